"""The workloads. Each takes a RunContext and returns the `results` block of the run's JSON."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperqwen.bench import checks, data, prom
from hyperqwen.bench.client import BenchClient, BenchError
from hyperqwen.bench.definitions import RequestRecord, cohort_summary, summarize

# Pass marks, stated once (bench/README.md lists them). GSM8K: the reference setup published 95.0-96.5% on
# 200 questions with greedy decoding and thinking off (its README); we fail below 85%, ten points under, so
# sampling noise on the 20-question sample (one question = 5 points) and prompt differences do not fail a
# healthy server while a broken one (junk, wrong drafter) cannot pass.
GSM8K_PASS = 0.85
# Requests: a run where more than this share of requests failed is not a measurement.
MAX_FAILED_SHARE = 0.10
# Speed workloads: share of sampled outputs that must agree with a greedy C1 re-run of the same prompt.
GREEDY_AGREEMENT_PASS = 0.8
# Long-document reproduction: share of the document's tokens reproduced before the first difference.
REPRODUCE_PASS = 0.9


@dataclass
class RunContext:
    client: BenchClient
    data_root: Path
    run_id: str
    seed: int
    temperature: float | None = 0.0  # None: the server's default sampling (no temperature sent)
    max_tokens: int | None = None
    options: dict = field(default_factory=dict)  # workload-specific CLI options
    gates: dict = field(default_factory=dict)  # name -> {"passed": bool, ...}

    def opt(self, name: str, default=None):
        value = self.options.get(name)
        return default if value is None else value

    def sampling(self, index: int) -> dict:
        # A per-request seed keeps sampled runs reproducible; greedy ignores it.
        if self.temperature is None:
            return {"seed": self.seed + index}
        return {"temperature": self.temperature, "seed": self.seed + index}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def gate(self, name: str, passed: bool, **detail) -> None:
        self.gates[name] = {"passed": bool(passed), **detail}


@dataclass
class ChatJob:
    """One chat request of a cohort, kept so a sample of them can be re-run as the greedy reference."""

    ctx: RunContext
    messages: list[dict]
    max_tokens: int
    index: int
    extra: dict = field(default_factory=dict)

    async def __call__(self) -> RequestRecord:
        return await self.ctx.client.stream_chat(
            self.messages, self.max_tokens, **self.ctx.sampling(self.index), **self.extra
        )


async def greedy_reference_check(ctx: RunContext, jobs: list[ChatJob], records: list[RequestRecord]) -> dict | None:
    """Re-run a sample of a greedy cohort's requests alone (C1) and compare their outputs token by token.

    A speed number is only worth something if the outputs behind it are right: a drafter or batch path
    producing garbage under load would otherwise post full speed. Sampled (non-greedy) cohorts are not
    comparable this way; the correctness workloads cover them."""
    if not ctx.greedy:
        return None
    samples = int(ctx.opt("check_samples", 1))
    checked = []
    for job, record in list(zip(jobs, records))[:samples]:
        if record.error is not None:
            continue
        reference = await ctx.client.stream_chat(
            job.messages, job.max_tokens, temperature=0.0, seed=ctx.seed + job.index, **job.extra
        )
        if reference.error is not None:
            continue
        checked.append({"request": job.index, **checks.greedy_agreement(reference.text, record.text)})
    tally = ctx.gates.setdefault(
        "outputs_match_greedy_reference",
        {"passed": True, "checked": 0, "agreed": 0, "pass_mark": GREEDY_AGREEMENT_PASS},
    )
    tally["checked"] += len(checked)
    tally["agreed"] += sum(1 for c in checked if c["agrees"])
    tally["passed"] = tally["checked"] == 0 or tally["agreed"] >= GREEDY_AGREEMENT_PASS * tally["checked"]
    return {"checked": checked}


async def snapshot(client: BenchClient) -> prom.CounterSnapshot | None:
    text = await client.metrics_text()
    return prom.CounterSnapshot.from_text(text) if text is not None else None


async def run_closed_loop(
    jobs: list[Callable[[], Awaitable[RequestRecord]]], concurrency: int
) -> tuple[list[RequestRecord], float, float]:
    """Run jobs with `concurrency` workers, each starting its next job as soon as its last one ends."""
    if concurrency < 1:
        raise BenchError(f"concurrency must be >= 1, got {concurrency}")
    queue: asyncio.Queue = asyncio.Queue()
    for index, job in enumerate(jobs):
        queue.put_nowait((index, job))
    results: list[RequestRecord | None] = [None] * len(jobs)

    async def worker() -> None:
        while True:
            try:
                index, job = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            results[index] = await job()

    t_start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(jobs)) or 1)))
    t_stop = time.perf_counter()
    return [r for r in results if r is not None], t_start, t_stop


async def measured_cohort(ctx: RunContext, jobs, concurrency: int, keep_text: bool = False) -> dict:
    """One cohort: /metrics before, the requests, /metrics after; summary + spec-decode deltas, then the
    greedy reference check on a sample (after the `after` snapshot, so it does not pollute the counters)."""
    await ctx.client.warm_up(concurrency)
    before = await snapshot(ctx.client)
    records, t_start, t_stop = await run_closed_loop(jobs, concurrency)
    after = await snapshot(ctx.client)
    summary = cohort_summary(records, t_start, t_stop, concurrency)
    summary["concurrency"] = concurrency
    if jobs and isinstance(jobs[0], ChatJob):
        summary["output_check"] = await greedy_reference_check(ctx, jobs, records)
    summary["spec_decode"] = prom.spec_decode_delta(before, after)
    summary["prefix_cache"] = prom.prefix_cache_delta(before, after)
    summary["per_request"] = [r.to_json(keep_text=keep_text) for r in records]
    errors = [r.error for r in records if r.error]
    if errors:
        summary["first_error"] = errors[0]
    return summary


def _concurrencies(ctx: RunContext, default: str) -> list[int]:
    raw = ctx.opt("concurrency", default)
    try:
        values = [int(v) for v in str(raw).split(",") if v.strip()]
    except ValueError:
        raise BenchError(
            f"--concurrency must be a comma-separated list of integers like 1,2,4,8 (got {raw!r})"
        ) from None
    if not values or any(v < 1 for v in values):
        raise BenchError(f"--concurrency values must be >= 1 (got {raw!r})")
    return values


def _chat_job(ctx: RunContext, messages: list[dict], max_tokens: int, index: int, **extra) -> ChatJob:
    return ChatJob(ctx, messages, max_tokens, index, extra)


def _salt_messages(messages: list[dict], run_id: str, tag: str) -> list[dict]:
    first, rest = messages[0], messages[1:]
    return [{**first, "content": data.salted(first["content"], run_id, tag)}, *rest]


# ---- chat cohorts --------------------------------------------------------------------------------
async def chat(ctx: RunContext) -> dict:
    prompts = data.chat_prompts(ctx.data_root)
    max_tokens = ctx.max_tokens or 512
    cohorts = []
    waves = int(ctx.opt("waves", 2))
    for concurrency in _concurrencies(ctx, "1,2,4,8"):
        # Whole waves of `concurrency` requests: 1.5 waves would leave the last half-wave running alone
        # and understate aggregate throughput.
        n_requests = int(ctx.opt("requests", concurrency * waves))
        jobs = []
        for i in range(n_requests):
            prompt = prompts[i % len(prompts)]
            messages = _salt_messages(prompt["messages"], ctx.run_id, f"chat-c{concurrency}-{i}")
            jobs.append(_chat_job(ctx, messages, max_tokens, i))
        cohorts.append(await measured_cohort(ctx, jobs, concurrency))
    return {"max_tokens": max_tokens, "prompts": [p["id"] for p in prompts], "cohorts": cohorts}


# ---- concurrency ladder --------------------------------------------------------------------------
async def ladder(ctx: RunContext) -> dict:
    paragraphs = data.corpus_paragraphs(ctx.data_root)
    counter = data.TokenCounter(ctx.client)
    prompt_tokens = int(ctx.opt("prompt_tokens", 4096))
    max_tokens = ctx.max_tokens or 256
    extra = {} if ctx.opt("no_ignore_eos", False) else {"ignore_eos": True}
    steps = []
    documents: dict[int, str] = {}
    instruction = "\n\nContinue the collection above with a new section in the same style."
    overhead = await counter.chat_overhead(data.salted(instruction, ctx.run_id, "ladder-c0-0"))
    for concurrency in _concurrencies(ctx, "1,2,4,8,16,32,64"):
        n_requests = int(ctx.opt("requests", concurrency * int(ctx.opt("waves", 1))))
        jobs = []
        for i in range(n_requests):
            # Distinct prompts: each starts at another paragraph and carries its own salt line.
            rotate = (i * 3) % len(paragraphs)
            if rotate not in documents:
                documents[rotate] = await data.document_of_tokens(
                    counter, paragraphs, prompt_tokens - overhead, rotate=rotate
                )
            content = data.salted(f"{documents[rotate]}{instruction}", ctx.run_id, f"ladder-c{concurrency}-{i}")
            jobs.append(_chat_job(ctx, [{"role": "user", "content": content}], max_tokens, i, **extra))
        steps.append(await measured_cohort(ctx, jobs, concurrency))
    return {
        "prompt_tokens_target": prompt_tokens,
        "max_tokens": max_tokens,
        "ignore_eos": bool(extra),
        "tokens_exact": counter.exact,
        "steps": steps,
    }


# ---- prefill rate by input length ----------------------------------------------------------------
async def prefill(ctx: RunContext) -> dict:
    paragraphs = data.corpus_paragraphs(ctx.data_root)
    counter = data.TokenCounter(ctx.client)
    raw = ctx.opt("lengths", "512,1024,2048,4096,8192,16384")
    try:
        lengths = [int(v) for v in str(raw).split(",") if v.strip()]
    except ValueError:
        raise BenchError(f"--lengths must be comma-separated integers like 1024,4096 (got {raw!r})") from None
    repeats = int(ctx.opt("repeats", 3))
    rows = []
    instruction = "\n\nReply with the single word OK."
    for length in lengths:
        # The target is the whole prompt: chat template, salt and instruction included.
        overhead = await counter.chat_overhead(data.salted(instruction, ctx.run_id, f"prefill-{length}-0"))
        if length - overhead < 16:
            raise BenchError(
                f"--lengths value {length} is too short: the chat template, salt and instruction "
                f"alone take {overhead} tokens"
            )
        document = await data.document_of_tokens(counter, paragraphs, length - overhead)
        records = []
        for r in range(repeats):
            content = data.salted(f"{document}{instruction}", ctx.run_id, f"prefill-{length}-{r}")
            records.append(await ctx.client.stream_chat([{"role": "user", "content": content}], 1, **ctx.sampling(r)))
        ok = [rec for rec in records if rec.error is None]
        rows.append(
            {
                "target_tokens": length,
                "prompt_tokens": summarize(rec.prompt_tokens for rec in ok),
                "ttft_s": summarize(rec.ttft_s for rec in ok),
                "prefill_tok_s": summarize(rec.prefill_tok_s for rec in ok),
                "errors": len(records) - len(ok),
                "first_error": next((rec.error for rec in records if rec.error), None),
            }
        )
    return {"repeats": repeats, "tokens_exact": counter.exact, "rows": rows}


# ---- prefix cache: turn-2 TTFT -------------------------------------------------------------------
async def prefix(ctx: RunContext) -> dict:
    paragraphs = data.corpus_paragraphs(ctx.data_root)
    counter = data.TokenCounter(ctx.client)
    context_tokens = int(ctx.opt("context_tokens", 8192))
    repeats = int(ctx.opt("repeats", 3))
    max_tokens = ctx.max_tokens or 64
    document = await data.document_of_tokens(counter, paragraphs, context_tokens - 100)
    turns = []
    before = await snapshot(ctx.client)
    for r in range(repeats):
        # Salt per conversation: turn 1 is cold, turn 2 shares turn 1's whole prefix.
        first = {
            "role": "user",
            "content": data.salted(
                f"{document}\n\nIn one sentence, what is the first document above about?", ctx.run_id, f"prefix-{r}"
            ),
        }
        turn1 = await ctx.client.stream_chat([first], max_tokens, **ctx.sampling(r))
        messages = [
            first,
            {"role": "assistant", "content": turn1.text or "."},
            {"role": "user", "content": "And in one sentence, what is the last document about?"},
        ]
        turn2 = await ctx.client.stream_chat(messages, max_tokens, **ctx.sampling(r))
        turns.append((turn1, turn2))
    after = await snapshot(ctx.client)
    cold = summarize(t1.ttft_s for t1, _ in turns if t1.error is None)
    warm = summarize(t2.ttft_s for t1, t2 in turns if t1.error is None and t2.error is None)
    speedup = (cold["median"] / warm["median"]) if cold and warm and warm["median"] > 0 else None
    return {
        "context_tokens_target": context_tokens,
        "repeats": repeats,
        "prompt_tokens_turn1": summarize(t1.prompt_tokens for t1, _ in turns),
        "prompt_tokens_turn2": summarize(t2.prompt_tokens for _, t2 in turns),
        "ttft_turn1_cold_s": cold,
        "ttft_turn2_s": warm,
        "turn2_speedup_median": speedup,
        "prefix_cache": prom.prefix_cache_delta(before, after),
        "errors": sum(1 for t1, t2 in turns for t in (t1, t2) if t.error),
    }


# ---- long-document tasks -------------------------------------------------------------------------
def first_mismatch(expected: str, got: str) -> int | None:
    """Index of the first differing character, None when identical."""
    for index, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return index
    return None if len(expected) == len(got) else min(len(expected), len(got))


def _strip_wrapping(text: str) -> str:
    """Drop surrounding whitespace and one pair of code fences; the content itself is compared exactly."""
    text = text.strip()
    fence = re.match(r"^```[^\n]*\n(.*)\n```$", text, flags=re.DOTALL)
    return fence.group(1).strip() if fence else text


def verbatim_check(expected: str, got: str) -> dict:
    got = _strip_wrapping(got)
    mismatch = first_mismatch(expected, got)
    result: dict[str, Any] = {"passed": mismatch is None, "expected_chars": len(expected), "got_chars": len(got)}
    if mismatch is not None:
        result["first_mismatch_at"] = mismatch
        result["expected_near"] = expected[max(0, mismatch - 20) : mismatch + 20]
        result["got_near"] = got[max(0, mismatch - 20) : mismatch + 20]
    return result


def _find_paragraph(paragraphs: list[data.Paragraph], doc: str, starts: str) -> str:
    for p in paragraphs:
        if p.doc == doc and p.text.startswith(starts):
            return p.text
    raise BenchError(f"longdoc_tasks.json: no paragraph of {doc} starts with {starts!r}")


async def longdoc(ctx: RunContext) -> dict:
    paragraphs = data.corpus_paragraphs(ctx.data_root)
    tasks = json.loads((ctx.data_root / "longdoc_tasks.json").read_text(encoding="utf-8"))
    counter = data.TokenCounter(ctx.client)
    context_tokens = int(ctx.opt("context_tokens", 8192))
    document = await data.document_of_tokens(counter, paragraphs, context_tokens - 300)
    results = []
    index = 0

    async def ask(task_id: str, instruction: str, max_tokens: int) -> RequestRecord:
        nonlocal index
        index += 1
        content = data.salted(f"<document>\n{document}\n</document>\n\n{instruction}", ctx.run_id, f"longdoc-{task_id}")
        return await ctx.client.stream_chat([{"role": "user", "content": content}], max_tokens, **ctx.sampling(index))

    for task in tasks.get("copy", []) + tasks.get("edit", []):
        paragraph = _find_paragraph(paragraphs, task["doc"], task["paragraph_starts"])
        if paragraph not in document:
            results.append({"id": task["id"], "skipped": "paragraph not within the context length"})
            continue
        if "replace" in task:
            expected = paragraph.replace(task["replace"], task["with"])
            instruction = (
                f'Output the paragraph of the document that begins with "{task["paragraph_starts"]}", '
                f'with every occurrence of the word "{task["replace"]}" replaced by '
                f'"{task["with"]}" and nothing else changed. Output only that paragraph.'
            )
        else:
            expected = paragraph
            instruction = (
                f'Copy the paragraph of the document that begins with "{task["paragraph_starts"]}" '
                "exactly, character for character. Output only that paragraph."
            )
        max_tokens = ctx.max_tokens or max(64, len(expected) // 2)
        record = await ask(task["id"], instruction, max_tokens)
        check = verbatim_check(expected, record.text)
        results.append(
            {"id": task["id"], "kind": "edit" if "replace" in task else "copy", **check, "request": record.to_json()}
        )
    results += await _longdoc_judged(ctx, tasks, ask, document, paragraphs)
    exact = [r for r in results if r.get("kind") in ("copy", "edit", "answer")]
    if exact:
        # Copy, edit and short answers have one right output; quotes and summaries are reported, not gated.
        ctx.gate(
            "longdoc_exact",
            all(r["passed"] for r in exact),
            tasks=[r["id"] for r in exact],
            failed=[r["id"] for r in exact if not r["passed"]],
            pass_mark="every copy/edit/answer task",
        )
    return {
        "context_tokens_target": context_tokens,
        "tokens_exact": counter.exact,
        "passed": sum(1 for r in results if r.get("passed")),
        "scored": sum(1 for r in results if "passed" in r),
        "tasks": results,
    }


async def _longdoc_judged(
    ctx: RunContext,
    tasks: dict,
    ask: Callable[[str, str, int], Awaitable[RequestRecord]],
    document: str,
    paragraphs: list,
) -> list[dict]:
    """The quote, summary and short-answer tasks: each judged by its own rule, not by a verbatim match."""
    results: list[dict] = []
    for task in tasks.get("quote", []):
        record = await ask(task["id"], task["instruction"] + " Output only the sentence.", ctx.max_tokens or 160)
        quote = _strip_wrapping(record.text).strip("\"'“”")
        passed = bool(quote) and quote in document and all(t in quote for t in task["must_contain"])
        results.append(
            {
                "id": task["id"],
                "kind": "quote",
                "passed": passed,
                "output": record.text[:400],
                "request": record.to_json(),
            }
        )
    for task in tasks.get("summarise", []):
        record = await ask(task["id"], task["instruction"], ctx.max_tokens or 200)
        words = len(record.text.split())
        found = [t for t in task["key_terms"] if checks.contains_tokens(record.text, t)]
        passed = 0 < words <= task["max_words"] and len(found) >= task["min_key_terms"]
        results.append(
            {
                "id": task["id"],
                "kind": "summarise",
                "passed": passed,
                "words": words,
                "key_terms_found": found,
                "output": record.text[:800],
                "request": record.to_json(),
            }
        )
    for task in tasks.get("answer", []):
        if not all(p.text in document for p in paragraphs if p.doc == task["doc"]):
            results.append({"id": task["id"], "skipped": "its document is not within the context length"})
            continue
        record = await ask(task["id"], task["question"], ctx.max_tokens or 32)
        # Token-level exact match: "11" does not pass inside "2011", nor does an echo of the document.
        passed = checks.answer_matches(record.text, task["accept"])
        results.append(
            {
                "id": task["id"],
                "kind": "answer",
                "passed": passed,
                "output": record.text[:200],
                "request": record.to_json(),
            }
        )
    return results


# ---- long-document reproduction ------------------------------------------------------------------
async def reproduce(ctx: RunContext) -> dict:
    """Copy a long document back verbatim (greedy): the reference setup's 25k-token document workload, where a
    drafter that fills its verify block from the prompt accepts long runs. Reports decode rate and tokens per
    verify step from the server's spec-decode counters; gated on how much of the document came back exactly."""
    paragraphs = data.corpus_paragraphs(ctx.data_root)
    counter = data.TokenCounter(ctx.client)
    context_tokens = int(ctx.opt("context_tokens", 25000))
    document = await data.document_of_tokens(counter, paragraphs, context_tokens)
    doc_tokens = await counter.count(document)
    instruction = (
        "Reproduce the document above exactly, character for character, from its first line to its "
        "last. Output only the document."
    )
    content = data.salted(f"<document>\n{document}\n</document>\n\n{instruction}", ctx.run_id, "reproduce")
    max_tokens = ctx.max_tokens or int(doc_tokens * 1.1) + 64
    before = await snapshot(ctx.client)
    record = await ctx.client.stream_chat(
        [{"role": "user", "content": content}], max_tokens, temperature=0.0, seed=ctx.seed
    )
    after = await snapshot(ctx.client)
    expected, got = checks.words(document), checks.words(_strip_wrapping(record.text))
    common = 0
    for x, y in zip(expected, got):
        if x != y:
            break
        common += 1
    share = common / len(expected) if expected else 0.0
    ctx.gate("reproduce", share >= REPRODUCE_PASS, reproduced_share=share, pass_mark=REPRODUCE_PASS)
    return {
        "context_tokens_target": context_tokens,
        "document_tokens": doc_tokens,
        "tokens_exact": counter.exact,
        "reproduced_share": share,
        "common_prefix_tokens": common,
        "document_word_tokens": len(expected),
        "decode_tok_s": record.decode_tok_s,
        "tpot_ms": record.tpot_ms,
        "ttft_s": record.ttft_s,
        "decode_reference_tok_s": (1000.0 / record.tpot_ms) if record.tpot_ms else None,
        "spec_decode": prom.spec_decode_delta(before, after),
        "request": record.to_json(),
    }


# ---- needle in a haystack ------------------------------------------------------------------------
NEEDLE = "The access code for the old pump house on Garnet Ledge is {code}."
DECOY = "The access code for the ferry office on Stanning Quay is {code}."
NEEDLE_QUESTION = (
    "What is the access code for the old pump house on Garnet Ledge? Reply with the code only, "
    "exactly as written in the document."
)


async def needle(ctx: RunContext) -> dict:
    """A code unique to this run and depth (XXXX-XXXX-XXXX) hidden at each depth, a decoy code elsewhere;
    exact match on the code. A server echoing the prompt names both codes and fails."""
    paragraphs = data.corpus_paragraphs(ctx.data_root)
    counter = data.TokenCounter(ctx.client)
    context_tokens = int(ctx.opt("context_tokens", 8192))
    raw = ctx.opt("depths", "0,0.25,0.5,0.75,1")
    try:
        depths = [float(v) for v in str(raw).split(",") if v.strip()]
    except ValueError:
        raise BenchError(f"--depths must be comma-separated fractions like 0,0.5,1 (got {raw!r})") from None
    if not depths or any(not 0 <= d <= 1 for d in depths):
        raise BenchError(f"--depths must lie within 0..1 (got {raw!r})")
    haystack = (await data.document_of_tokens(counter, paragraphs, context_tokens - 160)).split("\n\n")
    rows = []
    for i, depth in enumerate(depths):
        code = checks.needle_code(ctx.run_id, f"needle-{i}")
        decoy = checks.needle_code(ctx.run_id, f"decoy-{i}")
        at = round(depth * len(haystack))
        decoy_at = (at + len(haystack) // 2) % (len(haystack) + 1)
        parts = list(haystack)
        parts.insert(at, NEEDLE.format(code=code))
        parts.insert(decoy_at if decoy_at <= at else decoy_at + 1, DECOY.format(code=decoy))
        text = "\n\n".join(parts)
        content = data.salted(f"<document>\n{text}\n</document>\n\n{NEEDLE_QUESTION}", ctx.run_id, f"needle-{i}")
        record = await ctx.client.stream_chat(
            [{"role": "user", "content": content}], ctx.max_tokens or 48, temperature=0.0, seed=ctx.seed + i
        )
        check = checks.needle_check(record.text, code)
        rows.append(
            {
                "depth": depth,
                "found": check["passed"],
                "code": code,
                **check,
                "output": record.text[:200],
                "request": record.to_json(),
            }
        )
    found = sum(r["found"] for r in rows)
    ctx.gate("needle", found == len(rows), found=found, depths=len(rows), pass_mark="every depth, exact match")
    return {"context_tokens_target": context_tokens, "tokens_exact": counter.exact, "found": found, "rows": rows}


# ---- correctness gates ---------------------------------------------------------------------------
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_tide_time",
        "description": "Return the time of the next low tide at a named place.",
        "parameters": {"type": "object", "properties": {"place": {"type": "string"}}, "required": ["place"]},
    },
}

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "locks": {"type": "integer"},
        "reopened": {"type": "boolean"},
    },
    "required": ["title", "year", "locks", "reopened"],
    "additionalProperties": False,
}


def validate_json(instance, schema: dict) -> list[str]:
    """Errors of instance against schema (jsonschema when installed; else the subset ANSWER_SCHEMA uses)."""
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    if jsonschema is not None:
        return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(instance)]
    errors = []
    types: dict[str, Any] = {
        "object": dict,
        "string": str,
        "integer": int,
        "boolean": bool,
        "number": (int, float),
        "array": list,
    }
    if not isinstance(instance, types[schema["type"]]) or (schema["type"] == "integer" and isinstance(instance, bool)):
        return [f"expected {schema['type']}, got {type(instance).__name__}"]
    if schema["type"] == "object":
        for key in schema.get("required", []):
            if key not in instance:
                errors.append(f"missing required property {key!r}")
        for key, value in instance.items():
            if key in schema.get("properties", {}):
                errors += validate_json(value, schema["properties"][key])
            elif schema.get("additionalProperties") is False:
                errors.append(f"unexpected property {key!r}")
    return errors


async def gates(ctx: RunContext) -> dict:
    paragraphs = data.corpus_paragraphs(ctx.data_root)
    out: dict = {
        "verbatim_copy": await _gate_verbatim_copy(ctx, paragraphs),
        "tool_call_round_trip": await _gate_tool_round_trip(ctx),
        "json_schema": await _gate_json_schema(ctx),
        "greedy_repeatable": await _gate_greedy_repeatable(ctx),
    }
    for name, result in out.items():
        ctx.gates[name] = {"passed": result["passed"]}
    return out


async def _gate_verbatim_copy(ctx: RunContext, paragraphs: list) -> dict:
    client = ctx.client
    # 1. Verbatim copy of a short passage given in the prompt, checked character by character.
    passage = _find_paragraph(paragraphs, "06-tide-pools.md", "Wear shoes with a firm grip")
    content = data.salted(
        f"Repeat the following text exactly, character for character, and output nothing else.\n\n{passage}",
        ctx.run_id,
        "gate-copy",
    )
    record = await client.stream_chat(
        [{"role": "user", "content": content}], ctx.max_tokens or 200, temperature=0.0, seed=ctx.seed
    )
    return {**verbatim_check(passage, record.text), "request": record.to_json()}


async def _gate_tool_round_trip(ctx: RunContext) -> dict:
    client = ctx.client
    # 2. Tool-call round trip: the model calls the tool, we answer, the model uses the answer.
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": data.salted("When is the next low tide at Garnet Ledge? Use the tool.", ctx.run_id, "gate-tool"),
        }
    ]
    try:
        first = await client.post_json(
            "/v1/chat/completions",
            {
                "messages": messages,
                "tools": [WEATHER_TOOL],
                "tool_choice": "required",
                "max_tokens": 128,
                "temperature": 0.0,
                "seed": ctx.seed,
            },
        )
        message = first["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        tool_ok = bool(calls) and calls[0]["function"]["name"] == "get_tide_time"
        arguments = json.loads(calls[0]["function"]["arguments"]) if tool_ok else None
        tool_ok = tool_ok and isinstance(arguments, dict) and "place" in arguments
        final_text = None
        if tool_ok:
            messages += [
                {"role": "assistant", "content": message.get("content") or "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "Next low tide: 16:42."},
            ]
            second = await client.post_json(
                "/v1/chat/completions",
                {
                    # tool_choice "none": the answer must be text, whether or not the server parses tool calls.
                    "messages": messages,
                    "tools": [WEATHER_TOOL],
                    "tool_choice": "none",
                    "max_tokens": 96,
                    "temperature": 0.0,
                    "seed": ctx.seed,
                },
            )
            final_text = second["choices"][0]["message"].get("content") or ""
        return {
            "passed": bool(tool_ok and final_text and "16:42" in final_text),
            "tool_called": bool(tool_ok),
            "arguments": arguments,
            "final_answer": (final_text or "")[:300],
        }
    except (BenchError, KeyError, IndexError, ValueError, TypeError) as exc:
        return {"passed": False, "error": str(exc)[:300]}


async def _gate_json_schema(ctx: RunContext) -> dict:
    client = ctx.client
    # 3. JSON-schema constrained output validates.
    try:
        response = await client.post_json(
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": data.salted(
                            "Describe the Elmsworth Canal as JSON with a title, the year it opened (1797), its "
                            "number of locks (23) and whether part of it has reopened (true).",
                            ctx.run_id,
                            "gate-json",
                        ),
                    }
                ],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "canal", "schema": ANSWER_SCHEMA, "strict": True},
                },
                "max_tokens": 200,
                "temperature": 0.0,
                "seed": ctx.seed,
            },
        )
        text = response["choices"][0]["message"].get("content") or ""
        try:
            errors = validate_json(json.loads(text), ANSWER_SCHEMA)
        except ValueError as exc:
            errors = [f"not JSON: {exc}"]
        return {"passed": not errors, "errors": errors[:5], "output": text[:300]}
    except BenchError as exc:
        return {"passed": False, "error": str(exc)[:300]}


async def _gate_greedy_repeatable(ctx: RunContext) -> dict:
    client = ctx.client
    # 4. Greedy decoding repeated on one salted prompt gives identical text.
    repeats = int(ctx.opt("repeats", 3))
    prompt = data.chat_prompts(ctx.data_root)[0]
    messages = _salt_messages(prompt["messages"], ctx.run_id, "gate-greedy")
    texts = []
    for _ in range(repeats):
        rec = await client.stream_chat(messages, ctx.max_tokens or 128, temperature=0.0, seed=ctx.seed)
        texts.append(rec.text)
    return {
        "passed": len(set(texts)) == 1 and bool(texts[0]),
        "runs": repeats,
        "distinct_outputs": len(set(texts)),
    }


# ---- quality: GSM8K-style exact match ------------------------------------------------------------
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def gsm8k_target(answer: str) -> str:
    if "####" not in answer:
        raise BenchError(f"GSM8K answer without '#### <number>': {answer[:80]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def extract_final_number(text: str) -> str | None:
    """The number after the last 'answer is', else the last number in the text."""
    tail = text.lower().rsplit("answer is", 1)[-1] if "answer is" in text.lower() else text
    numbers = _NUMBER.findall(tail) or _NUMBER.findall(text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def numbers_equal(a: str | None, b: str) -> bool:
    if a is None:
        return False
    try:
        return math.isclose(float(a), float(b), rel_tol=0, abs_tol=1e-6)
    except ValueError:
        return False


async def gsm8k(ctx: RunContext) -> dict:
    path = Path(ctx.opt("dataset") or ctx.data_root / "gsm8k_sample.jsonl")
    if not path.is_file():
        raise BenchError(f"--dataset {path}: no such file (GSM8K jsonl with 'question' and 'answer' fields)")
    rows = data.read_jsonl(path)
    limit = ctx.opt("limit")
    if limit:
        rows = rows[: int(limit)]
    concurrency = int(ctx.opt("concurrency", 4))
    items = []
    for i, row in enumerate(rows):
        if "question" not in row or "answer" not in row:
            raise BenchError(f"{path} row {i + 1}: needs 'question' and 'answer' fields")
        items.append((row["question"], gsm8k_target(row["answer"])))

    def job(i: int, question: str):
        content = data.salted(
            f"{question}\nSolve it step by step, then finish with a line 'The answer is N.' where N is a number.",
            ctx.run_id,
            f"gsm8k-{i}",
        )
        return lambda: ctx.client.stream_chat(
            [{"role": "user", "content": content}], ctx.max_tokens or 512, temperature=0.0, seed=ctx.seed
        )

    records, t_start, t_stop = await run_closed_loop([job(i, q) for i, (q, _) in enumerate(items)], concurrency)
    per_item: list[dict[str, Any]] = []
    for (_question, target), record in zip(items, records):
        got = extract_final_number(record.text)
        per_item.append({"target": target, "got": got, "correct": numbers_equal(got, target), "error": record.error})
    correct = sum(r["correct"] for r in per_item)
    score = correct / len(items) if items else 0.0
    ctx.gate(
        "gsm8k", bool(items) and score >= GSM8K_PASS, exact_match=score, questions=len(items), pass_mark=GSM8K_PASS
    )
    return {
        "pass_mark": GSM8K_PASS,
        "dataset": str(path) if ctx.opt("dataset") else "built-in sample (bench/data/gsm8k_sample.jsonl)",
        "questions": len(items),
        "correct": correct,
        "exact_match": correct / len(items) if items else None,
        "wall_s": t_stop - t_start,
        "items": per_item,
    }


# ---- quality: perplexity from prompt logprobs ----------------------------------------------------
def prompt_token_logprobs(choice: dict) -> list[float]:
    """Log-probability of each actual prompt token (the first position has none)."""
    ids = choice.get("prompt_token_ids")
    entries = choice.get("prompt_logprobs")
    if ids is None or entries is None:
        raise BenchError(
            "the server returned no prompt_token_ids/prompt_logprobs; perplexity needs vLLM's "
            "`prompt_logprobs` and `return_token_ids` completion parameters"
        )
    values = []
    for token_id, entry in zip(ids, entries):
        if not entry:
            continue
        item = entry.get(str(token_id)) or entry.get(token_id)
        if item is None:
            raise BenchError(f"prompt_logprobs lack the actual token {token_id}")
        values.append(float(item["logprob"]))
    return values


async def perplexity(ctx: RunContext) -> dict:
    dataset = ctx.opt("dataset")
    if dataset:
        path = Path(dataset)
        if not path.is_file():
            raise BenchError(f"--dataset {path}: no such file (plain UTF-8 text, paragraphs split by blank lines)")
        texts = [b.strip() for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    else:
        texts = [p.text for p in data.corpus_paragraphs(ctx.data_root)]
    window_chars = int(ctx.opt("window_chars", 2000))
    limit = int(ctx.opt("limit", 0) or 0)
    windows, current = [], ""
    for text in texts:
        if current and len(current) + len(text) > window_chars:
            windows.append(current)
            current = ""
        current = f"{current}\n\n{text}" if current else text
    if current:
        windows.append(current)
    if limit:
        windows = windows[:limit]
    logprobs: list[float] = []
    per_window = []
    for window in windows:
        response = await ctx.client.post_json(
            "/v1/completions",
            {"prompt": window, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1, "return_token_ids": True},
        )
        values = prompt_token_logprobs(response["choices"][0])
        logprobs += values
        per_window.append(
            {"tokens": len(values), "perplexity": math.exp(-sum(values) / len(values)) if values else None}
        )
    return {
        "dataset": str(dataset) if dataset else "built-in corpus (bench/data/corpus)",
        "windows": len(windows),
        "tokens_scored": len(logprobs),
        "perplexity": math.exp(-sum(logprobs) / len(logprobs)) if logprobs else None,
        "per_window": per_window,
    }


WORKLOADS: dict[str, tuple[Callable[[RunContext], Awaitable[dict]], str]] = {
    "chat": (chat, "chat prompts (en, code, other languages) in cohorts at concurrency 1/2/4/8"),
    "ladder": (ladder, "concurrency ladder: distinct ~4k-token prompts, 256 output tokens"),
    "prefill": (prefill, "prefill rate by input length (salted prompts, max_tokens 1)"),
    "prefix": (prefix, "prefix cache: turn-2 TTFT over a long document vs cold turn 1"),
    "reproduce": (reproduce, "long-document reproduction: copy a ~25k-token document, tokens per verify step"),
    "longdoc": (longdoc, "long-document tasks: verbatim copy, edit, quote, summarise, answer"),
    "needle": (needle, "needle in a haystack at several depths"),
    "gates": (gates, "correctness gates: verbatim copy, tool-call round trip, JSON schema, greedy repeatability"),
    "gsm8k": (gsm8k, "GSM8K-style exact match (built-in sample or --dataset)"),
    "perplexity": (perplexity, "perplexity from prompt logprobs (built-in corpus or --dataset)"),
}
