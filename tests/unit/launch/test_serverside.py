"""The environment file `hyperqwen serve` writes for the environment route (patch 0050)."""

from __future__ import annotations

import json
import stat

from hyperqwen.config.load import load_settings
from hyperqwen.launch import serverside


def test_platform_kind_detects_wsl2():
    wsl = "Linux version 5.15.167.4-microsoft-standard-WSL2 (root@...) #1 SMP"
    assert serverside.platform_kind(wsl, {}) == "wsl2"
    assert serverside.platform_kind("Linux version 6.8.0-45-generic", {"WSL_DISTRO_NAME": "Ubuntu"}) == "wsl2"
    assert serverside.platform_kind("Linux version 6.8.0-45-generic (buildd@lcy02)", {}) == "linux"


def test_model_facts_checksum_follows_the_manifest(tmp_path):
    manifest = {"request": {"repo": "org/model", "revision": "0123abc"}, "source": "hub", "fingerprint": "fp",
                "files": {"a.safetensors": {"sha256": "11" * 32, "size": 1}, "config.json": {"sha256": "22" * 32}}}
    (tmp_path / serverside.MANIFEST_NAME).write_text(json.dumps(manifest))
    facts = serverside.model_facts(tmp_path)
    assert facts["repo"] == "org/model" and facts["revision"] == "0123abc" and facts["files"] == 2
    manifest["files"]["a.safetensors"]["sha256"] = "33" * 32
    (tmp_path / serverside.MANIFEST_NAME).write_text(json.dumps(manifest))
    assert serverside.model_facts(tmp_path)["files_sha256"] != facts["files_sha256"]
    assert serverside.model_facts(tmp_path / "missing")["manifest"] is None


def test_environment_file_masks_secrets_and_is_private(tmp_path):
    key = "sk-never-in-the-file-0123456789"
    settings = load_settings({"VLLM_API_KEY": key, "SPEC": "mtp", "MODEL": str(tmp_path)}, env_file=None)
    path = tmp_path / "env" / "environment.json"
    doc = serverside.write_environment_file(path, settings)
    text = path.read_text()
    assert key not in text and json.loads(text) == doc
    assert doc["knobs"]["VLLM_API_KEY"] == "****" and doc["knobs"]["SPEC"] == "mtp" and doc["mode"] == "single"
    assert doc["model"]["path"] == str(tmp_path) and doc["platform"] in ("linux", "wsl2")
    assert [p["name"] for p in doc["patch_series"]["patches"]][:1] == ["0001-auth-accept-x-api-key.patch"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_default_environment_file_is_one_per_port():
    """Two servers on one host (replicas, parallel test sessions) must not report each other's knobs."""
    a, b = serverside.default_environment_path(18020), serverside.default_environment_path("18021")
    assert a != b and a.parent == b.parent and a.name == "environment-18020.json"
