"""`hyperqwen replicas`: check GPUS and TP before anything starts, then write compose.replicas.yaml."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from hyperqwen.config.load import add_settings_arguments, settings_from_args
from hyperqwen.config.settings import Problem, Settings, SettingsError
from hyperqwen.exit_codes import Exit
from hyperqwen.memory.parallel import check_tp
from hyperqwen.replicas.compose import OVERRIDE_FILE, render_override
from hyperqwen.replicas.gpus import Gpu, check_gpus, parse_gpu_list, read_available_gpus, replica_groups


def plan_replicas(settings: Settings, available: list[Gpu] | None) -> tuple[list[tuple[str, ...]], list[Problem]]:
    """The replica groups for GPUS/TP, and every problem found (nothing is written when there is one)."""
    gpus, problems = parse_gpu_list(str(settings["GPUS"]))
    tp = int(settings["TP"])
    if not problems:
        problems += check_gpus(gpus, available, tp)
    problems += check_tp(settings)
    return replica_groups(gpus, tp), problems


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        settings = settings_from_args(args, environ)
        available = None if args.no_device_check else read_available_gpus()
        groups, problems = plan_replicas(settings, available)
    except SettingsError as exc:
        problems, groups = list(exc.problems), []
    errors = [p for p in problems if p.severity == "error"]
    for problem in problems:
        print(f"hyperqwen replicas: {problem}", file=sys.stderr)
    if errors:
        print("hyperqwen replicas: nothing was written or started.", file=sys.stderr)
        return Exit.BAD_INPUT
    if available is None and not args.no_device_check:
        print(
            "hyperqwen replicas: nvidia-smi is not available here, so GPUS was not checked against the machine's cards",
            file=sys.stderr,
        )
    text = render_override(groups, tp=int(settings["TP"]), port=int(settings["PORT"]))
    if args.print:
        print(text, end="")
        return Exit.OK
    out = Path(args.output)
    out.write_text(text)
    print(
        f"hyperqwen replicas: wrote {out} ({len(groups)} replica(s), TP={settings['TP']}). Start with:\n"
        f"    docker compose -f compose.yaml -f {out.name} --profile replicas up -d\n"
        f"(or put COMPOSE_FILE=compose.yaml:{out.name} in .env and use --profile replicas)"
    )
    return Exit.OK


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replicas",
        help="check GPUS/TP and write compose.replicas.yaml (one server per card)",
        description="One HyperQwen server per group of TP cards listed in GPUS, behind vllm-router "
        "(docs/multi-gpu.md). Checks the cards (nvidia-smi) and TP against the model's heads, then "
        f"writes {OVERRIDE_FILE}.",
    )
    add_settings_arguments(parser, mode=False)
    parser.add_argument("--output", default=OVERRIDE_FILE, help=f"where to write (default: ./{OVERRIDE_FILE})")
    parser.add_argument("--print", action="store_true", help="print the override instead of writing it")
    parser.add_argument(
        "--no-device-check",
        action="store_true",
        help="do not ask nvidia-smi (write the file on a machine without the cards)",
    )
    parser.set_defaults(func=run)
