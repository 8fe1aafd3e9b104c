"""The memory preflight `hyperqwen serve` runs before vLLM loads anything.

No GPU exists here: the card is described by GpuFacts.nominal (what nvidia-smi would report for an idle card
of that size), and the checkpoint is the header-only Qwen3.8-27B fixture of the memory planner's tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperqwen.memory import GpuFacts, parse_size
from hyperqwen.launch.command import build_plan
from hyperqwen.launch.budget import check_memory, memory_knobs
from hyperqwen.launch.serve import memory_preflight
from hyperqwen.config.settings import SettingsError, resolve_settings

FIXTURE = Path(__file__).parent / "memory" / "data" / "qwen3.8-27b-w4a16"


def settings_for(env=None, mode="single"):
    base = {"MODELS_DIR": str(FIXTURE.parent), "MODEL": FIXTURE.name}
    return resolve_settings({**base, **(env or {})}, mode=mode)


def fake_gpu(size: str) -> GpuFacts:
    return GpuFacts.nominal(parse_size(size))


def test_memory_knobs_are_what_vllm_will_see():
    knobs = memory_knobs(settings_for({"CTX": "long"}))
    assert knobs["KV"] == "fp8" and knobs["MAX_LEN"] == 131072 and knobs["SPEC"] == "mtp"
    assert knobs["DRAFT_TOKENS"] == 4 and knobs["PREFIX_CACHE"] is True and knobs["STATE_DTYPE"] == "float16"
    batch = memory_knobs(settings_for({"KV": "int8"}, mode="batch"))
    assert batch["KV"] == "int8_per_token_head" and batch["MAX_SEQS"] == 64


def test_fits_on_a_large_card_and_chooses_nothing():
    result = check_memory(settings_for(), fake_gpu("48GiB"))
    assert result.budget.fits and result.chosen_max_len is None


def test_unset_max_len_is_chosen_by_the_planner_when_the_default_does_not_fit():
    # 27 GiB: the fixture (bf16 lm_head, unprepared) leaves room for ~37k tokens of context, not the 64k default.
    settings = settings_for()
    first = check_memory(settings, fake_gpu("27GiB"))
    assert first.budget.fits and first.chosen_max_len is not None and 0 < first.chosen_max_len < 65536
    plan = memory_preflight(settings, build_plan(settings, api_key=None), {}, gpu=fake_gpu("27GiB"))
    argv = list(plan.vllm_args)
    assert argv[argv.index("--max-model-len") + 1] == str(first.chosen_max_len)


def test_explicit_max_len_that_cannot_fit_stops_with_the_largest_that_does():
    settings = settings_for({"MAX_LEN": "262144"})
    with pytest.raises(SettingsError) as caught:
        memory_preflight(settings, build_plan(settings, api_key=None), {}, gpu=fake_gpu("24GiB"))
    text = str(caught.value)
    assert "do not fit" in text and "MAX_LEN" in text and "MEMORY_CHECK=warn" in text


def test_memory_check_warn_and_off_let_it_start(capsys):
    for mode in ("warn", "off"):
        settings = settings_for({"MAX_LEN": "262144", "MEMORY_CHECK": mode})
        plan = build_plan(settings, api_key=None)
        assert memory_preflight(settings, plan, {}, gpu=fake_gpu("24GiB")) == plan
    assert "do not fit" in capsys.readouterr().err  # warn printed it


def test_tiny_card_never_fits_any_length():
    settings = settings_for()
    with pytest.raises(SettingsError, match="do not fit"):
        memory_preflight(settings, build_plan(settings, api_key=None), {}, gpu=fake_gpu("12GiB"))


PREPARED = FIXTURE.parent / "qwen3.8-27b-prepared"


def test_defaults_on_a_24gib_card_with_the_prepared_checkpoint():
    """What a 3090/4090 user gets with no .env (docs/memory.md, "The defaults on a 24 GiB card")."""
    base = {"MODELS_DIR": str(PREPARED.parent), "MODEL": PREPARED.name}
    batch = check_memory(resolve_settings(base, mode="batch"), fake_gpu("24GiB"))
    assert batch.budget.fits and batch.chosen_max_len is None
    single = check_memory(resolve_settings(base, mode="single"), fake_gpu("24GiB"))
    # MTP with 4 drafts and prefix caching at the CTX=fast 64k default does not fit the planner's margins at
    # vLLM's default GPU_UTIL; the planner lowers MAX_LEN rather than let vLLM fail at boot.
    assert single.budget.fits and single.chosen_max_len is not None and 32768 < single.chosen_max_len < 65536
