"""The compose stack for real: `docker compose --profile single up --wait`, then the live verify checks
against it. Needs a Docker engine, an NVIDIA GPU with the Container Toolkit, and a prepared models
folder (HYPERQWEN_MODELS, with api_key.txt), since the 27B weights cannot be fetched in a test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.container, pytest.mark.gpu]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def models_dir() -> Path:
    raw = os.environ.get("HYPERQWEN_MODELS")
    if not raw or not (Path(raw) / "qwen3.8-27b" / "config.json").is_file():
        pytest.skip("needs a prepared models folder: set HYPERQWEN_MODELS to one holding qwen3.8-27b/ and api_key.txt")
    return Path(raw)


@pytest.mark.parametrize("profile", ["single", "batch"])
def test_profile_serves_and_enforces_the_key(
    nvidia_gpu: None,
    image: str,
    compose_cli: dict[str, str],
    models_dir: Path,
    profile: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import docker
    from testcontainers.compose import DockerCompose

    # compose.yaml names the image ghcr.io/${HYPERQWEN_OWNER}/hyperqwen:${HYPERQWEN_TAG}: point it at ours.
    docker.from_env().images.get(image).tag("ghcr.io/hyperqwen/hyperqwen", "under-test")
    # testcontainers runs `docker compose` with this process's environment.
    for key in ("DOCKER_CONFIG",):
        if key in compose_cli:
            monkeypatch.setenv(key, compose_cli[key])
    monkeypatch.setenv("HYPERQWEN_MODELS", str(models_dir))
    monkeypatch.setenv("HYPERQWEN_OWNER", "hyperqwen")
    monkeypatch.setenv("HYPERQWEN_TAG", "under-test")
    with DockerCompose(
        str(REPO), compose_file_name="compose.yaml", profiles=[profile], wait=True, build=False
    ) as stack:
        services = {c.Service: c for c in stack.get_containers(include_all=True)}
        assert set(services) == {"prepare", profile}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "hyperqwen.verify",
                "--server",
                "http://127.0.0.1:18020",
                "--api-key-file",
                str(models_dir / "api_key.txt"),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "PASS auth: a request without a key gets 401" in proc.stdout
