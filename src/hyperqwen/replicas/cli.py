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
from hyperqwen.memory.gpu import GpuError, GpuFacts, parse_gpu, read_gpu_facts
from hyperqwen.replicas.compose import OVERRIDE_FILE, render_override
from hyperqwen.replicas.gpus import Gpu, check_gpus, parse_gpu_list, read_available_gpus, replica_groups


def plan_replicas(settings: Settings, available: list[Gpu] | None) -> tuple[list[tuple[str, ...]], list[Problem]]:
    """The replica groups for GPUS/TP, and every problem found (nothing is written when there is one)."""
    gpus, problems = parse_gpu_list(str(settings["GPUS"]))
    tp = int(settings["TP"])
    if not problems:
        problems += check_gpus(gpus, available, tp)
    return replica_groups(gpus, tp), problems


def check_memory(settings: Settings, gpu: GpuFacts | None) -> tuple[list[Problem], tuple[str, ...]]:
    """Every replica runs `hyperqwen serve` with these settings on one card like `gpu`: the verdict `plan`
    and `serve` give (memory/verdict.py), as errors (it would not start) and notes (a chosen MAX_LEN)."""
    from hyperqwen.memory.verdict import judge

    if gpu is None or settings["MEMORY_CHECK"] == "off":
        verdict = judge(settings, None)  # the refusals only (TP, the drafter): no card to plan for
    else:
        verdict = judge(settings, gpu)
    problems = list(verdict.refusals)
    budget = verdict.budget
    if budget is not None and not verdict.refusals and not verdict.starts:
        severity = "warning" if settings["MEMORY_CHECK"] == "warn" else "error"
        problems.append(Problem(severity, f"each replica: {budget.explain_failure()}", "MAX_LEN"))
    return problems, verdict.notes


def planned_card(args: argparse.Namespace) -> GpuFacts | None:
    """The card each replica is planned for: --gpu, else CUDA's first card here (None: no card, not planned)."""
    if getattr(args, "gpu", None):
        return parse_gpu(args.gpu)
    if args.no_device_check:
        return None
    return read_gpu_facts()


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        settings = settings_from_args(args, environ)
        available = None if args.no_device_check else read_available_gpus()
        groups, problems = plan_replicas(settings, available)
        memory_problems, notes = check_memory(settings, planned_card(args))
        problems += memory_problems
    except SettingsError as exc:
        problems, groups, notes = list(exc.problems), [], ()
    except GpuError as exc:
        print(f"hyperqwen replicas: --gpu: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    errors = [p for p in problems if p.severity == "error"]
    for problem in problems:
        print(f"hyperqwen replicas: {problem}", file=sys.stderr)
    if errors:
        print("hyperqwen replicas: nothing was written or started.", file=sys.stderr)
        return Exit.BAD_INPUT
    for note in notes:
        print(f"hyperqwen replicas: each replica: {note}", file=sys.stderr)
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
        "--gpu",
        metavar="CARD",
        help="plan each replica's memory for this card, by name (rtx3090, ...) or CUDA total (23.5GiB); "
        "default: the first card CUDA reports here",
    )
    parser.add_argument(
        "--no-device-check",
        action="store_true",
        help="do not ask nvidia-smi (write the file on a machine without the cards)",
    )
    parser.set_defaults(func=run)
