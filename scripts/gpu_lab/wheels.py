"""The lab's wheel list: the GPU image's locked list (requirements/image-gpu.txt), less what a lab machine
already has or a lab boot never loads. One list, derived, never hand-kept beside the image's."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE_LOCK = ROOT / "requirements" / "image-gpu.txt"

# Names in the image's lock a lab machine does not receive, and why. A lab GPU host brings its own CUDA
# libraries and scientific stack (its torch is replaced, its CUDA libraries are reused: docs/gpu-lab.md), and
# a lab boot serves text from a W4A16 checkpoint, so the image's audio/video/vision-codec and optional kernel
# packages never load. nvidia-cutlass-dsl* stays out on purpose: without it GDN_PREFILL=auto must choose the
# Triton prefill on Hopper, which the lab then checks on every boot.
HOST_PROVIDES = (
    "numpy", "numba", "llvmlite", "pillow", "opencv-python-headless", "sympy", "setuptools", "tabulate",
    "grpcio", "ml-dtypes", "nvidia-ml-py", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-python",
    "cuda-toolkit", "nvidia-cublas", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cuda-cupti",
    "nvidia-cuda-nvcc", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cudnn-frontend",
    "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse",
    "nvidia-cusparselt-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13", "nvidia-nvtx", "nvidia-nvvm", "nvtx",
)
NOT_LOADED_BY_A_LAB_BOOT = (
    "torchaudio", "torchcodec", "pynvvideocodec", "z3-solver", "supervisor", "sentry-sdk", "fastapi-cloud-cli",
    "rignore", "fastar", "agent-detector", "detect-installer", "fastsafetensors", "instanttensor",
    "humming-kernels", "quack-kernels", "tilelang", "tokenspeed-mla", "tokenspeed-triton", "cuda-tile",
    "nccl-extensions", "nccl4py", "torch-c-dlpack-ext", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13",
)
# What the project itself imports on the lab host (pyproject's dependencies and prepare/bench extras, less
# numpy, which the host has): each must survive the skips above, or the lab could not run `prepare`/`serve`.
PROJECT_NEEDS = ("pyyaml", "python-dotenv", "huggingface-hub", "safetensors", "tokenizers", "tqdm", "aiohttp",
                 "prometheus-client")

_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class LockError(ValueError):
    pass


def read_lock(path: Path = IMAGE_LOCK) -> dict[str, str]:
    """name -> version of every `name==version` line; anything else that is not a comment is an error."""
    pins: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = _PIN.match(text)
        if match is None:
            raise LockError(f"{path}:{number}: {line.strip()!r} is not a name==version pin")
        pins[canonical(match.group(1))] = match.group(2)
    return pins


def lab_pins(image_lock: dict[str, str]) -> dict[str, str]:
    """The image's pins less what the lab host provides or never loads; refuses a lock that lost a need."""
    skipped = {canonical(n) for n in (*HOST_PROVIDES, *NOT_LOADED_BY_A_LAB_BOOT)}
    pins = {name: version for name, version in image_lock.items() if name not in skipped}
    missing = [n for n in ("vllm", "torch", "triton", *PROJECT_NEEDS) if canonical(n) not in pins]
    if missing:
        raise LockError(f"the lab's wheel list would lack {', '.join(missing)}: {IMAGE_LOCK.name} must pin them")
    return dict(sorted(pins.items()))


def lab_requirements(lock: Path = IMAGE_LOCK) -> list[str]:
    return [f"{name}=={version}" for name, version in lab_pins(read_lock(lock)).items()]
