"""`.env` files, read by python-dotenv: the same rules for every command that reads one.

python-dotenv follows the rules Docker Compose documents for `.env` (KEY=VALUE, optional `export`,
single/double quotes, `#` comments after a space, no shell expansion of single-quoted values), so a
file that works with `docker compose` means the same to `hyperqwen`.
"""

from __future__ import annotations

import io
from pathlib import Path

from dotenv import dotenv_values


class EnvFileError(ValueError):
    """The file cannot be read as a .env file; the message names the file and line."""


def read_env_file(path: Path) -> dict[str, str]:
    """NAME -> value for every assignment in `path`. A line that is not NAME=VALUE is an error naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EnvFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise EnvFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        body = stripped[len("export ") :].lstrip() if stripped.startswith("export ") else stripped
        name, sep, _ = body.partition("=")
        if not sep or not name.strip().isidentifier():
            raise EnvFileError(f"{path}:{lineno}: expected NAME=value, got {stripped[:60]!r}")
    values = dotenv_values(stream=io.StringIO(text), interpolate=False)
    return {name: (value if value is not None else "") for name, value in values.items()}
