"""Prompts being filled right now, from the server's `/hyperqwen/prefill` route (vLLM patch 0060).

/metrics has no per-request view: vLLM counts prompt tokens only once a request finishes its prefill. Patch 0060
makes the engine report each prompt's computed tokens after every prefill chunk and serves the prompts still
filling as JSON:

    {"stream_interval_s": 1.0,
     "requests": [{"id": "chatcmpl-…", "computed_tokens": 12288, "prompt_tokens": 100000,
                   "tokens_per_s": 1032.5, "seconds_since_update": 0.4}]}

`tokens_per_s` is measured between the request's first and latest chunk report (null after one report). The
monitor adds the fraction done and an estimate of the time left at that rate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

PREFILL_PATH = "/hyperqwen/prefill"


class PrefillFormatError(ValueError):
    pass


@dataclass(frozen=True)
class PrefillRow:
    id: str
    computed_tokens: int
    prompt_tokens: int
    tokens_per_s: float | None
    seconds_since_update: float

    @property
    def fraction(self) -> float:
        return self.computed_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the measured rate, counted from the last report; None without a rate."""
        if not self.tokens_per_s or self.tokens_per_s <= 0:
            return None
        left = (self.prompt_tokens - self.computed_tokens) / self.tokens_per_s
        return max(0.0, left - self.seconds_since_update)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": self.fraction, "eta_s": self.eta_s}


def _number(row: dict[str, Any], field: str, *, optional: bool = False) -> float | None:
    value = row.get(field)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise PrefillFormatError(f"{PREFILL_PATH}: field {field!r} is {value!r}; expected a number >= 0")
    return float(value)


def parse_prefill(doc: Any) -> list[PrefillRow]:
    """The route's JSON → rows, largest prompt first. Raises PrefillFormatError naming the bad field."""
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise PrefillFormatError(f"{PREFILL_PATH}: expected an object with a 'requests' list, got {str(doc)[:120]!r}")
    rows = []
    for row in doc["requests"]:
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise PrefillFormatError(f"{PREFILL_PATH}: a request row without a string 'id': {str(row)[:120]!r}")
        computed = int(_number(row, "computed_tokens") or 0)
        total = int(_number(row, "prompt_tokens") or 0)
        if computed > total:
            raise PrefillFormatError(
                f"{PREFILL_PATH}: request {row['id']!r} has computed_tokens {computed} > prompt_tokens {total}"
            )
        rows.append(
            PrefillRow(
                id=row["id"],
                computed_tokens=computed,
                prompt_tokens=total,
                tokens_per_s=_number(row, "tokens_per_s", optional=True),
                seconds_since_update=_number(row, "seconds_since_update") or 0.0,
            )
        )
    rows.sort(key=lambda r: (-r.prompt_tokens, r.id))
    return rows
