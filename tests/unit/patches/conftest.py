"""Tests of the patch series' contents, run against the installed, patched vLLM.

The test environment applies patches/series before pytest runs (scripts/test.py); the `needs_patch` marker
(tests/conftest.py) skips a test, naming the patch, when that patch is not applied exactly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def vllm_source(relpath: str) -> Path:
    """Path of a file of the installed vLLM, found without importing vLLM (which pulls in torch)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0]) / relpath


@pytest.fixture(scope="session")
def auth_module():
    """vLLM's installed authenticate.py, loaded by path: it only needs starlette, and `import vllm` would
    pull in torch (tens of seconds). The file is the one the server runs."""
    spec = importlib.util.spec_from_file_location(
        "hyperqwen_test_vllm_authenticate", vllm_source("entrypoints/serve/middleware/authenticate.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
