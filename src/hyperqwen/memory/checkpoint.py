"""What the planner needs to know about a checkpoint, read from its files.

Only `config.json` and the safetensors *headers* are read (8-byte little-endian length, then that many
bytes of JSON); tensor data is never touched, so this works on a 15 GB checkpoint in milliseconds and on
a directory that holds only headers (the test fixtures).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperqwen.formats.safetensors import DTYPE_SIZES, SafetensorsError, TensorInfo, read_header

# Bytes per element of the safetensors dtype codes (the one table, in formats/safetensors.py).
SAFETENSORS_DTYPE_BYTES: Mapping[str, int] = DTYPE_SIZES
FLOAT_CODES = frozenset({"F64", "F32", "F16", "BF16"})

# Parameters vLLM allocates in float32 whatever --dtype says (so they stay 4 bytes per element).
# Source: vllm 0.32.0 model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py (A_log, dtype=torch.float32).
FLOAT32_PARAM_SUFFIXES = (".A_log",)

DTYPE_BYTES: Mapping[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}


class CheckpointError(ValueError):
    """A checkpoint file is missing or malformed; the message names the file and field."""


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """Tensor names, dtypes and shapes from one .safetensors file, reading only its header (data may be absent:
    the planner's fixtures hold headers only)."""
    try:
        return list(read_header(path, check_data=False).tensors.values())
    except SafetensorsError as exc:
        raise CheckpointError(str(exc)) from None


def read_checkpoint_tensors(model_dir: Path) -> list[TensorInfo]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: no *.safetensors files; the planner needs them to size the weights")
    out: list[TensorInfo] = []
    for p in files:
        out.extend(read_safetensors_header(p))
    return out


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes by part, as vLLM holds them on the GPU."""

    body: int  # language model: embeddings, decoder layers, final norm, lm_head
    vision: int  # the vision tower (model.visual.*)
    mtp: int  # the MTP head (mtp.*), loaded only as the MTP drafter

    def resident(self, *, language_model_only: bool, with_mtp: bool) -> int:
        return self.body + (0 if language_model_only else self.vision) + (self.mtp if with_mtp else 0)


def classify_tensor(name: str) -> str:
    if name.startswith("mtp."):
        return "mtp"
    if name.startswith(("model.visual.", "visual.")) or ".visual." in name:
        return "vision"
    return "body"


def tensor_resident_bytes(t: TensorInfo, model_dtype_bytes: int) -> int:
    """Bytes vLLM holds for one checkpoint tensor.

    Quantized tensors (integer packs, their scales/zeros) are held as stored. Unquantized floating tensors
    are copied into parameters of the model dtype (--dtype), except the few vLLM keeps in float32.
    """
    if t.dtype in FLOAT_CODES and not t.name.endswith(FLOAT32_PARAM_SUFFIXES):
        return t.numel * model_dtype_bytes
    return t.stored_bytes


def weight_bytes(tensors: Iterable[TensorInfo], model_dtype_bytes: int) -> WeightBytes:
    parts = {"body": 0, "vision": 0, "mtp": 0}
    for t in tensors:
        parts[classify_tensor(t.name)] += tensor_resident_bytes(t, model_dtype_bytes)
    return WeightBytes(**parts)


@dataclass(frozen=True)
class ModelShape:
    """The text model's dimensions that memory depends on (from config.json, never hard-coded)."""

    model_type: str
    torch_dtype: str  # checkpoint dtype, what --dtype auto resolves to
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    layer_types: tuple[str, ...]  # "full_attention" | "linear_attention" per decoder layer
    num_kv_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    mamba_ssm_dtype: str | None  # config default for the GDN state (vLLM applies it for STATE_DTYPE=auto)
    mtp_num_hidden_layers: int

    @property
    def num_full_attention_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "full_attention")

    @property
    def num_linear_attention_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "linear_attention")


def _need(cfg: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in cfg:
        raise CheckpointError(f"{where}: field {key!r} is missing; the memory planner needs it")
    return cfg[key]


def model_shape_from_config(config: Mapping[str, Any], where: str = "config.json") -> ModelShape:
    text: Mapping[str, Any] = config.get("text_config") or config
    if not isinstance(text, Mapping):
        raise CheckpointError(f"{where}: text_config is not an object")
    tw = f"{where} (text_config)" if "text_config" in config else where
    n_layers = int(_need(text, "num_hidden_layers", tw))
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = int(_need(text, "full_attention_interval", tw))
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    layer_types = tuple(str(t) for t in layer_types)
    if len(layer_types) != n_layers:
        raise CheckpointError(f"{tw}: layer_types has {len(layer_types)} entries but num_hidden_layers is {n_layers}")
    unknown = sorted(set(layer_types) - {"full_attention", "linear_attention"})
    if unknown:
        raise CheckpointError(
            f"{tw}: layer_types holds {unknown}; the planner knows full_attention and "
            "linear_attention (Qwen3.5-family hybrid models)"
        )
    heads = int(_need(text, "num_attention_heads", tw))
    hidden = int(_need(text, "hidden_size", tw))
    dtype = str(
        text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    )
    return ModelShape(
        model_type=str(config.get("model_type", text.get("model_type", "?"))),
        torch_dtype=dtype,
        hidden_size=hidden,
        intermediate_size=int(_need(text, "intermediate_size", tw)),
        vocab_size=int(_need(text, "vocab_size", tw)),
        max_position_embeddings=int(_need(text, "max_position_embeddings", tw)),
        layer_types=layer_types,
        num_kv_heads=int(text.get("num_key_value_heads", heads)),
        head_dim=int(text.get("head_dim") or hidden // heads),
        linear_num_key_heads=int(_need(text, "linear_num_key_heads", tw)),
        linear_num_value_heads=int(_need(text, "linear_num_value_heads", tw)),
        linear_key_head_dim=int(_need(text, "linear_key_head_dim", tw)),
        linear_value_head_dim=int(_need(text, "linear_value_head_dim", tw)),
        linear_conv_kernel_dim=int(_need(text, "linear_conv_kernel_dim", tw)),
        mamba_ssm_dtype=(str(text["mamba_ssm_dtype"]) if text.get("mamba_ssm_dtype") else None),
        mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers", 0) or 0),
    )


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: not found; MODEL must point at a checkpoint directory") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from exc


@dataclass(frozen=True)
class Checkpoint:
    shape: ModelShape
    tensors: tuple[TensorInfo, ...]

    def weights(self, model_dtype_bytes: int) -> WeightBytes:
        return weight_bytes(self.tensors, model_dtype_bytes)

    def embedding_bytes(self, model_dtype_bytes: int) -> int:
        """Bytes of the language model's embed_tokens parameters (packed weight, scales) as vLLM holds them."""
        return sum(
            tensor_resident_bytes(t, model_dtype_bytes)
            for t in self.tensors
            if classify_tensor(t.name) == "body" and ".embed_tokens." in f".{t.name}"
        )


def load_checkpoint(model_dir: Path) -> Checkpoint:
    model_dir = Path(model_dir)
    return Checkpoint(
        model_shape_from_config(read_config(model_dir), str(model_dir / "config.json")),
        tuple(read_checkpoint_tensors(model_dir)),
    )


@dataclass(frozen=True)
class DrafterAttention:
    """The KV-cache layers a separate drafter model (DFlash) adds: its own full-attention layers."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def drafter_attention_from_config(config: Mapping[str, Any], where: str) -> DrafterAttention:
    # A speculators-format drafter (the published DFlash2 one) keeps its decoder shape under
    # transformer_layer_config (vLLM 0.32.0: transformers_utils/configs/speculators/base.py).
    text: Mapping[str, Any] = config.get("text_config") or config.get("transformer_layer_config") or config
    heads = int(_need(text, "num_attention_heads", where))
    return DrafterAttention(
        num_layers=int(_need(text, "num_hidden_layers", where)),
        num_kv_heads=int(text.get("num_key_value_heads", heads)),
        head_dim=int(text.get("head_dim") or int(_need(text, "hidden_size", where)) // heads),
    )
