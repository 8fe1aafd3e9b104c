"""One scrape of vLLM's Prometheus `/metrics`, reduced to the numbers the monitor shows.

Parsing is hyperqwen.formats.prometheus (prometheus_client's own text parser), shared with the bench. Every
value is summed over label sets (one per engine and model name), except where a label is the point: the finish
reason of finished requests and the draft position of speculative acceptance. Metric names are those vLLM 0.32.0
registers (vllm/v1/metrics/loggers.py and vllm/v1/spec_decode/metrics.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hyperqwen.formats.prometheus import PrometheusFormatError, samples

# Counters (sample names carry prometheus_client's `_total` suffix).
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"  # label finished_reason: stop | length | abort | error | ...
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"  # tokens looked up in the prefix cache
PREFIX_HITS = "vllm:prefix_cache_hits_total"  # of those, tokens found
# The KV connector's lookups: with RAM_CACHE (vLLM's native offloading connector) the host-RAM tier. vLLM exports
# them on every server (0 without a connector); tokens, like the prefix-cache pair.
RAM_CACHE_QUERIES = "vllm:external_prefix_cache_queries_total"
RAM_CACHE_HITS = "vllm:external_prefix_cache_hits_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"  # verify steps that carried drafts
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label position: 0..k-1

# Gauges.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a fraction: 1.0 is a full KV pool

# Histograms whose _sum and _count the monitor uses. vLLM observes TTFT when a request's first token
# arrives; all the others when a request finishes, in the same call that counts it in REQUEST_SUCCESS.
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "request_prompt_tokens": "vllm:request_prompt_tokens",
    "request_generation_tokens": "vllm:request_generation_tokens",
}

CACHE_CONFIG_INFO = "vllm:cache_config_info"


class MetricsFormatError(ValueError):
    """The upstream answered, but not with Prometheus text from a vLLM server."""


@dataclass
class Histogram:
    sum: float = 0.0
    count: float = 0.0


@dataclass
class Scrape:
    """The numbers of one /metrics scrape, taken at `time` (seconds since the epoch)."""

    time: float
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    preemptions: float = 0.0
    finished: dict[str, float] = field(default_factory=dict)  # finished requests by finish reason
    prefix_queries: float | None = None  # None: the server exports no prefix-cache counters
    prefix_hits: float | None = None
    ram_cache_queries: float | None = None  # None: the server exports no connector counters
    ram_cache_hits: float | None = None
    spec_drafts: float | None = None  # None: no speculative decoding on this server
    spec_draft_tokens: float | None = None
    spec_accepted: float | None = None
    spec_accepted_per_pos: dict[int, float] = field(default_factory=dict)
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float | None = None
    histograms: dict[str, Histogram] = field(default_factory=dict)
    model_name: str | None = None
    cache_info: dict[str, str] = field(default_factory=dict)

    @property
    def finished_total(self) -> float:
        return sum(self.finished.values())

    def histogram(self, key: str) -> Histogram:
        return self.histograms.get(key, Histogram())


_HISTOGRAM_BY_NAME = {name: key for key, name in HISTOGRAMS.items()}

# Counters summed over label sets into a Scrape field that stays None while the server exports none of them.
_OPTIONAL_COUNTERS = {
    PREFIX_QUERIES: "prefix_queries",
    PREFIX_HITS: "prefix_hits",
    RAM_CACHE_QUERIES: "ram_cache_queries",
    RAM_CACHE_HITS: "ram_cache_hits",
    SPEC_DRAFTS: "spec_drafts",
    SPEC_DRAFT_TOKENS: "spec_draft_tokens",
    SPEC_ACCEPTED: "spec_accepted",
}


def _add(current: float | None, value: float) -> float:
    return (current or 0.0) + value


def parse_scrape(text: str, time: float) -> Scrape:
    """Reduce a Prometheus text exposition to a Scrape. Raises MetricsFormatError if it is not vLLM's."""
    scrape = Scrape(time=time)
    seen_vllm = False
    try:
        parsed = list(samples(text))
    except PrometheusFormatError as exc:
        raise MetricsFormatError(str(exc)) from None
    for sample in parsed:
        name, labels, value = sample.name, sample.labels, sample.value
        if not name.startswith("vllm:"):
            continue
        seen_vllm = True
        if scrape.model_name is None and labels.get("model_name"):
            scrape.model_name = labels["model_name"]
        if name == GENERATION_TOKENS:
            scrape.generation_tokens += value
        elif name == PROMPT_TOKENS:
            scrape.prompt_tokens += value
        elif name == PREEMPTIONS:
            scrape.preemptions += value
        elif name == REQUEST_SUCCESS:
            reason = labels.get("finished_reason", "unknown")
            scrape.finished[reason] = scrape.finished.get(reason, 0.0) + value
        elif name in _OPTIONAL_COUNTERS:
            attr = _OPTIONAL_COUNTERS[name]
            setattr(scrape, attr, _add(getattr(scrape, attr), value))
        elif name == SPEC_ACCEPTED_PER_POS and "position" in labels:
            pos = int(labels["position"])
            scrape.spec_accepted_per_pos[pos] = scrape.spec_accepted_per_pos.get(pos, 0.0) + value
        elif name == RUNNING:
            scrape.running += value
        elif name == WAITING:
            scrape.waiting += value
        elif name == KV_USAGE:
            # Several engines: show the fullest pool, the one that limits admission.
            scrape.kv_usage = value if scrape.kv_usage is None else max(scrape.kv_usage, value)
        elif name == CACHE_CONFIG_INFO:
            scrape.cache_info = {k: v for k, v in labels.items() if v not in ("", "None")}
        elif name.endswith(("_sum", "_count")):
            base, _, part = name.rpartition("_")
            key = _HISTOGRAM_BY_NAME.get(base)
            if key is not None:
                hist = scrape.histograms.setdefault(key, Histogram())
                setattr(hist, part, getattr(hist, part) + value)
    if not seen_vllm:
        raise MetricsFormatError("no vllm: metrics in the answer; is the upstream URL a vLLM server?")
    return scrape
