"""Memory planner: what fits on the card, computed before vLLM loads anything.

Public API (pure; no torch import at module import time):
    plan_memory(model_dir, knobs, gpu, overrides=None) -> MemoryBudget
    largest_max_len_that_fits(model_dir, knobs, gpu, overrides=None) -> int
    read_gpu_facts() -> GpuFacts | None
    MemoryKnobs.from_knobs(mapping with CONTRACT.md knob names)
"""

from hyperqwen.memory.budget import (
    GpuFacts,
    MemoryBudget,
    MemoryKnobs,
    MemoryPlanError,
    Term,
    build_layout,
    largest_max_len_that_fits,
    parse_size,
    plan_memory,
    read_gpu_facts,
)
from hyperqwen.memory.checkpoint import CheckpointError

__all__ = [
    "CheckpointError", "GpuFacts", "MemoryBudget", "MemoryKnobs", "MemoryPlanError", "Term", "build_layout",
    "largest_max_len_that_fits", "parse_size", "plan_memory", "read_gpu_facts",
]
