"""A fake (header-only) Qwen3.8-27B W4A16 checkpoint: real safetensors headers, no tensor data.

The 27B weights cannot exist here; the planner reads only headers, so a header with the right names,
dtypes and shapes is a faithful stand-in. Shapes come from the config.json next to it; the quantization
layout is the assumption documented in docs/memory.md (decoder-layer linears int4 group-128 GPTQ-packed,
everything else bf16).

Regenerate the committed fixture with:
    python tests/unit/memory/fake_checkpoint.py tests/unit/memory/data/qwen3.8-27b-w4a16
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

DT_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I8": 1}


def linear(name: str, in_f: int, out_f: int, quant: bool, group: int = 128) -> list[tuple[str, str, list[int]]]:
    if not quant:
        return [(f"{name}.weight", "BF16", [out_f, in_f])]
    # GPTQ packing (auto_round:auto_gptq): 8 int4 per int32 along in_features.
    return [(f"{name}.qweight", "I32", [in_f // 8, out_f]),
            (f"{name}.qzeros", "I32", [in_f // group, out_f // 8]),
            (f"{name}.scales", "F16", [in_f // group, out_f])]


def attention_layer(p: str, t: dict, quant: bool) -> list:
    h, hd = t["hidden_size"], t["head_dim"]
    q_out = t["num_attention_heads"] * hd * (2 if t.get("attn_output_gate") else 1)
    kv_out = t["num_key_value_heads"] * hd
    out = linear(f"{p}.self_attn.q_proj", h, q_out, quant) + linear(f"{p}.self_attn.k_proj", h, kv_out, quant)
    out += linear(f"{p}.self_attn.v_proj", h, kv_out, quant)
    out += linear(f"{p}.self_attn.o_proj", t["num_attention_heads"] * hd, h, quant)
    out += [(f"{p}.self_attn.q_norm.weight", "BF16", [hd]), (f"{p}.self_attn.k_norm.weight", "BF16", [hd])]
    return out


def gdn_layer(p: str, t: dict, quant: bool) -> list:
    h = t["hidden_size"]
    key_dim = t["linear_num_key_heads"] * t["linear_key_head_dim"]
    value_dim = t["linear_num_value_heads"] * t["linear_value_head_dim"]
    nv = t["linear_num_value_heads"]
    conv_dim = 2 * key_dim + value_dim
    out = linear(f"{p}.linear_attn.in_proj_qkv", h, conv_dim, quant)
    out += linear(f"{p}.linear_attn.in_proj_z", h, value_dim, quant)
    out += linear(f"{p}.linear_attn.in_proj_b", h, nv, False) + linear(f"{p}.linear_attn.in_proj_a", h, nv, False)
    out += [(f"{p}.linear_attn.conv1d.weight", "BF16", [conv_dim, 1, t["linear_conv_kernel_dim"]]),
            (f"{p}.linear_attn.dt_bias", "BF16", [nv]), (f"{p}.linear_attn.A_log", "F32", [nv]),
            (f"{p}.linear_attn.norm.weight", "BF16", [t["linear_value_head_dim"]])]
    out += linear(f"{p}.linear_attn.out_proj", value_dim, h, quant)
    return out


def mlp_and_norms(p: str, t: dict, quant: bool) -> list:
    h, i = t["hidden_size"], t["intermediate_size"]
    return (linear(f"{p}.mlp.gate_proj", h, i, quant) + linear(f"{p}.mlp.up_proj", h, i, quant)
            + linear(f"{p}.mlp.down_proj", i, h, quant)
            + [(f"{p}.input_layernorm.weight", "BF16", [h]), (f"{p}.post_attention_layernorm.weight", "BF16", [h])])


def vision_tower(v: dict) -> list:
    h, i, d = v["hidden_size"], v["intermediate_size"], v["depth"]
    ps, tps, c = v["patch_size"], v["temporal_patch_size"], v["in_channels"]
    out = [("model.visual.patch_embed.proj.weight", "BF16", [h, c, tps, ps, ps]),
           ("model.visual.patch_embed.proj.bias", "BF16", [h]),
           ("model.visual.pos_embed.weight", "BF16", [v["num_position_embeddings"], h])]
    for b in range(d):
        p = f"model.visual.blocks.{b}"
        out += [(f"{p}.norm1.weight", "BF16", [h]), (f"{p}.norm1.bias", "BF16", [h]),
                (f"{p}.norm2.weight", "BF16", [h]), (f"{p}.norm2.bias", "BF16", [h]),
                (f"{p}.attn.qkv.weight", "BF16", [3 * h, h]), (f"{p}.attn.qkv.bias", "BF16", [3 * h]),
                (f"{p}.attn.proj.weight", "BF16", [h, h]), (f"{p}.attn.proj.bias", "BF16", [h]),
                (f"{p}.mlp.linear_fc1.weight", "BF16", [i, h]), (f"{p}.mlp.linear_fc1.bias", "BF16", [i]),
                (f"{p}.mlp.linear_fc2.weight", "BF16", [h, i]), (f"{p}.mlp.linear_fc2.bias", "BF16", [h])]
    merged = h * v["spatial_merge_size"] ** 2
    out += [("model.visual.merger.norm.weight", "BF16", [h]), ("model.visual.merger.norm.bias", "BF16", [h]),
            ("model.visual.merger.linear_fc1.weight", "BF16", [merged, merged]),
            ("model.visual.merger.linear_fc1.bias", "BF16", [merged]),
            ("model.visual.merger.linear_fc2.weight", "BF16", [v["out_hidden_size"], merged]),
            ("model.visual.merger.linear_fc2.bias", "BF16", [v["out_hidden_size"]])]
    return out


def qwen3_5_tensors(config: dict, quantized: bool = True) -> list[tuple[str, str, list[int]]]:
    t = config["text_config"]
    h, vocab = t["hidden_size"], t["vocab_size"]
    out = [("model.language_model.embed_tokens.weight", "BF16", [vocab, h]),
           ("model.language_model.norm.weight", "BF16", [h]), ("lm_head.weight", "BF16", [vocab, h])]
    for n, kind in enumerate(t["layer_types"]):
        p = f"model.language_model.layers.{n}"
        out += attention_layer(p, t, quantized) if kind == "full_attention" else gdn_layer(p, t, quantized)
        out += mlp_and_norms(p, t, quantized)
    for n in range(t.get("mtp_num_hidden_layers", 0)):
        p = f"mtp.layers.{n}"
        out += attention_layer(p, t, False) + mlp_and_norms(p, t, False)
    if t.get("mtp_num_hidden_layers", 0):
        out += [("mtp.fc.weight", "BF16", [h, 2 * h]), ("mtp.norm.weight", "BF16", [h]),
                ("mtp.pre_fc_norm_hidden.weight", "BF16", [h]), ("mtp.pre_fc_norm_embedding.weight", "BF16", [h])]
    if "vision_config" in config:
        out += vision_tower(config["vision_config"])
    return out


# What `hyperqwen prepare` requantizes to int8 group-128 (compressed-tensors pack-quantized: four int8 per
# int32 along in_features, one bf16 scale per 128 inputs): lm_head, embed_tokens and the MTP linears.
def is_requantized_by_prepare(name: str, shape: list[int]) -> bool:
    return len(shape) == 2 and (name in ("lm_head.weight", "model.language_model.embed_tokens.weight", "mtp.fc.weight")
                                or (name.startswith("mtp.layers.") and name.endswith("proj.weight")))


def as_prepared(tensors: list[tuple[str, str, list[int]]]) -> list[tuple[str, str, list[int]]]:
    out = []
    for name, dtype, shape in tensors:
        if dtype == "BF16" and is_requantized_by_prepare(name, shape):
            rows, cols = shape
            base = name.removesuffix(".weight")
            out += [(f"{base}.weight_packed", "I32", [rows, cols // 4]),
                    (f"{base}.weight_scale", "BF16", [rows, cols // 128])]
        else:
            out.append((name, dtype, shape))
    return out


def write_header_only(path: Path, tensors: list[tuple[str, str, list[int]]]) -> None:
    """A safetensors header (with correct data_offsets) and no data: what the planner reads."""
    header: dict = {"__metadata__": {"format": "pt", "note": "header-only fake for hyperqwen memory tests"}}
    offset = 0
    for name, dtype, shape in tensors:
        n = DT_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def make_fake_checkpoint(model_dir: Path, quantized: bool = True, prepared: bool = False) -> Path:
    """prepared: the layout after `hyperqwen prepare` (int8 g128 lm_head, embed_tokens and MTP linears)."""
    config = json.loads((model_dir / "config.json").read_text())
    tensors = qwen3_5_tensors(config, quantized)
    write_header_only(model_dir / "model.safetensors", as_prepared(tensors) if prepared else tensors)
    return model_dir


if __name__ == "__main__":
    make_fake_checkpoint(Path(sys.argv[1]), prepared="--prepared" in sys.argv[2:])
