"""The one verdict `plan`, `serve`, `verify` and `replicas` give on the same settings and card.

Every command asks `judge` and reports its answer in its own format, so they cannot disagree: the same
refusals (TP that does not divide the model, a drafter that does not fit the target, a context that a
per-request reservation collapses), the same treatment of an unset MAX_LEN (the mode/CTX default, shortened
by the planner when it does not fit), and the same outcome and exit code. Pure given the card and host.

Exit codes (`hyperqwen plan` exits with them; `serve` starts exactly when it is 0): 0 serve would start
(maybe with a planner-chosen MAX_LEN); 2 a refusal (one line per problem, naming the knob); 3 the set
MAX_LEN does not fit, a shorter one does; 4 vLLM would refuse to boot; 5 the card would be full after boot.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hyperqwen.config.settings import Problem, Settings

if TYPE_CHECKING:
    from hyperqwen.memory.budget import MemoryBudget, Outcome
    from hyperqwen.memory.gpu import GpuFacts
    from hyperqwen.memory.host import HostFacts

EXIT_REFUSED = 2

# The shortest context the planner may choose on its own when MAX_LEN is unset. Below it a chat's history or
# a coding agent's system prompt and tool list (often over 8k tokens by themselves) no longer fit, so starting
# would look like a working server that fails every real request; a user who wants it sets MAX_LEN.
MIN_CHOSEN_CONTEXT = 8192


@dataclass(frozen=True)
class MemoryVerdict:
    """What the settings do on this card.

    outcome: the planner's verdict (None: refused before planning, or not planned: no card).
    max_model_len: what `serve` runs. budget: the planner's answer at that length (None when not planned).
    refusals: errors naming a knob (exit 2). notes: one-line facts every command shows (a chosen MAX_LEN).
    """

    outcome: Outcome | None
    max_model_len: int
    budget: MemoryBudget | None = None
    refusals: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()
    chosen: bool = False  # MAX_LEN was unset and the planner chose a shorter one than the default

    @property
    def planned(self) -> bool:
        return self.budget is not None

    @property
    def starts(self) -> bool:
        """serve (MEMORY_CHECK=strict) starts: nothing refused, and it fits (or there was no card to plan)."""
        return not self.refusals and (self.outcome is None or self.exit_code == 0)

    @property
    def exit_code(self) -> int:
        if self.refusals:
            return EXIT_REFUSED
        return 0 if self.outcome is None else self.outcome.exit_code

    def headline(self) -> str:
        """One line: the verdict as every command words it."""
        if self.refusals:
            return "refused: " + "; ".join(p.message for p in self.refusals)
        if self.budget is None:
            return f"not planned; MAX_LEN={self.max_model_len:,}"
        text = self.budget.summary()
        return text + (" (MAX_LEN chosen by the planner)" if self.chosen else "")


def model_refusals(settings: Settings, model_dir: Path | None = None) -> list[Problem]:
    """What vLLM would refuse about the model files the settings name, before any memory arithmetic:
    TP must divide the model's heads; a DFlash2 drafter on disk must match the target."""
    from hyperqwen.memory.parallel import load_heads, tp_problems

    target = model_dir or settings.model_path
    problems: list[Problem] = []
    tp = int(settings.knobs.tp)
    if tp != 1:
        heads, where = load_heads(target)
        problems += [Problem("error", message, "TP") for message in tp_problems(heads, tp, where)]
    draft = settings.draft_path
    if settings.knobs.spec == "dflash2" and draft is not None and (draft / "config.json").is_file() and target.is_dir():
        from hyperqwen.spec.drafter import DrafterError, check_drafter

        try:
            check_drafter(draft, target)
        except DrafterError as exc:
            problems.append(Problem("error", str(exc), "DRAFT"))
    return problems


def drafter_missing(settings: Settings) -> str | None:
    """For SPEC=dflash2 before `prepare` fetched the drafter: one line naming DRAFT, the folder and the fix."""
    draft = settings.draft_path
    if settings.knobs.spec != "dflash2" or draft is None or (draft / "config.json").is_file():
        return None
    from hyperqwen.config.knobs import DFLASH2_DRAFTER_DIR

    prepare = "`hyperqwen prepare` (or `docker compose run --rm prepare`) with SPEC=dflash2"
    if settings.knobs.draft == DFLASH2_DRAFTER_DIR:
        fix = f"{prepare} fetches it there (PREPARE_DRAFTER=auto), or point DRAFT at your own drafter folder"
    else:  # prepare always fetches into the default folder
        fix = (
            f"{prepare} fetches the pinned drafter into {settings.under_models_dir(DFLASH2_DRAFTER_DIR)} "
            f"(DRAFT's default), or put your drafter at {draft}"
        )
    return (
        f"the DFlash2 drafter is not downloaded yet: DRAFT={settings.knobs.draft} has no config.json at {draft}; {fix}"
    )


def judge(
    settings: Settings,
    gpu: GpuFacts | None,
    *,
    host: HostFacts | None = None,
    model_dir: Path | None = None,
) -> MemoryVerdict:
    """The verdict for these settings on this card (None: no card, only the refusals are checked)."""
    from hyperqwen.memory.budget import MemoryPlanError, plan_memory
    from hyperqwen.memory.checkpoint import CheckpointError

    configured = settings.configured_max_model_len
    refusals = model_refusals(settings, model_dir)
    if refusals:
        return MemoryVerdict(None, configured, refusals=tuple(refusals))
    if gpu is None:
        return MemoryVerdict(None, configured, notes=("no GPU to plan for; memory not checked",))
    missing = drafter_missing(settings)
    if missing:
        return MemoryVerdict(None, configured, refusals=(Problem("error", missing, "DRAFT"),))
    try:
        budget = plan_memory(settings, gpu, model_dir=model_dir, host=host)
        # Whether the planner used terms `hyperqwen calibrate` measured on this card, said by every command.
        calibration = (budget.calibration,) if budget.calibration else ()
        chosen = budget.largest_fitting_max_len
        if budget.fits or settings.explicit("MAX_LEN") or not chosen:
            return MemoryVerdict(budget.outcome, budget.max_model_len, budget, notes=calibration)
        shorter = plan_memory(settings, gpu, model_dir=model_dir, max_len=chosen, host=host)
        if not shorter.fits:
            return MemoryVerdict(budget.outcome, budget.max_model_len, budget, notes=calibration)
        if chosen < min(MIN_CHOSEN_CONTEXT, configured):
            return MemoryVerdict(
                None, configured, budget, refusals=(collapse_refusal(settings, gpu, chosen, configured, host),)
            )
    except (MemoryPlanError, CheckpointError) as exc:
        knob = "DRAFT" if settings.knobs.spec == "dflash2" and "DRAFT" in str(exc) else "MODEL"
        return MemoryVerdict(None, configured, refusals=(Problem("error", f"memory plan: {exc}", knob),))
    note = (
        f"MAX_LEN unset and the default {configured:,} does not fit; the planner chose MAX_LEN={chosen} "
        "(set MAX_LEN to choose yourself)"
    )
    return MemoryVerdict(shorter.outcome, chosen, shorter, notes=(*calibration, note), chosen=True)


def collapse_refusal(
    settings: Settings, gpu: GpuFacts, chosen: int, configured: int, host: HostFacts | None
) -> Problem:
    """The planner could only fit a uselessly short context. When MAX_SEQS was raised, it is the cause:
    every request slot reserves GDN state pages and CUDA-graph/activation memory, so name the largest
    MAX_SEQS that keeps the default context."""
    from hyperqwen.memory.budget import plan_memory

    head = (
        f"the largest context that fits is {chosen:,} tokens, below the {MIN_CHOSEN_CONTEXT:,} the planner "
        "chooses on its own"
    )
    if settings.explicit("MAX_SEQS"):
        seqs = settings.knobs.max_seqs
        assert seqs is not None  # explicit: the user set it
        low, high = 0, seqs  # largest MAX_SEQS (< seqs) with which the configured MAX_LEN fits
        while low < high:
            mid = (low + high + 1) // 2
            trial = settings.with_value("MAX_SEQS", mid, settings.setting("MAX_SEQS").source)
            if plan_memory(trial, gpu, max_len=configured, host=host).fits:
                low = mid
            else:
                high = mid - 1
        fix = f"MAX_SEQS={low} keeps MAX_LEN={configured}" if low else f"no MAX_SEQS keeps MAX_LEN={configured}"
        return Problem(
            "error",
            f"MAX_SEQS={seqs}: {head}, because each of the {seqs} request slots reserves memory; {fix}, "
            "or set MAX_LEN yourself to run this short",
            "MAX_SEQS",
        )
    return Problem(
        "error", f"{head}; set MAX_LEN yourself to run this short (`hyperqwen plan` shows the budget)", "MAX_LEN"
    )
