"""vLLM 0.32.0's KV-cache arithmetic for a Qwen3.5-family hybrid model, in plain integers.

Each function mirrors a named piece of vLLM 0.32.0 (paths relative to site-packages/vllm/); the
integration tests (tests/integration/test_memory_vllm.py) run vLLM's own code on the same inputs and
require identical numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# --- KV dtypes ---------------------------------------------------------------------------------------

# kv_cache_dtype -> bytes per stored element (utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE).
# "auto" means the model dtype and is resolved by the caller.
KV_ELEMENT_BYTES: Mapping[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8_per_token_head": 1,
    "fp8_per_token_head": 1,
    "int4_per_token_head": 1,
    "turboquant_k8v4": 1,
    "turboquant_4bit_nc": 1,
    "turboquant_k3v4_nc": 1,
    "turboquant_3bit_nc": 1,
}
PER_TOKEN_HEAD_DTYPES = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
# turboquant presets: (key bits, value bits) (model_executor/layers/quantization/turboquant/config.py TQ_PRESETS)
TURBOQUANT_PRESETS: Mapping[str, tuple[int, int]] = {
    "turboquant_k8v4": (8, 4),
    "turboquant_4bit_nc": (4, 4),
    "turboquant_k3v4_nc": (3, 4),
    "turboquant_3bit_nc": (3, 3),
}
SUPPORTED_KV_DTYPES = ("auto", *KV_ELEMENT_BYTES)
# Per-token-head modes store one float32 scale per head for K and one for V
# (v1/attention/backends/triton_attn.py TritonAttentionBackend.customize_spec).
PER_TOKEN_HEAD_SCALE_BYTES = 4


def _turboquant_slot_bytes(preset: str, head_dim: int) -> int:
    """Packed K+V bytes per head per token (turboquant/config.py TurboQuantConfig.slot_size_aligned)."""
    key_bits, value_bits = TURBOQUANT_PRESETS[preset]
    key = head_dim if key_bits == 8 else math.ceil(head_dim * key_bits / 8) + 2  # fp8 keys, or indices + fp16 norm
    value = math.ceil(head_dim * value_bits / 8) + 4  # data + fp16 scale + fp16 zero
    slot = key + value
    return slot + slot % 2


def attention_bytes_per_token_layer(
    kv_cache_dtype: str, num_kv_heads: int, head_dim: int, model_dtype_bytes: int, head_dim_v: int | None = None
) -> int:
    """Bytes one token occupies in one full-attention layer's KV cache page (block_size=1 page).

    Mirrors AttentionSpec.page_size_bytes after the GPU backend's customize_spec
    (v1/kv_cache_interface.py; triton_attn.py for *_per_token_head; turboquant_attn.py for turboquant_*).
    """
    hv = head_dim if head_dim_v is None else head_dim_v
    if kv_cache_dtype == "auto":
        elt = model_dtype_bytes
    elif kv_cache_dtype in KV_ELEMENT_BYTES:
        elt = KV_ELEMENT_BYTES[kv_cache_dtype]
    else:
        raise ValueError(
            f"KV dtype {kv_cache_dtype!r} is not modelled by the planner; use one of: {', '.join(SUPPORTED_KV_DTYPES)}"
        )
    if kv_cache_dtype in TURBOQUANT_PRESETS:
        return num_kv_heads * _turboquant_slot_bytes(kv_cache_dtype, head_dim)
    if kv_cache_dtype in PER_TOKEN_HEAD_DTYPES:
        hk, hv2 = (head_dim // 2, hv // 2) if kv_cache_dtype == "int4_per_token_head" else (head_dim, hv)
        return num_kv_heads * ((hk + hv2) * elt + 2 * PER_TOKEN_HEAD_SCALE_BYTES)
    return num_kv_heads * (head_dim + hv) * elt


# --- GDN state -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GdnStatePage:
    """One GDN layer's recurrent state for one request (one mamba 'page', before padding)."""

    conv_bytes: int
    ssm_bytes: int

    @property
    def bytes(self) -> int:
        return self.conv_bytes + self.ssm_bytes


def gdn_state_page(
    *,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    conv_kernel: int,
    num_speculative_tokens: int,
    conv_dtype_bytes: int,
    ssm_dtype_bytes: int,
    tp_size: int = 1,
) -> GdnStatePage:
    """Conv state (kernel-1+k) x conv_dim plus SSM state v_heads x v_dim x k_dim.

    model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator.gated_delta_net_state_shape and
    MambaSpec.page_size_bytes (v1/kv_cache_interface.py). Speculative tokens widen the conv state by k.
    """
    conv_dim = (head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads) // tp_size
    conv = conv_dim * (conv_kernel - 1 + num_speculative_tokens) * conv_dtype_bytes
    ssm = (num_v_heads // tp_size) * head_v_dim * head_k_dim * ssm_dtype_bytes
    return GdnStatePage(conv, ssm)


# --- page-size unification and the attention block size -------------------------------------------

# The smallest kernel block of the GPU attention backends this model uses on Ampere/Ada: FLASH_ATTN,
# TRITON_ATTN and FLASHINFER advertise MultipleOf(16) and TURBOQUANT 16..128
# (v1/attention/backends/*.py get_supported_kernel_block_sizes); CacheConfig.DEFAULT_BLOCK_SIZE is 16.
DEFAULT_KERNEL_BLOCK_ALIGNMENT = 16
# vLLM's CPU platform forces block_size 128 (platforms/cpu.py check_and_update_config) and CPU_ATTN
# advertises MultipleOf(32), so on the CPU build the alignment is max(32, 128) = 128.
CPU_KERNEL_BLOCK_ALIGNMENT = 128


def hybrid_attention_block_size(
    attn_bytes_per_token: int,
    mamba_page_bytes: int,
    kernel_block_alignment: int = DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    configured_block_size: int = DEFAULT_KERNEL_BLOCK_ALIGNMENT,
) -> int:
    """Smallest kernel-aligned attention block whose page (per layer) is >= the GDN page.

    platforms/interface.py Platform._align_hybrid_block_size.
    """
    align = max(kernel_block_alignment, configured_block_size)
    size = align * -(-mamba_page_bytes // (align * attn_bytes_per_token))
    return max(configured_block_size, size)


# --- layers, groups and the pool -------------------------------------------------------------------


@dataclass(frozen=True)
class LayerSpec:
    """A KV-cache layer as the allocator sees it: attention (per-token bytes x block size) or GDN state."""

    kind: str  # "attention" | "mamba"
    block_size: int  # tokens per block (attention); for mamba only the block-table granularity
    bytes_per_token: int = 0  # attention only
    state_bytes: int = 0  # mamba only: unpadded state page
    page_size_padded: int | None = None
    label: str = ""  # distinguishes attention specs with different heads (target vs drafter)

    @property
    def page_size_bytes(self) -> int:
        raw = self.block_size * self.bytes_per_token if self.kind == "attention" else self.state_bytes
        if self.page_size_padded is not None:
            assert self.page_size_padded >= raw
            return self.page_size_padded
        return raw


def unify_page_sizes(layers: Sequence[LayerSpec]) -> list[LayerSpec]:
    """v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size."""
    pages = {spec.page_size_bytes for spec in layers}
    if len(pages) <= 1:
        return list(layers)
    top = max(pages)
    out = []
    for spec in layers:
        if spec.page_size_bytes == top:
            out.append(spec)
        elif spec.kind == "mamba":
            out.append(LayerSpec(**{**spec.__dict__, "page_size_padded": top}))
        elif top % spec.page_size_bytes == 0:
            out.append(LayerSpec(**{**spec.__dict__, "block_size": spec.block_size * (top // spec.page_size_bytes)}))
        else:
            out.append(LayerSpec(**{**spec.__dict__, "page_size_padded": top}))
    return out


@dataclass(frozen=True)
class KvGroup:
    spec: LayerSpec
    num_layers: int


def group_layers(layers: Sequence[LayerSpec]) -> list[KvGroup]:
    """Split layers into KV-cache groups of equal layer count.

    v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size: layers with equal specs form a
    bucket; the group size is the smallest bucket, or the largest when it is < 1.5x the smallest (so an
    MTP layer added to 16 attention layers makes 17-layer groups); bucket i splits into cdiv(n, size)
    groups of layers[i::num_groups].
    """
    buckets: dict[LayerSpec, int] = {}
    for spec in layers:
        buckets[spec] = buckets.get(spec, 0) + 1
    counts = list(buckets.values())
    group_size = min(counts)
    if max(counts) < min(counts) * 1.5:
        group_size = max(counts)
    groups = []
    for spec, n in buckets.items():
        num_groups = -(-n // group_size)
        for i in range(num_groups):
            groups.append(KvGroup(spec, len(range(i, n, num_groups))))
    return groups


def bytes_per_block(groups: Sequence[KvGroup]) -> int:
    """v1/core/kv_cache_utils.py _get_kv_cache_bytes_per_block: the widest group's pages per block."""
    return max(g.num_layers * g.spec.page_size_bytes for g in groups)


def state_blocks_per_request(num_speculative_tokens: int, prefix_caching: bool) -> int:
    """GDN state pages one resident request holds per GDN group.

    MambaSpec.max_memory_usage_bytes (v1/kv_cache_interface.py): 'align' mode (prefix caching) keeps
    2 + k pages, 'none' keeps 1 + k.
    """
    return (2 if prefix_caching else 1) + num_speculative_tokens


@dataclass(frozen=True)
class PoolLayout:
    """The pool's structure: groups, block size and what one request costs in blocks."""

    groups: tuple[KvGroup, ...]
    bytes_per_block: int
    attention_block_size: int
    mamba_page_unpadded: int
    mamba_page_padded: int
    state_blocks_per_group: int

    @property
    def num_mamba_groups(self) -> int:
        return sum(1 for g in self.groups if g.spec.kind == "mamba")

    @property
    def mamba_padding_pct(self) -> float:
        return 100 * (self.mamba_page_padded - self.mamba_page_unpadded) / self.mamba_page_unpadded

    def blocks_per_request(self, num_tokens: int) -> int:
        """Blocks one request of num_tokens holds over all groups (_max_memory_usage_bytes_from_groups)."""
        total = 0
        for g in self.groups:
            if g.spec.kind == "attention":
                total += -(-num_tokens // g.spec.block_size)
            else:
                total += self.state_blocks_per_group
        return total

    def num_blocks(self, pool_bytes: int) -> int:
        """get_kv_cache_config_from_groups: available_memory // bytes_per_block (includes the null block)."""
        return pool_bytes // self.bytes_per_block

    def usable_blocks(self, pool_bytes: int) -> int:
        # BlockPool holds one null block forever (kv_cache_utils.get_kv_cache_configs 'check_memory').
        return max(self.num_blocks(pool_bytes) - 1, 0)

    def fits_one_request(self, pool_bytes: int, num_tokens: int) -> bool:
        """vLLM's boot check (_check_enough_kv_cache_memory): one max-length request must fit."""
        return self.blocks_per_request(num_tokens) <= self.usable_blocks(pool_bytes)

    def longest_request(self, pool_bytes: int) -> int:
        """Largest token count one request can have in this pool (0 if not even one token fits)."""
        free = self.usable_blocks(pool_bytes) - self.blocks_per_request(0)
        if free <= 0:
            return 0
        # Attention groups all consume cdiv(L, bs_g) blocks; solve for the largest L by bisection.
        lo, hi = 0, free * max(g.spec.block_size for g in self.groups)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.blocks_per_request(mid) <= self.usable_blocks(pool_bytes):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def reported_tokens(self, pool_bytes: int, max_model_len: int) -> int:
        """vLLM's log line 'GPU KV cache size: N tokens' (kv_cache_utils.get_kv_cache_capacity)."""
        concurrency = self.num_blocks(pool_bytes) / self.blocks_per_request(max_model_len)
        return int(concurrency * max_model_len)

    def max_concurrency(self, pool_bytes: int, max_model_len: int) -> float:
        return self.num_blocks(pool_bytes) / self.blocks_per_request(max_model_len)

    def resident_requests(self, pool_bytes: int, tokens_each: int) -> int:
        """How many requests of tokens_each tokens can hold their blocks at once."""
        return self.usable_blocks(pool_bytes) // self.blocks_per_request(tokens_each)

    def pool_bytes_for(self, num_tokens: int, num_requests: int = 1) -> int:
        """Smallest pool (bytes) that holds num_requests requests of num_tokens each."""
        return (self.blocks_per_request(num_tokens) * num_requests + 1) * self.bytes_per_block


@dataclass(frozen=True)
class PoolInputs:
    """Everything the pool layout depends on, already resolved to vLLM-level values."""

    num_attention_layers: int  # target full-attention layers
    num_gdn_layers: int
    attn_bytes_per_token_layer: int
    gdn_page: GdnStatePage
    num_speculative_tokens: int
    prefix_caching: bool
    mtp_attention_layers: int = 0  # MTP head layers (same spec as the target's attention)
    drafter_layers: int = 0  # a separate drafter's attention layers (DFlash)
    drafter_bytes_per_token_layer: int = 0
    kernel_block_alignment: int = DEFAULT_KERNEL_BLOCK_ALIGNMENT
    extra: Mapping[str, object] = field(default_factory=dict)


def pool_layout(p: PoolInputs) -> PoolLayout:
    mamba_unpadded = p.gdn_page.bytes
    block = hybrid_attention_block_size(p.attn_bytes_per_token_layer, mamba_unpadded, p.kernel_block_alignment)
    attn_page = block * p.attn_bytes_per_token_layer
    mamba_padded = attn_page if attn_page != mamba_unpadded else None
    target_attn = LayerSpec("attention", block, bytes_per_token=p.attn_bytes_per_token_layer, label="target")
    mamba = LayerSpec("mamba", block, state_bytes=mamba_unpadded, page_size_padded=mamba_padded)
    layers: list[LayerSpec] = [mamba] * p.num_gdn_layers + [target_attn] * (
        p.num_attention_layers + p.mtp_attention_layers
    )
    if p.drafter_layers:
        layers += [
            LayerSpec("attention", block, bytes_per_token=p.drafter_bytes_per_token_layer, label="drafter")
        ] * p.drafter_layers
    layers = unify_page_sizes(layers)
    groups = group_layers(layers)
    final_mamba = next(g.spec for g in groups if g.spec.kind == "mamba")
    target_block = next(g.spec.block_size for g in groups if g.spec.label == "target")
    return PoolLayout(
        groups=tuple(groups),
        bytes_per_block=bytes_per_block(groups),
        attention_block_size=target_block,
        mamba_page_unpadded=mamba_unpadded,
        mamba_page_padded=final_mamba.page_size_bytes,
        state_blocks_per_group=state_blocks_per_request(p.num_speculative_tokens, p.prefix_caching),
    )
