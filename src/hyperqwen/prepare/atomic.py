"""Crash-safe file operations: every output appears whole (temp file in the same dir, fsync, rename,
fsync the dir) or not at all. Also the crash-injection hook the SIGKILL tests drive."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from hyperqwen.prepare.errors import DiskSpaceError

TMP_SUFFIX = ".hyperqwen-tmp"
CRASH_ENV = "HYPERQWEN_PREPARE_CRASH_AT"
CRASH_LOG_ENV = "HYPERQWEN_PREPARE_CRASH_LOG"  # tests: append every crash point reached to this file
_crash_counter = 0


def crash_point(label: str) -> None:
    """Test hook: with HYPERQWEN_PREPARE_CRASH_AT=N, SIGKILL ourselves at the N-th crash point reached.

    A real SIGKILL (no cleanup, no flush), placed where a power cut would hurt most: between writing
    and renaming, between renaming and recording progress, in the middle of a tensor.
    """
    global _crash_counter
    target = os.environ.get(CRASH_ENV)
    log_path = os.environ.get(CRASH_LOG_ENV)
    if not target and not log_path:
        return
    _crash_counter += 1
    if log_path:
        with open(log_path, "a") as handle:
            handle.write(f"{_crash_counter} {label}\n")
    if not target:
        return
    if _crash_counter == int(target):
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    """fsync a file we did not write ourselves (a local source shard we hard-link): its data must be on disk
    before a marker or a published directory points at it. A read-only descriptor is enough on Linux."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EINVAL):  # a read-only mount holds nothing unwritten
            raise
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """mkdir -p, and fsync the parent of every directory created, so the new entries survive a power cut."""
    missing = []
    probe = path
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue
        fsync_dir(directory.parent)


def enospc_error(path: Path, exc: OSError) -> DiskSpaceError:
    where = path.parent if not path.is_dir() else path
    usage = shutil.disk_usage(where)
    stat = os.statvfs(where)
    inodes = stat.f_files and stat.f_favail == 0
    return DiskSpaceError(
        f"disk full while writing {path} ({exc.strerror}); {usage.free / 2**30:.2f} GiB free"
        + (" but no free inodes" if inodes else "")
        + " on that filesystem",
        fix="free space (or inodes) on the models volume or point MODELS_DIR at a larger disk, then run prepare "
        "again (it resumes; nothing half-written was kept)",
    )


class HashingWriter:
    """A file object wrapper that hashes everything written, so outputs are never re-read to hash them.

    `write_owned` hands a buffer the caller will not touch again to one background thread that writes and
    hashes it (both release the GIL), so with a second core the quantization of the next block overlaps the
    write and the hash of this one. Order is kept: one thread, FIFO; `write` and `drain` wait for it."""

    MAX_PENDING = 4  # bounds the memory held by queued blocks (a few MiB each)

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._pending: list[Any] = []
        self._executor: Any = None

    def _write_now(self, data: bytes | memoryview) -> None:
        self.handle.write(data)
        self.sha256.update(data)

    def write(self, data: bytes | memoryview) -> None:
        self.drain()
        self._write_now(data)
        self.size += len(data)

    def write_owned(self, data: bytes | memoryview) -> None:
        if _CPUS < 2:
            self.write(data)
            return
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(1, thread_name_prefix="hyperqwen-write")
        while len(self._pending) >= self.MAX_PENDING:
            self._pending.pop(0).result()
        self._pending.append(self._executor.submit(self._write_now, data))
        self.size += len(data)

    def drain(self) -> None:
        """Wait for every queued write; re-raises the first error (ENOSPC, ...)."""
        try:
            while self._pending:
                self._pending.pop(0).result()
        finally:
            if not self._pending and self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


_CPUS = len(os.sched_getaffinity(0))


@contextmanager
def atomic_write(path: Path) -> Iterator[HashingWriter]:
    """Write `path` via `<path>.hyperqwen-tmp`: fsync, rename over, fsync the directory.

    On any exception the temp file is removed and `path` is untouched. ENOSPC becomes DiskSpaceError.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as handle:
            writer = HashingWriter(handle)
            try:
                yield writer
            finally:
                writer.drain()
            crash_point(f"before-fsync:{path.name}")
            handle.flush()
            os.fsync(handle.fileno())
        crash_point(f"before-rename:{path.name}")
        os.replace(tmp, path)
        crash_point(f"before-dirsync:{path.name}")
        fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise enospc_error(path, exc) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> str:
    """Deterministic JSON (sorted keys, fixed indent), atomically. Returns the sha256 of the bytes."""
    payload = (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    with atomic_write(path) as out:
        out.write(payload)
    return out.sha256.hexdigest()


def copy_file_atomic(src: Path, dst: Path, chunk_bytes: int = 16 << 20) -> tuple[str, int]:
    """Stream-copy with hashing; returns (sha256, size)."""
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    with open(src, "rb") as handle, atomic_write(dst) as out:
        while True:
            n = handle.readinto(buf)
            if not n:
                break
            out.write(view[:n])
            crash_point(f"copy-chunk:{dst.name}")
    return out.sha256.hexdigest(), out.size


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link (no extra space; both sides are never modified in place) or copy across filesystems.

    The shared inode is fsynced first: a hard link makes the name durable, not the data behind it."""
    tmp = dst.with_name(dst.name + TMP_SUFFIX)
    tmp.unlink(missing_ok=True)
    fsync_path(src)
    try:
        os.link(src, tmp)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        copy_file_atomic(src, dst)
        return
    os.replace(tmp, dst)
    # rename(2) is a no-op when both names already point to the same inode (a resumed run re-linking
    # a file it linked before the crash): the temp name then survives and must go.
    tmp.unlink(missing_ok=True)
    fsync_dir(dst.parent)


def sha256_file(path: Path, chunk_bytes: int = 16 << 20) -> str:
    digest = hashlib.sha256()
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    with open(path, "rb") as handle:
        while True:
            n = handle.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
    return digest.hexdigest()


# renameat2(2) with RENAME_EXCHANGE swaps two directories atomically (Linux >= 3.15).
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange_dirs(a: Path, b: Path) -> bool:
    """Atomically swap two paths. Returns False where the kernel/filesystem cannot (caller falls back)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
