"""What is in a checkpoint directory, which tensors prepare requantizes, and the quantization config it writes."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from hyperqwen.prepare.errors import PrepareCheckpointError
from hyperqwen.prepare.quantize import module_of, weight_scheme
from hyperqwen.prepare.safetensors_io import FLOAT_DTYPES, SafetensorsHeader, TensorInfo, read_shard_header

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# The architectures vLLM 0.32.0 serves with qwen3_5.py (and whose MTP head qwen3_5_mtp.py loads).
SUPPORTED_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM")
SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
OUR_GROUP = "hyperqwen_int8_g128"

# The MTP module's linear layers, in checkpoint naming (vLLM fuses q/k/v and gate/up when loading).
MTP_LINEAR = re.compile(r"^mtp\.(fc|layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj))\.weight$")
LM_HEAD = "lm_head.weight"
# vLLM names the main model's head `language_model.lm_head` and the drafter's `lm_head`; a path target
# without a dot is not remapped, so one anchored regex covers both (and transformers' `lm_head`).
LM_HEAD_TARGET = r"re:^(.*\.)?lm_head$"
EMBED = re.compile(r"^(model\.language_model\.|model\.)embed_tokens\.weight$")


@dataclasses.dataclass
class CheckpointFiles:
    directory: Path
    config: dict[str, Any]
    weight_map: dict[str, str]  # tensor name -> shard file name
    headers: dict[str, SafetensorsHeader]  # shard file name -> parsed header
    has_index: bool

    @property
    def text_config(self) -> dict[str, Any]:
        return self.config.get("text_config") or self.config

    def tensor(self, name: str) -> TensorInfo:
        return self.headers[self.weight_map[name]].tensors[name]


# What to do about a damaged file, by where it lies (a message must not say "run prepare again" about a folder
# prepare never writes).
FIX_LOCAL = "fix or replace that file in MODEL_SOURCE_DIR (prepare only reads that folder), or unset MODEL_SOURCE_DIR"
FIX_DOWNLOAD = (
    "run prepare again: it checks every downloaded file against the hub's size and sha256 and fetches "
    "a missing or damaged one again"
)
FIX_OUTPUT = "run prepare again to rebuild the model"


def load_json(path: Path, what: str, fix: str = FIX_OUTPUT) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PrepareCheckpointError(f"{path} is missing ({what})", fix=fix) from None
    except (OSError, ValueError) as exc:
        raise PrepareCheckpointError(f"{path} is not valid JSON ({exc})", fix=fix) from None
    if not isinstance(data, dict):
        raise PrepareCheckpointError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def check_architecture(config: dict[str, Any], path: Path) -> None:
    archs = config.get("architectures") or []
    model_type = config.get("model_type")
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs) or model_type not in SUPPORTED_MODEL_TYPES:
        raise PrepareCheckpointError(
            f"{path}: architecture {archs or '(none)'} / model_type {model_type!r} is not Qwen3.5 "
            f"(expected one of {list(SUPPORTED_ARCHITECTURES)}, model_type {list(SUPPORTED_MODEL_TYPES)})",
            fix="set MODEL_REPO (or MODEL_SOURCE_DIR) to a Qwen3.8-27B checkpoint, e.g. the default "
            "dbirks/Qwen3.8-27B-W4A16-AutoRound",
            knob="MODEL_REPO",
        )


def open_checkpoint(directory: Path, fix: str = FIX_OUTPUT) -> CheckpointFiles:
    """Config, index and every shard's header; `fix` goes into the message about a missing or damaged file."""
    config = load_json(directory / "config.json", "the model config", fix)
    check_architecture(config, directory / "config.json")
    index_path = directory / INDEX_NAME
    if index_path.is_file():
        index = load_json(index_path, "the shard index", fix)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise PrepareCheckpointError(f"{index_path}: no weight_map (the index is corrupt)", fix=fix)
        has_index = True
    elif (directory / SINGLE_NAME).is_file():
        weight_map = None
        has_index = False
    else:
        raise PrepareCheckpointError(f"{directory}: neither {INDEX_NAME} nor {SINGLE_NAME} found (no weights)", fix=fix)
    shard_names = sorted(set(weight_map.values())) if weight_map else [SINGLE_NAME]
    headers = {}
    for shard in shard_names:
        path = directory / shard
        if not path.is_file():
            raise PrepareCheckpointError(f"{path} is missing (named by {INDEX_NAME})", fix=fix)
        headers[shard] = read_shard_header(path, fix)
    if weight_map is None:
        weight_map = {name: SINGLE_NAME for name in headers[SINGLE_NAME].tensors}
    return CheckpointFiles(directory, config, dict(weight_map), headers, has_index)


@dataclasses.dataclass(frozen=True)
class Targets:
    """Weight tensor names to requantize, by reason."""

    lm_head: tuple[str, ...]
    mtp: tuple[str, ...]
    embed: tuple[str, ...]
    already_quantized: tuple[str, ...]  # modules that already have weight_packed (left as they are)

    @property
    def all(self) -> tuple[str, ...]:
        return self.lm_head + self.mtp + self.embed


def _float_2d(ckpt: CheckpointFiles, name: str) -> bool:
    info = ckpt.tensor(name)
    return info.dtype in FLOAT_DTYPES and len(info.shape) == 2


def find_targets(ckpt: CheckpointFiles, quantize_embed: bool) -> Targets:
    names = ckpt.weight_map
    already = sorted(n[: -len(".weight_packed")] for n in names if n.endswith(".weight_packed"))
    lm_head = (LM_HEAD,) if LM_HEAD in names and _float_2d(ckpt, LM_HEAD) else ()
    if not lm_head and "lm_head" not in already and not ckpt.text_config.get("tie_word_embeddings", False):
        raise PrepareCheckpointError(
            f"{ckpt.directory}: no lm_head.weight although tie_word_embeddings is false",
            fix="the checkpoint is incomplete or of another layout; use the default MODEL_REPO",
        )
    mtp = tuple(sorted(n for n in names if MTP_LINEAR.match(n) and _float_2d(ckpt, n)))
    embed = tuple(sorted(n for n in names if quantize_embed and EMBED.match(n) and _float_2d(ckpt, n)))
    return Targets(lm_head, mtp, embed, tuple(already))


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern == name


def _target_for(module: str) -> str:
    return LM_HEAD_TARGET if module == "lm_head" else module


def updated_quantization_config(config: dict[str, Any], targets: Targets) -> dict[str, Any] | None:
    """The config's quantization_config with our int8 group added and our modules un-ignored.

    Returns None when nothing is quantized and the source had no quantization config.
    """
    original = config.get("quantization_config")
    modules = [module_of(n) for n in targets.all]
    if original is None:
        if not modules:
            return None
        qc: dict[str, Any] = {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {},
            "ignore": [],
            "kv_cache_scheme": None,
        }
    else:
        if original.get("quant_method") != "compressed-tensors":
            raise PrepareCheckpointError(
                f"quantization_config.quant_method is {original.get('quant_method')!r}; prepare writes "
                "compressed-tensors entries and can only merge them into a compressed-tensors checkpoint",
                fix="use the default MODEL_REPO (a compressed-tensors W4A16 build)",
                knob="MODEL_REPO",
            )
        qc = copy.deepcopy(original)
    if not modules:
        return qc
    ignore = list(qc.get("ignore") or [])
    kept = []
    for entry in ignore:
        hits = [m for m in modules if _matches(entry, m)]
        if not hits:
            kept.append(entry)
        elif entry.startswith("re:"):
            raise PrepareCheckpointError(
                f"quantization_config.ignore has the pattern {entry!r}, which also covers {hits[0]!r} that prepare "
                "quantizes; it cannot tell which other modules the pattern is meant for",
                fix="use a checkpoint whose ignore list names modules one by one (like the default MODEL_REPO)",
            )
    qc["ignore"] = kept
    groups = qc.setdefault("config_groups", {})
    group = groups.get(OUR_GROUP) or {
        "targets": [],
        "weights": weight_scheme(),
        "input_activations": None,
        "output_activations": None,
        "format": "pack-quantized",
    }
    group["targets"] = sorted(set(group["targets"]) | {_target_for(m) for m in modules})
    groups[OUR_GROUP] = group
    return qc
