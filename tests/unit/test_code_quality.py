"""ruff (lint and format) and mypy over the package, in the test run.

Each check is also shown a known-bad snippet, so a checker that silently checks nothing cannot pass.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from support.tools import missing_tool

REPO = Path(__file__).resolve().parents[2]


def tool(name: str, package: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        missing_tool(name, f"pip install {package}")
    return str(found)


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd, timeout=600)


def test_ruff_lint_is_clean():
    result = run(tool("ruff", "ruff"), "check", "src", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean():
    result = run(tool("ruff", "ruff"), "format", "--check", "src")
    assert result.returncode == 0, "run `ruff format src`:\n" + result.stdout + result.stderr


def test_mypy_is_clean():
    result = run(tool("mypy", "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_checkers_do_find_problems(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f(x: int) -> str:\n    return x\n")
    assert run(tool("ruff", "ruff"), "check", "--isolated", "--select", "F401", str(bad)).returncode == 1
    assert run(tool("mypy", "mypy"), "--no-incremental", "--config-file", "/dev/null", str(bad),
               cwd=tmp_path).returncode == 1
