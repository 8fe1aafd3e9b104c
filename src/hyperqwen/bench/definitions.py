"""Every number the bench publishes, defined once.

The texts in DEFINITIONS are the documentation: bench/README.md carries them verbatim (a unit test
checks it) and the Markdown renderer prints them under the tables. Change a definition here, then
update the README.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

DEFINITIONS_VERSION = 2

DEFINITIONS: dict[str, str] = {
    "ttft_s": (
        "TTFT (time to first token), seconds: from the moment the request's bytes are handed to the "
        "connection (the client's request-sent event, so the harness's own queueing is excluded) to the "
        "arrival of the first streamed chunk that carries output (content, reasoning or tool-call text)."
    ),
    "output_tokens": (
        "Output tokens: `usage.completion_tokens` from the server's final streamed chunk "
        "(the request sets `stream_options.include_usage`); chunks are never counted as tokens, "
        "because one chunk can carry several tokens (speculative decoding). If a server sends no usage, "
        "the run warns and counts the streamed text with the server's `/tokenize` route "
        "(`output_tokens_source: tokenize`); only when that fails too are chunks counted "
        "(`output_tokens_source: chunks`) and the decode numbers marked unreliable."
    ),
    "decode_tok_s": (
        "Per-stream decode rate (ours), tokens/s: (output tokens - 1) / (t_last - t_first), where t_first and "
        "t_last are the arrival times of the first and last output-bearing chunks of that stream. "
        "Undefined (omitted) for streams with fewer than 2 output tokens or a single output chunk."
    ),
    "tpot_ms": (
        "TPOT (time per output token), milliseconds, as `vllm bench serve` defines it "
        "(vllm/benchmarks/serve.py, calculate_metrics): (latency - TTFT) / (output tokens - 1) x 1000 with "
        "latency the arrival of the last output-bearing chunk, i.e. (t_last - t_first) / (output tokens - 1); "
        "requests with 1 output token have none. The reciprocal of the per-stream decode rate."
    ),
    "itl_ms": (
        "ITL (inter-token latency), milliseconds, as `vllm bench serve` defines it "
        "(vllm/benchmarks/lib/endpoint_request_func.py): the gaps between successive output-bearing chunks of "
        "a stream, pooled over all requests of a cohort. A chunk carrying several tokens (speculative "
        "decoding) is one gap, so ITL is per chunk, not per token."
    ),
    "decode_reference_tok_s": (
        "Decode rate by the reference's definition, tokens/s: C x 1000 / mean TPOT (ms), C the cohort's "
        "concurrency and the mean over its requests; what the reference setup published from `vllm bench "
        "serve`. Shown beside ours; for C1 it equals 1000 / mean TPOT."
    ),
    "steady_decode_tok_s": (
        "Steady-state decode, tokens/s: output tokens that arrived while every stream of the cohort was "
        "decoding (from the latest first chunk to the earliest last chunk) divided by that window; a "
        "request's tokens are spread evenly over its chunks. Excludes ramp-up and tail, unlike aggregate."
    ),
    "e2e_s": "End-to-end latency, seconds: from the same send moment as TTFT to the end of its stream.",
    "aggregate_tok_s": (
        "Aggregate throughput, tokens/s: the sum of output tokens of all requests of a cohort divided by "
        "the cohort's wall time (first request sent to last stream ended). Includes prefill and queueing."
    ),
    "prefill_tok_s": (
        "Prefill rate, tokens/s: prompt tokens (`usage.prompt_tokens`) / TTFT, for requests with "
        "`max_tokens` 1 and a salted prompt so the prefix cache cannot help."
    ),
    "tokens_per_verify_step": (
        "Tokens per verify step: 1 + delta(vllm:spec_decode_num_accepted_tokens_total) / "
        "delta(vllm:spec_decode_num_drafts_total), deltas of the server's /metrics counters between "
        "just before and just after the run (other traffic on the server during the run pollutes it). "
        "1.0 means no speculation or nothing accepted; absent when the server exposes no such counters."
    ),
    "acceptance_per_position": (
        "Per-position acceptance: delta(vllm:spec_decode_num_accepted_tokens_per_pos_total{position=i}) / "
        "delta(vllm:spec_decode_num_drafts_total), for draft position i = 0, 1, ..."
    ),
    "acceptance_rate": (
        "Draft acceptance rate: delta(vllm:spec_decode_num_accepted_tokens_total) / "
        "delta(vllm:spec_decode_num_draft_tokens_total)."
    ),
    "statistics": (
        "Mean, median, p90 and p99: the arithmetic mean and percentiles with linear interpolation between "
        "closest ranks (Hyndman-Fan type 7, numpy's default, which `vllm bench serve` uses), over the "
        "requests of one cohort (over the pooled gaps for ITL)."
    ),
    "salt": (
        "Salting: when the prefix cache must not help, every prompt starts with a unique line "
        "`[bench <run-id> <request-index>]` so no two requests share a first cache block."
    ),
}


def percentile(values: Sequence[float], q: float) -> float:
    """Type-7 percentile (linear interpolation between closest ranks), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    lower = math.floor(rank)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = rank - lower
    return float(ordered[lower] + (ordered[upper] - ordered[lower]) * fraction)


def summarize(values: Iterable[float | None]) -> dict | None:
    """Mean, median, p90, p99, min, max and count of the defined values; None when there are none."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return {
        "median": percentile(present, 50),
        "p90": percentile(present, 90),
        "p99": percentile(present, 99),
        "mean": statistics.fmean(present),
        "min": min(present),
        "max": max(present),
        "n": len(present),
    }


@dataclass
class RequestRecord:
    """What one streamed request measured. Times are time.perf_counter() seconds."""

    t_sent: float
    t_first: float | None = None  # first output-bearing chunk
    t_last: float | None = None  # last output-bearing chunk
    t_end: float | None = None  # stream closed
    output_chunks: int = 0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each output-bearing chunk
    output_tokens: int | None = None
    output_tokens_source: str = "usage"  # "usage" | "tokenize" | "chunks"
    prompt_tokens: int | None = None
    text: str = ""
    reasoning: str = ""
    tool_calls: list = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_sent

    @property
    def e2e_s(self) -> float | None:
        return None if self.t_end is None else self.t_end - self.t_sent

    @property
    def decode_tok_s(self) -> float | None:
        n = self.output_tokens
        if n is None or n < 2 or self.t_first is None or self.t_last is None:
            return None
        span = self.t_last - self.t_first
        if span <= 0:
            return None
        return (n - 1) / span

    @property
    def tpot_ms(self) -> float | None:
        rate = self.decode_tok_s
        return None if rate is None else 1000.0 / rate

    @property
    def itl_s(self) -> list[float]:
        """Gaps between successive output-bearing chunks (vllm bench serve's ITL)."""
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def prefill_tok_s(self) -> float | None:
        ttft = self.ttft_s
        if self.prompt_tokens is None or ttft is None or ttft <= 0:
            return None
        return self.prompt_tokens / ttft

    def to_json(self, keep_text: bool = False) -> dict:
        out = {
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "decode_tok_s": self.decode_tok_s,
            "tpot_ms": self.tpot_ms,
            "output_tokens": self.output_tokens,
            "output_tokens_source": self.output_tokens_source,
            "output_chunks": self.output_chunks,
            "prompt_tokens": self.prompt_tokens,
            "finish_reason": self.finish_reason,
        }
        if self.error:
            out["error"] = self.error
        if keep_text:
            out["text"] = self.text
        return out


def steady_decode(records: Sequence[RequestRecord]) -> float | None:
    """Tokens/s while every stream decodes (see DEFINITIONS["steady_decode_tok_s"]); None when no such window."""
    ok = [r for r in records if r.error is None and r.output_tokens and len(r.chunk_times) >= 2]
    if len(ok) < 1:
        return None
    start = max(r.chunk_times[0] for r in ok)
    stop = min(r.chunk_times[-1] for r in ok)
    if stop <= start:
        return None
    tokens = 0.0
    for r in ok:
        per_chunk = (r.output_tokens or 0) / len(r.chunk_times)
        # Chunks strictly after the window's start: a chunk at `start` ends the gap before the window.
        tokens += per_chunk * sum(1 for t in r.chunk_times if start < t <= stop)
    return tokens / (stop - start)


def cohort_summary(
    records: Sequence[RequestRecord], t_start: float, t_stop: float, concurrency: int | None = None
) -> dict:
    """Every per-request metric summarised, plus aggregate throughput over the cohort's wall time."""
    ok = [r for r in records if r.error is None]
    total_out = sum(r.output_tokens or 0 for r in ok)
    wall = t_stop - t_start
    sources = sorted({r.output_tokens_source for r in ok})
    tpot = summarize(r.tpot_ms for r in ok)
    c = concurrency if concurrency is not None else len(records)
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "output_tokens_total": total_out,
        "output_tokens_source": ",".join(sources) if sources else None,
        "wall_s": wall,
        "aggregate_tok_s": (total_out / wall) if wall > 0 and ok else None,
        "steady_decode_tok_s": steady_decode(ok),
        "decode_reference_tok_s": (c * 1000.0 / tpot["mean"]) if tpot and tpot["mean"] > 0 else None,
        "ttft_s": summarize(r.ttft_s for r in ok),
        "decode_tok_s": summarize(r.decode_tok_s for r in ok),
        "tpot_ms": tpot,
        "itl_ms": summarize(gap * 1000.0 for r in ok for gap in r.itl_s),
        "e2e_s": summarize(r.e2e_s for r in ok),
        "prompt_tokens": summarize(r.prompt_tokens for r in ok),
        "output_tokens": summarize(r.output_tokens for r in ok),
    }
