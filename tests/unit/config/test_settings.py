"""Settings resolution: precedence, parsing, validation messages, did-you-mean, cross-knob checks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from hyperqwen.config.knobs import KNOBS, KNOBS_BY_NAME, MODES
from hyperqwen.config.settings import (
    COMMAND_LINE,
    DEFAULT,
    ENV_FILE,
    ENVIRONMENT,
    SettingsError,
    load_profile,
    profile_defaults,
    resolve_settings,
)
from hyperqwen.config.spelling import did_you_mean, edit_distance


def errors_of(exc: SettingsError) -> list[str]:
    return [p.message for p in exc.problems if p.severity == "error"]


def warnings_of(settings) -> list[str]:
    return [p.message for p in settings.warnings]


def test_defaults_come_from_the_mode_profile():
    single = resolve_settings({}, mode="single")
    batch = resolve_settings({}, mode="batch")
    assert single["SPEC"] == "mtp" and single.setting("SPEC").source == "single profile"
    assert batch["SPEC"] == "none" and batch.setting("SPEC").source == "batch profile"
    assert single["PORT"] == 18020 and single.setting("PORT").source == DEFAULT
    assert single["BIND"] == "127.0.0.1"
    assert single["SERVED_MODEL_NAME"] == "qwen3.8-27b"
    assert single["THINKING"] is False


def test_precedence_default_profile_envfile_environment_command_line():
    base = resolve_settings({}, mode="single")
    assert base["DRAFT_TOKENS"] == 4 and base.setting("DRAFT_TOKENS").source == "single profile"
    from_file = resolve_settings({}, mode="single", env_file={"DRAFT_TOKENS": "2"})
    assert (from_file["DRAFT_TOKENS"], from_file.setting("DRAFT_TOKENS").source) == (2, ENV_FILE)
    from_env = resolve_settings({"DRAFT_TOKENS": "3"}, mode="single", env_file={"DRAFT_TOKENS": "2"})
    assert (from_env["DRAFT_TOKENS"], from_env.setting("DRAFT_TOKENS").source) == (3, ENVIRONMENT)
    from_cli = resolve_settings({"DRAFT_TOKENS": "3"}, mode="single", env_file={"DRAFT_TOKENS": "2"},
                                overrides={"DRAFT_TOKENS": "5"})
    assert (from_cli["DRAFT_TOKENS"], from_cli.setting("DRAFT_TOKENS").source) == (5, COMMAND_LINE)


def test_mode_from_environment_and_command_line_wins():
    assert resolve_settings({"MODE": "batch"}).mode == "batch"
    assert resolve_settings({"MODE": "batch"}, mode="single").mode == "single"
    assert resolve_settings({}).mode == "single"


def test_empty_value_means_unset_as_compose_passes_it():
    settings = resolve_settings({"PORT": "", "SPEC": "  "}, mode="single")
    assert settings["PORT"] == 18020 and settings["SPEC"] == "mtp"


@pytest.mark.parametrize("raw,expected", [("1", True), ("TRUE", True), ("yes", True), ("On", True),
                                          ("0", False), ("false", False), ("no", False), ("off", False)])
def test_booleans(raw, expected):
    assert resolve_settings({"PREFIX_CACHE": raw}, mode="single")["PREFIX_CACHE"] is expected


def test_choices_are_case_insensitive_and_canonicalised():
    assert resolve_settings({"SPEC": "MTP"}, mode="single")["SPEC"] == "mtp"


@pytest.mark.parametrize("env,fragments", [
    ({"PORT": "80800"}, ["PORT='80800'", "above the maximum", "int in [1, 65535]"]),
    ({"PORT": "http"}, ["PORT='http'", "not a whole number"]),
    ({"SPEC": "mpt"}, ["SPEC='mpt'", "did you mean mtp", "mtp | dflash2 | ngram | mtp+lookup | none"]),
    ({"PREFIX_CACHE": "maybe"}, ["PREFIX_CACHE='maybe'", "not a boolean", "true | false"]),
    ({"MAX_LEN": "64k"}, ["MAX_LEN='64k'", "write 65536"]),
    ({"GPU_UTIL": "nan"}, ["GPU_UTIL='nan'", "not a finite number"]),
    ({"KV_MEM": "5 parsecs"}, ["KV_MEM='5 parsecs'", "unknown unit"]),
    ({"EXTRA_ARGS": "--foo 'bar"}, ["EXTRA_ARGS=", "not valid shell quoting"]),
    ({"MODEL": "a\nb"}, ["MODEL=", "control character"]),
])
def test_bad_values_name_knob_value_and_what_is_allowed(env, fragments):
    with pytest.raises(SettingsError) as caught:
        resolve_settings(env, mode="single")
    message = "\n".join(errors_of(caught.value))
    for fragment in fragments:
        assert fragment in message
    assert "in the environment" in message


def test_every_error_is_reported_not_only_the_first():
    with pytest.raises(SettingsError) as caught:
        resolve_settings({"PORT": "x", "SPEC": "y", "THINKING": "z"}, mode="single")
    assert {p.knob for p in caught.value.problems if p.severity == "error"} >= {"PORT", "SPEC", "THINKING"}


def test_secret_values_are_never_echoed_in_errors():
    with pytest.raises(SettingsError) as caught:
        resolve_settings({"VLLM_API_KEY": "sk-secret\nvalue"}, mode="single")
    text = str(caught.value)
    assert "sk-secret" not in text and "VLLM_API_KEY=****" in text


def test_secret_display_is_masked():
    settings = resolve_settings({"VLLM_API_KEY": "sk-0123456789abcdef"}, mode="single")
    assert settings.setting("VLLM_API_KEY").display() == "****"
    assert resolve_settings({}, mode="single").setting("VLLM_API_KEY").display() == "(unset)"


@pytest.mark.parametrize("name,expected", [("SEPC", "SPEC"), ("spec", "SPEC"), ("DRAFT_TOKEN", "DRAFT_TOKENS"),
                                           ("PREFIX_CAHCE", "PREFIX_CACHE"), ("GPU_UTILS", "GPU_UTIL"),
                                           ("MAX_SEQ", "MAX_SEQS")])
def test_misspelled_variable_gets_did_you_mean(name, expected):
    settings = resolve_settings({name: "1"}, mode="single")
    assert any(f"{name} (in the environment) is not a HyperQwen knob" in w and f"did you mean {expected}?" in w
               for w in warnings_of(settings))


def test_unrelated_environment_is_left_alone():
    environ = {"PATH": "/bin", "HOME": "/root", "PWD": "/", "CXX": "g++", "TZ": "UTC", "LANG": "C.UTF-8",
               "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HOME": "/cache", "CUDA_VISIBLE_DEVICES": "0"}
    assert warnings_of(resolve_settings(environ, mode="single")) == []


def test_misspelling_in_env_file_is_flagged_and_other_names_pass_through():
    settings = resolve_settings({}, mode="single", env_file={"DRAFT_TOKNES": "3", "VLLM_LOGGING_LEVEL": "DEBUG"})
    assert any("DRAFT_TOKNES (in .env)" in w and "DRAFT_TOKENS" in w for w in warnings_of(settings))
    assert settings.passthrough_env["VLLM_LOGGING_LEVEL"] == "DEBUG"


def test_unknown_command_line_knob_is_an_error_with_suggestion():
    with pytest.raises(SettingsError, match="--set MAX_LNE: not a knob; did you mean MAX_LEN"):
        resolve_settings({}, mode="single", overrides={"MAX_LNE": "1024"})


def test_knob_ignored_by_mode_is_reported():
    batch = resolve_settings({"CTX": "long"}, mode="batch")
    assert any("CTX is ignored in batch mode" in w for w in warnings_of(batch))
    assert not any("MAX_LEN" in w for w in warnings_of(resolve_settings({"MAX_LEN": "4096"}, mode="batch")))


def test_contradiction_dflash_tokens_with_mtp_is_explained():
    settings = resolve_settings({"SPEC": "mtp", "DFLASH_TOKENS": "7"}, mode="single")
    assert any("DFLASH_TOKENS has no effect because SPEC=mtp" in w for w in warnings_of(settings))


def test_dflash2_drafter_defaults_to_the_folder_prepare_fetches_it_into():
    from hyperqwen.prepare.drafter import DRAFTER_DIR_NAME

    assert resolve_settings({"SPEC": "dflash2"}, mode="single")["DRAFT"] == DRAFTER_DIR_NAME
    assert resolve_settings({"SPEC": "dflash2", "DRAFT": ""}, mode="single")["DRAFT"] == DRAFTER_DIR_NAME
    assert resolve_settings({"SPEC": "dflash2", "DRAFT": "dflash2"}, mode="single")["DRAFT"] == "dflash2"


def test_api_key_on_extra_args_is_refused():
    with pytest.raises(SettingsError, match="EXTRA_ARGS: word 1 '--api-key=...' is set by HyperQwen from VLLM_API_KEY"):
        resolve_settings({"EXTRA_ARGS": "--api-key=abc"}, mode="single")


def test_bad_bind_address():
    with pytest.raises(SettingsError, match="BIND='not an address' is not an IP address"):
        resolve_settings({"BIND": "not an address"}, mode="single")


def test_profiles_are_valid_and_only_name_knobs():
    for mode in MODES:
        assert load_profile(mode)["mode"] == mode
        defaults = profile_defaults(mode)
        assert set(defaults) <= set(KNOBS_BY_NAME)


def test_profile_with_unknown_knob_is_rejected(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("mode: single\ndefaults:\n  SPECULATION: mtp\n")
    with pytest.raises(SettingsError, match="unknown knob 'SPECULATION'"):
        profile_defaults("single", path)


def test_edit_distance_and_did_you_mean():
    assert edit_distance("SPEC", "SEPC") == 1
    assert edit_distance("kitten", "sitting") == 3
    assert did_you_mean("MAX_LNE", KNOBS_BY_NAME) == "MAX_LEN"
    assert did_you_mean("COMPLETELY_DIFFERENT", KNOBS_BY_NAME) is None


# --- property: any string at any knob gives a clean error or valid settings -----------------------

@pytest.mark.parametrize("knob_name", [k.name for k in KNOBS])
@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.text(max_size=40))
def test_any_string_at_any_knob_is_a_clean_error_or_valid(knob_name, raw):
    try:
        settings = resolve_settings({knob_name: raw}, mode="single")
    except SettingsError as exc:
        assert exc.problems and all(p.message for p in exc.problems)
        return
    knob = KNOBS_BY_NAME[knob_name]
    value = settings[knob_name]
    if knob.kind == "choice":
        assert value in knob.choices or (value is None and knob.default is None)
    if knob.kind in ("int", "float", "bytes") and value is not None:
        assert (knob.min is None or value >= knob.min) and (knob.max is None or value <= knob.max)
