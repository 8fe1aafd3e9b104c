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

    `write_owned` takes a buffer the caller will not touch again: it is written at once and, with a second core,
    hashed by one background thread (hashlib releases the GIL), so the hash of this block overlaps the
    quantization of the next one and the write. The hash keeps the file's order (one thread, FIFO); `write`,
    `drain` and `sha256` wait for it. Writing and hashing sat on the same background thread before; the hash
    alone (about 1.1 GB/s here) is then the longest stage, the write (page cache, about 2 GB/s) is not.

    With a `direct` sink (large files, see atomic_write) the bytes bypass the page cache. Otherwise, every
    WRITEBACK_BYTES the kernel is asked to start writing the new pages out (sync_file_range
    SYNC_FILE_RANGE_WRITE, asynchronous), so the disk works while prepare computes and the fsync at the end waits
    only for the tail. Either way the fsync in atomic_write is what makes the file durable."""

    MAX_PENDING = 4  # bounds the memory held by queued blocks (a few MiB each)
    WRITEBACK_BYTES = 32 << 20

    def __init__(self, handle: BinaryIO, direct: DirectSink | None = None) -> None:
        self.handle = handle
        self._sha256 = hashlib.sha256()
        self.size = 0
        self._pending: list[Any] = []
        self._executor: Any = None
        self._written_back = 0
        self._direct = direct

    @property
    def sha256(self) -> Any:
        self.drain()
        return self._sha256

    def _emit(self, data: bytes | memoryview) -> None:
        if self._direct is not None:
            self._direct.write(data)
            return
        self.handle.write(data)
        if self.size + len(data) - self._written_back >= self.WRITEBACK_BYTES:
            self._start_writeback(self.size + len(data))

    def write(self, data: bytes | memoryview) -> None:
        self.drain()
        self._emit(data)
        self._sha256.update(data)
        self.size += len(data)

    def write_owned(self, data: bytes | memoryview) -> None:
        if _CPUS < 2:
            self.write(data)
            return
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(1, thread_name_prefix="hyperqwen-hash")
        while len(self._pending) >= self.MAX_PENDING:
            self._pending.pop(0).result()
        self._emit(data)
        self._pending.append(self._executor.submit(self._sha256.update, data))
        self.size += len(data)

    def _start_writeback(self, upto: int) -> None:
        # A large write leaves BufferedWriter's buffer empty, so the bytes up to `upto` are in the page cache.
        try:
            fd = self.handle.fileno()
        except (AttributeError, OSError, ValueError):
            return
        if start_writeback(fd, self._written_back, upto - self._written_back):
            self._written_back = upto
        else:
            self._written_back = 1 << 62  # not supported here: stop asking

    def drain(self) -> None:
        """Wait for every queued hash; re-raises the first error."""
        try:
            while self._pending:
                self._pending.pop(0).result()
        finally:
            if not self._pending and self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def finish(self) -> None:
        """Wait for the hashes and put the direct sink's last bytes in the file (before the fsync)."""
        self.drain()
        if self._direct is not None:
            self._direct.finish()

    def abandon(self) -> None:
        """After an error: stop the background work (its errors are moot) and close the direct descriptor."""
        for job in self._pending:
            job.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._pending.clear()
        if self._direct is not None:
            self._direct.close()


class DirectSink:
    """Writes a file through a second, O_DIRECT descriptor: no copy into the page cache and no writeback later.

    In the prepare benchmark's profile (one core, the 2.37 GiB lm_head), the buffered write of the 1.27 GB output
    was 11% of the samples (copy_folio_from_iter_atomic) plus the writeback's block allocation at fsync; here
    `dd bs=16M oflag=direct` wrote 1.3 GB at 1.5 GB/s while `conv=fsync` took 382 MB/s on the same (busy) box.
    Bytes are gathered in page-aligned chunks (O_DIRECT needs aligned memory, offsets and lengths) and one
    background thread writes each full chunk (pwrite releases the GIL, so the disk works while prepare
    computes). `finish` writes the last partial chunk through the ordinary descriptor; the caller's fsync then
    makes the whole file durable (it flushes the drive's cache for the direct writes too). A file system that
    refuses a direct write (EINVAL) gets the same bytes through the ordinary descriptor. The price: the file is
    not left in the page cache, so the server's first load reads it from disk (the int8 lm_head: 1.3 GB)."""

    ALIGN = 4096
    CHUNK = 8 << 20
    BUFFERS = 3

    def __init__(self, direct_fd: int, buffered_fd: int) -> None:
        import mmap
        from concurrent.futures import ThreadPoolExecutor

        self._fd: int | None = direct_fd
        self._buffered_fd = buffered_fd
        self._offset = 0  # file offset of the current chunk's first byte (a multiple of ALIGN)
        self._fill = 0
        # Anonymous maps are page-aligned; 3 chunks: one filling, up to two being written.
        self._maps = [mmap.mmap(-1, self.CHUNK) for _ in range(self.BUFFERS)]
        self._free = [memoryview(m) for m in self._maps]
        self._current = self._free.pop()
        self._pending: list[tuple[Any, memoryview]] = []
        self._executor: Any = ThreadPoolExecutor(1, thread_name_prefix="hyperqwen-direct")

    @staticmethod
    def open(path: Path, buffered_fd: int) -> DirectSink | None:
        """A sink for `path` (already opened for writing as `buffered_fd`), or None where O_DIRECT is missing or
        refused (tmpfs, some network and FUSE file systems)."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | flag)
        except OSError:
            return None
        return DirectSink(fd, buffered_fd)

    def _pwrite(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            try:
                assert self._fd is not None
                done += os.pwrite(self._fd, view[done:], offset + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                done += os.pwrite(self._buffered_fd, view[done:], offset + done)

    def write(self, data: bytes | memoryview) -> None:
        data = memoryview(data).cast("B")
        pos = 0
        while pos < len(data):
            take = min(len(data) - pos, self.CHUNK - self._fill)
            self._current[self._fill : self._fill + take] = data[pos : pos + take]
            self._fill += take
            pos += take
            if self._fill == self.CHUNK:
                self._submit()

    def _submit(self) -> None:
        chunk = self._current
        self._pending.append((self._executor.submit(self._pwrite, chunk, self._offset), chunk))
        self._offset += self.CHUNK
        self._fill = 0
        if not self._free:
            job, free = self._pending.pop(0)
            job.result()
            self._free.append(free)
        self._current = self._free.pop()

    def finish(self) -> None:
        while self._pending:
            job, free = self._pending.pop(0)
            job.result()
            self._free.append(free)
        if self._fill:
            tail = self._current[: self._fill]
            done = 0
            while done < len(tail):
                done += os.pwrite(self._buffered_fd, tail[done:], self._offset + done)
            self._offset += self._fill
            self._fill = 0
        self.close()

    def close(self) -> None:
        for job, _ in self._pending:
            job.cancel()
        self._executor.shutdown(wait=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for view in [self._current, *self._free, *(chunk for _, chunk in self._pending)]:
            view.release()
        self._pending.clear()
        self._free.clear()


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: list[Any] = []


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask Linux to start writing a range of dirty pages to disk without waiting (sync_file_range(2)
    SYNC_FILE_RANGE_WRITE). False where the call is missing or refused; durability never depends on it."""
    if not _sync_file_range:
        try:
            function = ctypes.CDLL(None, use_errno=True).sync_file_range
            function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            function.restype = ctypes.c_int
        except (OSError, AttributeError):
            function = None
        _sync_file_range.append(function)
    function = _sync_file_range[0]
    return function is not None and function(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0


_CPUS = len(os.sched_getaffinity(0))


DIRECT_MIN_BYTES = 64 << 20  # smaller files: an extra descriptor, thread and 24 MiB of chunks are not worth it


@contextmanager
def atomic_write(path: Path, expected_size: int = 0) -> Iterator[HashingWriter]:
    """Write `path` via `<path>.hyperqwen-tmp`: fsync, rename over, fsync the directory.

    On any exception the temp file is removed and `path` is untouched. ENOSPC becomes DiskSpaceError.
    An `expected_size` of DIRECT_MIN_BYTES or more writes through O_DIRECT where the file system allows it.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as handle:
            direct = DirectSink.open(tmp, handle.fileno()) if expected_size >= DIRECT_MIN_BYTES else None
            writer = HashingWriter(handle, direct)
            try:
                yield writer
                writer.finish()
            finally:
                writer.abandon()
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


def load_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object from a state file prepare wrote, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
