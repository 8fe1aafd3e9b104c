"""Hostile and random values for every knob, from every source: a valid command or clean errors naming the knob.

The pure pieces `hyperqwen serve` runs are called directly: resolve_settings (defaults < .env < environment <
--set), read_api_key (the key file under MODELS_DIR) and the argv builder. "Clean" means a SettingsError whose
errors each name a knob, one of them the knob under test; never another exception (a traceback for the user),
and never the key in a message.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from hyperqwen.config.apikey import (
    describe_api_key,
    is_secret_name,
    key_policy_violation,
    load_api_key,
    read_api_key,
    shown_in_clear,
)
from hyperqwen.config.knobs import KNOBS, MODES
from hyperqwen.config.settings import SettingsError, profile_defaults, resolve_settings
from hyperqwen.launch.command import MASK, build_command

KEY = "hq-fuzz-0123456789abcdef"
SOURCES = ("environment", "env_file", "set")
# What the outside probe threw at `--print` (and more): shell syntax, numbers that are not, Unicode look-alikes,
# control characters, traversal, and lengths Linux refuses (a 10,000-character name ended in ENAMETOOLONG).
HOSTILE = ["", " ", "true", "NaN", "-0", "inf", "1e309", "0x10", "$(id)", "`id`", "; rm -rf /", "ＭＴＰ", "０",
           "\u202e", "\ud800", "a\nb", "a\tb", "\x00", "\x1b[31m", "../../../../etc/passwd", "/" * 5000,
           "a" * 10_000, "/" + "a" * 300, "a/" * 2500, "é" * 3000, "%2F..%2F", "'", '"', "\\", "--api-key=x",
           "-1", "99999999999999999999999", "1.5", "0.0.0.0", "::", "localhost", "[::1]"]


# The mode profiles, read once (resolve_settings would read the YAML files on every call).
PROFILES = {mode: profile_defaults(mode) for mode in MODES}


def resolve(knob: str, value: str, source: str, tmp_path: Path):
    base = {"MODELS_DIR": str(tmp_path)}
    if source == "environment":
        return resolve_settings({**base, knob: value}, mode="single", profiles=PROFILES)
    if source == "env_file":
        return resolve_settings(base, mode="single", env_file={knob: value}, profiles=PROFILES)
    return resolve_settings(base, mode="single", overrides={knob: value}, profiles=PROFILES)


def _key_messages() -> str:
    """The fixed text of the key refusals: a fuzzed 'key' that is a word of it is no leak."""
    texts = []
    for sample in ("x", "é" * 20, "a b" * 8):
        try:
            resolve_settings({"VLLM_API_KEY": sample}, mode="single", profiles=PROFILES)
        except SettingsError as exc:
            texts.append(str(exc))
    return "\n".join(texts)


KEY_MESSAGES = _key_messages()


def check_one(knob: str, value: str, source: str, tmp_path: Path) -> None:
    try:
        settings = resolve(knob, value, source, tmp_path)
        key = read_api_key(settings)
        command = build_command(settings, api_key=key or KEY)
    except SettingsError as exc:
        errors = [p for p in exc.problems if p.severity == "error"]
        assert errors, exc.problems
        assert all(p.knob for p in errors), [str(p) for p in errors if not p.knob]
        if knob != "MODELS_DIR":  # a bad MODELS_DIR can surface through the paths under it
            assert any(p.knob == knob for p in errors) or any(knob in p.message for p in errors), (knob, errors)
        if knob == "VLLM_API_KEY" and len(value.strip()) >= 4 and value.strip() not in KEY_MESSAGES:
            assert value.strip() not in str(exc)
        return
    assert command.argv and all(isinstance(w, str) for w in command.argv)
    shown = command.shell_command()
    if knob == "VLLM_API_KEY" or key:
        assert (key or KEY) not in shown
    describe_api_key(settings)  # what --explain prints: never raises


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("knob", [k.name for k in KNOBS])
def test_hostile_values(knob, source, tmp_path):
    for value in HOSTILE:
        check_one(knob, value, source, tmp_path)


@pytest.mark.parametrize("knob", [k.name for k in KNOBS])
@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.text(max_size=60), st.builds(lambda c, n: c * n, st.characters(), st.integers(1, 12_000))),
       source=st.sampled_from(SOURCES))
@example(value="x" * 10_000, source="environment")
def test_random_values(knob, value, source, tmp_path):
    check_one(knob, value, source, tmp_path)


@pytest.mark.parametrize("name", ["MODELS_DIR", "API_KEY_FILE", "MODEL", "DRAFT", "DRAFT_VOCAB_IDS"])
def test_over_long_paths_are_one_clean_error(name, tmp_path):
    for value in ("x" * 10_000, "/" + "y" * 256, "a/" * 2100):
        with pytest.raises(SettingsError) as caught:
            extra = {"SPEC": "dflash2"} if name == "DRAFT" else {}
            settings = resolve_settings({**extra, name: value}, mode="single", profiles=PROFILES)
            read_api_key(settings)
        errors = [p for p in caught.value.problems if p.severity == "error"]
        assert [p.knob for p in errors] == [name], [str(p) for p in errors]
        assert "Errno" not in str(caught.value)


# --- the key: one rule for every source ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["true", "NaN", "-0", "$(id)", "short-key", "x" * 15, "ＭＴＰ" * 6, "０" * 20,
                                 "key with spaces 123", "tab\there-0123456789", "é" * 20])
def test_bad_keys_are_refused_from_every_source(key, tmp_path):
    for source in SOURCES:
        with pytest.raises(SettingsError) as caught:
            resolve("VLLM_API_KEY", key, source, tmp_path)
        message = str(caught.value)
        assert message.count("\n") == 0 and message.startswith("error: VLLM_API_KEY"), message
        assert key.strip() not in message or len(key.strip()) < 4
    (tmp_path / "api_key.txt").write_text(key + "\n", encoding="utf-8")
    settings = resolve_settings({"MODELS_DIR": str(tmp_path)}, mode="single", profiles=PROFILES)
    with pytest.raises(SettingsError, match=r"API_KEY_FILE .*api_key.txt"):
        read_api_key(settings)


@pytest.mark.parametrize("key", ["0123456789abcdef", "a" * 64, "hq-" + "Z9_~!#" * 4])
def test_good_keys_pass_from_every_source(key, tmp_path):
    for source in SOURCES:
        settings = resolve("VLLM_API_KEY", key, source, tmp_path)
        assert read_api_key(settings) == key
    (tmp_path / "api_key.txt").write_text(key + "\n")
    settings = resolve_settings({"MODELS_DIR": str(tmp_path)}, mode="single")
    assert read_api_key(settings) == key
    assert describe_api_key(settings) == f"set, from API_KEY_FILE {tmp_path / 'api_key.txt'}"
    assert key not in describe_api_key(settings) and key not in repr(load_api_key(settings))


def test_documented_key_command_makes_a_good_key():
    # `openssl rand -hex 16` prints 32 lowercase hex characters
    assert key_policy_violation("0f" * 16) is None
    assert "openssl rand -hex 16" in (key_policy_violation("short") or "")


def test_unreadable_key_file_is_one_clean_error(tmp_path):
    (tmp_path / "api_key.txt").mkdir()  # a directory where the file should be
    settings = resolve_settings({"MODELS_DIR": str(tmp_path)}, mode="single")
    with pytest.raises(SettingsError, match=r"API_KEY_FILE .*cannot read it \(EISDIR\)"):
        read_api_key(settings)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe" * 20)
    settings = resolve_settings({"MODELS_DIR": str(tmp_path), "API_KEY_FILE": "bad.txt"}, mode="single")
    with pytest.raises(SettingsError, match="cannot read it"):
        read_api_key(settings)


@pytest.mark.parametrize("name", ["VLLM_APIKEY", "VLLM_API_KY", "VLLM_API_KEYS", "VLLM_APi_KEY", "vllm_api_key",
                                  "HF_TOKN"])
def test_misspelt_key_variables_get_did_you_mean(name, tmp_path):
    for layer in ("environ", "env_file"):
        kwargs = {"env_file": {name: KEY}} if layer == "env_file" else {}
        environ = {name: KEY} if layer == "environ" else {}
        settings = resolve_settings(environ, mode="single", **kwargs)
        warnings = [str(p) for p in settings.warnings]
        assert any(name in w and "did you mean" in w for w in warnings), warnings
        assert not any(KEY in w for w in warnings)


def test_real_vllm_variables_get_no_did_you_mean():
    settings = resolve_settings({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO", "HF_HOME": "/x",
                                 "VLLM_USE_V1": "1", "HF_HUB_CACHE": "/c"}, mode="single")
    assert not settings.warnings


# --- nothing secret-looking in clear ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["VLLM_API_KY", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
                                  "DB_PASSWORD", "MY_SETTING", "GITHUB_TOKEN", "HF_TOKN", "ANTHROPIC_AUTH_TOKEN"])
def test_unknown_and_secret_env_entries_are_masked_in_print(name):
    settings = resolve_settings({}, mode="single", env_file={name: "s3cr3t-value-123", "VLLM_CPU_KVCACHE_SPACE": "1"})
    shown = build_command(settings, api_key=KEY).shell_command()
    assert "s3cr3t-value-123" not in shown and f"{name}={MASK}" in shown.replace("'", "")
    assert "VLLM_CPU_KVCACHE_SPACE=1" in shown and KEY not in shown


def test_secret_name_rule():
    assert is_secret_name("VLLM_API_KEY") and is_secret_name("X_TOKEN") and is_secret_name("PGPASSWORD")
    assert is_secret_name("VLLM_API_KY")  # a near miss of a secret knob
    assert not is_secret_name("VLLM_CPU_KVCACHE_SPACE")
    assert shown_in_clear("CUDA_VISIBLE_DEVICES") and not shown_in_clear("SOMETHING_ELSE")
