"""`hyperqwen prepare`: turn the models volume into a servable, verified checkpoint (once)."""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import gc
import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hyperqwen.commands import add_command
from hyperqwen.exit_codes import Exit
from hyperqwen.prepare.errors import (
    EXIT_FILESYSTEM,
    EXIT_INPUT,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    FilesystemError,
    Interrupted,
    PrepareError,
    filesystem_error,
)

if TYPE_CHECKING:
    from hyperqwen.config.settings import Settings
    from hyperqwen.prepare.options import PrepareOptions

EXIT_STATUSES = (
    f"exit status: {EXIT_OK} ready; {EXIT_INPUT} a problem with a knob, the source, the hub or the token; "
    f"{Exit.BAD_INPUT} usage; {EXIT_FILESYSTEM} the file system refused (read-only, full, no inodes, permission, "
    f"name too long); {EXIT_SIGINT} Ctrl-C; {EXIT_SIGTERM} SIGTERM. Nothing is published half-way; "
    "a re-run continues where the last one stopped."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    from hyperqwen.config.load import add_settings_arguments

    parser = add_command(subparsers, "prepare", func=run, epilog=EXIT_STATUSES, allow_abbrev=False)
    add_settings_arguments(parser)
    parser.add_argument(
        "--verify-only",
        action="store_true",
        help="only verify the prepared model directory (tensors, tokenizer, config); write nothing",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")


_AT_EXIT: list[Any] = []


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="prepare: %(message)s", stream=sys.stderr)
    log = logging.getLogger("hyperqwen.prepare")
    # Whatever is alive at exit (numba's type registry: hundreds of thousands of objects) is frozen first, so the
    # interpreter's final collection does not walk it: 4.75% -> 0.84% of a one-core lm_head prepare's samples
    # in gc_collect_main (perf, prepare benchmark workload). Every output is closed and fsynced before exit.
    if gc.freeze not in _AT_EXIT:
        _AT_EXIT.append(gc.freeze)
        atexit.register(gc.freeze)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run(args, log)
    except KeyboardInterrupt:
        log.error("interrupted (Ctrl-C): nothing was published half-way; run prepare again to continue")
        return EXIT_SIGINT
    except Interrupted:
        log.error("terminated (SIGTERM): nothing was published half-way; run prepare again to continue")
        return EXIT_SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, log: logging.Logger) -> int:
    from hyperqwen.prepare.options import PrepareOptions, resolve_settings_from_args

    try:
        # Resolved once for the options and the drafter choice (each resolution takes ~0.1 s: cProfile).
        settings = resolve_settings_from_args(args)
        options = PrepareOptions.from_settings(settings)
        if args.no_progress:
            options = dataclasses.replace(options, show_progress=False)
        log.info("options: %s", options.describe())
        if args.verify_only:
            from hyperqwen.prepare.verify import verify_checkpoint

            report = verify_checkpoint(Path(options.output_dir))
            log.info(
                "%s verified: %d tensors, %d quantized modules, <think> -> %s",
                options.output_dir,
                report.tensors,
                report.quantized_modules,
                list(report.think_ids),
            )
            return EXIT_OK
        from hyperqwen.prepare.pipeline import prepare

        result = prepare(options)
        drafter = _fetch_drafter_if_wanted(args, options, log, settings)
    except PrepareError as exc:
        log.error("%s", exc)
        return exc.exit_code
    except OSError as exc:  # --verify-only and option loading read files too
        if not isinstance(exc.errno, int):
            raise
        error: FilesystemError = filesystem_error(exc)
        log.error("%s", error)
        return error.exit_code
    for name, err in sorted(result.quant_errors.items()):
        log.info("  %s: relative Frobenius error %.4f%%", name, err * 100)
    log.info("ready: %s (%s)", result.output_dir, "updated" if result.changed else "already up to date")
    if drafter is not None:
        log.info("drafter ready: %s (DRAFT=%s)", drafter, drafter.name)
    return EXIT_OK


def _fetch_drafter_if_wanted(
    args: argparse.Namespace, options: PrepareOptions, log: logging.Logger, settings: Settings | None = None
) -> Path | None:
    """PREPARE_DRAFTER: auto fetches the DFlash2 drafter when SPEC=dflash2, on always, off never."""
    import os

    from hyperqwen.config.load import settings_from_args

    if settings is None:
        settings = settings_from_args(args, os.environ)
    knobs = settings.knobs
    wanted = knobs.prepare_drafter
    if wanted == "off" or (wanted == "auto" and knobs.spec != "dflash2"):
        return None
    from hyperqwen.prepare.drafter import fetch_drafter

    log.info("fetching the DFlash2 drafter (PREPARE_DRAFTER=%s, SPEC=%s)", wanted, knobs.spec)
    return fetch_drafter(options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperqwen", allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    args = parser.parse_args(["prepare", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


__all__ = ["EXIT_STATUSES", "main", "register", "run"]
