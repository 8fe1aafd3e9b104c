"""`hyperqwen plan`: the GPU memory budget for a card, before anything is loaded or downloaded.

Exit codes (memory/verdict.py, the verdict serve, verify and replicas give too): 0 fits, so `serve` would
start (MAX_LEN unset: maybe with a shorter context the planner chose, said on the last line); 3 the MAX_LEN set
does not fit, a shorter one does; 4 vLLM would refuse to boot; 5 the card would be full after boot; 2 bad
input or a refusal (one line naming the knob, no traceback). 1 is never used on purpose: Python exits 1 on an
uncaught error, which must not read as a verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hyperqwen.commands import add_command
from hyperqwen.config.load import add_settings_arguments, settings_from_args
from hyperqwen.config.settings import SettingsError
from hyperqwen.config.sizes import SizeError, parse_size
from hyperqwen.exit_codes import Exit
from hyperqwen.memory.budget import MemoryBudget, MemoryPlanError, Outcome, format_gib
from hyperqwen.memory.checkpoint import CheckpointError
from hyperqwen.memory.gpu import GpuError, add_card_argument, parse_gpu
from hyperqwen.memory.host import HostFacts, read_host_facts
from hyperqwen.memory.verdict import judge

EXIT_BAD_INPUT = Exit.BAD_INPUT


def row(label: str, value: str, note: str = "") -> str:
    return f"  {label:<34} {value:>16}  {note}"


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def render_table(b: MemoryBudget) -> str:
    """The whole plan (`--verbose`): vLLM's start in order, the KV cache arithmetic, the result."""
    return "\n".join([*_start_rows(b), *_kv_rows(b), *_result_rows(b)])


def _start_rows(b: MemoryBudget) -> list[str]:
    i, r = b.inputs, b.resolved
    lines = [
        f"Memory plan: {b.gpu.name} (total {format_gib(b.gpu.total_bytes)}, free {format_gib(b.gpu.free_bytes)}; "
        f"{b.gpu.source})",
        f"  checkpoint: {b.checkpoint_source}",
        f"  KV {i.kv_cache_dtype}, GDN state {r['state_dtype']}, SPEC {i.spec_method} "
        f"k={i.num_speculative_tokens}, prefix caching {'on' if i.prefix_caching else 'off'} "
        f"(mamba mode {r['mamba_cache_mode']}), MAX_SEQS {i.max_num_seqs}, MAX_BATCHED_TOKENS "
        f"{i.max_num_batched_tokens}, "
        + (
            f"KV_MEM {i.kv_cache_memory_bytes:,} B"
            if i.kv_cache_memory_bytes
            else f"GPU_UTIL {i.gpu_memory_utilization}"
        ),
        "",
        "vLLM's start, in order:",
    ]
    t = b.terms
    lines.append(row("1. CUDA context", mib(t["cuda_context"].value), t["cuda_context"].source))
    lines.append(row("   free at vLLM's start snapshot", format_gib(b.free_at_start_bytes)))
    lines.append(
        row(
            "2. startup check: requested",
            format_gib(b.requested_bytes),
            f"ceil(total x {i.gpu_memory_utilization}) must be <= free at start",
        )
    )
    lines.append(
        row(
            "3. weights",
            mib(t["weights"].value),
            f"incl. drafter {mib(t['drafter_weights'].value)}; vision "
            f"{'skipped' if i.language_model_only else 'loaded'}; {t['weights'].source}",
        )
    )
    if t["load_transient"].value:
        lines.append(row("   load transient", mib(t["load_transient"].value), t["load_transient"].source))
    lines.append(row("4. activation peak (profile)", mib(t["activation_peak"].value), t["activation_peak"].source))
    lines.append(row("5. CUDA graphs + non-torch", mib(t["cuda_graphs"].value), t["cuda_graphs"].source))
    if t["uncounted_graphs"].value:
        lines.append(
            row("   graphs vLLM does not count", mib(t["uncounted_graphs"].value), t["uncounted_graphs"].source)
        )
    lines.append(row("6. KV pool", f"{b.pool_bytes:,} B", f"{format_gib(b.pool_bytes)}, {b.num_blocks} blocks"))
    lines.append(row("7. boot check margin", mib(t["profile_margin"].value), t["profile_margin"].source))
    lines.append(
        row(
            "8. free after boot",
            format_gib(b.headroom_bytes),
            f"must stay >= HEADROOM_FLOOR {mib(t['headroom_floor'].value)}",
        )
    )
    lines.append(row("RAM cache (host, pinned)", str(r["ram_cache"]), "RAM_CACHE -> --kv-offloading-size"))
    lines.append(row("embed_tokens in host RAM", str(r["embed_on_host"]), "EMBED_ON_HOST -> --cpu-offload-params"))
    return lines


def _kv_rows(b: MemoryBudget) -> list[str]:
    lay = b.layout
    lines = ["", "KV cache (vLLM 0.32.0 arithmetic):"]
    lines.append(row("KV bytes / token / attn layer", f"{b.attn_bytes_per_token_layer:,} B"))
    lines.append(row("KV bytes / token (all layers)", f"{b.kv_bytes_per_token:,} B"))
    lines.append(
        row(
            "GDN state page (conv + SSM)",
            f"{b.gdn_page['bytes']:,} B",
            f"conv {b.gdn_page['conv_bytes']:,} + ssm {b.gdn_page['ssm_bytes']:,}",
        )
    )
    lines.append(
        row(
            "attention block size",
            f"{lay.attention_block_size} tok",
            f"GDN page padded by {lay.mamba_padding_pct:.2f}% to {lay.mamba_page_padded:,} B",
        )
    )
    lines.append(
        row(
            "groups",
            " + ".join(f"{g.num_layers}{g.spec.kind[0]}" for g in lay.groups),
            f"bytes per block {lay.bytes_per_block:,}",
        )
    )
    lines.append(row("state pages / request / group", str(lay.state_blocks_per_group)))
    return lines


def _result_rows(b: MemoryBudget) -> list[str]:
    i = b.inputs
    lines = ["", "Result:"]
    lines.append(row("MAX_LEN", f"{b.max_model_len:,}", "the context a request may use (--max-model-len)"))
    lines.append(
        row("pool tokens (vLLM's log line)", f"{b.pool_tokens:,}", "vLLM's 'GPU KV cache size': concurrency x MAX_LEN")
    )
    lines.append(row("max concurrency at MAX_LEN", f"{b.max_concurrency}x", "vLLM's 'Maximum concurrency' line"))
    lines.append(
        row(
            "longest context of one request",
            f"{b.longest_context:,}",
            "the longest single request this pool holds",
        )
    )
    for n, c in b.resident_requests.items():
        capped = b.layout.resident_requests(b.pool_bytes, n) > i.max_num_seqs
        lines.append(row(f"requests resident at {n:,} tokens", f"{c:,}", "capped by MAX_SEQS" if capped else ""))
    lines.append(row("largest MAX_LEN that fits", f"{b.largest_fitting_max_len:,}", b.largest_note.strip()))
    lines.append(row("largest KV_MEM keeping the floor", f"{b.suggested_kv_mem:,} B", format_gib(b.suggested_kv_mem)))
    lines.append("")
    lines.append(f"{b.outcome.value.upper()} (exit {b.outcome.exit_code})")
    if not b.fits:
        lines.append(b.explain_failure())
    return lines


def one_change(b: MemoryBudget) -> str:
    """The single change to try first: nothing when it fits; the context when only the context is too long;
    else the planner's first hint."""
    if b.fits:
        return "none needed"
    if b.outcome is Outcome.SHORTER and b.largest_fitting_max_len:
        return f"set MAX_LEN={b.largest_fitting_max_len}{b.largest_note}"
    if b.fix_hints:
        return b.fix_hints[0]
    if b.largest_fitting_max_len:
        return f"set MAX_LEN={b.largest_fitting_max_len}{b.largest_note}"
    return "no setting fits this card; see --verbose"


def render_answer(b: MemoryBudget, exit_code: int) -> str:
    """The short answer: verdict, context, seats, pool, the one change. The table is under --verbose."""
    i = b.inputs
    seats = ", ".join(f"{c:,} of {n:,}" for n, c in b.resident_requests.items())
    return "\n".join(
        [
            f"{b.outcome.value.upper()} (exit {exit_code}) on {b.gpu.name}, {format_gib(b.gpu.total_bytes)}",
            f"  context   MAX_LEN={b.max_model_len:,} tokens per request",
            f"  seats     {seats} tokens: requests served at once (MAX_SEQS={i.max_num_seqs})",
            f"  pool      KV {format_gib(b.pool_bytes)} = {b.pool_tokens:,} tokens ({i.kv_cache_dtype}); "
            f"{format_gib(b.headroom_bytes)} free after boot",
            f"  change    {one_change(b)}",
            "Every term and where it comes from: hyperqwen plan --verbose",
        ]
    )


def _fail(message: str, as_json: bool = False) -> int:
    if as_json:
        print(json.dumps({"error": message, "exit_code": EXIT_BAD_INPUT}))
    print(f"hyperqwen plan: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def model_dir_problem(path: Path) -> str | None:
    """Why --model-dir cannot be a checkpoint directory (missing, a file, unreadable), or None."""
    try:
        if not path.exists():
            return "does not exist"
        if not path.is_dir():
            return "is a file, not a checkpoint directory"
    except OSError as exc:  # a parent without search permission, a name too long
        return f"cannot be checked ({exc.strerror or type(exc).__name__})"
    if not os.access(path, os.R_OK | os.X_OK):
        return "cannot be read (permission denied)"
    return None


def run_plan(args: argparse.Namespace) -> int:
    if args.model_dir:
        problem = model_dir_problem(Path(args.model_dir))
        if problem:
            shown = args.model_dir if len(args.model_dir) <= 120 else args.model_dir[:117] + "..."
            return _fail(
                f"--model-dir {shown} {problem}; give a prepared checkpoint directory (config.json and "
                "*.safetensors), or leave --model-dir out to plan MODELS_DIR/MODEL"
            )
    try:
        gpu = parse_gpu(args.gpu, reserved=args.reserved, wsl2=args.wsl2)
        settings = settings_from_args(args, os.environ)
        model_dir = Path(args.model_dir) if args.model_dir else None
        host = read_host_facts()
        if args.host_ram:
            ram = parse_size(args.host_ram)
            host = HostFacts(ram, ram, args.wsl2, f"--host-ram {args.host_ram}")
        # The verdict serve, verify and replicas give too (memory/verdict.py): same refusals, same MAX_LEN.
        verdict = judge(settings, gpu, host=host, model_dir=model_dir)
    except GpuError as exc:
        return _fail(str(exc), args.json)
    except SizeError as exc:
        return _fail(f"--host-ram={args.host_ram!r} {exc}", args.json)
    except SettingsError as exc:
        errors = [p.message for p in exc.problems if p.severity == "error"] or [str(exc)]
        return _fail("; ".join(errors), args.json)
    except (MemoryPlanError, CheckpointError) as exc:
        return _fail(str(exc), args.json)
    except (OSError, UnicodeDecodeError) as exc:  # a file in the checkpoint that cannot be read
        where = getattr(exc, "filename", None) or args.model_dir or "the checkpoint"
        return _fail(f"cannot read {where} ({getattr(exc, 'strerror', None) or type(exc).__name__})", args.json)
    if verdict.refusals:
        return _fail("; ".join(p.message for p in verdict.refusals), args.json)
    budget = verdict.budget
    assert budget is not None  # a card was given and nothing was refused: judge planned it
    if args.json:
        print(json.dumps({**budget.to_dict(), "exit_code": verdict.exit_code, "notes": list(verdict.notes)}, indent=2))
    else:
        print(render_table(budget) if args.verbose else render_answer(budget, verdict.exit_code))
        for note in verdict.notes:
            print(note)
    return verdict.exit_code


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "plan", func=run_plan)
    add_card_argument(p, "the card to plan for", default="rtx3090", default_text="rtx3090")
    p.add_argument("--wsl2", action="store_true", help="the card under WSL2 (its driver leaves ~0.5 GiB less)")
    p.add_argument("--reserved", help="memory other programs hold on the card (desktop, browser), e.g. 1.5GiB")
    p.add_argument("--host-ram", help="host RAM available for RAM_CACHE, e.g. 64GiB (default: this machine's)")
    p.add_argument(
        "--json", action="store_true", help='print the budget as JSON; bad input prints {"error": ..., "exit_code": 2}'
    )
    p.add_argument("--verbose", "-v", action="store_true", help="print every term of the budget and its source")
    p.add_argument("--model-dir", help="checkpoint directory (default: MODELS_DIR/MODEL, else the bundled shapes)")
    add_settings_arguments(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperqwen", allow_abbrev=False)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
