"""`hyperqwen bench suite|<workload>|render|report ...`.

Registering the commands imports nothing beyond the standard library, so `hyperqwen bench --help` answers on
a base install; running one imports the bench extra (aiohttp, tqdm, matplotlib) and, when it is missing,
exits 2 with one line naming the extra.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hyperqwen.bench.errors import EXTRA_HINT, BenchError, mask_key
from hyperqwen.bench.runner import (
    add_server_arguments,
    api_key,
    failed_gates,
    missing_extra,
    run_workload,
    write_json_atomic,
)
from hyperqwen.commands import add_command
from hyperqwen.exit_codes import Exit

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
    bench = add_command(subparsers, "bench")
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


def run_command(args: argparse.Namespace) -> int:
    import asyncio

    missing = missing_extra()
    if missing:
        print(f"hyperqwen bench: needs the bench extra ({missing} is not installed): {EXTRA_HINT}", file=sys.stderr)
        return Exit.BAD_INPUT
    try:
        doc = asyncio.run(run_workload(args))
    except (BenchError, FileNotFoundError) as exc:
        print(f"hyperqwen bench: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
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
        return Exit.FAILED
    return Exit.OK


def render_command(args: argparse.Namespace) -> int:
    from hyperqwen.bench.render import render

    try:
        sys.stdout.write(render(args.files))
    except BenchError as exc:
        print(f"hyperqwen bench render: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    return Exit.OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperqwen", allow_abbrev=False)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))
