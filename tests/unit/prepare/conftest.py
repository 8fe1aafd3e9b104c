"""Fixtures for prepare: tiny synthetic checkpoints shaped like Qwen3.8-27B's W4A16 AutoRound build."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hyperqwen.prepare.options import PrepareOptions
from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint


@pytest.fixture(scope="session")
def pristine_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only for tests: prepare never modifies its source (tests that damage one use `source`)."""
    directory = tmp_path_factory.mktemp("synthetic") / "source"
    write_synthetic_checkpoint(directory, SyntheticShape())
    return directory


@pytest.fixture
def source(pristine_source: Path, tmp_path: Path) -> Path:
    """A private copy a test may damage (missing tokenizer, other architecture, ...)."""
    copy = tmp_path / "source"
    shutil.copytree(pristine_source, copy)
    return copy


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def make_options():
    """make_options(source_dir, models_dir, **overrides) -> PrepareOptions for tests (no progress bars)."""
    return _make_options


@pytest.fixture
def tree_bytes():
    return _tree_bytes


def _make_options(source_dir: Path, models_dir: Path, **overrides) -> PrepareOptions:
    # Baseline without the embedding step (QUANTIZE_EMBED's default is on); tests that exercise it say so.
    values = dict(
        output_dir=models_dir / "qwen3.8-27b",
        models_dir=models_dir,
        source_dir=source_dir,
        show_progress=False,
        quantize_embed=False,
    )
    values.update(overrides)
    return PrepareOptions(**values)


def _tree_bytes(directory: Path) -> dict[str, bytes]:
    """Every file's bytes, by relative path (hidden state files excluded: they are not the model)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
