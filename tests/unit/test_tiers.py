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
