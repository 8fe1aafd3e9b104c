"""Synthetic checkpoints shaped like Qwen3.8-27B's W4A16 AutoRound build, for tests and the prepare benchmark
(`PYTHONPATH=tests python -m support.prepare_bench`; importable as `support.synthetic_checkpoint`).

Same tensor names and layouts as the real checkpoint (see vLLM 0.32.0 qwen3_5.py / qwen3_5_mtp.py):
model.language_model.* (Gated DeltaNet + full-attention layers, W4A16 pack-quantized linears),
an untied bf16 lm_head, a bf16 MTP head (mtp.fc, mtp.layers.0.*, norms), a bf16 vision tower, and a
compressed-tensors quantization_config whose ignore list names the unquantized linears. Values are
seeded random numbers: good for layout, streaming and error-bound checks, meaningless as a model.
Tensors are written a row block at a time, so a multi-GB checkpoint costs little memory to make.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

import numpy as np

from hyperqwen.prepare.safetensors_io import OutTensor, build_header, f32_to_bf16_bits

W4_GROUP = 128


@dataclasses.dataclass(frozen=True)
class SyntheticShape:
    hidden: int = 256
    intermediate: int = 512
    layers: int = 4  # every 4th is full attention, as in the real model
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 128
    linear_k_heads: int = 2
    linear_v_heads: int = 4
    linear_head_dim: int = 128
    vocab: int = 1024
    vision_hidden: int = 128
    shards: int = 3
    seed: int = 0


FULL = SyntheticShape(
    hidden=5120,
    intermediate=17408,
    layers=64,
    heads=24,
    kv_heads=4,
    head_dim=256,
    linear_k_heads=16,
    linear_v_heads=48,
    vocab=248320,
    vision_hidden=1152,
)


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str = "normal"  # normal | ones | packed4 | scale4 | shape
    value: tuple[int, ...] = ()  # for kind "shape": the [out, in] it records


def _w4(module: str, out_features: int, in_features: int) -> list[Spec]:
    return [
        Spec(f"{module}.weight_packed", "I32", (out_features, in_features // 8), "packed4"),
        Spec(f"{module}.weight_scale", "BF16", (out_features, in_features // W4_GROUP), "scale4"),
        Spec(f"{module}.weight_shape", "I64", (2,), "shape", (out_features, in_features)),
    ]


def _bf16(module: str, *shape: int) -> Spec:
    return Spec(f"{module}.weight", "BF16", tuple(shape))


def layer_types(shape: SyntheticShape) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(shape.layers)]


def _attention(prefix: str, s: SyntheticShape, quantized: bool) -> list[Spec]:
    q_out = s.heads * s.head_dim * 2  # attn_output_gate doubles q_proj
    kv_out = s.kv_heads * s.head_dim
    dims = {
        "q_proj": (q_out, s.hidden),
        "k_proj": (kv_out, s.hidden),
        "v_proj": (kv_out, s.hidden),
        "o_proj": (s.hidden, s.heads * s.head_dim),
    }
    specs = []
    for proj, (o, i) in dims.items():
        specs += _w4(f"{prefix}.self_attn.{proj}", o, i) if quantized else [_bf16(f"{prefix}.self_attn.{proj}", o, i)]
    specs += [
        Spec(f"{prefix}.self_attn.q_norm.weight", "BF16", (s.head_dim,), "ones"),
        Spec(f"{prefix}.self_attn.k_norm.weight", "BF16", (s.head_dim,), "ones"),
    ]
    return specs


def _mlp(prefix: str, s: SyntheticShape, quantized: bool) -> list[Spec]:
    dims = {
        "gate_proj": (s.intermediate, s.hidden),
        "up_proj": (s.intermediate, s.hidden),
        "down_proj": (s.hidden, s.intermediate),
    }
    specs = []
    for proj, (o, i) in dims.items():
        specs += _w4(f"{prefix}.mlp.{proj}", o, i) if quantized else [_bf16(f"{prefix}.mlp.{proj}", o, i)]
    return specs


def _norms(prefix: str, s: SyntheticShape) -> list[Spec]:
    return [
        Spec(f"{prefix}.input_layernorm.weight", "BF16", (s.hidden,), "ones"),
        Spec(f"{prefix}.post_attention_layernorm.weight", "BF16", (s.hidden,), "ones"),
    ]


def tensor_specs(s: SyntheticShape) -> tuple[list[list[Spec]], list[str]]:
    """Tensors grouped per shard, and the module names the W4A16 config ignores."""
    lm = "model.language_model"
    ignore: list[str] = []
    body: list[Spec] = [_bf16(f"{lm}.embed_tokens", s.vocab, s.hidden)]
    key_dim = s.linear_k_heads * s.linear_head_dim
    value_dim = s.linear_v_heads * s.linear_head_dim
    for i, kind in enumerate(layer_types(s)):
        p = f"{lm}.layers.{i}"
        body += _norms(p, s)
        if kind == "linear_attention":
            body += _w4(f"{p}.linear_attn.in_proj_qkv", 2 * key_dim + value_dim, s.hidden)
            body += _w4(f"{p}.linear_attn.in_proj_z", value_dim, s.hidden)
            body += [
                _bf16(f"{p}.linear_attn.in_proj_b", s.linear_v_heads, s.hidden),
                _bf16(f"{p}.linear_attn.in_proj_a", s.linear_v_heads, s.hidden),
                Spec(f"{p}.linear_attn.conv1d.weight", "BF16", (2 * key_dim + value_dim, 1, 4)),
                Spec(f"{p}.linear_attn.A_log", "F32", (s.linear_v_heads,)),
                Spec(f"{p}.linear_attn.dt_bias", "BF16", (s.linear_v_heads,), "ones"),
                Spec(f"{p}.linear_attn.norm.weight", "F32", (s.linear_head_dim,), "ones"),
            ]
            body += _w4(f"{p}.linear_attn.out_proj", s.hidden, value_dim)
            ignore += [f"{p}.linear_attn.in_proj_b", f"{p}.linear_attn.in_proj_a"]
        else:
            body += _attention(p, s, quantized=True)
        body += _mlp(p, s, quantized=True)
    body.append(Spec(f"{lm}.norm.weight", "BF16", (s.hidden,), "ones"))
    vision: list[Spec] = []
    v = "model.visual"
    vision += [Spec(f"{v}.patch_embed.proj.weight", "BF16", (s.vision_hidden, 3, 2, 16, 16))]
    for b in range(2):
        vp = f"{v}.blocks.{b}"
        vision += [
            _bf16(f"{vp}.attn.qkv", 3 * s.vision_hidden, s.vision_hidden),
            Spec(f"{vp}.attn.qkv.bias", "BF16", (3 * s.vision_hidden,)),
            _bf16(f"{vp}.attn.proj", s.vision_hidden, s.vision_hidden),
            _bf16(f"{vp}.mlp.linear_fc1", 4 * s.vision_hidden, s.vision_hidden),
            _bf16(f"{vp}.mlp.linear_fc2", s.vision_hidden, 4 * s.vision_hidden),
            Spec(f"{vp}.norm1.weight", "BF16", (s.vision_hidden,), "ones"),
            Spec(f"{vp}.norm2.weight", "BF16", (s.vision_hidden,), "ones"),
        ]
        ignore += [f"{vp}.attn.qkv", f"{vp}.attn.proj", f"{vp}.mlp.linear_fc1", f"{vp}.mlp.linear_fc2"]
    vision += [
        _bf16(f"{v}.merger.linear_fc1", 4 * s.vision_hidden, 4 * s.vision_hidden),
        _bf16(f"{v}.merger.linear_fc2", s.hidden, 4 * s.vision_hidden),
    ]
    ignore += [f"{v}.merger.linear_fc1", f"{v}.merger.linear_fc2"]
    head = [_bf16("lm_head", s.vocab, s.hidden)]
    ignore.append("lm_head")
    mtp = [_bf16("mtp.fc", s.hidden, 2 * s.hidden)]
    mtp += _norms("mtp.layers.0", s) + _attention("mtp.layers.0", s, quantized=False) + _mlp("mtp.layers.0", s, False)
    mtp += [
        Spec(f"mtp.{n}.weight", "BF16", (s.hidden,), "ones")
        for n in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding")
    ]
    ignore += [
        sp.name[: -len(".weight")] for sp in mtp if sp.name.endswith("_proj.weight") or sp.name == "mtp.fc.weight"
    ]
    # Split like the real checkpoint: body across shards, then the vision tower + lm_head, then MTP.
    if s.shards <= 1:
        return [body + vision + head + mtp], ignore
    per = max(1, len(body) // max(1, s.shards - 2)) if s.shards > 2 else len(body)
    shards = [body[i : i + per] for i in range(0, len(body), per)][: max(1, s.shards - 2)]
    covered = sum(len(x) for x in shards)
    shards[-1] += body[covered:]
    if s.shards == 2:
        shards[-1] += vision + head
        shards.append(mtp)
    else:
        shards.append(vision + head)
        shards.append(mtp)
    return shards, ignore


def _values(spec: Spec, rows: slice, rng: np.random.Generator) -> np.ndarray:
    shape = (rows.stop - rows.start, *spec.shape[1:])
    if spec.kind == "ones":
        values = np.ones(shape, np.float32)
    elif spec.kind == "scale4":
        values = rng.uniform(0.001, 0.004, shape).astype(np.float32)
    elif spec.kind == "packed4":
        return rng.integers(-(2**31), 2**31, shape, dtype=np.int64).astype("<i4")
    else:
        values = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    if spec.dtype == "BF16":
        return f32_to_bf16_bits(values)
    return values.astype("<f4")


def _write_shard(path: Path, specs: list[Spec], shape: SyntheticShape, block_bytes: int = 32 << 20) -> None:
    header = build_header([OutTensor(s.name, s.dtype, s.shape) for s in specs], {"format": "pt"})
    with open(path, "wb") as out:
        out.write(header)
        for spec in specs:
            rng = np.random.default_rng([shape.seed, zlib.crc32(spec.name.encode())])
            if spec.kind == "shape":
                out.write(np.array(spec.value, "<i8").tobytes())
                continue
            rows = spec.shape[0]
            row_elems = int(np.prod(spec.shape[1:])) if len(spec.shape) > 1 else 1
            step = max(1, block_bytes // (row_elems * 8))
            for begin in range(0, rows, step):
                out.write(_values(spec, slice(begin, min(rows, begin + step)), rng).tobytes())


def config_for(s: SyntheticShape, ignore: list[str]) -> dict:
    w4 = {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": W4_GROUP,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
        "observer_kwargs": {},
        "block_structure": None,
    }
    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "layer_types": layer_types(s),
        "full_attention_interval": 4,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "attn_output_gate": True,
        "linear_num_key_heads": s.linear_k_heads,
        "linear_num_value_heads": s.linear_v_heads,
        "linear_key_head_dim": s.linear_head_dim,
        "linear_value_head_dim": s.linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "vocab_size": s.vocab,
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "dtype": "bfloat16",
        "eos_token_id": 3,
        "pad_token_id": 3,
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {
            "model_type": "qwen3_5",
            "hidden_size": s.vision_hidden,
            "depth": 2,
            "out_hidden_size": s.hidden,
            "deepstack_visual_indexes": [],
        },
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": w4,
                    "input_activations": None,
                    "output_activations": None,
                    "format": "pack-quantized",
                }
            },
            "ignore": ignore,
            "kv_cache_scheme": None,
            "sparsity_config": {},
            "transform_config": {},
            "version": "0.12.2",
        },
    }


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A small word-level tokenizer with Qwen's special tokens (<think> etc.) as added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    words = [f"w{i}" for i in range(min(vocab_size, 512) - len(specials) - 1)]
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
            indent=2,
        )
        + "\n"
    )


def write_synthetic_checkpoint(
    directory: Path, shape: SyntheticShape = SyntheticShape(), with_tokenizer: bool = True
) -> dict[str, list[str]]:
    """Write the checkpoint; returns shard file name -> tensor names."""
    directory.mkdir(parents=True, exist_ok=True)
    shards, ignore = tensor_specs(shape)
    total = len(shards)
    layout: dict[str, list[str]] = {}
    weight_map: dict[str, str] = {}
    total_size = 0
    for i, specs in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{total:05d}.safetensors"
        _write_shard(directory / name, specs, shape)
        layout[name] = [s.name for s in specs]
        for s in specs:
            weight_map[s.name] = name
            total_size += OutTensor(s.name, s.dtype, s.shape).nbytes
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}, indent=2)
        + "\n"
    )
    (directory / "config.json").write_text(json.dumps(config_for(shape, ignore), indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [3], "do_sample": False}) + "\n")
    if with_tokenizer:
        write_tokenizer(directory, shape.vocab)
    return layout
