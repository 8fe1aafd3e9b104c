"""A base install answers: `pip install -e .` (no extras) then `hyperqwen --help` lists every command.

A fresh virtualenv without system packages gets only the base dependencies (from the package index, as a
user's pip would); a command whose extra is missing exits 2 with one line naming the extra.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hyperqwen.cli import COMMANDS
from support.commands import TYPICAL

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("base-install") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "--isolated", "--disable-pip-version-check",
                             "-q", "-e", str(REPO)], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pytest.fail(f"pip install -e . failed:\n{result.stdout}\n{result.stderr}")
    return venv


def hyperqwen(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "hyperqwen"), *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_help_lists_every_command_without_a_traceback(base_venv):
    result = hyperqwen(base_venv, "--help")
    assert result.returncode == 0, result.stderr
    for name in COMMANDS:
        assert name in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", [name for name, command in COMMANDS.items() if command.extra])
def test_a_command_whose_extra_is_missing_names_the_extra(base_venv, name):
    result = hyperqwen(base_venv, name, "--help")
    assert "Traceback" not in result.stderr
    if result.returncode == 0:  # its module imports with the base dependencies alone
        return
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'hyperqwen[{COMMANDS[name].extra}]'" in lines[0]


@pytest.mark.parametrize("name", [name for name, command in COMMANDS.items() if not command.extra])
def test_base_commands_answer_help(base_venv, name):
    result = hyperqwen(base_venv, name, "--help")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_serve_print_works_on_a_base_install(base_venv, tmp_path):
    result = subprocess.run([str(base_venv / "bin" / "hyperqwen"), "serve", "--print", "--set", "MEMORY_CHECK=off"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "vllm.entrypoints.openai.api_server" in result.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_typical_first_input_ends_without_a_traceback(base_venv, tmp_path, name):
    env = {"PATH": str(base_venv / "bin"), "HOME": str(tmp_path), "MODELS_DIR": str(tmp_path / "models"),
           "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([str(base_venv / "bin" / "hyperqwen"), *TYPICAL[name]], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=env)
    assert "Traceback" not in result.stderr and "unrecognized arguments" not in result.stderr, result.stderr
    if "needs the Python package" in result.stderr:
        assert result.returncode == 2 and f"pip install 'hyperqwen[{COMMANDS[name].extra or 'all'}]'" in result.stderr
