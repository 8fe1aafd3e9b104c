"""Memory planner: what fits on the card, computed before vLLM loads anything.

Public API (pure; no torch import at module import time):
    plan_memory(settings, gpu, *, model_dir=None, terms=None, max_len=None) -> MemoryBudget
    parse_gpu("rtx3090" | "24GiB", reserved=None, wsl2=False) -> GpuFacts
    read_gpu_facts() -> GpuFacts | None
"""

from hyperqwen.memory.budget import (
    LayoutKnobs,
    MemoryBudget,
    MemoryInputs,
    MemoryPlanError,
    Outcome,
    Term,
    build_layout,
    largest_max_len_that_fits,
    plan_memory,
)
from hyperqwen.memory.checkpoint import CheckpointError
from hyperqwen.memory.gpu import CARDS, GpuError, GpuFacts, parse_gpu, read_gpu_facts

__all__ = [
    "CARDS",
    "CheckpointError",
    "GpuError",
    "GpuFacts",
    "LayoutKnobs",
    "MemoryBudget",
    "MemoryInputs",
    "MemoryPlanError",
    "Outcome",
    "Term",
    "build_layout",
    "largest_max_len_that_fits",
    "parse_gpu",
    "plan_memory",
    "read_gpu_facts",
]
