"""Shared by every test folder: the `needs_patch` marker.

The test environment applies patches/series before pytest runs (scripts/test.py). A test marked
`@pytest.mark.needs_patch("NNNN-name.patch", ...)` is skipped, naming the patch, when `hyperqwen patches check`
does not find that patch applied exactly; so an unpatched venv reports skips, not failures that are really
"patches not applied".
"""

from __future__ import annotations

import functools

import pytest


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

