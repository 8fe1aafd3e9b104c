"""CPU bench of every SPEC value on the tiny test models: tokens per verify step, acceptance per position, and
greedy output identical to SPEC=none. Writes one result file that `hyperqwen bench render` puts in
docs/benchmarks.md.

    PYTHONPATH=tests .venv/bin/python scripts/bench_spec_cpu.py --out bench/results/2026-12-01-cpu-tiny-qwen-spec.json
    .venv/bin/hyperqwen bench render bench/results/*.json > docs/benchmarks.md

It starts one vLLM CPU server per SPEC value, one at a time, through `hyperqwen serve` (the knobs as
environment variables, as compose passes them), on tiny-qwen (support.testmodels: its greedy output is a
planted successor chain, so every token is known). About 2 minutes per server on 2 cores.

Workloads (the same prompts for every SPEC):
- chat: four short text prompts, 48 tokens each. The answer never repeats the prompt (a fresh chain), so
  prompt lookup finds nothing to copy; model drafters still draft.
- document: two prompts that walk the successor chain into its cycle and around it twice, 192 tokens each.
  The answer continues around the cycle, so every answer token is already in the context: the tiny-model
  analogue of reproducing or quoting a document.

SPEC=dflash2 runs with `tiny-dflash`, the DFlash layout of the tiny DFlash2 drafter: vLLM 0.32.0's CPU build
refuses a DFlash2 candidate-head drafter (tests/integration/test_spec_dflash2.py says where and why), so this
row measures the serving path DFlash2 shares (SPEC=dflash2 -> method "dflash"), not DFlash2's own drafting.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from hyperqwen.bench.environment import build_environment  # noqa: E402
from hyperqwen.bench.specmodes import (  # noqa: E402
    SpecPrompt,
    compare_outputs,
    measure_mode,
    spec_modes_result,
)
from hyperqwen.config.knobs import SPEC_METHODS  # noqa: E402
from hyperqwen.formats import http  # noqa: E402
from hyperqwen.launch.serverside import ENVIRONMENT_FILE_ENV  # noqa: E402

SERVED = "qwen3.8-27b"
# What the integration servers use (tests/integration/conftest.py BASE_KNOBS), SPEC-independent.
BASE_KNOBS = {
    "MODE": "single", "BIND": "127.0.0.1", "SERVED_MODEL_NAME": SERVED, "STATE_DTYPE": "float16",
    "MAX_LEN": "2048", "MAX_SEQS": "16", "VLLM_CPU_KVCACHE_SPACE": "1", "EXTRA_ARGS": "--enforce-eager",
    "DTYPE": "bfloat16", "PREFIX_CACHE": "0",
}
COMMAND = ("PYTHONPATH=tests .venv/bin/python scripts/bench_spec_cpu.py --out "
           "bench/results/2026-12-01-cpu-tiny-qwen-spec.json")
NOTE = (
    "CPU numbers on tiny random test models (tiny-qwen: 4 layers, hidden 256; planted weights make greedy output a "
    "known successor chain and each drafter's first guess right), vLLM 0.32.0 CPU build, 2-core shared VM, "
    "prefix caching off, each SPEC at its default draft count. They show how many drafted tokens each mode gets "
    "verified per step and that greedy output is unchanged; the rates are not GPU speed. SPEC=dflash2 is served "
    "with the DFlash layout of the tiny drafter (the CPU build refuses DFlash2's candidate head; see "
    "docs/cpu-limitations.md): its row measures the shared SPEC=dflash2 serving path, not DFlash2 drafting."
)
CHAT_PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "def fibonacci(n):", "1, 2, 3, 4,"]


def document_prompts(succ: list[int]) -> list[SpecPrompt]:
    """Prompts that walk the successor chain into its cycle and twice around it (cycle 16..400 tokens)."""
    prompts: list[SpecPrompt] = []
    start = 1000
    while len(prompts) < 2:
        chain, seen = [start], {start: 0}
        while succ[chain[-1]] not in seen:
            seen[succ[chain[-1]]] = len(chain)
            chain.append(succ[chain[-1]])
        cycle = chain[seen[succ[chain[-1]]]:]
        if 16 <= len(cycle) <= 400 and len(chain) + len(cycle) <= 1200:
            prompts.append(SpecPrompt(f"document-{len(prompts) + 1}", "document", chain + cycle, 192))
        start += 7919
    return prompts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(knobs: dict[str, str], log_path: Path):
    port = free_port()
    api_key = "hq-bench-" + secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "EXTRA_ARGS", "SPEC", "DRAFT")}
    env.update({**BASE_KNOBS, **knobs, "PORT": str(port), "VLLM_API_KEY": api_key, "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                # Its own environment file: `hyperqwen serve` defaults to one path per host, which another
                # server on this machine (a test session) would overwrite while this one runs.
                ENVIRONMENT_FILE_ENV: str(log_path.with_suffix(".environment.json"))})
    command = [str(Path(sys.executable).with_name("hyperqwen")), "serve", "--mode", "single"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server for {knobs} exited ({proc.returncode}); log: {log_path}")
            with contextlib.suppress(http.HttpError):
                if http.get(f"{base}/health", timeout=5).ok:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"server for {knobs} not healthy in 900 s; log: {log_path}")
            time.sleep(2)
        yield base, api_key
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, required=True, help="result JSON to write")
    parser.add_argument("--specs", default=",".join(["none", *[s for s in SPEC_METHODS if s != "none"]]),
                        help="comma-separated SPEC values, none first (default: every SPEC value in knobs.py)")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep server logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    specs = [s.strip() for s in args.specs.split(",") if s.strip()]
    if specs[0] != "none":
        parser.error("--specs must start with none (the reference every mode is compared with)")

    from support.testmodels import TINY_DFLASH, TINY_QWEN, ensure_test_models, tiny_qwen_successor

    models = ensure_test_models(only=[TINY_QWEN, TINY_DFLASH])
    succ = tiny_qwen_successor(models[TINY_QWEN])
    prompts = [SpecPrompt(f"chat-{i + 1}", "chat", text, 48) for i, text in enumerate(CHAT_PROMPTS)]
    prompts += document_prompts(succ)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-spec-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    reference: dict[str, list[int]] = {}
    modes = []
    environment = None
    for spec in specs:
        knobs = {"MODEL": str(models[TINY_QWEN]), "SPEC": spec}
        if spec == "dflash2":
            knobs["DRAFT"] = str(models[TINY_DFLASH])
        print(f"[bench-spec] SPEC={spec}: starting the server (log {log_dir / f'{spec}.log'})", flush=True)
        with server(knobs, log_dir / f"{spec}.log") as (base, key):
            measured = measure_mode(base, key, SERVED, prompts)
            answer = http.get(f"{base}/hyperqwen/environment", api_key=key, timeout=30)
            server_knobs = (answer.json().get("knobs") if answer.ok else None) or {}
            if server_knobs.get("SPEC") != spec:
                raise SystemExit(f"SPEC={spec}: the server reports knobs {server_knobs.get('SPEC')!r}; log {log_dir}")
            if environment is None:
                version = http.get(f"{base}/version", api_key=key, timeout=30)
                metrics = http.get(f"{base}/metrics", api_key=key, timeout=30)
                environment = build_environment(
                    version=version.json().get("version") if version.ok else None,
                    metrics_text=metrics.text() if metrics.ok else None, server_log=None, env_file=None,
                    hardware="cpu", label="CPU: every SPEC on tiny-qwen (vLLM CPU build, 2-core shared VM)",
                    server=answer.json() if answer.ok else None,
                    server_note=None if answer.ok else f"/hyperqwen/environment: HTTP {answer.status}",
                )
        if spec == "none":
            reference = measured["outputs"]
        spec_knobs = {}
        wanted = {"mtp": ["DRAFT_TOKENS"], "dflash2": ["DFLASH_TOKENS"], "ngram": ["LOOKUP_TOKENS"]}
        for name in wanted.get(spec, ["DRAFT_TOKENS", "LOOKUP_TOKENS"] if spec != "none" else []):
            if name in server_knobs:
                spec_knobs[name] = server_knobs[name]
        if spec == "dflash2":
            spec_knobs["DRAFT"] = "tiny-dflash (DFlash layout)"
        modes.append({"spec": spec, "knobs": spec_knobs, "workloads": measured["workloads"],
                      "identical": compare_outputs(reference, measured["outputs"], prompts)})
        print(f"[bench-spec] SPEC={spec}: {modes[-1]['workloads']}", flush=True)

    assert environment is not None
    doc = spec_modes_result(model=SERVED, environment=environment, modes=modes, run_id=secrets.token_hex(4), seed=0,
                            duration_s=time.perf_counter() - started, command=COMMAND, note=NOTE)
    from hyperqwen.bench.cli import write_json_atomic

    write_json_atomic(args.out, doc)
    print(f"[bench-spec] wrote {args.out}; gate identical_to_no_speculation: "
          f"{doc['gates']['identical_to_no_speculation']}")
    return 0 if doc["gates"]["identical_to_no_speculation"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
