"""Every command line we generate must be one vLLM 0.32.0 accepts.

The parser is vLLM's own (`make_arg_parser`, abbreviations off, as `vllm serve` builds it). Values vLLM only
checks later (speculative-config JSON, KV dtype, tool and reasoning parser names, JSON dict flags) are checked
against vLLM's own registries, Literal types and config dataclasses. Needs the vLLM CPU build; no server.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import typing

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM 0.32.0 CPU build (installed by scripts/test.sh)")

from vllm.config.cache import CacheDType  # noqa: E402
from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

from hyperqwen import VLLM_VERSION  # noqa: E402
from hyperqwen.config.knobs import KNOBS, KNOBS_BY_NAME, KV_DTYPES, STRUCTURED_OUTPUT_CONFIGS  # noqa: E402
from hyperqwen.config.settings import SettingsError, resolve_settings  # noqa: E402
from hyperqwen.launch.command import build_command  # noqa: E402

pytestmark = pytest.mark.integration

KEY = "sk-test-0123456789abcdef"
# Numeric knobs: a sample across each range (its ends and a typical value).
NUMERIC_SAMPLES = {
    "PORT": ["1", "18020", "65535"], "DRAFT_TOKENS": ["1", "4", "8"], "DFLASH_TOKENS": ["1", "7", "16"],
    "MAX_LEN": ["256", "32768", "262144"], "MAX_SEQS": ["1", "64", "1024"], "MAX_BATCHED_TOKENS": ["256", "131072"],
    "GPU_UTIL": ["0.1", "0.92", "0.99"], "KV_MEM": ["1", "5583457484", "5GiB"], "TEMPERATURE": ["0", "0.7", "2"],
}


def vllm_parser() -> FlexibleArgumentParser:
    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server.",
                                                  allow_abbrev=False))


def test_installed_vllm_is_the_pinned_release():
    assert vllm.__version__ == VLLM_VERSION


def variants():
    """(mode, environment) pairs: every value of every enumerated knob, a sample of numeric ones."""
    for mode in ("single", "batch"):
        yield mode, {}
        for knob in KNOBS:
            if knob.kind == "choice" and knob.name != "MODE":
                for choice in knob.choices:
                    env = {knob.name: choice}
                    if knob.name == "SPEC" and choice == "dflash2":
                        env["DRAFT"] = "dflash2-drafter"
                    yield mode, env
            elif knob.kind == "bool":
                for value in ("true", "false"):
                    yield mode, {knob.name: value}
        for name, samples in NUMERIC_SAMPLES.items():
            for sample in samples:
                yield mode, {name: sample}
        for spec, prefix in itertools.product(("mtp", "none"), ("true", "false")):
            yield mode, {"SPEC": spec, "PREFIX_CACHE": prefix, "EXTRA_ARGS": "--enforce-eager"}


VARIANTS = list(variants())


@pytest.fixture(scope="module")
def parser():
    return vllm_parser()


@pytest.mark.parametrize("mode,env", VARIANTS, ids=[f"{m}-{'-'.join(f'{k}={v}' for k, v in e.items()) or 'defaults'}"
                                                    for m, e in VARIANTS])
def test_generated_argv_parses_and_validates(parser, mode, env):
    settings = resolve_settings(env, mode=mode)
    plan = build_command(settings, api_key=KEY)
    args = parser.parse_args(list(plan.vllm_args))
    validate_parsed_serve_args(args)

    # What vLLM will do is what the plan meant.
    assert args.model == str(settings.model_path)
    assert args.served_model_name == [settings["SERVED_MODEL_NAME"]]
    assert args.port == settings["PORT"]
    assert args.max_model_len == plan.max_model_len
    assert args.enable_prefix_caching is settings["PREFIX_CACHE"]
    assert args.language_model_only is (not settings["VISION"])
    assert args.default_chat_template_kwargs == {"enable_thinking": settings["THINKING"]}
    assert args.api_key is None  # the key travels in VLLM_API_KEY, never argv

    # Checked later by vLLM's config objects: check now against its own types and registries.
    assert args.kv_cache_dtype in typing.get_args(CacheDType)
    assert args.mamba_ssm_cache_dtype == settings["STATE_DTYPE"]
    if settings["TOOLS"]:
        assert args.enable_auto_tool_choice and args.tool_call_parser in ToolParserManager.list_registered()
    if args.reasoning_parser:
        assert args.reasoning_parser in ReasoningParserManager.list_registered()
    if args.speculative_config is not None:
        spec = args.speculative_config
        fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
        assert set(spec) <= fields, f"unknown speculative-config keys: {set(spec) - fields}"
        assert spec["method"] in typing.get_args(SpeculativeMethod)
        assert isinstance(spec["num_speculative_tokens"], int) and spec["num_speculative_tokens"] >= 1
    if args.override_generation_config:
        assert set(args.override_generation_config) == {"temperature"}
    # STRUCTURED_OUTPUT's dotted flags merge into one structured-outputs config with exactly its settings.
    wanted = STRUCTURED_OUTPUT_CONFIGS[settings["STRUCTURED_OUTPUT"]]
    grammar = args.structured_outputs_config
    assert {key: getattr(grammar, key) for key in wanted} == wanted
    if "disable_any_whitespace" not in wanted:
        assert grammar.disable_any_whitespace is False

    # vLLM's own EngineArgs accept the parsed namespace.
    engine_args = AsyncEngineArgs.from_cli_args(args)
    assert engine_args.kv_cache_dtype == plan.kv_cache_dtype


@pytest.mark.parametrize("name", ["TOOL_PARSER", "REASONING_PARSER"])
def test_every_parser_choice_imports_from_vllm(name):
    manager = ToolParserManager if name == "TOOL_PARSER" else ReasoningParserManager
    getter = manager.get_tool_parser if name == "TOOL_PARSER" else manager.get_reasoning_parser
    for choice in KNOBS_BY_NAME[name].choices:
        if choice != "none":
            assert getter(choice) is not None


def test_every_kv_choice_is_a_vllm_cache_dtype():
    assert set(KV_DTYPES.values()) <= set(typing.get_args(CacheDType))


def test_dflash_and_mtp_are_vllm_methods():
    assert {"mtp", "dflash"} <= set(typing.get_args(SpeculativeMethod))


def test_exec_reaches_vllm_with_the_planned_argv(tmp_path):
    """`hyperqwen serve` really execs vLLM's server with the planned argv: vLLM's parser takes it, and vLLM
    itself then refuses the empty model config (no model here, so it cannot serve)."""
    model = tmp_path / "qwen3.8-27b"
    model.mkdir()
    (model / "config.json").write_text("{}")
    environ = {**os.environ, "MODELS_DIR": str(tmp_path), "VLLM_API_KEY": KEY}
    result = subprocess.run([sys.executable, "-m", "hyperqwen", "serve", "--mode", "single"], env=environ,
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode not in (0, 2), output[-3000:]  # 2 would be HyperQwen refusing before the exec
    assert "nothing was started" not in output and str(model) in output, output[-3000:]
    assert KEY not in output


def test_extra_args_help_is_refused_before_the_exec(tmp_path):
    """`EXTRA_ARGS=-h` made the server print vLLM's help and exit 0 instead of serving; now it is one line, exit 2."""
    model = tmp_path / "qwen3.8-27b"
    model.mkdir()
    (model / "config.json").write_text("{}")
    environ = {**os.environ, "MODELS_DIR": str(tmp_path), "EXTRA_ARGS": "-h", "VLLM_API_KEY": KEY}
    result = subprocess.run([sys.executable, "-m", "hyperqwen", "serve", "--mode", "single"], env=environ,
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2 and "prints vLLM's help" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "usage:" not in result.stdout


def test_unknown_flag_in_extra_args_is_rejected_by_vllm_parser(parser):
    # Refused before anything starts (config/extra_args.py reads EXTRA_ARGS against vLLM's option table) ...
    with pytest.raises(SettingsError, match="EXTRA_ARGS: word 1 '--no-such-flag' is not a vLLM 0.32.0 option"):
        resolve_settings({"EXTRA_ARGS": "--no-such-flag"}, mode="single")
    # ... as vLLM's own parser would refuse it at start.
    plan = build_command(resolve_settings({}, mode="single"), api_key=None)
    with pytest.raises(SystemExit):
        parser.parse_args([*plan.vllm_args, "--no-such-flag"])


def test_abbreviations_are_off(parser):
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-model", "1024"])


def test_no_settings_error_escapes_as_traceback():
    with pytest.raises(SettingsError):
        resolve_settings({"SPEC": json.dumps({"method": "eagle"})}, mode="single")
