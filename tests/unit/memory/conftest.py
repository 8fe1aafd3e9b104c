from __future__ import annotations

from pathlib import Path

import pytest

from hyperqwen.memory.checkpoint import load_checkpoint

QWEN38_FIXTURE = Path(__file__).parent / "data" / "qwen3.8-27b-w4a16"


@pytest.fixture(scope="session")
def qwen38_dir() -> Path:
    """Fake (header-only) Qwen3.8-27B W4A16 checkpoint; see fake_checkpoint.py."""
    return QWEN38_FIXTURE


@pytest.fixture(scope="session")
def qwen38(qwen38_dir):
    return load_checkpoint(qwen38_dir)
