"""`hyperqwen serve`: settings -> memory budget -> vLLM command line -> print, explain or exec.

One way through: `prepare_launch` decides the memory budget (and with it the context length) first,
then builds the command line once; `--print` prints that command, `--explain` explains it, and the exec
runs it. Nothing is computed twice.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hyperqwen.commands import add_command
from hyperqwen.config.apikey import describe_api_key, read_api_key
from hyperqwen.config.knobs import KNOBS
from hyperqwen.config.load import add_settings_arguments, settings_from_args
from hyperqwen.config.settings import PLANNER, Problem, Settings, SettingsError, listen_host
from hyperqwen.exit_codes import Exit
from hyperqwen.launch.budget import BudgetOutcome, LaunchBudget, decide_budget
from hyperqwen.launch.command import (
    VllmCommand,
    build_command,
    check_command,
    check_command_with_vllm,
    gdn_prefill_fallback,
)
from hyperqwen.memory.gpu import add_card_argument

if TYPE_CHECKING:
    from hyperqwen.memory import GpuFacts
    from hyperqwen.memory.host import HostFacts


@dataclass(frozen=True)
class Launch:
    """Everything one start decides: the settings, the memory decision, and the one command it runs."""

    settings: Settings
    budget: LaunchBudget
    command: VllmCommand
    # Why GDN_PREFILL=auto chose Triton on this machine (said at start), or None.
    gdn_reason: str | None = None

    @property
    def notes(self) -> list[str]:
        """What the start says besides the command: the memory decision's notes, then the kernel choice."""
        return [*self.budget.notes, *filter(None, [self.gdn_reason])]


GpuReader = Callable[[], "GpuFacts | None"]


def probe_gdn_prefill() -> str | None:
    """GDN_PREFILL=auto on this machine: gdn_prefill_fallback() over the card's compute capability and
    whether the CuTe DSL package is installed (looked up, not imported: importing it costs seconds)."""
    import importlib.util

    from hyperqwen.memory.gpu import compute_capability

    return gdn_prefill_fallback(compute_capability(), importlib.util.find_spec("cutlass") is not None)


def read_gpu() -> GpuFacts | None:
    """The card vLLM will see (hyperqwen.memory's reader), or None without a GPU."""
    from hyperqwen.memory import read_gpu_facts

    return read_gpu_facts()


def read_host(settings: Settings) -> HostFacts | None:
    """This machine's RAM, read only when RAM_CACHE asks for some of it."""
    if settings.knobs.ram_cache is None:
        return None
    from hyperqwen.memory.host import read_host_facts

    return read_host_facts()


def check_model_fit(settings: Settings) -> list[Problem]:
    """Checks of the model files the settings name, before vLLM would fail on them with a stack trace:
    TP must divide the model's heads; a DFlash2 drafter must match the target (hidden size, vocabulary).
    The same refusals `plan`, `verify` and `replicas` make (memory/verdict.py)."""
    from hyperqwen.memory.verdict import model_refusals

    return model_refusals(settings)


def prepare_launch(
    settings: Settings,
    environ: Mapping[str, str],
    gpu: GpuFacts | None,
    host: HostFacts | None = None,
    *,
    preview: bool = False,
    gdn_reason: str | None = None,
) -> Launch:
    """Decide the budget, then build the command from that decision. Pure given `gpu`, `host` and
    `gdn_reason` (gdn_prefill_fallback()'s answer for this machine).

    preview (--print/--explain): a DFlash2 drafter that is not downloaded yet is a warning (the command is
    still shown, the memory is not planned: the drafter's shapes are unknown); for a real start it is an error.
    """
    from hyperqwen.memory.verdict import drafter_missing

    problems = check_model_fit(settings)
    missing = drafter_missing(settings)
    if missing and not preview:
        problems.append(Problem("error", missing, "DRAFT"))
    if problems:
        raise SettingsError(problems)
    api_key = read_api_key(settings)
    if missing:
        configured = settings.configured_max_model_len
        budget = LaunchBudget(configured, BudgetOutcome.NOT_CHECKED, notes=(f"warning: {missing}",))
    else:
        budget = decide_budget(settings, gpu, host)
    command = build_command(
        settings,
        max_model_len=budget.max_model_len,
        api_key=api_key,
        listen_host=listen_host(environ, settings.knobs.bind),
        gdn_prefill_fallback=gdn_reason is not None,
    )
    return Launch(settings, budget, command, gdn_reason)


def explain(launch: Launch) -> str:
    """Every knob's final value and where it came from (secrets masked), then the memory decision."""
    settings = launch.settings
    rows = [("KNOB", "VALUE", "SOURCE")]
    for knob in KNOBS:
        setting = settings.setting(knob.name)
        value = setting.display() or "(unset)"
        note = "" if settings.mode in knob.modes else f" [ignored in {settings.mode} mode]"
        rows.append((knob.name, value + note, setting.source))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{name:<{widths[0]}}  {value:<{widths[1]}}  {source}" for name, value, source in rows]
    # Where the key comes from (a file path, never the key): VLLM_API_KEY alone says "(unset)" when it is a file.
    lines += ["", f"API key: {describe_api_key(settings)}"]
    lines += [
        "",
        f"KV cache dtype: {launch.command.kv_cache_dtype}; max model length: {launch.command.max_model_len}",
        launch.budget.summary(),
        *launch.notes,
    ]
    from hyperqwen.spec.explain import spec_lines

    lines += spec_lines(settings, launch.budget, launch.command.vllm_args)
    lines += [f"{problem}" for problem in settings.problems]
    return "\n".join(lines)


def report(problems: Sequence[Problem]) -> None:
    from hyperqwen.config.names import already_reported

    for problem in problems:
        if not already_reported(problem.message):  # `hyperqwen` printed its "did you mean" lines already
            print(f"hyperqwen: {problem}", file=sys.stderr)


def refuse_start(problems: Sequence[Problem], said: str = "nothing was started.") -> int:
    """Report the problems, then what that means for the start; the exit code the command returns."""
    report(problems)
    print(f"hyperqwen: {said}", file=sys.stderr)
    return Exit.BAD_INPUT


def exec_environment(command: VllmCommand, environ: Mapping[str, str]) -> dict[str, str]:
    env = {name: value for name, value in environ.items() if name not in command.unset_env}
    env.update(command.env)
    return env


def write_server_environment(launch: Launch, environ: Mapping[str, str]) -> dict[str, str]:
    """Write the facts the bench's field report reads from the server (GPU, versions, patches, model
    checksum, the knobs in effect with secrets masked) for the authenticated /hyperqwen/environment route.
    Returns the variable that tells the route where the file is. Best effort: a failure never blocks a start."""
    from pathlib import Path

    from hyperqwen.launch.serverside import ENVIRONMENT_FILE_ENV, default_environment_path, write_environment_file

    settings = launch.settings
    knobs = settings.knobs
    path = Path(environ.get(ENVIRONMENT_FILE_ENV) or default_environment_path(knobs.port))
    if knobs.max_len != launch.budget.max_model_len:  # the knobs as they run, MAX_LEN included
        settings = settings.with_value("MAX_LEN", launch.budget.max_model_len, PLANNER)
    try:
        write_environment_file(path, settings, settings.model_path)
    except (OSError, ValueError) as exc:
        print(
            f"hyperqwen: warning: could not write the server environment file {path} ({exc}); the bench's "
            "field report will lack the server's GPU facts",
            file=sys.stderr,
        )
        return {}
    return {ENVIRONMENT_FILE_ENV: str(path)}


def check_model_dir(settings: Settings) -> list[Problem]:
    """The model directory must exist and look like a checkpoint before vLLM spends minutes starting."""
    path = settings.model_path
    if not (path / "config.json").is_file():
        return [
            Problem(
                "error",
                f"MODEL={settings.knobs.model}: no checkpoint at {path} (config.json missing). "
                "Run `docker compose run --rm prepare` (or `hyperqwen prepare`) to create it, or point MODEL "
                "(and MODELS_DIR) at a prepared checkpoint directory.",
                "MODEL",
            )
        ]
    return []


def check_extra_args_with_vllm(settings: Settings) -> list[Problem]:
    """EXTRA_ARGS also goes through vLLM's own parser, where vLLM is installed (the image).

    The settings check (config/extra_args.py) already refused what it could from a table generated from
    that parser; this is the parser itself, so a vLLM that parses differently from the table cannot let an
    owned option or a stray word through. Skipped when EXTRA_ARGS is empty.
    """
    extra_args = settings.knobs.extra_args
    if not extra_args:
        return []
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return []
    from hyperqwen.config.extra_args import check_with_vllm_parser

    return [Problem("error", f"EXTRA_ARGS {message}", "EXTRA_ARGS") for message in check_with_vllm_parser(extra_args)]


def check_before_start(launch: Launch) -> list[Problem]:
    """The one check `--print`, `--explain` and the real start share, so what one accepts the others accept:
    the WHOLE final argv read as vLLM's parser reads it (its option table), with every owned setting (host,
    port, model, served name, key, socket) required to come out exactly as HyperQwen decided."""
    return [Problem("error", message, "EXTRA_ARGS") for message in check_command(launch.command)]


def check_with_vllm_before_exec(launch: Launch) -> list[Problem]:
    """Right before the exec, where vLLM is installed: EXTRA_ARGS and then the whole argv through vLLM's own
    parser (the same verdicts as check_before_start, from the parser itself rather than its table)."""
    problems = check_extra_args_with_vllm(launch.settings)
    if problems:
        return problems
    return [Problem("error", message, "EXTRA_ARGS") for message in check_command_with_vllm(launch.command)]


Exec = Callable[[str, list[str], dict[str, str]], object]


def run(
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    *,
    gpu_reader: GpuReader = read_gpu,
    gdn_prober: Callable[[], str | None] = probe_gdn_prefill,
    execve: Exec = os.execve,
) -> int:
    """The command. gpu_reader, gdn_prober and execve are the I/O edges, replaceable in tests."""
    environ = os.environ if environ is None else environ
    card = getattr(args, "gpu", None)
    if card and card != "auto":
        if not (args.print or args.explain):
            print(
                "hyperqwen serve: --gpu plans for a card that is not here; use it with --print or --explain",
                file=sys.stderr,
            )
            return Exit.BAD_INPUT
        from hyperqwen.memory import GpuError, parse_gpu

        try:
            planned = parse_gpu(card)
        except GpuError as exc:
            print(f"hyperqwen serve: {exc}", file=sys.stderr)
            return Exit.BAD_INPUT
        gpu_reader = lambda: planned  # noqa: E731
        gdn_prober = lambda: None  # noqa: E731 - a planned card is not this machine's
    try:
        settings = settings_from_args(args, environ)
        if not (args.print or args.explain):
            report(settings.warnings)
            model_problems = check_model_dir(settings)
            if model_problems:
                report(model_problems)
                return Exit.BAD_INPUT
        knobs = settings.knobs
        gpu = None if knobs.memory_check == "off" else gpu_reader()
        gdn_reason = gdn_prober() if knobs.gdn_prefill == "auto" else None
        launch = prepare_launch(
            settings,
            environ,
            gpu,
            read_host(settings) if gpu is not None else None,
            preview=args.print or args.explain,
            gdn_reason=gdn_reason,
        )
    except SettingsError as exc:
        return refuse_start(
            exc.problems, "nothing was started; `hyperqwen serve --explain` shows every setting and its source."
        )
    problems = check_before_start(launch)
    if problems:
        return refuse_start(problems)
    if args.explain:
        print(explain(launch))
        return Exit.OK
    if args.print:
        print(launch.command.shell_command())
        report(settings.warnings)
        for note in launch.notes:
            print(f"hyperqwen: {note}", file=sys.stderr)
        return Exit.OK
    problems = check_with_vllm_before_exec(launch)
    if problems:
        return refuse_start(problems)
    print(f"hyperqwen: {launch.budget.summary()}", file=sys.stderr)
    for note in launch.notes:
        print(f"hyperqwen: {note}", file=sys.stderr)
    if launch.budget.outcome is BudgetOutcome.DOES_NOT_FIT:
        print("hyperqwen: starting anyway because MEMORY_CHECK=warn", file=sys.stderr)
    env = exec_environment(launch.command, environ)
    env.update(write_server_environment(launch, environ))
    sys.stdout.flush()
    sys.stderr.flush()
    execve(launch.command.argv[0], list(launch.command.argv), env)
    return Exit.OK  # pragma: no cover - execve does not return


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "serve", func=run)
    add_settings_arguments(parser)
    parser.add_argument("--print", action="store_true", help="print the exact command and environment; start nothing")
    parser.add_argument("--explain", action="store_true", help="show every setting, its value and its source")
    add_card_argument(
        parser,
        "with --print/--explain, plan for this card instead of the one here",
        default="auto",
        default_text="the card CUDA reports",
    )
