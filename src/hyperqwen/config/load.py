"""The one way every command loads settings: defaults < mode profile < `.env` < environment < `--set`.

`add_settings_arguments` gives a command the same flags (`--mode`, `--env-file`, `--set`), and
`load_settings` is the I/O edge around the pure `resolve_settings`: it reads the `.env` file (the
`--env-file` given, else `./.env` when it exists) and nothing else.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from hyperqwen.config.envfile import EnvFileError, read_env_file
from hyperqwen.config.knobs import MODES
from hyperqwen.config.settings import Problem, Settings, SettingsError, resolve_settings

DEFAULT_ENV_FILE = Path(".env")


def add_settings_arguments(parser: argparse.ArgumentParser, *, mode: bool = True) -> None:
    """The settings flags every command that reads knobs takes, with the same meaning everywhere."""
    if mode:
        parser.add_argument("--mode", choices=MODES, help="single or batch (default: MODE, else single)")
    parser.add_argument("--env-file", metavar="FILE", help="read knobs from this file (default: ./.env when it exists)")
    parser.add_argument(
        "--set",
        action="append",
        metavar="KNOB=VALUE",
        default=None,
        help="override a knob for this run (repeatable); wins over .env and the environment",
    )


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """`--set KNOB=VALUE` pairs -> a mapping; a pair without '=' is one clear error."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise SettingsError([Problem("error", f"--set {pair!r}: expected KNOB=VALUE, e.g. --set MAX_LEN=32768")])
        overrides[name.strip()] = value
    return overrides


def read_env_layer(
    env_file: str | Path | None, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], Path | None]:
    """The `.env` layer: the file given (it must exist), else ./.env when present, else nothing.
    environ: what `${VAR}` in the file sees first, as compose does (default: this process's environment)."""
    if env_file is not None:
        path = Path(env_file)
        if not path.is_file():
            raise SettingsError(
                [
                    Problem(
                        "error",
                        f"--env-file {env_file}: no such file; copy .env.example to .env or leave --env-file out",
                    )
                ]
            )
    elif DEFAULT_ENV_FILE.is_file():
        path = DEFAULT_ENV_FILE
    else:
        return {}, None
    try:
        return read_env_file(path, environ), path
    except EnvFileError as exc:
        raise SettingsError([Problem("error", str(exc))]) from None


def load_settings(
    environ: Mapping[str, str],
    *,
    mode: str | None = None,
    env_file: str | Path | None = None,
    overrides: Sequence[str] | Mapping[str, str] = (),
) -> Settings:
    """Resolve every knob from the defaults, the mode profile, the .env file, `environ` and the overrides."""
    env_values, env_path = read_env_layer(env_file, environ)
    pairs = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    return resolve_settings(environ, mode=mode, env_file=env_values, overrides=pairs, env_file_path=env_path)


def load_only(environ: Mapping[str, str], names: Iterable[str]) -> Settings:
    """load_settings (defaults < mode profile < ./.env < environment) for the knobs `names` alone: every other
    knob keeps its default, so a bad value of one of them, left to the command that reads it, cannot fail this
    load. MODE picks the profile only when it is one of `names` (else single's applies). For the container
    entrypoint, which acts before any command and must not stop on a knob it does not read."""
    wanted = set(names)
    env_values, env_path = read_env_layer(None, environ)
    return resolve_settings(
        {name: value for name, value in environ.items() if name in wanted},
        env_file={name: value for name, value in env_values.items() if name in wanted},
        env_file_path=env_path,
    )


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """load_settings with the flags `add_settings_arguments` added."""
    return load_settings(
        environ,
        mode=getattr(args, "mode", None),
        env_file=getattr(args, "env_file", None),
        overrides=getattr(args, "set", None) or (),
    )
