"""`hyperqwen bench <workload> ...` and `hyperqwen bench render FILES...`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from pathlib import Path

from hyperqwen.bench import data
from hyperqwen.bench.client import BenchClient, BenchError, mask_key
from hyperqwen.bench.definitions import DEFINITIONS_VERSION
from hyperqwen.bench.environment import build_environment
from hyperqwen.bench.render import SCHEMA, render
from hyperqwen.bench.workloads import WORKLOADS, RunContext

# Options forwarded to workloads (dest names); each workload reads the ones it uses.
WORKLOAD_OPTIONS = ("concurrency", "requests", "prompt_tokens", "context_tokens", "lengths", "depths", "repeats",
                    "dataset", "limit", "window_chars", "no_ignore_eos")


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="server root or /v1 URL, e.g. http://127.0.0.1:18020")
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="bearer key (default: $VLLM_API_KEY); never printed")
    key.add_argument("--api-key-file", type=Path, help="file holding the bearer key")
    parser.add_argument("--model", help="model name (default: the first of /v1/models)")
    parser.add_argument("--out", type=Path, help="write the result JSON here (default: stdout)")
    parser.add_argument("--label", help="title of this run in the rendered tables")
    parser.add_argument("--hardware", help="hardware class label (default: gpu if nvidia-smi sees one, else cpu)")
    parser.add_argument("--seed", type=int, default=1234, help="sampling and selection seed (default 1234)")
    parser.add_argument("--run-id", help="salt prefix (default: random, so no earlier run's cache can help)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0, greedy)")
    parser.add_argument("--max-tokens", type=int, help="output tokens per request (workload default if unset)")
    parser.add_argument("--concurrency", help="comma-separated concurrency levels (chat, ladder) or workers (gsm8k)")
    parser.add_argument("--requests", type=int, help="requests per cohort (chat, ladder)")
    parser.add_argument("--prompt-tokens", type=int, help="ladder prompt length (default 4096)")
    parser.add_argument("--context-tokens", type=int, help="document length for prefix/longdoc/needle (default 8192)")
    parser.add_argument("--lengths", help="prefill input lengths, comma-separated")
    parser.add_argument("--depths", help="needle depths within 0..1, comma-separated")
    parser.add_argument("--repeats", type=int, help="repetitions (prefill, prefix, gates)")
    parser.add_argument("--dataset", help="full dataset path (gsm8k: jsonl; perplexity: text)")
    parser.add_argument("--limit", type=int, help="use only the first N items (gsm8k, perplexity)")
    parser.add_argument("--window-chars", type=int, help="perplexity window size in characters (default 2000)")
    parser.add_argument("--no-ignore-eos", action="store_true", help="ladder: do not send vLLM's ignore_eos")
    parser.add_argument("--data-dir", type=Path, help="bench data directory (default: bench/data of this checkout)")
    parser.add_argument("--server-log", type=Path, help="vLLM log to read the KV pool size from")
    parser.add_argument("--env-file", type=Path, help=".env whose knobs describe the server (default: environment)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks and correctness gates against an OpenAI-compatible server",
                                  description="Run a workload and save one JSON result, or render results to Markdown.")
    inner = bench.add_subparsers(dest="bench_command", required=True, metavar="<workload>|render")
    for name, (_, doc) in WORKLOADS.items():
        sub = inner.add_parser(name, help=doc, description=doc)
        _add_run_arguments(sub)
        sub.set_defaults(func=run_command, workload=name)
    rend = inner.add_parser("render", help="Markdown tables from result JSON files (prints to stdout)")
    rend.add_argument("files", nargs="+", type=Path)
    rend.set_defaults(func=render_command)


def _api_key(args) -> str | None:
    if args.api_key_file:
        if not args.api_key_file.is_file():
            raise BenchError(f"--api-key-file {args.api_key_file}: no such file")
        return args.api_key_file.read_text().strip()
    return args.api_key or os.environ.get("VLLM_API_KEY") or None


async def run_workload(args) -> dict:
    """Run one workload; returns the result document (also used by tests)."""
    func, _ = WORKLOADS[args.workload]
    root = data.data_dir(args.data_dir)
    async with BenchClient(args.url, _api_key(args), args.model, timeout_s=args.timeout) as client:
        model = await client.resolve_model()
        version = await client.version()
        metrics_text = await client.metrics_text()
        options = {name: getattr(args, name, None) for name in WORKLOAD_OPTIONS}
        ctx = RunContext(client=client, data_root=root, run_id=args.run_id or secrets.token_hex(4), seed=args.seed,
                         temperature=args.temperature, max_tokens=args.max_tokens, options=options)
        t0 = time.perf_counter()
        results = await func(ctx)
        duration = time.perf_counter() - t0
        environment = build_environment(version=version, metrics_text=metrics_text, server_log=args.server_log,
                                        env_file=args.env_file, hardware=args.hardware, label=args.label)
    params = {"temperature": args.temperature, "max_tokens": args.max_tokens,
              **{k: v for k, v in options.items() if v not in (None, False)}}
    return {"schema": SCHEMA, "definitions_version": DEFINITIONS_VERSION, "workload": args.workload,
            "model": model, "server_url": client.base_url, "run_id": ctx.run_id, "seed": args.seed,
            "params": params, "duration_s": duration, "environment": environment, "gates": ctx.gates,
            "results": results}


def run_command(args) -> int:
    try:
        doc = asyncio.run(run_workload(args))
    except BenchError as exc:
        print(f"hyperqwen bench: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"hyperqwen bench: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(args.out)  # never leave a half-written result
        print(f"hyperqwen bench: {args.workload} against {doc['server_url']} (key {mask_key(_api_key(args))}) "
              f"-> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    failed = [name for name, gate in doc["gates"].items() if not gate["passed"]]
    if failed:
        print(f"hyperqwen bench: gates failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def render_command(args) -> int:
    try:
        sys.stdout.write(render(args.files))
    except BenchError as exc:
        print(f"hyperqwen bench render: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperqwen", allow_abbrev=False)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
