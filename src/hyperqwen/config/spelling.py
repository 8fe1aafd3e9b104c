""" "Did you mean": the closest knob, option or name to a misspelled one. A leaf: imports nothing of ours."""

from __future__ import annotations

from collections.abc import Iterable


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance (Levenshtein plus adjacent transpositions)."""
    rows = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        rows[i][0] = i
    for j in range(len(b) + 1):
        rows[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            rows[i][j] = min(rows[i - 1][j] + 1, rows[i][j - 1] + 1, rows[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                rows[i][j] = min(rows[i][j], rows[i - 2][j - 2] + 1)
    return rows[len(a)][len(b)]


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate within a small edit distance (1 for short words, 2 for longer), else None."""
    best: tuple[int, str] | None = None
    upper = word.upper()
    for candidate in candidates:
        limit = 1 if len(candidate) <= 5 else 2
        if abs(len(candidate) - len(word)) > limit:  # the distance is at least the length difference
            continue
        distance = edit_distance(upper, candidate.upper())
        if distance <= limit and (best is None or distance < best[0]):
            best = (distance, candidate)
    return best[1] if best else None
