"""`verify --server` and the model checks against the real vLLM CPU build (the e2e helper's shared
session server, started through `hyperqwen serve` with an API key)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyperqwen import verify as hv

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def run_verify(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ, PYTHONPATH=str(REPO / "src"), **env)
    return subprocess.run(
        [sys.executable, "-m", "hyperqwen.verify", *args], capture_output=True, text=True, env=environ, timeout=600
    )


def test_test_models_pass_the_model_checks(test_models: dict[str, Path]) -> None:
    """The real checkpoints the servers load as their model (written by transformers' save_pretrained) pass. The
    DFlash drafters are not served models: vLLM loads them beside a target, with its tokenizer, and they ship none
    (like the published drafter); spec/drafter.py's check_drafter checks them."""
    from support.testmodels import TINY_DFLASH, TINY_DFLASH2

    served = {name: path for name, path in test_models.items() if name not in (TINY_DFLASH, TINY_DFLASH2)}
    assert served and len(served) == len(test_models) - 2
    for name, model_dir in served.items():
        out = io.StringIO()
        report = hv.Report(out=out)
        hv.check_model_dir(report, model_dir)
        assert report.lines and not report.failed, (name, out.getvalue())


@pytest.mark.server
def test_verify_server_against_real_vllm(smol_server, tmp_path: Path) -> None:
    key_file = tmp_path / "api_key.txt"
    key_file.write_text(smol_server.api_key + "\n")
    proc = run_verify(
        ["--server", smol_server.base_url, "--api-key-file", str(key_file), "--model", smol_server.served_model_name]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS auth: a request without a key gets 401" in proc.stdout
    assert "PASS auth: a request with a wrong key gets 401" in proc.stdout
    assert "PASS chat: one chat completion" in proc.stdout
    assert smol_server.api_key not in proc.stdout + proc.stderr


@pytest.mark.server
def test_health_flag_against_real_vllm(smol_server) -> None:
    port = smol_server.base_url.rsplit(":", 1)[1]
    proc = run_verify(["--health"], PORT=port)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS health"), proc.stdout + proc.stderr


@pytest.mark.server
def test_wrong_key_given_to_verify_fails(smol_server, tmp_path: Path) -> None:
    key_file = tmp_path / "api_key.txt"
    key_file.write_text("not-the-server-key-0123456789\n")
    proc = run_verify(["--server", smol_server.base_url, "--api-key-file", str(key_file)])
    assert proc.returncode == 1
    assert "answers 401" in proc.stdout and "not the server's" in proc.stdout
