"""The one rule every API key must pass, the mask shown in its place, and the path-length limits: pure checks, importing nothing of ours,
so settings validation (settings.py) and key loading (apikey.py) share them. apikey.py's docstring says why
the rule is what it is."""

from __future__ import annotations

import re
from pathlib import Path

# What every message, `--print`, `--explain` and report shows in place of a secret: whether it is set, never any
# part of it.
MASK = "****"
MIN_KEY_LENGTH = 16
MAKE_KEY = "openssl rand -hex 16 > models/api_key.txt"
# Longest path and file name Linux accepts (PATH_MAX, NAME_MAX); longer ones fail with ENAMETOOLONG.
PATH_MAX = 4096
NAME_MAX = 255


def key_policy_violation(key: str) -> str | None:
    """What is wrong with `key` (without showing it), or None when it passes the rule."""
    bad = sorted({f"U+{ord(ch):04X}" for ch in key if not 0x21 <= ord(ch) <= 0x7E})
    if bad:
        what = (
            "a space"
            if bad == ["U+0020"]
            else "characters outside printable ASCII (" + ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "") + ")"
        )
        return (
            f"the key contains {what}, which clients cannot send in a header; use only printable ASCII "
            f"without spaces, e.g. `{MAKE_KEY}`"
        )
    if len(key) < MIN_KEY_LENGTH:
        return (
            f"the key has {len(key)} characters; at least {MIN_KEY_LENGTH} are needed (a short key can be "
            f"guessed); make one with `{MAKE_KEY}`"
        )
    return None


def path_problem(path: Path) -> str | None:
    """Why `path` cannot be opened on Linux before even trying (too long), or None."""
    text = str(path)
    if len(text.encode("utf-8", "surrogatepass")) > PATH_MAX:
        return f"the path has {len(text)} characters; Linux allows at most {PATH_MAX} bytes"
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in path.parts), default=0)
    if longest > NAME_MAX:
        return f"a part of the path is {longest} bytes long; Linux allows at most {NAME_MAX} bytes per name"
    return None


def masked(value: object, unset: str = "(unset)") -> str:
    """A secret as it may be shown: MASK when set, `unset` when not."""
    return MASK if value else unset


def mask_assignments(text: str) -> str:
    """`text` with every value after '=' replaced by MASK: for a tool's error message that may echo a key given
    as `--flag=KEY` or `NAME=KEY`."""
    return re.sub(r"=\S+", f"={MASK}", text)
