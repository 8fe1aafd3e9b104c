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


MAX_FUNCTION_LINES = 100


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`path:line name (N lines)` for every function or method longer than `limit` lines (its def to its last
    line, decorators and docstring included)."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_in_src_is_over_100_lines():
    """A function that long does several things; split it along its steps."""
    assert long_functions(REPO / "src") == []


def test_long_functions_are_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "".join(f"    x{n} = {n}\n" for n in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg" / "m.py").write_text(f"def short():\n    pass\n\n\nasync def long():\n{body}")
    assert long_functions(tmp_path / "pkg") == ["pkg/m.py:5 long (101 lines)"]


# The knob reads by name left in src, each with its reason; every other read is `settings.knobs.<knob>`, which
# mypy checks (config/values.py is generated from the knob table).
KNOB_READS_BY_NAME = {
    "hyperqwen/config/settings.py": "the path knobs are checked in one loop over PATH_KNOBS",
    "hyperqwen/memory/budget.py": "the measured terms are one table of knobs (TERM_KNOBS), read together",
    "hyperqwen/prepare/options.py": "which knob is shown depends on the name that was misspelt",
}


def knob_reads_by_name(root: Path) -> dict[str, list[str]]:
    """`settings[...]` and `settings.get(...)` reads (on any name ending in `settings`), by file: a literal
    knob name as `literal NAME:line`, any other key as `by name:line`."""
    import ast

    def is_settings(node: ast.expr) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name.endswith("settings")

    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and is_settings(node.value):
                key = node.slice
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and is_settings(node.func.value) and node.args):
                key = node.args[0]
            if key is None:
                continue
            literal = isinstance(key, ast.Constant) and isinstance(key.value, str)
            what = f"literal {key.value}" if literal else "by name"  # type: ignore[union-attr]
            found.setdefault(path.relative_to(root).as_posix(), []).append(f"{what}:{node.lineno}")
    return found


def test_knobs_are_read_as_typed_attributes():
    """`settings["SPEC"]` is a string mypy cannot check; `settings.knobs.spec` is checked. What is still read by
    name is listed above with its reason; no knob is read by a literal name."""
    found = knob_reads_by_name(REPO / "src")
    literal = {path: reads for path, reads in found.items() if any(r.startswith("literal") for r in reads)}
    assert literal == {}, "read these through settings.knobs.<knob>"
    assert sorted(found) == sorted(KNOB_READS_BY_NAME), "a read by name needs its reason in KNOB_READS_BY_NAME"


def test_knob_reads_by_name_are_found(tmp_path):
    (tmp_path / "m.py").write_text(
        'def f(settings, name, self):\n    a = settings["SPEC"]\n    b = self.settings.get("PORT")\n'
        "    return settings[name], a, b\n"
    )
    assert knob_reads_by_name(tmp_path) == {"m.py": ["literal SPEC:2", "literal PORT:3", "by name:4"]}
