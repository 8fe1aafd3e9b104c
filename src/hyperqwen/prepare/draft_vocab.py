"""A draft vocabulary for the MTP drafter (patch 0007): the N most used token ids and their lm_head rows.

Contract with patch 0007 (patches/LEDGER.md): the text config (`text_config`, or the top level of a text-only
config: vLLM reads `hf_text_config`) carries `mtp_draft_vocab_size: N`; the checkpoint carries
`mtp.draft_lm_head.weight` [N, hidden] (the lm_head rows of those ids; quantized exactly like lm_head, its
quantization target being `mtp.draft_lm_head`) and `mtp.d2t` [N] int64 with target id = k + d2t[k]
(the EAGLE-3 convention of vLLM's llama_eagle3.py).

Which ids: counted over a corpus we ship (prepare/draft-vocab-corpus/) tokenized with the model's own
tokenizer.json, or from a counts file written by `hyperqwen draft-vocab-recount` (the model's own outputs
through a running server; knob DRAFT_VOCAB_IDS). Ties break by the corpus count, then by the lower id; the
ids the config names as eos/bos/pad are always included. Rows are read one id at a time and written in
blocks, so memory stays bounded whatever N and hidden are.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from hyperqwen.commands import add_command
from hyperqwen.exit_codes import Exit
from hyperqwen.prepare.errors import PrepareCheckpointError, PrepareError

log = logging.getLogger("hyperqwen.prepare")

CONFIG_KEY = "mtp_draft_vocab_size"
HEAD_MODULE = "mtp.draft_lm_head"
D2T = "mtp.d2t"
DRAFT_FILE = "model-hyperqwen-draft-vocab.safetensors"
COUNTS_FORMAT = "hyperqwen-draft-vocab-counts"
COUNTS_VERSION = 1
CORPUS_README = "README.md"
ROW_BLOCK_BYTES = 32 << 20


def default_corpus_dir() -> Path:
    """prepare/draft-vocab-corpus/ of the repository this package is installed from (editable install or a
    copy of the repo in the image); HYPERQWEN_DRAFT_VOCAB_CORPUS overrides it."""
    override = os.environ.get("HYPERQWEN_DRAFT_VOCAB_CORPUS")
    if override:
        return Path(override)
    packaged = Path(__file__).resolve().parent / "_draft_vocab_corpus"  # the wheel's copy (pyproject force-include)
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "prepare" / "draft-vocab-corpus"


# --- counting ----------------------------------------------------------------------------------------------


def corpus_files(corpus_dir: Path) -> list[Path]:
    if not corpus_dir.is_dir():
        raise PrepareError(
            f"the draft-vocabulary corpus {corpus_dir} is missing (needed because DRAFT_VOCAB > 0)",
            fix="ship prepare/draft-vocab-corpus/ with the package, set DRAFT_VOCAB_IDS to a counts "
            "file, or set DRAFT_VOCAB=0",
            knob="DRAFT_VOCAB",
        )
    files = sorted(p for p in corpus_dir.rglob("*") if p.is_file() and p.name != CORPUS_README)
    if not files:
        raise PrepareError(
            f"the draft-vocabulary corpus {corpus_dir} has no files",
            knob="DRAFT_VOCAB",
            fix="restore prepare/draft-vocab-corpus/ or set DRAFT_VOCAB=0",
        )
    return files


def corpus_digest(corpus_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in corpus_files(corpus_dir):
        digest.update(path.relative_to(corpus_dir).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def load_tokenizer(tokenizer_path: Path):
    from tokenizers import Tokenizer

    if not tokenizer_path.is_file():
        raise PrepareCheckpointError(
            f"{tokenizer_path} is missing; the draft vocabulary is counted with the model's own tokenizer",
            fix="use the complete checkpoint (it ships tokenizer.json)",
        )
    return Tokenizer.from_file(str(tokenizer_path))


def count_ids(id_lists: Iterable[Iterable[int]], vocab: int, what: str) -> np.ndarray:
    counts = np.zeros(vocab, dtype=np.int64)
    for ids in id_lists:
        arr = np.asarray(list(ids), dtype=np.int64)
        if arr.size == 0:
            continue
        if arr.min() < 0 or arr.max() >= vocab:
            bad = int(arr[(arr < 0) | (arr >= vocab)][0])
            raise PrepareCheckpointError(
                f"{what}: token id {bad} is outside the model's vocab_size {vocab}",
                fix="the tokenizer or counts belong to another model; use this model's own",
            )
        counts += np.bincount(arr, minlength=vocab)
    return counts


def count_corpus(tokenizer_path: Path, corpus_dir: Path, vocab: int) -> np.ndarray:
    """Token-id counts [vocab] over every corpus file, encoded without special tokens."""
    tokenizer = load_tokenizer(tokenizer_path)
    texts = [p.read_text(encoding="utf-8") for p in corpus_files(corpus_dir)]
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    return count_ids((e.ids for e in encodings), vocab, f"corpus {corpus_dir} tokenized with {tokenizer_path}")


def read_counts_file(path: Path, vocab: int) -> np.ndarray:
    """Counts from a DRAFT_VOCAB_IDS file: {"format": ..., "counts": {"<id>": count, ...}}."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PrepareError(
            f"DRAFT_VOCAB_IDS={str(path)!r} does not exist",
            knob="DRAFT_VOCAB_IDS",
            fix="write it with `hyperqwen draft-vocab-recount --out ...`, or unset DRAFT_VOCAB_IDS "
            "to count the shipped corpus",
        ) from None
    except (OSError, ValueError) as exc:
        raise PrepareError(
            f"DRAFT_VOCAB_IDS={str(path)!r} is not readable JSON ({exc})",
            knob="DRAFT_VOCAB_IDS",
            fix="write it again with `hyperqwen draft-vocab-recount`",
        ) from None
    counts = data.get("counts") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("format") != COUNTS_FORMAT or not isinstance(counts, dict) or not counts:
        raise PrepareError(
            f"DRAFT_VOCAB_IDS={str(path)!r} is not a {COUNTS_FORMAT} file with non-empty counts",
            knob="DRAFT_VOCAB_IDS",
            fix="write it with `hyperqwen draft-vocab-recount --out ...`",
        )
    out = np.zeros(vocab, dtype=np.int64)
    for key, value in counts.items():
        try:
            token, count = int(key), int(value)
        except (TypeError, ValueError):
            raise PrepareError(
                f"DRAFT_VOCAB_IDS={str(path)!r}: entry {key!r}: {value!r} is not id: count",
                knob="DRAFT_VOCAB_IDS",
                fix="write it again with `hyperqwen draft-vocab-recount`",
            ) from None
        if not 0 <= token < vocab or count < 0:
            raise PrepareError(
                f"DRAFT_VOCAB_IDS={str(path)!r}: id {token} (count {count}) is outside the model's "
                f"vocab_size {vocab} or negative",
                knob="DRAFT_VOCAB_IDS",
                fix="the counts were made with another model; recount against this model's server",
            )
        out[token] += count
    return out


def named_special_ids(config: dict[str, Any], directory: Path) -> set[int]:
    """eos/bos/pad ids named by config.json (top level and text_config) and generation_config.json."""
    sources = [config, config.get("text_config") or {}]
    generation = directory / "generation_config.json"
    if generation.is_file():
        try:
            sources.append(json.loads(generation.read_text()))
        except ValueError:
            pass  # verify reports a broken generation config elsewhere; it does not name ids then
    ids: set[int] = set()
    for source in sources:
        for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
            value = source.get(key) if isinstance(source, dict) else None
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                    ids.add(item)
    return ids


def choose_ids(counts: np.ndarray, n: int, forced: Iterable[int], tie_break: np.ndarray | None = None) -> np.ndarray:
    """The N ids to draft from, ascending: `forced` first, then by count, tie_break count, lower id."""
    vocab = counts.shape[0]
    forced = sorted({int(i) for i in forced if 0 <= int(i) < vocab})
    if not 0 < n < vocab:
        raise PrepareError(
            f"DRAFT_VOCAB={n} must be between 1 and vocab_size - 1 ({vocab - 1}) for this model",
            fix=f"use e.g. DRAFT_VOCAB={min(40960, vocab // 4) or 1}, or DRAFT_VOCAB=0 (off)",
            knob="DRAFT_VOCAB",
        )
    if len(forced) > n:
        raise PrepareError(
            f"DRAFT_VOCAB={n} is smaller than the {len(forced)} special ids the config names ({forced})",
            fix=f"use DRAFT_VOCAB >= {len(forced)}",
            knob="DRAFT_VOCAB",
        )
    secondary = np.zeros(vocab, np.int64) if tie_break is None else tie_break
    order = np.lexsort((np.arange(vocab), -secondary, -counts))  # last key is primary
    chosen = set(forced)
    for token in order:
        if len(chosen) == n:
            break
        chosen.add(int(token))
    return np.array(sorted(chosen), dtype=np.int64)


# --- choose and write --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DraftVocab:
    ids: np.ndarray  # int64, strictly increasing
    source: str  # "corpus" | "ids-file"
    coverage: float  # share of the counted tokens the ids cover
    head: Any  # TensorInfo of the float rows' source (lm_head, or embed_tokens when tied)
    head_path: Path
    quantized: bool  # int8 group-128 like the requantized lm_head, else the source dtype

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])

    @property
    def d2t(self) -> np.ndarray:
        return self.ids - np.arange(self.size, dtype=np.int64)

    @property
    def ids_sha256(self) -> str:
        return hashlib.sha256(self.ids.astype("<i8").tobytes()).hexdigest()

    def tensors(self):
        from hyperqwen.prepare.quantize import quantized_outputs
        from hyperqwen.prepare.safetensors_io import OutTensor, TensorInfo

        hidden = self.head.shape[1]
        if self.quantized:
            rows = TensorInfo(f"{HEAD_MODULE}.weight", self.head.dtype, (self.size, hidden), 0)
            head = quantized_outputs(rows)
        else:
            head = [OutTensor(f"{HEAD_MODULE}.weight", self.head.dtype, (self.size, hidden))]
        return [*head, OutTensor(D2T, "I64", (self.size,))]

    def manifest_entry(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "source": self.source,
            "ids_sha256": self.ids_sha256,
            "coverage": round(self.coverage, 6),
            "quantized": self.quantized,
            "rows_from": self.head.name,
        }


def choose_draft_vocab(ckpt, targets, options) -> DraftVocab:
    """Choose the ids for `options.draft_vocab` (> 0) from the source checkpoint `ckpt`."""
    from hyperqwen.prepare.checkpoint import EMBED, LM_HEAD
    from hyperqwen.prepare.safetensors_io import FLOAT_DTYPES

    text = ckpt.text_config
    vocab = int(text.get("vocab_size") or 0)
    if LM_HEAD in ckpt.weight_map:
        name, quantized = LM_HEAD, bool(targets.lm_head)
    else:
        embeds = [n for n in ckpt.weight_map if EMBED.match(n)]
        if not (text.get("tie_word_embeddings") and embeds):
            raise PrepareCheckpointError(
                f"{ckpt.directory}: no float lm_head.weight to take draft-vocabulary rows from",
                fix="use a checkpoint with a bf16 lm_head (the default MODEL_REPO), or DRAFT_VOCAB=0",
                knob="DRAFT_VOCAB",
            )
        name, quantized = embeds[0], bool(targets.embed)
    head = ckpt.tensor(name)
    if head.dtype not in FLOAT_DTYPES or len(head.shape) != 2 or head.shape[0] != vocab:
        raise PrepareCheckpointError(
            f"{name} is {head.dtype}{list(head.shape)}; the draft vocabulary needs float rows "
            f"[vocab_size={vocab}, hidden]",
            fix="use the default MODEL_REPO, or DRAFT_VOCAB=0",
            knob="DRAFT_VOCAB",
        )
    corpus = count_corpus(ckpt.directory / "tokenizer.json", options.draft_vocab_corpus or default_corpus_dir(), vocab)
    if options.draft_vocab_ids is not None:
        counts, tie_break, source = read_counts_file(options.draft_vocab_ids, vocab), corpus, "ids-file"
    else:
        counts, tie_break, source = corpus, None, "corpus"
    ids = choose_ids(counts, options.draft_vocab, named_special_ids(ckpt.config, ckpt.directory), tie_break)
    total = int(counts.sum())
    coverage = float(counts[ids].sum()) / total if total else 0.0
    log.info(
        "draft vocabulary: %d ids from the %s cover %.2f%% of its %d counted tokens",
        len(ids),
        source,
        coverage * 100,
        total,
    )
    return DraftVocab(ids, source, coverage, head, ckpt.directory / ckpt.weight_map[name], quantized)


def recipe_parts(draft: DraftVocab, options) -> list[Any]:
    from hyperqwen.prepare.quantize import weight_scheme

    stat = draft.head_path.stat()
    return [
        draft.head.name,
        str(draft.head_path.name),
        stat.st_size,
        stat.st_mtime_ns,
        draft.ids_sha256,
        draft.quantized and weight_scheme(),
        options.max_rel_error,
    ]


def write_draft_file(
    draft: DraftVocab, out, block_bytes: int = ROW_BLOCK_BYTES, on_block: Callable[[], None] | None = None
) -> None:
    """Write the tensors' data (after the header) through `out.write`, in `draft.tensors()` order."""
    from hyperqwen.prepare.quantize import FUSED_MIN_ELEMENTS, quantize_block
    from hyperqwen.prepare.safetensors_io import STORAGE_DTYPES, from_float_bits

    info = draft.head
    hidden = info.shape[1]
    storage = np.dtype(STORAGE_DTYPES[info.dtype])
    row_bytes = hidden * storage.itemsize
    step = max(1, block_bytes // (hidden * 4 * 6))
    scales = []
    with open(draft.head_path, "rb") as handle:
        for begin in range(0, draft.size, step):
            block_ids = draft.ids[begin : begin + step]
            raw = np.empty((len(block_ids), hidden), dtype=storage)
            view = memoryview(raw).cast("B")  # type: ignore[arg-type]
            for row, token in enumerate(block_ids):
                handle.seek(info.begin + int(token) * row_bytes)
                if handle.readinto(view[row * row_bytes : (row + 1) * row_bytes]) != row_bytes:
                    raise PrepareCheckpointError(
                        f"{info.name}: short read at row {int(token)}",
                        fix="the source shard is truncated; delete it and run prepare again",
                    )
            if draft.quantized:
                # Rows quantize independently (groups run along hidden), so these bytes equal the
                # requantized lm_head's rows for the same ids.
                # Same kernel choice as for the lm_head itself (numba and numpy give identical bytes).
                packed, stored, _, _ = quantize_block(
                    from_float_bits(raw.reshape(-1), info.dtype).reshape(raw.shape),
                    info.dtype,
                    info.numel >= FUSED_MIN_ELEMENTS,
                )
                out.write(memoryview(np.ascontiguousarray(packed)).cast("B"))  # type: ignore[arg-type]
                scales.append(stored)
            else:
                out.write(view)
            if on_block is not None:
                on_block()
    if draft.quantized:
        out.write(memoryview(np.ascontiguousarray(np.concatenate(scales, axis=0))).cast("B"))  # type: ignore[arg-type]
        out.write(memoryview(np.array([draft.size, hidden], dtype="<i8")).cast("B"))  # type: ignore[arg-type]
    out.write(memoryview(np.ascontiguousarray(draft.d2t.astype("<i8"))).cast("B"))  # type: ignore[arg-type]


def text_config_with_key(config: dict[str, Any], size: int) -> dict[str, Any]:
    """config with mtp_draft_vocab_size where vLLM's hf_text_config reads it."""
    config = dict(config)
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = {**config["text_config"], CONFIG_KEY: size}
    else:
        config[CONFIG_KEY] = size
    return config


# --- verify -------------------------------------------------------------------------------------------------


def check_draft_vocab(ckpt) -> int:
    """Config key and tensors agree: shape, dtype, ids in range and strictly increasing. Returns N (0 if off)."""
    text = ckpt.text_config
    size = text.get(CONFIG_KEY)
    present = [n for n in ckpt.weight_map if n == D2T or n.startswith(f"{HEAD_MODULE}.")]
    if size is None:
        if present:
            raise PrepareCheckpointError(
                f"{present[0]} is in the checkpoint but config.json has no {CONFIG_KEY}",
                fix="run prepare again to rebuild the model",
            )
        return 0
    vocab = int(text.get("vocab_size") or 0)
    hidden = int(text.get("hidden_size") or 0)
    if not isinstance(size, int) or not 0 < size < vocab:
        raise PrepareCheckpointError(
            f"config.json {CONFIG_KEY}={size!r} must be an integer in 1..{vocab - 1}",
            fix="run prepare again to rebuild the model",
        )
    if D2T not in ckpt.weight_map:
        raise PrepareCheckpointError(
            f"config.json sets {CONFIG_KEY}={size} but {D2T} is missing", fix="run prepare again to rebuild the model"
        )
    d2t_info = ckpt.tensor(D2T)
    if d2t_info.dtype != "I64" or d2t_info.shape != (size,):
        raise PrepareCheckpointError(f"{D2T} is {d2t_info.dtype}{list(d2t_info.shape)}, expected I64[{size}]")
    if f"{HEAD_MODULE}.weight_packed" in ckpt.weight_map:
        rows = ckpt.tensor(f"{HEAD_MODULE}.weight_packed").shape[0]
    elif f"{HEAD_MODULE}.weight" in ckpt.weight_map:
        info = ckpt.tensor(f"{HEAD_MODULE}.weight")
        if info.shape != (size, hidden):
            raise PrepareCheckpointError(f"{HEAD_MODULE}.weight is {list(info.shape)}, expected [{size}, {hidden}]")
        rows = size
    else:
        raise PrepareCheckpointError(
            f"config.json sets {CONFIG_KEY}={size} but {HEAD_MODULE}.weight is missing",
            fix="run prepare again to rebuild the model",
        )
    if rows != size:
        raise PrepareCheckpointError(f"{HEAD_MODULE} has {rows} rows, {CONFIG_KEY} is {size}")
    from safetensors import safe_open

    with safe_open(str(ckpt.directory / ckpt.weight_map[D2T]), framework="numpy") as handle:
        d2t = handle.get_tensor(D2T)
    ids = d2t + np.arange(size, dtype=np.int64)
    if ids[0] < 0 or ids[-1] >= vocab or (size > 1 and not bool(np.all(np.diff(ids) > 0))):
        raise PrepareCheckpointError(
            f"{D2T} maps to ids that are not strictly increasing inside 0..{vocab - 1} "
            f"(first {int(ids[0])}, last {int(ids[-1])})",
            fix="run prepare again to rebuild the model",
        )
    return size


# --- recount from the model's own outputs ---------------------------------------------------------------------

RECOUNT_PROMPTS = (
    "Explain how a refrigerator keeps food cold, for someone with no physics background.",
    "Write a Python function that merges two sorted lists, with a docstring and a short test.",
    "Summarise the causes and consequences of the printing press in Europe in five bullet points.",
    "A train leaves at 09:40 and arrives at 13:05. How long is the journey? Show your working.",
    "Write a short, friendly email asking a colleague to review a pull request by Friday.",
    "What is the difference between TCP and UDP? When would you use each?",
    "Write a bash script that finds the ten largest files under a directory.",
    "Translate into French and German: 'The meeting has been moved to Thursday afternoon.'",
    "Give me a three-day packing list for a rainy hiking trip.",
    "Write a haiku about autumn and then explain its imagery.",
    "Explain what a SQL LEFT JOIN does with a small example using two tables.",
    "Describe the water cycle in simple terms for a ten-year-old.",
    "Write a TypeScript interface for a blog post and a function that sorts posts by date.",
    "What are the pros and cons of working from home? Answer in a short table.",
    "Solve: if 3x + 7 = 25, what is x? Explain each step.",
    "Write a Rust function that counts word frequencies in a string.",
    "Suggest five names for a small bakery and say why each works.",
    "Explain recursion with an example in JavaScript.",
    "Write a short story opening (about 150 words) set in a lighthouse during a storm.",
    "How do I resolve a merge conflict in git? Give the commands.",
    "¿Cuáles son los beneficios de caminar todos los días? Responde en español.",
    "用中文简单介绍一下光合作用。",
    "Explain the difference between a process and a thread.",
    "Write a JSON schema for a user profile with name, email and an optional list of tags.",
)


def _post_json(url: str, body: dict[str, Any], api_key: str, timeout: float) -> dict[str, Any]:
    from hyperqwen.formats.http import HttpError, post

    try:
        response = post(url, body, api_key=api_key or None, timeout=timeout)
    except HttpError as exc:
        raise PrepareError(
            f"cannot reach {url} ({exc.reason})", fix="start the server (hyperqwen serve) and check --url"
        ) from None
    if not response.ok:
        raise PrepareError(
            f"{url} answered HTTP {response.status}: {response.brief(300)}",
            fix="check --url, --api-key-file and --model against the running server",
        )
    return response.json()


def _served_model(base: str, api_key: str, timeout: float) -> str:
    from hyperqwen.formats.http import HttpError, get

    try:
        response = get(f"{base}/v1/models", api_key=api_key or None, timeout=timeout)
        if not response.ok:
            raise ValueError(f"HTTP {response.status}: {response.brief()}")
        models = response.json().get("data") or []
    except (HttpError, ValueError, AttributeError) as exc:
        raise PrepareError(
            f"cannot list models at {base}/v1/models ({exc})", fix="check --url and --api-key-file, or pass --model"
        ) from None
    if not models:
        raise PrepareError(f"{base}/v1/models lists no model", fix="pass --model")
    return models[0]["id"]


def recount(
    base_url: str,
    api_key: str,
    *,
    prompts: int = len(RECOUNT_PROMPTS),
    max_tokens: int = 512,
    model: str | None = None,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Generate through the server (OpenAI chat API, `return_token_ids`) and count the generated token ids."""
    if not 0 < prompts <= len(RECOUNT_PROMPTS):
        raise PrepareError(
            f"--prompts {prompts} must be in 1..{len(RECOUNT_PROMPTS)}",
            fix=f"use --prompts {len(RECOUNT_PROMPTS)} (all built-in prompts)",
        )
    base = base_url.rstrip("/")
    model = model or _served_model(base, api_key, timeout)
    counts: dict[int, int] = {}
    generated = 0
    for prompt in RECOUNT_PROMPTS[:prompts]:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        }
        reply = _post_json(f"{base}/v1/chat/completions", body, api_key, timeout)
        for choice in reply.get("choices") or []:
            ids = choice.get("token_ids")
            if not isinstance(ids, list):
                raise PrepareError(
                    f"{base}/v1/chat/completions returned no token_ids (return_token_ids is a vLLM extension)",
                    fix="point --url at the hyperqwen vLLM server",
                )
            for token in ids:
                counts[int(token)] = counts.get(int(token), 0) + 1
            generated += len(ids)
    log.info("recount: %d prompts, %d generated tokens, %d distinct ids", prompts, generated, len(counts))
    return {
        "format": COUNTS_FORMAT,
        "version": COUNTS_VERSION,
        "model": model,
        "prompts": prompts,
        "max_tokens": max_tokens,
        "generated_tokens": generated,
        "counts": {str(k): counts[k] for k in sorted(counts)},
    }


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "draft-vocab-recount", func=run_recount, allow_abbrev=False)
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:18020")
    parser.add_argument("--api-key-file", type=Path, help="file holding the API key (never printed)")
    parser.add_argument("--out", type=Path, required=True, help="counts JSON to write (atomically)")
    parser.add_argument(
        "--prompts",
        type=int,
        default=len(RECOUNT_PROMPTS),
        help=f"how many built-in prompts to use (1..{len(RECOUNT_PROMPTS)}, default all)",
    )
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens generated per prompt (default 512)")
    parser.add_argument("--model", help="served model name (default: the first one /v1/models lists)")


def run_recount(args: argparse.Namespace) -> int:
    from hyperqwen.prepare.atomic import write_json_atomic

    logging.basicConfig(level=logging.INFO, format="draft-vocab-recount: %(message)s", stream=sys.stderr)
    try:
        api_key = ""
        if args.api_key_file is not None:
            try:
                api_key = args.api_key_file.read_text().strip()
            except OSError as exc:
                raise PrepareError(
                    f"--api-key-file {str(args.api_key_file)!r} cannot be read ({exc.strerror})",
                    fix="pass the file the server's key is in (MODELS_DIR/api_key.txt)",
                ) from None
        result = recount(args.url, api_key, prompts=args.prompts, max_tokens=args.max_tokens, model=args.model)
        write_json_atomic(args.out, result)
    except PrepareError as exc:
        log.error("%s", exc)
        return Exit.FAILED
    log.info(
        "wrote %s: %d distinct ids over %d tokens; use DRAFT_VOCAB_IDS=%s",
        args.out,
        len(result["counts"]),
        result["generated_tokens"],
        args.out,
    )
    return Exit.OK
