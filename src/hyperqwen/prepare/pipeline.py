"""prepare: source -> requantize -> verify -> manifest -> publish, crash-safe and resumable.

Layout next to the output directory D (same filesystem, so renames are atomic):
  D/                              the servable checkpoint; replaced only as a whole (renameat2 exchange)
  .D.hyperqwen-staging/           the next version, built file by file (each file: temp, fsync, rename)
  .D.hyperqwen-progress.json      which staging files are complete, for which recipe (resume)
  .D.hyperqwen-old/               only during the fallback publish on filesystems without exchange
  .D.hyperqwen-verified.json      size/mtime/sha256 of D's files, so a no-op re-run does not rehash
The manifest (D/hyperqwen-manifest.json) is written last: a directory with a matching manifest is complete.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hyperqwen import __version__
from hyperqwen.prepare.atomic import (
    TMP_SUFFIX,
    atomic_write,
    copy_file_atomic,
    crash_point,
    exchange_dirs,
    fsync_dir,
    link_or_copy,
    load_json_object,
    make_dirs,
    remove_tree,
    sha256_file,
    write_json_atomic,
)
from hyperqwen.prepare.checkpoint import (
    INDEX_NAME,
    OUR_GROUP,
    CheckpointFiles,
    Targets,
    find_targets,
    open_checkpoint,
    updated_quantization_config,
)
from hyperqwen.prepare.draft_vocab import (
    DRAFT_FILE,
    HEAD_MODULE,
    DraftVocab,
    choose_draft_vocab,
    corpus_digest,
    default_corpus_dir,
    recipe_parts,
    text_config_with_key,
    write_draft_file,
)
from hyperqwen.prepare.errors import (
    DiskSpaceError,
    FilesystemError,
    PrepareCheckpointError,
    PrepareError,
    QuantizationError,
    filesystem_error,
)
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.progress import ByteProgress
from hyperqwen.prepare.quantize import QuantStats, quantize_tensor, quantized_outputs, weight_scheme
from hyperqwen.prepare.safetensors_io import OutTensor, TensorInfo, build_header
from hyperqwen.prepare.source import Source, acquire_source, list_files
from hyperqwen.prepare.verify import check_index_against_shards, verify_checkpoint

log = logging.getLogger("hyperqwen.prepare")

FORMAT_VERSION = 1
TOOL = f"hyperqwen-prepare/{__version__}"
MANIFEST_NAME = "hyperqwen-manifest.json"
STEPS = ("source", "requantize", "verify", "manifest")
DISK_MARGIN_BYTES = 64 << 20
COPY_CHUNK = 16 << 20


# prepare's state beside the output folder, by attribute: each is `.<output name>.hyperqwen-<suffix>`.
_STATE_SUFFIXES = {
    "staging": "staging",
    "progress": "progress.json",
    "old": "old",
    "verified": "verified.json",
    "lock": "lock",
}


@dataclasses.dataclass(frozen=True)
class StatePaths:
    """Where prepare keeps its state for `output`: the staging folder, its progress file, the previous output
    while it is replaced, the verification record and the lock, each a hidden sibling of the output folder."""

    output: Path
    staging: Path = dataclasses.field(init=False)
    progress: Path = dataclasses.field(init=False)
    old: Path = dataclasses.field(init=False)
    verified: Path = dataclasses.field(init=False)
    lock: Path = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        for name, suffix in _STATE_SUFFIXES.items():
            object.__setattr__(self, name, self.output.parent / f".{self.output.name}.hyperqwen-{suffix}")


@dataclasses.dataclass
class ShardEntry:
    action: str  # "copy" | "quantize"
    source: TensorInfo
    outputs: list[OutTensor]


@dataclasses.dataclass
class OutputFile:
    path: str
    kind: str  # "link" | "rewrite" | "generate"
    recipe: str
    size: int
    source: Path | None = None
    content: bytes | None = None
    entries: list[ShardEntry] | None = None
    metadata: dict[str, str] | None = None
    draft: DraftVocab | None = None


@dataclasses.dataclass
class StepList:
    source: Source
    checkpoint: CheckpointFiles
    targets: Targets
    outputs: list[OutputFile]
    expected_tensors: dict[str, tuple[str, tuple[int, ...]]]
    request: dict[str, Any]
    draft: DraftVocab | None = None

    @property
    def fingerprint(self) -> str:
        items = [[o.path, o.recipe] for o in self.outputs]
        return _digest([TOOL, FORMAT_VERSION, self.request, items])


@dataclasses.dataclass
class Result:
    output_dir: Path
    changed: bool
    files_written: list[str]
    files_reused: list[str]
    quant_errors: dict[str, float]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _identity(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _request(options: PrepareOptions) -> dict[str, Any]:
    """What the user asked for; a prepared model is reused only for the same request."""
    source = (
        {"source_dir": str(options.source_dir.resolve())}
        if options.source_dir
        else {"repo": options.repo_id, "revision": options.revision}
    )
    request = {
        **source,
        "quantize_embed": options.quantize_embed,
        "max_rel_error": options.max_rel_error,
        "max_group_rel_error": options.max_group_rel_error,
        "scheme": weight_scheme(),
    }
    if options.draft_vocab:  # only when on, so models prepared without it keep their request
        request["draft_vocab"] = options.draft_vocab
        request["draft_vocab_corpus"] = corpus_digest(options.draft_vocab_corpus or default_corpus_dir())
        if options.draft_vocab_ids is not None:
            request["draft_vocab_ids"] = _file_digest_or_name(options.draft_vocab_ids)
    return request


def _file_digest_or_name(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return str(path)  # planning reports the missing file with the knob's name


# --- planning ---------------------------------------------------------------------------------------


def list_steps(source: Source, options: PrepareOptions) -> StepList:
    """What prepare will write, file by file (link, rewrite, generate, draft), from the source's headers."""
    ckpt = open_checkpoint(source.directory, source.damaged_fix)
    check_index_against_shards(ckpt)
    targets = find_targets(ckpt, options.quantize_embed)
    quant_config = updated_quantization_config(ckpt.config, targets)
    target_set = set(targets.all)
    outputs: list[OutputFile] = []
    weight_map: dict[str, str] = {}
    expected: dict[str, tuple[str, tuple[int, ...]]] = {}
    total_size = 0
    generated = {"config.json", INDEX_NAME, MANIFEST_NAME}
    for rel in list_files(source.directory):
        name = rel.as_posix()
        path = source.directory / rel
        if name in generated:
            continue
        if name in ckpt.headers:
            rewrite, size = _shard_output(name, path, ckpt.headers[name], target_set, options, weight_map, expected)
            total_size += size
            if rewrite is not None:
                outputs.append(rewrite)
                continue
        outputs.append(
            OutputFile(name, "link", _digest([TOOL, "link", name, _identity(path)]), path.stat().st_size, source=path)
        )
    config = dict(ckpt.config)
    draft = choose_draft_vocab(ckpt, targets, options) if options.draft_vocab else None
    if draft is not None:
        if DRAFT_FILE in ckpt.headers:
            raise PrepareCheckpointError(
                f"{source.directory / DRAFT_FILE} is in the source checkpoint; prepare writes that file itself",
                fix="use the original checkpoint as the source",
            )
        if draft.quantized:
            assert quant_config is not None  # the draft head is quantized only when lm_head is
            group = quant_config["config_groups"][OUR_GROUP]
            group["targets"] = sorted(set(group["targets"]) | {HEAD_MODULE})
        config = text_config_with_key(config, draft.size)
        tensors = draft.tensors()
        for out in tensors:
            weight_map[out.name] = DRAFT_FILE
            expected[out.name] = (out.dtype, out.shape)
            total_size += out.nbytes
        metadata = {"format": "pt"}
        outputs.append(
            OutputFile(
                DRAFT_FILE,
                "draft",
                _digest([TOOL, "draft", *recipe_parts(draft, options)]),
                len(build_header(tensors, metadata)) + sum(t.nbytes for t in tensors),
                metadata=metadata,
                draft=draft,
            )
        )
    if quant_config is not None:
        config["quantization_config"] = quant_config
    generated_files = {"config.json": (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode()}
    if ckpt.has_index or draft is not None:
        # Without an index vLLM loads every *.safetensors, but verify reads only the index: write one.
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        generated_files[INDEX_NAME] = (json.dumps(index, indent=2) + "\n").encode()
    for name, content in generated_files.items():
        outputs.append(
            OutputFile(
                name,
                "generate",
                _digest([TOOL, "generate", hashlib.sha256(content).hexdigest()]),
                len(content),
                content=content,
            )
        )
    return StepList(source, ckpt, targets, outputs, expected, _request(options), draft)


def _shard_output(
    name: str,
    path: Path,
    header: Any,
    target_set: set[str],
    options: PrepareOptions,
    weight_map: dict[str, str],
    expected: dict[str, tuple[str, tuple[int, ...]]],
) -> tuple[OutputFile | None, int]:
    """One source shard: its tensors go into weight_map and expected; returns the rewrite it needs (None when
    none of its tensors is quantized: it is linked) and the bytes of its output tensors."""
    entries = []
    size = 0
    for tname, info in sorted(header.tensors.items(), key=lambda kv: kv[1].begin):
        if tname in target_set:
            entries.append(ShardEntry("quantize", info, quantized_outputs(info)))
        else:
            entries.append(ShardEntry("copy", info, [OutTensor(tname, info.dtype, info.shape)]))
    for entry in entries:
        for out in entry.outputs:
            weight_map[out.name] = name
            expected[out.name] = (out.dtype, out.shape)
            size += out.nbytes
    quantized = sorted(e.source.name for e in entries if e.action == "quantize")
    if quantized:
        metadata = dict(header.metadata) or {"format": "pt"}
        tensors = [out for e in entries for out in e.outputs]
        file_size = len(build_header(tensors, metadata)) + sum(t.nbytes for t in tensors)
        recipe = _digest(
            [
                TOOL,
                "rewrite",
                name,
                _identity(path),
                quantized,
                weight_scheme(),
                options.max_rel_error,
                options.max_group_rel_error,
            ]
        )
        return OutputFile(name, "rewrite", recipe, file_size, source=path, entries=entries, metadata=metadata), size
    return None, size


# --- producing files ----------------------------------------------------------------------------------


def _copy_range(handle, start: int, nbytes: int, write, progress: ByteProgress, buf: bytearray) -> None:
    handle.seek(start)
    view = memoryview(buf)
    left = nbytes
    while left:
        n = handle.readinto(view[: min(left, len(buf))])
        if not n:
            raise PrepareCheckpointError(
                f"{handle.name}: unexpected end of file", fix="delete it and run prepare again"
            )
        write(view[:n])
        left -= n
        progress.update(n)


def write_rewritten_shard(spec: OutputFile, target: Path, options: PrepareOptions) -> tuple[str, int, dict[str, float]]:
    assert spec.entries is not None and spec.source is not None
    tensors = [out for e in spec.entries for out in e.outputs]
    header = build_header(tensors, spec.metadata)
    errors: dict[str, float] = {}
    progress = ByteProgress(sum(e.source.nbytes for e in spec.entries), options.show_progress, spec.path, leave=False)
    buf = bytearray(COPY_CHUNK)
    try:
        with open(spec.source, "rb") as handle, atomic_write(target, spec.size) as out:
            out.write(header)
            for entry in spec.entries:
                if entry.action == "copy":
                    _copy_range(handle, entry.source.begin, entry.source.nbytes, out.write, progress, buf)
                    continue

                def on_block(nbytes: int) -> None:
                    progress.update(nbytes)
                    crash_point(f"quantize-block:{spec.path}")

                stats: QuantStats = quantize_tensor(
                    handle, entry.source, out.write, options.block_bytes, on_block, options.max_group_rel_error
                )
                rel = stats.rel_error
                log.info(
                    "quantized %s %s: relative Frobenius error %.4f%%, worst 128-group %.2f%% (row %d)",
                    entry.source.name,
                    list(entry.source.shape),
                    rel * 100,
                    stats.worst_group_error * 100,
                    stats.worst_group_row,
                )
                if not rel <= options.max_rel_error:
                    raise QuantizationError(
                        f"{entry.source.name}: int8 group-128 relative Frobenius error {rel * 100:.3f}% exceeds the "
                        f"bound {options.max_rel_error * 100:.2f}%",
                        fix="the weights have outliers int8 group-128 cannot represent; keep this tensor in bf16 "
                        "(use a checkpoint where it is already quantized) and report the model",
                    )
                errors[entry.source.name] = round(rel, 9)
            if out.size != spec.size:
                raise PrepareError(f"internal: wrote {out.size} bytes for {spec.path}, expected {spec.size}")
    finally:
        progress.close()
    return out.sha256.hexdigest(), out.size, errors


# --- state, checks -----------------------------------------------------------------------------------


@contextmanager
def _locked(paths: StatePaths) -> Iterator[None]:
    make_dirs(paths.output.parent)
    with open(paths.lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise PrepareError(
                    f"another prepare is already working on {paths.output}",
                    fix="wait for it to finish (or stop it) and run prepare again",
                ) from None
            raise
        yield


def _recover_publish(paths: StatePaths) -> None:
    """Finish or undo a publish a crash interrupted (fallback path only; exchange is one syscall)."""
    if not paths.old.exists():
        return
    if paths.output.exists():
        remove_tree(paths.old)
    else:
        os.rename(paths.old, paths.output)
    fsync_dir(paths.output.parent)


def _file_sha(path: Path, cache: dict[str, list], key: str) -> str:
    ident = _identity(path)
    cached = cache.get(key)
    if cached and cached[:2] == ident:
        return cached[2]
    digest = sha256_file(path)
    cache[key] = [*ident, digest]
    return digest


def output_matches_manifest(directory: Path, manifest: dict[str, Any], cache: dict[str, list]) -> bool:
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for name, entry in files.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != entry.get("size"):
            return False
        if _file_sha(path, cache, name) != entry.get("sha256"):
            return False
    return True


def _cleanup_leftovers(paths: StatePaths) -> None:
    for leftover in (paths.staging, paths.old, paths.progress):
        if leftover.exists():
            remove_tree(leftover)


def _shares_inode(out: OutputFile) -> bool:
    """Weight shards are hard-linked from the source (no second copy of ~15 GB); small files (configs, tokenizer,
    chat template) are copied, so editing one in the model directory never edits the source too."""
    return out.kind == "link" and out.path.endswith(".safetensors")


def _preflight(steps: StepList, paths: StatePaths, done: set[str], reusable: set[str], options: PrepareOptions) -> None:
    if not options.check_disk_space:
        return
    staging_dev = paths.staging.stat().st_dev
    needed = 0
    for out in steps.outputs:
        if out.path in done:
            continue
        if out.path in reusable and paths.output.stat().st_dev == staging_dev:
            continue
        if _shares_inode(out) and out.source is not None and out.source.stat().st_dev == staging_dev:
            continue  # hard link: no new blocks
        needed += out.size
    files = sum(1 for out in steps.outputs if out.path not in done) + 4  # + progress, manifest, temp names
    stat = os.statvfs(paths.staging)
    if stat.f_files and files > stat.f_favail:  # f_files == 0: the file system does not count inodes
        raise DiskSpaceError(
            f"prepare needs {files} new files in {paths.staging.parent}, but its file system has only "
            f"{stat.f_favail} free inodes",
            fix="delete files there (or remount with more inodes, e.g. tmpfs nr_inodes=) or point MODELS_DIR at "
            "another disk, then run prepare again",
        )
    free = shutil.disk_usage(paths.staging).free
    if needed + DISK_MARGIN_BYTES > free:
        raise DiskSpaceError(
            f"prepare needs {needed / 2**30:.2f} GiB (+{DISK_MARGIN_BYTES >> 20} MiB margin) in "
            f"{paths.staging.parent}, only {free / 2**30:.2f} GiB free",
            fix="free space on the models volume or point MODELS_DIR at a larger disk, then run prepare again",
        )


# --- the run -------------------------------------------------------------------------------------------


def _noop_if_current(options: PrepareOptions, paths: StatePaths, cache: dict[str, list]) -> Result | None:
    manifest = load_json_object(paths.output / MANIFEST_NAME)
    if not manifest or manifest.get("format") != FORMAT_VERSION or manifest.get("tool") != TOOL:
        return None
    if manifest.get("request") != _request(options):
        return None
    if not output_matches_manifest(paths.output, manifest, cache):
        return None
    # When the source is at hand, its files must still be the ones the model was built from.
    source_dir = options.source_dir if options.source_dir else options.source_download_dir
    if (source_dir / "config.json").is_file():
        try:
            from hyperqwen.prepare.source import Source as _Source

            steps = list_steps(_Source(source_dir.resolve(), {}), options)
        except PrepareError:
            return None
        if steps.fingerprint != manifest.get("fingerprint"):
            return None
    return Result(
        paths.output,
        False,
        [],
        sorted(manifest["files"]),
        {k: v["rel_frobenius_error"] for k, v in (manifest.get("quantized") or {}).items()},
    )


def prepare(options: PrepareOptions) -> Result:
    """Make options.output_dir a verified, servable checkpoint. Idempotent; safe to kill at any point.

    Raises PrepareError (FilesystemError for what the kernel refused: read-only, full, permissions)."""
    try:
        return _prepare(options)
    except OSError as exc:
        if isinstance(exc, FilesystemError) or not isinstance(exc.errno, int):
            raise
        raise filesystem_error(exc) from None


def _prepare(options: PrepareOptions) -> Result:
    paths = StatePaths(options.output_dir.absolute())
    if paths.output.exists() and not paths.output.is_dir():
        raise PrepareError(
            f"MODEL={str(paths.output)!r} exists and is not a directory",
            fix="point MODEL at a directory (relative to MODELS_DIR)",
            knob="MODEL",
        )
    # Nothing to do needs no lock and no write, so it also works on a read-only models volume. The check only
    # reads, and answers "up to date" only when every published file matches the manifest; a publish by
    # another prepare swaps the whole directory in one rename, so the check sees the old or the new model.
    verified_cache = load_json_object(paths.verified) or {}
    before = json.dumps(verified_cache, sort_keys=True)
    if not any(p.exists() for p in (paths.staging, paths.old, paths.progress)):
        noop = _noop_if_current(options, paths, verified_cache)
        if noop is not None:
            if json.dumps(verified_cache, sort_keys=True) != before:
                try:  # only saves rehashing next time
                    write_json_atomic(paths.verified, verified_cache)
                except OSError as exc:
                    log.debug("cannot update %s (%s); the next run rehashes", paths.verified, exc.strerror)
            log.info("%s is up to date (manifest matches); nothing to do", paths.output)
            return noop
    with _locked(paths):
        _recover_publish(paths)
        verified_cache = load_json_object(paths.verified) or {}
        noop = _noop_if_current(options, paths, verified_cache)
        if noop is not None:
            _cleanup_leftovers(paths)
            write_json_atomic(paths.verified, verified_cache)
            log.info("%s is up to date (manifest matches); nothing to do", paths.output)
            return noop
        if paths.output.is_dir() and any(paths.output.iterdir()) and not (paths.output / MANIFEST_NAME).is_file():
            # Only prepare's publish creates this directory, always with a manifest: this one is someone else's.
            raise PrepareError(
                f"MODEL={str(paths.output)!r} exists but was not made by hyperqwen prepare (no {MANIFEST_NAME}); "
                "prepare replaces only directories it made",
                fix="move that directory away, or set MODEL to another name (or serve it as it is and skip prepare)",
                knob="MODEL",
            )
        source = acquire_source(options)
        steps = list_steps(source, options)
        return _build(steps, options, paths, verified_cache)


def _build(steps: StepList, options: PrepareOptions, paths: StatePaths, verified_cache: dict[str, list]) -> Result:
    fingerprint = steps.fingerprint
    progress = load_json_object(paths.progress)
    if not progress or progress.get("fingerprint") != fingerprint or not paths.staging.is_dir():
        remove_tree(paths.staging)
        make_dirs(paths.staging)
        progress = {"fingerprint": fingerprint, "files": {}, "quantized": {}}
        write_json_atomic(paths.progress, progress)
    for leftover in paths.staging.rglob(f"*{TMP_SUFFIX}"):
        leftover.unlink()

    done = set()
    for out in steps.outputs:
        entry = progress["files"].get(out.path)
        target = paths.staging / out.path
        if entry and entry["recipe"] == out.recipe and target.is_file() and target.stat().st_size == out.size:
            done.add(out.path)

    old_manifest = load_json_object(paths.output / MANIFEST_NAME) or {}
    old_files: dict[str, Any] = old_manifest["files"] if isinstance(old_manifest.get("files"), dict) else {}
    reusable = {
        o.path
        for o in steps.outputs
        if old_files.get(o.path, {}).get("recipe") == o.recipe and (paths.output / o.path).is_file()
    }
    _preflight(steps, paths, done, reusable, options)

    written: list[str] = []
    reused: list[str] = []
    # A download's shards were hashed against the hub's sha256 already; reuse those while the file's size and
    # mtime are unchanged, else hash now. With a second core, the shards to hash are hashed by a background
    # thread while the requantized files (done first) are written.
    source_hashes = progress.setdefault("source_hashes", {})
    for name, entry in steps.source.hash_cache().items():
        source_hashes.setdefault(name, entry)
    ordered = sorted(steps.outputs, key=lambda o: o.kind not in ("rewrite", "draft"))
    hashing: dict[str, Any] = {}
    executor = None
    if len(os.sched_getaffinity(0)) >= 2:
        from concurrent.futures import ThreadPoolExecutor

        executor = ThreadPoolExecutor(1, thread_name_prefix="hyperqwen-hash")
        for out in ordered:
            if out.path not in done and out.path not in reusable and _shares_inode(out) and out.source is not None:
                # A private copy of the cache: the main thread serializes source_hashes into the progress file.
                hashing[out.path] = executor.submit(_file_sha, out.source, dict(source_hashes), out.path)
    try:
        return _write_outputs(
            steps,
            options,
            paths,
            verified_cache,
            progress,
            fingerprint,
            done,
            reusable,
            ordered,
            hashing,
            source_hashes,
            written,
            reused,
            old_files,
            old_manifest,
        )
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def _manifest(steps: StepList, progress: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    """The manifest of the prepared checkpoint: what was asked, from where, each quantized tensor's error, and
    every file's hash (from the progress record)."""
    quantized = {}
    for name in steps.targets.all:
        info = steps.checkpoint.tensor(name)
        quantized[name] = {
            "rel_frobenius_error": progress["quantized"][name],
            "shape": list(info.shape),
            "source_dtype": info.dtype,
            "scheme": "int8 symmetric group-128 pack-quantized",
        }
    manifest = {
        "format": FORMAT_VERSION,
        "tool": TOOL,
        "steps": list(STEPS),
        "request": steps.request,
        "source": steps.source.origin,
        "fingerprint": fingerprint,
        "quantized": quantized,
        **({"draft_vocab": steps.draft.manifest_entry()} if steps.draft is not None else {}),
        "files": {o.path: progress["files"][o.path] for o in sorted(steps.outputs, key=lambda o: o.path)},
    }
    return manifest


def _write_outputs(
    steps: StepList,
    options: PrepareOptions,
    paths: StatePaths,
    verified_cache: dict[str, list],
    progress: dict[str, Any],
    fingerprint: str,
    done: set[str],
    reusable: set[str],
    ordered: list[OutputFile],
    hashing: dict[str, Any],
    source_hashes: dict[str, list],
    written: list[str],
    reused: list[str],
    old_files: dict[str, Any],
    old_manifest: dict[str, Any],
) -> Result:
    for out in ordered:
        if out.path in done:
            reused.append(out.path)
            continue
        target = paths.staging / out.path
        make_dirs(target.parent)
        errors: dict[str, float] = {}
        old_entry = old_files.get(out.path) if out.path in reusable else None
        if old_entry and _file_sha(paths.output / out.path, verified_cache, out.path) == old_entry["sha256"]:
            link_or_copy(paths.output / out.path, target)
            sha, size = old_entry["sha256"], old_entry["size"]
            errors = {
                k: v["rel_frobenius_error"]
                for k, v in (old_manifest.get("quantized") or {}).items()
                if k in {e.source.name for e in out.entries or [] if e.action == "quantize"}
            }
            reused.append(out.path)
        elif out.kind == "link":
            assert out.source is not None
            if _shares_inode(out):
                job = hashing.pop(out.path, None)
                if job is not None:
                    sha = job.result()
                    source_hashes[out.path] = [*_identity(out.source), sha]
                else:
                    sha = _file_sha(out.source, source_hashes, out.path)
                link_or_copy(out.source, target)
                size = out.size
            else:
                sha, size = copy_file_atomic(out.source, target)
            written.append(out.path)
        elif out.kind == "generate":
            assert out.content is not None
            with atomic_write(target) as handle:
                handle.write(out.content)
            sha, size = handle.sha256.hexdigest(), handle.size
            written.append(out.path)
        elif out.kind == "draft":
            assert out.draft is not None
            log.info("writing the draft vocabulary (%d ids) to %s", out.draft.size, out.path)
            with atomic_write(target) as handle:
                handle.write(build_header(out.draft.tensors(), out.metadata))
                write_draft_file(out.draft, handle, on_block=functools.partial(crash_point, f"draft-block:{out.path}"))
                if handle.size != out.size:
                    raise PrepareError(f"internal: wrote {handle.size} bytes for {out.path}, expected {out.size}")
            sha, size = handle.sha256.hexdigest(), handle.size
            written.append(out.path)
        else:
            log.info("requantizing %s", out.path)
            sha, size, errors = write_rewritten_shard(out, target, options)
            written.append(out.path)
        crash_point(f"before-progress:{out.path}")
        progress["files"][out.path] = {"recipe": out.recipe, "sha256": sha, "size": size}
        progress["quantized"].update(errors)
        write_json_atomic(paths.progress, progress)

    verify_checkpoint(paths.staging, steps.expected_tensors)
    crash_point("before-manifest")
    manifest = _manifest(steps, progress, fingerprint)
    files: dict[str, Any] = manifest["files"]  # type: ignore[assignment]
    write_json_atomic(paths.staging / MANIFEST_NAME, manifest)
    crash_point("before-publish")
    _publish(paths)
    write_json_atomic(
        paths.verified,
        {name: [*_identity(paths.output / name), entry["sha256"]] for name, entry in files.items()},
    )
    log.info("prepared %s: %d files written, %d reused", paths.output, len(written), len(reused))
    return Result(paths.output, True, written, reused, dict(progress["quantized"]))


def _publish(paths: StatePaths) -> None:
    parent = paths.output.parent
    if not paths.output.exists():
        os.rename(paths.staging, paths.output)
        fsync_dir(parent)
    elif exchange_dirs(paths.staging, paths.output):
        fsync_dir(parent)
        crash_point("after-exchange")
    else:
        os.rename(paths.output, paths.old)
        fsync_dir(parent)
        crash_point("between-renames")
        os.rename(paths.staging, paths.output)
        fsync_dir(parent)
    # Progress first: a staging dir without progress is never trusted.
    paths.progress.unlink(missing_ok=True)
    remove_tree(paths.staging)
    remove_tree(paths.old)
