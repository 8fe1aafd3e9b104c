"""No knob value can become an option: every value goes into vLLM's argv as one `--flag=value` word, and the
whole final argv, parsed by vLLM's own parser, gives every owned setting (host, port, model, served name,
key, socket) exactly the value HyperQwen decided.

The property tests drive each string knob that reaches the argv with option-like values. Where vLLM is
importable (the test venv) the real parser reads the argv; the fast tier reads it with the committed option
table (config/vllm_options.json, generated from that parser) and says so in the skip of the real-parser cases.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from hyperqwen.config.knobs import MODES
from hyperqwen.config.settings import SettingsError, profile_defaults, resolve_settings
from hyperqwen.launch.command import _table_owned_values, build_command, check_command, parsed_owned_values

KEY = "sk-test-0123456789abcdef"
PROFILES = {mode: profile_defaults(mode) for mode in MODES}
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM's own parser needs the vLLM CPU build (.venv); "
                                "the option-table cases cover the fast tier")

# What the outside probe used: vLLM's parser rewrote `--served-model-name.z` into JSON and took the next word.
OPTION_LIKE = ["--x", "--x.y", "--served-model-name.z", "--host.a", "--port.b", "--uds", "--uds.x", "-h",
               "--help", "=", "--host=0.0.0.0", "a --host 0.0.0.0", "x=--port", "--api-key=k", "-O3", "--",
               "--config", "a b", " -x", "--model", "name.with.dots", "--enable-prefix-caching"]
STRING_KNOBS = ("MODEL", "SERVED_MODEL_NAME", "MODELS_DIR", "DRAFT")

option_like = st.one_of(
    st.sampled_from(OPTION_LIKE),
    st.builds(lambda a, b, c: a + b + c, st.sampled_from(["", "-", "--", "a", "--x."]),
              st.text(st.sampled_from("abz-_.=/ \n"), max_size=12), st.sampled_from(["", "=", ".y", " --port"])),
)


@lru_cache(maxsize=1)
def real_parser():
    from hyperqwen.config.extra_args import vllm_parser

    return vllm_parser()


def built(knob: str, value: str, tmp_path: Path):
    """The command for `knob`=value (SPEC=dflash2 when the knob is DRAFT, so it reaches the argv), or None when
    HyperQwen refuses the value (then the refusal names the knob, in one message per problem)."""
    environ = {"MODELS_DIR": str(tmp_path), knob: value}
    if knob == "DRAFT":
        environ["SPEC"] = "dflash2"
    try:
        settings = resolve_settings(environ, mode="single", profiles=PROFILES)
        return settings, build_command(settings, api_key=None)
    except SettingsError as exc:
        errors = [p for p in exc.problems if p.severity == "error"]
        assert errors and any(p.knob == knob or knob in p.message for p in errors), errors
        return None


def assert_owned_unchanged(settings, command, got, parser=None) -> None:
    """The parsed owned settings are the ones the knobs say, not only what the builder recorded."""
    assert got["host"] == "127.0.0.1" and got["port"] == settings["PORT"]
    assert got["model"] == str(settings.model_path)
    assert got["served_model_name"] == [settings["SERVED_MODEL_NAME"]]
    assert got["api_key"] is None and got["uds"] is None and got["model_tag"] is None
    assert not got["headless"] and not got["grpc"]
    assert check_command(command, parser) == []


@pytest.mark.parametrize("knob", STRING_KNOBS)
@given(value=option_like)
@example(value="--served-model-name.z")
@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_option_like_string_knobs_cannot_change_owned_settings_table(knob, value, tmp_path):
    result = built(knob, value, tmp_path)
    if result is not None:
        settings, command = result
        assert_owned_unchanged(settings, command, _table_owned_values(command.vllm_args))


@needs_vllm
@pytest.mark.parametrize("knob", STRING_KNOBS)
@given(value=option_like)
@example(value="--served-model-name.z")
@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_option_like_string_knobs_cannot_change_owned_settings_vllm_parser(knob, value, tmp_path):
    result = built(knob, value, tmp_path)
    if result is not None:
        settings, command = result
        assert_owned_unchanged(settings, command, parsed_owned_values(command.vllm_args, real_parser()), real_parser())


def test_the_probe_value_is_a_served_name_not_an_option(tmp_path):
    """The outside probe's case: SERVED_MODEL_NAME with a dotted option name no longer opens the host."""
    settings, command = built("SERVED_MODEL_NAME", "a.--served-model-name.z", tmp_path)
    assert "--served-model-name=a.--served-model-name.z" in command.vllm_args
    assert_owned_unchanged(settings, command, _table_owned_values(command.vllm_args))


def test_every_builder_value_is_one_flag_equals_value_word():
    settings = resolve_settings({"SPEC": "dflash2", "DRAFT": "d", "TEMPERATURE": "0.7", "MAX_SEQS": "4",
                                 "RAM_CACHE": "1GiB", "TP": "1"}, mode="single", profiles=PROFILES)
    args = build_command(settings, api_key=KEY).vllm_args
    for word in args:
        assert word.startswith("--"), f"{word!r} is a separate value word"


@pytest.mark.parametrize(("knob", "value", "says"), [
    ("MODEL", "../../etc", "climbs out of MODELS_DIR"), ("MODEL", "a/../../b", "climbs out of MODELS_DIR"),
    ("MODEL", "--served-model-name.z", "starts with '-'"), ("MODELS_DIR", "--x", "starts with '-'"),
    ("SERVED_MODEL_NAME", "-h", "starts with '-'"), ("DRAFT", "../d", "climbs out of MODELS_DIR"),
])
def test_paths_and_names_that_are_tricks_are_refused_in_one_line(knob, value, says, tmp_path):
    environ = {"MODELS_DIR": str(tmp_path), knob: value, "SPEC": "dflash2", "DRAFT": "d"}
    environ[knob] = value
    with pytest.raises(SettingsError) as caught:
        build_command(resolve_settings(environ, mode="single", profiles=PROFILES), api_key=None)
    (problem,) = caught.value.problems
    assert problem.knob == knob and says in problem.message and "\n" not in problem.message


def test_an_absolute_model_path_is_still_a_model(tmp_path):
    settings, command = built("MODEL", str(tmp_path / "m"), tmp_path)
    assert f"--model={tmp_path / 'm'}" in command.vllm_args


def test_an_owned_setting_changed_after_the_builder_is_caught():
    """check_command compares what the parser makes of the argv with the decision, so a word slipped in later
    (here: a Unix socket after the builder's own words) is refused with one line."""
    from dataclasses import replace

    command = build_command(resolve_settings({}, mode="single", profiles=PROFILES), api_key=None)
    sneaked = replace(command, argv=(*command.argv, "--uds=/tmp/s"))
    for parser in (None, real_parser()) if HAVE_VLLM else (None,):
        messages = check_command(sneaked, parser)
        assert messages and "uds" in messages[0]
