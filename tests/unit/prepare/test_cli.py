"""`hyperqwen prepare` as the init service runs it: knobs from the environment, exit codes, logs."""

import argparse
import logging

import pytest

from hyperqwen.prepare import register
from hyperqwen.prepare.cli import main


@pytest.fixture
def env(monkeypatch, pristine_source, tmp_path):
    for name in ("MODEL_REPO", "MODEL_REVISION", "HF_HUB_OFFLINE", "QUANTIZE_EMBED", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("MODEL", "served")
    monkeypatch.setenv("MODEL_SOURCE_DIR", str(pristine_source))
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_value_must_not_leak_42")
    return tmp_path / "models" / "served"


def test_register_adds_the_prepare_command():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prepare", "--verify-only", "--no-progress"])
    assert args.verify_only and args.no_progress and callable(args.func)


def test_prepare_then_rerun_then_verify_only(env, caplog):
    caplog.set_level(logging.INFO, logger="hyperqwen.prepare")
    assert main(["--no-progress"]) == 0
    assert (env / "hyperqwen-manifest.json").is_file()
    assert main(["--no-progress"]) == 0
    assert "already up to date" in caplog.text
    assert main(["--verify-only"]) == 0
    assert "verified" in caplog.text
    assert "hf_SECRET_value_must_not_leak_42" not in caplog.text
    assert "'HF_TOKEN': '****'" in caplog.text  # the masked form is what the log shows


def test_errors_exit_1_with_the_message(env, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MODEL_SOURCE_DIR", str(tmp_path / "missing"))
    assert main(["--no-progress"]) == 1
    assert "MODEL_SOURCE_DIR=" in caplog.text and "is not a directory" in caplog.text
    assert main(["--verify-only"]) == 1  # nothing prepared yet
    assert "config.json is missing" in caplog.text


def test_knobs_load_like_every_command_env_file_then_environment_then_set(env, monkeypatch, tmp_path, caplog):
    # The one settings loader: --env-file < environment < --set.
    caplog.set_level(logging.INFO, logger="hyperqwen.prepare")
    env_file = tmp_path / "prepare.env"
    env_file.write_text(f"MODEL_SOURCE_DIR={tmp_path / 'from-env-file'}\nQUANTIZE_EMBED=0\n")
    monkeypatch.delenv("MODEL_SOURCE_DIR")
    assert main(["--no-progress", "--env-file", str(env_file)]) == 1
    assert f"MODEL_SOURCE_DIR='{tmp_path / 'from-env-file'}' is not a directory" in caplog.text
    caplog.clear()
    monkeypatch.setenv("MODEL_SOURCE_DIR", str(tmp_path / "from-environment"))
    assert main(["--no-progress", "--env-file", str(env_file)]) == 1
    assert "from-environment" in caplog.text
    caplog.clear()
    assert (
        main(["--no-progress", "--env-file", str(env_file), "--set", f"MODEL_SOURCE_DIR={tmp_path / 'set'}"]) == 1
    )
    assert f"MODEL_SOURCE_DIR='{tmp_path / 'set'}' is not" in caplog.text and "'QUANTIZE_EMBED': False" in caplog.text
