"""The whole-card budget, in vLLM 0.32.0's order of events, and the verdict.

vLLM's start, and where each planner term sits in it (paths under site-packages/vllm/):

1. CUDA context (+ NCCL, none for one GPU): `v1/worker/gpu_worker.py Worker.init_device` creates it BEFORE
   taking the start snapshot. So the context never comes out of the KV pool; it only lowers the free
   memory that the startup check sees (term `cuda_context`).
2. Startup check: `v1/worker/utils.py request_memory`: requested = ceil(total x GPU_UTIL), and vLLM refuses
   to start when the snapshot's free memory is below it. This runs with KV_MEM too (GPU_UTIL then stays
   at its 0.9 default for this check).
3. Weights: `Worker.load_model` (term `weights`; MTP adds `load_transient` while its embed/lm_head copies
   exist).
4. Profile run: `Worker.determine_available_memory` -> `utils/mem_utils.py memory_profiling`: non-KV
   memory = weights + non-torch growth since the snapshot + the transient activation peak
   (`activation_peak`).
5. CUDA graphs: `v1/worker/gpu_model_runner.py GPUModelRunner.profile_cudagraph_memory` estimates graph
   memory and, with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (the default), takes it from the pool
   (`cuda_graphs`; calibrated together with the non-torch growth). Graphs vLLM does not profile (the
   DFlash2 drafter's, per the 3090 reference) are `uncounted_graphs`.
6. Pool: available = requested - non-KV - graph estimate (`determine_available_memory`), or KV_MEM exactly.
7. Boot check: `v1/core/kv_cache_utils.py _check_enough_kv_cache_memory`: one MAX_LEN request must fit.
8. After boot: `Worker.compile_or_warm_up_model` captures the graphs; from then on the process holds
   weights + activation cache + graphs + pool, and what is left of the card is the headroom
   (`headroom_floor` must stay free).

Pure functions: inputs are typed settings, a checkpoint (headers only, or the bundled default) and GPU
facts; nothing is started, nothing imported from torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperqwen.config.knobs import KNOBS_BY_NAME, MTP_SPEC_METHODS
from hyperqwen.config.sizes import GiB, MiB
from hyperqwen.exit_codes import Exit
from hyperqwen.memory.checkpoint import (
    DTYPE_BYTES,
    Checkpoint,
    DrafterAttention,
    WeightBytes,
    drafter_attention_from_config,
    load_checkpoint,
    read_checkpoint_tensors,
    read_config,
    weight_bytes,
)
from hyperqwen.memory.gpu import GpuFacts, fraction_that_fits
from hyperqwen.memory.host import HostFacts, pinned_host_problems, ram_cache_problems
from hyperqwen.memory.kvcache import (
    DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    PoolInputs,
    PoolLayout,
    attention_bytes_per_token_layer,
    gdn_state_page,
    pool_layout,
)

if TYPE_CHECKING:
    from hyperqwen.config.settings import Settings


class MemoryPlanError(ValueError):
    """The inputs cannot be planned (a missing drafter, a model without an MTP head); one line, names the knob."""


class Outcome(StrEnum):
    """The verdict, most severe first; `hyperqwen plan` exits with `exit_code`."""

    REFUSES_BOOT = "vLLM would refuse to boot"
    SHORTER = "fits only with a shorter context"
    CARD_FULL = "card full after boot"
    FITS = "fits"

    @property
    def exit_code(self) -> int:
        # Never 1 (exit_codes.py): it is what Python exits with on an uncaught error.
        return {
            Outcome.FITS: Exit.OK,
            Outcome.SHORTER: Exit.PLAN_SHORTER,
            Outcome.REFUSES_BOOT: Exit.PLAN_REFUSES_BOOT,
            Outcome.CARD_FULL: Exit.PLAN_CARD_FULL,
        }[self]


# --- inputs ----------------------------------------------------------------------------------------

# vLLM 0.32.0's defaults for the OpenAI server on a card under 70 GiB (engine/arg_utils.py
# EngineArgs._set_default_max_num_seqs_and_batched_tokens_args) and CacheConfig.gpu_memory_utilization.
VLLM_DEFAULT_MAX_NUM_SEQS = 256
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
VLLM_DEFAULT_GPU_UTIL = 0.9

# The measured terms a user (or a test) may replace, by knob name (config/knobs.py documents each).
TERM_KNOBS = ("CUDA_CONTEXT", "CUDA_GRAPHS", "ACTIVATION_PEAK", "UNCOUNTED_GRAPHS", "PROFILE_MARGIN", "HEADROOM_FLOOR")
# Further overrides only code passes (calibration against other checkpoints, the allocator tests).
EXTRA_TERMS = ("WEIGHTS", "DRAFTER_WEIGHTS", "KERNEL_BLOCK_ALIGNMENT")


@dataclass(frozen=True)
class MemoryInputs:
    """The vLLM-level values the budget depends on, read from Settings only (no second validation: the
    knob schema in config/knobs.py already checked every value)."""

    model_dir: Path
    kv_cache_dtype: str  # --kv-cache-dtype
    max_model_len: int  # --max-model-len
    max_num_seqs: int  # --max-num-seqs
    spec_method: str  # none | mtp | dflash2 | ngram | mtp+lookup
    num_speculative_tokens: int
    prefix_caching: bool
    state_dtype: str  # --mamba-ssm-cache-dtype
    kv_cache_memory_bytes: int | None  # --kv-cache-memory-bytes
    gpu_memory_utilization: float  # --gpu-memory-utilization (vLLM's default when unset)
    max_num_batched_tokens: int
    model_dtype: str  # --dtype
    language_model_only: bool
    draft_dir: Path | None
    ram_cache_bytes: int | None  # RAM_CACHE -> --kv-offloading-size (pinned host RAM)
    embed_on_host: bool  # EMBED_ON_HOST -> embed_tokens in pinned host memory via UVA (patch 0065)
    terms: Mapping[str, int | None]  # TERM_KNOBS values (None: the planner's estimate) + EXTRA_TERMS
    # Terms vLLM measured on this card (memory/calibration.py), used where the knob is unset.
    measured: Mapping[str, Term] = field(default_factory=dict)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        model_dir: Path | None = None,
        max_len: int | None = None,
        terms: Mapping[str, int] | None = None,
    ) -> MemoryInputs:
        knobs = settings.knobs
        util = knobs.gpu_util
        # By name: the measured terms are one table of knobs (TERM_KNOBS), taken together.
        values: dict[str, int | None] = {name: settings[name] for name in TERM_KNOBS}
        values.update(terms or {})
        return cls(
            model_dir=Path(model_dir) if model_dir is not None else settings.model_path,
            kv_cache_dtype=settings.kv_cache_dtype,
            max_model_len=int(max_len) if max_len is not None else settings.configured_max_model_len,
            max_num_seqs=int(knobs.max_seqs or VLLM_DEFAULT_MAX_NUM_SEQS),
            spec_method=knobs.spec,
            num_speculative_tokens=settings.num_speculative_tokens,
            prefix_caching=bool(knobs.prefix_cache),
            state_dtype=knobs.state_dtype,
            kv_cache_memory_bytes=knobs.kv_mem,
            gpu_memory_utilization=float(util) if util is not None else VLLM_DEFAULT_GPU_UTIL,
            max_num_batched_tokens=int(knobs.max_batched_tokens or VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS),
            model_dtype=knobs.dtype,
            language_model_only=not knobs.vision,
            draft_dir=settings.draft_path,
            ram_cache_bytes=knobs.ram_cache,
            embed_on_host=bool(knobs.embed_on_host),
            terms=values,
        )

    def term(self, name: str) -> int | None:
        value = self.terms.get(name)
        return None if value is None else int(value)

    def calibration_key(self, extra_args: Sequence[str] = ()) -> dict[str, Any]:
        """Every setting that changes what vLLM takes before the pool (weights, profile peak, graphs); the context
        length, GPU_UTIL and KV_MEM only size the pool, so a measurement holds across them."""
        return {
            "spec_method": self.spec_method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_dtype": self.kv_cache_dtype,
            "state_dtype": self.state_dtype,
            "model_dtype": self.model_dtype,
            "prefix_caching": self.prefix_caching,
            "language_model_only": self.language_model_only,
            "embed_on_host": self.embed_on_host,
            "ram_cache": self.ram_cache_bytes is not None,
            "draft_dir": str(self.draft_dir) if self.spec_method == "dflash2" and self.draft_dir else None,
            "extra_args": list(extra_args),  # a list, as the JSON file gives it back
        }


# --- non-pool terms ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One memory term: its bytes and where the number comes from."""

    value: int
    source: str


# The start profile's transient activation peak on CUDA, measured by this project's GPU lab on an H200 given a
# 3090's budget (docs/data/gpu/2026-12-02-h200-as-rtx3090-*-cold.json: vLLM's "peak activation" less its
# CUDA-graph estimate, on a cold torch.compile cache, which is what a first start and every changed setting
# get): 1.19 GiB in batch mode (2048 batched tokens, 64 sequences, no speculation) and 1.25 GiB in single
# mode (2048, 4 sequences, MTP k=4; the drafter's own profile run adds to the target's). A warm cache
# profiles far less (0.33 GiB in single mode): the planner plans the cold start, so a later one only gains.
# (batched tokens, sequences, k) -> bytes
MEASURED_ACTIVATION_PEAKS = {
    "none": (int(1.19 * GiB), 2048, 64, 0),
    "mtp": (int(1.25 * GiB), 2048, 4, 4),
}
# vLLM 0.32.0's CUDA-graph memory estimate (taken from the pool before it is sized) and the process's
# non-torch memory, from the same recordings: the estimate was 0.25 GiB with graphs up to 40 tokens (single)
# and 0.40 GiB up to 128 (batch), a line in the largest captured size; non-torch memory 0.31-0.35 GiB.
GRAPH_ESTIMATE_BASE = int(0.182 * GiB)
GRAPH_ESTIMATE_PER_TOKEN = int(0.15 / 88 * GiB)
NON_TORCH = int(0.35 * GiB)
# "Model loading took 14.8 GiB" (single) and 14.4 GiB (batch) against 14.54 and 14.14 GiB of tensors in the
# safetensors headers: CUDA holds ~0.26 GiB more than the tensors while loading (kernel workspaces, repacked
# quantized weights); 0.27 covers the log's two-decimal rounding.
CUDA_LOAD_OVERHEAD = int(0.27 * GiB)


def activation_peak_estimate(
    shape_hidden: int,
    shape_intermediate: int,
    vocab: int,
    model_dtype_bytes: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    k: int,
    *,
    mtp: bool = False,
) -> Term:
    """The cold start profile's transient activation peak: the nearest measurement, moved by what differs.

    Per batched token a step holds the MLP's gate_up output (2I) and its activated half (I) plus a few
    hidden-size tensors (residual, normed input, attention output: 4H); the sampler holds float32 logits
    for every position it scores: max_num_seqs x (1 + k) x vocab. The difference of these from the
    measured setting is added to (or taken from) the measurement.
    """
    measured, at_tokens, at_seqs, at_k = MEASURED_ACTIVATION_PEAKS["mtp" if mtp else "none"]
    per_token = model_dtype_bytes * (3 * shape_intermediate + 4 * shape_hidden)

    def logits(seqs: int, kk: int) -> int:
        return seqs * (1 + kk) * vocab * 4

    value = (
        measured + (max_num_batched_tokens - at_tokens) * per_token + logits(max_num_seqs, k) - logits(at_seqs, at_k)
    )
    return Term(
        max(value, 0),
        f"{measured / GiB:.2f} GiB measured cold on CUDA at {at_tokens} batched tokens, {at_seqs} sequences, "
        f"k={at_k} (docs/data/gpu), moved to {max_num_batched_tokens} tokens x {per_token:,} B and logits for "
        f"{max_num_seqs} x (1+{k}); vLLM measures the real one at boot",
    )


def cuda_graphs_estimate(capture_sizes: list[int]) -> Term:
    """vLLM's CUDA-graph memory estimate plus non-torch memory, both taken before the pool is sized."""
    largest = max(capture_sizes, default=0)
    graphs = GRAPH_ESTIMATE_BASE + GRAPH_ESTIMATE_PER_TOKEN * largest
    return Term(
        graphs + NON_TORCH,
        f"graph estimate {graphs / GiB:.2f} GiB (graphs up to {largest} tokens) + non-torch {NON_TORCH / GiB:.2f} "
        "GiB, measured on CUDA (docs/data/gpu)",
    )


def default_cudagraph_capture_sizes(
    max_num_seqs: int, num_speculative_tokens: int, max_num_batched_tokens: int, default_max_graph_size: int = 512
) -> list[int]:
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

# Requests of these total lengths (prompt + output) are shown as "resident at once"; 640 = the batch
# benchmark's 128 in / 512 out.
PROMPT_LENGTHS = (640, 4096, 16384)


@dataclass(frozen=True)
class MemoryBudget:
    gpu: GpuFacts
    inputs: MemoryInputs
    checkpoint_source: str  # the directory read, or the bundled default's description
    resolved: Mapping[str, object]  # model dtype, state dtype, k, ... as vLLM will see them
    weights: Mapping[str, int]  # body / vision / mtp / drafter / resident
    attn_bytes_per_token_layer: int
    kv_bytes_per_token: int  # all attention layers of one token (target + drafter)
    gdn_page: Mapping[str, int]
    layout: PoolLayout
    terms: Mapping[str, Term]
    pool_bytes: int
    max_model_len: int
    requested_bytes: int  # ceil(total x GPU_UTIL): what the startup check asks for
    free_at_start_bytes: int  # free when vLLM takes its start snapshot (after its CUDA context)
    footprint_bytes: int  # what vLLM's process holds after boot, apart from its CUDA context
    outcome: Outcome = Outcome.FITS
    problems: tuple[str, ...] = ()
    fix_hints: tuple[str, ...] = ()
    largest_fitting_max_len: int = 0
    largest_note: str = ""  # the other change that MAX_LEN assumes (e.g. " once GPU_UTIL=...")
    suggested_kv_mem: int = 0  # largest pool that keeps the headroom floor: what to pin KV_MEM to
    calibration: str = ""  # one line: the measurement used (or why none was), "" without a calibration file

    @property
    def fits(self) -> bool:
        return self.outcome is Outcome.FITS

    @property
    def num_blocks(self) -> int:
        return self.layout.num_blocks(self.pool_bytes)

    @property
    def pool_tokens(self) -> int:
        """vLLM's log line 'GPU KV cache size: N tokens' for this MAX_LEN."""
        if self.num_blocks == 0:
            return 0
        return self.layout.reported_tokens(self.pool_bytes, self.max_model_len)

    @property
    def max_concurrency(self) -> float:
        """vLLM's 'Maximum concurrency for MAX_LEN tokens per request: Nx' (get_kv_cache_capacity)."""
        return round(self.layout.max_concurrency(self.pool_bytes, self.max_model_len), 2)

    @property
    def longest_context(self) -> int:
        return self.layout.longest_request(self.pool_bytes)

    @property
    def resident_requests(self) -> dict[int, int]:
        """Requests of n tokens whose blocks fit at once, capped by MAX_SEQS (the scheduler's limit)."""
        cap = self.inputs.max_num_seqs
        return {n: min(self.layout.resident_requests(self.pool_bytes, n), cap) for n in PROMPT_LENGTHS}

    @property
    def headroom_bytes(self) -> int:
        return self.free_at_start_bytes - self.footprint_bytes

    def explain_failure(self) -> str:
        lines = [
            f"{self.outcome.value} on this GPU ({self.gpu.name}: {format_gib(self.gpu.free_bytes)} free of "
            f"{format_gib(self.gpu.total_bytes)}):"
        ]
        lines += [f"  - {p}" for p in self.problems]
        if self.largest_fitting_max_len:
            lines.append(
                f"Largest MAX_LEN that fits{self.largest_note or ' with these settings'}: "
                f"{self.largest_fitting_max_len} (set MAX_LEN={self.largest_fitting_max_len})."
            )
        else:
            lines.append("No MAX_LEN fits with these settings.")
        lines += [f"Or change: {h}" for h in self.fix_hints]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: the verdict and the numbers a user acts on."""
        return (
            f"{self.outcome.value}: MAX_LEN={self.max_model_len:,}, KV pool {format_gib(self.pool_bytes)} = "
            f"{self.pool_tokens:,} tokens, max concurrency {self.max_concurrency}x at full length, "
            f"{format_gib(self.headroom_bytes)} free after boot"
        )

    def to_dict(self) -> dict:
        i = self.inputs
        return {
            "outcome": self.outcome.value,
            "fits": self.fits,
            "exit_code": self.outcome.exit_code,
            "problems": list(self.problems),
            "fix_hints": list(self.fix_hints),
            "gpu": asdict(self.gpu),
            "checkpoint": self.checkpoint_source,
            "inputs": {
                **{k: v for k, v in asdict(i).items() if k not in ("model_dir", "draft_dir", "terms", "measured")},
                "model_dir": str(i.model_dir),
                "draft_dir": str(i.draft_dir) if i.draft_dir else None,
            },
            "resolved": dict(self.resolved),
            "weights_bytes": dict(self.weights),
            "kv": {
                "attention_bytes_per_token_per_layer": self.attn_bytes_per_token_layer,
                "bytes_per_token_all_layers": self.kv_bytes_per_token,
                "gdn_state_page": dict(self.gdn_page),
                "attention_block_size": self.layout.attention_block_size,
                "mamba_page_padded_bytes": self.layout.mamba_page_padded,
                "mamba_padding_pct": round(self.layout.mamba_padding_pct, 2),
                "groups": [
                    {
                        "kind": g.spec.kind,
                        "layers": g.num_layers,
                        "page_bytes": g.spec.page_size_bytes,
                        "block_size": g.spec.block_size,
                    }
                    for g in self.layout.groups
                ],
                "bytes_per_block": self.layout.bytes_per_block,
                "state_pages_per_request_per_group": self.layout.state_blocks_per_group,
                "state_bytes_per_request": self.layout.blocks_per_request(0) * self.layout.bytes_per_block,
                "pool_bytes_per_token": self.layout.bytes_per_block / self.layout.attention_block_size,
            },
            "terms": {k: {"bytes": t.value, "source": t.source} for k, t in self.terms.items()},
            "pool_bytes": self.pool_bytes,
            "num_blocks": self.num_blocks,
            "max_model_len": self.max_model_len,
            "pool_tokens": self.pool_tokens,
            "max_concurrency": self.max_concurrency,
            "longest_context": self.longest_context,
            "resident_requests": {str(k): v for k, v in self.resident_requests.items()},
            "requested_bytes": self.requested_bytes,
            "free_at_start_bytes": self.free_at_start_bytes,
            "footprint_bytes": self.footprint_bytes,
            "headroom_bytes": self.headroom_bytes,
            "largest_fitting_max_len": self.largest_fitting_max_len,
            "largest_fitting_max_len_note": self.largest_note.strip(),
            "suggested_kv_mem": self.suggested_kv_mem,
            "calibration": self.calibration,
        }


def format_gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


# --- the plan ----------------------------------------------------------------------------------------


def _resolve_dtype(model_dtype: str, checkpoint_dtype: str) -> str:
    if model_dtype != "auto":
        return model_dtype
    # --dtype auto on a float32 checkpoint gives bfloat16 on CUDA (config/model.py _resolve_auto_dtype).
    return "bfloat16" if checkpoint_dtype in ("float32", "float") else checkpoint_dtype


def _resolve_state_dtype(state_dtype: str, config_default: str | None, model_dtype: str) -> str:
    """--mamba-ssm-cache-dtype: auto takes the config's mamba_ssm_dtype (model_executor/models/config.py
    Qwen3_5ForConditionalGenerationConfig), else the conv state dtype (the model dtype)."""
    if state_dtype != "auto":
        return state_dtype
    return config_default or model_dtype


@dataclass(frozen=True)
class LayoutKnobs:
    """What the pool's structure depends on (a subset of MemoryInputs; the allocator tests build it)."""

    kv_cache_dtype: str
    state_dtype: str = "auto"
    model_dtype: str = "auto"
    spec_method: str = "none"
    num_speculative_tokens: int = 0
    prefix_caching: bool = True


def build_layout(
    checkpoint: Checkpoint,
    knobs: LayoutKnobs,
    *,
    drafter: DrafterAttention | None = None,
    kernel_block_alignment: int = DEFAULT_KERNEL_BLOCK_ALIGNMENT,
) -> tuple[PoolLayout, dict]:
    """The pool layout for these knobs (no GPU needed): what the integration tests compare with vLLM."""
    s = checkpoint.shape
    model_dtype = _resolve_dtype(knobs.model_dtype, s.torch_dtype)
    mdb = DTYPE_BYTES[model_dtype]
    state_dtype = _resolve_state_dtype(knobs.state_dtype, s.mamba_ssm_dtype, model_dtype)
    k = knobs.num_speculative_tokens
    attn = attention_bytes_per_token_layer(knobs.kv_cache_dtype, s.num_kv_heads, s.head_dim, mdb)
    page = gdn_state_page(
        num_k_heads=s.linear_num_key_heads,
        num_v_heads=s.linear_num_value_heads,
        head_k_dim=s.linear_key_head_dim,
        head_v_dim=s.linear_value_head_dim,
        conv_kernel=s.linear_conv_kernel_dim,
        num_speculative_tokens=k,
        conv_dtype_bytes=mdb,
        ssm_dtype_bytes=DTYPE_BYTES[state_dtype],
    )
    uses_mtp = knobs.spec_method in MTP_SPEC_METHODS
    mtp_layers = s.mtp_num_hidden_layers if uses_mtp else 0
    if uses_mtp and mtp_layers == 0:
        raise MemoryPlanError(
            f"SPEC={knobs.spec_method} but the checkpoint's config has mtp_num_hidden_layers=0 (no MTP head); "
            "use SPEC=none or SPEC=dflash2"
        )
    drafter_layers = drafter_bpt = 0
    if knobs.spec_method == "dflash2":
        if drafter is None:
            raise MemoryPlanError("SPEC=dflash2 needs the drafter's config: set DRAFT to the drafter directory")
        drafter_layers = drafter.num_layers
        drafter_bpt = attention_bytes_per_token_layer(knobs.kv_cache_dtype, drafter.num_kv_heads, drafter.head_dim, mdb)
    layout = pool_layout(
        PoolInputs(
            num_attention_layers=s.num_full_attention_layers,
            num_gdn_layers=s.num_linear_attention_layers,
            attn_bytes_per_token_layer=attn,
            gdn_page=page,
            num_speculative_tokens=k,
            prefix_caching=knobs.prefix_caching,
            mtp_attention_layers=mtp_layers,
            drafter_layers=drafter_layers,
            drafter_bytes_per_token_layer=drafter_bpt,
            kernel_block_alignment=kernel_block_alignment,
        )
    )
    info = {
        "model_dtype": model_dtype,
        "state_dtype": state_dtype,
        "num_speculative_tokens": k,
        "attn": attn,
        "gdn_page": page,
        "mtp_layers": mtp_layers,
        "drafter_layers": drafter_layers,
        "drafter_bpt": drafter_bpt,
        "mamba_cache_mode": "align" if knobs.prefix_caching else "none",
    }
    return layout, info


def load_planning_checkpoint(model_dir: Path) -> tuple[Checkpoint, str]:
    """The checkpoint at model_dir; when that directory does not exist and it is the default model, the
    bundled shapes (so a fresh checkout can plan before downloading). A directory that exists but is
    broken is an error, never silently replaced."""
    from hyperqwen.memory.bundled import BUNDLED_MODEL, load_bundled_checkpoint

    if not model_dir.exists() and model_dir.name == BUNDLED_MODEL:
        return load_bundled_checkpoint(), (
            f"bundled shapes of the prepared {BUNDLED_MODEL} (no checkpoint at "
            f"{model_dir} yet; point MODEL/--model-dir at one to use its headers)"
        )
    return load_checkpoint(model_dir), str(model_dir)


def plan_memory(
    settings: Settings,
    gpu: GpuFacts,
    *,
    model_dir: Path | None = None,
    terms: Mapping[str, int] | None = None,
    max_len: int | None = None,
    checkpoint: Checkpoint | None = None,
    host: HostFacts | None = None,
    calibrated: bool = True,
) -> MemoryBudget:
    """Plan the card for these settings: weights, non-pool terms, KV pool, headroom, and the verdict.

    max_len: the context length to check (None: what the settings give). terms: replace a measured term
    by knob name (TERM_KNOBS) or an EXTRA_TERMS entry, in bytes. checkpoint: an already-loaded one (tests).
    host: the host's RAM, to check RAM_CACHE against (None: not checked).
    With TP > 1 the card is planned for one rank: its share of the weights, KV heads and GDN state
    (memory/parallel.py, vLLM 0.32.0's per-rank split) plus NCCL's buffers on top of the CUDA context.
    calibrated: use the terms `hyperqwen calibrate` measured for these settings on this card, when the model
    folder holds them (one GPU only: a measurement is of one whole card).
    """
    tp = int(settings.knobs.tp)
    if tp > 1:
        from hyperqwen.memory.parallel import NCCL_BUFFERS, rank_checkpoint

        if checkpoint is None:
            checkpoint, _ = load_planning_checkpoint(model_dir or settings.model_path)
        checkpoint = rank_checkpoint(checkpoint, tp)
        terms = dict(terms or {})
        if "CUDA_CONTEXT" not in terms:
            terms["CUDA_CONTEXT"] = int(settings.knobs.cuda_context or 0) + NCCL_BUFFERS
    inputs = MemoryInputs.from_settings(settings, model_dir=model_dir, max_len=max_len, terms=terms)
    note = ""
    if calibrated and tp == 1:
        inputs, note = _with_measured_terms(inputs, gpu, settings.knobs.extra_args)
    budget = plan_inputs(inputs, gpu, checkpoint=checkpoint, host=host)
    return replace(budget, calibration=note) if note else budget


def _with_measured_terms(i: MemoryInputs, gpu: GpuFacts, extra_args: tuple[str, ...]) -> tuple[MemoryInputs, str]:
    """The inputs with the terms vLLM measured for them on this card (the model folder's calibration file),
    and one line saying which measurement was used, or why none was ("" without a file)."""
    from hyperqwen.memory.calibration import CalibrationError, find_measurement, read_calibration

    try:
        found, note = find_measurement(read_calibration(i.model_dir), i.calibration_key(extra_args), gpu)
    except CalibrationError as exc:
        return i, f"calibration not used: {exc}"
    if found is None:
        return i, note
    said = f"measured by `hyperqwen calibrate` ({found.describe()})"
    numbers = found.vllm
    terms = found.terms
    measured = {
        "WEIGHTS": Term(terms["WEIGHTS"], f"vLLM's 'Model loading took {numbers['model_loading_gib']} GiB', {said}"),
        "ACTIVATION_PEAK": Term(
            terms["ACTIVATION_PEAK"],
            f"vLLM's peak activation {numbers['peak_activation_gib']} GiB less its graph estimate, {said}",
        ),
        "CUDA_GRAPHS": Term(
            terms["CUDA_GRAPHS"],
            f"vLLM's graph estimate {numbers.get('graph_estimate_gib', 0.0)} GiB + non-torch "
            f"{numbers.get('non_torch_gib')} GiB, {said}",
        ),
    }
    return replace(i, measured=measured), note


def plan_inputs(
    i: MemoryInputs, gpu: GpuFacts, *, checkpoint: Checkpoint | None = None, host: HostFacts | None = None
) -> MemoryBudget:
    """vLLM's start, step by step: the checkpoint's layout and terms, the startup check, the host RAM, the one
    request the pool must hold, the headroom left after boot, then the verdict."""
    if checkpoint is not None:
        ckpt, ckpt_source = checkpoint, "given checkpoint"
    else:
        ckpt, ckpt_source = load_planning_checkpoint(i.model_dir)
    s = ckpt.shape
    mdb = DTYPE_BYTES[_resolve_dtype(i.model_dtype, s.torch_dtype)]
    drafter, drafter_weights = _drafter(i, mdb)
    kba = i.term("KERNEL_BLOCK_ALIGNMENT") or DEFAULT_KERNEL_BLOCK_ALIGNMENT
    lk = LayoutKnobs(
        i.kv_cache_dtype, i.state_dtype, i.model_dtype, i.spec_method, i.num_speculative_tokens, i.prefix_caching
    )
    layout, info = build_layout(ckpt, lk, drafter=drafter, kernel_block_alignment=kba)
    w = ckpt.weights(mdb)
    t = _terms(i, _CheckpointFacts(ckpt, ckpt_source, mdb, w, drafter is not None, drafter_weights))
    resident = t.weights.value
    pinned = i.kv_cache_memory_bytes is not None
    # 1-2. Context, then the startup check (request_memory).
    free_at_start = max(gpu.free_bytes - t.context.value, 0)
    requested = math.ceil(gpu.total_bytes * i.gpu_memory_utilization)
    # 4-6. Profile, graphs, pool.
    counted = resident + t.act.value + t.graphs.value
    pool = i.kv_cache_memory_bytes if i.kv_cache_memory_bytes is not None else max(requested - counted, 0)
    # 8. After boot: the process holds the weights, the cached activation peak, the graphs and the pool.
    footprint = counted + t.uncounted.value + pool
    fit_util = fraction_that_fits(max(free_at_start - t.floor.value - t.uncounted.value, 0), gpu.total_bytes)

    found = _startup_findings(i, t, free_at_start, requested, counted, pool, fit_util)
    ram_note, embed_note = _host_findings(i, host, t.embed_host_bytes, found)
    # 7. Boot check with the pool a worse profile run could give (GPU_UTIL mode): pool - PROFILE_MARGIN.
    check_pool = max(pool - t.margin.value, 0)
    short = _one_request_findings(i, layout, info, check_pool, t.margin, found)
    full, safe_pool = _after_boot_findings(
        t, free_at_start - footprint, free_at_start - counted, pinned, fit_util, found
    )
    fit_check_pool = min(check_pool, max(safe_pool - t.margin.value, 0))
    weights_fail = resident + t.load_transient.value > free_at_start
    largest = 0 if weights_fail else min(layout.longest_request(fit_check_pool), s.max_position_embeddings)
    note = ""
    if largest and fit_check_pool < check_pool:
        note = f" once KV_MEM={safe_pool}" if pinned else f" once GPU_UTIL={fit_util}"
    if short and largest == 0:
        found.refuse = True
    outcome = _verdict(found.refuse, short, full)
    resolved = {
        **{kk: v for kk, v in info.items() if kk != "gdn_page"},
        "kv_cache_dtype": i.kv_cache_dtype,
        "language_model_only": i.language_model_only,
        "ram_cache": ram_note,
        "embed_on_host": embed_note,
    }
    kv_all = (
        info["attn"] * (s.num_full_attention_layers + info["mtp_layers"]) + info["drafter_bpt"] * info["drafter_layers"]
    )
    page = info["gdn_page"]
    return MemoryBudget(
        gpu=gpu,
        inputs=i,
        checkpoint_source=ckpt_source,
        resolved=resolved,
        weights={
            "body": w.body,
            "vision": w.vision,
            "mtp": w.mtp,
            "drafter": t.drafter.value,
            "resident": resident,
        },
        attn_bytes_per_token_layer=info["attn"],
        kv_bytes_per_token=kv_all,
        gdn_page={"conv_bytes": page.conv_bytes, "ssm_bytes": page.ssm_bytes, "bytes": page.bytes},
        layout=layout,
        terms=t.by_name(),
        pool_bytes=pool,
        max_model_len=i.max_model_len,
        requested_bytes=requested,
        free_at_start_bytes=free_at_start,
        footprint_bytes=footprint,
        outcome=outcome,
        problems=tuple(found.problems),
        fix_hints=tuple(dict.fromkeys(found.hints)),
        largest_fitting_max_len=largest,
        largest_note=note,
        suggested_kv_mem=safe_pool,
    )


def _after_boot_findings(
    t: _Terms, headroom: int, free_beyond_counted: int, pinned: bool, fit_util: float, found: _Findings
) -> tuple[bool, int]:
    """Step 8: whether the card would be full after boot (less than HEADROOM_FLOOR free), and the largest pool
    that keeps the floor."""
    safe_pool = max(free_beyond_counted - t.floor.value - t.uncounted.value, 0)
    full = headroom < t.floor.value
    if full:
        found.problems.append(
            f"after boot only {format_gib(headroom)} would stay free, below the "
            f"{format_gib(t.floor.value)} HEADROOM_FLOOR: the first burst of requests runs out of memory"
        )
        found.hints.append(
            f"KV_MEM={safe_pool} (largest pool that keeps the floor)"
            if pinned
            else f"GPU_UTIL={fit_util} (keeps the headroom floor), or pin KV_MEM={safe_pool}"
        )
    return full, safe_pool


def _verdict(refuse: bool, short: bool, full: bool) -> Outcome:
    """The most severe outcome found."""
    if refuse:
        return Outcome.REFUSES_BOOT
    if short:
        return Outcome.SHORTER
    return Outcome.CARD_FULL if full else Outcome.FITS


def _drafter(i: MemoryInputs, mdb: int) -> tuple[DrafterAttention | None, int]:
    """A DFlash2 drafter's attention layers and weight bytes (read from DRAFT), or (None, 0) without one."""
    if i.spec_method != "dflash2":
        return None, 0
    if i.draft_dir is None:
        raise MemoryPlanError("SPEC=dflash2 needs DRAFT (the drafter directory) for its layers and weights")
    if not (i.draft_dir / "config.json").is_file():
        raise MemoryPlanError(
            f"SPEC=dflash2: DRAFT={i.draft_dir} has no config.json (the drafter is not downloaded?); "
            "`hyperqwen prepare` with SPEC=dflash2 fetches it there, or point DRAFT at the drafter folder"
        )
    drafter = drafter_attention_from_config(read_config(i.draft_dir), str(i.draft_dir / "config.json"))
    if i.term("DRAFTER_WEIGHTS") is not None:
        return drafter, 0
    weights = weight_bytes(read_checkpoint_tensors(i.draft_dir), mdb).resident(language_model_only=True, with_mtp=False)
    return drafter, weights


@dataclass(frozen=True)
class _Terms:
    """The budget's terms for one plan, each with where its number comes from."""

    weights: Term
    drafter: Term
    load_transient: Term
    context: Term
    act: Term
    graphs: Term
    uncounted: Term
    margin: Term
    floor: Term
    embed_host_bytes: int

    def by_name(self) -> dict[str, Term]:
        return {
            "weights": self.weights,
            "drafter_weights": self.drafter,
            "load_transient": self.load_transient,
            "cuda_context": self.context,
            "activation_peak": self.act,
            "cuda_graphs": self.graphs,
            "uncounted_graphs": self.uncounted,
            "profile_margin": self.margin,
            "headroom_floor": self.floor,
        }


def _knob_term(i: MemoryInputs, name: str, fallback: Term) -> Term:
    """A term from its knob: the default carries its measurement (knobs.py details), a set value says so."""
    value = i.term(name)
    if value is None:
        return i.measured.get(name, fallback)
    knob = KNOBS_BY_NAME.get(name)
    if knob is not None and knob.default == value:
        return Term(value, " ".join(knob.details) or knob.doc)
    return Term(value, f"{name}={value:,} B (set)")


@dataclass(frozen=True)
class _CheckpointFacts:
    """What the weight terms are computed from: the checkpoint (and where it was read), the model dtype's
    bytes, its weight bytes by part, and the drafter's."""

    ckpt: Checkpoint
    source: str
    mdb: int  # bytes per element of the model dtype
    w: WeightBytes
    has_drafter: bool
    drafter_weights: int


def _weight_terms(i: MemoryInputs, cf: _CheckpointFacts) -> tuple[Term, Term]:
    """The drafter's weights and all resident weights (drafter included, EMBED_ON_HOST's table left out)."""
    ckpt, ckpt_source, mdb, w = cf.ckpt, cf.source, cf.mdb, cf.w
    has_drafter, drafter_weights = cf.has_drafter, cf.drafter_weights
    with_mtp = i.spec_method in MTP_SPEC_METHODS
    drafter_term = _knob_term(
        i,
        "DRAFTER_WEIGHTS",
        Term(
            w.mtp if with_mtp else drafter_weights,
            "mtp.* tensor headers" if with_mtp else ("drafter safetensors headers" if has_drafter else "no drafter"),
        ),
    )
    weights = _knob_term(
        i,
        "WEIGHTS",
        Term(
            w.resident(language_model_only=i.language_model_only, with_mtp=False)
            + drafter_term.value
            + CUDA_LOAD_OVERHEAD,
            f"safetensors headers ({ckpt_source}) + {CUDA_LOAD_OVERHEAD / GiB:.2f} GiB CUDA holds beyond them "
            "while loading (docs/data/gpu)",
        ),
    )
    # EMBED_ON_HOST: vLLM's UVA offloader moves embed_tokens to pinned host memory as the model is built
    # (offloader/uva.py, reached for the embedding through patch 0065), before the weights are loaded, so its
    # bytes never count on the GPU.
    embed_host_bytes = ckpt.embedding_bytes(mdb) if i.embed_on_host else 0
    if embed_host_bytes and weights is not i.measured.get("WEIGHTS"):  # a measurement already lacks the table
        weights = Term(
            weights.value - embed_host_bytes,
            f"{weights.source}, less embed_tokens ({format_gib(embed_host_bytes)}) in host memory (EMBED_ON_HOST)",
        )
    return drafter_term, weights


def _terms(i: MemoryInputs, cf: _CheckpointFacts) -> _Terms:
    """Each term of the budget: the knob's value when set, else the estimate and where it comes from."""
    ckpt, mdb = cf.ckpt, cf.mdb
    s = ckpt.shape
    with_mtp = i.spec_method in MTP_SPEC_METHODS
    drafter_term, weights = _weight_terms(i, cf)
    # MTP: the drafter first builds its own embed_tokens and lm_head in the model dtype, then swaps in the
    # target's (vLLM log 'Sharing target model ... weights with the draft model'): a load-time transient.
    load_transient = Term(
        2 * s.vocab_size * s.hidden_size * mdb if with_mtp else 0,
        "MTP drafter's own embed_tokens + lm_head before it shares the target's",
    )
    context = _knob_term(i, "CUDA_CONTEXT", Term(0, "CUDA_CONTEXT"))
    act = _knob_term(
        i,
        "ACTIVATION_PEAK",
        activation_peak_estimate(
            s.hidden_size,
            s.intermediate_size,
            s.vocab_size,
            mdb,
            i.max_num_batched_tokens,
            i.max_num_seqs,
            i.num_speculative_tokens,
            mtp=with_mtp,
        ),
    )
    graphs = _knob_term(
        i,
        "CUDA_GRAPHS",
        cuda_graphs_estimate(
            default_cudagraph_capture_sizes(i.max_num_seqs, i.num_speculative_tokens, i.max_num_batched_tokens)
        ),
    )
    uncounted = _knob_term(
        i,
        "UNCOUNTED_GRAPHS",
        Term(
            int(1.9 * GiB),
            "DFlash2 drafter graphs vLLM's profiler does not count: 1.2-1.9 GiB on the 3090 reference (upper end)",
        )
        if i.spec_method == "dflash2"
        else Term(0, "vLLM's profiler counts the graphs of this path"),
    )
    if i.kv_cache_memory_bytes is not None:
        margin = Term(0, "pool pinned by KV_MEM: not sized from a profile, no margin")
    elif i.spec_method == "dflash2":
        margin = _knob_term(
            i,
            "PROFILE_MARGIN",
            Term(GiB, "SPEC=dflash2: its runner's profiled peak varied by ~1 GiB between starts on the 3090 reference"),
        )
    else:
        margin = _knob_term(
            i,
            "PROFILE_MARGIN",
            Term(
                64 * MiB,
                "warm starts of one configuration gave pools within 0.4% "
                "(~30 MiB) on the 3090 reference; a cold compile cache "
                "profiles ~0.87 GiB more once (pin KV_MEM against it)",
            ),
        )
    floor = _knob_term(i, "HEADROOM_FLOOR", Term(0, "HEADROOM_FLOOR"))
    return _Terms(
        weights,
        drafter_term,
        load_transient,
        context,
        act,
        graphs,
        uncounted,
        margin,
        floor,
        ckpt.embedding_bytes(mdb) if i.embed_on_host else 0,
    )


@dataclass
class _Findings:
    """What the checks found: problems, ways to fix them, and whether vLLM would refuse to start."""

    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    refuse: bool = False

    def add(self, problems: list[str], hints: list[str]) -> None:
        self.refuse = self.refuse or bool(problems)
        self.problems += problems
        self.hints += hints


def _startup_findings(
    i: MemoryInputs, t: _Terms, free_at_start: int, requested: int, counted: int, pool: int, fit_util: float
) -> _Findings:
    """vLLM's startup check (GPU_UTIL of the card must be free), the weights' load, and a pool left at all."""
    found = _Findings()
    util = i.gpu_memory_utilization
    pinned = i.kv_cache_memory_bytes is not None
    resident = t.weights.value
    if free_at_start < requested:
        found.refuse = True
        what = f"GPU_UTIL={util}" if not pinned else f"the startup check (GPU_UTIL={util}, applied with KV_MEM too)"
        found.problems.append(
            f"{what} asks for {format_gib(requested)} but only {format_gib(free_at_start)} is free "
            f"once vLLM's CUDA context ({format_gib(t.context.value)}) exists: vLLM refuses to start "
            "('Free memory on device ... is less than desired GPU memory utilization')"
        )
        found.hints.append(
            f"GPU_UTIL={min(fit_util, 0.99)} (the largest the startup check accepts with the headroom floor)"
        )
    if resident + t.load_transient.value > free_at_start:
        found.refuse = True
        found.problems.append(
            f"weights ({format_gib(resident)}) + load transient ({format_gib(t.load_transient.value)}) "
            f"do not fit in the {format_gib(free_at_start)} free after the CUDA context: loading fails"
        )
    if pinned and counted + pool > free_at_start:
        # vLLM allocates a pinned pool as asked, after the weights and the profile: one that is larger than
        # what is left fails that allocation, so the engine never boots (not "full after boot").
        found.refuse = True
        found.problems.append(
            f"KV_MEM={pool:,} B ({format_gib(pool)}) does not fit beside the weights, activations and graphs "
            f"({format_gib(counted)}) in the {format_gib(free_at_start)} free after the CUDA context: "
            "vLLM fails to allocate the KV cache and does not start"
        )
    if not pinned and pool <= 0:
        found.refuse = True
        found.problems.append(
            f"GPU_UTIL={util} leaves no KV pool: {format_gib(requested)} requested, "
            f"{format_gib(counted)} for weights, activations and graphs"
        )
    return found


def _host_findings(i: MemoryInputs, host: HostFacts | None, embed_host_bytes: int, found: _Findings) -> tuple[str, str]:
    """Host RAM for the pinned tiers (EMBED_ON_HOST, RAM_CACHE): refused when the host cannot hold them.
    Returns the notes shown for RAM_CACHE and EMBED_ON_HOST."""
    ram_note = "off"
    embed_note = f"{format_gib(embed_host_bytes)} pinned" if embed_host_bytes else "off (on the GPU)"
    if embed_host_bytes and host is not None:
        found.add(*pinned_host_problems(embed_host_bytes + (i.ram_cache_bytes or 0), host))
    if i.ram_cache_bytes:
        if host is None:
            ram_note = f"{format_gib(i.ram_cache_bytes)} (host RAM not checked)"
        else:
            found.add(*ram_cache_problems(i.ram_cache_bytes, host, i.prefix_caching))
            ram_note = f"{format_gib(i.ram_cache_bytes)} of {format_gib(host.available_bytes)} available"
    return ram_note, embed_note


def _one_request_findings(
    i: MemoryInputs, layout: PoolLayout, info: Mapping[str, Any], check_pool: int, margin: Term, found: _Findings
) -> bool:
    """vLLM refuses to start when the pool cannot hold one MAX_LEN request; True when that is so."""
    max_len = i.max_model_len
    short = False
    if not layout.fits_one_request(check_pool, max_len):
        short = True
        need = layout.pool_bytes_for(max_len)
        found.problems.append(
            f"one MAX_LEN={max_len} request needs {layout.blocks_per_request(max_len)} blocks "
            f"({format_gib(need)} of KV pool incl. the null block) but the pool is "
            f"{format_gib(check_pool)} ({layout.usable_blocks(check_pool)} usable blocks"
            + (f", after the {format_gib(margin.value)} PROFILE_MARGIN" if margin.value else "")
            + "): vLLM refuses to start ('To serve at least one request ... max_model_len')"
        )
        if info["state_dtype"] == "float32":
            found.hints.append("STATE_DTYPE=float16 (halves the GDN state page)")
        if i.kv_cache_dtype in ("auto", "bfloat16", "float16"):
            found.hints.append("KV=fp8 (halves KV bytes per token)")
        if i.num_speculative_tokens > 1:
            found.hints.append("fewer DRAFT_TOKENS/DFLASH_TOKENS (each adds a GDN state page per request)")
    return short


def largest_max_len_that_fits(settings: Settings, gpu: GpuFacts, **kwargs: object) -> int:
    """The largest MAX_LEN these settings fit on this card (0: none), with the headroom floor kept."""
    return plan_memory(settings, gpu, **kwargs).largest_fitting_max_len  # type: ignore[arg-type]
