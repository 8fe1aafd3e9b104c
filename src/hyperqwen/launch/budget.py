"""The memory step of a launch: settings + the card -> the context length and budget that will run.

`hyperqwen serve` decides this BEFORE it builds the vLLM command line, and builds the command line once
from the decision, so `--print`, `--explain` and the exec all show the same numbers. Pure: the GPU facts
are passed in (serve reads them at its I/O edge).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from hyperqwen.config.settings import Problem, Settings, SettingsError
from hyperqwen.launch.command import configured_max_model_len

if TYPE_CHECKING:  # the planner is imported only when a card is there to plan for
    from hyperqwen.memory import GpuFacts, MemoryBudget
    from hyperqwen.memory.host import HostFacts

MEMORY_CHECK_HINT = "(`hyperqwen plan` shows the whole budget; if you measured that it fits, MEMORY_CHECK=warn)"


class BudgetOutcome(StrEnum):
    FITS = "fits"
    SHORTENED = "fits with a shorter context"  # MAX_LEN was unset; the planner chose the largest that fits
    DOES_NOT_FIT = "does not fit"  # only with MEMORY_CHECK=warn: started anyway
    NOT_CHECKED = "not checked"  # MEMORY_CHECK=off, or no GPU to plan for


@dataclass(frozen=True)
class LaunchBudget:
    """What the memory step decided: the context length to run, and why.

    max_model_len: what goes to --max-model-len. budget: the planner's full answer (None when not checked).
    notes: one-line messages for the log (the plan chosen, a shortened context, a skipped check).
    """

    max_model_len: int
    outcome: BudgetOutcome
    budget: MemoryBudget | None = None
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """The one line serve logs about the plan it chose."""
        if self.budget is None:
            return f"memory plan: {self.outcome.value}; MAX_LEN={self.max_model_len}"
        b = self.budget
        return (
            f"memory plan: {self.outcome.value} on {b.gpu.name} ({b.gpu.total_bytes / 2**30:.2f} GiB): "
            f"MAX_LEN={self.max_model_len}, KV pool {b.pool_bytes / 2**30:.2f} GiB "
            f"= {b.pool_tokens:,} tokens, up to {b.max_concurrency} requests at full length"
        )


def decide_budget(settings: Settings, gpu: GpuFacts | None, host: HostFacts | None = None) -> LaunchBudget:
    """Plan the card and decide MAX_LEN. gpu: the card, or None when there is none. host: the host's RAM,
    checked against RAM_CACHE (None: not checked).

    - MEMORY_CHECK=off or no GPU: MAX_LEN as configured, not checked.
    - fits: MAX_LEN as configured.
    - does not fit, MAX_LEN unset by the user, a shorter one fits: that one (outcome SHORTENED).
    - does not fit otherwise: SettingsError naming the fix (strict), or a warning and the configured
      MAX_LEN (warn).
    """
    configured = configured_max_model_len(settings)
    memory_check = settings.knobs.memory_check
    if memory_check == "off":
        return LaunchBudget(configured, BudgetOutcome.NOT_CHECKED, notes=("memory check off (MEMORY_CHECK=off)",))
    if gpu is None:
        return LaunchBudget(
            configured, BudgetOutcome.NOT_CHECKED, notes=("no NVIDIA GPU found (CUDA); memory check skipped",)
        )

    from hyperqwen.memory.verdict import judge

    # The one verdict `plan`, `verify` and `replicas` give too (memory/verdict.py).
    verdict = judge(settings, gpu, host=host)
    if verdict.refusals:
        raise SettingsError(verdict.refusals)
    budget = verdict.budget
    assert budget is not None  # judge plans whenever it has a card and refuses nothing
    if verdict.starts:
        outcome = BudgetOutcome.SHORTENED if verdict.chosen else BudgetOutcome.FITS
        return LaunchBudget(verdict.max_model_len, outcome, budget, verdict.notes)
    message = "memory check: these settings do not fit the GPU.\n" + budget.explain_failure() + "\n" + MEMORY_CHECK_HINT
    if memory_check == "warn":
        return LaunchBudget(configured, BudgetOutcome.DOES_NOT_FIT, budget, (f"warning: {message}",))
    raise SettingsError([Problem("error", message, "MAX_LEN")])
