"""Every user-facing knob, declared once.

This table is the single source of truth: validation (settings.py), the vLLM command line (plan.py),
`.env.example` and `docs/knobs.md` (docsgen.py) are all derived from it. Per-mode defaults are data in
`single-user/profile.yaml` and `batch/profile.yaml`; a knob's `default` here is the value used when the
mode's profile says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hyperqwen.config.keyrule import MAKE_KEY
from hyperqwen.config.sizes import EXAMPLES as SIZE_EXAMPLES
from hyperqwen.config.sizes import UNIT_RULE

MODES = ("single", "batch")
# The repository folder of each mode: its profile.yaml and README.md.
MODE_FOLDERS: dict[str, str] = {"single": "single-user", "batch": "batch"}

_MiB, _GiB = 1024**2, 1024**3
# EMBED_ON_HOST's --cpu-offload-gb: a cap, not an amount. With --cpu-offload-params embed_tokens only the
# embedding's parameters are eligible, and all of them fit under it (a bf16 table of this model family is
# 2.4 GiB; the prepared int8 one 1.2 GiB).
EMBED_OFFLOAD_CAP_GIB = 4

# Value maps that turn a knob's user-facing choice into vLLM values. They live here, next to the knob,
# so docs and validation see the same table the planner uses.

# KV cache dtypes by the names batch users choose. All are vLLM 0.32.0 `--kv-cache-dtype` choices.
KV_DTYPES: dict[str, str] = {
    "bf16": "auto",  # the model dtype: bfloat16 for this checkpoint
    "fp8": "fp8",
    "int8": "int8_per_token_head",
    "int4": "int4_per_token_head",
}

# Context presets for single mode: the KV dtype and the context length each one buys.
# Which KV dtype, and why: docs/memory.md "Long context" (0.32.0 backends on SM86, published quality).
# fast: full-precision KV, the reference setup's 64k (its MTP runs: 120.9 tok/s at 64k bf16 KV).
# long: int8 per-token-head KV (Triton attention, runs on SM86, hybrid and MTP); perplexity 8.231 against
#       fp8's 8.235 on a 3090 (github.com/syv-ai/qwen38-27b-rtx3090 docs/long-context.md); 128k.
# huge: vLLM 0.32.0's int4 per-token-head KV (an in-tree dtype) up to the model's 262,144 positions.
CTX_PRESETS: dict[str, dict[str, Any]] = {
    "fast": {"kv": "bf16", "max_len": 65536},
    "long": {"kv": "int8", "max_len": 131072},
    "huge": {"kv": "int4", "max_len": 262144},
}

# STRUCTURED_OUTPUT -> vLLM's structured-outputs config (vllm/config/structured_outputs.py: backend, and
# disable_any_whitespace, which only xgrammar and guidance support). vLLM's default (auto, free whitespace) let a
# JSON-schema reply stop after `{"ok"` and pad with whitespace until max_tokens on every API; compact JSON ends
# when the object closes (tests/integration/test_structured_output.py).
STRUCTURED_OUTPUT_CONFIGS: dict[str, dict[str, Any]] = {
    "xgrammar-compact": {"backend": "xgrammar", "disable_any_whitespace": True},
    "guidance-compact": {"backend": "guidance", "disable_any_whitespace": True},
    "xgrammar": {"backend": "xgrammar"},
    "guidance": {"backend": "guidance"},
    "auto": {"backend": "auto"},
}

SPEC_METHODS = ("mtp", "dflash2", "ngram", "mtp+lookup", "none")
# The SPEC values that draft with the checkpoint's own MTP head (its layers, weights and KV in the plan).
MTP_SPEC_METHODS = ("mtp", "mtp+lookup")
# The folder under MODELS_DIR where `hyperqwen prepare` puts the pinned DFlash2 drafter (the 3090 reference
# uses the same name, so a user's DRAFT setting carries over); DRAFT's default, so SPEC=dflash2 needs nothing else.
DFLASH2_DRAFTER_DIR = "Qwen3.8-27B-DFlash2-W4A16"


@dataclass(frozen=True)
class Knob:
    """One environment variable a user may set.

    kind: "str" | "int" | "float" | "bool" | "choice" | "bytes" | "args" (a shell-quoted argument string)
    maps_to: what the knob drives, shown in docs: a vLLM flag ("--port"), a vLLM environment variable
             ("env VLLM_API_KEY") or our own behaviour ("hyperqwen: ...").
    modes: the modes that use the knob; setting it for another mode is reported as ignored.
    """

    name: str
    kind: str
    doc: str
    maps_to: str
    section: str
    default: Any = None
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    modes: tuple[str, ...] = MODES
    secret: bool = False
    # Shown in .env.example as a one-line trade-off; doc is the what, tradeoff the why-you-would.
    tradeoff: str = ""
    # Extra lines for docs only (e.g. the value map).
    details: tuple[str, ...] = field(default_factory=tuple)
    # The value shown on .env.example's commented line when it is not the default (MODELS_DIR: the host folder
    # compose mounts, while the container's own default is /models).
    example: str | None = None

    def allowed_text(self) -> str:
        if self.kind == "choice":
            return " | ".join(self.choices)
        if self.kind == "bool":
            return "true | false (also 1/0, yes/no, on/off)"
        if self.kind in ("int", "float"):
            low = "" if self.min is None else _fmt_number(self.min)
            high = "" if self.max is None else _fmt_number(self.max)
            if low and high:
                return f"{self.kind} in [{low}, {high}]"
            if low:
                return f"{self.kind} >= {low}"
            if high:
                return f"{self.kind} <= {high}"
            return self.kind
        if self.kind == "bytes":
            return f"bytes: {SIZE_EXAMPLES} ({UNIT_RULE})"
        if self.kind == "args":
            return "shell-quoted vLLM arguments"
        return "text"


def _fmt_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


SERVER = "Server"
MODEL = "Model and mode"
SPEED = "Speculative decoding"
MEMORY = "Context and memory"
API = "API behaviour"
SECURITY = "Security"
PREPARE = "Prepare (download and requantize)"
OPERATIONS = "Operations"
COMPOSE = "Compose (host side)"
MULTI_GPU = "More than one GPU (docs/multi-gpu.md)"

KNOBS: tuple[Knob, ...] = (
    # --- model and mode -------------------------------------------------------------------------
    Knob(
        "MODE",
        "choice",
        "Which profile to run: single (low latency, speculative decoding) or batch (throughput).",
        "hyperqwen: picks single-user/profile.yaml or batch/profile.yaml",
        MODEL,
        default="single",
        choices=MODES,
        tradeoff="single = fastest one stream; batch = most tokens/s over many requests.",
    ),
    Knob(
        "MODELS_DIR",
        "str",
        "Directory holding prepared models and api_key.txt. Under compose: the host folder "
        "mounted as the models volume (default ./models); the containers always see it as /models.",
        "hyperqwen: base for MODEL, DRAFT and API_KEY_FILE; compose: host side of the models volume",
        MODEL,
        default="/models",
        example="./models",
        tradeoff="point it at a disk with ~40 GB free; `init` creates it and gives it to HYPERQWEN_UID.",
    ),
    Knob(
        "MODEL",
        "str",
        "The servable checkpoint: a directory (relative paths are under MODELS_DIR).",
        "--model",
        MODEL,
        default="qwen3.8-27b",
        tradeoff="point it at another prepared directory to serve another checkpoint.",
    ),
    Knob(
        "SERVED_MODEL_NAME",
        "str",
        "The model name clients send and /v1/models lists.",
        "--served-model-name",
        MODEL,
        default="qwen3.8-27b",
    ),
    Knob(
        "DTYPE",
        "choice",
        "Activation and unquantized weight dtype.",
        "--dtype",
        MODEL,
        default="auto",
        choices=("auto", "bfloat16", "float16", "float32"),
        tradeoff="auto follows the checkpoint (bfloat16); float32 only for tests on CPU.",
    ),
    Knob(
        "VISION",
        "bool",
        "Load the vision tower too (images in chat).",
        "off: --language-model-only",
        MODEL,
        default=False,
        tradeoff="on costs ~0.86 GiB of GPU memory that the KV pool would otherwise get.",
    ),
    # --- server ---------------------------------------------------------------------------------
    Knob(
        "BIND",
        "str",
        "Host address the API is reachable on (published port on the host).",
        "--host (outside a container); compose port publish address",
        SERVER,
        default="127.0.0.1",
        tradeoff="127.0.0.1 = this machine only; 0.0.0.0 = your LAN too (needs an API key).",
    ),
    Knob("PORT", "int", "TCP port of the API.", "--port", SERVER, default=18020, min=1, max=65535),
    # --- security -------------------------------------------------------------------------------
    Knob(
        "VLLM_API_KEY",
        "str",
        "API key clients must send (Authorization: Bearer ...).",
        "env VLLM_API_KEY (never on the command line)",
        SECURITY,
        default="",
        secret=True,
        tradeoff="required when BIND is not loopback; prefer API_KEY_FILE so the key is not in .env.",
    ),
    Knob(
        "API_KEY_FILE",
        "str",
        "File holding the API key, read when VLLM_API_KEY is empty (relative: under MODELS_DIR).",
        "env VLLM_API_KEY",
        SECURITY,
        default="api_key.txt",
        tradeoff=f"create one with: {MAKE_KEY}",
    ),
    Knob(
        "METRICS_PUBLIC",
        "bool",
        "Serve /metrics without the API key (for a scraper that cannot send one).",
        "env HYPERQWEN_METRICS_PUBLIC (read by patch 0002)",
        SECURITY,
        default=False,
    ),
    Knob(
        "MAX_HEADER_BYTES",
        "bytes",
        "Largest request head (request line plus headers) the API reads; a larger one gets 431 before the key "
        "is checked.",
        "env HYPERQWEN_MAX_HEADER_BYTES (read by patch 0017)",
        SECURITY,
        default=64 * 1024,
        min=4 * 1024,
        max=64 * _MiB,
        tradeoff="raise it only for a proxy that adds very large headers; every connection may hold this much.",
    ),
    Knob(
        "MAX_BODY_BYTES",
        "bytes",
        "Largest request body the API accepts; a larger one gets 413 before the key is checked or the JSON parsed.",
        "env HYPERQWEN_MAX_BODY_BYTES (read by patch 0017)",
        SECURITY,
        default=32 * _MiB,
        min=64 * 1024,
        max=4 * _GiB,
        tradeoff="32 MiB holds a full 262k-token conversation as JSON several times over; raise it for huge "
        "tool outputs.",
    ),
    # --- speculative decoding -------------------------------------------------------------------
    Knob(
        "SPEC",
        "choice",
        "Speculative decoding method.",
        "--speculative-config method (mtp | dflash | ngram; mtp+lookup: mtp with context_lookup, patch 0031)",
        SPEED,
        default="none",
        choices=SPEC_METHODS,
        tradeoff=(
            "mtp uses the model's own MTP head (no extra download); dflash2 needs a drafter (DRAFT); ngram "
            "drafts by copying from the prompt and earlier output (quoting, editing, documents; no model); "
            "mtp+lookup fills the verify block from such a copy when the context has one and from the MTP head "
            "otherwise (turns vLLM's async scheduling off); none for max batch throughput."
        ),
        details=(
            'mtp: {"method": "mtp", "num_speculative_tokens": DRAFT_TOKENS}',
            'dflash2: {"method": "dflash", "model": DRAFT, "num_speculative_tokens": DFLASH_TOKENS}',
            'ngram: {"method": "ngram", "num_speculative_tokens": LOOKUP_TOKENS, "prompt_lookup_min": 2, '
            '"prompt_lookup_max": 5}',
            'mtp+lookup: {"method": "mtp", "num_speculative_tokens": max(DRAFT_TOKENS, LOOKUP_TOKENS), '
            '"context_lookup": true, "context_lookup_min": 2, "context_lookup_max": 5, '
            '"context_drafter_tokens": DRAFT_TOKENS}',
        ),
    ),
    Knob(
        "DRAFT_TOKENS",
        "int",
        "Tokens the MTP head drafts per step (SPEC=mtp, mtp+lookup).",
        "--speculative-config num_speculative_tokens",
        SPEED,
        default=3,
        min=1,
        max=8,
        tradeoff="more drafts = more tokens per step when they are accepted, more GDN state memory per request.",
    ),
    Knob(
        "DFLASH_TOKENS",
        "int",
        "Tokens the DFlash2 drafter proposes per step (SPEC=dflash2).",
        "--speculative-config num_speculative_tokens",
        SPEED,
        default=7,
        min=1,
        max=16,
        tradeoff="the reference setup measured 7 as its best on a 3090 (its numbers, not ours).",
    ),
    Knob(
        "DRAFT",
        "str",
        "The DFlash2 drafter checkpoint directory (relative: under MODELS_DIR); SPEC=dflash2 only. The default "
        "is where `hyperqwen prepare` fetches the pinned drafter when SPEC=dflash2.",
        "--speculative-config model",
        SPEED,
        default=DFLASH2_DRAFTER_DIR,
    ),
    Knob(
        "LOOKUP_TOKENS",
        "int",
        "Tokens prompt lookup copies per step from a match in the context (SPEC=ngram); with SPEC=mtp+lookup "
        "the verify block (at least DRAFT_TOKENS).",
        "--speculative-config num_speculative_tokens",
        SPEED,
        default=8,
        min=1,
        max=32,
        tradeoff="a longer block copies more per step when the answer repeats the context; each token adds a GDN "
        "state page per request, and a miss costs a wider verify step.",
    ),
    # --- context and memory ---------------------------------------------------------------------
    Knob(
        "CTX",
        "choice",
        "Context preset for single mode: KV dtype and default MAX_LEN.",
        "--kv-cache-dtype and --max-model-len",
        MEMORY,
        default="fast",
        choices=tuple(CTX_PRESETS),
        modes=("single",),
        tradeoff="fast = bf16 KV, 64k; long = int8 KV, 128k; huge = int4 KV, 256k (slower prefill, +0.3% perplexity).",
        details=tuple(
            f"{name}: KV {preset['kv']} ({KV_DTYPES[preset['kv']]}), MAX_LEN {preset['max_len']}"
            for name, preset in CTX_PRESETS.items()
        ),
    ),
    Knob(
        "KV",
        "choice",
        "KV cache dtype. Batch mode: its profile sets it; single mode: empty = the CTX preset's.",
        "--kv-cache-dtype",
        MEMORY,
        default=None,
        choices=tuple(KV_DTYPES),
        tradeoff="fp8 halves KV bytes vs bf16; int8/int4 per-token-head fit more tokens, at some quality cost.",
        details=tuple(f"{name}: {dtype}" for name, dtype in KV_DTYPES.items()),
    ),
    Knob(
        "MAX_LEN",
        "int",
        "Longest context (prompt + output) of one request; empty = the mode/CTX default.",
        "--max-model-len",
        MEMORY,
        default=None,
        min=256,
        max=262144,
    ),
    Knob(
        "MAX_SEQS",
        "int",
        "Requests decoded at once.",
        "--max-num-seqs",
        MEMORY,
        default=None,
        min=1,
        max=1024,
        tradeoff="higher = more aggregate throughput, more memory for CUDA graphs and GDN state.",
    ),
    Knob(
        "MAX_BATCHED_TOKENS",
        "int",
        "Tokens processed per engine step (prefill chunk size).",
        "--max-num-batched-tokens",
        MEMORY,
        default=None,
        min=256,
        max=131072,
        tradeoff="higher = faster prefill of long prompts, larger activation peak.",
    ),
    Knob(
        "GPU_UTIL",
        "float",
        "Fraction of GPU memory vLLM may use.",
        "--gpu-memory-utilization",
        MEMORY,
        default=None,
        min=0.1,
        max=0.99,
        tradeoff="lower it on a desktop GPU that also drives a display, or under WSL2.",
    ),
    Knob(
        "KV_MEM",
        "bytes",
        "Pin the KV cache pool to this many bytes instead of a GPU_UTIL fraction.",
        "--kv-cache-memory-bytes",
        MEMORY,
        default=None,
        min=1,
        tradeoff="exact and repeatable; too large fails at boot, so the planner checks it first.",
    ),
    Knob(
        "PREFIX_CACHE",
        "bool",
        "Reuse the KV of a shared prompt prefix across requests.",
        "--enable-prefix-caching / --no-enable-prefix-caching (always explicit)",
        MEMORY,
        default=True,
        tradeoff="big win for chats and agents (turn 2 is fast); costs one extra GDN state page per request.",
    ),
    Knob(
        "MEMORY_CHECK",
        "choice",
        "Before starting, plan GPU memory and stop when the settings do not fit "
        "(strict), only warn (warn), or skip (off).",
        "hyperqwen: memory preflight (hyperqwen plan)",
        MEMORY,
        default="strict",
        choices=("strict", "warn", "off"),
        tradeoff="warn if your own measurement says it fits where the planner's estimates say it does not.",
    ),
    Knob(
        "STATE_DTYPE",
        "choice",
        "Gated-DeltaNet recurrent state dtype.",
        "--mamba-ssm-cache-dtype",
        MEMORY,
        default="float16",
        choices=("float16", "float32", "auto"),
        tradeoff="float16 halves the ~144 MiB per state page of float32.",
    ),
    # --- measured memory terms (hyperqwen plan / the serve memory check; docs/memory.md) --------------
    # Defaults are measurements from public logs of real GPUs; replace one with your own measurement.
    Knob(
        "CUDA_CONTEXT",
        "bytes",
        "GPU memory vLLM's process uses before its start snapshot (CUDA context, "
        "driver): outside the KV pool, but counted in vLLM's startup free-memory check.",
        "hyperqwen: memory check",
        MEMORY,
        default=600 * _MiB,
        min=0,
        max=8 * _GiB,
        details=(
            "600 MiB: the 3090 reference (github.com/syv-ai/qwen38-27b-rtx3090, batch/start_qwen.sh) "
            "starts headless at GPU_UTIL 0.972 and fails the startup check at 0.98, which brackets it at "
            "482-675 MiB of a 23.56 GiB CUDA total; a public 3090 log shows 645 MiB in use at vLLM's "
            "start snapshot (github.com/wtdcode/vllm-backport/issues/34).",
        ),
    ),
    Knob(
        "CUDA_GRAPHS",
        "bytes",
        "CUDA-graph memory plus non-torch allocations after vLLM's start snapshot, "
        "taken from the KV pool; empty = vLLM's graph-memory estimate for the captured sizes plus 0.35 GiB.",
        "hyperqwen: memory check",
        MEMORY,
        default=None,
        min=0,
        max=64 * _GiB,
        details=(
            "Measured by the GPU lab (docs/gpu-lab.md, docs/data/gpu): vLLM 0.32.0 estimated 0.25 GiB of graphs "
            "in single mode and 0.40 GiB in batch mode, and used 0.31-0.35 GiB of non-torch memory.",
        ),
    ),
    Knob(
        "ACTIVATION_PEAK",
        "bytes",
        "The profile run's activation peak; empty = estimated from the model's shapes and MAX_BATCHED_TOKENS.",
        "hyperqwen: memory check",
        MEMORY,
        default=None,
        min=0,
        max=64 * _GiB,
    ),
    Knob(
        "UNCOUNTED_GRAPHS",
        "bytes",
        "Graph memory vLLM's profiler does not count (the DFlash2 drafter's); "
        "empty = 1.9 GiB with SPEC=dflash2, else 0.",
        "hyperqwen: memory check",
        MEMORY,
        default=None,
        min=0,
        max=64 * _GiB,
    ),
    Knob(
        "PROFILE_MARGIN",
        "bytes",
        "How much smaller the profiled KV pool may come out at a later start; "
        "MAX_LEN must still fit then (GPU_UTIL-sized pools only). Empty = 64 MiB, or 1 GiB with SPEC=dflash2.",
        "hyperqwen: memory check",
        MEMORY,
        default=None,
        min=0,
        max=16 * _GiB,
        tradeoff="pin the pool with KV_MEM and no margin is needed: vLLM then does not size it from a profile.",
        details=(
            "64 MiB: warm starts of one configuration on the 3090 reference gave pools within 0.4% "
            "(183,673 vs 184,438 tokens, ~30 MiB); 1 GiB with SPEC=dflash2, whose runner's profiled "
            "peak varied by ~1 GiB between starts (github.com/syv-ai/qwen38-27b-rtx3090, docs/gotchas.md "
            "9 and 18). A first start on a cold torch.compile cache profiles ~0.87 GiB more (gotcha 16): "
            "pin KV_MEM to make every start the same.",
        ),
    ),
    Knob(
        "RAM_CACHE",
        "bytes",
        "Host RAM for a conversation cache: KV blocks evicted from the GPU pool move to "
        "pinned host memory and come back on a prefix-cache hit instead of being recomputed. Empty = off.",
        "--kv-offloading-size (GiB) --kv-offloading-backend native",
        MEMORY,
        default=None,
        min=1 * _GiB,
        max=1024 * _GiB,
        tradeoff="turn 2 of a long conversation after eviction starts fast; the RAM is pinned (never swapped), "
        "needs PREFIX_CACHE=true, and the planner refuses more than the host has.",
        details=(
            "Off by default: pinned memory is taken from everything else on the host, and on 0.31 the "
            "CPU tier served nothing once it began evicting (github.com/vllm-project/vllm/issues/51787); "
            "with MTP on a hybrid model it could store without serving "
            "(github.com/vllm-project/vllm/issues/52735). Not yet measured on a GPU here.",
        ),
    ),
    Knob(
        "EMBED_ON_HOST",
        "bool",
        "Hold the embedding table (embed_tokens) in pinned host memory, read by the GPU through unified "
        "addressing (UVA); its GPU bytes go to the KV pool.",
        f"--cpu-offload-gb {EMBED_OFFLOAD_CAP_GIB} --cpu-offload-params embed_tokens (patch 0065)",
        MEMORY,
        default=False,
        tradeoff="about 1.2 GiB more KV pool with the prepared int8 table (~19k more bf16 tokens) for as much "
        "pinned host RAM; a lookup reads only the step's rows over PCIe.",
        details=(
            "Off by default: not yet measured on a GPU by this project. The 3090 reference measured a 15.7% "
            "larger pool for ~2.1 GiB of host RAM and no measured speed cost "
            "(github.com/syv-ai/qwen38-27b-rtx3090). The planner checks the host has the RAM.",
        ),
    ),
    Knob(
        "HEADROOM_FLOOR",
        "bytes",
        "GPU memory that must stay free after boot.",
        "hyperqwen: memory check",
        MEMORY,
        default=400 * _MiB,
        min=0,
        max=16 * _GiB,
        details=(
            "400 MiB: on the 3090 reference ~400 MiB had to stay free after boot or bursts of requests "
            "failed (github.com/syv-ai/qwen38-27b-rtx3090).",
        ),
    ),
    # --- API behaviour --------------------------------------------------------------------------
    Knob(
        "TOOLS",
        "bool",
        "Let the model call tools (OpenAI tools / Anthropic tool_use).",
        "--enable-auto-tool-choice --tool-call-parser TOOL_PARSER",
        API,
        default=True,
    ),
    Knob(
        "TOOL_PARSER",
        "choice",
        "vLLM tool-call parser for the model's tool-call format.",
        "--tool-call-parser",
        API,
        default="qwen3_coder",
        choices=("qwen3_coder", "qwen3_xml", "hermes"),
    ),
    Knob(
        "REASONING_PARSER",
        "choice",
        "vLLM reasoning parser (splits <think> output into reasoning).",
        "--reasoning-parser",
        API,
        default="qwen3",
        choices=("qwen3", "deepseek_r1", "none"),
    ),
    Knob(
        "STRUCTURED_OUTPUT",
        "choice",
        "Grammar backend for structured output (JSON schema / json_object on every API, forced tool calls) and "
        "whether the JSON it allows may carry free whitespace between tokens; -compact = none (strings keep "
        "theirs).",
        "--structured-outputs-config (backend, disable_any_whitespace)",
        API,
        default="xgrammar-compact",
        choices=tuple(STRUCTURED_OUTPUT_CONFIGS),
        tradeoff="with free whitespace a small or unsure model can pad a JSON reply with blank lines until max_tokens.",
        details=(
            "xgrammar-compact / guidance-compact: that backend, no whitespace outside strings; xgrammar / "
            "guidance: that backend, whitespace allowed; auto: vLLM's own choice, whitespace allowed",
        ),
    ),
    Knob(
        "THINKING",
        "bool",
        "Think before answering by default; a request's chat_template_kwargs can still override.",
        '--default-chat-template-kwargs {"enable_thinking": ...}',
        API,
        default=False,
        tradeoff="on = better answers to hard questions, many more tokens and a slower reply.",
    ),
    Knob(
        "CLIENT_THINKING",
        "bool",
        "Let a request's reasoning effort (OpenAI reasoning_effort / reasoning.effort, Anthropic thinking or "
        "output_config.effort) switch thinking on or off; off = only THINKING and chat_template_kwargs decide.",
        "env HYPERQWEN_CLIENT_THINKING (read by patch 0023)",
        API,
        default=False,
        tradeoff="coding agents send an effort on every request (Claude Code: high); on = they all think.",
        details=(
            "Rule (docs/agents.md): effort none/minimal -> thinking off; low/medium/high/xhigh/max -> on; "
            "Anthropic thinking.type enabled/adaptive -> on, disabled -> off.",
        ),
    ),
    Knob(
        "STREAM_KEEPALIVE",
        "int",
        "Seconds of silence after which a stream gets a keep-alive (SSE comment; Anthropic ping event on "
        "/v1/messages); 0 = never.",
        "--sse-keep-alive-interval (patch 0022 extends it to /v1/messages and /v1/responses)",
        API,
        default=10,
        min=0,
        max=300,
        tradeoff="Claude Code warns after 150 s without a chunk and gives up at 300 s.",
    ),
    Knob(
        "STREAM_PROGRESS",
        "float",
        "While a long prompt fills (chunked prefill), a streaming request gets an SSE comment "
        "`: prefill COMPUTED/TOTAL` at most every this many seconds and at most once per chunk; 0 = never.",
        "env HYPERQWEN_PREFILL_PROGRESS_INTERVAL (read by patch 0060)",
        API,
        default=1.0,
        min=0.0,
        max=60.0,
        tradeoff="comments are skipped by SSE clients; lower = finer progress, more bytes on a long prefill.",
    ),
    Knob(
        "TEMPERATURE",
        "float",
        "Default sampling temperature when a request sets none; empty = the model's generation_config.",
        '--override-generation-config {"temperature": ...}',
        API,
        default=None,
        min=0.0,
        max=2.0,
    ),
    Knob(
        "GDN_PREFILL",
        "choice",
        "Kernel for the Gated-DeltaNet layers' prefill. auto: vLLM's choice, except on Hopper and newer cards "
        "without the CuTe DSL package (nvidia-cutlass-dsl), where vLLM's FlashInfer kernel cannot load: there "
        "Triton, said in one line at start.",
        "--gdn-prefill-backend",
        SPEED,
        default="auto",
        choices=("auto", "triton", "flashinfer"),
        tradeoff="triton runs on every NVIDIA card; flashinfer is vLLM's pick on Hopper (needs nvidia-cutlass-dsl).",
        details=(
            "Seen on an H200 with vLLM 0.32.0 and no nvidia-cutlass-dsl: FlashInfer's GDN prefill imports "
            "`cutlass.cute` and the engine fails to start; `--gdn-prefill-backend triton` boots "
            "(scripts/gpu_lab, docs/gpu-lab.md). A 3090 or 4090 runs the Triton kernel either way.",
        ),
    ),
    Knob(
        "EXTRA_ARGS",
        "args",
        "More vLLM arguments, appended last. Options a knob sets (key, host, port, model, "
        "...) are refused in any spelling or abbreviation, as are stray words and control characters.",
        "appended to the vLLM command line",
        API,
        default=(),  # the parsed value's type (a tuple of words), as a set value has
        tradeoff="escape hatch; checked against vLLM 0.32.0's own options before anything starts.",
    ),
    # --- operations -----------------------------------------------------------------------------
    Knob(
        "MONITOR_PORT",
        "int",
        "TCP port of the monitor page (docs/monitor.md).",
        "hyperqwen monitor --port; compose monitor ports",
        OPERATIONS,
        default=18021,
        min=1,
        max=65535,
    ),
    Knob(
        "MONITOR_INTERVAL",
        "float",
        "Seconds between the monitor's scrapes of /metrics.",
        "hyperqwen monitor --interval",
        OPERATIONS,
        default=2.0,
        min=0.2,
        max=60,
        tradeoff="lower = requests finishing close together get separate rows in the table.",
    ),
    Knob(
        "MONITOR_HISTORY",
        "int",
        "Seconds of history the monitor's charts keep (in memory).",
        "hyperqwen monitor --history",
        OPERATIONS,
        default=900,
        min=10,
        max=86400,
    ),
    Knob(
        "WEBUI_PORT",
        "int",
        "Host port of the Open WebUI page (compose profile webui, docs/webui.md).",
        "compose: webui ports",
        OPERATIONS,
        default=18030,
        min=1,
        max=65535,
    ),
    Knob(
        "WEBUI_ADMIN_EMAIL",
        "str",
        "The Open WebUI admin's login; its password is the API key. Created on the WebUI's first start, with "
        "sign-up off, so nobody who reaches the page first can make themselves admin.",
        "compose: webui WEBUI_ADMIN_EMAIL (password: the API key file), ENABLE_SIGNUP=False",
        OPERATIONS,
        default="admin@hyperqwen.local",
        tradeoff="log in with this address and the key in models/api_key.txt; add users from the admin panel.",
    ),
    Knob(
        "SKIP_VERIFY",
        "bool",
        "Start the server without running verify.sh first (container entrypoint).",
        "hyperqwen: entrypoint",
        OPERATIONS,
        default=False,
    ),
    Knob(
        "ENGINE_STALL_TIMEOUT",
        "int",
        "Seconds the engine may leave a health probe unanswered before it counts "
        "as stalled: /health turns red and the server exits (compose restarts it); 0 = never.",
        "env HYPERQWEN_ENGINE_STALL_TIMEOUT (read by patch 0040)",
        OPERATIONS,
        default=300,
        min=0,
        max=3600,
        tradeoff="lower = a hung kernel is noticed sooner; too low restarts an engine busy with a long JIT compile.",
    ),
    # --- compose (read by compose.yaml for interpolation; the containers get them too) -------------------------
    Knob(
        "HYPERQWEN_UID",
        "int",
        "User id the containers run as; `init` gives the models and cache folders to it.",
        "compose: user; init chowns to it",
        COMPOSE,
        default=1000,
        min=0,
        max=2**31 - 1,
        tradeoff="set it to `id -u` on the host so files in the models folder belong to you.",
    ),
    Knob(
        "HYPERQWEN_GID",
        "int",
        "Group id the containers run as (with HYPERQWEN_UID).",
        "compose: user",
        COMPOSE,
        default=1000,
        min=0,
        max=2**31 - 1,
        tradeoff="`id -g` on the host.",
    ),
    Knob(
        "HYPERQWEN_GPU",
        "str",
        "The GPU the server reserves: an index or a UUID from `nvidia-smi -L`.",
        "compose: deploy device_ids; the GPU lock's name",
        COMPOSE,
        default="0",
    ),
    Knob(
        "HYPERQWEN_OWNER",
        "str",
        "Registry owner of the image: ghcr.io/<owner>/hyperqwen.",
        "compose: image",
        COMPOSE,
        default="hyperqwen",
        tradeoff="a fork's workflow pushes to ghcr.io/<its GitHub owner>.",
    ),
    Knob(
        "HYPERQWEN_TAG",
        "str",
        "Image tag; defaults to this checkout's release, never `latest`.",
        "compose: image",
        COMPOSE,
        default="0.1.0",
        tradeoff="`sha-<commit>` pins a main-branch build; `latest` follows main once CI passed.",
    ),
    # --- more than one GPU ----------------------------------------------------------------------
    Knob(
        "GPUS",
        "str",
        "The cards of the replicas profile, as device indexes or UUIDs (nvidia-smi -L), comma separated.",
        "hyperqwen replicas: one replica-N service per group of TP cards in compose.replicas.yaml",
        MULTI_GPU,
        default="0",
        tradeoff="GPUS=0,1,2,3 runs four servers behind the router (TP=1).",
    ),
    Knob(
        "TP",
        "int",
        "Tensor parallel size: cards one server spans (TP=2 splits heads, KV and GDN state over two).",
        "--tensor-parallel-size",
        MULTI_GPU,
        default=1,
        min=1,
        max=8,
        tradeoff="TP=2 buys context for one long request; replicas (TP=1) buy throughput (docs/multi-gpu.md).",
    ),
    Knob(
        "ROUTER_POLICY",
        "choice",
        "How vllm-router picks a replica for a request.",
        "vllm-router --policy",
        MULTI_GPU,
        default="cache_aware",
        choices=("cache_aware", "consistent_hash", "round_robin", "power_of_two"),
        tradeoff="cache_aware sends a conversation's next turn to the replica holding its prefix; "
        "consistent_hash needs a session header from the client.",
    ),
    Knob(
        "SCALE_OUT",
        "bool",
        "Serve vLLM's render endpoints (/v1/chat/completions/render, ...), through which "
        "vllm-router's cache_aware policy tokenizes a request to find the replica holding its prefix.",
        "--enable-scale-out",
        MULTI_GPU,
        default=False,
        tradeoff="the replicas profile turns it on; off elsewhere (vLLM 0.32.0 answers those routes 403).",
    ),
    Knob(
        "ROUTER_WORKERS",
        "str",
        "Servers the router sends to, as base URLs (http://host:18020), comma separated; "
        "empty = the replicas compose.replicas.yaml defines.",
        "vllm-router --worker-urls",
        MULTI_GPU,
        default="",
        tradeoff="set it to route to servers on other hosts (docs/multi-gpu.md).",
    ),
    # --- prepare --------------------------------------------------------------------------------
    Knob(
        "MODEL_REPO",
        "str",
        "Hugging Face repo id of the base checkpoint prepare downloads.",
        "hyperqwen prepare",
        PREPARE,
        default="dbirks/Qwen3.8-27B-W4A16-AutoRound",
    ),
    Knob(
        "MODEL_REVISION",
        "str",
        "Branch, tag or commit of MODEL_REPO.",
        "hyperqwen prepare",
        PREPARE,
        default="main",
        tradeoff="pin a commit for a reproducible download.",
    ),
    Knob(
        "HF_TOKEN",
        "str",
        "Hugging Face token, for gated or private repos.",
        "env HF_TOKEN (huggingface_hub)",
        PREPARE,
        default="",
        secret=True,
    ),
    Knob(
        "MODEL_SOURCE_DIR",
        "str",
        "Use this local checkpoint directory instead of downloading.",
        "hyperqwen prepare",
        PREPARE,
        default="",
    ),
    Knob(
        "HF_HUB_OFFLINE",
        "bool",
        "Never touch the network: prepare uses MODEL_SOURCE_DIR or its earlier complete "
        "download (checked against the hub metadata recorded then).",
        "env HF_HUB_OFFLINE (huggingface_hub)",
        PREPARE,
        default=False,
    ),
    Knob(
        "QUANTIZE_EMBED",
        "bool",
        "Also requantize embed_tokens to int8 group-128.",
        "hyperqwen prepare",
        PREPARE,
        default=True,
        tradeoff="frees ~1.3 GB of GPU memory; needs patches 0004/0005 (in the image) to load.",
    ),
    Knob(
        "PREPARE_DRAFTER",
        "choice",
        "Fetch the DFlash2 drafter (SPEC=dflash2) after the main model: auto = when "
        "SPEC=dflash2, on = always, off = never.",
        "hyperqwen prepare: the pinned W4A16 DFlash2 drafter into MODELS_DIR",
        PREPARE,
        default="auto",
        choices=("auto", "on", "off"),
        tradeoff="~1.2 GB more to download; off when you bring your own drafter in DRAFT.",
    ),
    Knob(
        "DRAFT_VOCAB",
        "int",
        "Give the MTP drafter a draft vocabulary of this many most-used token ids (0 = off).",
        "hyperqwen prepare: mtp.draft_lm_head + mtp.d2t (read by patch 0007)",
        PREPARE,
        default=0,
        min=0,
        max=248320,
        tradeoff="the reference setup used 40960 ids (97.5% coverage, ~10% faster decode, their numbers); "
        "off until measured on a GPU here.",
    ),
    Knob(
        "DRAFT_VOCAB_IDS",
        "str",
        "Token-id counts from `hyperqwen draft-vocab-recount` to choose DRAFT_VOCAB ids by "
        "instead of the shipped corpus (relative: under MODELS_DIR).",
        "hyperqwen prepare",
        PREPARE,
        default="",
        tradeoff="counts of the model's own outputs cover more of what it generates than a text corpus.",
    ),
)

KNOBS_BY_NAME: dict[str, Knob] = {knob.name: knob for knob in KNOBS}

SECTIONS: tuple[str, ...] = (MODEL, SERVER, SECURITY, SPEED, MEMORY, API, OPERATIONS, MULTI_GPU, PREPARE, COMPOSE)
