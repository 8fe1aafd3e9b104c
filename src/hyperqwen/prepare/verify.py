"""Check a checkpoint directory before it is published (and on demand): tensors, tokenizer, config."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from hyperqwen.prepare.checkpoint import (
    INDEX_NAME,
    LM_HEAD_TARGET,
    OUR_GROUP,
    CheckpointFiles,
    open_checkpoint,
)
from hyperqwen.prepare.errors import PrepareCheckpointError

THINK_TOKEN = "<think>"


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    tensors: int
    quantized_modules: int
    think_ids: tuple[int, ...]


def check_tokenizer(directory: Path, model_vocab: int | None = None) -> tuple[int, ...]:
    """Load tokenizer.json the way vLLM's fast tokenizer does and encode `<think>`.

    Without tokenizer.json a Qwen checkpoint can silently end up with a 1-token vocabulary and the server
    dies far from the cause, so a missing file is an error here.
    """
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise PrepareCheckpointError(
            f"{path} is missing: without it the tokenizer degrades to a tiny vocabulary",
            fix="the checkpoint is incomplete; run prepare again (or copy tokenizer.json into MODEL_SOURCE_DIR)",
        )
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure means an unusable tokenizer
        raise PrepareCheckpointError(
            f"{path} does not load as a tokenizer ({exc})", fix="delete it and run prepare again"
        ) from None
    ids = tuple(tokenizer.encode(THINK_TOKEN, add_special_tokens=False).ids)
    if not ids:
        raise PrepareCheckpointError(
            f"{path}: encoding {THINK_TOKEN!r} gave no token ids",
            fix="the tokenizer is broken; use the checkpoint's original tokenizer.json",
        )
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab <= 1:
        raise PrepareCheckpointError(
            f"{path}: only {vocab} token(s) in the vocabulary", fix="use the checkpoint's tokenizer.json"
        )
    if model_vocab is not None and max(ids) >= model_vocab:
        raise PrepareCheckpointError(
            f"{path}: {THINK_TOKEN!r} encodes to id {max(ids)}, outside the model's vocab_size {model_vocab}",
            fix="the tokenizer belongs to another model; use the checkpoint's own",
        )
    return ids


def _group_args(qc: dict, module: str) -> dict | None:
    """The weights args of the first config group whose targets name this module (vLLM's matching order:
    explicit names/regexes first, then the class name `Linear`)."""
    groups = (qc or {}).get("config_groups") or {}
    for entry in qc.get("ignore") or []:
        if entry == module or (entry.startswith("re:") and re.match(entry[3:], module)):
            return None
    for group in groups.values():
        for target in group.get("targets") or []:
            if target == module or (target.startswith("re:") and re.match(target[3:], module)):
                return group.get("weights")
    # The class-name target: vLLM matches it against linear layer classes (…Linear); the output head
    # (ParallelLMHead) and embeddings are not linear layers there, so `Linear` never covers them.
    if module.endswith(("lm_head", "embed_tokens")):
        return None
    for group in groups.values():
        if "Linear" in (group.get("targets") or []):
            return group.get("weights")
    return None


def check_quantized_modules(ckpt: CheckpointFiles) -> int:
    qc = ckpt.config.get("quantization_config") or {}
    modules = sorted(n[: -len(".weight_packed")] for n in ckpt.weight_map if n.endswith(".weight_packed"))
    if modules and not qc:
        raise PrepareCheckpointError(
            f"{ckpt.directory}/config.json has no quantization_config but "
            f"{len(modules)} modules are packed (e.g. {modules[0]})"
        )
    # Every module our group names must be quantized in the tensors, and vice versa for the whole config.
    ours = ((qc.get("config_groups") or {}).get(OUR_GROUP) or {}).get("targets") or []
    for target in ours:
        module = "lm_head" if target == LM_HEAD_TARGET else target
        if f"{module}.weight_packed" not in ckpt.weight_map:
            raise PrepareCheckpointError(
                f"quantization_config group {OUR_GROUP} targets {target!r} but the checkpoint has "
                f"no {module}.weight_packed",
                fix="run prepare again to rebuild the model",
            )
        if f"{module}.weight" in ckpt.weight_map:
            raise PrepareCheckpointError(f"{module} has both a plain weight and weight_packed")
    for module in modules:
        args = _group_args(qc, module)
        if args is None:
            raise PrepareCheckpointError(
                f"{module} is packed but quantization_config does not target it (or ignores it)",
                fix="run prepare again to rebuild config.json",
            )
        bits, group_size = int(args["num_bits"]), args.get("group_size") or 0
        packed = ckpt.tensor(f"{module}.weight_packed")
        scale = ckpt.tensor(f"{module}.weight_scale")
        shape_name = f"{module}.weight_shape"
        if shape_name not in ckpt.weight_map:
            raise PrepareCheckpointError(f"{module}: weight_shape is missing")
        rows = packed.shape[0]
        cols = packed.shape[1] * 32 // bits
        if packed.dtype != "I32":
            raise PrepareCheckpointError(f"{module}.weight_packed is {packed.dtype}, compressed-tensors packs into I32")
        expected_groups = cols // group_size if group_size and group_size > 0 else 1
        if scale.shape != (rows, expected_groups):
            raise PrepareCheckpointError(
                f"{module}.weight_scale has shape {list(scale.shape)}, expected [{rows}, {expected_groups}] "
                f"for {bits}-bit group {group_size} with weight_packed {list(packed.shape)}"
            )
    return len(modules)


def check_shapes_against_config(ckpt: CheckpointFiles) -> None:
    text = ckpt.text_config
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    for name in ("lm_head", "model.language_model.embed_tokens"):
        if f"{name}.weight" in ckpt.weight_map:
            shape = ckpt.tensor(f"{name}.weight").shape
            rows, cols = shape[0], shape[1]
        elif f"{name}.weight_packed" in ckpt.weight_map:
            rows = ckpt.tensor(f"{name}.weight_packed").shape[0]
            cols = None
        else:
            continue
        if vocab is not None and rows != vocab:
            raise PrepareCheckpointError(f"{name} has {rows} rows but config vocab_size is {vocab}")
        if cols is not None and hidden is not None and cols != hidden:
            raise PrepareCheckpointError(f"{name} has {cols} columns but config hidden_size is {hidden}")
    mtp_layers = int(text.get("mtp_num_hidden_layers") or 0)
    if mtp_layers and not any(n.startswith("mtp.") for n in ckpt.weight_map):
        raise PrepareCheckpointError(
            f"config.json says mtp_num_hidden_layers={mtp_layers} but there are no mtp.* tensors",
            fix="the MTP head is missing; use the full checkpoint",
        )


def check_index_against_shards(ckpt: CheckpointFiles) -> int:
    """Every tensor the index names is in its shard, and each shard holds only indexed tensors."""
    count = 0
    for shard, header in ckpt.headers.items():
        named = {n for n, s in ckpt.weight_map.items() if s == shard}
        present = set(header.tensors)
        if named - present:
            missing = sorted(named - present)
            raise PrepareCheckpointError(
                f"{INDEX_NAME} names {len(missing)} tensors missing from {shard}, e.g. {missing[0]}",
                fix="run prepare again to rebuild the model",
            )
        if present - named:
            extra = sorted(present - named)
            raise PrepareCheckpointError(f"{shard} holds {len(extra)} tensors the index does not name, e.g. {extra[0]}")
        count += len(named)
    return count


def check_with_safetensors(ckpt: CheckpointFiles) -> None:
    """Re-open every shard with the safetensors library: independent of our own header parser."""
    from safetensors import safe_open

    for shard, header in ckpt.headers.items():
        try:
            with safe_open(str(ckpt.directory / shard), framework="numpy") as handle:
                keys = set(handle.keys())
                if keys != set(header.tensors):
                    raise PrepareCheckpointError(
                        f"{shard}: safetensors sees {len(keys)} tensors, the header parser {len(header.tensors)}"
                    )
                for name, info in header.tensors.items():
                    piece = handle.get_slice(name)
                    if piece.get_dtype() != info.dtype or tuple(piece.get_shape()) != info.shape:
                        raise PrepareCheckpointError(
                            f"{shard}: {name} is {piece.get_dtype()}{piece.get_shape()}, expected "
                            f"{info.dtype}{list(info.shape)}"
                        )
        except PrepareCheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's own parse errors
            raise PrepareCheckpointError(
                f"{ckpt.directory / shard}: safetensors cannot open it ({exc})",
                fix="run prepare again to rebuild the model",
            ) from None


def verify_checkpoint(
    directory: Path, expected_dtypes: dict[str, tuple[str, tuple[int, ...]]] | None = None
) -> VerifyReport:
    """Everything a server start needs from the files; raises PrepareCheckpointError naming the first problem.

    expected_dtypes: tensor name -> (dtype, shape) that must match exactly (prepare passes its step list).
    """
    ckpt = open_checkpoint(directory)
    count = check_index_against_shards(ckpt)
    if expected_dtypes is not None:
        names = set(ckpt.weight_map)
        if names != set(expected_dtypes):
            diff = sorted(names ^ set(expected_dtypes))
            raise PrepareCheckpointError(f"{directory}: tensor set differs from the step list, e.g. {diff[0]}")
        for name, (dtype, shape) in expected_dtypes.items():
            info = ckpt.tensor(name)
            if (info.dtype, info.shape) != (dtype, shape):
                raise PrepareCheckpointError(f"{name} is {info.dtype}{list(info.shape)}, expected {dtype}{list(shape)}")
    check_with_safetensors(ckpt)
    quantized = check_quantized_modules(ckpt)
    check_shapes_against_config(ckpt)
    from hyperqwen.prepare.draft_vocab import check_draft_vocab

    check_draft_vocab(ckpt)
    ids = check_tokenizer(directory, ckpt.text_config.get("vocab_size"))
    return VerifyReport(count, quantized, ids)
