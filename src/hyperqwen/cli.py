"""`hyperqwen`: the one command line. Each command lives in its own module and registers itself here.

`hyperqwen --help` lists the commands from the table below without importing them, so a base install
(`pip install hyperqwen`, no extras) answers; choosing a command imports only its module, and a command
whose optional dependencies are missing exits 2 with one line naming the extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hyperqwen import __version__
from hyperqwen.exit_codes import Exit


@dataclass(frozen=True)
class Command:
    module: str  # provides `register(subparsers)`
    help: str
    extra: str | None = None  # the pip extra its dependencies come from, if any


# In the order `--help` lists them.
COMMANDS: dict[str, Command] = {
    "serve": Command("hyperqwen.launch.serve", "start the vLLM server for a mode (or print/explain what would start)"),
    "plan": Command("hyperqwen.memory.cli", "print the GPU memory budget (weights, KV pool, headroom)"),
    "calibrate": Command(
        "hyperqwen.memory.calibrate",
        "boot a mode once on this card; keep vLLM's memory numbers beside the model for plan/serve",
    ),
    "prepare": Command("hyperqwen.prepare.cli", "download and requantize the model into the models folder", "prepare"),
    "draft-vocab-recount": Command(
        "hyperqwen.prepare.draft_vocab",
        "count the token ids a running server generates, for DRAFT_VOCAB_IDS",
        "prepare",
    ),
    "verify": Command("hyperqwen.verify", "check the install, the model and (optionally) a running server"),
    "bench": Command("hyperqwen.bench.cli", "benchmark a running server (speed and correctness gates)", "bench"),
    "monitor": Command("hyperqwen.monitor", "serve the live monitor page for a running server", "bench"),
    "patches": Command("hyperqwen.patches", "apply or check the vLLM patch series"),
    "replicas": Command(
        "hyperqwen.replicas.cli", "check GPUS/TP and write compose.replicas.yaml (one server per card)"
    ),
    "router": Command(
        "hyperqwen.replicas.router", "serve vllm-router in front of the replicas, behind a key gate", "router"
    ),
    "knobs": Command("hyperqwen.docsgen", "regenerate or check .env.example and docs/knobs.md"),
}


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
    for name, command in COMMANDS.items():
        if name == only:
            _import_command(name).register(subparsers)
        else:
            subparsers.add_parser(name, help=command.help, add_help=False)
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
