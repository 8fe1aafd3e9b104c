"""Get the base checkpoint: a local directory, or a resumable, verified Hugging Face download."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from hyperqwen.prepare.atomic import sha256_file, write_json_atomic
from hyperqwen.prepare.errors import DiskSpaceError, SourceError
from hyperqwen.prepare.options import PrepareOptions, mask_secret

log = logging.getLogger("hyperqwen.prepare")

COMPLETE_MARKER = ".hyperqwen-download.json"  # written only after every file verified
REQUANTIZED_SHARE = 0.25
HASH_CACHE = ".hyperqwen-hashes.json"  # path -> [size, mtime_ns, sha256]; saves rehashing on re-runs


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int | None
    sha256: str | None  # the hub gives it for LFS files (all weight shards)


@dataclasses.dataclass(frozen=True)
class Source:
    directory: Path
    origin: dict[str, Any]  # for the manifest: where it came from (never the token)

    def hash_cache(self) -> dict[str, list]:
        """sha256 of source files verified at download, by path: [size, mtime_ns, sha256]."""
        return _load_json(self.directory / HASH_CACHE) or {}


def is_hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def list_files(directory: Path) -> list[Path]:
    """Relative paths of the checkpoint's files, skipping hidden ones (download caches, our markers)."""
    files = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if is_hidden(rel) or not path.is_file() or path.name.endswith(".hyperqwen-tmp"):
            continue
        files.append(rel)
    return files


def local_source(options: PrepareOptions) -> Source:
    directory = options.source_dir
    assert directory is not None
    if not directory.is_dir():
        raise SourceError(f"MODEL_SOURCE_DIR={str(directory)!r} is not a directory",
                          fix="point MODEL_SOURCE_DIR at a downloaded checkpoint (with config.json and *.safetensors), "
                              "or unset it to download MODEL_REPO", knob="MODEL_SOURCE_DIR")
    if not (directory / "config.json").is_file():
        raise SourceError(f"MODEL_SOURCE_DIR={str(directory)!r} has no config.json",
                          fix="point MODEL_SOURCE_DIR at the checkpoint's top directory", knob="MODEL_SOURCE_DIR")
    return Source(directory.resolve(), {"kind": "local", "path": str(directory.resolve())})


# --- hub -------------------------------------------------------------------------------------------

def _hub_error(exc: BaseException, options: PrepareOptions) -> SourceError:
    """Turn huggingface_hub's exceptions into messages that say which knob to change."""
    from huggingface_hub import errors as hf_errors

    repo = options.repo_id
    endpoint = options.hf_endpoint or "https://huggingface.co"
    token_state = "set" if options.token else "not set"
    if isinstance(exc, hf_errors.GatedRepoError):
        return SourceError(
            f"MODEL_REPO={repo!r} is gated and HF_TOKEN ({mask_secret(options.token)}) has no access to it",
            fix=f"accept the model's terms on {endpoint}/{repo} with your account, then set HF_TOKEN to a read token "
                "of that account", knob="HF_TOKEN")
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return SourceError(f"MODEL_REVISION={options.revision!r} does not exist in {repo}",
                           fix="use an existing branch, tag or commit of the repo (default: main)",
                           knob="MODEL_REVISION")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return SourceError(
            f"MODEL_REPO={repo!r} was not found on {endpoint} (or is private; HF_TOKEN is {token_state})",
            fix="check the spelling (default: dbirks/Qwen3.8-27B-W4A16-AutoRound); for a private repo set HF_TOKEN",
            knob="MODEL_REPO")
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 401:
            return SourceError(f"the hub rejected HF_TOKEN ({mask_secret(options.token)}) as invalid (HTTP 401)",
                               fix="create a new read token at https://huggingface.co/settings/tokens and set HF_TOKEN, "
                                   "or unset HF_TOKEN for public repos", knob="HF_TOKEN")
        if status == 403:
            return SourceError(f"HF_TOKEN ({mask_secret(options.token)}) may not read {repo} (HTTP 403)",
                               fix="use a token with read access to the repo", knob="HF_TOKEN")
        return SourceError(f"the hub answered HTTP {status} for {repo}: {str(exc).splitlines()[0]}",
                           fix="retry later; prepare resumes where it stopped")
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return SourceError("HF_HUB_OFFLINE is on and no verified download of "
                           f"{repo}@{options.revision} exists in {options.source_download_dir}",
                           fix="unset HF_HUB_OFFLINE for one run, or set MODEL_SOURCE_DIR to a local checkpoint",
                           knob="HF_HUB_OFFLINE")
    # Connection refused, DNS failure, timeouts: httpx2/httpx errors, or OSError underneath.
    return SourceError(
        f"cannot reach the Hugging Face hub at {endpoint} to download {repo} ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else 'no details'})",
        fix="check the network (and HF_ENDPOINT / proxy variables); or set MODEL_SOURCE_DIR to a local copy; "
            "prepare resumes a partial download when run again")


def _remote_files(options: PrepareOptions) -> tuple[str, list[RemoteFile]]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=options.hf_endpoint, token=options.token or False)
    try:
        info = api.model_info(options.repo_id, revision=options.revision, files_metadata=True,
                              token=options.token or False)
    except Exception as exc:  # noqa: BLE001 - every hub/network failure is mapped to a clear message
        raise _hub_error(exc, options) from None
    files = []
    for sibling in info.siblings or []:
        sha = sibling.lfs.sha256 if sibling.lfs is not None else None
        files.append(RemoteFile(sibling.rfilename, sibling.size, sha))
    return info.sha or options.revision, files


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def verify_download(directory: Path, files: list[RemoteFile]) -> None:
    """Sizes always; sha256 where the hub gave one. Hashes are cached by (size, mtime)."""
    cache_path = directory / HASH_CACHE
    cache = _load_json(cache_path) or {}
    problems = []
    for remote in files:
        local = directory / remote.path
        if not local.is_file():
            problems.append(f"{remote.path}: missing")
            continue
        stat = local.stat()
        if remote.size is not None and stat.st_size != remote.size:
            problems.append(f"{remote.path}: {stat.st_size} bytes, the hub says {remote.size}")
            continue
        if remote.sha256:
            cached = cache.get(remote.path)
            if cached and cached[:2] == [stat.st_size, stat.st_mtime_ns]:
                digest = cached[2]
            else:
                digest = sha256_file(local)
                cache[remote.path] = [stat.st_size, stat.st_mtime_ns, digest]
            if digest != remote.sha256:
                problems.append(f"{remote.path}: sha256 {digest[:12]}..., the hub says {remote.sha256[:12]}...")
                local.unlink()  # so the next run fetches it again instead of trusting it
    write_json_atomic(cache_path, cache)
    if problems:
        raise SourceError("the download does not match the hub's metadata:\n    " + "\n    ".join(problems),
                          fix="run prepare again: bad files were deleted and will be fetched again")


def hub_source(options: PrepareOptions) -> Source:
    directory = options.source_download_dir
    marker = _load_json(directory / COMPLETE_MARKER)
    origin = {"kind": "hub", "repo": options.repo_id, "revision": options.revision}

    def complete_for(revision_or_commit: str) -> bool:
        return bool(marker) and marker.get("repo") == options.repo_id and revision_or_commit in (
            marker.get("revision"), marker.get("commit"))

    if options.offline:
        if complete_for(options.revision):
            return Source(directory, origin | {"commit": marker["commit"]})
        from huggingface_hub.errors import OfflineModeIsEnabled
        raise _hub_error(OfflineModeIsEnabled("offline"), options)

    try:
        commit, files = _remote_files(options)
    except SourceError:
        if complete_for(options.revision):
            log.warning("hub unreachable; using the earlier verified download of %s@%s (commit %s)",
                        options.repo_id, options.revision, marker["commit"])
            return Source(directory, origin | {"commit": marker["commit"]})
        raise
    origin["commit"] = commit
    if complete_for(commit):
        return Source(directory, origin)

    directory.mkdir(parents=True, exist_ok=True)
    missing = 0
    for remote in files:
        local = directory / remote.path
        have = local.stat().st_size if local.is_file() else 0
        missing += max(0, (remote.size or 0) - have)
    # The requantized copy comes later (its exact size is known once headers are local): reserve a share of
    # the download for it now, so a full disk shows up before hours of downloading rather than after.
    # For Qwen3.8-27B W4A16 the rewritten shards (int8 lm_head, MTP, optionally embed_tokens) are ~3 GB of ~20.
    total = sum(remote.size or 0 for remote in files)
    reserve = int(total * REQUANTIZED_SHARE)
    free = shutil.disk_usage(directory).free
    if options.check_disk_space and missing + reserve > free:
        raise DiskSpaceError(
            f"the download needs {missing / 2**30:.2f} GiB more in {directory} plus ~{reserve / 2**30:.2f} GiB for "
            f"the requantized copy; only {free / 2**30:.2f} GiB free",
            fix="free space on the models volume or point MODELS_DIR at a larger disk")

    from huggingface_hub import snapshot_download

    log.info("downloading %s@%s (commit %s) into %s", options.repo_id, options.revision, commit, directory)
    try:
        snapshot_download(options.repo_id, revision=commit, local_dir=directory, token=options.token or False,
                          endpoint=options.hf_endpoint)
    except Exception as exc:  # noqa: BLE001
        raise _hub_error(exc, options) from None
    verify_download(directory, files)
    write_json_atomic(directory / COMPLETE_MARKER, {
        "repo": options.repo_id, "revision": options.revision, "commit": commit,
        "files": {f.path: {"size": f.size, "sha256": f.sha256} for f in files}})
    return Source(directory, origin)


def acquire_source(options: PrepareOptions) -> Source:
    if options.source_dir is not None:
        return local_source(options)
    return hub_source(options)
