"""`hyperqwen`: the one command line. Each command lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hyperqwen import __version__

# Modules that provide `register(subparsers)`, in the order `--help` lists them.
COMMAND_MODULES = (
    "hyperqwen.serve",
    "hyperqwen.docsgen",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyperqwen", allow_abbrev=False,
                                     description="Serve Qwen3.8-27B on one 24 GB GPU with vLLM.")
    parser.add_argument("--version", action="version", version=f"hyperqwen {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
