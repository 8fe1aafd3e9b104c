"""What a SPEC choice implies, for `hyperqwen serve --explain`: draft tokens and verify block, seats, context,
GDN state per request, the drafter (path, check, weights), which work it suits, and the public reference's
published numbers beside it (theirs, labelled).

Everything shown comes from the launch that `serve` would exec (the vLLM argv, the memory decision) and the
settings, so --explain cannot describe a different server from the one that starts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hyperqwen.config.knobs import MTP_SPEC_METHODS

if TYPE_CHECKING:
    from hyperqwen.config.settings import Settings
    from hyperqwen.launch.budget import LaunchBudget

# The 3090 reference's published numbers (github.com/syv-ai/qwen38-27b-rtx3090; one RTX 3090 at 250 W, vLLM
# 0.27.1 with that project's patches; decode = 1000 / mean TPOT at C1; README tables unless said otherwise).
# Theirs, not ours: shown beside the choice as orientation, never as a promise. bench/data/reference.json
# holds the same rows for the bench's comparison.
REFERENCE_SOURCE = "github.com/syv-ai/qwen38-27b-rtx3090 (RTX 3090, vLLM 0.27.1 + its patches)"
REFERENCE_NUMBERS: dict[str, str] = {
    "none": "46 tok/s decode at C1",
    "mtp": "~120 tok/s decode at C1 with 4 drafts (119.9 greedy, 120.9 default sampling); 2.9 tokens per verify "
    "step in its README, 3.66 in its later reports",
    "dflash2": "127-130 tok/s decode at C1 with 7 drafts (127.2 default sampling, 130.4 greedy); 3.3 tokens per "
    "verify step in its README, 4.6-4.9 in its later reports",
    "lookup": "381 tok/s copying a 25k-token document, 14.97 tokens per verify step, with a 15-token verify block "
    "filled from the prompt (their DFlash2 setup)",
}

# Which work each choice suits (issue: chat, coding agents, document work); the why is in docs/design.md.
SUITS: dict[str, str] = {
    "none": "batch throughput (many concurrent requests); the smallest GDN state per request",
    "mtp": "chat and coding agents: no extra download, good acceptance on free text and code",
    "dflash2": "chat and coding agents at the highest single-stream speed (more drafts per step than MTP), "
    "for ~1.2 GB more download and the drafter's memory",
    "ngram": "document work (quoting, reproducing, editing text or code the prompt contains): copies runs from "
    "the context; drafts nothing on free text",
    "mtp+lookup": "coding agents and document work: copies from the context where the output repeats it (edits, "
    "quotes, reproductions) and lets the MTP head draft elsewhere",
}


def _arg(args: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in the vLLM argv, or None."""
    from hyperqwen.config.extra_args import argv_value

    return argv_value(args, flag)


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _drafter_lines(settings: Settings, budget: LaunchBudget) -> list[str]:
    from hyperqwen.spec.drafter import DrafterError, check_drafter

    path = settings.draft_path
    if path is None:
        return ["  drafter: none set (DRAFT); `hyperqwen prepare` fetches the pinned one, or SPEC=mtp needs none"]
    lines = [f"  drafter: {path} (DRAFT)"]
    if not (path / "config.json").is_file():
        # Before `prepare` fetched it: the one warning above says where it goes; nothing here to check or plan.
        return [*lines, "  drafter check: not downloaded yet (the warning above says how); memory not planned"]
    try:
        info = check_drafter(path, settings.model_path)
    except DrafterError as exc:
        lines.append(f"  drafter check: FAILS: {exc}")
    else:
        lines.append(
            f"  drafter check: ok: {info.kind} ({info.layout} layout, vLLM {info.vllm_architecture}), reads target "
            f"layers {list(info.target_layer_ids)}, hidden {info.hidden_size}, vocabulary {info.vocab_size}"
        )
    on_disk = sum(p.stat().st_size for p in Path(path).glob("*.safetensors")) if Path(path).is_dir() else 0
    planned = budget.budget.weights.get("drafter") if budget.budget is not None else None
    memory = f"{_size(on_disk)} of weights on disk"
    if planned is not None and budget.budget is not None:
        memory += (
            f"; the memory plan counts {_size(int(planned))} of drafter weights on the GPU and "
            f"{budget.budget.kv_bytes_per_token / 1024:.1f} KiB of KV per token (target and drafter layers)"
        )
    else:
        memory += "; not planned here (no GPU checked): `--gpu rtx3090` plans it"
    lines.append(f"  drafter memory: {memory}")
    return lines


def spec_lines(settings: Settings, budget: LaunchBudget, vllm_args: Sequence[str]) -> list[str]:
    """The --explain section on speculative decoding for the launch `vllm_args` describe."""
    spec = settings.knobs.spec
    raw = _arg(vllm_args, "--speculative-config")
    config = json.loads(raw) if raw else None
    seats = _arg(vllm_args, "--max-num-seqs") or "vLLM's default"
    context = _arg(vllm_args, "--max-model-len") or "the model's"
    prefix_cache = "--no-enable-prefix-caching" not in vllm_args
    lines = ["", f"Speculative decoding: SPEC={spec} ({settings.setting('SPEC').source})"]
    k = int(config["num_speculative_tokens"]) if config else 0
    if config is None:
        lines.append("  drafts: none; every step decodes one token per request")
    else:
        lines.append(
            f"  drafts: up to {k} tokens per step (vLLM method {config['method']!r}); one verify step checks up to "
            f"{k + 1} tokens per request and keeps the longest run the model agrees with (greedy output unchanged)"
        )
    lines.append(f"  seats: {seats} requests at once (--max-num-seqs); context: {context} tokens (--max-model-len)")
    pages = (2 if prefix_cache else 1) + k
    lines.append(
        f"  GDN state: {pages} pages per running request per linear-attention layer group "
        f"({'2' if prefix_cache else '1'} + {k} drafts; prefix caching {'on' if prefix_cache else 'off'})"
    )
    if spec == "dflash2":
        lines += _drafter_lines(settings, budget)
    lookup = (
        "prompt lookup: copies the tokens that followed the earliest occurrence of the longest match (2-5 "
        "tokens) of the recent output in the prompt or earlier output"
    )
    if spec in MTP_SPEC_METHODS:
        lines.append("  drafter: the model's own MTP head (in the checkpoint; nothing extra to download)")
        if config is not None and config.get("context_lookup"):
            lines.append(
                f"  context drafting: the verify block is filled first by {lookup}; where nothing matches, the MTP "
                f"head drafts {config.get('context_drafter_tokens', k)} tokens"
            )
    elif config is not None and config.get("method") == "ngram":
        lines.append(f"  drafter: none ({lookup}; nothing is drafted when nothing matches)")
    if spec in SUITS:
        lines.append(f"  suits: {SUITS[spec]}")
    # A combined value (e.g. MTP + lookup) shows the numbers of each part it combines.
    parts = [name for name in ("none", "mtp", "dflash2") if name == spec or f"{name}+" in spec]
    if spec == "ngram" or "lookup" in spec:
        parts.append("lookup")
    for part in parts:
        lines.append(f"  the reference's published numbers (theirs, {REFERENCE_SOURCE}): {REFERENCE_NUMBERS[part]}")
    return lines
