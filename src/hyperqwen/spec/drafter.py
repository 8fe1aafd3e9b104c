"""Check a DFlash/DFlash2 drafter checkpoint against the target model before vLLM starts.

Why: vLLM 0.32.0 builds the drafter from its config and only then finds that it does not fit the target (a
shape error deep in weight loading, or a device-side assert at the first verify step on a GPU). A drafter
for another model, a truncated download, or DRAFT pointing at the wrong folder should instead stop
`hyperqwen serve` with one message that names the drafter path and the mismatch.

Formats (as vLLM 0.32.0 reads them):
- speculators format: `speculators_model_type` "dflash2" (or "dflash"), the decoder shape under
  `transformer_layer_config`, `aux_hidden_state_layer_ids` (1-based target layers whose hidden states the
  drafter reads), `speculators_config.verifier` (the target it was trained for). vLLM maps "dflash2" to
  method "dflash" (`transformers_utils/configs/speculators/base.py`, `build_vllm_speculative_config`) and to
  architecture `DFlash2DraftModel` (`algos.py`, `update_dflash2`), which the registry serves as
  `DFlash2Qwen3ForCausalLM` (`model_executor/models/registry.py` -> `qwen3_dflash2.py`).
- Hugging Face format: `architectures` ["DFlash2DraftModel"] or ["DFlashDraftModel"] with `hidden_size`,
  `vocab_size`, optional `target_hidden_size`, and `dflash_config.target_layer_ids` (0-based).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The public W4A16 DFlash2 drafter for Qwen3.8-27B that the 3090 reference publishes and pins
# (github.com/syv-ai/qwen38-27b-rtx3090: README "shipped as syvai/Qwen3.8-27B-DFlash2-W4A16", ~1.19 GB;
# prepare/fetch_dflash2.py: REVISION = "4d30ec73..."). The weight file's size and SHA-256 and the config's
# SHA-256 are what public deployments of that revision recorded; they were not re-downloaded here (no
# network on the build machine), so prepare must verify them on the first real fetch.
DFLASH2_DRAFTER_REPO = "syvai/Qwen3.8-27B-DFlash2-W4A16"
DFLASH2_DRAFTER_REVISION = "4d30ec736ffc6b8688dc2ae2b502d9b48bdec279"
DFLASH2_DRAFTER_WEIGHTS = {
    "model.safetensors": (1_280_633_960, "ec26996e6a0745ab5edb857117220ce1e219ad524f71e6e149b703804947d8e7"),
}
DFLASH2_DRAFTER_CONFIG_SHA256 = "61d6276fe8d76295232cb02d26cbb0d29c25565911f50441e779c88c9220c556"

DFLASH_ARCHITECTURES = {"DFlash2DraftModel": "dflash2", "DFlashDraftModel": "dflash"}
SPECULATORS_TYPES = {"dflash2": "dflash2", "dflash": "dflash"}


class DrafterError(ValueError):
    """The drafter cannot serve this target; the message names the drafter path and the mismatch."""


@dataclass(frozen=True)
class DrafterInfo:
    path: Path
    kind: str  # "dflash2" or "dflash"
    layout: str  # "speculators" or "hf"
    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]  # 0-based target layers the drafter reads
    verifier: str | None  # the target the drafter names, if it names one
    verifier_architectures: tuple[str, ...] = ()  # the architectures of that target, if the drafter names them

    @property
    def vllm_method(self) -> str:
        """vLLM's speculative method for this drafter: both DFlash and DFlash2 run as "dflash"."""
        return "dflash"

    @property
    def vllm_architecture(self) -> str:
        return "DFlash2Qwen3ForCausalLM" if self.kind == "dflash2" else "DFlashQwen3ForCausalLM"


@dataclass(frozen=True)
class TargetShape:
    path: Path
    architectures: tuple[str, ...]
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int


def _read_config(folder: Path, what: str, knob: str) -> dict[str, Any]:
    config = folder / "config.json"
    if not folder.is_dir():
        raise DrafterError(
            f"{what} {folder} ({knob}) does not exist; run `hyperqwen prepare` or point {knob} at the checkpoint folder"
        )
    try:
        data = json.loads(config.read_text())
    except FileNotFoundError:
        raise DrafterError(
            f"{what} {folder} ({knob}) has no config.json: not a checkpoint folder "
            "(an interrupted download?); run `hyperqwen prepare` again"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise DrafterError(f"{what} {config} ({knob}) cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DrafterError(f"{what} {config} ({knob}) is not a JSON object")
    return data


def _int(data: dict[str, Any], key: str, where: Path) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DrafterError(f"drafter {where}: config field {key!r} is {value!r}, expected a positive integer")
    return value


def target_shape(target_dir: Path) -> TargetShape:
    """The target's hidden size, vocabulary and depth (text_config for the multimodal checkpoint)."""
    data = _read_config(target_dir, "target model", "MODEL")
    nested = data.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else data
    try:
        return TargetShape(
            path=target_dir,
            architectures=tuple(data.get("architectures") or ()),
            hidden_size=int(text["hidden_size"]),
            vocab_size=int(text["vocab_size"]),
            num_hidden_layers=int(text["num_hidden_layers"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DrafterError(f"target model {target_dir} (MODEL): config.json lacks {exc}") from None


def read_drafter(drafter_dir: Path) -> DrafterInfo:
    """Parse a DFlash/DFlash2 drafter config in either format; any other checkpoint is an error."""
    data = _read_config(drafter_dir, "drafter", "DRAFT")
    if "speculators_model_type" in data:
        kind = SPECULATORS_TYPES.get(str(data["speculators_model_type"]))
        if kind is None:
            raise DrafterError(
                f"drafter {drafter_dir} (DRAFT) is a speculators {data['speculators_model_type']!r} checkpoint; "
                f"SPEC=dflash2 needs one of {sorted(SPECULATORS_TYPES)}"
            )
        layer = data.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise DrafterError(f"drafter {drafter_dir}: speculators config has no transformer_layer_config")
        aux = data.get("aux_hidden_state_layer_ids")
        if not isinstance(aux, list) or not aux or not all(isinstance(i, int) for i in aux):
            raise DrafterError(
                f"drafter {drafter_dir}: aux_hidden_state_layer_ids is {aux!r}, expected a list of target layer numbers"
            )
        verifier = data.get("speculators_config", {}).get("verifier", {})
        hidden = _int(layer, "hidden_size", drafter_dir)
        target_hidden = data.get("target_hidden_size") or layer.get("target_hidden_size") or hidden
        return DrafterInfo(
            path=drafter_dir,
            kind=kind,
            layout="speculators",
            hidden_size=hidden,
            target_hidden_size=int(target_hidden),
            vocab_size=_int(layer, "vocab_size", drafter_dir),
            # vLLM converts the speculators ids (1-based) with i - 1 (algos.py, update_dflash).
            target_layer_ids=tuple(i - 1 for i in aux),
            verifier=(verifier.get("name_or_path") if isinstance(verifier, dict) else None),
            verifier_architectures=tuple(
                str(a) for a in ((verifier.get("architectures") if isinstance(verifier, dict) else None) or ())
            ),
        )
    architectures = data.get("architectures") or []
    kinds = [DFLASH_ARCHITECTURES[a] for a in architectures if a in DFLASH_ARCHITECTURES]
    if not kinds:
        raise DrafterError(
            f"drafter {drafter_dir} (DRAFT) has architectures {architectures!r}: not a DFlash/DFlash2 drafter "
            f"(expected {sorted(DFLASH_ARCHITECTURES)} or a speculators 'dflash2' config). SPEC=mtp uses the "
            "model's own MTP head and needs no DRAFT"
        )
    hidden = _int(data, "hidden_size", drafter_dir)
    nested = data.get("dflash_config")
    dflash: dict[str, Any] = nested if isinstance(nested, dict) else {}
    ids = dflash.get("target_layer_ids") or []
    return DrafterInfo(
        path=drafter_dir,
        kind=kinds[0],
        layout="hf",
        hidden_size=hidden,
        target_hidden_size=int(data.get("target_hidden_size") or hidden),
        vocab_size=_int(data, "vocab_size", drafter_dir),
        target_layer_ids=tuple(int(i) for i in ids),
        verifier=None,
    )


def _weights_present(drafter_dir: Path) -> bool:
    return (drafter_dir / "model.safetensors").is_file() or (drafter_dir / "model.safetensors.index.json").is_file()


def _tensor_names(drafter_dir: Path) -> set[str] | None:
    """The drafter's tensor names (safetensors headers or the index), or None when they cannot be read."""
    from hyperqwen.formats.safetensors import SafetensorsError, read_header

    index = drafter_dir / "model.safetensors.index.json"
    try:
        if index.is_file():
            return set(json.loads(index.read_text()).get("weight_map", {}))
        return set(read_header(drafter_dir / "model.safetensors", check_data=False).tensors)
    except (OSError, ValueError, SafetensorsError):
        return None


def _family(architecture: str) -> str:
    """Qwen3_5ForConditionalGeneration and Qwen3_5ForCausalLM are one family (the same language model)."""
    for suffix in ("ForConditionalGeneration", "ForCausalLM", "Model"):
        if architecture.endswith(suffix):
            return architecture[: -len(suffix)]
    return architecture


def check_drafter(drafter_dir: Path, target_dir: Path) -> DrafterInfo:
    """Raise DrafterError naming the drafter path and the first mismatch with the target; else the drafter."""
    drafter_dir, target_dir = Path(drafter_dir), Path(target_dir)
    info = read_drafter(drafter_dir)
    if not _weights_present(drafter_dir):
        raise DrafterError(
            f"drafter {drafter_dir} (DRAFT) has a config.json but no model.safetensors: an "
            "interrupted download? run `hyperqwen prepare` again"
        )
    target = target_shape(target_dir)
    if info.target_hidden_size != target.hidden_size:
        raise DrafterError(
            f"drafter {drafter_dir} (DRAFT) reads target hidden states of size {info.target_hidden_size}, but the "
            f"target {target_dir} (MODEL) has hidden_size {target.hidden_size}: the drafter was built for another "
            "model; use the drafter made for this one (prepare fetches it) or SPEC=mtp"
        )
    if info.vocab_size != target.vocab_size:
        raise DrafterError(
            f"drafter {drafter_dir} (DRAFT) has vocab_size {info.vocab_size}, the target {target_dir} (MODEL) "
            f"{target.vocab_size}: their tokens would not mean the same thing; use the drafter made for this model"
        )
    bad = [i for i in info.target_layer_ids if not 0 <= i < target.num_hidden_layers]
    if bad:
        raise DrafterError(
            f"drafter {drafter_dir} (DRAFT) reads target layers {list(info.target_layer_ids)} (0-based), but the "
            f"target {target_dir} (MODEL) has {target.num_hidden_layers} layers (bad: {bad}): built for another model"
        )
    trained_for = {_family(a) for a in info.verifier_architectures}
    if trained_for and target.architectures and not trained_for & {_family(a) for a in target.architectures}:
        raise DrafterError(
            f"drafter {drafter_dir} (DRAFT) was trained for a {'/'.join(info.verifier_architectures)} target "
            f"({info.verifier or 'speculators_config.verifier'}), but the target {target_dir} (MODEL) is "
            f"{'/'.join(target.architectures)}: use the drafter made for this model"
        )
    # Without its own embedding and lm_head the drafter runs on the target's (vLLM's proposer shares them);
    # when the widths differ vLLM silently keeps a separate, never-loaded embedding instead
    # (llm_base_proposer.py, "Keeping separate embedding weights"): drafts would be garbage, never an error.
    names = _tensor_names(drafter_dir)
    if names is not None and info.hidden_size != target.hidden_size:
        shared = [part for part in ("embed_tokens", "lm_head") if not any(part in n for n in names)]
        if shared:
            raise DrafterError(
                f"drafter {drafter_dir} (DRAFT) has hidden_size {info.hidden_size} and no {'/'.join(shared)} of its "
                f"own, so it would run on the target's, whose hidden_size is {target.hidden_size} "
                f"({target_dir}, MODEL): built for another model; use the drafter made for this one"
            )
    return info
