"""`.env` files (config/envfile.py): the rules docker compose uses, one parser for every command."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperqwen.config.envfile import EnvFileError, read_env_file
from hyperqwen.config.load import load_settings
from hyperqwen.config.settings import SettingsError


def test_env_file_parsing(tmp_path):
    path = tmp_path / ".env"
    path.write_text("# comment\n\nexport SPEC=mtp\nMAX_LEN = 32768\nSERVED_MODEL_NAME='my model'\n"
                    "EXTRA_ARGS=\"--enforce-eager\"\nPORT=18021 # trailing comment\nEMPTY=\n")
    assert read_env_file(path) == {"SPEC": "mtp", "MAX_LEN": "32768", "SERVED_MODEL_NAME": "my model",
                                   "EXTRA_ARGS": "--enforce-eager", "PORT": "18021", "EMPTY": ""}


def test_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / ".env"
    path.write_text("SPEC=mtp\nthis is not a setting\n")
    with pytest.raises(EnvFileError, match=r"\.env:2: expected NAME=value"):
        read_env_file(path)


def test_not_utf8_is_one_clear_error(tmp_path):
    path = tmp_path / ".env"
    path.write_bytes(b"SPEC=\xff\n")
    with pytest.raises(EnvFileError, match="not UTF-8"):
        read_env_file(path)


@given(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True),
                       st.from_regex(r"[A-Za-z0-9_./:-]{0,30}", fullmatch=True), max_size=8))
def test_round_trip_of_plain_values(tmp_path_factory, values):
    path = tmp_path_factory.mktemp("env") / ".env"
    path.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    assert read_env_file(path) == values


def test_every_command_reads_dot_env_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("MAX_SEQS=3\n")
    monkeypatch.chdir(tmp_path)
    settings = load_settings({}, mode="batch")
    assert settings["MAX_SEQS"] == 3 and settings.setting("MAX_SEQS").source == ".env"
    assert load_settings({"MAX_SEQS": "5"}, mode="batch")["MAX_SEQS"] == 5  # the environment wins
    assert load_settings({"MAX_SEQS": "5"}, mode="batch", overrides=["MAX_SEQS=7"])["MAX_SEQS"] == 7


def test_a_bad_env_file_is_a_settings_error(tmp_path):
    bad = tmp_path / "bad.env"
    bad.write_text("not a setting\n")
    with pytest.raises(SettingsError, match="bad.env:1"):
        load_settings({}, env_file=bad)
    with pytest.raises(SettingsError, match="no such file"):
        load_settings({}, env_file=tmp_path / "missing.env")
