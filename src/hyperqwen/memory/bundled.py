"""The default model's shapes and per-tensor sizes, shipped with the package so `hyperqwen plan` answers
"will it fit?" before a 20 GB download.

`data/qwen3.8-27b-prepared.json.gz` holds the checkpoint's config.json and every tensor's name, dtype and
shape as `hyperqwen prepare` leaves them (int8 group-128 lm_head, embed_tokens and MTP linears on the W4A16
body). It is generated from safetensors headers with `write_bundle` (the test suite regenerates it from the
header fixture and requires the same bytes); a checkpoint on disk always wins over it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from hyperqwen.memory.checkpoint import Checkpoint, TensorInfo, model_shape_from_config

BUNDLE = Path(__file__).parent / "data" / "qwen3.8-27b-prepared.json.gz"
# The model the bundle describes: MODEL's default directory name (config/knobs.py) and its Hub repo.
BUNDLED_MODEL = "qwen3.8-27b"
BUNDLE_FORMAT = 1


def bundle_bytes(config: Mapping[str, object], tensors: Iterable[TensorInfo], origin: str) -> bytes:
    """The bundle file's exact bytes (gzip with a fixed mtime, sorted keys): regenerating is reproducible."""
    doc = {
        "format": BUNDLE_FORMAT,
        "origin": origin,
        "config": config,
        "tensors": sorted([t.name, t.dtype, list(t.shape)] for t in tensors),
    }
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return gzip.compress(raw, compresslevel=9, mtime=0)


def write_bundle(model_dir: Path, out: Path = BUNDLE, origin: str | None = None) -> Path:
    """Write the bundle from a checkpoint directory (config.json + safetensors headers)."""
    from hyperqwen.memory.checkpoint import read_checkpoint_tensors, read_config

    data = bundle_bytes(read_config(model_dir), read_checkpoint_tensors(model_dir), origin or model_dir.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return out


def load_bundled_checkpoint(path: Path = BUNDLE) -> Checkpoint:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    tensors = tuple(TensorInfo(name, dtype, tuple(shape)) for name, dtype, shape in doc["tensors"])
    return Checkpoint(model_shape_from_config(doc["config"], f"{path.name} (config)"), tensors)


if __name__ == "__main__":  # pragma: no cover - the regeneration command docs/memory.md gives
    import sys

    print(write_bundle(Path(sys.argv[1]), origin=sys.argv[2] if len(sys.argv) > 2 else None))
