"""The `hyperqwen` commands in one table: each one's name, its one-line help, its module and its pip extra.

`hyperqwen --help` lists the commands from this table without importing their modules, and each module's
`register(subparsers)` adds its parser through `add_command`, which takes the help line from here, so every
command's name and help are written once. Standard library only: a base install must be able to import it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    module: str  # provides `register(subparsers)`
    help: str  # the line `hyperqwen --help` shows
    extra: str | None = None  # the pip extra its dependencies come from, if any
    description: str | None = None  # the paragraph `hyperqwen NAME --help` opens with


# In the order `--help` lists them. A description that names a module's constant (calibrate, replicas) or is
# the module's docstring (verify) is given where that module registers the command.
COMMANDS: dict[str, Command] = {
    "serve": Command(
        "hyperqwen.launch.serve",
        "start the vLLM server for a mode (or print/explain what would start)",
        description="Resolve the knobs (defaults < mode profile < .env < environment < --set), decide the memory "
        "budget, build the vLLM command once, and print, explain or exec it.",
    ),
    "plan": Command(
        "hyperqwen.memory.cli",
        "print the GPU memory budget (weights, KV pool, headroom)",
        description="Compute what fits on a card from the checkpoint's config and safetensors headers (or, before "
        "the download, the default model's bundled shapes), without loading anything. Exit 0 fits (serve would "
        "start), 3 the MAX_LEN set does not fit but a shorter one does, 4 vLLM would refuse to boot, 5 card full "
        "after boot, 2 bad input or a refusal.",
    ),
    "calibrate": Command(
        "hyperqwen.memory.calibrate",
        "boot a mode once on this card; keep vLLM's memory numbers beside the model for plan/serve",
    ),
    "prepare": Command(
        "hyperqwen.prepare.cli",
        "download, requantize (int8 lm_head/MTP) and verify the model; resumable and crash-safe",
        "prepare",
        description="Reads MODELS_DIR, MODEL, MODEL_REPO, MODEL_REVISION, HF_TOKEN, MODEL_SOURCE_DIR, "
        "HF_HUB_OFFLINE, QUANTIZE_EMBED, DRAFT_VOCAB and DRAFT_VOCAB_IDS (defaults < mode profile < .env < "
        "environment < --set). Re-running is a no-op once the model is prepared.",
    ),
    "draft-vocab-recount": Command(
        "hyperqwen.prepare.draft_vocab",
        "count the token ids a running server generates; DRAFT_VOCAB_IDS=<out> makes prepare use them",
        "prepare",
        description="Generates answers to built-in prompts through a running OpenAI-compatible vLLM server and "
        "writes the generated token ids' counts as JSON. Then run prepare with DRAFT_VOCAB=N and "
        "DRAFT_VOCAB_IDS=<out> to draft from the N ids the model itself uses most.",
    ),
    "verify": Command("hyperqwen.verify", "check the install, model, GPU, or a running server (PASS/WARN/FAIL lines)"),
    "bench": Command(
        "hyperqwen.bench.cli",
        "benchmark a running OpenAI-compatible server (speed and correctness gates)",
        "bench",
        description="`suite` runs the whole field report; a workload name runs one workload and saves one JSON "
        "result; `render` turns result files into Markdown; `report` rebuilds a suite's report.",
    ),
    "monitor": Command(
        "hyperqwen.monitor",
        "serve the live monitor page for a running server",
        "bench",
        description="Scrape the server's /metrics and serve a page with live charts (tokens/s, TTFT, "
        "speculative acceptance, KV use, prefix-cache hits, queue) and recent requests.",
    ),
    "patches": Command(
        "hyperqwen.patches",
        "apply, check or list the vLLM patch series (patches/series)",
        description="Apply, check or list the ordered vLLM patch series with GNU patch (-p1, fuzz 0).",
    ),
    "replicas": Command(
        "hyperqwen.replicas.cli", "check GPUS/TP and write compose.replicas.yaml (one server per card)"
    ),
    "router": Command(
        "hyperqwen.replicas.router",
        "serve vllm-router in front of the replicas, behind a key-checking gate",
        "router",
        description="Start vLLM's router (vllm-router) on loopback for the replicas (ROUTER_WORKERS, else the "
        "list compose.replicas.yaml sets) and publish a gate on BIND:PORT that forwards only the inference "
        "routes and checks the API key.",
    ),
    "knobs": Command("hyperqwen.docsgen", "regenerate or check .env.example and docs/knobs.md"),
}


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    *,
    description: str | None = None,
    func: Callable[..., int] | None = None,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """Add the parser of command `name` (a key of COMMANDS) with its help line and description from the table
    (`description` given here replaces the table's); `func`, when given, is what `hyperqwen` runs with the
    parsed arguments. Other keywords go to `add_parser` as they are."""
    command = COMMANDS[name]
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=command.help, description=description or command.description, **kwargs
    )
    if func is not None:
        parser.set_defaults(func=func)
    return parser
