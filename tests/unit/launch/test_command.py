"""The pure command builder: settings -> vLLM argv and environment."""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from hyperqwen.config.extra_args import owned_flags
from hyperqwen.config.knobs import CTX_PRESETS, KNOBS, KV_DTYPES
from hyperqwen.config.settings import SettingsError, resolve_settings
from hyperqwen.launch.command import BUILDER_FLAGS, VLLM_SERVER_MODULE, argv_value, build_command

KEY = "sk-test-0123456789abcdef"


def command_for(environ=None, mode="single", api_key=None, **kwargs):
    return build_command(resolve_settings(environ or {}, mode=mode), api_key=api_key, python="python3", **kwargs)


def flag_value(argv, flag):
    value = argv_value(argv, flag)
    assert value is not None and f"{flag}={value}" in argv, f"{flag} is not passed as one --flag=value word"
    return value


def test_runs_the_vllm_openai_server_module():
    command = command_for()
    assert command.argv[:3] == ("python3", "-m", VLLM_SERVER_MODULE)


def test_single_mode_defaults():
    argv = command_for().vllm_args
    assert flag_value(argv, "--model") == "/models/qwen3.8-27b"
    assert flag_value(argv, "--served-model-name") == "qwen3.8-27b"
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--port") == "18020"
    assert flag_value(argv, "--kv-cache-dtype") == "auto"
    assert flag_value(argv, "--max-model-len") == str(CTX_PRESETS["fast"]["max_len"])
    assert flag_value(argv, "--mamba-ssm-cache-dtype") == "float16"
    assert json.loads(flag_value(argv, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 4}
    assert "--enable-prefix-caching" in argv and "--language-model-only" in argv
    assert flag_value(argv, "--tool-call-parser") == "qwen3_coder" and "--enable-auto-tool-choice" in argv
    assert flag_value(argv, "--reasoning-parser") == "qwen3"
    assert json.loads(flag_value(argv, "--default-chat-template-kwargs")) == {"enable_thinking": False}


def test_batch_mode_defaults():
    argv = command_for(mode="batch").vllm_args
    assert argv_value(argv, "--speculative-config") is None
    assert flag_value(argv, "--kv-cache-dtype") == "fp8"
    assert flag_value(argv, "--max-num-seqs") == "64"
    assert flag_value(argv, "--max-model-len") == "65536"


@pytest.mark.parametrize("ctx", list(CTX_PRESETS))
def test_ctx_presets_pick_kv_dtype_and_length(ctx):
    command = command_for({"CTX": ctx})
    assert flag_value(command.vllm_args, "--kv-cache-dtype") == KV_DTYPES[CTX_PRESETS[ctx]["kv"]]
    assert flag_value(command.vllm_args, "--max-model-len") == str(CTX_PRESETS[ctx]["max_len"])


def test_kv_overrides_the_ctx_preset_in_single_mode():
    assert flag_value(command_for({"CTX": "long", "KV": "int8"}).vllm_args, "--kv-cache-dtype") == "int8_per_token_head"


def test_max_len_overrides_the_preset():
    assert flag_value(command_for({"MAX_LEN": "32768"}).vllm_args, "--max-model-len") == "32768"


@pytest.mark.parametrize("kv", list(KV_DTYPES))
def test_batch_kv_choices(kv):
    assert flag_value(command_for({"KV": kv}, mode="batch").vllm_args, "--kv-cache-dtype") == KV_DTYPES[kv]


def test_prefix_cache_is_always_explicit():
    assert "--no-enable-prefix-caching" in command_for({"PREFIX_CACHE": "false"}).vllm_args
    assert "--enable-prefix-caching" not in command_for({"PREFIX_CACHE": "false"}).vllm_args
    assert "--enable-prefix-caching" in command_for({"PREFIX_CACHE": "true"}).vllm_args


def test_dflash2_config_points_at_drafter_under_models_dir():
    spec = json.loads(flag_value(command_for({"SPEC": "dflash2", "DRAFT": "drafter", "DFLASH_TOKENS": "7"}).vllm_args,
                                 "--speculative-config"))
    assert spec == {"method": "dflash", "model": "/models/drafter", "num_speculative_tokens": 7}


def test_ngram_is_prompt_lookup_with_the_lookup_block():
    spec = json.loads(flag_value(command_for({"SPEC": "ngram", "LOOKUP_TOKENS": "15"}).vllm_args,
                                 "--speculative-config"))
    assert spec == {"method": "ngram", "num_speculative_tokens": 15, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


@pytest.mark.parametrize(("draft", "lookup", "block"), [("3", "8", 8), ("5", "4", 5)])
def test_mtp_plus_lookup_is_mtp_with_context_lookup(draft, lookup, block):
    """The verify block is max(DRAFT_TOKENS, LOOKUP_TOKENS); the MTP head drafts DRAFT_TOKENS of it (patch 0031)."""
    settings = resolve_settings({"SPEC": "mtp+lookup", "DRAFT_TOKENS": draft, "LOOKUP_TOKENS": lookup}, mode="single")
    spec = json.loads(flag_value(build_command(settings, api_key=None, python="python3").vllm_args,
                                 "--speculative-config"))
    assert spec == {"method": "mtp", "num_speculative_tokens": block, "context_lookup": True,
                    "context_lookup_min": 2, "context_lookup_max": 5, "context_drafter_tokens": int(draft)}
    assert settings.num_speculative_tokens == block
    # Both counts are in use: neither knob is reported as ignored.
    assert not [p for p in settings.problems if p.knob in ("DRAFT_TOKENS", "LOOKUP_TOKENS")]


def test_spec_none_has_no_speculative_config():
    assert "--speculative-config" not in command_for({"SPEC": "none"}).vllm_args


def test_thinking_on_and_temperature():
    argv = command_for({"THINKING": "on", "TEMPERATURE": "0.6"}).vllm_args
    assert json.loads(flag_value(argv, "--default-chat-template-kwargs")) == {"enable_thinking": True}
    assert json.loads(flag_value(argv, "--override-generation-config")) == {"temperature": 0.6}


def test_tools_off_and_no_reasoning_parser():
    argv = command_for({"TOOLS": "false", "REASONING_PARSER": "none"}).vllm_args
    assert "--enable-auto-tool-choice" not in argv and "--tool-call-parser" not in argv
    assert "--reasoning-parser" not in argv


def test_memory_knobs_map_to_flags():
    argv = command_for({"GPU_UTIL": "0.9", "KV_MEM": "5GiB", "MAX_SEQS": "2", "MAX_BATCHED_TOKENS": "4096"}).vllm_args
    assert flag_value(argv, "--gpu-memory-utilization") == "0.9"
    assert flag_value(argv, "--kv-cache-memory-bytes") == str(5 * 1024**3)
    assert flag_value(argv, "--max-num-seqs") == "2"
    assert flag_value(argv, "--max-num-batched-tokens") == "4096"


def test_extra_args_come_last():
    argv = command_for({"EXTRA_ARGS": "--enforce-eager --max-log-len 1"}).vllm_args
    assert argv[-3:] == ("--enforce-eager", "--max-log-len", "1")


def test_api_key_goes_through_environment_never_argv():
    command = command_for(api_key=KEY)
    assert command.env["VLLM_API_KEY"] == KEY
    assert all(KEY not in word for word in command.argv)
    assert KEY not in command.shell_command() and "VLLM_API_KEY=****" in command.shell_command()


def test_no_key_unsets_an_inherited_one():
    assert command_for().unset_env == ("VLLM_API_KEY",)


def test_exposed_without_key_refuses_with_how_to_fix():
    with pytest.raises(SettingsError) as caught:
        command_for({"BIND": "0.0.0.0"})
    assert "openssl rand -hex 16 > models/api_key.txt" in str(caught.value)
    assert command_for({"BIND": "0.0.0.0"}, api_key=KEY).argv  # with a key it is fine


def test_listen_host_inside_container_keeps_bind_for_the_security_check():
    command = command_for(listen_host="0.0.0.0")
    assert flag_value(command.vllm_args, "--host") == "0.0.0.0"


def test_shell_command_round_trips_through_a_shell_parser():
    command = command_for({"EXTRA_ARGS": "--chat-template '/tmp/a b.jinja'"}, api_key=KEY)
    words = shlex.split(command.shell_command().replace("\\\n", " "))
    assert words[0] == "env" and "VLLM_API_KEY=****" in words
    assert tuple(words[words.index("python3"):]) == command.argv


def test_command_is_pure_same_input_same_output():
    assert command_for({"SPEC": "none"}) == command_for({"SPEC": "none"})


@pytest.mark.parametrize("knob_name", [k.name for k in KNOBS])
@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.text(max_size=30), mode=st.sampled_from(["single", "batch"]))
def test_any_string_gives_clean_error_or_valid_command(knob_name, raw, mode):
    try:
        command = command_for({knob_name: raw}, mode=mode, api_key=KEY)
    except SettingsError as exc:
        assert exc.problems
        return
    assert all(isinstance(word, str) and "\x00" not in word for word in command.argv)
    assert command.argv[:3] == ("python3", "-m", VLLM_SERVER_MODULE)


def test_ram_cache_maps_to_native_offloading_in_gib():
    argv = command_for({"RAM_CACHE": "16GiB"}).vllm_args
    assert flag_value(argv, "--kv-offloading-size") == "16"
    assert flag_value(argv, "--kv-offloading-backend") == "native"
    assert "--kv-offloading-size" not in command_for().vllm_args


def test_planner_only_term_knobs_never_reach_vllm():
    from hyperqwen.memory.budget import TERM_KNOBS

    env = {name: "1GiB" for name in TERM_KNOBS}
    argv = " ".join(command_for(env).vllm_args)
    for name in TERM_KNOBS:
        assert name.lower().replace("_", "-") not in argv


def test_stream_progress_reaches_patch_0060_through_the_environment():
    assert command_for().env["HYPERQWEN_PREFILL_PROGRESS_INTERVAL"] == "1.0"  # the documented default
    assert command_for({"STREAM_PROGRESS": "0"}).env["HYPERQWEN_PREFILL_PROGRESS_INTERVAL"] == "0.0"
    assert command_for({"STREAM_PROGRESS": "0.25"}).env["HYPERQWEN_PREFILL_PROGRESS_INTERVAL"] == "0.25"


@pytest.mark.parametrize("mode", ["single", "batch"])
def test_structured_output_is_compact_xgrammar_by_default(mode):
    argv = command_for(mode=mode).argv
    assert flag_value(argv, "--structured-outputs-config.backend") == "xgrammar"
    assert flag_value(argv, "--structured-outputs-config.disable_any_whitespace") == "true"


@pytest.mark.parametrize("choice, backend, compact", [("auto", "auto", False), ("xgrammar", "xgrammar", False),
                                                       ("guidance-compact", "guidance", True)])
def test_structured_output_knob_picks_backend_and_whitespace(choice, backend, compact):
    argv = command_for({"STRUCTURED_OUTPUT": choice}).argv
    assert flag_value(argv, "--structured-outputs-config.backend") == backend
    assert (argv_value(argv, "--structured-outputs-config.disable_any_whitespace") is not None) is compact


def test_structured_outputs_config_in_extra_args_names_the_knob():
    with pytest.raises(SettingsError, match="STRUCTURED_OUTPUT"):
        command_for({"EXTRA_ARGS": "--structured-outputs-config.backend guidance"})


# Settings that between them turn on every branch of build_command (each choice of the knobs with choices, and
# the optional numbers set).
FLAG_MATRIX = [
    {"MODE": "single"},
    {"MODE": "batch"},
    {"TOOLS": "false", "REASONING_PARSER": "none", "PREFIX_CACHE": "0", "VISION": "true", "THINKING": "1"},
    {"SPEC": "ngram", "TP": "2", "SCALE_OUT": "1", "TEMPERATURE": "0.6", "EMBED_ON_HOST": "1"},
    {"SPEC": "mtp+lookup", "MAX_SEQS": "4", "MAX_BATCHED_TOKENS": "4096", "GPU_UTIL": "0.9", "RAM_CACHE": "8G"},
    {"SPEC": "dflash2", "DRAFT": "drafter", "KV_MEM": "4G"},
]


@pytest.mark.parametrize("environ", FLAG_MATRIX, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_every_flag_the_builder_emits_is_a_knobs_or_declared(environ):
    """EXTRA_ARGS ownership is checked against knobs' maps_to plus BUILDER_FLAGS: together they must cover
    every flag build_command emits, or EXTRA_ARGS could silently override one."""
    environ = dict(environ)
    mode = environ.pop("MODE", "single")
    argv = command_for(environ, mode=mode, api_key=KEY).vllm_args
    declared = set(owned_flags()) | set(BUILDER_FLAGS)
    # A dotted flag (--structured-outputs-config.backend) is its base flag's, as vLLM's parser merges it.
    assert sorted({w.split("=", 1)[0].split(".", 1)[0] for w in argv if w.startswith("--")} - declared) == []


@pytest.mark.parametrize("flag", BUILDER_FLAGS)
def test_extra_args_cannot_override_a_builder_flag(flag):
    value = {"--tool-strict-level": " auto"}.get(flag, "")
    for spelling in (flag, "--" + flag[2:].replace("-", "_"), flag[:-2]):
        with pytest.raises(SettingsError) as caught:
            command_for({"EXTRA_ARGS": spelling + value}, api_key=KEY)
        (problem,) = caught.value.problems
        assert problem.knob == "EXTRA_ARGS" and "is set by HyperQwen's own command line" in problem.message
