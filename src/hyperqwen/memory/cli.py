"""`hyperqwen plan`: print the memory budget for a card before anything is loaded."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hyperqwen.memory.budget import (
    OVERRIDABLE_TERMS,
    GpuFacts,
    MemoryBudget,
    MemoryPlanError,
    format_gib,
    parse_size,
    plan_memory,
)
from hyperqwen.config.knobs import MODES
from hyperqwen.memory.checkpoint import CheckpointError

def resolve_knobs(mode: str, sets: dict[str, str], environ: dict[str, str]
                  ) -> tuple[dict[str, object], dict[str, int], Path]:
    """Knobs through the one settings schema (defaults < mode profile < environment < --set), plus the
    measured-term overrides. Returns (planner knobs, term overrides, model directory)."""
    from hyperqwen.launch.budget import memory_knobs
    from hyperqwen.config.settings import SettingsError, resolve_settings

    overrides: dict[str, int] = {}
    knob_sets: dict[str, str] = {}
    for key, value in sets.items():
        if key in OVERRIDABLE_TERMS:
            overrides[key] = parse_size(value, key) if key != "KERNEL_BLOCK_ALIGNMENT" else int(value)
        else:
            knob_sets[key] = value
    try:
        settings = resolve_settings(environ, mode=mode, overrides=knob_sets)
    except SettingsError as exc:
        errors = "; ".join(p.message for p in exc.problems if p.severity == "error")
        raise MemoryPlanError(f"{errors} (measured terms for --set: {', '.join(OVERRIDABLE_TERMS)})") from None
    return memory_knobs(settings), overrides, settings.model_path


def render_table(b: MemoryBudget) -> str:
    def row(label: str, value: str, note: str = "") -> str:
        return f"  {label:<34} {value:>16}  {note}"

    mib = lambda n: f"{n / 2**20:,.0f} MiB"  # noqa: E731
    k, r, lay = b.knobs, b.resolved, b.layout
    lines = [f"Memory plan: {b.gpu.name} ({b.gpu.source}): total {format_gib(b.gpu.total_bytes)}, "
             f"free {format_gib(b.gpu.free_bytes)}",
             f"  KV {k.kv_cache_dtype}, GDN state {r['state_dtype']}, SPEC {k.spec_method} k={k.num_speculative_tokens}, "
             f"prefix caching {'on' if k.prefix_caching else 'off'} (mamba mode {r['mamba_cache_mode']}), "
             f"MAX_SEQS {k.max_num_seqs}", "", "Weights and non-pool terms:"]
    lines.append(row("weights resident", mib(b.weights["resident"]),
                     f"body {mib(b.weights['body'])}, vision "
                     f"{'skipped' if k.language_model_only else mib(b.weights['vision'])}"))
    for name, t in b.terms.items():
        if name == "weights":
            continue
        lines.append(row(name, mib(t.value), t.source))
    lines += ["", "KV cache:"]
    lines.append(row("KV bytes / token / attn layer", f"{b.attn_bytes_per_token_layer:,} B"))
    lines.append(row("KV bytes / token (all layers)", f"{b.kv_bytes_per_token:,} B"))
    lines.append(row("GDN state page (conv + SSM)", f"{b.gdn_page['bytes']:,} B",
                     f"conv {b.gdn_page['conv_bytes']:,} + ssm {b.gdn_page['ssm_bytes']:,}"))
    lines.append(row("attention block size", f"{lay.attention_block_size} tok",
                     f"GDN page padded by {lay.mamba_padding_pct:.2f}% to {lay.mamba_page_padded:,} B"))
    lines.append(row("groups", " + ".join(f"{g.num_layers}{g.spec.kind[0]}" for g in lay.groups),
                     f"bytes per block {lay.bytes_per_block:,}"))
    lines.append(row("state pages / request / group", str(lay.state_blocks_per_group)))
    lines.append(row("KV pool", f"{b.pool_bytes:,} B", f"{format_gib(b.pool_bytes)}, {b.num_blocks} blocks"))
    lines += ["", "Result:"]
    lines.append(row("MAX_LEN", f"{b.max_model_len:,}", "(chosen)" if k.max_model_len is None else ""))
    lines.append(row("pool tokens (vLLM's log line)", f"{b.pool_tokens:,}"))
    lines.append(row("longest context of one request", f"{b.longest_context:,}"))
    for n, c in b.resident_requests.items():
        lines.append(row(f"requests resident at {n:,} tokens", f"{c:,}"))
    lines.append(row("largest KV_MEM keeping the floor", f"{b.suggested_kv_mem:,} B", format_gib(b.suggested_kv_mem)))
    lines.append(row("free after boot (headroom)", format_gib(b.headroom_bytes),
                     f"floor {format_gib(b.terms['headroom_floor'].value)}"))
    lines.append("")
    lines.append("FITS" if b.fits else b.explain_failure())
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    try:
        sets = {}
        for item in args.set or []:
            if "=" not in item:
                raise MemoryPlanError(f"--set {item!r}: expected KNOB=VALUE")
            key, value = item.split("=", 1)
            sets[key.strip()] = value.strip()
        knobs, overrides, default_model_dir = resolve_knobs(args.mode, sets, dict(os.environ))
        total = parse_size(args.gpu, "--gpu")
        reserved = parse_size(args.reserved, "--reserved") if args.reserved else 0
        gpu = GpuFacts.nominal(total, reserved_bytes=reserved, wsl2=args.wsl2)
        model_dir = Path(args.model_dir) if args.model_dir else default_model_dir
        budget = plan_memory(model_dir, knobs, gpu, overrides)
    except (MemoryPlanError, CheckpointError) as exc:
        print(f"hyperqwen plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(budget.to_dict(), indent=2))
    else:
        print(render_table(budget))
    return 0 if budget.fits else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="print the GPU memory budget (weights, KV pool, headroom)",
                              description="Compute what fits on a card from the checkpoint's config and "
                                          "safetensors headers, without loading anything.")
    p.add_argument("--gpu", default="24GiB", help="card memory, e.g. 12GiB, 16GiB, 24GiB, 32GiB, 48GiB "
                                                  "(GB is read as GiB, as GPU makers mean it)")
    p.add_argument("--mode", choices=MODES, help="single or batch (default: MODE, else single)")
    p.add_argument("--json", action="store_true", help="print the budget as JSON")
    p.add_argument("--wsl2", action="store_true", help=f"model WSL2's loss (~{0.5:.1f} GiB, reference setup)")
    p.add_argument("--reserved", help="memory other programs hold (desktop, browser), e.g. 1.5GiB")
    p.add_argument("--model-dir", help="checkpoint directory (default: $MODELS_DIR/$MODEL)")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE",
                   help="knob (KV, MAX_LEN, SPEC, ...) or measured term (CUDA_GRAPHS, HEADROOM_FLOOR, ...) "
                        "override; repeatable")
    p.set_defaults(func=run_plan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperqwen", allow_abbrev=False)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
