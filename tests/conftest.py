"""Shared by every test folder: the `needs_patch` marker, Hypothesis without deadlines, and the hand-over
from the fast tier to the full tier (below).

The test environment applies patches/series before pytest runs (scripts/test.py). A test marked
`@pytest.mark.needs_patch("NNNN-name.patch", ...)` is skipped, naming the patch, when `hyperqwen patches check`
does not find that patch applied exactly; so an unpatched venv reports skips, not failures that are really
"patches not applied".
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest


def _no_hypothesis_deadline() -> None:
    """Hypothesis fails an example that takes over 200 ms; on a shared 2-core runner plain parsing can (302 ms
    for a .env round trip in the fast tier while other jobs ran). The properties are about results, not speed.
    derandomize: CI runs the same examples every time, so a run fails because of a change, not a draw (a
    planted-outlier property once drew a case on its threshold)."""
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("hyperqwen", deadline=None, derandomize=True)
    settings.load_profile("hyperqwen")


_no_hypothesis_deadline()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_patch(*names): skip unless these patches/series entries are applied to vLLM"
    )


@functools.cache
def patch_state() -> dict[str, str]:
    """patch name -> "" when applied exactly, else why not (the same check as `hyperqwen patches check`)."""
    from hyperqwen import patches

    try:
        series = patches.read_series(patches.default_patches_dir())
        results = patches.check_series(series, patches.find_vllm_site_packages())
    except patches.PatchError as exc:
        return {"*": str(exc)}
    return {r.patch.name: "" if r.applied else (r.detail.splitlines() or ["not applied"])[-1] for r in results}


def pytest_runtest_setup(item):
    for marker in item.iter_markers("needs_patch"):
        state = patch_state()
        for name in marker.args:
            if "*" in state:
                pytest.skip(f"cannot check the patch series: {state['*']}")
            if name not in state:
                pytest.fail(f"{name} is not listed in patches/series")
            if state[name]:
                pytest.skip(
                    f"{name} is not applied to this vLLM ({state[name]}); run `hyperqwen patches apply` "
                    "(scripts/test.py does it for the test venv)"
                )



# --- one CI run, two tiers: what the fast tier passed, the full tier does not run again -----------------------
# scripts/test.py runs the fast tier first with HYPERQWEN_RECORD_PASSED=FILE (each passed test's node id is
# written there), then the full tier with HYPERQWEN_SKIP_PASSED=FILE (those tests are deselected). A test the
# fast tier skipped (no torch, no vLLM, no linter binary) runs in the full tier, where a missing tool fails.
RECORD_PASSED_ENV = "HYPERQWEN_RECORD_PASSED"
SKIP_PASSED_ENV = "HYPERQWEN_SKIP_PASSED"
_passed: list[str] = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed and os.environ.get(RECORD_PASSED_ENV):
        _passed.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(RECORD_PASSED_ENV)
    if path:
        Path(path).write_text("".join(f"{nodeid}\n" for nodeid in _passed))


def pytest_collection_modifyitems(config, items):
    path = os.environ.get(SKIP_PASSED_ENV)
    if not path:
        return
    passed = set(Path(path).read_text().splitlines())
    kept = [item for item in items if item.nodeid not in passed]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in passed])
        items[:] = kept
