"""The whole-card budget: weights + non-pool terms + KV pool + headroom, and the preflight verdict.

Pure functions: inputs are a checkpoint directory (read-only, headers only), resolved knob values and GPU
facts; nothing is started, nothing imported from torch at import time.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hyperqwen.memory.checkpoint import (
    DTYPE_BYTES,
    Checkpoint,
    CheckpointError,
    DrafterAttention,
    drafter_attention_from_config,
    load_checkpoint,
    read_checkpoint_tensors,
    read_config,
    weight_bytes,
)
from hyperqwen.memory.kvcache import (
    DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    SUPPORTED_KV_DTYPES,
    PoolInputs,
    PoolLayout,
    attention_bytes_per_token_layer,
    gdn_state_page,
    pool_layout,
)

MiB = 1024**2
GiB = 1024**3

SPEC_METHODS = ("none", "mtp", "dflash2")
STATE_DTYPES = ("auto", "float16", "float32", "bfloat16")
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32")


class MemoryPlanError(ValueError):
    """The requested configuration does not fit; the message says why, what fits and which knob to change."""


# --- inputs ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryKnobs:
    """Resolved, vLLM-level values the budget depends on (knob names from CONTRACT.md in comments).

    kv_cache_dtype            KV        -> --kv-cache-dtype (vLLM string: auto, bfloat16, fp8, int8_per_token_head, ...)
    max_model_len             MAX_LEN   -> --max-model-len (None: the planner picks the largest that fits)
    max_num_seqs              MAX_SEQS  -> --max-num-seqs
    spec_method               SPEC      (none | mtp | dflash2)
    num_speculative_tokens    DRAFT_TOKENS (mtp) / DFLASH_TOKENS (dflash2); 0 without SPEC
    prefix_caching            PREFIX_CACHE
    state_dtype               STATE_DTYPE -> --mamba-ssm-cache-dtype
    kv_cache_memory_bytes     KV_MEM    -> --kv-cache-memory-bytes (None: derived from GPU_UTIL)
    gpu_memory_utilization    GPU_UTIL  -> --gpu-memory-utilization (None: vLLM's default 0.9)
    max_num_batched_tokens    MAX_BATCHED_TOKENS
    model_dtype               DTYPE     -> --dtype
    language_model_only       not VISION -> --language-model-only
    draft_dir                 DRAFT (the DFlash drafter directory; read for its layers and weights)
    """

    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 1
    spec_method: str = "none"
    num_speculative_tokens: int = 0
    prefix_caching: bool = True
    state_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int = 8192
    model_dtype: str = "auto"
    language_model_only: bool = True
    draft_dir: str | None = None

    def __post_init__(self) -> None:
        def bad(knob: str, value: object, ok: str) -> MemoryPlanError:
            return MemoryPlanError(f"{knob}={value!r} is not valid for the memory planner; use {ok}")

        if self.kv_cache_dtype not in SUPPORTED_KV_DTYPES:
            raise bad("KV", self.kv_cache_dtype, ", ".join(SUPPORTED_KV_DTYPES))
        if self.spec_method not in SPEC_METHODS:
            raise bad("SPEC", self.spec_method, " | ".join(SPEC_METHODS))
        if self.state_dtype not in STATE_DTYPES:
            raise bad("STATE_DTYPE", self.state_dtype, " | ".join(STATE_DTYPES))
        if self.model_dtype not in MODEL_DTYPES:
            raise bad("DTYPE", self.model_dtype, " | ".join(MODEL_DTYPES))
        if self.max_model_len is not None and self.max_model_len < 1:
            raise bad("MAX_LEN", self.max_model_len, "a positive token count")
        if self.max_num_seqs < 1:
            raise bad("MAX_SEQS", self.max_num_seqs, "an integer >= 1")
        if self.num_speculative_tokens < 0 or (self.spec_method == "none" and self.num_speculative_tokens):
            raise bad("DRAFT_TOKENS/DFLASH_TOKENS", self.num_speculative_tokens,
                      "0 with SPEC=none, 1 or more with SPEC=mtp|dflash2")
        if self.spec_method != "none" and self.num_speculative_tokens < 1:
            raise bad("DRAFT_TOKENS/DFLASH_TOKENS", self.num_speculative_tokens, "an integer >= 1 with SPEC set")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise bad("KV_MEM", self.kv_cache_memory_bytes, "a positive byte count, e.g. 5GiB")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise bad("GPU_UTIL", self.gpu_memory_utilization, "a fraction in (0, 1]")
        if self.max_num_batched_tokens < 1:
            raise bad("MAX_BATCHED_TOKENS", self.max_num_batched_tokens, "an integer >= 1")

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, object]) -> MemoryKnobs:
        """Build from CONTRACT.md knob names; values already resolved by settings (missing = default)."""
        spec = str(knobs.get("SPEC") or "none")
        if spec == "mtp":
            k = int(knobs.get("DRAFT_TOKENS") or 0)
        elif spec == "dflash2":
            k = int(knobs.get("DFLASH_TOKENS") or 0)
        else:
            k = 0
        vision = knobs.get("VISION")

        def opt_int(name: str) -> int | None:
            v = knobs.get(name)
            return None if v is None or v == "" else int(v)  # type: ignore[arg-type]

        util = knobs.get("GPU_UTIL")
        return cls(
            kv_cache_dtype=str(knobs.get("KV") or "auto"),
            max_model_len=opt_int("MAX_LEN"),
            max_num_seqs=opt_int("MAX_SEQS") or 1,
            spec_method=spec,
            num_speculative_tokens=k,
            prefix_caching=bool(knobs.get("PREFIX_CACHE", True)),
            state_dtype=str(knobs.get("STATE_DTYPE") or "auto"),
            kv_cache_memory_bytes=opt_int("KV_MEM"),
            gpu_memory_utilization=None if util in (None, "") else float(util),  # type: ignore[arg-type]
            max_num_batched_tokens=opt_int("MAX_BATCHED_TOKENS") or 8192,
            model_dtype=str(knobs.get("DTYPE") or "auto"),
            language_model_only=not bool(vision) if vision is not None else True,
            draft_dir=(str(knobs["DRAFT"]) if knobs.get("DRAFT") else None),
        )


@dataclass(frozen=True)
class GpuFacts:
    """What the planner knows about the card: total memory, and memory free before vLLM starts."""

    total_bytes: int
    free_bytes: int
    name: str = "unknown GPU"
    source: str = "given"

    @classmethod
    def nominal(cls, total_bytes: int, *, reserved_bytes: int = 0, wsl2: bool = False,
                wsl2_reduction_bytes: int | None = None) -> GpuFacts:
        """A card as planned without measuring it: free = total - reserved (desktop, other apps) - WSL2 loss."""
        loss = (WSL2_REDUCTION.value if wsl2_reduction_bytes is None else wsl2_reduction_bytes) if wsl2 else 0
        src = f"nominal {format_gib(total_bytes)} card"
        if reserved_bytes:
            src += f", {format_gib(reserved_bytes)} reserved"
        if wsl2:
            src += f", WSL2 (-{format_gib(loss)})"
        return cls(total_bytes, max(total_bytes - reserved_bytes - loss, 0), "planned card", src)


# --- non-pool terms ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """A memory term that can only be measured on a GPU: the value we use and where it comes from."""

    value: int
    source: str


# Values measured elsewhere (the 3090 reference setup, vLLM 0.27.1 + patches; shared/reference/
# reference-numbers.md) or estimated; every one can be replaced with --set NAME=BYTES.
CUDA_GRAPHS = Term(1400 * MiB, "reference setup's constant '1400 MiB of graphs' (issue #6); counted by "
                               "vLLM's profiler when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (default)")
UNCOUNTED_GRAPHS_DFLASH = Term(int(1.9 * GiB), "reference-numbers.md: DFlash2 path graphs not counted by "
                                               "vLLM's profiler, ~1.2-1.9 GiB (upper end)")
HEADROOM_FLOOR = Term(400 * MiB, "reference-numbers.md: ~400 MiB had to stay free after boot or bursts failed")
ACTIVATION_VARIABILITY = Term(1 * GiB, "reference-numbers.md: the profiled activation peak varied by ~1 GiB "
                                       "between starts (only matters when GPU_UTIL sizes the pool)")
WSL2_REDUCTION = Term(GiB // 2, "reference-numbers.md: WSL2 leaves ~0.5 GiB less than bare metal")
CUDA_CONTEXT = Term(512 * MiB, "estimate (not measured here): CUDA context + cuBLAS/NCCL-free workspaces "
                               "outside torch's allocator; measure: nvidia-smi used memory of an idle "
                               "process after torch.cuda.init()")

OVERRIDABLE_TERMS = ("CUDA_GRAPHS", "UNCOUNTED_GRAPHS", "HEADROOM_FLOOR", "ACTIVATION_VARIABILITY",
                     "CUDA_CONTEXT", "ACTIVATION_PEAK", "DRAFTER_WEIGHTS", "KERNEL_BLOCK_ALIGNMENT")


def activation_peak_estimate(shape_hidden: int, shape_intermediate: int, vocab: int, model_dtype_bytes: int,
                             max_num_batched_tokens: int, max_num_seqs: int, k: int) -> Term:
    """Profile-run peak of activations (estimate from config shapes; vLLM measures the real one).

    A batched step of T tokens holds the MLP's gate_up output (T x 2I) and its activated half (T x I) plus
    a few hidden-size tensors (residual, normed input, attention output: T x 4H); the sampler holds
    float32 logits for every position it scores: max_num_seqs x (1 + k) x vocab.
    """
    per_token = model_dtype_bytes * (3 * shape_intermediate + 4 * shape_hidden)
    logits = max_num_seqs * (1 + k) * vocab * 4
    value = max_num_batched_tokens * per_token + logits
    return Term(value, f"estimate from config: {max_num_batched_tokens} batched tokens x {per_token} B "
                       f"+ logits {max_num_seqs}x(1+{k})x{vocab}x4 B; vLLM measures it at boot")


def default_cudagraph_capture_sizes(max_num_seqs: int, num_speculative_tokens: int, max_num_batched_tokens: int,
                                    default_max_graph_size: int = 512) -> list[int]:
    """The batch sizes (tokens) vLLM 0.32.0 captures CUDA graphs for by default on a pre-Blackwell GPU.

    config/vllm.py VllmConfig._set_cudagraph_sizes (no user sizes, default performance mode, no dynamic
    speculation): a token grid 1, 2, 4, 8..248 step 8, 256.. step 16 up to min(2 x MAX_SEQS x (1 + k), 512,
    MAX_BATCHED_TOKENS), plus MAX_BATCHED_TOKENS when inside it, plus uniform decode sizes n x (1 + k).
    Graph memory grows with these sizes and with k; it is reported next to the CUDA_GRAPHS term.
    """
    q = 1 + num_speculative_tokens
    top = min(max_num_seqs * q * 2, default_max_graph_size)
    decode: list[int] = []
    if q > 1:
        reqs = min(max_num_seqs, default_max_graph_size)
        counts = [n for n in (1, 2, 4) if n <= reqs] + list(range(8, min(reqs + 1, 256), 8))
        counts = sorted(set(counts + list(range(256, reqs + 1, 16)) + [reqs]))
        decode = sorted({n * q for n in counts if n * q <= top})
    elif max_num_seqs <= top:
        decode = [max_num_seqs]
    top = min(max_num_batched_tokens, top)
    sizes = [i for i in (1, 2, 4) if i <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    if max_num_batched_tokens <= top and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    sizes += [d for d in decode if d <= max_num_batched_tokens]
    return sorted(set(sizes))


# --- outputs -----------------------------------------------------------------------------------------

PROMPT_LENGTHS = (128, 4096, 16384)


@dataclass(frozen=True)
class MemoryBudget:
    gpu: GpuFacts
    knobs: MemoryKnobs
    resolved: Mapping[str, object]  # model dtype, state dtype, k, ... as vLLM will see them
    weights: Mapping[str, int]  # body / vision / mtp / drafter / resident
    attn_bytes_per_token_layer: int
    kv_bytes_per_token: int  # all attention layers of one token (target + drafter)
    gdn_page: Mapping[str, int]
    layout: PoolLayout
    terms: Mapping[str, Term]
    pool_bytes: int
    max_model_len: int
    requested_bytes: int  # GPU_UTIL x total (what vLLM asks for), or the KV_MEM footprint
    footprint_bytes: int  # everything vLLM holds after boot, incl. uncounted graphs
    problems: tuple[str, ...] = ()
    fix_hints: tuple[str, ...] = ()
    largest_fitting_max_len: int = 0
    largest_note: str = ""  # the other change that MAX_LEN assumes (e.g. " once KV_MEM=...")
    suggested_kv_mem: int = 0  # largest pool that keeps the headroom floor: what to pin KV_MEM to

    # derived views -------------------------------------------------------------------------------
    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def num_blocks(self) -> int:
        return self.layout.num_blocks(self.pool_bytes)

    @property
    def pool_tokens(self) -> int:
        """vLLM's 'GPU KV cache size: N tokens' for this MAX_LEN."""
        if self.num_blocks == 0:
            return 0
        return self.layout.reported_tokens(self.pool_bytes, self.max_model_len)

    @property
    def longest_context(self) -> int:
        return self.layout.longest_request(self.pool_bytes)

    @property
    def resident_requests(self) -> dict[int, int]:
        return {n: self.layout.resident_requests(self.pool_bytes, n) for n in PROMPT_LENGTHS}

    @property
    def headroom_bytes(self) -> int:
        return self.gpu.free_bytes - self.footprint_bytes

    def raise_if_not_fits(self) -> None:
        if self.problems:
            raise MemoryPlanError(self.explain_failure())

    def explain_failure(self) -> str:
        lines = ["The memory plan does not fit this GPU "
                 f"({self.gpu.name}: {format_gib(self.gpu.free_bytes)} free of {format_gib(self.gpu.total_bytes)}):"]
        lines += [f"  - {p}" for p in self.problems]
        if self.largest_fitting_max_len:
            lines.append(f"Largest MAX_LEN that fits{self.largest_note or ' with these settings'}: "
                         f"{self.largest_fitting_max_len} (set MAX_LEN={self.largest_fitting_max_len}).")
        else:
            lines.append("No MAX_LEN fits with these settings.")
        lines += [f"Or change: {h}" for h in self.fix_hints]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "fits": self.fits,
            "problems": list(self.problems),
            "fix_hints": list(self.fix_hints),
            "gpu": asdict(self.gpu),
            "knobs": asdict(self.knobs),
            "resolved": dict(self.resolved),
            "weights_bytes": dict(self.weights),
            "kv": {
                "attention_bytes_per_token_per_layer": self.attn_bytes_per_token_layer,
                "bytes_per_token_all_layers": self.kv_bytes_per_token,
                "gdn_state_page": dict(self.gdn_page),
                "attention_block_size": self.layout.attention_block_size,
                "mamba_page_padded_bytes": self.layout.mamba_page_padded,
                "mamba_padding_pct": round(self.layout.mamba_padding_pct, 2),
                "groups": [{"kind": g.spec.kind, "layers": g.num_layers, "page_bytes": g.spec.page_size_bytes,
                            "block_size": g.spec.block_size} for g in self.layout.groups],
                "bytes_per_block": self.layout.bytes_per_block,
                "state_pages_per_request_per_group": self.layout.state_blocks_per_group,
                # What one request costs in the pool: its GDN state blocks (all groups) and, per token,
                # one block's bytes spread over the block's tokens.
                "state_bytes_per_request": self.layout.blocks_per_request(0) * self.layout.bytes_per_block,
                "pool_bytes_per_token": self.layout.bytes_per_block / self.layout.attention_block_size,
            },
            "terms": {k: {"bytes": t.value, "source": t.source} for k, t in self.terms.items()},
            "pool_bytes": self.pool_bytes,
            "num_blocks": self.num_blocks,
            "max_model_len": self.max_model_len,
            "pool_tokens": self.pool_tokens,
            "longest_context": self.longest_context,
            "resident_requests": {str(k): v for k, v in self.resident_requests.items()},
            "requested_bytes": self.requested_bytes,
            "footprint_bytes": self.footprint_bytes,
            "headroom_bytes": self.headroom_bytes,
            "largest_fitting_max_len": self.largest_fitting_max_len,
            "largest_fitting_max_len_note": self.largest_note.strip(),
            "suggested_kv_mem": self.suggested_kv_mem,
        }


def format_gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


# --- the plan ----------------------------------------------------------------------------------------

DEFAULT_GPU_UTIL = 0.9  # vLLM 0.32.0 CacheConfig.gpu_memory_utilization default


def _resolve_dtype(model_dtype: str, checkpoint_dtype: str) -> str:
    if model_dtype != "auto":
        return model_dtype
    # vLLM keeps float32 checkpoints at bfloat16-or-float16 on GPU only when asked; --dtype auto on a
    # float32 checkpoint gives bfloat16 on CUDA (config/model.py _resolve_auto_dtype). Others pass through.
    return "bfloat16" if checkpoint_dtype in ("float32", "float") else checkpoint_dtype


def _resolve_state_dtype(state_dtype: str, config_default: str | None, model_dtype: str) -> str:
    """--mamba-ssm-cache-dtype: auto takes the config's mamba_ssm_dtype (model_executor/models/config.py
    Qwen3_5ForConditionalGenerationConfig), else the conv state dtype (the model dtype)."""
    if state_dtype != "auto":
        return state_dtype
    return config_default or model_dtype


def _term(overrides: Mapping[str, int], name: str, default: Term) -> Term:
    if name in overrides:
        return Term(int(overrides[name]), "user override")
    return default


def build_layout(checkpoint: Checkpoint, knobs: MemoryKnobs, *, drafter: DrafterAttention | None = None,
                 kernel_block_alignment: int = DEFAULT_KERNEL_BLOCK_ALIGNMENT) -> tuple[PoolLayout, dict]:
    """The pool layout for these knobs (no GPU needed): what the integration tests compare with vLLM."""
    s = checkpoint.shape
    model_dtype = _resolve_dtype(knobs.model_dtype, s.torch_dtype)
    mdb = DTYPE_BYTES[model_dtype]
    state_dtype = _resolve_state_dtype(knobs.state_dtype, s.mamba_ssm_dtype, model_dtype)
    k = knobs.num_speculative_tokens
    attn = attention_bytes_per_token_layer(knobs.kv_cache_dtype, s.num_kv_heads, s.head_dim, mdb)
    page = gdn_state_page(num_k_heads=s.linear_num_key_heads, num_v_heads=s.linear_num_value_heads,
                          head_k_dim=s.linear_key_head_dim, head_v_dim=s.linear_value_head_dim,
                          conv_kernel=s.linear_conv_kernel_dim, num_speculative_tokens=k,
                          conv_dtype_bytes=mdb, ssm_dtype_bytes=DTYPE_BYTES[state_dtype])
    mtp_layers = s.mtp_num_hidden_layers if knobs.spec_method == "mtp" else 0
    if knobs.spec_method == "mtp" and mtp_layers == 0:
        raise MemoryPlanError("SPEC=mtp but the checkpoint's config has mtp_num_hidden_layers=0 (no MTP head); "
                              "use SPEC=none or SPEC=dflash2")
    drafter_layers = drafter_bpt = 0
    if knobs.spec_method == "dflash2":
        if drafter is None:
            raise MemoryPlanError("SPEC=dflash2 needs the drafter's config: set DRAFT to the drafter directory")
        drafter_layers = drafter.num_layers
        drafter_bpt = attention_bytes_per_token_layer(knobs.kv_cache_dtype, drafter.num_kv_heads,
                                                      drafter.head_dim, mdb)
    layout = pool_layout(PoolInputs(
        num_attention_layers=s.num_full_attention_layers, num_gdn_layers=s.num_linear_attention_layers,
        attn_bytes_per_token_layer=attn, gdn_page=page, num_speculative_tokens=k,
        prefix_caching=knobs.prefix_caching, mtp_attention_layers=mtp_layers, drafter_layers=drafter_layers,
        drafter_bytes_per_token_layer=drafter_bpt, kernel_block_alignment=kernel_block_alignment))
    info = {"model_dtype": model_dtype, "state_dtype": state_dtype, "num_speculative_tokens": k,
            "attn": attn, "gdn_page": page, "mtp_layers": mtp_layers, "drafter_layers": drafter_layers,
            "drafter_bpt": drafter_bpt,
            "mamba_cache_mode": "align" if knobs.prefix_caching else "none"}
    return layout, info


def plan_memory(model_dir: str | Path, knobs: Mapping[str, object] | MemoryKnobs, gpu: GpuFacts,
                overrides: Mapping[str, int] | None = None, *, checkpoint: Checkpoint | None = None) -> MemoryBudget:
    """Plan the card: weights, non-pool terms, KV pool, headroom; problems listed when it does not fit.

    knobs: a MemoryKnobs, or a mapping with CONTRACT.md knob names (see MemoryKnobs.from_knobs).
    overrides: replace a measured/estimated term by name (OVERRIDABLE_TERMS), in bytes.
    """
    k = knobs if isinstance(knobs, MemoryKnobs) else MemoryKnobs.from_knobs(knobs)
    ov = dict(overrides or {})
    ckpt = checkpoint or load_checkpoint(Path(model_dir))
    s = ckpt.shape

    drafter = None
    drafter_weights = 0
    if k.spec_method == "dflash2":
        if not k.draft_dir:
            raise MemoryPlanError("SPEC=dflash2 needs DRAFT (the drafter directory) for its layers and weights")
        dd = Path(k.draft_dir)
        if not dd.is_absolute():
            dd = Path(model_dir).parent / dd
        drafter = drafter_attention_from_config(read_config(dd), str(dd / "config.json"))
        if "DRAFTER_WEIGHTS" not in ov:
            mdt = DTYPE_BYTES[_resolve_dtype(k.model_dtype, s.torch_dtype)]
            drafter_weights = weight_bytes(read_checkpoint_tensors(dd), mdt).resident(
                language_model_only=True, with_mtp=False)

    kba = int(ov.get("KERNEL_BLOCK_ALIGNMENT", DEFAULT_KERNEL_BLOCK_ALIGNMENT))
    layout, info = build_layout(ckpt, k, drafter=drafter, kernel_block_alignment=kba)
    mdb = DTYPE_BYTES[info["model_dtype"]]
    w = ckpt.weights(mdb)
    with_mtp = k.spec_method == "mtp"
    drafter_term = _term(ov, "DRAFTER_WEIGHTS", Term(w.mtp if with_mtp else drafter_weights,
                                                     "mtp.* tensor headers" if with_mtp else
                                                     ("drafter safetensors headers" if drafter else "no drafter")))
    resident = w.resident(language_model_only=k.language_model_only, with_mtp=False) + drafter_term.value
    # MTP: the drafter first builds its own embed_tokens and lm_head in the model dtype, then swaps in the
    # target's (vLLM log 'Sharing target model ... weights with the draft model'): a load-time transient.
    load_transient = 2 * s.vocab_size * s.hidden_size * mdb if with_mtp else 0

    capture = default_cudagraph_capture_sizes(k.max_num_seqs, k.num_speculative_tokens, k.max_num_batched_tokens)
    graphs = _term(ov, "CUDA_GRAPHS", replace(CUDA_GRAPHS, source=CUDA_GRAPHS.source + (
        f"; vLLM captures {len(capture)} sizes up to {capture[-1]} tokens for these knobs (more sizes, "
        "larger k or MAX_SEQS: more graph memory, measure it)")))
    uncounted = _term(ov, "UNCOUNTED_GRAPHS", UNCOUNTED_GRAPHS_DFLASH if k.spec_method == "dflash2"
                      else Term(0, "vLLM's profiler counts the graphs of this path"))
    context = _term(ov, "CUDA_CONTEXT", CUDA_CONTEXT)
    floor = _term(ov, "HEADROOM_FLOOR", HEADROOM_FLOOR)
    act = (Term(int(ov["ACTIVATION_PEAK"]), "user override") if "ACTIVATION_PEAK" in ov else
           activation_peak_estimate(s.hidden_size, s.intermediate_size, s.vocab_size, mdb,
                                    k.max_num_batched_tokens, k.max_num_seqs, k.num_speculative_tokens))
    variability = (_term(ov, "ACTIVATION_VARIABILITY", ACTIVATION_VARIABILITY)
                   if k.kv_cache_memory_bytes is None else Term(0, "pool pinned by KV_MEM: not profiled"))
    terms = {"weights": Term(resident, "safetensors headers"), "drafter_weights": drafter_term,
             "cuda_context": context, "activation_peak": act, "cuda_graphs": graphs,
             "uncounted_graphs": uncounted, "activation_variability": variability, "headroom_floor": floor,
             "load_transient": Term(load_transient, "MTP drafter's own embed_tokens + lm_head before sharing")}

    non_pool = resident + context.value + act.value + graphs.value + uncounted.value
    problems: list[str] = []
    hints: list[str] = []
    if k.kv_cache_memory_bytes is not None:
        pool = k.kv_cache_memory_bytes
        requested = non_pool + pool
    else:
        util = k.gpu_memory_utilization if k.gpu_memory_utilization is not None else DEFAULT_GPU_UTIL
        requested = math.ceil(gpu.total_bytes * util)
        # gpu_worker.determine_available_memory: requested - (weights + peak + non-torch) - graph estimate.
        pool = max(requested - (non_pool - uncounted.value), 0)
        if requested > gpu.free_bytes:
            problems.append(f"GPU_UTIL={util} asks vLLM for {format_gib(requested)} but only "
                            f"{format_gib(gpu.free_bytes)} is free; vLLM refuses to start")
    footprint = non_pool + pool

    if resident + load_transient + context.value > gpu.free_bytes:
        problems.append(f"weights ({format_gib(resident)}) + load transient ({format_gib(load_transient)}) + CUDA "
                        f"context do not fit in {format_gib(gpu.free_bytes)} free")

    # A worse profile run at a later boot shrinks a GPU_UTIL-sized pool by up to `variability`; MAX_LEN
    # must still fit then, so fit checks use the smaller pool.
    check_pool = max(pool - variability.value, 0)
    # MAX_LEN: chosen when unset (largest that fits, capped by the model's max_position_embeddings).
    longest = layout.longest_request(check_pool)
    largest = min(longest, s.max_position_embeddings)
    max_len = k.max_model_len if k.max_model_len is not None else largest
    if max_len <= 0:
        margin = f" after the {format_gib(variability.value)} activation-variability margin" if variability.value else ""
        problems.append(f"the KV pool ({format_gib(check_pool)}{margin}) cannot hold even one token of one "
                        f"request (one block is {layout.bytes_per_block} B and a request needs "
                        f"{layout.blocks_per_request(1)} blocks)")
        hints.append("KV=fp8 or a smaller model footprint (VISION=0, SPEC=none), or a larger GPU_UTIL")
        max_len = 1
    elif not layout.fits_one_request(check_pool, max_len):
        need = layout.pool_bytes_for(max_len)
        problems.append(f"one MAX_LEN={max_len} request needs {layout.blocks_per_request(max_len)} blocks "
                        f"({format_gib(need)} of KV pool incl. the null block) but the pool is "
                        f"{format_gib(check_pool)} ({layout.usable_blocks(check_pool)} usable blocks"
                        + (", after the activation-variability margin" if variability.value else "")
                        + "); vLLM refuses to start")
        if info["state_dtype"] == "float32":
            hints.append("STATE_DTYPE=float16 (halves the GDN state page)")
        if k.kv_cache_dtype in ("auto", "bfloat16", "float16"):
            hints.append("KV=fp8 (halves KV bytes per token)")
        if k.num_speculative_tokens > 1:
            hints.append("fewer DRAFT_TOKENS/DFLASH_TOKENS (each adds a GDN state page per request)")
        pinned = max(gpu.free_bytes - floor.value - non_pool, 0)
        if k.kv_cache_memory_bytes is None and layout.longest_request(pinned) > layout.longest_request(check_pool):
            hints.append(f"KV_MEM={pinned} (pins the pool, no profiling margin: MAX_LEN up to "
                         f"{min(layout.longest_request(pinned), s.max_position_embeddings)})")
    headroom = gpu.free_bytes - footprint
    # The largest pool every constraint allows: footprint + floor <= free (in GPU_UTIL mode this also
    # keeps GPU_UTIL x total <= free, since the requested memory is part of the footprint).
    safe_pool = max(gpu.free_bytes - floor.value - non_pool, 0)
    if k.kv_cache_memory_bytes is None:
        fit_util = math.floor((gpu.free_bytes - floor.value - uncounted.value) / gpu.total_bytes * 1000) / 1000
    if headroom < floor.value:
        problems.append(f"after boot only {format_gib(headroom)} would stay free, below the "
                        f"{format_gib(floor.value)} headroom floor ({floor.source})")
        if k.kv_cache_memory_bytes is not None:
            hints.append(f"KV_MEM={safe_pool} (largest pool that keeps the headroom floor)")
        else:
            hints.append(f"GPU_UTIL={fit_util} (keeps the headroom floor), or pin KV_MEM={safe_pool}")
    weights_problem = resident + load_transient + context.value > gpu.free_bytes
    fit_check_pool = min(check_pool, max(safe_pool - variability.value, 0))
    largest_fit = 0 if weights_problem else min(layout.longest_request(fit_check_pool), s.max_position_embeddings)
    largest_note = ""
    if fit_check_pool < check_pool and largest_fit:
        largest_note = (f" once KV_MEM={safe_pool}" if k.kv_cache_memory_bytes is not None
                        else f" once GPU_UTIL={fit_util}")

    resolved = {**{kk: v for kk, v in info.items() if kk not in ("gdn_page",)},
                "kv_cache_dtype": k.kv_cache_dtype, "language_model_only": k.language_model_only}
    kv_all = info["attn"] * (s.num_full_attention_layers + info["mtp_layers"]) + \
        info["drafter_bpt"] * info["drafter_layers"]
    page = info["gdn_page"]
    return MemoryBudget(
        gpu=gpu, knobs=k, resolved=resolved,
        weights={"body": w.body, "vision": w.vision, "mtp": w.mtp, "drafter": drafter_term.value,
                 "resident": resident},
        attn_bytes_per_token_layer=info["attn"], kv_bytes_per_token=kv_all,
        gdn_page={"conv_bytes": page.conv_bytes, "ssm_bytes": page.ssm_bytes, "bytes": page.bytes},
        layout=layout, terms=terms, pool_bytes=pool, max_model_len=max_len, requested_bytes=requested,
        footprint_bytes=footprint, problems=tuple(problems), fix_hints=tuple(dict.fromkeys(hints)),
        largest_fitting_max_len=largest_fit, largest_note=largest_note, suggested_kv_mem=safe_pool)


def largest_max_len_that_fits(model_dir: str | Path, knobs: Mapping[str, object] | MemoryKnobs, gpu: GpuFacts,
                              overrides: Mapping[str, int] | None = None) -> int:
    """The largest MAX_LEN a plan with these knobs fits (0: none), with the headroom floor kept."""
    k = knobs if isinstance(knobs, MemoryKnobs) else MemoryKnobs.from_knobs(knobs)
    return plan_memory(model_dir, replace(k, max_model_len=None), gpu, overrides).largest_fitting_max_len


# --- GPU facts ---------------------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": MiB, "MB": MiB, "MIB": MiB,
          "G": GiB, "GB": GiB, "GIB": GiB, "T": 1024 * GiB, "TB": 1024 * GiB, "TIB": 1024 * GiB}


def parse_size(text: str, what: str = "size") -> int:
    """'24GiB', '24GB', '5583457484', '512MiB' -> bytes. GPU makers' 'GB' means GiB (a '24 GB' card has
    24,576 MiB), so GB and GiB are read the same."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise MemoryPlanError(f"{what}={text!r} is not a size; use e.g. 24GiB, 512MiB or a byte count")
    unit = (m.group(2) or "").upper()
    return int(float(m.group(1)) * _UNITS[unit])


def read_gpu_facts(device_index: int = 0) -> GpuFacts | None:
    """Total and free memory of GPU device_index via nvidia-smi, else torch.cuda; None when neither works."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, f"--id={device_index}", "--query-gpu=memory.total,memory.free,name",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20,
                                 check=True).stdout.strip().splitlines()
            total_mib, free_mib, name = (x.strip() for x in out[0].split(",", 2))
            return GpuFacts(int(total_mib) * MiB, int(free_mib) * MiB, name, "nvidia-smi")
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    try:
        import torch  # deferred: importing torch costs seconds and is not needed for planning
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(device_index)
        return GpuFacts(int(total), int(free), torch.cuda.get_device_name(device_index), "torch.cuda.mem_get_info")
    except Exception:  # noqa: BLE001 - a broken driver means "no facts", not a crash of the planner
        return None


__all__ = [
    "CheckpointError", "GpuFacts", "MemoryBudget", "MemoryKnobs", "MemoryPlanError", "Term", "build_layout",
    "default_cudagraph_capture_sizes", "largest_max_len_that_fits", "parse_size", "plan_memory", "read_gpu_facts",
]
