"""GDN_PREFILL: on Hopper and newer without the CuTe DSL package vLLM 0.32.0's own pick (FlashInfer) cannot load,
so auto passes Triton and says why in one line. Recorded on the lab's H200: docs/data/gpu (every boot there ran
with GDN_PREFILL=auto and no EXTRA_ARGS)."""

from __future__ import annotations

import pytest

from hyperqwen.cli import build_parser
from hyperqwen.config.settings import resolve_settings
from hyperqwen.launch import serve
from hyperqwen.launch.command import argv_value, build_command, gdn_prefill_fallback


@pytest.mark.parametrize(
    ("capability", "cute_dsl", "falls_back"),
    [((9, 0), False, True), ((10, 0), False, True), ((9, 0), True, False), ((8, 6), False, False),
     ((8, 9), False, False), (None, False, False)],
)
def test_fallback_only_where_vllms_pick_cannot_load(capability, cute_dsl, falls_back):
    reason = gdn_prefill_fallback(capability, cute_dsl)
    assert (reason is not None) is falls_back
    if reason:
        assert "GDN_PREFILL=auto" in reason and "nvidia-cutlass-dsl" in reason and "\n" not in reason


@pytest.mark.parametrize(("knob", "fallback", "flag"), [("auto", False, None), ("auto", True, "triton"),
                                                         ("triton", False, "triton"), ("flashinfer", True, "flashinfer")])
def test_the_flag_follows_the_knob(knob, fallback, flag):
    settings = resolve_settings({"GDN_PREFILL": knob}, mode="single")
    command = build_command(settings, api_key=None, gdn_prefill_fallback=fallback)
    assert argv_value(command.vllm_args, "--gdn-prefill-backend") == flag


def test_serve_says_why_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = build_parser("serve").parse_args(["serve", "--print", "--set", "MEMORY_CHECK=off"])
    reason = gdn_prefill_fallback((9, 0), False)
    assert serve.run(args, {"MODELS_DIR": str(tmp_path)}, gdn_prober=lambda: reason) == 0
    out = capsys.readouterr()
    assert "--gdn-prefill-backend=triton" in out.out
    assert [line for line in out.err.splitlines() if "GDN_PREFILL=auto" in line] == [f"hyperqwen: {reason}"]
