"""`hyperqwen bench suite`: the whole field report against a running server, in one command.

Every step is one workload with fixed options; each finished step is saved as `<out>/steps/<name>.json`
and kept, so an interrupted run resumes where it stopped (`--restart` discards them). At the end
`report.py` writes `report.json`, `report.md` and the plots. The exit status is 1 when any gate failed,
2 when the run could not start, 0 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hyperqwen.bench.errors import EXTRA_HINT, BenchError
from hyperqwen.exit_codes import Exit

# The order is cheapest-informative first: a broken server shows in the first minute, not after the ladder.
STEP_NAMES = (
    "chat_greedy",
    "chat_default",
    "ladder",
    "prefill",
    "prefix",
    "reproduce",
    "longdoc",
    "needle",
    "gsm8k",
    "perplexity",
)
GSM8K_DATASET = ("openai/gsm8k", "main", "test")  # the 1,319-question test split on the Hugging Face hub


@dataclass
class Step:
    name: str
    workload: str
    options: dict[str, Any]
    temperature: float | None = 0.0  # None: the server's default sampling
    max_tokens: int | None = None
    planned_requests: int = 1
    note: str = ""
    skipped: str | None = None

    def key(self, model: str) -> str:
        """Identity of the step's configuration: a saved result is reused only for the same one."""
        blob = json.dumps(
            [self.name, self.workload, self.options, self.temperature, self.max_tokens, model],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class SuitePlan:
    steps: list[Step] = field(default_factory=list)
    max_model_len: int | None = None


# Haystack sizes of the long-context needles: 128k (CTX=long) and 200k (CTX=huge).
LONG_NEEDLES = {"needle_128k": 131_072, "needle_200k": 200_000}
LONG_NEEDLE_DEPTHS = "0.1,0.5,0.9"


def _fit(tokens: int, max_len: int | None, reserve: int) -> int:
    """A prompt length that fits the served context with `reserve` tokens left for the output and template."""
    return tokens if max_len is None else max(256, min(tokens, max_len - reserve))


def plan(quick: bool, max_len: int | None, gsm8k_dataset: str | None = None) -> SuitePlan:
    """The steps of a run. Full sizes follow the reference's published workloads; --quick shrinks every one
    to seconds on a small CPU model (a smoke test of the whole pipeline, not a measurement)."""
    q = quick
    steps: list[Step] = []
    chat_requests, chat_tokens = (2, 48) if q else (6, 1024)
    for name, temperature in (("chat_greedy", 0.0), ("chat_default", None)):
        steps.append(
            Step(
                name,
                "chat",
                {"concurrency": "1", "requests": chat_requests, "check_samples": 1},
                temperature,
                chat_tokens,
                chat_requests + 1,
                f"C1, {chat_tokens} output tokens, {'greedy' if temperature == 0 else 'default sampling'}",
            )
        )
    ladder = [1, 2, 4] if q else [1, 2, 4, 8, 16, 32, 64]
    ladder_tokens = 24 if q else 512
    steps.append(
        Step(
            "ladder",
            "ladder",
            {"concurrency": ",".join(map(str, ladder)), "prompt_tokens": 128, "waves": 1, "check_samples": 1},
            0.0,
            ladder_tokens,
            sum(ladder) + len(ladder),
            f"C{'/'.join(map(str, ladder))}, 128 in / {ladder_tokens} out, ignore_eos (as the reference)",
        )
    )
    steps += _context_steps(q, max_len)
    steps += _task_steps(q, max_len, gsm8k_dataset)
    return SuitePlan(steps, max_len)


def _context_steps(q: bool, max_len: int | None) -> list[Step]:
    """Prefill by input length, the prefix cache, and reproduction of a long document."""
    steps: list[Step] = []
    lengths = [256, 1024] if q else [1024, 16384, 65536]
    if not q and (max_len is None or max_len >= 100_000 + 64):
        lengths.append(100_000)
    fitted = sorted({_fit(n, max_len, 64) for n in lengths})
    repeats = 1 if q else 3
    steps.append(
        Step(
            "prefill",
            "prefill",
            {"lengths": ",".join(map(str, fitted)), "repeats": repeats},
            0.0,
            None,
            len(fitted) * repeats,
            "input lengths " + ", ".join(f"{n:,}" for n in fitted),
        )
    )
    prefix_ctx = _fit(1024 if q else 25_000, max_len, 256)
    steps.append(
        Step(
            "prefix",
            "prefix",
            {"context_tokens": prefix_ctx, "repeats": 1 if q else 2},
            0.0,
            16 if q else 64,
            2 if q else 4,
            f"turn 2 over a {prefix_ctx:,}-token document",
        )
    )
    # Reproduction needs room for the document twice (prompt and output).
    repro_ctx = 512 if q else 25_000
    if max_len is not None:
        repro_ctx = max(256, min(repro_ctx, int((max_len - 256) / 2.2)))
    steps.append(
        Step(
            "reproduce",
            "reproduce",
            {"context_tokens": repro_ctx},
            0.0,
            None,
            1,
            f"copy a {repro_ctx:,}-token document",
        )
    )
    longdoc_ctx = _fit(2048 if q else 8192, max_len, 512)
    steps.append(
        Step("longdoc", "longdoc", {"context_tokens": longdoc_ctx}, 0.0, None, 10, f"{longdoc_ctx:,}-token document")
    )
    return steps


def _needle_step(name: str, context_tokens: int, depths: str) -> Step:
    """A needle-in-a-haystack step: one request per depth (a comma-separated list of fractions)."""
    return Step(
        name,
        "needle",
        {"context_tokens": context_tokens, "depths": depths},
        0.0,
        None,
        len(depths.split(",")),
        f"{context_tokens:,}-token haystack, depths {depths}",
    )


def _task_steps(q: bool, max_len: int | None, gsm8k_dataset: str | None) -> list[Step]:
    """Needles (the long ones when the served context holds them), GSM8K and perplexity."""
    steps: list[Step] = []
    needle_ctx = _fit(1024 if q else 32_768, max_len, 128)
    depths = "0,0.5,1" if q else "0,0.25,0.5,0.75,1"
    steps.append(_needle_step("needle", needle_ctx, depths))
    # Long-context needles for a server started with CTX=long (128k) or CTX=huge (200k+): run only when the
    # served context holds the haystack, since each costs minutes of prefill per depth on a 24 GB card.
    for name, haystack in () if q or max_len is None else LONG_NEEDLES.items():
        if max_len is not None and max_len >= haystack + 128:
            steps.append(_needle_step(name, haystack, LONG_NEEDLE_DEPTHS))
    gsm_limit = 5 if q else None
    steps.append(
        Step(
            "gsm8k",
            "gsm8k",
            {"concurrency": 4, "limit": gsm_limit, "dataset": gsm8k_dataset},
            0.0,
            256 if q else 512,
            gsm_limit or (1319 if gsm8k_dataset else 20),
            "full test set (1,319)" if gsm8k_dataset else "shipped 20-question sample",
        )
    )
    steps.append(
        Step("perplexity", "perplexity", {"limit": 2 if q else 6}, 0.0, None, 2 if q else 6, "built-in corpus windows")
    )
    return steps


def fetch_gsm8k(out_dir: Path) -> Path:
    """The full GSM8K test split as jsonl (question/answer), fetched with `datasets` (network, only on request)."""
    target = out_dir / "gsm8k-test.jsonl"
    if target.is_file():
        return target
    try:
        from datasets import load_dataset
    except ImportError:
        raise BenchError("--gsm8k-full needs the `datasets` package: pip install datasets") from None
    try:
        rows = load_dataset(*GSM8K_DATASET[:2], split=GSM8K_DATASET[2])
    except Exception as exc:  # noqa: BLE001 - offline, hub down, gated: all the same to the user
        raise BenchError(
            f"cannot fetch GSM8K ({GSM8K_DATASET[0]}): {type(exc).__name__}: {str(exc)[:200]}; "
            "run without --gsm8k-full to use the shipped sample"
        ) from None
    tmp = target.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"question": row["question"], "answer": row["answer"]}) + "\n")
    tmp.replace(target)
    return target


class _Progress:
    """One progress bar per step (tqdm, on stderr) with an ETA; plain lines when tqdm is missing."""

    def __init__(self, step: Step, index: int, total: int):
        label = f"[{index}/{total}] {step.name}"
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
            print(f"hyperqwen bench suite: {label} ({step.note})", file=sys.stderr)
            return
        self.bar = tqdm(
            total=step.planned_requests,
            desc=label,
            unit="req",
            file=sys.stderr,
            dynamic_ncols=True,
            bar_format="{desc}: {n_fmt}/{total_fmt} req |{bar}| {elapsed}<{remaining}",
        )

    def tick(self) -> None:
        if self.bar is not None:
            if self.bar.n >= self.bar.total:
                self.bar.total += 1  # more requests than planned: keep the bar honest, not stuck at 100%
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _step_args(args: argparse.Namespace, step: Step) -> argparse.Namespace:
    from hyperqwen.bench.runner import WORKLOAD_OPTIONS

    values: dict[str, Any] = {name: None for name in WORKLOAD_OPTIONS}
    values.update({k: v for k, v in step.options.items() if v is not None})
    values["no_ignore_eos"] = False
    shared = {
        k: getattr(args, k)
        for k in (
            "url",
            "api_key",
            "api_key_file",
            "model",
            "label",
            "hardware",
            "seed",
            "run_id",
            "data_dir",
            "server_log",
            "env_file",
            "timeout",
            "thinking",
        )
    }
    return argparse.Namespace(
        **shared,
        **values,
        workload=step.workload,
        temperature=-1.0 if step.temperature is None else step.temperature,
        max_tokens=step.max_tokens,
    )


async def run_suite(args: argparse.Namespace) -> tuple[Path, dict]:
    from hyperqwen.bench import report
    from hyperqwen.bench.client import BenchClient
    from hyperqwen.bench.runner import api_key, report_environment, run_workload, write_json_atomic

    out: Path = args.out or Path("bench-results") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    steps_dir = out / "steps"
    if args.restart and steps_dir.is_dir():
        for old in steps_dir.glob("*.json"):
            old.unlink()
    client = BenchClient(args.url, api_key(args), args.model, timeout_s=args.timeout)
    client.chat_extra = {} if args.thinking else {"chat_template_kwargs": {"enable_thinking": False}}
    try:
        model = await client.resolve_model()
        environment, note = await report_environment(client, args)
        if note:
            print(
                f"hyperqwen bench suite: warning: server environment unavailable ({note}); the report records "
                "the bench host only",
                file=sys.stderr,
            )
        dataset = str(fetch_gsm8k(out)) if args.gsm8k_full else None
        suite_plan = plan(args.quick, client.max_model_len, dataset)
        chosen = [
            s for s in suite_plan.steps if (not args.only or s.name in args.only) and s.name not in (args.skip or [])
        ]
        docs: dict[str, dict] = {}
        for index, step in enumerate(chosen, 1):
            path = steps_dir / f"{step.name}.json"
            key = step.key(model)
            if path.is_file():
                try:
                    saved = json.loads(path.read_text(encoding="utf-8"))
                except ValueError:
                    saved = {}
                if saved.get("suite", {}).get("key") == key:
                    print(
                        f"hyperqwen bench suite: [{index}/{len(chosen)}] {step.name}: kept from an earlier run "
                        f"({path})",
                        file=sys.stderr,
                    )
                    docs[step.name] = saved
                    continue
            progress = _Progress(step, index, len(chosen))
            client.on_request_done = [progress.tick]
            try:
                doc = await run_workload(_step_args(args, step), client=client, environment=environment)
            except BenchError as exc:
                # One workload the server cannot do (e.g. no prompt_logprobs) fails its step, not the run;
                # the step is not saved, so a re-run tries it again.
                doc = {
                    "workload": step.workload,
                    "error": str(exc),
                    "results": None,
                    "environment": environment,
                    "gates": {"ran": {"passed": False, "first_error": str(exc)[:300]}},
                    "warnings": {},
                }
                print(f"hyperqwen bench suite: {step.name}: {exc}", file=sys.stderr)
            finally:
                progress.close()
                client.on_request_done = []
            doc["suite"] = {"step": step.name, "key": key, "note": step.note, "quick": bool(args.quick)}
            if "error" not in doc:
                write_json_atomic(path, doc)
            docs[step.name] = doc
            failed = [n for n, g in doc["gates"].items() if not g["passed"]]
            if failed:
                print(f"hyperqwen bench suite: {step.name}: gates failed: {', '.join(failed)}", file=sys.stderr)
    finally:
        await client.close()
    summary = report.write_report(
        out, docs, environment=environment, quick=bool(args.quick), planned=[s.name for s in chosen]
    )
    return out, summary


def suite_command(args: argparse.Namespace) -> int:
    import asyncio

    from hyperqwen.bench.runner import missing_extra

    missing = missing_extra()
    if missing:
        print(
            f"hyperqwen bench suite: needs the bench extra ({missing} is not installed): {EXTRA_HINT}", file=sys.stderr
        )
        return Exit.BAD_INPUT
    try:
        out, summary = asyncio.run(run_suite(args))
    except (BenchError, FileNotFoundError) as exc:
        print(f"hyperqwen bench suite: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    for text in summary.get("warnings", {}).values():
        print(f"hyperqwen bench suite: warning: {text}", file=sys.stderr)
    print(f"hyperqwen bench suite: report: {out / 'report.md'} and {out / 'report.json'}", file=sys.stderr)
    if summary["failed_gates"]:
        print(f"hyperqwen bench suite: FAILED gates: {', '.join(summary['failed_gates'])}", file=sys.stderr)
        return Exit.FAILED
    return Exit.OK


def report_command(args: argparse.Namespace) -> int:
    """Rebuild report.json/report.md/plots from a suite directory's saved steps."""
    from hyperqwen.bench import report

    steps_dir = args.dir / "steps"
    docs = {}
    for path in sorted(steps_dir.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        docs[doc.get("suite", {}).get("step", path.stem)] = doc
    if not docs:
        print(
            f"hyperqwen bench report: {steps_dir} holds no step results; run `hyperqwen bench suite --out "
            f"{args.dir}` first",
            file=sys.stderr,
        )
        return Exit.BAD_INPUT
    environment = next(iter(docs.values()))["environment"]
    summary = report.write_report(
        args.dir,
        docs,
        environment=environment,
        quick=any(d.get("suite", {}).get("quick") for d in docs.values()),
        planned=list(docs),
    )
    print(f"hyperqwen bench report: {args.dir / 'report.md'}", file=sys.stderr)
    return Exit.FAILED if summary["failed_gates"] else Exit.OK


def register(inner: argparse._SubParsersAction) -> None:
    from hyperqwen.bench.runner import add_server_arguments

    doc = (
        "the whole field report against a running server: C1 chat decode (greedy and default sampling), the "
        "C1..64 ladder, prefill by length, prefix cache, long-document reproduction, long-document tasks, "
        "needle, GSM8K and perplexity; one JSON and one Markdown report with plots; exit 1 when a gate fails"
    )
    sub = inner.add_parser("suite", help="the whole field report in one command (resumable)", description=doc)
    add_server_arguments(sub)
    sub.add_argument(
        "--out",
        type=Path,
        help="output directory (default: bench-results/<UTC time>); completed "
        "steps in it are kept and skipped on a re-run",
    )
    sub.add_argument("--quick", action="store_true", help="every workload briefly (a smoke test, not a measurement)")
    sub.add_argument("--restart", action="store_true", help="discard completed steps in --out and run them all")
    sub.add_argument("--only", action="append", choices=STEP_NAMES, help="run only this step (repeatable)")
    sub.add_argument("--skip", action="append", choices=STEP_NAMES, help="leave this step out (repeatable)")
    sub.add_argument(
        "--gsm8k-full",
        action="store_true",
        help="fetch the full 1,319-question GSM8K test set from the Hugging Face hub (network) "
        "instead of the shipped 20-question sample",
    )
    sub.set_defaults(func=suite_command)
    rep = inner.add_parser("report", help="rebuild a suite directory's report.json, report.md and plots")
    rep.add_argument("dir", type=Path)
    rep.set_defaults(func=report_command)
