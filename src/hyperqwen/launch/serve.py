"""`hyperqwen serve`: resolve settings, build the plan, check it, exec the vLLM OpenAI server."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hyperqwen.config.knobs import KNOBS, MODES
from hyperqwen.launch.command import Plan, build_plan
from hyperqwen.config.apikey import read_api_key
from hyperqwen.config.load import add_settings_arguments, load_settings, parse_overrides  # noqa: F401 (re-exported)
from hyperqwen.config.settings import PLANNER, Problem, Settings, SettingsError

# Inside the image the server listens on all interfaces of the container's own network namespace;
# compose publishes the port on BIND only. Set by the Dockerfile, never by users.
LISTEN_HOST_ENV = "HYPERQWEN_LISTEN_HOST"


def explain(settings: Settings, plan: Plan | None) -> str:
    """Every knob's final value and where it came from; secrets masked."""
    rows = [("KNOB", "VALUE", "SOURCE")]
    for knob in KNOBS:
        setting = settings.setting(knob.name)
        value = setting.display() or "(unset)"
        note = "" if settings.mode in knob.modes else f" [ignored in {settings.mode} mode]"
        rows.append((knob.name, value + note, setting.source))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{name:<{widths[0]}}  {value:<{widths[1]}}  {source}" for name, value, source in rows]
    if plan is not None:
        lines += ["", f"KV cache dtype: {plan.kv_cache_dtype}; max model length: {plan.max_model_len}"]
    lines += [f"{problem}" for problem in settings.problems]
    return "\n".join(lines)


def report(problems: Sequence[Problem]) -> None:
    for problem in problems:
        print(f"hyperqwen: {problem}", file=sys.stderr)


def exec_environment(plan: Plan, environ: Mapping[str, str]) -> dict[str, str]:
    env = {name: value for name, value in environ.items() if name not in plan.unset_env}
    env.update(plan.env)
    return env


def check_model_dir(settings: Settings) -> list[Problem]:
    """The model directory must exist and look like a checkpoint before vLLM spends minutes starting."""
    path = settings.model_path
    if not (path / "config.json").is_file():
        return [Problem("error", f"MODEL={settings['MODEL']}: no checkpoint at {path} (config.json missing). "
                        "Run `docker compose run --rm prepare` (or `hyperqwen prepare`) to create it, or point MODEL "
                        "(and MODELS_DIR) at a prepared checkpoint directory.", "MODEL")]
    return []


def memory_preflight(settings: Settings, plan: Plan, environ: Mapping[str, str], gpu=None) -> Plan:
    """Before vLLM loads anything: does the plan fit the GPU's free memory? Returns the plan to run
    (with MAX_LEN chosen by the planner when the user left it unset and the default does not fit).
    gpu: the card's facts; None reads them (nvidia-smi, torch.cuda)."""
    from hyperqwen.memory import CheckpointError, MemoryPlanError, read_gpu_facts
    from hyperqwen.launch.budget import check_memory

    if settings["MEMORY_CHECK"] == "off":
        return plan
    gpu = gpu or read_gpu_facts()
    if gpu is None:
        print("hyperqwen: no NVIDIA GPU found (nvidia-smi, torch.cuda); memory preflight skipped", file=sys.stderr)
        return plan
    try:
        result = check_memory(settings, gpu)
    except (MemoryPlanError, CheckpointError) as exc:
        raise SettingsError([Problem("error", f"memory preflight: {exc}")]) from None
    if not result.budget.fits:
        message = ("memory preflight: these settings do not fit the GPU's free memory.\n"
                   + result.budget.explain_failure()
                   + "\n(`hyperqwen plan` shows the whole budget; if you measured that it fits, MEMORY_CHECK=warn)")
        if settings["MEMORY_CHECK"] == "warn":
            report([Problem("warning", message, "MEMORY_CHECK")])
            return plan
        raise SettingsError([Problem("error", message, "MAX_LEN")])
    if result.chosen_max_len is not None:
        print(f"hyperqwen: MAX_LEN unset and the default does not fit; the planner chose MAX_LEN="
              f"{result.chosen_max_len} (set MAX_LEN to choose yourself)", file=sys.stderr)
        settings = settings.with_value("MAX_LEN", result.chosen_max_len, PLANNER)
        plan = build_plan(settings, api_key=plan.env.get("VLLM_API_KEY"),
                          listen_host=environ.get(LISTEN_HOST_ENV) or None, python=plan.argv[0])
    return plan


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        settings = load_settings(environ, mode=args.mode, env_file=args.env_file, overrides=args.set or ())
        plan = build_plan(settings, api_key=read_api_key(settings), listen_host=environ.get(LISTEN_HOST_ENV) or None)
    except SettingsError as exc:
        report(exc.problems)
        print("hyperqwen: nothing was started; `hyperqwen serve --explain` shows every setting and its source.",
              file=sys.stderr)
        return 2
    if args.explain:
        print(explain(settings, plan))
        return 0
    if args.print:
        print(plan.shell_command())
        report(settings.warnings)
        return 0
    report(settings.warnings)
    problems = check_model_dir(settings)
    if problems:
        report(problems)
        return 2
    try:
        plan = memory_preflight(settings, plan, environ)
    except SettingsError as exc:
        report(exc.problems)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(plan.argv[0], list(plan.argv), exec_environment(plan, environ))
    return 0  # pragma: no cover - execve does not return


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="start the vLLM server for a mode (or print/explain what would start)",
        description="Resolve the knobs (defaults < mode profile < .env < environment < --set), build the vLLM "
                    "command and exec it.")
    parser.add_argument("--mode", choices=MODES, help="single or batch (default: MODE, else single)")
    parser.add_argument("--print", action="store_true", help="print the exact command and environment; start nothing")
    parser.add_argument("--explain", action="store_true", help="show every setting, its value and its source")
    parser.add_argument("--env-file", help="read knobs from this file (default: ./.env when it exists)")
    parser.add_argument("--set", action="append", metavar="KNOB=VALUE", help="override a knob (repeatable)")
    parser.set_defaults(func=run)
