"""Get the base checkpoint: a local directory, or a resumable, verified Hugging Face download.

The download is done file by file here rather than by `snapshot_download`: huggingface_hub names its partial
files `<etag>.<random>.incomplete`, so a new process never finds the partial file of a killed one. Each file
goes to a stable, hidden partial name next to its destination (`.<name>.<sha-prefix>.hyperqwen-part`), keyed
by the hub's sha256 (LFS files) or git blob id (small files), and a new run continues it with an HTTP Range
request. URLs, auth headers, the HTTP session, retries on 429/5xx and error classes are huggingface_hub's own
(`hf_hub_url`, `build_hf_headers`, `http_stream_backoff`, `hf_raise_for_status`).

Every run checks every local file against the hub's metadata (size always; sha256 or git blob id, cached by
size and mtime so a re-run does not rehash gigabytes): a missing or damaged file is fetched again, and the run
says so. Each file is fsynced (and its directory) before it gets its final name, and the completion marker is
written (fsynced) only after every file is in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from hyperqwen.config.keyrule import masked
from hyperqwen.prepare.atomic import crash_point, fsync_dir, load_json_object, make_dirs, sha256_file, write_json_atomic
from hyperqwen.prepare.checkpoint import FIX_DOWNLOAD, FIX_LOCAL, FIX_OUTPUT
from hyperqwen.prepare.errors import DiskSpaceError, SourceError
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.progress import ByteProgress

log = logging.getLogger("hyperqwen.prepare")

COMPLETE_MARKER = ".hyperqwen-download.json"  # the hub metadata of a download whose every file was verified
REQUANTIZED_SHARE = 0.25
HASH_CACHE = ".hyperqwen-hashes.json"  # path -> [size, mtime_ns, sha256]; saves rehashing on re-runs
PART_SUFFIX = ".hyperqwen-part"
# Read size of the HTTP body: a kill loses at most this much of what was received (the rest is on disk).
DOWNLOAD_CHUNK = 1 << 20
# A stalled or cut connection is retried from where it stopped; give up after this many tries in a row
# without new bytes (the next run still continues from the partial file).
MAX_STALLED_TRIES = 5
# huggingface_hub's own download cache inside a local_dir (what earlier versions of prepare used): its
# `.incomplete` files can never be resumed by us, so they are removed once a download completes.
HF_LOCAL_DIR_CACHE = ".cache/huggingface"


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int | None
    sha256: str | None  # the hub gives it for LFS files (all weight shards)
    blob_id: str | None = None  # git blob sha1, for files stored in git itself (configs, tokenizer)

    @property
    def key(self) -> str:
        return (self.sha256 or self.blob_id or "unknown")[:16]

    def as_json(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256, "blob_id": self.blob_id}


@dataclasses.dataclass(frozen=True)
class Source:
    directory: Path
    origin: dict[str, Any]  # for the manifest: where it came from (never the token)

    @property
    def damaged_fix(self) -> str:
        """What a message about a missing or damaged file of this source tells the user to do."""
        return FIX_LOCAL if self.origin.get("kind") == "local" else FIX_DOWNLOAD

    def hash_cache(self) -> dict[str, list]:
        """sha256 of source files verified at download, by path: [size, mtime_ns, sha256]."""
        return load_json_object(self.directory / HASH_CACHE) or {}


class HubUnreachableError(SourceError):
    """The hub could not be asked at all (network, DNS, timeout, 5xx): an earlier verified download may stand in.
    Never raised for an answer about the request itself (401, 403, 404)."""


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
        raise SourceError(
            f"MODEL_SOURCE_DIR={str(directory)!r} is not a directory",
            fix="point MODEL_SOURCE_DIR at a downloaded checkpoint (with config.json and *.safetensors), "
            "or unset it to download MODEL_REPO",
            knob="MODEL_SOURCE_DIR",
        )
    if not (directory / "config.json").is_file():
        raise SourceError(
            f"MODEL_SOURCE_DIR={str(directory)!r} has no config.json",
            fix="point MODEL_SOURCE_DIR at the checkpoint's top directory",
            knob="MODEL_SOURCE_DIR",
        )
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
            f"MODEL_REPO={repo!r} is gated and HF_TOKEN ({masked(options.token)}) has no access to it",
            fix=f"accept the model's terms on {endpoint}/{repo} with your account, then set HF_TOKEN to a read token "
            "of that account",
            knob="HF_TOKEN",
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return SourceError(
            f"MODEL_REVISION={options.revision!r} does not exist in {repo}",
            fix="use an existing branch, tag or commit of the repo (default: main)",
            knob="MODEL_REVISION",
        )
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return SourceError(
            f"MODEL_REPO={repo!r} was not found on {endpoint} (or is private; HF_TOKEN is {token_state})",
            fix="check the spelling (default: dbirks/Qwen3.8-27B-W4A16-AutoRound); for a private repo set HF_TOKEN",
            knob="MODEL_REPO",
        )
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 401:
            return SourceError(
                f"the hub rejected HF_TOKEN ({masked(options.token)}) as invalid (HTTP 401)",
                fix="create a new read token at https://huggingface.co/settings/tokens and set HF_TOKEN, "
                "or unset HF_TOKEN for public repos; with HF_HUB_OFFLINE=1 prepare uses an "
                "earlier verified download without asking the hub",
                knob="HF_TOKEN",
            )
        if status == 403:
            return SourceError(
                f"HF_TOKEN ({masked(options.token)}) may not read {repo} (HTTP 403)",
                fix="use a token with read access to the repo (or accept its terms on "
                f"{endpoint}/{repo}); with HF_HUB_OFFLINE=1 prepare uses an earlier verified "
                "download without asking the hub",
                knob="HF_TOKEN",
            )
        first = str(exc).splitlines()[0] if str(exc) else ""
        if status is not None and (status >= 500 or status in (408, 429)):
            return HubUnreachableError(
                f"the hub answered HTTP {status} for {repo}: {first}",
                fix="retry later; prepare resumes where it stopped",
            )
        return SourceError(
            f"the hub answered HTTP {status} for {repo}: {first}", fix="retry later; prepare resumes where it stopped"
        )
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return SourceError(
            "HF_HUB_OFFLINE is on and no verified download of "
            f"{repo}@{options.revision} exists in {options.source_download_dir}",
            fix="unset HF_HUB_OFFLINE for one run, or set MODEL_SOURCE_DIR to a local checkpoint",
            knob="HF_HUB_OFFLINE",
        )
    # Connection refused, DNS failure, timeouts: httpx errors, or OSError underneath.
    return HubUnreachableError(
        f"cannot reach the Hugging Face hub at {endpoint} to download {repo} ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else 'no details'})",
        fix="check the network (and HF_ENDPOINT / proxy variables); or set MODEL_SOURCE_DIR to a local copy; "
        "prepare resumes a partial download when run again",
    )


def _remote_files(options: PrepareOptions) -> tuple[str, list[RemoteFile]]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=options.hf_endpoint, token=options.token or False)
    try:
        info = api.model_info(
            options.repo_id, revision=options.revision, files_metadata=True, token=options.token or False
        )
    except Exception as exc:  # noqa: BLE001 - every hub/network failure is mapped to a clear message
        raise _hub_error(exc, options) from None
    files = []
    for sibling in info.siblings or []:
        sha = sibling.lfs.sha256 if sibling.lfs is not None else None
        blob = None if sibling.lfs is not None else sibling.blob_id
        files.append(RemoteFile(sibling.rfilename, sibling.size, sha, blob))
    return info.sha or options.revision, files


def git_blob_sha1(path: Path) -> str:
    """The id git gives a file's content (what the hub lists as blob id for non-LFS files)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_local_file(directory: Path, remote: RemoteFile, cache: dict[str, list]) -> str | None:
    """None when the local copy matches the hub's metadata, else what is wrong with it."""
    local = directory / remote.path
    if not local.is_file():
        return "missing"
    stat = local.stat()
    if remote.size is not None and stat.st_size != remote.size:
        return f"{stat.st_size} bytes, the hub says {remote.size}"
    if remote.sha256:
        cached = cache.get(remote.path)
        if cached and cached[:2] == [stat.st_size, stat.st_mtime_ns]:
            digest = cached[2]
        else:
            digest = sha256_file(local)
            cache[remote.path] = [stat.st_size, stat.st_mtime_ns, digest]
        if digest != remote.sha256:
            return f"sha256 {digest[:12]}..., the hub says {remote.sha256[:12]}..."
    elif remote.blob_id:
        blob = git_blob_sha1(local)
        if blob != remote.blob_id:
            return f"git blob id {blob[:12]}..., the hub says {remote.blob_id[:12]}..."
    return None


def part_path(directory: Path, remote: RemoteFile) -> Path:
    """The stable partial file of one download: the same name in every run, so a new process continues it."""
    dest = directory / remote.path
    return dest.with_name(f".{dest.name}.{remote.key}{PART_SUFFIX}")


def _transport_errors() -> tuple[type[BaseException], ...]:
    try:
        import httpx2 as httpx  # what huggingface_hub 2.x uses
    except ImportError:  # pragma: no cover - older huggingface_hub
        import httpx  # type: ignore[no-redef]
    # Not OSError: huggingface_hub's HTTP errors subclass it (and must not be retried as a cut connection), and
    # a local write error (disk full) must reach the user, not be retried.
    return (httpx.TransportError,)


def download_file(remote: RemoteFile, directory: Path, commit: str, options: PrepareOptions, bar: ByteProgress) -> str:
    """Fetch one file into `directory`, continuing its partial file; returns its sha256.

    Order on disk: bytes appended to the partial file -> fsync -> size and hash checked against the hub ->
    rename to the final name -> fsync the directory. A kill at any point leaves either the partial file
    (continued next time) or the complete, durable file.
    """
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

    dest = directory / remote.path
    make_dirs(dest.parent)
    part = part_path(directory, remote)
    url = hf_hub_url(options.repo_id, remote.path, revision=commit, endpoint=options.hf_endpoint)
    headers = build_hf_headers(token=options.token or False, library_name="hyperqwen")
    transport = _transport_errors()
    with open(part, "ab+") as handle:
        have = handle.seek(0, os.SEEK_END)
        if remote.size is not None and have > remote.size:
            handle.truncate(0)
            have = 0
        sha256 = hashlib.sha256()
        blob = hashlib.sha1(f"blob {remote.size}\0".encode(), usedforsecurity=False) if remote.blob_id else None
        if have:
            # The bytes of the partial file count toward the hash; read them once (page cache, usually).
            handle.seek(0)
            for chunk in iter(lambda: handle.read(16 << 20), b""):
                sha256.update(chunk)
                if blob is not None:
                    blob.update(chunk)
            log.info("continuing %s at %.1f of %.1f MiB", remote.path, have / 2**20, (remote.size or 0) / 2**20)
            bar.update(have)
        stalled = 0
        while remote.size is None or have < remote.size:
            request = dict(headers)
            if have:
                request["Range"] = f"bytes={have}-"
            before = have
            cut: BaseException | None = None
            try:
                with http_stream_backoff(
                    "GET", url, headers=request, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
                ) as response:
                    hf_raise_for_status(response)
                    if have and response.status_code != 206:
                        # The server ignored the Range request: start over rather than append a second copy.
                        handle.truncate(0)
                        have = 0
                        sha256 = hashlib.sha256()
                        blob = (
                            hashlib.sha1(f"blob {remote.size}\0".encode(), usedforsecurity=False)
                            if remote.blob_id
                            else None
                        )
                    # A cut inside the body is caught here: thrown into huggingface_hub's retrying generator it
                    # would be retried from byte 0 (or fail), not continued from `have`.
                    try:
                        for chunk in response.iter_bytes(DOWNLOAD_CHUNK):
                            handle.write(chunk)
                            sha256.update(chunk)
                            if blob is not None:
                                blob.update(chunk)
                            have += len(chunk)
                            bar.update(len(chunk))
                            crash_point(f"download-chunk:{remote.path}")
                    except transport as exc:
                        cut = exc
            except transport as exc:
                cut = exc
            if cut is not None:
                if have > before:
                    stalled = 0
                stalled += 1
                if stalled >= MAX_STALLED_TRIES:
                    handle.flush()
                    raise _hub_error(cut, options) from None
                log.warning(
                    "%s: connection lost at %.1f MiB (%s); continuing", remote.path, have / 2**20, type(cut).__name__
                )
                time.sleep(min(8.0, 0.25 * 2**stalled))
                continue
            if remote.size is None:
                break
            if have == before:
                stalled += 1
                if stalled >= MAX_STALLED_TRIES:
                    raise SourceError(
                        f"{remote.path}: the hub sent no data after {have} of {remote.size} bytes",
                        fix="retry later; prepare resumes where it stopped",
                    )
        handle.flush()
        crash_point(f"download-before-fsync:{remote.path}")
        os.fsync(handle.fileno())
    digest = _verified_digest(remote, part, have, sha256, blob)
    os.replace(part, dest)
    fsync_dir(dest.parent)
    return digest


def _verified_digest(remote: RemoteFile, part: Path, have: int, sha256: Any, blob: Any) -> str:
    """The downloaded file's sha256 once its size, sha256 and git blob id match the hub's metadata; a file
    that does not match is deleted (never continued) and refused."""
    digest = sha256.hexdigest()
    problem = None
    if remote.size is not None and have != remote.size:
        problem = f"{have} bytes, the hub says {remote.size}"
    elif remote.sha256 and digest != remote.sha256:
        problem = f"sha256 {digest[:12]}..., the hub says {remote.sha256[:12]}..."
    elif blob is not None and remote.blob_id and blob.hexdigest() != remote.blob_id:
        problem = f"git blob id {blob.hexdigest()[:12]}..., the hub says {remote.blob_id[:12]}..."
    if problem:
        part.unlink(missing_ok=True)  # never continue a file whose bytes are wrong
        raise SourceError(
            f"the download of {remote.path} does not match the hub's metadata ({problem}); the bad copy was deleted",
            fix="run prepare again: it fetches the file again; if this repeats, a proxy or the hub serves corrupt data",
        )
    return digest


def _remove_partials(directory: Path) -> None:
    """After a complete download: no partial file (ours, or huggingface_hub's from earlier versions) survives."""
    for leftover in directory.rglob(f"*{PART_SUFFIX}"):
        leftover.unlink(missing_ok=True)
    cache = directory / HF_LOCAL_DIR_CACHE
    if cache.is_dir():
        shutil.rmtree(cache, ignore_errors=True)
        parent = cache.parent
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


def _verify_earlier(directory: Path, marker: dict[str, Any], options: PrepareOptions, why: str) -> None:
    """Without the hub: the earlier download's files must still match what the hub said when it was made."""
    files = marker.get("files") or {}
    cache = load_json_object(directory / HASH_CACHE) or {}
    problems = []
    for path, meta in sorted(files.items()):
        remote = RemoteFile(path, meta.get("size"), meta.get("sha256"), meta.get("blob_id"))
        problem = check_local_file(directory, remote, cache)
        if problem:
            problems.append(f"{path}: {problem}")
    if problems:
        raise SourceError(
            f"{why}, and the earlier download in {directory} is damaged:\n    " + "\n    ".join(problems),
            fix="run prepare with the hub reachable (and HF_HUB_OFFLINE unset) to fetch those files "
            "again, or set MODEL_SOURCE_DIR to a local checkpoint",
            knob="HF_HUB_OFFLINE",
        )


def _download(
    needed: list[RemoteFile],
    files: list[RemoteFile],
    directory: Path,
    commit: str,
    cache: dict,
    options: PrepareOptions,
) -> None:
    """Fetch the `needed` files of `files` (after a disk-space check), recording each one's hash in `cache`."""
    missing = sum(max(0, (r.size or 0) - _size_or_zero(part_path(directory, r))) for r in needed)
    # The requantized copy comes later (its exact size is known once headers are local): reserve a share of
    # the download for it now, so a full disk shows up before hours of downloading rather than after.
    # For Qwen3.8-27B W4A16 the rewritten shards (int8 lm_head, MTP, optionally embed_tokens) are ~3 GB of ~20.
    total = sum(remote.size or 0 for remote in files)
    reserve = int(total * REQUANTIZED_SHARE)
    free = shutil.disk_usage(directory).free
    if options.check_disk_space and missing + reserve > free:
        raise DiskSpaceError(
            f"the download needs {missing / 2**30:.2f} GiB more in {directory} plus ~{reserve / 2**30:.2f} GiB "
            f"for the requantized copy; only {free / 2**30:.2f} GiB free",
            fix="free space on the models volume or point MODELS_DIR at a larger disk",
        )
    log.info(
        "downloading %d file(s), %.2f GiB, of %s@%s (commit %s) into %s",
        len(needed),
        missing / 2**30,
        options.repo_id,
        options.revision,
        commit,
        directory,
    )
    bar = ByteProgress(sum(r.size or 0 for r in needed), options.show_progress, "download")
    try:
        for remote in needed:
            digest = download_file(remote, directory, commit, options, bar)
            stat = (directory / remote.path).stat()
            cache[remote.path] = [stat.st_size, stat.st_mtime_ns, digest]
            write_json_atomic(directory / HASH_CACHE, cache)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - hub answers (401/403/404...) raised mid-download
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(exc, HfHubHTTPError):
            raise _hub_error(exc, options) from None
        raise
    finally:
        bar.close()


def hub_source(options: PrepareOptions) -> Source:
    directory = options.source_download_dir
    marker = load_json_object(directory / COMPLETE_MARKER)
    origin: dict[str, Any] = {"kind": "hub", "repo": options.repo_id, "revision": options.revision}

    def complete_for(revision_or_commit: str) -> bool:
        return (
            marker is not None
            and marker.get("repo") == options.repo_id
            and revision_or_commit in (marker.get("revision"), marker.get("commit"))
        )

    if options.offline:
        if marker is not None and complete_for(options.revision):
            _verify_earlier(directory, marker, options, "HF_HUB_OFFLINE is on")
            return Source(directory, origin | {"commit": marker["commit"]})
        from huggingface_hub.errors import OfflineModeIsEnabled

        raise _hub_error(OfflineModeIsEnabled("offline"), options)

    try:
        commit, files = _remote_files(options)
    except HubUnreachableError as exc:
        # Only when the hub could not be asked: an answer about the token or the repo is never "unreachable".
        if marker is not None and complete_for(options.revision):
            _verify_earlier(directory, marker, options, "the hub is unreachable")
            log.warning(
                "hub unreachable (%s); using the earlier verified download of %s@%s (commit %s)",
                str(exc).splitlines()[0],
                options.repo_id,
                options.revision,
                marker["commit"],
            )
            return Source(directory, origin | {"commit": marker["commit"]})
        raise
    origin["commit"] = commit
    if not any(f.path == "config.json" for f in files):
        raise SourceError(
            f"MODEL_REPO={options.repo_id!r}@{options.revision} has no config.json at its top level, "
            "so it is not a transformers model checkpoint",
            fix="set MODEL_REPO to a Qwen3.8-27B checkpoint repo (default: "
            "dbirks/Qwen3.8-27B-W4A16-AutoRound), or MODEL_SOURCE_DIR to a local one",
            knob="MODEL_REPO",
        )

    make_dirs(directory)
    cache = load_json_object(directory / HASH_CACHE) or {}
    needed: list[RemoteFile] = []
    for remote in files:
        problem = check_local_file(directory, remote, cache)
        if problem is None:
            continue
        if problem != "missing":
            log.warning("%s: %s; fetching it again", remote.path, problem)
            (directory / remote.path).unlink()
        elif marker is not None and complete_for(commit):
            log.warning("%s: missing from the earlier download; fetching it again", remote.path)
        needed.append(remote)
    if cache != (load_json_object(directory / HASH_CACHE) or {}):
        write_json_atomic(directory / HASH_CACHE, cache)

    if needed:
        _download(needed, files, directory, commit, cache, options)
    crash_point("download-before-marker")
    # Every file is fsynced under its final name (download_file) before this marker says "complete".
    new_marker = {
        "repo": options.repo_id,
        "revision": options.revision,
        "commit": commit,
        "files": {f.path: f.as_json() for f in files},
    }
    if new_marker != marker:
        write_json_atomic(directory / COMPLETE_MARKER, new_marker)
    _remove_partials(directory)
    return Source(directory, origin)


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def acquire_source(options: PrepareOptions) -> Source:
    if options.source_dir is not None:
        return local_source(options)
    return hub_source(options)


__all__ = [
    "COMPLETE_MARKER",
    "FIX_OUTPUT",
    "HubUnreachableError",
    "RemoteFile",
    "Source",
    "acquire_source",
    "download_file",
    "hub_source",
    "list_files",
    "local_source",
    "part_path",
]
