"""Tensor parallel (TP=2, 4, ...): what one rank holds, and which TP sizes this model accepts.

vLLM 0.32.0's per-rank arithmetic for a Qwen3.5-family hybrid model, as plain integers (paths relative to
site-packages/vllm/):
- full attention: query heads per rank = heads / TP (must divide: config/model.py
  ModelConfig.verify_with_parallel_config); KV heads per rank = max(1, kv_heads // TP), split when
  kv_heads >= TP (must divide), else replicated (TP must be a multiple of kv_heads)
  (model_executor/models/qwen3_next.py Qwen3NextAttention.__init__). The KV page per token per layer
  therefore shrinks by min(TP, kv_heads).
- GDN state: conv_dim / TP and num_v_heads / TP (model_executor/layers/mamba/mamba_utils.py
  MambaStateShapeCalculator.gated_delta_net_state_shape, `divide` asserts divisibility), so key heads and
  value heads must both divide by TP.
- weights: every linear layer, conv1d, A_log/dt_bias, embed_tokens and lm_head (VocabParallelEmbedding,
  vocab padded to a multiple of 64 first) are split across ranks; the RMSNorm weights are replicated.
- a quantized down_proj/o_proj (row parallel) splits its input dimension: each rank's share must be a whole
  number of quantization groups (GPTQ/AutoRound group_size).

How the planner uses this (a separate module so the planner's owner wires it in): plan one rank with
`rank_checkpoint(checkpoint, tp)` in place of the checkpoint, against ONE card's GpuFacts. vLLM sizes every
rank's pool from that rank's free memory and uses the smallest block count of all ranks, so the per-rank
plan of the tightest card is the plan. Each rank also holds NCCL buffers: the NCCL_BUFFERS term below.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from hyperqwen.config.settings import Problem, Settings
from hyperqwen.memory.checkpoint import Checkpoint, ModelShape, TensorInfo

MiB = 1024**2
# vLLM pads the vocabulary to a multiple of 64 before splitting it (layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64
# Estimate, not measured here: NCCL's communicator buffers and vLLM's custom all-reduce workspace per rank
# (NCCL_BUFFSIZE defaults to 4 MiB per channel and peer; the custom all-reduce buffer is 8 MiB; PCIe cards
# without P2P fall back to NCCL). Measure: nvidia-smi per-process memory of a TP=2 server vs a TP=1 one.
NCCL_BUFFERS = 256 * MiB
# Names of the tensors vLLM keeps whole on every rank: the RMSNorm weights (input_layernorm,
# post_attention_layernorm, q_norm, k_norm, the GDN gated norm, the final norm, the MTP norms).
_REPLICATED_SUFFIXES = ("norm.weight",)


@dataclass(frozen=True)
class Heads:
    """The head counts TP splits, read from the checkpoint's config (text_config for Qwen3.5)."""

    num_attention_heads: int
    num_kv_heads: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    intermediate_size: int
    quant_group_size: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> Heads:
        text = config.get("text_config") or config
        assert isinstance(text, Mapping)
        heads = int(text["num_attention_heads"])  # type: ignore[call-overload]
        quant = config.get("quantization_config") or {}
        group = quant.get("group_size") if isinstance(quant, Mapping) else None
        return cls(
            num_attention_heads=heads,
            num_kv_heads=int(text.get("num_key_value_heads", heads)),  # type: ignore[call-overload]
            linear_num_key_heads=int(text.get("linear_num_key_heads", 0)),  # type: ignore[call-overload]
            linear_num_value_heads=int(text.get("linear_num_value_heads", 0)),  # type: ignore[call-overload]
            intermediate_size=int(text["intermediate_size"]),  # type: ignore[call-overload]
            quant_group_size=int(group) if group else None,
        )


def load_heads(model_dir: Path) -> tuple[Heads, str]:
    """Heads from model_dir/config.json; before prepare has run, from the planner's bundled config."""
    path = Path(model_dir) / "config.json"
    if path.is_file():
        return Heads.from_config(json.loads(path.read_text())), str(path)
    import gzip

    from hyperqwen.memory.bundled import BUNDLE

    return Heads.from_config(json.loads(gzip.decompress(BUNDLE.read_bytes()))["config"]), f"{BUNDLE.name} (bundled)"


def tp_problems(heads: Heads, tp: int, where: str = "config.json") -> list[str]:
    """Why vLLM would refuse TP=tp for this model (empty: it accepts it). Each message names TP and the field."""
    if tp < 1:
        return [f"TP={tp}: the tensor parallel size must be 1 or more"]
    if tp == 1:
        return []
    out = []

    def need(count: int, field: str) -> None:
        if count % tp:
            out.append(f"TP={tp} does not divide {field}={count} ({where}); vLLM asserts it does")

    need(heads.num_attention_heads, "num_attention_heads")
    if heads.num_kv_heads >= tp:
        need(heads.num_kv_heads, "num_key_value_heads")
    elif tp % heads.num_kv_heads:
        out.append(
            f"TP={tp} is larger than num_key_value_heads={heads.num_kv_heads} ({where}) and not a multiple "
            "of it, so the KV heads cannot be replicated evenly"
        )
    if heads.linear_num_key_heads:
        need(heads.linear_num_key_heads, "linear_num_key_heads")
    if heads.linear_num_value_heads:
        need(heads.linear_num_value_heads, "linear_num_value_heads")
    need(heads.intermediate_size, "intermediate_size")
    group = heads.quant_group_size
    if group and heads.intermediate_size % tp == 0 and (heads.intermediate_size // tp) % group:
        out.append(
            f"TP={tp}: each rank's share of intermediate_size={heads.intermediate_size} is "
            f"{heads.intermediate_size // tp}, not a whole number of quantization groups of {group}"
        )
    return out


def valid_tp_sizes(heads: Heads, largest: int = 8) -> list[int]:
    return [tp for tp in range(1, largest + 1) if not tp_problems(heads, tp)]


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """Qwen3NextAttention: max(1, total_num_kv_heads // tp_size)."""
    return max(1, num_kv_heads // tp)


def rank_shape(shape: ModelShape, tp: int) -> ModelShape:
    """The model as one rank sees it: per-rank KV heads, GDN heads and MLP width (hidden size and vocab stay:
    activations between layers and the gathered logits are whole on every rank)."""
    return replace(
        shape,
        num_kv_heads=kv_heads_per_rank(shape.num_kv_heads, tp),
        linear_num_key_heads=shape.linear_num_key_heads // tp,
        linear_num_value_heads=shape.linear_num_value_heads // tp,
        intermediate_size=shape.intermediate_size // tp,
    )


def _split(t: TensorInfo, tp: int) -> TensorInfo:
    if t.name.endswith(_REPLICATED_SUFFIXES) or not t.shape:
        return t
    shape = list(t.shape)
    if (
        t.name.endswith(("embed_tokens.weight", "lm_head.weight", "embed_tokens.weight_scale", "lm_head.weight_scale"))
        or "embed_tokens." in t.name
        or "lm_head." in t.name
    ):
        shape[0] = -(-shape[0] // VOCAB_PADDING) * VOCAB_PADDING
    # Split the first dimension TP divides (column-parallel splits outputs, row-parallel inputs; the bytes are
    # the same either way); a dimension no split fits is rounded up, as vLLM pads the last shard.
    for i, dim in enumerate(shape):
        if dim % tp == 0:
            shape[i] = dim // tp
            break
    else:
        shape[0] = -(-shape[0] // tp)
    return replace(t, shape=tuple(shape))


def rank_tensors(tensors: Iterable[TensorInfo], tp: int) -> tuple[TensorInfo, ...]:
    return tuple(_split(t, tp) for t in tensors) if tp > 1 else tuple(tensors)


def rank_checkpoint(checkpoint: Checkpoint, tp: int) -> Checkpoint:
    """What one of TP ranks holds, as a Checkpoint the planner can plan against one card."""
    if tp == 1:
        return checkpoint
    return Checkpoint(rank_shape(checkpoint.shape, tp), rank_tensors(checkpoint.tensors, tp))


def check_tp(settings: Settings) -> list[Problem]:
    """TP must divide the model's heads (read from MODEL's config.json, else the planner's bundled config)."""
    tp = int(settings.knobs.tp)
    if tp == 1:
        return []
    heads, where = load_heads(settings.model_path)
    return [Problem("error", message, "TP") for message in tp_problems(heads, tp, where)]
