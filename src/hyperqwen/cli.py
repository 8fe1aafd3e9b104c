"""`hyperqwen`: the one command line. Each command lives in its own module and registers itself here.

`hyperqwen --help` lists the commands from the table in `hyperqwen.commands` without importing them, so a
base install (`pip install hyperqwen`, no extras) answers; choosing a command imports only its module, and a
command whose optional dependencies are missing exits 2 with one line naming the extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence

from hyperqwen import __version__
from hyperqwen.commands import COMMANDS, add_command
from hyperqwen.exit_codes import Exit


class MissingExtraError(SystemExit):
    pass


def _missing_extra(name: str, exc: ModuleNotFoundError) -> MissingExtraError:
    """One line naming the package and the extra that brings it; a missing module of our own is a bug: re-raise."""
    missing = exc.name or "a dependency"
    if missing.split(".")[0] == "hyperqwen":
        raise exc
    extra = COMMANDS[name].extra or "all"
    print(
        f"hyperqwen {name}: needs the Python package {missing!r}, which is not installed; "
        f"install it with: pip install 'hyperqwen[{extra}]'",
        file=sys.stderr,
    )
    return MissingExtraError(2)


def _import_command(name: str):
    try:
        return importlib.import_module(COMMANDS[name].module)
    except ModuleNotFoundError as exc:
        raise _missing_extra(name, exc) from None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; `only` names the one command whose module is imported (None: none, for --help)."""
    parser = argparse.ArgumentParser(
        prog="hyperqwen",
        allow_abbrev=False,
        description="Serve Qwen3.8-27B on one 24 GB GPU with vLLM.",
        epilog="`hyperqwen COMMAND --help` shows a command's options. `hyperqwen` without a command prints this "
        "list and exits with status 2 (usage); a command's own exit statuses are in its --help.",
    )
    parser.add_argument("--version", action="version", version=f"hyperqwen {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if name == only:
            _import_command(name).register(subparsers)
        else:
            add_command(subparsers, name, add_help=False)
    return parser


def warn_about_unknown_names(args: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Before any command runs: one "did you mean" line per variable in `.env` or the environment that is not a
    knob but looks meant as one. A `.env` that cannot be read is left to the command, which names the problem."""
    from hyperqwen.config.load import read_env_layer
    from hyperqwen.config.names import report_unknown_names, unknown_names
    from hyperqwen.config.settings import SettingsError

    try:
        env_values, _ = read_env_layer(getattr(args, "env_file", None))
    except SettingsError:
        env_values = {}
    report_unknown_names(unknown_names(env_values, environ))


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: the command's; 2 for usage errors. Bare `hyperqwen` lists the commands and exits 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        build_parser().print_help()
        return Exit.BAD_INPUT
    only = argv[0] if argv[0] in COMMANDS else None
    try:
        args = build_parser(only).parse_args(argv)
    except MissingExtraError as exc:
        return int(exc.code or 2)
    warn_about_unknown_names(args, os.environ)
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:  # imported late, when the command needs it (numpy, aiohttp, ...)
        return int(_missing_extra(args.command, exc).code or 2)


if __name__ == "__main__":
    sys.exit(main())
