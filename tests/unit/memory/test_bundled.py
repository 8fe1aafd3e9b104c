"""Before download: the shipped shapes are the header fixture's, byte for byte, and plan like the checkpoint."""

from __future__ import annotations

from pathlib import Path

from hyperqwen.config.settings import resolve_settings
from hyperqwen.memory import parse_gpu, plan_memory
from hyperqwen.memory.bundled import BUNDLE, BUNDLED_MODEL, bundle_bytes, load_bundled_checkpoint
from hyperqwen.memory.checkpoint import load_checkpoint, read_checkpoint_tensors, read_config

PREPARED = Path(__file__).parent / "data" / "qwen3.8-27b-prepared"
ORIGIN = "header fixture tests/unit/memory/data/qwen3.8-27b-prepared"


def test_regenerating_from_the_header_fixture_gives_the_shipped_file():
    assert bundle_bytes(read_config(PREPARED), read_checkpoint_tensors(PREPARED), ORIGIN) == BUNDLE.read_bytes()
    assert BUNDLE.stat().st_size < 64 * 1024  # small enough to ship in the wheel


def test_bundle_matches_the_checkpoint():
    bundled, real = load_bundled_checkpoint(), load_checkpoint(PREPARED)
    assert bundled.shape == real.shape
    assert bundled.weights(2) == real.weights(2)


def test_plan_works_on_a_fresh_checkout_without_the_model(tmp_path):
    settings = resolve_settings({"MODELS_DIR": str(tmp_path)}, mode="single")
    assert settings["MODEL"] == BUNDLED_MODEL and not settings.model_path.exists()
    b = plan_memory(settings, parse_gpu("rtx3090"))
    assert "bundled shapes" in b.checkpoint_source and b.pool_bytes > 0


def test_a_checkpoint_on_disk_wins(tmp_path):
    settings = resolve_settings({"MODELS_DIR": str(PREPARED.parent), "MODEL": PREPARED.name}, mode="single")
    assert plan_memory(settings, parse_gpu("rtx3090")).checkpoint_source == str(PREPARED)
