"""Speculative-decoding modes side by side: tokens per verify step, acceptance per draft position, and whether
greedy output is identical, token for token, to the same prompts without speculation (SPEC=none).

One server per SPEC value serves the same model; `measure_mode` sends the same prompts to each (greedy,
`ignore_eos`, token ids back from vLLM's `/v1/completions`), reads the spec-decode counters from `/metrics`
before and after each workload (definitions: `tokens_per_verify_step`, `acceptance_per_position`,
`acceptance_rate` in definitions.py), and `compare_outputs` checks each mode's token ids against the SPEC=none
server's. `spec_modes_result` makes one `hyperqwen-bench/1` result file of all modes (workload `spec_modes`),
which `hyperqwen bench render` turns into the table in docs/benchmarks.md.

The CPU run on the tiny test models (scripts/bench_spec_cpu.py) measures mechanics: how many drafts a mode
proposes and verifies per step on outputs whose every token is known. Its rates say nothing about a GPU.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from hyperqwen.bench import prom
from hyperqwen.formats import http

WORKLOAD = "spec_modes"


@dataclass(frozen=True)
class SpecPrompt:
    """One greedy request: `prompt` is text or token ids (the completions API takes both)."""

    name: str
    workload: str  # a group of prompts measured together, e.g. "chat" or "document"
    prompt: str | list[int]
    max_tokens: int


class SpecBenchError(RuntimeError):
    """A mode could not be measured; the message names the server URL and what went wrong."""


def _metrics(base_url: str, api_key: str | None) -> prom.CounterSnapshot:
    response = http.get(f"{base_url}/metrics", api_key=api_key, timeout=30)
    if not response.ok:
        raise SpecBenchError(f"GET {base_url}/metrics: HTTP {response.status} {response.brief()}")
    return prom.CounterSnapshot.from_text(response.text())


def greedy_token_ids(
    base_url: str, api_key: str | None, model: str, prompt: SpecPrompt, timeout: float = 600
) -> list[int]:
    """Exactly max_tokens greedy token ids (EOS ignored, so every mode decodes the same length)."""
    payload = {
        "model": model,
        "prompt": prompt.prompt,
        "max_tokens": prompt.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    response = http.post(f"{base_url}/v1/completions", payload, api_key=api_key, timeout=timeout)
    if not response.ok:
        raise SpecBenchError(
            f"POST {base_url}/v1/completions ({prompt.name}): HTTP {response.status} {response.brief()}"
        )
    ids = response.json()["choices"][0].get("token_ids")
    if not isinstance(ids, list) or len(ids) != prompt.max_tokens:
        raise SpecBenchError(
            f"{base_url} ({prompt.name}): expected {prompt.max_tokens} token ids, got "
            f"{len(ids) if isinstance(ids, list) else ids!r} (vLLM's return_token_ids)"
        )
    return [int(i) for i in ids]


def measure_mode(base_url: str, api_key: str | None, model: str, prompts: list[SpecPrompt]) -> dict[str, Any]:
    """Run each workload's prompts one after another (C1) on one server; counters per workload.

    Returns {"workloads": {name: {...numbers...}}, "outputs": {prompt name: token ids}}.
    """
    workloads: dict[str, Any] = {}
    outputs: dict[str, list[int]] = {}
    for workload in dict.fromkeys(p.workload for p in prompts):
        group = [p for p in prompts if p.workload == workload]
        before = _metrics(base_url, api_key)
        started = time.perf_counter()
        for prompt in group:
            outputs[prompt.name] = greedy_token_ids(base_url, api_key, model, prompt)
        wall = time.perf_counter() - started
        after = _metrics(base_url, api_key)
        tokens = sum(p.max_tokens for p in group)
        workloads[workload] = {
            "requests": len(group),
            "output_tokens": tokens,
            "wall_s": wall,
            "output_tok_s": tokens / wall if wall > 0 else None,
            "spec_decode": prom.spec_decode_delta(before, after),
        }
    return {"workloads": workloads, "outputs": outputs}


def _digest(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def compare_outputs(
    reference: dict[str, list[int]], outputs: dict[str, list[int]], prompts: list[SpecPrompt]
) -> dict[str, Any]:
    """Per workload: how many outputs equal the reference's token for token, and where the first one forks."""
    result: dict[str, Any] = {}
    for workload in dict.fromkeys(p.workload for p in prompts):
        names = [p.name for p in prompts if p.workload == workload]
        identical = 0
        forks = {}
        for name in names:
            ref, got = reference[name], outputs[name]
            if ref == got:
                identical += 1
            else:
                forks[name] = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
        result[workload] = {
            "identical": identical,
            "of": len(names),
            "first_difference": forks,
            "digests": {name: _digest(outputs[name]) for name in names},
        }
    return result


def spec_modes_result(
    *,
    model: str,
    environment: dict[str, Any],
    modes: list[dict[str, Any]],
    run_id: str,
    seed: int,
    duration_s: float,
    command: str,
    note: str,
) -> dict[str, Any]:
    """One result document for all modes. Each mode: {"spec", "knobs", "workloads", "identical"}.

    Gate `identical_to_no_speculation`: every output of every mode equals SPEC=none's (greedy is exact here:
    the verify step keeps only tokens the target itself would have chosen).
    """
    from hyperqwen.bench.definitions import DEFINITIONS_VERSION
    from hyperqwen.bench.render import SCHEMA

    forks = {
        m["spec"]: {w: c["first_difference"] for w, c in m["identical"].items() if c["first_difference"]} for m in modes
    }
    forks = {spec: f for spec, f in forks.items() if f}
    return {
        "schema": SCHEMA,
        "definitions_version": DEFINITIONS_VERSION,
        "workload": WORKLOAD,
        "model": model,
        "run_id": run_id,
        "seed": seed,
        "params": {"temperature": 0.0, "command": command},
        "duration_s": duration_s,
        "environment": environment,
        "gates": {"identical_to_no_speculation": {"passed": not forks, "forks": forks}},
        "warnings": {},
        "results": {"note": note, "modes": modes},
    }
