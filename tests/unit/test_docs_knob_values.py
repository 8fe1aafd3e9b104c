"""Knob values quoted in the prose docs are checked against the schema (config/knobs.py) and the mode profiles.

The tables are generated (docs/knobs.md, .env.example, the mode READMEs' profile tables: test_docsgen.py); this
covers the prose around them: every `KNOB=VALUE` written in a doc must be a value the knob accepts, and every
one the text calls a default must be the knob's default or a mode profile's value (a mode README: its own mode's).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hyperqwen import docsgen
from hyperqwen.config.knobs import KNOBS_BY_NAME, MODES
from hyperqwen.config.settings import _BadValue, format_value, parse_value, profile_defaults

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted(
    p.relative_to(REPO).as_posix()
    for p in [*REPO.glob("docs/*.md"), REPO / "README.md", *REPO.glob("*/README.md")]
    if p.relative_to(REPO).as_posix() not in docsgen.GENERATED or p.name == "README.md"
)
MODE_OF_README = {path: mode for mode, path in docsgen.MODE_READMES.items()}
_NAMES = "|".join(sorted(KNOBS_BY_NAME, key=len, reverse=True))
ASSIGNMENT = re.compile(rf"(?<![A-Za-z0-9_#])({_NAMES})=([^\s`'\"),;|\]]*)")
# "(default)", "(the default here, `X=1`)", "by default (`X=1`)", "`X=1` (the default here)"
DEFAULT_BEFORE = re.compile(r"default[^.|`]{0,12}[(,:]\s*`?$", re.IGNORECASE)
DEFAULT_AFTER = re.compile(r"^`?\s*\((the )?default", re.IGNORECASE)


def placeholder(value: str) -> bool:
    """`MAX_LEN=N`, `DRAFT=...`, `KEY=<your key>`, `PORT=$PORT`: a shape, not a value."""
    return not value or re.fullmatch(r"[A-Z_]+", value) is not None or any(c in value for c in "<${*") or (
        "..." in value
    )


def quoted_values(relative: str):
    for lineno, line in enumerate((REPO / relative).read_text(encoding="utf-8").splitlines(), start=1):
        for match in ASSIGNMENT.finditer(line):
            value = match.group(2).rstrip(".:")
            if not placeholder(value):
                yield lineno, line, match, value


def allowed_defaults(name: str, mode: str | None) -> set[str]:
    knob = KNOBS_BY_NAME[name]
    values = {format_value(knob, knob.default)} if mode is None else set()
    for each in MODES if mode is None else (mode,):
        values.add(format_value(knob, profile_defaults(each).get(name, knob.default)))
    return values


@pytest.mark.parametrize("relative", DOCS)
def test_every_quoted_knob_value_is_accepted_and_every_quoted_default_is_true(relative):
    wrong = []
    for lineno, line, match, value in quoted_values(relative):
        name = match.group(1)
        try:
            parsed = parse_value(KNOBS_BY_NAME[name], value)
        except _BadValue as exc:
            wrong.append(f"{relative}:{lineno}: {name}={value} {exc}")
            continue
        before, after = line[: match.start()], line[match.end() :]
        if DEFAULT_BEFORE.search(before) or DEFAULT_AFTER.search(after):
            shown = format_value(KNOBS_BY_NAME[name], parsed)
            allowed = allowed_defaults(name, MODE_OF_README.get(relative))
            if shown not in allowed:
                wrong.append(f"{relative}:{lineno}: says {name}={value} is the default; it is {sorted(allowed)}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_stale_default(tmp_path, monkeypatch):
    """The default-claim pattern catches the stale statements it exists for."""
    line = "`SPEC=none` (the default here) and off by default (`THINKING=true`)"
    matches = [m for m in ASSIGNMENT.finditer(line)]
    claims = [m.group(0) for m in matches
              if DEFAULT_BEFORE.search(line[: m.start()]) or DEFAULT_AFTER.search(line[m.end():])]
    assert claims == ["SPEC=none", "THINKING=true"]
    assert "true" not in allowed_defaults("THINKING", None)
    assert allowed_defaults("SPEC", "batch") == {"none"} and "none" not in allowed_defaults("SPEC", "single")
