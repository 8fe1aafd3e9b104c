"""The environment block every result file carries: what was measured, on what, with which settings."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from hyperqwen.bench import prom
from hyperqwen.launch import serverside

REPO_ROOT = Path(__file__).resolve().parents[3]


def project_commit(repo: Path = REPO_ROOT) -> str | None:
    """`git rev-parse HEAD` (+ '-dirty' when tracked files changed); None outside a git checkout."""
    if not (repo / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
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


def bench_host_knobs(env_file: Path | None) -> dict[str, str] | None:
    """Explicitly set knobs as the bench host's settings loader sees them (hyperqwen.config.load: defaults <
    mode profile < .env < environment), secrets masked. Only a fallback: the server's own knobs come from
    its environment route. None when the environment's settings do not resolve."""
    try:
        from hyperqwen.config.load import load_settings
        from hyperqwen.config.settings import SettingsError
    except ImportError:  # a bare checkout without the config package's dependencies
        return None
    try:
        settings = load_settings(os.environ, env_file=env_file)
    except (SettingsError, OSError, ValueError) as exc:
        if env_file is not None:  # asked for by name: its problem is the user's to fix
            from hyperqwen.bench.errors import BenchError

            raise BenchError(f"--env-file {env_file}: {exc}") from None
        return None
    return {name: settings.setting(name).display() for name in settings if settings.explicit(name)}


def server_hardware(server: dict | None) -> str | None:
    """'gpu' or 'cpu' from the server's own environment; None when the server did not say."""
    if not server:
        return None
    live = server.get("live") or {}
    if server.get("gpus") or live.get("device"):
        return "gpu"
    # nvidia-smi absent in the file, or torch running without a CUDA device: a CPU server.
    return "cpu" if "gpus" in server or live.get("torch") else None


def build_environment(
    *,
    version: str | None,
    metrics_text: str | None,
    server_log: Path | None,
    env_file: Path | None,
    hardware: str | None,
    label: str | None,
    server: dict | None = None,
    server_note: str | None = None,
) -> dict:
    """`server`: the body of the server's authenticated /hyperqwen/environment route (None when it has none);
    the bench host is recorded separately and never stands in for the server's GPU."""
    pool = prom.pool_size_from_metrics(metrics_text) if metrics_text else None
    if (pool is None or pool.get("pool_tokens") is None) and server_log is not None and server_log.is_file():
        pool = prom.pool_size_from_log(server_log.read_text(errors="replace")) or pool
    detected = server_hardware(server)
    knobs = (server or {}).get("knobs")
    return {
        "label": label,
        "hardware": hardware or detected or "unknown",
        "hardware_source": "--hardware" if hardware else ("server environment" if detected else "unknown"),
        "timestamp_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "project_commit": project_commit(),
        "project_version": _project_version(),
        "vllm_version": version,
        "server": server,
        "server_note": server_note,
        "bench_host": {
            "machine": platform.machine(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": serverside.platform_kind(),
            "gpus": serverside.gpu_facts(),
            # Other load on the bench host skews numbers; only telling when the server runs here too.
            "load_average_1m_at_end": _load_average(),
        },
        "knobs": knobs if knobs is not None else bench_host_knobs(env_file),
        "knobs_source": "server environment" if knobs is not None else "bench host settings (server did not say)",
        "pool": pool,
    }
