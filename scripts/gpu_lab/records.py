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
import sys
import tarfile
import tempfile
from pathlib import Path

from hyperqwen.memory.calibration import failure_reason, missing_numbers, parse_vllm_log
from hyperqwen.monitor.metrics import parse_scrape

__all__ = ["RecordError", "build_record", "failure_reason", "parse_vllm_log"]


class RecordError(ValueError):
    pass


def planner_prediction(plan: dict) -> dict:
    return {
        "pool_bytes": plan["pool_bytes"],
        "pool_tokens": plan["pool_tokens"],
        "max_concurrency": plan["max_concurrency"],
        "max_model_len": plan["max_model_len"],
        "outcome": plan["outcome"],
        "terms_bytes": {name: term["bytes"] for name, term in plan["terms"].items()},
        # The checkpoint's resident weights as its safetensors headers give them, so a later planner can be
        # replayed on the lab's checkpoint whatever its own weight terms then are: the parts the server loads
        # (the vision tower only without --language-model-only, the drafter's own weights), with nothing of the
        # planner's in them (its "resident" adds the CUDA load overhead and leaves out an EMBED_ON_HOST table).
        "header_weights_bytes": header_weights_bytes(plan),
    }


def header_weights_bytes(plan: dict) -> int:
    parts = plan["weights_bytes"]
    vision = 0 if plan["resolved"]["language_model_only"] else parts["vision"]
    return int(parts["body"] + vision + parts["drafter"])


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
        # What vLLM had already logged when it failed (its pool may be sized before the engine dies).
        record["vllm_before_failure"] = parse_vllm_log(log)
        return record
    vllm = parse_vllm_log(log)
    missing = missing_numbers(vllm)
    if missing:
        raise RecordError(f"{boot_dir.name}: vLLM's log lacks {', '.join(missing)}; not recorded as truth")
    record["vllm"] = vllm
    record["requests"] = meta.get("requests", {})
    record["alive_after_requests"] = meta.get("alive_after_requests")
    record["gpu_used_mib_serving"] = meta.get("gpu_used_mib_serving")  # nvidia-smi while serving
    metrics = boot_dir / "metrics.txt"
    if metrics.is_file():  # /metrics after the requests: what speculative decoding drafted and kept
        scrape = parse_scrape(metrics.read_text(), 0.0)
        record["spec_decode"] = {
            "drafts": scrape.spec_drafts,
            "draft_tokens": scrape.spec_draft_tokens,
            "accepted_tokens": scrape.spec_accepted,
        }
    ladder = boot_dir / "bench-ladder.json"
    if ladder.is_file():  # the `speed` request: `hyperqwen bench ladder`'s own result, without its environment
        result = json.loads(ladder.read_text())
        record["bench_ladder"] = {key: result[key] for key in ("params", "gates", "results")}
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
