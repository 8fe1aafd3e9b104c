"""Reading config.json and real safetensors headers (files written by the safetensors library)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from hyperqwen.memory.checkpoint import (
    CheckpointError,
    drafter_attention_from_config,
    load_checkpoint,
    model_shape_from_config,
    read_safetensors_header,
    weight_bytes,
)


def test_header_reader_matches_real_safetensors_file(tmp_path):
    tensors = {"model.language_model.embed_tokens.weight": np.zeros((10, 4), np.float16),
               "model.language_model.layers.0.mlp.qweight": np.zeros((2, 8), np.int32),
               "model.language_model.layers.0.linear_attn.A_log": np.zeros((3,), np.float32),
               "model.visual.blocks.0.attn.qkv.weight": np.zeros((6, 2), np.float16),
               "mtp.fc.weight": np.zeros((4, 8), np.float16)}
    save_file(tensors, tmp_path / "model.safetensors")
    infos = {t.name: t for t in read_safetensors_header(tmp_path / "model.safetensors")}
    assert {n: (t.dtype, t.shape) for n, t in infos.items()} == {
        "model.language_model.embed_tokens.weight": ("F16", (10, 4)),
        "model.language_model.layers.0.mlp.qweight": ("I32", (2, 8)),
        "model.language_model.layers.0.linear_attn.A_log": ("F32", (3,)),
        "model.visual.blocks.0.attn.qkv.weight": ("F16", (6, 2)),
        "mtp.fc.weight": ("F16", (4, 8))}
    # bf16 model dtype: floats at 2 B, A_log stays float32, int32 packs as stored.
    w = weight_bytes(infos.values(), model_dtype_bytes=2)
    assert w.body == 10 * 4 * 2 + 2 * 8 * 4 + 3 * 4
    assert w.vision == 6 * 2 * 2
    assert w.mtp == 4 * 8 * 2
    assert w.resident(language_model_only=True, with_mtp=False) == w.body
    assert w.resident(language_model_only=False, with_mtp=True) == w.body + w.vision + w.mtp
    # float32 model dtype: every float tensor at 4 B.
    assert weight_bytes(infos.values(), model_dtype_bytes=4).body == 10 * 4 * 4 + 2 * 8 * 4 + 3 * 4


def test_header_reader_rejects_non_safetensors(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(CheckpointError, match="not plausible"):
        read_safetensors_header(p)
    p.write_bytes(struct.pack("<Q", 5) + b"{no}")
    with pytest.raises(CheckpointError, match="file ends"):
        read_safetensors_header(p)
    p.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(CheckpointError, match="not JSON"):
        read_safetensors_header(p)
    p.write_bytes(b"abc")
    with pytest.raises(CheckpointError, match="8-byte"):
        read_safetensors_header(p)


def test_unknown_dtype_is_named(tmp_path):
    raw = json.dumps({"w": {"dtype": "Q3", "shape": [1], "data_offsets": [0, 1]}}).encode()
    p = tmp_path / "m.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(CheckpointError, match="'Q3'"):
        read_safetensors_header(p)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="config.json: not found"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path)


def test_qwen38_shape_from_config(qwen38):
    s = qwen38.shape
    assert (s.num_full_attention_layers, s.num_linear_attention_layers) == (16, 48)
    assert [i for i, t in enumerate(s.layer_types) if t == "full_attention"] == list(range(3, 64, 4))
    assert (s.num_kv_heads, s.head_dim, s.mtp_num_hidden_layers, s.mamba_ssm_dtype) == (4, 256, 1, "float32")


def test_layer_types_derived_from_interval_when_absent():
    cfg = {"num_hidden_layers": 8, "full_attention_interval": 4, "num_attention_heads": 4, "hidden_size": 64,
           "intermediate_size": 128, "vocab_size": 10, "max_position_embeddings": 64, "linear_num_key_heads": 1,
           "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
           "linear_conv_kernel_dim": 4}
    s = model_shape_from_config(cfg)
    assert s.layer_types == (("linear_attention",) * 3 + ("full_attention",)) * 2
    assert s.head_dim == 16 and s.num_kv_heads == 4
    bad = dict(cfg)
    del bad["linear_conv_kernel_dim"]
    with pytest.raises(CheckpointError, match="'linear_conv_kernel_dim' is missing"):
        model_shape_from_config(bad)
    with pytest.raises(CheckpointError, match="sliding_attention"):
        model_shape_from_config({**cfg, "layer_types": ["sliding_attention"] * 8})


def test_drafter_attention_from_config():
    d = drafter_attention_from_config({"num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
                                       "hidden_size": 4096}, "drafter")
    assert (d.num_layers, d.num_kv_heads, d.head_dim) == (5, 8, 128)


def test_drafter_attention_from_a_speculators_config():
    """The published DFlash2 drafter's layout: the decoder shape sits under transformer_layer_config."""
    d = drafter_attention_from_config({"speculators_model_type": "dflash2", "transformer_layer_config": {
        "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 5120,
        "head_dim": 128}}, "drafter")
    assert (d.num_layers, d.num_kv_heads, d.head_dim) == (5, 8, 128)


def test_qwen38_weights_by_part(qwen38):
    w = qwen38.weights(2)
    # Vision tower of the fixture config: ~0.86 GiB in bf16 per the architecture notes.
    assert 0.8 < w.vision / 2**30 < 0.9
    # The MTP head is one bf16 decoder layer plus fc (10240 -> 5120) and norms.
    assert w.mtp > 5120 * 10240 * 2
    assert w.body > 2 * 248320 * 5120 * 2  # at least embed_tokens + lm_head in bf16
