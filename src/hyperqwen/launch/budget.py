"""Settings -> memory planner inputs, and the check `hyperqwen serve` runs before vLLM loads anything."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hyperqwen.memory import GpuFacts, MemoryBudget, plan_memory
from hyperqwen.launch.command import kv_cache_dtype, max_model_len
from hyperqwen.config.settings import Settings


def memory_knobs(settings: Settings, *, max_len: int | None = None) -> dict[str, object]:
    """The planner's inputs, as vLLM will see them (KV as the vLLM dtype string, DRAFT as a path).

    max_len: None keeps what the settings give (MAX_LEN, else the mode/CTX default); a number replaces it.
    """
    draft = settings["DRAFT"]
    return {
        "KV": kv_cache_dtype(settings),
        "MAX_LEN": max_model_len(settings) if max_len is None else max_len,
        "MAX_SEQS": settings["MAX_SEQS"],
        "SPEC": settings["SPEC"],
        "DRAFT_TOKENS": settings["DRAFT_TOKENS"],
        "DFLASH_TOKENS": settings["DFLASH_TOKENS"],
        "DRAFT": str(settings.under_models_dir(draft)) if draft else None,
        "PREFIX_CACHE": settings["PREFIX_CACHE"],
        "STATE_DTYPE": settings["STATE_DTYPE"],
        "KV_MEM": settings["KV_MEM"],
        "GPU_UTIL": settings["GPU_UTIL"],
        "MAX_BATCHED_TOKENS": settings["MAX_BATCHED_TOKENS"],
        "DTYPE": settings["DTYPE"],
        "VISION": settings["VISION"],
    }


@dataclass(frozen=True)
class Preflight:
    budget: MemoryBudget
    chosen_max_len: int | None  # set when MAX_LEN was unset and the default did not fit


def check_memory(settings: Settings, gpu: GpuFacts, overrides: Mapping[str, int] | None = None) -> Preflight:
    """Plan the card. When MAX_LEN was left unset and the mode's default does not fit, choose the largest
    MAX_LEN that does (the planner's answer), instead of letting vLLM fail after minutes of loading."""
    budget = plan_memory(settings.model_path, memory_knobs(settings), gpu, overrides)
    if budget.fits or settings.explicit("MAX_LEN") or not budget.largest_fitting_max_len:
        return Preflight(budget, None)
    chosen = budget.largest_fitting_max_len
    retry = plan_memory(settings.model_path, memory_knobs(settings, max_len=chosen), gpu, overrides)
    return Preflight(retry, chosen) if retry.fits else Preflight(budget, None)
