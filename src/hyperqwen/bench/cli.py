"""`hyperqwen bench suite|<workload>|render|report ...`.

Registering the commands imports nothing beyond the standard library, so `hyperqwen bench --help` answers on
a base install; running one imports the bench extra (aiohttp, tqdm, matplotlib) and, when it is missing,
exits 2 with one line naming the extra.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from hyperqwen.bench.errors import EXTRA_HINT, BenchError, mask_key

# Workload name -> one-line description (workloads.WORKLOADS holds the functions; a test keeps them equal).
WORKLOAD_DOCS: dict[str, str] = {
    "chat": "chat prompts (en, code, other languages) in cohorts at concurrency 1/2/4/8",
    "ladder": "concurrency ladder 1..64: distinct prompts, whole waves, ignore_eos",
    "prefill": "prefill rate by input length (salted prompts, max_tokens 1)",
    "prefix": "prefix cache: turn-2 TTFT over a long document vs cold turn 1",
    "reproduce": "long-document reproduction: copy a ~25k-token document, tokens per verify step",
    "longdoc": "long-document tasks: verbatim copy, edit, quote, summarise, answer (token-level exact match)",
    "needle": "needle in a haystack at several depths (exact match on a unique code, decoy present)",
    "gates": "correctness gates: verbatim copy, tool-call round trip, JSON schema, greedy repeatability",
    "gsm8k": "GSM8K exact match (built-in sample or --dataset), gated at the stated pass mark",
    "perplexity": "perplexity from prompt logprobs (built-in corpus or --dataset)",
}

# Options forwarded to workloads (dest names); each workload reads the ones it uses.
WORKLOAD_OPTIONS = (
    "concurrency",
    "requests",
    "waves",
    "prompt_tokens",
    "context_tokens",
    "lengths",
    "depths",
    "repeats",
    "dataset",
    "limit",
    "window_chars",
    "no_ignore_eos",
    "check_samples",
)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="server root or /v1 URL, e.g. http://127.0.0.1:18020")
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="bearer key (default: $VLLM_API_KEY); never printed")
    key.add_argument("--api-key-file", type=Path, help="file holding the bearer key")
    parser.add_argument("--model", help="model name (default: the first of /v1/models)")
    parser.add_argument("--label", help="title of this run in the rendered tables")
    parser.add_argument("--hardware", help="hardware class label (default: from the server's environment route)")
    parser.add_argument("--seed", type=int, default=1234, help="sampling and selection seed (default 1234)")
    parser.add_argument("--run-id", help="salt prefix (default: random, so no earlier run's cache can help)")
    parser.add_argument("--data-dir", type=Path, help="bench data directory (default: bench/data of this checkout)")
    parser.add_argument("--server-log", type=Path, help="vLLM log to read the KV pool size from")
    parser.add_argument(
        "--env-file", type=Path, help="only when the server has no environment route: .env describing its knobs"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    parser.add_argument(
        "--thinking",
        action="store_true",
        help="leave the model's thinking on (default: chat_template_kwargs enable_thinking=false, "
        "as the reference measured)",
    )


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser)
    parser.add_argument("--out", type=Path, help="write the result JSON here (default: stdout)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature (default 0, greedy; -1: the server's default sampling)",
    )
    parser.add_argument("--max-tokens", type=int, help="output tokens per request (workload default if unset)")
    parser.add_argument("--concurrency", help="comma-separated concurrency levels (chat, ladder) or workers (gsm8k)")
    parser.add_argument("--requests", type=int, help="requests per cohort (chat, ladder; default: whole waves)")
    parser.add_argument("--waves", type=int, help="waves of C requests per cohort (chat default 2, ladder 1)")
    parser.add_argument("--prompt-tokens", type=int, help="ladder prompt length (default 4096)")
    parser.add_argument("--context-tokens", type=int, help="document length for prefix/longdoc/needle/reproduce")
    parser.add_argument("--lengths", help="prefill input lengths, comma-separated")
    parser.add_argument("--depths", help="needle depths within 0..1, comma-separated")
    parser.add_argument("--repeats", type=int, help="repetitions (prefill, prefix, gates)")
    parser.add_argument("--dataset", help="full dataset path (gsm8k: jsonl; perplexity: text)")
    parser.add_argument("--limit", type=int, help="use only the first N items (gsm8k, perplexity)")
    parser.add_argument("--window-chars", type=int, help="perplexity window size in characters (default 2000)")
    parser.add_argument("--no-ignore-eos", action="store_true", help="ladder: do not send vLLM's ignore_eos")
    parser.add_argument(
        "--check-samples",
        type=int,
        help="greedy cohorts: requests per cohort re-run alone as the greedy reference (default 1)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench",
        help="benchmarks and correctness gates against an OpenAI-compatible server",
        description="`suite` runs the whole field report; a workload name runs one workload and saves one JSON "
        "result; `render` turns result files into Markdown; `report` rebuilds a suite's report.",
    )
    inner = bench.add_subparsers(dest="bench_command", required=True, metavar="suite|<workload>|render|report")
    from hyperqwen.bench import suite  # standard library only at import time

    suite.register(inner)
    for name, doc in WORKLOAD_DOCS.items():
        sub = inner.add_parser(name, help=doc, description=doc)
        _add_run_arguments(sub)
        sub.set_defaults(func=run_command, workload=name)
    rend = inner.add_parser("render", help="Markdown tables from result JSON files (prints to stdout)")
    rend.add_argument("files", nargs="+", type=Path)
    rend.set_defaults(func=render_command)


def api_key(args: argparse.Namespace) -> str | None:
    if getattr(args, "api_key_file", None):
        if not args.api_key_file.is_file():
            raise BenchError(f"--api-key-file {args.api_key_file}: no such file")
        return args.api_key_file.read_text().strip()
    return getattr(args, "api_key", None) or os.environ.get("VLLM_API_KEY") or None


def missing_extra() -> str | None:
    """The bench extra's first missing module, or None when everything a run needs imports."""
    for module in ("aiohttp", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            return module
    return None


def temperature_of(args: argparse.Namespace) -> float | None:
    value = getattr(args, "temperature", 0.0)
    return None if value is not None and value < 0 else value


async def fetch_server_environment(client: Any) -> tuple[dict | None, str | None]:
    """The server's authenticated environment route: (body, None) or (None, why not)."""
    from hyperqwen.bench.serverside import ROUTE

    status, body = await client.get_json(ROUTE)
    if status == 200 and body is not None:
        return body, None
    reasons = {
        0: "no answer",
        401: "401: wrong or missing --api-key",
        403: "403: the server has no API key, so it keeps its environment private",
        404: "404: not a HyperQwen server (patch 0050 not applied)",
    }
    return None, f"{ROUTE}: {reasons.get(status, f'HTTP {status}')}"


def request_gate(client: Any) -> dict:
    """Fail when the run's requests mostly failed (or all did): an all-dash table is not a result."""
    from hyperqwen.bench.workloads import MAX_FAILED_SHARE

    total, failed = client.requests_total, client.requests_failed
    passed = total > 0 and failed <= MAX_FAILED_SHARE * total
    gate = {
        "passed": passed,
        "requests": total,
        "failed": failed,
        "pass_mark": f"at most {MAX_FAILED_SHARE:.0%} failed",
    }
    if client.first_error:
        gate["first_error"] = client.first_error[:300]
    return gate


async def run_workload(args: argparse.Namespace, client: Any = None, environment: dict | None = None) -> dict:
    """Run one workload; returns the result document (also used by the suite and by tests)."""
    import secrets
    import time

    from hyperqwen.bench import data
    from hyperqwen.bench.client import BenchClient
    from hyperqwen.bench.definitions import DEFINITIONS_VERSION
    from hyperqwen.bench.environment import build_environment
    from hyperqwen.bench.render import SCHEMA
    from hyperqwen.bench.workloads import WORKLOADS, RunContext

    func, _ = WORKLOADS[args.workload]
    root = data.data_dir(args.data_dir)
    own = client is None
    if own:
        client = BenchClient(args.url, api_key(args), args.model, timeout_s=args.timeout)
        client.chat_extra = {} if args.thinking else {"chat_template_kwargs": {"enable_thinking": False}}
    try:
        model = await client.resolve_model()
        if environment is None:
            version = await client.version()
            metrics_text = await client.metrics_text()
            server, note = await fetch_server_environment(client)
            environment = build_environment(
                version=version,
                metrics_text=metrics_text,
                server_log=args.server_log,
                env_file=args.env_file,
                hardware=args.hardware,
                label=args.label,
                server=server,
                server_note=note,
            )
        options = {name: getattr(args, name, None) for name in WORKLOAD_OPTIONS}
        counts = (client.requests_total, client.requests_failed, client.first_error)
        client.requests_total, client.requests_failed, client.first_error = 0, 0, None
        ctx = RunContext(
            client=client,
            data_root=root,
            run_id=args.run_id or secrets.token_hex(4),
            seed=args.seed,
            temperature=temperature_of(args),
            max_tokens=args.max_tokens,
            options=options,
        )
        t0 = time.perf_counter()
        results = await func(ctx)
        duration = time.perf_counter() - t0
        ctx.gates["requests"] = request_gate(client)
        client.requests_total += counts[0]
        client.requests_failed += counts[1]
        client.first_error = client.first_error or counts[2]
        warnings = dict(client.warnings)
    finally:
        if own:
            await client.close()
    params = {
        "temperature": temperature_of(args),
        "max_tokens": args.max_tokens,
        **{k: v for k, v in options.items() if v not in (None, False)},
    }
    return {
        "schema": SCHEMA,
        "definitions_version": DEFINITIONS_VERSION,
        "workload": args.workload,
        "model": model,
        "server_url": client.base_url,
        "run_id": ctx.run_id,
        "seed": args.seed,
        "params": params,
        "duration_s": duration,
        "environment": environment,
        "gates": ctx.gates,
        "warnings": warnings,
        "results": results,
    }


def write_json_atomic(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)  # never leave a half-written result


def failed_gates(doc: dict) -> list[str]:
    return [name for name, gate in doc.get("gates", {}).items() if not gate["passed"]]


def run_command(args: argparse.Namespace) -> int:
    import asyncio

    missing = missing_extra()
    if missing:
        print(f"hyperqwen bench: needs the bench extra ({missing} is not installed): {EXTRA_HINT}", file=sys.stderr)
        return 2
    try:
        doc = asyncio.run(run_workload(args))
    except (BenchError, FileNotFoundError) as exc:
        print(f"hyperqwen bench: {exc}", file=sys.stderr)
        return 2
    for text in doc["warnings"].values():
        print(f"hyperqwen bench: warning: {text}", file=sys.stderr)
    if args.out:
        write_json_atomic(args.out, doc)
        print(
            f"hyperqwen bench: {args.workload} against {doc['server_url']} (key {mask_key(api_key(args))}) "
            f"-> {args.out}",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    failed = failed_gates(doc)
    if failed:
        print(f"hyperqwen bench: gates failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def render_command(args: argparse.Namespace) -> int:
    from hyperqwen.bench.render import render

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
    return int(args.func(args))
