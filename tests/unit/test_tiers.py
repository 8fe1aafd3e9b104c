"""The hand-over between the tiers (tests/conftest.py): what the fast tier passed, the full tier does not run again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests/unit/config/test_sizes.py"  # small, fast and without optional tools


def pytest_run(**env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERQWEN_RECORD", "HYPERQWEN_SKIP"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", MODULE],
                          capture_output=True, text=True, cwd=REPO, env={**environ, **env}, timeout=300)


def test_the_full_tier_deselects_what_the_fast_tier_passed(tmp_path):
    passed = tmp_path / "passed-tests.txt"
    first = pytest_run(HYPERQWEN_RECORD_PASSED=str(passed))
    assert first.returncode == 0, first.stdout[-2000:]
    ids = passed.read_text().splitlines()
    assert ids and all(i.startswith(MODULE + "::") for i in ids)
    second = pytest_run(HYPERQWEN_SKIP_PASSED=str(passed))
    assert second.returncode == 5 and f"{len(ids)} deselected" in second.stdout, second.stdout[-2000:]  # 5: none ran
    # One id dropped from the list (as if the fast tier had skipped that test): exactly that one runs again.
    passed.write_text("".join(f"{i}\n" for i in ids[1:]))
    third = pytest_run(HYPERQWEN_SKIP_PASSED=str(passed))
    assert third.returncode == 0 and "1 passed" in third.stdout, third.stdout[-2000:]


def _ensure_calls(function) -> list[str]:
    import ast

    return [node.func.id for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("ensure_")]


def test_ci_installs_every_tool_a_narrowed_full_tier_run_installs():
    """CI runs run_both_tiers; a developer's narrowed run (`scripts/test.py tests/...`) goes through main's own
    list. A tool only the narrowed run installs makes its tests skip in CI unseen (aider and llm once did)."""
    import ast

    tree = ast.parse((REPO / "scripts" / "test.py").read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    narrowed = [node for node in ast.walk(functions["main"]) if isinstance(node, ast.If)
                and isinstance(node.test, ast.Name) and node.test.id == "args"]
    assert len(narrowed) == 1
    full_tier = set(_ensure_calls(narrowed[0])) - {"ensure_fast_venv"}
    ci = set(_ensure_calls(functions["run_both_tiers"])) - {"ensure_fast_venv"}
    assert full_tier and ci == full_tier, (sorted(ci), sorted(full_tier))
