"""Errors prepare raises: each names what is wrong, the bad value, and what would work.

Exit statuses of `hyperqwen prepare` (also in prepare/README.md):
  0    ready (prepared now, or already up to date)
  1    a problem with the inputs: a knob, the source checkpoint, the hub, the token, quantization quality
  2    command-line usage (argparse)
  3    the file system refused: read-only, no space, no inodes, quota, permission, name too long
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM). Nothing is published half-way; a re-run continues.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from hyperqwen.exit_codes import Exit

# prepare's exit statuses, from the one table (exit_codes.py).
EXIT_OK = Exit.OK
EXIT_INPUT = Exit.FAILED
EXIT_FILESYSTEM = Exit.FILESYSTEM
EXIT_SIGINT = Exit.INTERRUPTED
EXIT_SIGTERM = Exit.TERMINATED


class PrepareError(Exception):
    """A failure the user can act on. `str()` is the whole message; the CLI prints it and exits `exit_code`."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, *, fix: str = "", knob: str = "") -> None:
        self.knob = knob
        self.fix = fix
        text = message
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class SourceError(PrepareError):
    """The base checkpoint could not be obtained (network, auth, missing repo, bad local dir)."""


class FilesystemError(PrepareError):
    """The kernel refused a file operation (EROFS, ENOSPC, EDQUOT, EACCES, ENAMETOOLONG, ...)."""

    exit_code = EXIT_FILESYSTEM


class DiskSpaceError(FilesystemError):
    """Not enough free space, found by the preflight or by the kernel (ENOSPC) while writing."""


class PrepareCheckpointError(PrepareError):
    """The checkpoint is malformed, of another architecture, or fails verification."""


class QuantizationError(PrepareError):
    """A requantized tensor is too far from the original, or holds non-finite values."""


class Interrupted(BaseException):
    """SIGTERM, turned into an exception so that every temp file is removed on the way out (like Ctrl-C)."""


_MODELS_FIX = "or point MODELS_DIR at another disk, then run prepare again (it continues where it stopped)"


def _free_space(path: Path) -> tuple[str, bool]:
    """(" (N GiB free, M free inodes)" for the file system holding path, whether it has no free inode left)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
        st = os.statvfs(probe)
    except OSError:
        return "", False
    inodes = f", {st.f_favail} free inodes" if st.f_files else ""  # f_files == 0: inodes are not counted
    return f" ({usage.free / 2**30:.2f} GiB free{inodes})", bool(st.f_files) and st.f_favail == 0


def _free_text(path: Path) -> str:
    return _free_space(path)[0]


def filesystem_error(exc: OSError) -> FilesystemError:
    """One line naming the path and the fix for an OSError from the file system."""
    path = Path(exc.filename) if exc.filename else None
    where = str(path) if path else "(unknown path)"
    code = exc.errno
    if code == errno.EROFS:
        return FilesystemError(
            f"{where}: the file system is read-only",
            fix="mount the models volume read-write (drop ':ro' from the compose mount) " + _MODELS_FIX,
        )
    if code == errno.ENOSPC:
        detail, no_inodes = _free_space(path) if path else ("", False)
        what = "no free inodes left" if no_inodes else "no space left"
        return DiskSpaceError(
            f"{where}: {what} on its file system{detail}",
            fix=("delete files there (or remount a tmpfs with more inodes) " if no_inodes else "free space there ")
            + _MODELS_FIX,
        )
    if code == errno.EDQUOT:
        return DiskSpaceError(
            f"{where}: disk quota exceeded{_free_text(path) if path else ''}",
            fix="raise the quota or free space in it " + _MODELS_FIX,
        )
    if code in (errno.EACCES, errno.EPERM):
        return FilesystemError(
            f"{where}: permission denied for user {os.getuid()}",
            fix=f"make it writable for uid {os.getuid()} (chown/chmod the models folder) " + _MODELS_FIX,
        )
    if code == errno.ENAMETOOLONG:
        return FilesystemError(
            f"{where}: file name too long for this file system", fix="use a shorter MODELS_DIR or MODEL"
        )
    if code == errno.ENOMEM:
        return FilesystemError(
            f"{where}: out of memory in the kernel ({exc.strerror})",
            fix="free memory (or tmpfs space) and run prepare again",
        )
    return FilesystemError(
        f"{where}: {exc.strerror or exc}", fix="check that path and run prepare again (it continues where it stopped)"
    )
