"""Prometheus text exposition, parsed once with prometheus_client's own parser.

Both the bench (counter deltas around a workload) and the monitor (one scrape reduced to a dashboard's
numbers) read vLLM's `/metrics` through `samples()`; neither carries a parser of its own. Sample names keep
prometheus_client's suffixes (`_total` on counters, `_sum`/`_count` on histograms).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


class PrometheusFormatError(ValueError):
    """The text is not a Prometheus text exposition."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def samples(text: str) -> Iterator[Sample]:
    """Every sample of a Prometheus text exposition. Raises PrometheusFormatError on malformed text."""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:  # prometheus_client raises ValueError (or subclasses) on malformed lines
        raise PrometheusFormatError(f"not Prometheus text: {exc}") from None
    for family in families:
        for sample in family.samples:
            yield Sample(sample.name, dict(sample.labels), float(sample.value))


def sum_by_name(text: str, names: set[str]) -> dict[str, float]:
    """Each wanted sample name summed over its label sets (engines, model names); absent names are left out."""
    out: dict[str, float] = {}
    for sample in samples(text):
        if sample.name in names:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out
