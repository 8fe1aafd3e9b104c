"""`hyperqwen replicas`: check GPUS and TP before anything starts, then write compose.replicas.yaml."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from hyperqwen.commands import add_command
from hyperqwen.config.load import add_settings_arguments, settings_from_args
from hyperqwen.config.settings import Problem, Settings, SettingsError
from hyperqwen.exit_codes import Exit
from hyperqwen.memory.gpu import GpuError, GpuFacts, add_card_argument, parse_gpu, read_gpu_facts
from hyperqwen.replicas.compose import OVERRIDE_FILE, render_override
from hyperqwen.replicas.gpus import Gpu, check_gpus, parse_gpu_list, read_available_gpus, replica_groups


def plan_replicas(settings: Settings, available: list[Gpu] | None) -> tuple[list[tuple[str, ...]], list[Problem]]:
    """The replica groups for GPUS/TP, and every problem found (nothing is written when there is one)."""
    knobs = settings.knobs
    gpus, problems = parse_gpu_list(knobs.gpus)
    tp = knobs.tp
    if not problems:
        problems += check_gpus(gpus, available, tp)
    return replica_groups(gpus, tp), problems


def check_memory(settings: Settings, gpu: GpuFacts | None) -> tuple[list[Problem], tuple[str, ...]]:
    """Every replica runs `hyperqwen serve` with these settings on one card like `gpu`: the verdict `plan`
    and `serve` give (memory/verdict.py), as errors (it would not start) and notes (a chosen MAX_LEN)."""
    from hyperqwen.memory.verdict import judge

    memory_check = settings.knobs.memory_check
    if gpu is None or memory_check == "off":
        verdict = judge(settings, None)  # the refusals only (TP, the drafter): no card to plan for
    else:
        verdict = judge(settings, gpu)
    problems = list(verdict.refusals)
    budget = verdict.budget
    if budget is not None and not verdict.refusals and not verdict.starts:
        severity = "warning" if memory_check == "warn" else "error"
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
    knobs = settings.knobs
    text = render_override(groups, tp=knobs.tp, port=knobs.port)
    if args.print:
        print(text, end="")
        return Exit.OK
    out = Path(args.output)
    out.write_text(text)
    print(
        f"hyperqwen replicas: wrote {out} ({len(groups)} replica(s), TP={knobs.tp}). Start with:\n"
        f"    docker compose -f compose.yaml -f {out.name} --profile replicas up -d\n"
        f"(or put COMPOSE_FILE=compose.yaml:{out.name} in .env and use --profile replicas)"
    )
    return Exit.OK


# `hyperqwen replicas --help`'s opening paragraph (here, not in the command table: it names OVERRIDE_FILE).
DESCRIPTION = (
    "One HyperQwen server per group of TP cards listed in GPUS, behind vllm-router (docs/multi-gpu.md). Checks "
    f"the cards (nvidia-smi) and TP against the model's heads, then writes {OVERRIDE_FILE}."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "replicas", func=run, description=DESCRIPTION)
    add_settings_arguments(parser, mode=False)
    parser.add_argument("--output", default=OVERRIDE_FILE, help=f"where to write (default: ./{OVERRIDE_FILE})")
    parser.add_argument("--print", action="store_true", help="print the override instead of writing it")
    add_card_argument(parser, "plan each replica's memory for this card", "the first card CUDA reports here")
    parser.add_argument(
        "--no-device-check",
        action="store_true",
        help="do not ask nvidia-smi (write the file on a machine without the cards)",
    )
