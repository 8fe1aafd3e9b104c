"""Running one workload against a server: the library the `bench` commands (cli.py, suite.py) share.

Standard library only at import time; the bench extra (aiohttp, prometheus_client) is imported by the run.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from hyperqwen.bench.errors import BenchError

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


def api_key(args: argparse.Namespace) -> str | None:
    if getattr(args, "api_key_file", None):
        if not args.api_key_file.is_file():
            raise BenchError(f"--api-key-file {args.api_key_file}: no such file")
        return args.api_key_file.read_text().strip()
    # The bench host's own environment, by name: the bench resolves no Settings (it is a client of the server).
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
    from hyperqwen.launch.serverside import ROUTE

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


async def report_environment(client: Any, args: argparse.Namespace) -> tuple[dict, str | None]:
    """The result's environment block: the server's own (its environment route) and this host's, plus why the
    server's is missing when it is (None when it is there)."""
    from hyperqwen.bench.environment import build_environment

    server, note = await fetch_server_environment(client)
    environment = build_environment(
        version=await client.version(),
        metrics_text=await client.metrics_text(),
        server_log=args.server_log,
        env_file=args.env_file,
        hardware=args.hardware,
        label=args.label,
        server=server,
        server_note=note,
    )
    return environment, note


async def run_workload(args: argparse.Namespace, client: Any = None, environment: dict | None = None) -> dict:
    """Run one workload; returns the result document (also used by the suite and by tests)."""
    import secrets
    import time

    from hyperqwen.bench import data
    from hyperqwen.bench.client import BenchClient
    from hyperqwen.bench.definitions import DEFINITIONS_VERSION
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
            environment, _ = await report_environment(client, args)
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
