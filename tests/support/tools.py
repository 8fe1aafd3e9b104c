"""Tools a test needs: skip in the fast tier, fail in the full tier."""

from __future__ import annotations

import pytest

# The fast tier (`scripts/test.py --fast`) runs without the heavy tools: a test whose tool is missing skips
# and says what to install. The full tier (what CI runs) installs every tool and sets HYPERQWEN_FULL_TIER=1,
# so there a missing tool is a failure, never a silent skip.
FULL_TIER_ENV = "HYPERQWEN_FULL_TIER"


def missing_tool(what: str, install: str):
    """Skip (fast tier) or fail (full tier) a test whose tool `what` is missing; `install` says how to get it."""
    import os

    message = f"{what} is not installed ({install})"
    if os.environ.get(FULL_TIER_ENV) == "1":
        pytest.fail(message + "; the full tier installs it (scripts/test.py)", pytrace=False)
    pytest.skip(message, allow_module_level=True)  # also at import time, to skip a whole module


def import_or_missing(module: str, install: str):
    """importlib.import_module(module), or missing_tool when it is not installed."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        missing_tool(f"the Python module {module!r}", install)


def require_modules(*modules: str, why: str) -> None:
    """At the top of a test module that needs the full tier's heavy packages (torch, vLLM, starlette): skip the
    whole module in the fast tier, naming the first missing package; fail in the full tier. Call it before
    importing them, so the fast tier never reaches an ImportError."""
    import importlib.util

    for module in modules:
        if importlib.util.find_spec(module) is None:
            missing_tool(f"the Python package {module!r} ({why})", "the full tier installs it: python3 scripts/test.py")
