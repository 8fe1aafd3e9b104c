"""`hyperqwen prepare`: turn the models volume into a servable, verified checkpoint (once)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from hyperqwen.prepare.errors import PrepareError
from hyperqwen.prepare.options import PrepareOptions


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare", help="download, requantize (int8 lm_head/MTP) and verify the model; resumable and crash-safe",
        description="Reads MODELS_DIR, MODEL, MODEL_REPO, MODEL_REVISION, HF_TOKEN, MODEL_SOURCE_DIR, HF_HUB_OFFLINE, "
                    "QUANTIZE_EMBED, DRAFT_VOCAB and DRAFT_VOCAB_IDS from the environment. Re-running is a no-op "
                    "once the model is prepared.",
        allow_abbrev=False)
    parser.add_argument("--verify-only", action="store_true",
                        help="only verify the prepared model directory (tensors, tokenizer, config); write nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    parser.set_defaults(func=run)


def _options_from_environment() -> PrepareOptions:
    return PrepareOptions.from_env(os.environ)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="prepare: %(message)s", stream=sys.stderr)
    log = logging.getLogger("hyperqwen.prepare")
    try:
        options = _options_from_environment()
        if args.no_progress:
            import dataclasses

            options = dataclasses.replace(options, show_progress=False)
        log.info("options: %s", options.describe())
        if args.verify_only:
            from hyperqwen.prepare.verify import verify_checkpoint

            report = verify_checkpoint(Path(options.output_dir))
            log.info("%s verified: %d tensors, %d quantized modules, <think> -> %s", options.output_dir,
                     report.tensors, report.quantized_modules, list(report.think_ids))
            return 0
        from hyperqwen.prepare.pipeline import prepare

        result = prepare(options)
    except PrepareError as exc:
        log.error("%s", exc)
        return 1
    for name, err in sorted(result.quant_errors.items()):
        log.info("  %s: relative Frobenius error %.4f%%", name, err * 100)
    log.info("ready: %s (%s)", result.output_dir, "updated" if result.changed else "already up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperqwen", allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    args = parser.parse_args(["prepare", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)
