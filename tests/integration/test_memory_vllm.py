"""Ground truth for the memory planner: vLLM 0.32.0's own KV-cache code on the real Qwen3.8-27B layout.

A real VllmConfig is built (CPU build, no weights, no server) from the Qwen3.8-27B config.json fixture.
For every grid point the test then does what a GPU worker does:
  - undo what the CPU platform changed (it forces attention block size 128 and may switch the GDN state
    dtype): block_size back to CacheConfig.DEFAULT_BLOCK_SIZE, the requested state dtype set again;
  - run the base Platform._align_hybrid_block_size with the GPU attention backend this KV dtype selects
    (FLASH_ATTN for bf16/fp8, TRITON_ATTN for *_per_token_head, TURBOQUANT for turboquant_*);
  - build each layer's KV-cache spec as vLLM's Attention / MambaBase layers do, MTP layer included;
  - call vllm.v1.core.kv_cache_utils.get_kv_cache_configs and get_kv_cache_capacity.
The planner's numbers must be identical.

Slow part: building one VllmConfig (vLLM import + config resolution, ~60-70 s on 2 cores); it is built
once per module and reused for every grid point (each point is milliseconds).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hyperqwen.memory.budget import LayoutKnobs, build_layout
from hyperqwen.memory.checkpoint import load_checkpoint

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parents[1] / "unit" / "memory" / "data" / "qwen3.8-27b-w4a16"
REFERENCE_POOL = 5_583_457_484  # the reference setup's pinned --kv-cache-memory-bytes


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    # vLLM's CPU platform would reject the W4A16 auto-round quantization config; the KV arithmetic does
    # not depend on it, so the config is used without that one block.
    model_dir = tmp_path_factory.mktemp("qwen3.8-27b-config")
    config = json.loads((FIXTURE / "config.json").read_text())
    config.pop("quantization_config")
    (model_dir / "config.json").write_text(json.dumps(config))
    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, language_model_only=True,
                      max_model_len=65536, enable_prefix_caching=True, dtype="bfloat16",
                      mamba_ssm_cache_dtype="float16",
                      speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    return args.create_engine_config()


def _backend_for(kv_cache_dtype: str):
    if kv_cache_dtype.endswith("_per_token_head"):
        from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
        return TritonAttentionBackend
    if kv_cache_dtype.startswith("turboquant_"):
        from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend
        return TurboQuantAttentionBackend
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    return FlashAttentionBackend


def vllm_kv_cache_config(cfg, *, kv_cache_dtype: str, state_dtype: str, k: int, prefix_caching: bool,
                         pool_bytes: int, max_model_len: int):
    """vLLM's own KVCacheConfig and reported token capacity for one grid point, as on a GPU."""
    from vllm.config.cache import CacheConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms.interface import Platform
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity, get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, get_kv_quant_mode

    cfg = copy.copy(cfg)
    cfg.cache_config = copy.deepcopy(cfg.cache_config)
    cfg.model_config = copy.copy(cfg.model_config)
    cache = cfg.cache_config
    cfg.model_config.max_model_len = max_model_len
    # Undo the CPU platform: GPU default block size, requested state dtype, requested cache mode.
    cache.block_size = CacheConfig.DEFAULT_BLOCK_SIZE
    cache.user_specified_block_size = False
    cache.mamba_page_size_padded = None
    cache.mamba_ssm_cache_dtype = state_dtype
    cache.cache_dtype = kv_cache_dtype
    cache.enable_prefix_caching = prefix_caching
    cache.mamba_cache_mode = "align" if prefix_caching else "none"
    cache.mamba_block_size = None
    cache.kv_cache_layout = "LBHNC"
    if k:
        cfg.speculative_config = copy.copy(cfg.speculative_config)
        cfg.speculative_config.num_speculative_tokens = k
    else:
        cfg.speculative_config = None
    backend = _backend_for(kv_cache_dtype)
    Platform._align_hybrid_block_size(cfg, backend)
    # MambaModelConfig.verify_and_update_config: align mode uses the attention block size, none mode
    # the whole context.
    cache.mamba_block_size = cache.block_size if prefix_caching else max_model_len

    hf = cfg.model_config.hf_text_config
    model_cls, _ = ModelRegistry.resolve_model_cls(cfg.model_config.architecture, model_config=cfg.model_config)
    kv_torch_dtype = (cfg.model_config.dtype if kv_cache_dtype == "auto"
                      else STR_DTYPE_TO_TORCH_DTYPE[kv_cache_dtype])
    attn_spec = backend.customize_spec(FullAttentionSpec(
        block_size=cache.block_size, num_kv_heads=hf.num_key_value_heads, head_size=hf.head_dim,
        dtype=kv_torch_dtype, kv_quant_mode=get_kv_quant_mode(kv_cache_dtype)))
    mamba_spec = MambaSpec(
        shapes=tuple(model_cls.get_mamba_state_shape_from_config(cfg)),
        dtypes=model_cls.get_mamba_state_dtype_from_config(cfg),
        block_size=cache.mamba_block_size, page_size_padded=cache.mamba_page_size_padded,
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN, mamba_cache_mode=cache.mamba_cache_mode,
        num_speculative_blocks=cfg.num_speculative_tokens)
    specs = {}
    for i, kind in enumerate(hf.layer_types):  # registration order of the decoder layers
        if kind == "full_attention":
            specs[f"language_model.model.layers.{i}.self_attn.attn"] = attn_spec
        else:
            specs[f"language_model.model.layers.{i}.linear_attn"] = mamba_spec
    if k:  # the MTP drafter's attention layer registers after the target's layers
        for j in range(hf.mtp_num_hidden_layers):
            specs[f"mtp.layers.{len(hf.layer_types) + j}.self_attn.attn"] = attn_spec
    (kv_config,) = get_kv_cache_configs(cfg, [specs], [pool_bytes])
    tokens, _ = get_kv_cache_capacity(cfg, kv_config)
    return kv_config, tokens, cache.block_size


def planner_layout(kv_cache_dtype: str, state_dtype: str, k: int, prefix_caching: bool):
    knobs = LayoutKnobs(kv_cache_dtype=kv_cache_dtype, state_dtype=state_dtype,
                        spec_method="mtp" if k else "none", num_speculative_tokens=k,
                        prefix_caching=prefix_caching, model_dtype="bfloat16")
    layout, _ = build_layout(load_checkpoint(FIXTURE), knobs)
    return layout


KV_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head",
             "int4_per_token_head", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
             "turboquant_3bit_nc")
POOLS = (REFERENCE_POOL, 5_261_334_938, 2 * 1024**3, 7_500_000_000, 12 * 1024**3)


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
@pytest.mark.parametrize("state_dtype", ("float16", "float32"))
@pytest.mark.parametrize("k", (0, 3, 7))
@pytest.mark.parametrize("prefix_caching", (True, False))
def test_planner_matches_vllm_allocator(vllm_config, kv_cache_dtype, state_dtype, k, prefix_caching):
    layout = planner_layout(kv_cache_dtype, state_dtype, k, prefix_caching)
    for pool in POOLS:
        for max_len in (4096, 65536, 131072):
            fits = layout.fits_one_request(pool, max_len)
            try:
                kv_config, tokens, block_size = vllm_kv_cache_config(
                    vllm_config, kv_cache_dtype=kv_cache_dtype, state_dtype=state_dtype, k=k,
                    prefix_caching=prefix_caching, pool_bytes=pool, max_model_len=max_len)
            except ValueError as exc:
                assert not fits, f"vLLM refused ({exc}) but the planner says it fits"
                assert "max seq len" in str(exc) or "No available memory" in str(exc)
                continue
            assert fits, f"vLLM accepted pool={pool} max_len={max_len} but the planner says it does not fit"
            assert layout.attention_block_size == block_size
            assert layout.num_blocks(pool) == kv_config.num_blocks
            assert layout.reported_tokens(pool, max_len) == tokens
            groups = [(len(g.layer_names), g.kv_cache_spec.page_size_bytes) for g in kv_config.kv_cache_groups]
            assert sorted(groups) == sorted((g.num_layers, g.spec.page_size_bytes) for g in layout.groups)


def test_issue_claim_67k_tokens_bf16_prefix_k7(vllm_config):
    """Issue #6: the reference pool, bf16 KV, prefix caching, 7 speculative tokens: ~67k tokens."""
    kv_config, tokens, _ = vllm_kv_cache_config(vllm_config, kv_cache_dtype="auto", state_dtype="float16", k=7,
                                                prefix_caching=True, pool_bytes=REFERENCE_POOL, max_model_len=65536)
    layout = planner_layout("auto", "float16", 7, True)
    assert tokens == layout.reported_tokens(REFERENCE_POOL, 65536)
    assert 66_000 <= tokens <= 68_000


def test_issue_claim_fp32_state_cannot_hold_one_65536_request(vllm_config):
    layout = planner_layout("auto", "float32", 7, True)
    assert not layout.fits_one_request(REFERENCE_POOL, 65536)
    with pytest.raises(ValueError, match="max seq len"):
        vllm_kv_cache_config(vllm_config, kv_cache_dtype="auto", state_dtype="float32", k=7,
                             prefix_caching=True, pool_bytes=REFERENCE_POOL, max_model_len=65536)


def test_longest_request_matches_vllm_estimate(vllm_config):
    """The planner's longest single request equals vLLM's own binary search (_estimate_max_model_len_from_groups)."""
    from vllm.v1.core.kv_cache_utils import _estimate_max_model_len_from_groups, _pool_bytes_per_block

    for state_dtype, k in (("float16", 7), ("float32", 3), ("float16", 0)):
        kv_config, _, _ = vllm_kv_cache_config(vllm_config, kv_cache_dtype="auto", state_dtype=state_dtype, k=k,
                                               prefix_caching=True, pool_bytes=12 * 1024**3, max_model_len=4096)
        cfg = copy.copy(vllm_config)
        cfg.model_config = copy.copy(cfg.model_config)
        cfg.model_config.max_model_len = 262144
        cfg.cache_config = copy.deepcopy(cfg.cache_config)
        cfg.cache_config.kv_cache_layout = "LBHNC"
        cfg.cache_config.mamba_cache_mode = "align"
        groups = kv_config.kv_cache_groups
        avail = REFERENCE_POOL - _pool_bytes_per_block(cfg, groups)
        vllm_longest = _estimate_max_model_len_from_groups(cfg, groups, avail)
        layout = planner_layout("auto", state_dtype, k, True)
        assert layout.longest_request(REFERENCE_POOL) == vllm_longest


def test_planner_predicts_cpu_server_pool(tiny_qwen_prefix_server):
    """A real vLLM CPU server (tiny Qwen3.5, prefix caching, SPEC=none) logs 'CPU KV cache size: N tokens'
    for VLLM_CPU_KVCACHE_SPACE GiB; the planner, with the CPU platform's block alignment, predicts N."""
    import re

    from hyperqwen.memory.kvcache import CPU_KERNEL_BLOCK_ALIGNMENT

    server = tiny_qwen_prefix_server
    log = server.log_text()
    reported = re.search(r"CPU KV cache size: ([\d,]+) tokens", log)
    assert reported, "the server log has no 'CPU KV cache size' line:\n" + server.log_tail(40)
    # The CPU platform keeps float16 state only with its accelerated GDN kernel, else resets to float32
    # (platforms/cpu.py); read which one it chose, as the planner cannot know this machine's CPU flags.
    state_dtype = "float32" if "Reset SSM cache type to float32" in log else server.knobs.get("STATE_DTYPE", "float16")
    pool_bytes = int(server.env.get("VLLM_CPU_KVCACHE_SPACE", server.knobs.get("VLLM_CPU_KVCACHE_SPACE"))) * 1024**3
    max_len = int(server.knobs["MAX_LEN"])
    knobs = LayoutKnobs(kv_cache_dtype="auto", state_dtype=state_dtype, spec_method="none",
                        prefix_caching=True, model_dtype="bfloat16")
    layout, _ = build_layout(load_checkpoint(server.model_dir), knobs,
                             kernel_block_alignment=CPU_KERNEL_BLOCK_ALIGNMENT)
    assert layout.reported_tokens(pool_bytes, max_len) == int(reported.group(1).replace(",", ""))
    padding = re.search(r"Padding mamba page size by ([\d.]+)%", log)
    if padding:
        assert f"{layout.mamba_padding_pct:.2f}" == padding.group(1)


@pytest.mark.parametrize("max_num_seqs,k,batched", [(1, 0, 8192), (1, 3, 8192), (1, 7, 2048), (16, 3, 8192),
                                                    (64, 0, 8192), (256, 0, 8192), (256, 0, 300), (48, 4, 4096)])
def test_cudagraph_capture_sizes_match_vllm(vllm_config, max_num_seqs, k, batched):
    from vllm.config.compilation import CUDAGraphMode

    from hyperqwen.memory.budget import default_cudagraph_capture_sizes

    cfg = copy.copy(vllm_config)
    cfg.compilation_config = copy.deepcopy(cfg.compilation_config)
    cfg.scheduler_config = copy.deepcopy(cfg.scheduler_config)
    cfg.model_config = copy.copy(cfg.model_config)
    cfg.model_config.enforce_eager = False
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE  # the GPU default; CPU has none
    cfg.compilation_config.cudagraph_capture_sizes = None
    cfg.compilation_config.max_cudagraph_capture_size = None
    cfg.scheduler_config.max_num_seqs = max_num_seqs
    cfg.scheduler_config.max_num_batched_tokens = batched
    if k:
        cfg.speculative_config = copy.copy(cfg.speculative_config)
        cfg.speculative_config.num_speculative_tokens = k
    else:
        cfg.speculative_config = None
    cfg._set_cudagraph_sizes()
    assert default_cudagraph_capture_sizes(max_num_seqs, k, batched) == cfg.compilation_config.cudagraph_capture_sizes
