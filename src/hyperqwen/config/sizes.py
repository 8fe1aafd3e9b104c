"""Byte sizes as people write them, with one unit rule for every knob and flag.

    B                      1
    kB KB MB GB TB         powers of 1000   (what disk makers and SI mean: 5GB = 5,000,000,000)
    KiB MiB GiB TiB        powers of 1024   (5GiB = 5,368,709,120)
    K M G T  (bare)        powers of 1024, as `docker run --memory 5g` and `ls -h` read them

Case does not matter ("5gib", "5Gb"); a fraction is allowed with a unit ("5.2GiB"), never for bare bytes.
"""

from __future__ import annotations

import math
import re

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4

UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "k": KiB,
    "m": MiB,
    "g": GiB,
    "t": TiB,
}
UNIT_RULE = "GB = 10^9 bytes, GiB = 2^30; a bare G (as docker reads it) = GiB"
EXAMPLES = "5368709120, 5GiB, 5.2G, 512MiB, 6GB"

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


class SizeError(ValueError):
    """The text is not a size; the message says why (without naming the knob: callers add that)."""


def parse_size(text: str) -> int:
    """'5GiB' -> 5368709120, '5GB' -> 5000000000, '512' -> 512. Raises SizeError."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise SizeError(f"is not a size (write e.g. {EXAMPLES})")
    number, unit = match.groups()
    factor = UNITS.get(unit.lower())
    if factor is None:
        raise SizeError(f"has an unknown unit {unit!r} (use B, KB/MB/GB/TB or KiB/MiB/GiB/TiB)")
    if "." in number:
        if factor == 1:
            raise SizeError("is a fraction of a byte")
        value = float(number) * factor
        if not math.isfinite(value):
            raise SizeError("is too large")
        return int(value)
    return int(number) * factor


def format_size(n: int) -> str:
    """Bytes as GiB with two decimals (how the planner and docs show memory)."""
    return f"{n / GiB:.2f} GiB"
