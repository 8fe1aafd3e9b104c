"""Pure answer checks the correctness workloads and gates apply. No I/O, so each is unit-tested directly.

Every check compares *tokens*, never substrings: "11" is not found in "2011", and a server that echoes the
prompt back does not "find" what the prompt contains.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

# Words and numbers (decimals kept whole: "304.8" is one token), the unit of every comparison here.
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:['’][^\W\d_]+)*", re.UNICODE)


def words(text: str) -> list[str]:
    """Lower-cased word and number tokens of text; punctuation, quotes and markup dropped."""
    return [t.lower().replace(",", "") if t[0].isdigit() else t.lower() for t in _TOKEN.findall(text)]


def contains_tokens(text: str, phrase: str) -> bool:
    """True when the tokens of phrase occur contiguously among the tokens of text ("11" is not in "2011")."""
    needle, hay = words(phrase), words(text)
    if not needle:
        return False
    n = len(needle)
    return any(hay[i : i + n] == needle for i in range(len(hay) - n + 1))


def answer_matches(text: str, accepted: Sequence[str], max_extra_tokens: int = 12) -> bool:
    """A short answer: one accepted answer occurs as whole tokens and the reply is not much longer than it
    (a reply that repeats the whole document contains every answer and must not pass)."""
    hay = words(text)
    for answer in accepted:
        target = words(answer)
        if target and contains_tokens(text, answer) and len(hay) <= len(target) + max_extra_tokens:
            return True
    return False


# ---- needle ----------------------------------------------------------------------------------------
_CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: a model cannot be excused for confusing them
CODE_PATTERN = re.compile(r"\b[A-Z2-9]{4}-[A-Z2-9]{4}-[A-Z2-9]{4}\b")


def needle_code(run_id: str, label: str) -> str:
    """A code unique to this run and label (XXXX-XXXX-XXXX), reproducible from both, so a test can know it."""
    digest = hashlib.sha256(f"{run_id}:{label}".encode()).digest()
    chars = [_CODE_ALPHABET[b % len(_CODE_ALPHABET)] for b in digest[:12]]
    return "-".join("".join(chars[i : i + 4]) for i in (0, 4, 8))


def needle_check(reply: str, code: str, max_chars: int = 200) -> dict:
    """Exact match: the reply names exactly one code, the right one, and is short. The prompt carries a
    decoy code too, so a server echoing the prompt (two codes, long) fails, as does one naming the decoy."""
    found = sorted(set(CODE_PATTERN.findall(reply.upper())))
    passed = found == [code] and len(reply.strip()) <= max_chars
    return {"passed": passed, "codes_in_reply": found[:5], "reply_chars": len(reply.strip())}


# ---- greedy reference ------------------------------------------------------------------------------
def greedy_agreement(reference: str, got: str) -> dict:
    """How far two greedy outputs of one prompt agree, in tokens from the start.

    Greedy decoding of one prompt is deterministic in exact arithmetic, but batched GPU kernels reorder
    floating-point sums, so a long output may fork late on a near-tie. The outputs must agree on at least
    half of the shorter one (or 64 tokens); garbage from a broken batch or drafter forks at once."""
    a, b = words(reference), words(got)
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    shorter = min(len(a), len(b))
    agrees = bool(a) and bool(b) and (common >= min(64, shorter) or common >= 0.5 * shorter)
    return {"agrees": agrees, "common_prefix_tokens": common, "reference_tokens": len(a), "tokens": len(b)}
