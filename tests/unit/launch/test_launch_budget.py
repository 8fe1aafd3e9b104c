"""The memory step `hyperqwen serve` runs before it builds the vLLM command (launch/budget.py).

No GPU exists here: the card is described by GpuFacts.nominal, and the checkpoint is the header-only
Qwen3.8-27B fixture of the memory planner's tests. Card sizes are found by asking the planner, so these tests
hold the launch decision to the planner's answer whatever its calibration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperqwen.config.settings import SettingsError, resolve_settings
from hyperqwen.config.sizes import GiB
from hyperqwen.launch.budget import BudgetOutcome, decide_budget
from hyperqwen.launch.command import build_command
from hyperqwen.memory import GpuFacts, plan_memory

FIXTURES = Path(__file__).parents[1] / "memory" / "data"
PREPARED = FIXTURES / "qwen3.8-27b-prepared"


def settings_for(env=None, mode="single"):
    base = {"MODELS_DIR": str(FIXTURES), "MODEL": PREPARED.name}
    return resolve_settings({**base, **(env or {})}, mode=mode)


def card(gib: float) -> GpuFacts:
    return GpuFacts.nominal(int(gib * GiB))


def shortening_card(settings) -> GpuFacts:
    """The smallest card (in 1/4 GiB steps) on which the configured MAX_LEN does not fit but a shorter one does."""
    for quarter in range(12 * 4, 96 * 4):
        gpu = card(quarter / 4)
        budget = plan_memory(settings, gpu)
        if not budget.fits and budget.largest_fitting_max_len and plan_memory(
                settings, gpu, max_len=budget.largest_fitting_max_len).fits:
            return gpu
    raise AssertionError("no card size between 12 and 96 GiB shortens the default context")


def test_fits_on_a_large_card_keeps_the_configured_length():
    settings = settings_for()
    decision = decide_budget(settings, card(80))
    assert decision.outcome is BudgetOutcome.FITS
    assert decision.max_model_len == settings.configured_max_model_len
    assert "MAX_LEN=65536" in decision.summary()


def test_unset_max_len_is_shortened_to_what_the_planner_says_fits():
    settings = settings_for()
    gpu = shortening_card(settings)
    decision = decide_budget(settings, gpu)
    expected = plan_memory(settings, gpu).largest_fitting_max_len
    assert decision.outcome is BudgetOutcome.SHORTENED
    assert decision.max_model_len == expected < settings.configured_max_model_len
    assert any(f"MAX_LEN={expected}" in note for note in decision.notes)
    argv = build_command(settings, max_model_len=decision.max_model_len, api_key=None).vllm_args
    assert f"--max-model-len={expected}" in argv


def test_explicit_max_len_that_cannot_fit_stops_with_the_largest_that_does():
    settings = settings_for({"MAX_LEN": "262144"})
    with pytest.raises(SettingsError) as caught:
        decide_budget(settings, card(24))
    text = str(caught.value)
    assert "do not fit" in text and "MAX_LEN" in text and "MEMORY_CHECK=warn" in text


def test_memory_check_warn_starts_with_the_configured_length_and_says_why():
    settings = settings_for({"MAX_LEN": "262144", "MEMORY_CHECK": "warn"})
    decision = decide_budget(settings, card(24))
    assert decision.outcome is BudgetOutcome.DOES_NOT_FIT and decision.max_model_len == 262144
    assert any("do not fit" in note for note in decision.notes)


@pytest.mark.parametrize("gpu", [None, "off"])
def test_no_gpu_or_check_off_is_not_checked(gpu):
    settings = settings_for({"MEMORY_CHECK": "off"} if gpu == "off" else None)
    decision = decide_budget(settings, None if gpu is None else card(8))
    assert decision.outcome is BudgetOutcome.NOT_CHECKED and decision.budget is None
    assert decision.max_model_len == settings.configured_max_model_len


def test_tiny_card_never_fits_any_length():
    with pytest.raises(SettingsError, match="do not fit"):
        decide_budget(settings_for(), card(8))


def test_tensor_parallel_plans_one_rank_of_the_split():
    """TP=2: each card holds half the weights, KV heads and GDN state, so the same card fits a longer context."""
    one = plan_memory(settings_for(), card(24))
    two = plan_memory(settings_for({"TP": "2"}), card(24))
    assert two.weights["resident"] < one.weights["resident"]
    assert two.pool_bytes > one.pool_bytes
    assert decide_budget(settings_for({"TP": "2"}), card(24)).outcome is BudgetOutcome.FITS


def test_tp_that_does_not_divide_the_heads_is_refused_before_start(tmp_path):
    from hyperqwen.launch.serve import prepare_launch

    with pytest.raises(SettingsError) as caught:
        prepare_launch(settings_for({"TP": "3"}), {}, card(24))
    assert any(p.knob == "TP" for p in caught.value.problems)
