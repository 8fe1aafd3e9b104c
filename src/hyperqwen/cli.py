"""`hyperqwen`: the one command line. Each command lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hyperqwen import __version__

# Command name -> module providing `register(subparsers)`, in the order `--help` lists them.
# Only the chosen command's module is imported, so `hyperqwen serve` (which execs vLLM) stays light and
# does not need the bench or monitor dependencies.
COMMANDS = {
    "serve": "hyperqwen.launch.serve",
    "plan": "hyperqwen.memory.cli",
    "prepare": "hyperqwen.prepare.cli",
    "draft-vocab-recount": "hyperqwen.prepare.draft_vocab",
    "verify": "hyperqwen.verify",
    "bench": "hyperqwen.bench.cli",
    "monitor": "hyperqwen.monitor",
    "patches": "hyperqwen.patches",
    "knobs": "hyperqwen.docsgen",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyperqwen", allow_abbrev=False,
                                     description="Serve Qwen3.8-27B on one 24 GB GPU with vLLM.")
    parser.add_argument("--version", action="version", version=f"hyperqwen {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(only).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
