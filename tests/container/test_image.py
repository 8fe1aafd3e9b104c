"""The built image: non-root, entrypoint and healthcheck wired, the install gate passes inside it, and
`single` refuses to start when verify fails. Needs a Docker engine; no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.container


def test_image_config(image: str) -> None:
    import docker

    config = docker.from_env().images.get(image).attrs["Config"]
    assert config["Entrypoint"] == ["hyperqwen-entrypoint"]
    assert config["Cmd"] == ["single"]
    assert config["User"] and config["User"].split(":")[0] not in ("0", "root")
    assert "--health" in config["Healthcheck"]["Test"]
    assert config["Healthcheck"]["StartPeriod"] >= 15 * 60 * 10**9  # nanoseconds
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["HYPERQWEN_LISTEN_HOST"] == "0.0.0.0" and env["MODELS_DIR"] == "/models"


def test_runs_as_non_root(run_image) -> None:
    result = run_image(["id", "-u"])
    assert result.exit_code == 0 and result.output.strip() != "0", result.output


def test_verify_install_passes_inside_the_image(run_image) -> None:
    result = run_image(["verify", "--install"])
    assert result.exit_code == 0, result.output
    assert "PASS vllm: vllm 0.32.0 (GPU build)" in result.output
    assert "FAIL" not in result.output


def test_patch_series_is_applied_in_the_image(run_image) -> None:
    result = run_image(["hyperqwen", "patches", "check"])
    assert result.exit_code == 0, result.output


def test_single_refuses_to_start_when_verify_fails(run_image, tmp_path: Path) -> None:
    """An empty models volume and (here) no GPU: verify fails and the server is not started."""
    models = tmp_path / "models"
    models.mkdir()
    result = run_image(["single"], volumes=[(str(models), "/models", "ro")], timeout=600)
    assert result.exit_code != 0
    assert "FAIL model" in result.output
    assert "not starting the server" in result.output
