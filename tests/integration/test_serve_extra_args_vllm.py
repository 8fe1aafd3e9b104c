"""`hyperqwen serve` runs EXTRA_ARGS through vLLM's own parser before the exec (where vLLM is installed)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs the vLLM 0.32.0 CPU build (installed by scripts/test.py)")

from hyperqwen.config.settings import resolve_settings  # noqa: E402
from hyperqwen.launch.serve import check_extra_args_with_vllm  # noqa: E402


def test_accepted_extra_args_pass_the_real_parser():
    settings = resolve_settings({"EXTRA_ARGS": "--enforce-eager --seed 7"}, mode="single")
    assert check_extra_args_with_vllm(settings) == []


@pytest.mark.parametrize("words", [("--api_key", "sk-smuggled-0123456789"), ("--api-k=sk-smuggled-0123456789",),
                                   ("--enforce-eager", "Mtp"), ("-h",), ("--help",), ("--uds", "/tmp/s"),
                                   ("--headless",)])
def test_what_the_table_would_miss_the_real_parser_refuses(words):
    # Settings bypassing the table check (as if the committed table were stale): the real parser still refuses.
    base = resolve_settings({}, mode="single")
    settings = base.with_value("EXTRA_ARGS", tuple(words), "test")
    problems = check_extra_args_with_vllm(settings)
    assert problems and all(p.knob == "EXTRA_ARGS" for p in problems)
    assert all("sk-smuggled" not in p.message for p in problems)
