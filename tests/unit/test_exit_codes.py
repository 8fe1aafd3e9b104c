"""Every command's exit statuses come from the one table (hyperqwen/exit_codes.py), read from the source with ast:
a command function (annotated `-> int` in a command module) never returns a bare number, and nothing raises
SystemExit or calls sys.exit with one. docs/design.md shows the same table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hyperqwen.cli import COMMANDS
from hyperqwen.exit_codes import Exit

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "hyperqwen"
# Modules that implement a command beyond the ones `hyperqwen` registers (cli.COMMANDS).
MORE_COMMAND_MODULES = ("hyperqwen.cli", "hyperqwen.entrypoint", "hyperqwen.bench.suite", "hyperqwen.monitor.server",
                        "hyperqwen.config.extra_args")
# `-> int` functions in those modules that return a number, not an exit status.
NOT_EXIT_STATUSES = {("hyperqwen.prepare.draft_vocab", "check_draft_vocab")}  # the draft vocabulary's size


def module_path(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


COMMAND_MODULES = sorted({c.module for c in COMMANDS.values()} | set(MORE_COMMAND_MODULES))


def bare_exits(source: str, module: str) -> list[str]:
    """`line: code` for every exit status written as a bare number."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            if ast.unparse(node.returns) != "int" or (module, node.name) in NOT_EXIT_STATUSES:
                continue
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and ret.value is not None:
                    values = [ret.value.body, ret.value.orelse] if isinstance(ret.value, ast.IfExp) else [ret.value]
                    found += [f"{v.lineno}: {ast.unparse(ret)}" for v in values
                              if isinstance(v, ast.Constant) and type(v.value) is int]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("SystemExit", "sys.exit", "exit"):
            if node.args and isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is int:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_every_exit_status_comes_from_the_table(module):
    assert bare_exits(module_path(module).read_text(encoding="utf-8"), module) == []


def test_bare_exits_are_found():
    source = "import sys\ndef main() -> int:\n    if x:\n        return 2\n    sys.exit(3)\n    return 0 if y else Exit.OK\n"
    assert sorted(bare_exits(source, "m")) == ["4: return 2", "5: sys.exit(3)", "6: return 0 if y else Exit.OK"]


def test_the_table_is_documented_in_design_md():
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    documented = {int(code) for row in re.findall(r"^  \| ([0-9 /]+) \|", text, re.M) for code in row.split("/")}
    assert documented == {int(code) for code in Exit}


def test_codes_are_unique_and_1_is_never_a_verdict():
    assert len({int(code) for code in Exit}) == len(Exit)
    from hyperqwen.memory.budget import Outcome

    assert Exit.FAILED not in {outcome.exit_code for outcome in Outcome}
