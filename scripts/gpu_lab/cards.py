"""Card emulation: a larger GPU given the memory budget of a named card, the arithmetic in one place.

vLLM sizes everything from `gpu_memory_utilization x CUDA total` (vllm/v1/worker/gpu_worker.py,
requested_memory). So a lab GPU of total T booted with util u x C / T requests the bytes a card of CUDA total C
requests at util u: the same weights, activation peak, graphs and pool arithmetic, on a faster chip.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from hyperqwen.memory.gpu import CARDS, find_card  # noqa: E402

MiB = 1 << 20


class EmulationError(ValueError):
    pass


def card_cuda_total_bytes(card: str) -> int:
    found = find_card(card)
    if found is None:
        raise EmulationError(f"unknown card {card!r}: use one of {', '.join(sorted(CARDS))}")
    return found.linux_mib * MiB


def emulated_gpu_util(card: str, card_gpu_util: float, device_total_bytes: int) -> float:
    """GPU_UTIL for the lab GPU so that vLLM requests what `card` requests at `card_gpu_util`. Rounded down
    at the sixth decimal: the lab never gets more bytes than the card would."""
    if not 0 < card_gpu_util <= 1:
        raise EmulationError(f"GPU_UTIL {card_gpu_util} is not in (0, 1]")
    card_total = card_cuda_total_bytes(card)
    if device_total_bytes < card_total:
        raise EmulationError(
            f"this GPU has {device_total_bytes / MiB:,.0f} MiB (CUDA total), less than the emulated {card}'s "
            f"{card_total / MiB:,.0f} MiB: emulate a smaller card or use a larger GPU"
        )
    return math.floor(card_gpu_util * card_total / device_total_bytes * 1e6) / 1e6
