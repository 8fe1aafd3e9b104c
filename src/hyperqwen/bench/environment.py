"""The environment block every result file carries: what was measured, on what, with which settings."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from hyperqwen.bench import prom

REPO_ROOT = Path(__file__).resolve().parents[3]


def project_commit(repo: Path = REPO_ROOT) -> str | None:
    """`git rev-parse HEAD` (+ '-dirty' when tracked files changed); None outside a git checkout."""
    if not (repo / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def _project_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("hyperqwen")
    except ImportError:  # PackageNotFoundError is one: not installed (bare checkout on PYTHONPATH)
        return None


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def gpu_facts() -> list[dict] | None:
    """GPU name, driver and power limit from nvidia-smi on the bench host; None when unreadable."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,power.limit,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            gpus.append({"name": parts[0], "driver": parts[1], "power_limit": parts[2], "memory_total": parts[3]})
    return gpus or None


def _knob_names() -> tuple[list[str], set[str]]:
    try:
        from hyperqwen.config.knobs import KNOBS
        return [k.name for k in KNOBS], {k.name for k in KNOBS if k.secret}
    except ImportError:  # the bench also works from a bare checkout without the launcher
        return [], {"VLLM_API_KEY", "HF_TOKEN"}


def read_env_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        raise FileNotFoundError(f"--env-file {path}: no such file")
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip().removeprefix("export ").strip()
        values[key] = value.strip().strip("'\"")
    return values


def knob_values(env_file: Path | None = None) -> dict[str, str]:
    """Our knobs as set in the env file (or this process's environment), secrets masked."""
    names, secrets = _knob_names()
    source = read_env_file(env_file) if env_file else dict(os.environ)
    wanted = names or sorted(source)
    out = {}
    for name in wanted:
        if name in source:
            out[name] = "***" if name in secrets and source[name] else source[name]
    return out


def build_environment(*, version: str | None, metrics_text: str | None, server_log: Path | None,
                      env_file: Path | None, hardware: str | None, label: str | None) -> dict:
    gpus = gpu_facts()
    pool = prom.pool_size_from_metrics(metrics_text) if metrics_text else None
    if (pool is None or pool.get("pool_tokens") is None) and server_log is not None and server_log.is_file():
        pool = prom.pool_size_from_log(server_log.read_text(errors="replace")) or pool
    if hardware is None:
        hardware = "gpu" if gpus else "cpu"
    return {
        "label": label,
        "hardware": hardware,
        "timestamp_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "project_commit": project_commit(),
        "project_version": _project_version(),
        "vllm_version": version,
        "gpus": gpus,
        "gpu_note": None if gpus else "nvidia-smi not readable on the bench host",
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cpus": os.cpu_count(),
                 # Other load on the bench host skews numbers; only telling when the server runs here too.
                 "load_average_1m_at_end": _load_average()},
        "knobs": knob_values(env_file),
        "knobs_source": str(env_file) if env_file else "bench process environment",
        "pool": pool,
    }
