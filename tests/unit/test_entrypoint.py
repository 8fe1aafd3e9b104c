"""The container entrypoint's dispatch, run as the container runs it (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys


def entrypoint(*args, env=None, cwd=None):
    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "hyperqwen.entrypoint", *args], capture_output=True, text=True,
                          env=environ, cwd=cwd, timeout=120)


def test_mode_refuses_to_start_when_verify_fails(tmp_path):
    # No model in MODELS_DIR (and no GPU here): verify reports FAIL lines and the server is not started.
    result = entrypoint("single", env={"MODELS_DIR": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 1
    assert "FAIL" in result.stdout
    assert "not starting the server" in result.stderr and "SKIP_VERIFY" in result.stderr


def test_skip_verify_goes_straight_to_serve(tmp_path):
    result = entrypoint("batch", env={"MODELS_DIR": str(tmp_path), "SKIP_VERIFY": "true"}, cwd=tmp_path)
    # serve's own preflight then stops on the missing model, naming prepare: proof it got to serve.
    assert result.returncode == 2
    assert "no checkpoint at" in result.stderr and "prepare" in result.stderr
    assert "FAIL" not in result.stdout


def test_bad_skip_verify_value_is_a_clean_error(tmp_path):
    result = entrypoint("single", env={"SKIP_VERIFY": "perhaps"}, cwd=tmp_path)
    assert result.returncode == 2 and "SKIP_VERIFY='perhaps' is not a boolean" in result.stderr


def test_any_other_command_is_executed(tmp_path):
    result = entrypoint("echo", "hello from the container", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "hello from the container\n"


def test_unknown_command_says_what_is_accepted(tmp_path):
    result = entrypoint("no-such-command-here", cwd=tmp_path)
    assert result.returncode == 127
    assert "single, batch" in result.stderr and "prepare, verify" in result.stderr


def test_verify_is_dispatched_with_its_arguments(tmp_path):
    result = entrypoint("verify", "--help", cwd=tmp_path)
    assert result.returncode == 0 and "--install" in result.stdout
