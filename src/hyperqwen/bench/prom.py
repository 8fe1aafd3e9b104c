"""What the bench reads from the server's /metrics: speculative-decoding counters and the KV pool size.

Parsing is hyperqwen.formats.prometheus, shared with the monitor."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hyperqwen.formats.prometheus import PrometheusFormatError, Sample, samples

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"


def parse_metrics(text: str) -> list[Sample]:
    """Samples of the server's /metrics (hyperqwen.formats.prometheus); text that is not Prometheus: none."""
    try:
        return list(samples(text))
    except PrometheusFormatError:
        return []


@dataclass
class CounterSnapshot:
    """The counters the bench takes deltas of, summed over engines (label sets)."""

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    prefix_queries: float | None = None
    prefix_hits: float | None = None

    @classmethod
    def from_text(cls, text: str) -> CounterSnapshot:
        snap = cls()
        for sample in parse_metrics(text):
            name, labels, value = sample.name, sample.labels, sample.value
            if name == DRAFTS:
                snap.drafts = (snap.drafts or 0.0) + value
            elif name == DRAFT_TOKENS:
                snap.draft_tokens = (snap.draft_tokens or 0.0) + value
            elif name == ACCEPTED:
                snap.accepted = (snap.accepted or 0.0) + value
            elif name == ACCEPTED_PER_POS and "position" in labels:
                pos = int(labels["position"])
                snap.accepted_per_pos[pos] = snap.accepted_per_pos.get(pos, 0.0) + value
            elif name == PREFIX_QUERIES:
                snap.prefix_queries = (snap.prefix_queries or 0.0) + value
            elif name == PREFIX_HITS:
                snap.prefix_hits = (snap.prefix_hits or 0.0) + value
        return snap


def _delta(after: float | None, before: float | None) -> float | None:
    if after is None:
        return None
    return after - (before or 0.0)


def spec_decode_delta(before: CounterSnapshot | None, after: CounterSnapshot | None) -> dict | None:
    """Tokens per verify step, acceptance rate and per-position acceptance over one run.

    None when the server has no spec-decode counters (no speculation, or not vLLM)."""
    if before is None or after is None or after.drafts is None:
        return None
    drafts = _delta(after.drafts, before.drafts) or 0.0
    accepted = _delta(after.accepted, before.accepted) or 0.0
    draft_tokens = _delta(after.draft_tokens, before.draft_tokens)
    out: dict = {"drafts": drafts, "accepted_tokens": accepted, "draft_tokens": draft_tokens}
    if drafts <= 0:
        out.update(tokens_per_verify_step=None, acceptance_rate=None, acceptance_per_position=None)
        return out
    out["tokens_per_verify_step"] = 1.0 + accepted / drafts
    out["acceptance_rate"] = (accepted / draft_tokens) if draft_tokens else None
    positions = sorted(after.accepted_per_pos)
    out["acceptance_per_position"] = [
        (after.accepted_per_pos[p] - before.accepted_per_pos.get(p, 0.0)) / drafts for p in positions
    ] or None
    return out


def prefix_cache_delta(before: CounterSnapshot | None, after: CounterSnapshot | None) -> dict | None:
    if before is None or after is None or after.prefix_queries is None:
        return None
    queries = _delta(after.prefix_queries, before.prefix_queries) or 0.0
    hits = _delta(after.prefix_hits, before.prefix_hits) or 0.0
    return {"queried_tokens": queries, "hit_tokens": hits, "hit_rate": (hits / queries) if queries else None}


def pool_size_from_metrics(text: str) -> dict | None:
    """KV pool size in tokens from vllm:cache_config_info labels (kv_cache_size_tokens, else blocks x block size)."""
    for sample in parse_metrics(text):
        if sample.name != CACHE_CONFIG_INFO:
            continue
        labels = sample.labels
        info: dict = {"source": "/metrics vllm:cache_config_info"}
        for key in (
            "kv_cache_size_tokens",
            "num_gpu_blocks",
            "block_size",
            "cache_dtype",
            "enable_prefix_caching",
            "mamba_ssm_cache_dtype",
            "kv_cache_memory_bytes",
            "gpu_memory_utilization",
        ):
            if key in labels and labels[key] not in ("", "None"):
                info[key] = labels[key]
        tokens = _as_int(info.get("kv_cache_size_tokens"))
        if tokens is None:
            blocks, block_size = _as_int(info.get("num_gpu_blocks")), _as_int(info.get("block_size"))
            if blocks is not None and block_size is not None:
                tokens = blocks * block_size
        info["pool_tokens"] = tokens
        return info
    return None


_LOG_POOL = re.compile(r"KV cache size: ([\d,]+) tokens")


def pool_size_from_log(text: str) -> dict | None:
    """Pool size from the vLLM log line '<device> KV cache size: N tokens, ...' (last one wins)."""
    matches = _LOG_POOL.findall(text)
    if not matches:
        return None
    return {"source": "server log", "pool_tokens": int(matches[-1].replace(",", ""))}


def _as_int(value) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None
