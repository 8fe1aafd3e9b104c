"""Bounded history of scrapes: rates per interval, window averages, and recent finished requests.

vLLM's /metrics holds counters and histograms, not per-request records. What can be derived, and how:

- Rates (tokens/s) are counter differences over the time between two scrapes.
- Mean TTFT over an interval is the difference of the TTFT histogram's _sum over that of its _count.
- Speculative decoding: tokens per verify step = 1 + accepted / drafts; per-position acceptance =
  accepted at position i / drafts (the fraction of steps whose i-th draft token was accepted).
- Finished requests: vLLM counts a finished request and observes its prompt tokens, output tokens, queue
  time, prefill time and end-to-end latency in one call, so between two scrapes the differences of those
  histograms' sums belong to exactly the requests finished in between. When exactly one request finished,
  the row is that request's exact numbers (`exact: true`); when several did, the row shows their count,
  totals and means (`exact: false`). Scraping more often (MONITOR_INTERVAL) makes single-request rows likelier.
- A request's own TTFT is not recorded at finish time. The table shows queue time + prefill time (engine
  clock: from entering the queue to the first token), which misses only the API server's tokenization and
  hand-off before the engine sees the request, so it is a slight underestimate of what the client saw.
- Counters that go down mean the server restarted: that interval counts from zero.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from hyperqwen.monitor.metrics import Histogram, Scrape

REQUEST_ROWS = 200  # recent finished-request rows kept


def _delta(after: float | None, before: float | None) -> float | None:
    """Counter difference; a decrease means the counter restarted from zero."""
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


def _hist_delta(after: Histogram, before: Histogram) -> Histogram:
    if after.count < before.count:
        return Histogram(after.sum, after.count)
    return Histogram(after.sum - before.sum, after.count - before.count)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


@dataclass
class Interval:
    """Counter differences between two consecutive scrapes, plus the gauges of the later one."""

    start: float
    end: float
    generation_tokens: float
    prompt_tokens: float
    finished: dict[str, float]
    ttft: Histogram
    e2e: Histogram
    queue: Histogram
    prefill: Histogram
    request_prompt_tokens: Histogram
    request_generation_tokens: Histogram
    prefix_queries: float | None
    prefix_hits: float | None
    ram_cache_queries: float | None
    ram_cache_hits: float | None
    spec_drafts: float | None
    spec_draft_tokens: float | None
    spec_accepted: float | None
    spec_accepted_per_pos: dict[int, float]
    running: float
    waiting: float
    kv_usage: float | None

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def finished_total(self) -> float:
        return sum(self.finished.values())

    @classmethod
    def between(cls, before: Scrape, after: Scrape) -> Interval:
        restarted = after.generation_tokens < before.generation_tokens or after.finished_total < before.finished_total
        base = Scrape(time=before.time) if restarted else before
        reasons = set(after.finished) | set(base.finished)
        return cls(
            start=before.time,
            end=after.time,
            generation_tokens=_delta(after.generation_tokens, base.generation_tokens) or 0.0,
            prompt_tokens=_delta(after.prompt_tokens, base.prompt_tokens) or 0.0,
            finished={
                r: d for r in sorted(reasons) if (d := _delta(after.finished.get(r, 0.0), base.finished.get(r, 0.0)))
            },
            ttft=_hist_delta(after.histogram("ttft"), base.histogram("ttft")),
            e2e=_hist_delta(after.histogram("e2e"), base.histogram("e2e")),
            queue=_hist_delta(after.histogram("queue"), base.histogram("queue")),
            prefill=_hist_delta(after.histogram("prefill"), base.histogram("prefill")),
            request_prompt_tokens=_hist_delta(
                after.histogram("request_prompt_tokens"), base.histogram("request_prompt_tokens")
            ),
            request_generation_tokens=_hist_delta(
                after.histogram("request_generation_tokens"), base.histogram("request_generation_tokens")
            ),
            prefix_queries=_delta(after.prefix_queries, base.prefix_queries),
            prefix_hits=_delta(after.prefix_hits, base.prefix_hits),
            ram_cache_queries=_delta(after.ram_cache_queries, base.ram_cache_queries),
            ram_cache_hits=_delta(after.ram_cache_hits, base.ram_cache_hits),
            spec_drafts=_delta(after.spec_drafts, base.spec_drafts),
            spec_draft_tokens=_delta(after.spec_draft_tokens, base.spec_draft_tokens),
            spec_accepted=_delta(after.spec_accepted, base.spec_accepted),
            spec_accepted_per_pos={
                p: _delta(v, base.spec_accepted_per_pos.get(p)) or 0.0
                for p, v in sorted(after.spec_accepted_per_pos.items())
            },
            running=after.running,
            waiting=after.waiting,
            kv_usage=after.kv_usage,
        )


@dataclass
class RequestRow:
    """Requests that finished between two scrapes (one request when `exact`)."""

    time: float  # the scrape that first saw them finished
    count: int
    finish_reasons: dict[str, int]
    prompt_tokens: float  # totals over the row's requests
    output_tokens: float
    duration_s: float  # mean end-to-end latency (vLLM's arrival to finish)
    ttft_s: float  # mean queue + prefill time, see the module docstring
    exact: bool

    @classmethod
    def from_interval(cls, interval: Interval) -> RequestRow | None:
        count = round(interval.finished_total)
        if count <= 0:
            return None
        return cls(
            time=interval.end,
            count=count,
            finish_reasons={r: round(n) for r, n in interval.finished.items()},
            prompt_tokens=interval.request_prompt_tokens.sum,
            output_tokens=interval.request_generation_tokens.sum,
            duration_s=interval.e2e.sum / count,
            ttft_s=(interval.queue.sum + interval.prefill.sum) / count,
            exact=count == 1,
        )


@dataclass
class Summary:
    """Rates and ratios over a run of intervals."""

    seconds: float
    generation_tps: float | None
    prompt_tps: float | None
    ttft_mean_s: float | None
    first_tokens: float
    finished: float
    prefix_hit_rate: float | None
    ram_cache_hit_tokens: float | None  # prompt tokens restored from the host-RAM tier (RAM_CACHE)
    ram_cache_hit_rate: float | None  # of the tokens looked up there
    spec_tokens_per_step: float | None
    spec_acceptance_rate: float | None
    spec_per_position: list[float] | None

    @classmethod
    def over(cls, intervals: list[Interval]) -> Summary:
        seconds = sum(i.seconds for i in intervals)
        gen = sum(i.generation_tokens for i in intervals)
        prompt = sum(i.prompt_tokens for i in intervals)
        ttft_sum = sum(i.ttft.sum for i in intervals)
        ttft_count = sum(i.ttft.count for i in intervals)
        queries = _sum_optional(i.prefix_queries for i in intervals)
        hits = _sum_optional(i.prefix_hits for i in intervals)
        ram_queries = _sum_optional(i.ram_cache_queries for i in intervals)
        ram_hits = _sum_optional(i.ram_cache_hits for i in intervals)
        drafts = _sum_optional(i.spec_drafts for i in intervals)
        draft_tokens = _sum_optional(i.spec_draft_tokens for i in intervals)
        accepted = _sum_optional(i.spec_accepted for i in intervals)
        per_pos: dict[int, float] = {}
        for interval in intervals:
            for pos, value in interval.spec_accepted_per_pos.items():
                per_pos[pos] = per_pos.get(pos, 0.0) + value
        per_step = None if not drafts or accepted is None else 1.0 + accepted / drafts
        return cls(
            seconds=seconds,
            generation_tps=_ratio(gen, seconds),
            prompt_tps=_ratio(prompt, seconds),
            ttft_mean_s=_ratio(ttft_sum, ttft_count),
            first_tokens=ttft_count,
            finished=sum(i.finished_total for i in intervals),
            prefix_hit_rate=_ratio(hits, queries),
            ram_cache_hit_tokens=ram_hits,
            ram_cache_hit_rate=_ratio(ram_hits, ram_queries),
            spec_tokens_per_step=per_step,
            spec_acceptance_rate=_ratio(accepted, draft_tokens),
            spec_per_position=[per_pos[p] / drafts for p in sorted(per_pos)] if drafts else None,
        )


def _prefix_cache_on(scrape: Scrape | None) -> bool:
    """vLLM exports the prefix-cache counters even with caching off; its cache_config_info says which."""
    if scrape is None:
        return False
    if "enable_prefix_caching" in scrape.cache_info:
        return scrape.cache_info["enable_prefix_caching"] == "True"
    return scrape.prefix_queries is not None


def _sum_optional(values) -> float | None:
    total = None
    for value in values:
        if value is not None:
            total = (total or 0.0) + value
    return total


@dataclass
class History:
    """The last `max_intervals` intervals and the last REQUEST_ROWS finished-request rows."""

    max_intervals: int
    intervals: deque[Interval] = field(init=False)
    requests: deque[RequestRow] = field(init=False)
    latest: Scrape | None = None

    def __post_init__(self) -> None:
        if self.max_intervals < 1:
            raise ValueError(f"max_intervals must be at least 1, got {self.max_intervals}")
        self.intervals = deque(maxlen=self.max_intervals)
        self.requests = deque(maxlen=REQUEST_ROWS)

    def add(self, scrape: Scrape) -> Interval | None:
        """Record a scrape; returns the interval it closes (None for the first one)."""
        previous, self.latest = self.latest, scrape
        if previous is None or scrape.time <= previous.time:
            return None
        interval = Interval.between(previous, scrape)
        self.intervals.append(interval)
        row = RequestRow.from_interval(interval)
        if row is not None:
            self.requests.append(row)
        return interval

    def window(self, seconds: float) -> list[Interval]:
        """The intervals ending within the last `seconds` (at least the latest one)."""
        if not self.intervals:
            return []
        end = self.intervals[-1].end
        chosen = [i for i in self.intervals if i.end > end - seconds]
        return chosen or [self.intervals[-1]]

    def summary(self, seconds: float) -> Summary:
        return Summary.over(self.window(seconds))

    def lifetime(self) -> dict[str, Any] | None:
        """Totals since the server started, straight from the latest scrape."""
        s = self.latest
        if s is None:
            return None
        return {
            "generation_tokens": s.generation_tokens,
            "prompt_tokens": s.prompt_tokens,
            "finished": dict(s.finished),
            "finished_total": s.finished_total,
            "preemptions": s.preemptions,
            "prefix_queries": s.prefix_queries,
            "prefix_hits": s.prefix_hits,
            "prefix_hit_rate": _ratio(s.prefix_hits, s.prefix_queries),
            "ram_cache_queries": s.ram_cache_queries,
            "ram_cache_hits": s.ram_cache_hits,
            "ram_cache_hit_rate": _ratio(s.ram_cache_hits, s.ram_cache_queries),
            "spec_drafts": s.spec_drafts,
            "spec_accepted": s.spec_accepted,
            "spec_tokens_per_step": (
                None if not s.spec_drafts or s.spec_accepted is None else 1.0 + s.spec_accepted / s.spec_drafts
            ),
            "spec_per_position": (
                [s.spec_accepted_per_pos[p] / s.spec_drafts for p in sorted(s.spec_accepted_per_pos)]
                if s.spec_drafts
                else None
            ),
            "ttft_mean_s": _ratio(s.histogram("ttft").sum, s.histogram("ttft").count),
        }

    def series(self) -> dict[str, list]:
        """One value per interval, oldest first, for the charts."""
        out: dict[str, list] = {
            k: []
            for k in (
                "t",
                "generation_tps",
                "prompt_tps",
                "ttft_s",
                "kv_usage",
                "running",
                "waiting",
                "prefix_hit_rate",
                "spec_tokens_per_step",
            )
        }
        for i in self.intervals:
            out["t"].append(i.end)
            out["generation_tps"].append(_ratio(i.generation_tokens, i.seconds))
            out["prompt_tps"].append(_ratio(i.prompt_tokens, i.seconds))
            out["ttft_s"].append(_ratio(i.ttft.sum, i.ttft.count))
            out["kv_usage"].append(i.kv_usage)
            out["running"].append(i.running)
            out["waiting"].append(i.waiting)
            out["prefix_hit_rate"].append(_ratio(i.prefix_hits, i.prefix_queries))
            out["spec_tokens_per_step"].append(
                None if not i.spec_drafts or i.spec_accepted is None else 1.0 + i.spec_accepted / i.spec_drafts
            )
        return out

    def state(self, windows: dict[str, float], now_seconds: float) -> dict[str, Any]:
        """Everything the page shows, as JSON-ready data."""
        latest = self.latest
        return {
            "now": {
                **asdict(self.summary(now_seconds)),
                "running": latest.running if latest else None,
                "waiting": latest.waiting if latest else None,
                "kv_usage": latest.kv_usage if latest else None,
            },
            "windows": {name: asdict(self.summary(seconds)) for name, seconds in windows.items()},
            "lifetime": self.lifetime(),
            "series": self.series(),
            "requests": [asdict(r) for r in reversed(self.requests)],
            "speculative": bool(latest and latest.spec_drafts is not None),
            "prefix_cache": _prefix_cache_on(latest),
            # A KV connector answered lookups (RAM_CACHE): vLLM exports its counters at 0 on every server.
            "ram_cache": bool(latest and latest.ram_cache_queries),
            "model_name": latest.model_name if latest else None,
            "cache_info": latest.cache_info if latest else {},
        }
