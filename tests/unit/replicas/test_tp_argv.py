"""TP and SCALE_OUT reach the vLLM command line (launch/command.py), and vLLM's own parser takes them."""

from __future__ import annotations

import pytest

from hyperqwen.config.settings import SettingsError, resolve_settings
from hyperqwen.launch.command import build_command


def _args(environ: dict[str, str]) -> list[str]:
    return list(build_command(resolve_settings(environ, profiles={}), api_key=None).vllm_args)


def test_tp1_adds_no_flag_and_tp2_maps_to_tensor_parallel_size():
    assert "--tensor-parallel-size" not in _args({})
    args = _args({"TP": "2"})
    assert "--tensor-parallel-size=2" in args


def test_scale_out_maps_to_enable_scale_out():
    assert "--enable-scale-out" not in _args({})
    assert "--enable-scale-out" in _args({"SCALE_OUT": "true"})


@pytest.mark.parametrize("raw", ["0", "9", "two", "1.5"])
def test_bad_tp_is_refused_naming_the_knob(raw):
    with pytest.raises(SettingsError) as info:
        resolve_settings({"TP": raw}, profiles={})
    assert [p.knob for p in info.value.problems] == ["TP"]


def test_vllm_parser_takes_both_flags():
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args", reason="needs the vLLM CPU build (.venv)")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = cli_args.make_arg_parser(FlexibleArgumentParser(allow_abbrev=False))
    parsed = parser.parse_args(_args({"TP": "2", "SCALE_OUT": "1"}))
    assert parsed.tensor_parallel_size == 2
    assert parsed.enable_scale_out is True
