"""The replicas profile rendered by the real Compose binary: compose.yaml + the override `hyperqwen replicas` writes."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hyperqwen.replicas.cli import run
from hyperqwen.replicas.compose import render_override
from unit.compose_render import compose_binary  # tests/unit/compose_render.py

REPO = Path(__file__).resolve().parents[3]


def _render(project: Path, *files: str, profile: str = "replicas", env: dict[str, str] | None = None) -> dict:
    argv = [*compose_binary(), "--project-directory", str(project)]
    for name in files:
        argv += ["-f", str(project / name)]
    argv += ["--profile", profile, "config", "--format", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(project), **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["services"]


@pytest.fixture()
def project(tmp_path) -> Path:
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    return tmp_path


def _write(project: Path, **knobs: str) -> int:
    args = argparse.Namespace(env_file=None, set=[f"{k}={v}" for k, v in knobs.items()],
                              output=str(project / "compose.replicas.yaml"), print=False, no_device_check=True)
    return run(args, {"MODELS_DIR": str(project / "models")})


def test_four_gpus_four_replicas_one_prepare_one_router(project):
    assert _write(project, GPUS="0,1,2,3") == 0
    services = _render(project, "compose.yaml", "compose.replicas.yaml")
    assert sorted(services) == ["init", "prepare", "replica-0", "replica-1", "replica-2", "replica-3",
                                "replicas-monitor", "router"]
    monitor = services["replicas-monitor"]
    assert monitor["command"] == ["hyperqwen", "monitor", "--upstream",
                                  ",".join(f"http://replica-{i}:18020" for i in range(4))]
    assert monitor["profiles"] == ["replicas"] and monitor["ports"][0]["published"] == "18021"
    for i in range(4):
        replica = services[f"replica-{i}"]
        assert replica["deploy"]["resources"]["reservations"]["devices"] == [
            {"capabilities": ["gpu"], "driver": "nvidia", "device_ids": [str(i)]}]
        assert not replica.get("ports"), "a replica must not publish a port: only the router reaches it"
        assert replica["networks"] == {"default": {}}, "no `server` alias on a replica"
        assert replica["volumes"][0]["target"] == "/models" and replica["volumes"][0]["read_only"] is True
        assert replica["depends_on"]["prepare"]["condition"] == "service_completed_successfully"
        assert replica["environment"]["HYPERQWEN_GPU_LOCK"] == f"/cache/locks/gpu-{i}"
        assert replica["environment"]["TP"] == "1"
        assert replica["environment"]["SCALE_OUT"] == "true"  # cache_aware renders requests on the replicas
        assert replica["profiles"] == ["replicas"]
    router = services["router"]
    assert router["ports"] == [{"mode": "ingress", "host_ip": "127.0.0.1", "target": 18020, "published": "18020",
                                "protocol": "tcp"}]
    assert router["environment"]["HYPERQWEN_REPLICA_URLS"].split() == [f"http://replica-{i}:18020" for i in range(4)]
    assert all(router["depends_on"][f"replica-{i}"]["condition"] == "service_healthy" for i in range(4))
    assert router["command"] == ["hyperqwen", "router"]
    assert "deploy" not in router, "the router needs no GPU"


def test_tp2_pairs_cards(project):
    assert _write(project, GPUS="0,1,2,3", TP="2") == 0
    services = _render(project, "compose.yaml", "compose.replicas.yaml")
    assert [services[f"replica-{i}"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
            for i in range(2)] == [["0", "1"], ["2", "3"]]
    assert "replica-2" not in services


def test_port_and_bind_follow_the_env_file(project):
    (project / ".env").write_text("BIND=0.0.0.0\nPORT=18111\nGPUS=0,1\n")
    assert _write(project, PORT="18111") == 0
    services = _render(project, "compose.yaml", "compose.replicas.yaml")
    assert services["router"]["ports"][0]["host_ip"] == "0.0.0.0"
    assert services["router"]["ports"][0]["published"] == "18111"
    assert services["router"]["environment"]["HYPERQWEN_REPLICA_URLS"].split()[0] == "http://replica-0:18111"


def test_without_the_override_the_template_never_starts(project):
    services = _render(project, "compose.yaml")
    assert "replica" not in services and "router" in services


def test_router_profile_alone_is_the_front_for_other_hosts(project):
    services = _render(project, "compose.yaml", profile="router")
    assert sorted(services) == ["router"]


@pytest.mark.parametrize(("knobs", "knob"), [({"GPUS": "0,0"}, "GPUS"), ({"GPUS": "0,1,2", "TP": "2"}, "TP"),
                                             ({"GPUS": "0,1,2", "TP": "3"}, "TP")])
def test_bad_input_writes_nothing(project, capsys, knobs, knob):
    assert _write(project, **knobs) == 2
    assert not (project / "compose.replicas.yaml").exists()
    assert f"{knob}=" in capsys.readouterr().err


def test_override_text_is_stable():
    assert render_override([("0",), ("1",)], tp=1, port=18020) == render_override([("0",), ("1",)], tp=1, port=18020)
