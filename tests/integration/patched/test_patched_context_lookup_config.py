"""Patch 0031's configuration on the real vLLM engine config (no server): what `SPEC=mtp+lookup` builds, and
the combinations it refuses with one message each instead of a wrong draft or a silent fallback."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.needs_patch("0031-context-lookup-before-drafter.patch")]


def engine_config(model_dir, speculative_config: dict, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(model_dir), speculative_config=speculative_config, max_model_len=2048, enforce_eager=True, **kwargs
    ).create_engine_config()


def test_mtp_plus_lookup_as_the_launcher_builds_it(test_models):
    """The launcher's --speculative-config for SPEC=mtp+lookup is accepted, and async scheduling goes off."""
    from hyperqwen.config.settings import resolve_settings
    from hyperqwen.launch.command import argv_value, build_command

    settings = resolve_settings({"SPEC": "mtp+lookup", "DRAFT_TOKENS": "3", "LOOKUP_TOKENS": "8"}, mode="single")
    argv = list(build_command(settings, api_key=None).vllm_args)
    spec = json.loads(argv_value(argv, "--speculative-config"))
    config = engine_config(test_models["tiny-qwen"], spec)
    assert config.speculative_config.method == "mtp"
    assert config.speculative_config.num_speculative_tokens == 8
    assert config.speculative_config.context_lookup and config.speculative_config.context_drafter_tokens == 3
    assert config.scheduler_config.async_scheduling is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"method": "ngram"}, "context_lookup needs an EAGLE or MTP drafter"),
        ({"context_drafter_tokens": 9}, "context_drafter_tokens=9 must be <= num_speculative_tokens=8"),
        ({"draft_sample_method": "probabilistic"}, "context_lookup needs draft_sample_method='greedy'"),
        ({"context_lookup_min": 6}, "context_lookup_min=6 must be <= context_lookup_max=5"),
    ],
)
def test_refused_combinations_name_the_field(test_models, extra, message):
    spec = {"method": "mtp", "num_speculative_tokens": 8, "context_lookup": True, **extra}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        engine_config(test_models["tiny-qwen"], spec)


def test_explicit_async_scheduling_is_refused(test_models):
    spec = {"method": "mtp", "num_speculative_tokens": 8, "context_lookup": True}
    with pytest.raises(ValueError, match="Async scheduling is not compatible with speculative_config context_lookup"):
        engine_config(test_models["tiny-qwen"], spec, async_scheduling=True)
