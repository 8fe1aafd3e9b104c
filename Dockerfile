# syntax=docker/dockerfile:1
#
# HyperQwen: vLLM 0.32.0 (GPU build) + the hyperqwen launcher, for NVIDIA GPUs of compute capability
# 8.6/8.9 (RTX 3090/4090) and newer. Host needs an NVIDIA driver >= 580 (CUDA 13.0) and the NVIDIA
# Container Toolkit.
#
# Why these pins (read from the wheels themselves, not guessed):
# - vllm==0.32.0's GPU wheel (PyPI) requires torch==2.13.0, torchvision==0.28.0, torchaudio==2.11.0
#   (its METADATA Requires-Dist) and its kernels link libcudart.so.13 with code for sm_75 ... sm_120
#   (sm_86 and sm_89 included).
# - PyPI's torch 2.13.0 brings the CUDA 13.0 libraries as wheels (nvidia-cuda-runtime 13.0.96, cuBLAS,
#   cuDNN, NCCL, ...), so the base is CUDA 13.0's smallest flavour, `base` (driver glue and cudart only):
#   the `runtime` and `devel` flavours would carry those libraries a second time (~3-4 GB). FlashInfer
#   and DeepGEMM compile kernels with nvcc the first time a shape is used, at run time, and Triton builds
#   its launchers with a C compiler, so only the pieces those need are added: nvcc, the cudart and curand
#   headers, g++ (as the public 3090 reference's image does: github.com/syv-ai/qwen38-27b-rtx3090,
#   Dockerfile: CUDA base + cuda-nvcc, cuda-cudart-dev, libcurand-dev; ~9.5 GB).
# - Python 3.12 (vLLM 0.32.0 supports 3.11-3.14), a fixed patch release from uv's
#   python-build-standalone builds, so the interpreter does not drift with Ubuntu's updates.

# Renovate (renovate.json) pins these by digest and proposes updates.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

# ---------------------------------------------------------------------------------------------
# Stage 1 (uv): only a source for the uv binary, which fetches a pinned CPython in stage 2.
FROM ${UV_IMAGE} AS uv

# ---------------------------------------------------------------------------------------------
# Stage 2 (python): a relocatable CPython under /opt/python; nothing else from this stage is kept.
FROM ${CUDA_IMAGE} AS python
ARG PYTHON_VERSION=3.12.16
ENV UV_PYTHON_INSTALL_DIR=/opt/python
COPY --from=uv /uv /usr/local/bin/uv
# /opt/python/current: a stable path to it (uv names the folder after version, arch and libc).
RUN uv python install "${PYTHON_VERSION}" \
    && ln -s "$(dirname "$(dirname "$(uv python find "${PYTHON_VERSION}")")")" /opt/python/current

# ---------------------------------------------------------------------------------------------
# Stage 3 (runtime): the image that is shipped.
FROM ${CUDA_IMAGE} AS runtime

ARG VLLM_VERSION=0.32.0
ARG TORCH_VERSION=2.13.0
ARG TORCHVISION_VERSION=0.28.0
ARG TORCHAUDIO_VERSION=2.11.0
# GNU patch applies patches/series; Ubuntu 24.04's release-pocket version.
ARG GNU_PATCH_VERSION=2.7.6-7build3
ARG HYPERQWEN_UID=1000

LABEL org.opencontainers.image.title="hyperqwen" \
      org.opencontainers.image.description="Qwen3.8-27B on one 24 GB GPU with vLLM 0.32.0" \
      org.opencontainers.image.licenses="Apache-2.0"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# System packages: GNU patch, and what the run-time JIT compilers need (see the top). The CUDA packages come
# from the base image's own CUDA apt repository; "-13-0" in their names holds them to its CUDA 13.0 line.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends "patch=${GNU_PATCH_VERSION}" \
        cuda-nvcc-13-0 cuda-cudart-dev-13-0 libcurand-dev-13-0 g++ \
    && rm -rf /var/lib/apt/lists/*
ENV CUDA_HOME=/usr/local/cuda

# A non-root user with a fixed uid (Ubuntu 24.04 images ship a user `ubuntu` on uid 1000: drop it).
RUN if id ubuntu >/dev/null 2>&1; then userdel ubuntu && rm -rf /home/ubuntu; fi \
    && if getent group ubuntu >/dev/null; then groupdel ubuntu; fi \
    && groupadd --gid "${HYPERQWEN_UID}" hyperqwen \
    && useradd --uid "${HYPERQWEN_UID}" --gid "${HYPERQWEN_UID}" --create-home --shell /bin/bash hyperqwen \
    && mkdir -p /models /cache \
    && chown hyperqwen:hyperqwen /models \
    && chmod 1777 /cache

# Python virtual environment owned by root: the server user can read it but not change it.
COPY --from=python /opt/python /opt/python
RUN /opt/python/current/bin/python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:${PATH} \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# vLLM and torch: the big, slow-changing layer, before the project so edits do not rebuild it.
# requirements/image-gpu.txt pins every transitive dependency to the versions resolved for this image.
# BuildKit cache mount: wheels stay in the builder's cache (and the CI's layer cache), not in the image.
COPY requirements/image-gpu.txt /opt/hyperqwen-constraints.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --constraint /opt/hyperqwen-constraints.txt \
        "vllm==${VLLM_VERSION}" \
        "torch==${TORCH_VERSION}" \
        "torchvision==${TORCHVISION_VERSION}" \
        "torchaudio==${TORCHAUDIO_VERSION}"

# The project, installed as a regular (non-editable) package. .dockerignore keeps models, caches,
# tests and git out of the build context.
COPY . /opt/hyperqwen
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --constraint /opt/hyperqwen-constraints.txt "/opt/hyperqwen[prepare,bench,router]" \
    && install -m 0755 /opt/hyperqwen/verify.sh /usr/local/bin/verify.sh
ENV HYPERQWEN_PATCHES_DIR=/opt/hyperqwen/patches

# Patch vLLM from patches/series, in order; any hunk that does not apply with fuzz 0 fails the build.
# Then byte-compile what changed, since the server user cannot write __pycache__ at run time.
RUN hyperqwen patches apply \
    && python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/vllm"

# Build gate: vLLM version, every patch applied exactly (reverse-apply), packages import; and the JIT
# toolchain the slim base must still provide (nvcc with the cudart/curand headers, a host C++ compiler).
RUN verify.sh --install \
    && "${CUDA_HOME}/bin/nvcc" --version \
    && test -f "${CUDA_HOME}/include/cuda_runtime.h" && test -f "${CUDA_HOME}/include/curand.h" \
    && g++ --version

# Runtime environment. Caches live under /cache: compose mounts its named volume `cache` there, and the
# README's `docker run` lines mount a named volume too, so the first boot's compilation is reused. No VOLUME
# instruction: it would give every container without that mount (the monitor, one-off `docker run`s) an
# anonymous volume that is never reused.
ENV MODELS_DIR=/models \
    HYPERQWEN_LISTEN_HOST=0.0.0.0 \
    HOME=/home/hyperqwen \
    XDG_CACHE_HOME=/cache \
    HF_HOME=/cache/huggingface \
    VLLM_CACHE_ROOT=/cache/vllm \
    TRITON_CACHE_DIR=/cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/cache/torchinductor \
    FLASHINFER_WORKSPACE_BASE=/cache \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1

USER ${HYPERQWEN_UID}:${HYPERQWEN_UID}
WORKDIR /home/hyperqwen
EXPOSE 18020

# /health answers only once the engine is up; the first boot compiles for many minutes (see compose.yaml).
HEALTHCHECK --interval=30s --timeout=10s --start-period=20m --retries=3 \
    CMD ["python3", "-m", "hyperqwen.verify", "--health"]

ENTRYPOINT ["hyperqwen-entrypoint"]
CMD ["single"]
