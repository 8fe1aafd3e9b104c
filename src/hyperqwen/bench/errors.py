"""The bench's user-facing error, importable without the bench extra (aiohttp) so `--help` always works."""

from __future__ import annotations

from hyperqwen.config.keyrule import masked

EXTRA_HINT = "pip install 'hyperqwen[bench]'"


class BenchError(RuntimeError):
    """A problem the user must fix (unreachable server, bad key, bad input); printed without a traceback."""


def mask_key(key: str | None) -> str:
    """What a message may say about an API key: whether there is one, never any part of it."""
    return masked(key, "(none)")
