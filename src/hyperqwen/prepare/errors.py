"""Errors prepare raises: each names what is wrong, the bad value, and what would work."""

from __future__ import annotations


class PrepareError(Exception):
    """A failure the user can act on. `str()` is the whole message; the CLI prints it and exits 1."""

    def __init__(self, message: str, *, fix: str = "", knob: str = "") -> None:
        self.knob = knob
        self.fix = fix
        text = message
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class SourceError(PrepareError):
    """The base checkpoint could not be obtained (network, auth, missing repo, bad local dir)."""


class DiskSpaceError(PrepareError):
    """Not enough free space, found by the preflight or by the kernel (ENOSPC) while writing."""


class CheckpointError(PrepareError):
    """The checkpoint is malformed, of another architecture, or fails verification."""


class QuantizationError(PrepareError):
    """A requantized tensor is too far from the original."""
