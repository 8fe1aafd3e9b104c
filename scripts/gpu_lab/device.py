"""Device side of the GPU lab: runs on the lent GPU host, with no network, from the repository root.

    python3 scripts/gpu_lab/device.py install --volumes DIR [--target /tmp/site]
    python3 scripts/gpu_lab/device.py checkpoint [--source /tmp/src]
    python3 scripts/gpu_lab/device.py session scripts/gpu_lab/sessions/NAME.json [--only NAME,...]
    python3 scripts/gpu_lab/device.py collect --out DIR

`session` runs `hyperqwen prepare` on the checkpoint once, then boots `hyperqwen serve` once per entry, with the memory budget of the session's card (cards.py),
and writes everything a record needs under WORK/boots/NN-name/ (WORK defaults to /tmp/lab): the planner's
prediction for the card, `serve --print`, vLLM's log, the request round trips, the GPU and versions.
`collect` packs finished boots for the trip home; records.py turns them into docs/data/gpu/*.json there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_lab.cards import EmulationError, emulated_gpu_util  # noqa: E402
from gpu_lab.volumes import VolumeError, unpack  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("GPU_LAB_WORK", "/tmp/lab"))
SITE = Path(os.environ.get("GPU_LAB_SITE", "/tmp/site"))
MODELS = Path(os.environ.get("GPU_LAB_MODELS", "/tmp/models"))
PORT = 18020
# The lab host's GPUs are shared: NVLink multicast stays off in every process (the host's rules).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def log(message: str) -> None:
    print(f"[gpu-lab {time.strftime('%H:%M:%S')}] {message}", flush=True)


def lab_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The installed stack ahead of the host's own (its torch is older): the project's src, then the target
    directory; NCCL from the target first (torch 2.13 needs symbols the host's NCCL lacks), then the host's
    CUDA libraries. `pip --target` installs run no .pth files, hence the explicit paths."""
    host_site = Path(sysconfig.get_paths()["purelib"])
    libs = [SITE / "nvidia" / "nccl" / "lib", *sorted(host_site.glob("nvidia/*/lib")), *sorted(host_site.glob("nvidia/cu13/lib"))]
    env = dict(os.environ)
    env.update(NO_MULTICAST)
    env.update({
        "PYTHONPATH": f"{ROOT / 'src'}:{SITE}",
        "LD_LIBRARY_PATH": ":".join([*(str(p) for p in libs if p.is_dir()), env.get("LD_LIBRARY_PATH", "")]),
        "PATH": f"{WORK / 'bin'}:{env.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "MODELS_DIR": str(MODELS),
    })
    env.update(extra or {})
    return env


def hyperqwen(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hyperqwen", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


# --- install -------------------------------------------------------------------------------------------


def install(volumes: Path) -> int:
    started = time.monotonic()
    try:
        names = unpack(volumes, WORK / "wheelhouse")
    except VolumeError as exc:
        print(f"gpu-lab install: {exc}", file=sys.stderr)
        return 2
    wheels = sorted(str(WORK / "wheelhouse" / n) for n in names if n.endswith(".whl"))
    (WORK / "bin").mkdir(parents=True, exist_ok=True)
    if shutil.which("patch") is None:
        shutil.copy2(WORK / "wheelhouse" / "bin" / "patch", WORK / "bin" / "patch")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--target", str(SITE), *wheels]
    if subprocess.run(pip).returncode != 0:
        print("gpu-lab install: pip install --target failed (above)", file=sys.stderr)
        return 1
    env = lab_env()
    applied = hyperqwen("patches", "apply", "--target", str(SITE), env=env)
    print(applied.stdout[-2000:], applied.stderr[-2000:])
    if applied.returncode != 0:
        print("gpu-lab install: the patch series did not apply (above)", file=sys.stderr)
        return 1
    versions = describe_stack(env)
    (WORK / "stack.json").write_text(json.dumps(versions, indent=1) + "\n")
    log(f"installed {len(wheels)} wheels and the patch series in {time.monotonic() - started:.0f} s: {versions}")
    return 0


STACK_PROBE = """
import json, subprocess, torch, vllm
free, total = torch.cuda.mem_get_info()
smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total,compute_cap", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout.strip().split(", ")
print(json.dumps({"gpu": torch.cuda.get_device_name(), "cuda_total_bytes": total, "cuda_free_bytes": free,
                  "driver": smi[0], "nvidia_smi_total_mib": int(smi[1]), "compute_capability": smi[2],
                  "cuda_runtime": torch.version.cuda, "torch": torch.__version__, "vllm": vllm.__version__}))
"""


def describe_stack(env: dict[str, str]) -> dict:
    probe = subprocess.run([sys.executable, "-c", STACK_PROBE], env=env, capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        raise SystemExit(f"gpu-lab: the installed stack does not import: {probe.stderr.strip().splitlines()[-1:]}")
    return json.loads(probe.stdout.strip().splitlines()[-1])


# --- checkpoint ----------------------------------------------------------------------------------------


def checkpoint(source: Path) -> int:
    """The full-size synthetic W4A16 checkpoint with a tokenizer over the whole vocabulary (host packages
    only, so it can run while the wheel volumes are still travelling)."""
    from gpu_lab.checkpoint import write_lab_checkpoint

    started = time.monotonic()
    try:
        write_lab_checkpoint(source)
    except Exception as exc:  # noqa: BLE001 - the session waits on one of the two marker files
        (WORK / "checkpoint.failed").write_text(repr(exc))
        raise
    log(f"synthetic checkpoint in {time.monotonic() - started:.0f} s")
    (WORK / "checkpoint.done").write_text(str(source))
    return 0


def prepare(source: Path) -> int:
    """`hyperqwen prepare` from the local checkpoint into MODELS (the installed stack: it needs python-dotenv)."""
    started = time.monotonic()
    done = hyperqwen("prepare", "--no-progress", env=lab_env({"MODEL_SOURCE_DIR": str(source)}), timeout=1800)
    (WORK / "prepare.log").write_text(done.stdout + done.stderr)
    log(f"prepare rc={done.returncode} after {time.monotonic() - started:.0f} s")
    return done.returncode


# --- one boot ------------------------------------------------------------------------------------------


def get(path: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as exc:
        return 0, str(exc)


def post(path: str, body: dict, timeout: float = 300) -> tuple[int, dict | str, float]:
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), time.perf_counter() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:2000], time.perf_counter() - started
    except (OSError, urllib.error.URLError) as exc:
        return 0, str(exc), time.perf_counter() - started


def completion(prompt: str | list[int], max_tokens: int, **extra: object) -> dict:
    status, body, seconds = post("/v1/completions", {"model": "qwen3.8-27b", "prompt": prompt, "max_tokens": max_tokens,
                                                     "temperature": 0, "ignore_eos": True, **extra})
    usage = body.get("usage", {}) if isinstance(body, dict) else {}
    return {"status": status, "seconds": round(seconds, 4), "usage": usage,
            "error": None if status == 200 else body}


def salted_ids(salt: int, length: int) -> list[int]:
    """Token-id prompts: distinct per salt (no prefix-cache hit between them), ids inside the vocabulary."""
    return [(salt * 7919 + j * 31) % 240000 + 300 for j in range(length)]


def run_requests(kinds: list[str], out: Path, env: dict[str, str]) -> dict:
    results: dict[str, object] = {}
    if "roundtrip" in kinds:
        results["roundtrip"] = completion("hello world, this is the lab", 16)
    if "one_token" in kinds:
        results["one_token"] = completion([400], 4)
        results["one_token_then_health"] = get("/health")[0]
        results["one_token_then_roundtrip"] = completion(salted_ids(1, 64), 8)
    if "prefix" in kinds:
        doc = salted_ids(2, 16384)
        cold = completion(doc, 64)
        warm = completion(doc[:-32] + salted_ids(3, 32), 64)
        results["prefix_16k"] = {"cold": cold, "turn2": warm}
        # Greedy output over a cached 16k prefix equals the output that computed it (the first request).
        texts = [post("/v1/completions", {"model": "qwen3.8-27b", "prompt": doc, "max_tokens": 32,
                                          "temperature": 0})[1] for _ in range(2)]
        texts = [body["choices"][0]["text"] if isinstance(body, dict) else body for body in texts]
        results["prefix_greedy_equal"] = texts[0] == texts[1]
    if "ram_cache" in kinds:
        before = get("/metrics")[1]
        first = completion(salted_ids(10, 8192), 4)
        fillers = [completion(salted_ids(11 + i, 8192), 4)["status"] for i in range(12)]
        again = completion(salted_ids(10, 8192), 4)
        results["ram_cache"] = {"first": first, "fillers": fillers, "again": again}
        (out / "metrics-before.txt").write_text(before)
    if "speed" in kinds:
        bench = out / "bench-ladder.json"
        done = hyperqwen("bench", "ladder", "--url", f"http://127.0.0.1:{PORT}", "--concurrency",
                         env.get("GPU_LAB_LADDER", "1,4"), "--max-tokens", "256", "--prompt-tokens", "1024",
                         "--out", str(bench), env=env, timeout=400)
        results["bench_ladder"] = {"rc": done.returncode, "stderr": done.stderr[-3000:]}
    results["metrics_status"], metrics = get("/metrics")
    (out / "metrics.txt").write_text(metrics)
    return results


def stop(process: subprocess.Popen) -> int | None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    return process.returncode


def gpu_used_mib() -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True)
    return int(done.stdout.split()[0]) if done.returncode == 0 and done.stdout.strip() else None


def boot(index: int, entry: dict, card: str, stack: dict) -> dict:
    name, mode = entry["name"], entry["mode"]
    out = WORK / "boots" / f"{index:02d}-{name}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    sets = [arg for k, v in entry.get("set", {}).items() for arg in ("--set", f"{k}={v}")]
    # Cold: an empty vLLM compile cache for this boot; warm: an earlier boot's. Triton's kernel cache is
    # shared by the session's boots (its state before this boot is recorded).
    cache = WORK / "vllm-cache" / entry.get("warm_from", name)
    triton = WORK / "triton"
    triton_entries = sum(1 for _ in triton.iterdir()) if triton.is_dir() else 0
    env = lab_env({"VLLM_CACHE_ROOT": str(cache), "TRITON_CACHE_DIR": str(triton), **entry.get("env", {})})
    meta: dict[str, object] = {"name": name, "mode": mode, "set": entry.get("set", {}), "card": card,
                               "compile_cache": "warm" if "warm_from" in entry else "cold",
                               "triton_cache_entries_before": triton_entries, "stack": stack,
                               "gpu_used_mib_before": gpu_used_mib()}
    plan = hyperqwen("plan", "--gpu", card, "--mode", mode, *sets, "--json", env=env)
    (out / "plan.json").write_text(plan.stdout)
    meta["plan_rc"] = plan.returncode
    settings = hyperqwen("serve", "--mode", mode, *sets, "--gpu", card, "--print", env=env)
    try:
        util = emulated_gpu_util(card, entry.get("card_gpu_util") or profile_gpu_util(mode, entry, env),
                                 stack["cuda_total_bytes"])
    except EmulationError as exc:
        meta.update(status="refused", reason=str(exc))
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        return meta
    meta["emulated_gpu_util"] = util
    serve_args = ["serve", "--mode", mode, *sets, "--set", f"GPU_UTIL={util}"]
    printed = hyperqwen(*serve_args, "--print", env=env)
    (out / "print.txt").write_text(settings.stdout + "\n# on this GPU:\n" + printed.stdout + printed.stderr)
    started = time.monotonic()
    with open(out / "serve.log", "w") as server_log:
        process = subprocess.Popen([sys.executable, "-m", "hyperqwen", *serve_args], env=env, stdout=server_log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    healthy = False
    deadline = started + float(entry.get("boot_timeout", 900))
    while time.monotonic() < deadline and process.poll() is None:
        if get("/health", 2)[0] == 200:
            healthy = True
            break
        time.sleep(1)
    meta["boot_seconds"] = round(time.monotonic() - started, 1)
    meta["healthy"] = healthy
    meta["gpu_used_mib_serving"] = gpu_used_mib()
    if healthy:
        try:
            meta["requests"] = run_requests(entry.get("requests", ["roundtrip"]), out, env)
        except Exception as exc:  # noqa: BLE001 - the record says what broke; the session goes on
            meta["requests_error"] = repr(exc)
        meta["alive_after_requests"] = process.poll() is None
    meta["exit_code"] = stop(process)
    meta["status"] = "served" if healthy else "failed"
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"{name}: {meta['status']} after {meta['boot_seconds']} s")
    return meta


def profile_gpu_util(mode: str, entry: dict, env: dict[str, str]) -> float:
    """The GPU_UTIL the settings give on the card (profile < entry's --set): what a 3090 user runs."""
    value = entry.get("set", {}).get("GPU_UTIL")
    if value is not None:
        return float(value)
    sys.path[:0] = [str(ROOT / "src")]
    sys.path.append(str(SITE))  # python-dotenv, which config imports, comes with the installed stack
    from hyperqwen.config.settings import profile_defaults

    return float(profile_defaults(mode)["GPU_UTIL"])


def session(path: Path, only: set[str] | None) -> int:
    plan = json.loads(path.read_text())
    stack = json.loads((WORK / "stack.json").read_text())
    for _ in range(900):
        if (WORK / "checkpoint.done").exists() or (WORK / "checkpoint.failed").exists():
            break
        time.sleep(2)
    if not (WORK / "checkpoint.done").exists():
        log("the synthetic checkpoint was not written: see checkpoint.out")
        return 1
    if not (MODELS / "qwen3.8-27b").is_dir() and prepare(Path((WORK / "checkpoint.done").read_text())) != 0:
        log("prepare failed: see prepare.log")
        (WORK / "session.done").write_text("prepare failed")
        return 1
    for index, entry in enumerate(plan["boots"]):
        if only and entry["name"] not in only:
            continue
        try:
            boot(index, entry, plan["card"], stack)
        except Exception as exc:  # noqa: BLE001 - one broken boot must not cost the rest of the session
            import traceback

            log(f"{entry['name']}: the lab itself failed: {exc!r}\n{traceback.format_exc()}")
    (WORK / "session.done").write_text("ok")
    return 0


def collect(out: Path, wait: float) -> int:
    """Pack each finished, not yet collected boot as NN-name.tar.gz into `out` (at most 7 a call)."""
    deadline = time.monotonic() + wait
    sent = WORK / "collected"
    sent.mkdir(parents=True, exist_ok=True)
    while True:
        ready = [d for d in sorted((WORK / "boots").glob("*")) if (d / "meta.json").exists()
                 and not (sent / d.name).exists()]
        if ready or time.monotonic() > deadline or (WORK / "session.done").exists():
            break
        time.sleep(5)
    for boot_dir in ready[:7]:
        with tarfile.open(out / f"{boot_dir.name}.tar.gz", "w:gz") as tar:
            tar.add(boot_dir, arcname=boot_dir.name)
        (sent / boot_dir.name).write_text("sent")
    running = [d.name for d in sorted((WORK / "boots").glob("*")) if not (d / "meta.json").exists()]
    print(json.dumps({"sent": [d.name for d in ready[:7]], "running": running,
                      "session_done": (WORK / "session.done").exists()}))
    for name in ("checkpoint.out", "prepare.log", "session.out"):
        if (WORK / name).exists():
            print(f"--- {name}:", *(WORK / name).read_text(errors="replace").splitlines()[-4:], sep="\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("install")
    p.add_argument("--volumes", type=Path, required=True)
    p = sub.add_parser("checkpoint")
    p.add_argument("--source", type=Path, default=Path("/tmp/src"))
    p = sub.add_parser("session")
    p.add_argument("file", type=Path)
    p.add_argument("--only", help="comma-separated boot names")
    p = sub.add_parser("collect")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--wait", type=float, default=0, help="seconds to wait for a boot to finish")
    args = parser.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    if args.command == "install":
        return install(args.volumes)
    if args.command == "checkpoint":
        return checkpoint(args.source)
    if args.command == "session":
        return session(args.file, set(args.only.split(",")) if args.only else None)
    return collect(args.out, args.wait)


if __name__ == "__main__":
    sys.exit(main())
