"""Records: one boot of the lab (device.py's NN-name/ folder) -> one JSON file under docs/data/gpu/.

    python3 scripts/gpu_lab/records.py BOOT.tar.gz|BOOT_DIR ... [--out docs/data/gpu] [--date YYYY-MM-DD]

A record holds the settings, cold or warm, vLLM's own numbers read from its log (parse_vllm_log), the
planner's prediction for the same settings on the emulated card, the request round trips, and the GPU,
driver, CUDA, torch and vLLM versions. A boot whose log lacks a number a record needs is written as a
failure record with vLLM's reason, never as truth with holes (RecordError).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path

GiB = 1 << 30
# vLLM 0.32.0's own log lines (file: format string), parsed as written there.
PATTERNS = {
    # vllm/v1/worker/gpu_model_runner.py: "Model loading took %s GiB memory and %.6f seconds"
    "model_loading": re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds"),
    # vllm/v1/worker/gpu_worker.py: "Available KV cache memory: %s GiB"
    "available_kv": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    # vllm/v1/core/kv_cache_utils.py: "%s KV cache size: %s tokens, Maximum concurrency for %s tokens ..."
    "pool": re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
                       r"([\d.]+)x"),
    # vllm/v1/worker/gpu_worker.py, after graph capture: the consumed/peak/graph split of the start profile
    "usage": re.compile(r"Actual usage is ([\d.]+) GiB for consumed memory \(weights \+ non-torch\), ([\d.]+) GiB "
                        r"for peak activation, and ([\d.]+) GiB for CUDAGraph memory"),
    "requested": re.compile(r"Desired GPU memory utilization is \(([\d.]+), ([\d.]+) GiB\)"),
    # vllm/v1/worker/gpu_model_runner.py: "Graph capturing finished in %.0f secs, took %.2f GiB"
    "graphs": re.compile(r"Graph capturing finished in (\d+) secs, took ([\d.]+) GiB"),
    # vllm/v1/engine/core.py: "init engine (profile, create kv cache, warmup model) took %.2f s ..."
    "init": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
                       r"(?: \(compilation: ([\d.]+) s)?"),
    # vllm/compilation/monitor.py: "Initial profiling/warmup run took %.2f s" (once per compiled model: the
    # target's backbone, then a drafter's head)
    "first_profile_run": re.compile(r"Initial profiling/warmup run took ([\d.]+) s"),
    # vllm/v1/worker/gpu_worker.py: "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), ..."
    "graph_pool": re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\), ([\d.]+) GiB \(estimated\)"),
}
# A boot that failed: the last line that names the cause, as vLLM or Python printed it.
FAILURE = re.compile(r"(Error|error|Exception|CUDA out of memory|No available memory|exceeds)")
REQUIRED = ("model_loading_gib", "available_kv_gib", "pool_tokens", "max_concurrency", "consumed_gib",
            "peak_activation_gib", "cuda_graph_gib", "init_seconds")


class RecordError(ValueError):
    pass


def parse_vllm_log(text: str) -> dict:
    """vLLM's start numbers from its log; keys absent when the line is absent."""
    found: dict[str, float | int] = {}

    def last(name: str) -> re.Match | None:
        matches = list(PATTERNS[name].finditer(text))
        return matches[-1] if matches else None

    if m := last("model_loading"):
        found["model_loading_gib"], found["model_loading_seconds"] = float(m[1]), float(m[2])
    if m := last("available_kv"):
        found["available_kv_gib"] = float(m[1])
    if m := last("pool"):
        found["pool_tokens"] = int(m[1].replace(",", ""))
        found["max_model_len"] = int(m[2].replace(",", ""))
        found["max_concurrency"] = float(m[3])
    if m := last("usage"):
        found["consumed_gib"], found["peak_activation_gib"], found["cuda_graph_gib"] = map(float, m.groups())
    if m := last("requested"):
        found["gpu_util"], found["requested_gib"] = float(m[1]), float(m[2])
    graphs = list(PATTERNS["graphs"].finditer(text))
    if graphs:
        found["graph_capture_gib"] = [float(g[2]) for g in graphs]
    if m := last("init"):
        found["init_seconds"] = float(m[1])
        if m[2]:
            found["compile_seconds"] = float(m[2])
    runs = [float(m[1]) for m in PATTERNS["first_profile_run"].finditer(text)]
    if runs:
        found["first_profile_run_seconds"] = max(runs)
    if m := last("graph_pool"):
        found["graph_pool_actual_gib"], found["graph_estimate_gib"] = float(m[1]), float(m[2])
    if "consumed_gib" in found and "model_loading_gib" in found:
        found["non_torch_gib"] = round(found["consumed_gib"] - found["model_loading_gib"], 2)
    return found


def failure_reason(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if FAILURE.search(line) and "Warning" not in line]
    return lines[-1][:400] if lines else "no error line in the log (timed out?)"


def planner_prediction(plan: dict) -> dict:
    return {
        "pool_bytes": plan["pool_bytes"],
        "pool_tokens": plan["pool_tokens"],
        "max_concurrency": plan["max_concurrency"],
        "max_model_len": plan["max_model_len"],
        "outcome": plan["outcome"],
        "terms_bytes": {name: term["bytes"] for name, term in plan["terms"].items()},
        # The checkpoint's resident weights as its safetensors headers give them (no calibrated term in them), so a
        # later planner can be replayed on the lab's checkpoint whatever its own weight terms then are.
        "header_weights_bytes": plan["weights_bytes"]["resident"],
    }


def build_record(boot_dir: Path, date: str) -> dict:
    meta = json.loads((boot_dir / "meta.json").read_text())
    log_path = boot_dir / "serve.log"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    record: dict = {
        "name": meta["name"],
        "date": date,
        "mode": meta["mode"],
        "set": meta["set"],
        "emulated_card": meta["card"],
        "emulated_gpu_util": meta.get("emulated_gpu_util"),
        "compile_cache": meta["compile_cache"],
        "triton_cache_entries_before": meta["triton_cache_entries_before"],
        "stack": meta["stack"],
        "boot_seconds": meta.get("boot_seconds"),
        "status": meta["status"],
    }
    try:
        record["planner"] = planner_prediction(json.loads((boot_dir / "plan.json").read_text()))
    except (OSError, ValueError, KeyError) as exc:
        record["planner"] = {"error": f"plan.json unreadable: {exc}"}
    if meta["status"] != "served":
        record["failure"] = meta.get("reason") or failure_reason(log)
        return record
    vllm = parse_vllm_log(log)
    missing = [key for key in REQUIRED if key not in vllm]
    if missing:
        raise RecordError(f"{boot_dir.name}: vLLM's log lacks {', '.join(missing)}; not recorded as truth")
    record["vllm"] = vllm
    record["requests"] = meta.get("requests", {})
    record["alive_after_requests"] = meta.get("alive_after_requests")
    planner = record["planner"]
    if "pool_tokens" in planner:
        record["planner_vs_vllm_pool"] = round(planner["pool_tokens"] / vllm["pool_tokens"] - 1, 4)
    return record


def boot_dirs(paths: list[Path], scratch: Path) -> list[Path]:
    found = []
    for path in paths:
        if path.is_dir():
            found.append(path)
        else:
            with tarfile.open(path) as tar:
                tar.extractall(scratch, filter="data")
                found.append(scratch / tar.getnames()[0].split("/")[0])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("boots", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/data/gpu"))
    parser.add_argument("--date", required=True)
    parser.add_argument("--prefix", default="h200-as-rtx3090")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    status = 0
    with tempfile.TemporaryDirectory() as scratch:
        for boot_dir in boot_dirs(args.boots, Path(scratch)):
            try:
                record = build_record(boot_dir, args.date)
            except (RecordError, OSError, ValueError, KeyError) as exc:
                print(f"records: {exc}", file=sys.stderr)
                status = 1
                continue
            target = args.out / f"{args.date}-{args.prefix}-{record['name']}-{record['compile_cache']}.json"
            target.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
            print(f"records: {target} ({record['status']})")
    return status


if __name__ == "__main__":
    sys.exit(main())
