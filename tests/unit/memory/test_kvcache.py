"""Each KV-cache term on its own; expected values worked by hand from vLLM 0.32.0's formulas
(the integration test compares the same functions with vLLM's code)."""

from __future__ import annotations

import pytest

from hyperqwen.memory.kvcache import (
    GdnStatePage,
    KvGroup,
    LayerSpec,
    PoolInputs,
    attention_bytes_per_token_layer,
    bytes_per_block,
    gdn_state_page,
    group_layers,
    hybrid_attention_block_size,
    pool_layout,
    state_blocks_per_request,
    unify_page_sizes,
)

# Qwen3.8-27B attention: 4 KV heads x head_dim 256.
H, D = 4, 256


@pytest.mark.parametrize("dtype,expected", [
    ("auto", H * 2 * D * 2),  # bf16 model dtype
    ("bfloat16", H * 2 * D * 2),
    ("float16", H * 2 * D * 2),
    ("fp8", H * 2 * D), ("fp8_e4m3", H * 2 * D), ("fp8_e5m2", H * 2 * D),
    ("int8_per_token_head", H * (2 * D + 2 * 4)),  # one fp32 scale for K and one for V per head
    ("fp8_per_token_head", H * (2 * D + 2 * 4)),
    ("int4_per_token_head", H * (2 * (D // 2) + 2 * 4)),  # two int4 per byte
    ("turboquant_k8v4", H * (256 + (128 + 4))),  # fp8 keys; 4-bit values + fp16 scale/zero
    ("turboquant_4bit_nc", H * ((128 + 2) + (128 + 4))),
    ("turboquant_k3v4_nc", H * ((96 + 2) + (128 + 4))),
    ("turboquant_3bit_nc", H * ((96 + 2) + (96 + 4))),
])
def test_attention_bytes_per_token(dtype, expected):
    assert attention_bytes_per_token_layer(dtype, H, D, model_dtype_bytes=2) == expected


def test_turboquant_slot_rounds_to_even():
    # head_dim 10, 3-bit keys: ceil(30/8)=4 + 2 = 6; 3-bit values: 4 + 4 = 8 -> 14 (even); 1 head.
    assert attention_bytes_per_token_layer("turboquant_3bit_nc", 1, 10, 2) == 14
    # head_dim 6, k8v4: keys 6, values ceil(24/8)=3 + 4 = 7 -> 13 -> rounded up to 14.
    assert attention_bytes_per_token_layer("turboquant_k8v4", 1, 6, 2) == 14


def test_unknown_kv_dtype_is_named():
    with pytest.raises(ValueError, match="'nvfp4'.*auto"):
        attention_bytes_per_token_layer("nvfp4", H, D, 2)


@pytest.mark.parametrize("k,ssm_bytes,expected", [
    (0, 4, (3 * 10240 * 2, 48 * 128 * 128 * 4)),  # fp32 SSM: 3 MiB per layer
    (0, 2, (3 * 10240 * 2, 48 * 128 * 128 * 2)),
    (7, 2, ((3 + 7) * 10240 * 2, 48 * 128 * 128 * 2)),  # k widens the conv state
])
def test_gdn_state_page(k, ssm_bytes, expected):
    page = gdn_state_page(num_k_heads=16, num_v_heads=48, head_k_dim=128, head_v_dim=128, conv_kernel=4,
                          num_speculative_tokens=k, conv_dtype_bytes=2, ssm_dtype_bytes=ssm_bytes)
    assert (page.conv_bytes, page.ssm_bytes) == expected
    assert page.bytes == sum(expected)


def test_gdn_state_page_tensor_parallel_splits_heads():
    one = gdn_state_page(num_k_heads=16, num_v_heads=48, head_k_dim=128, head_v_dim=128, conv_kernel=4,
                         num_speculative_tokens=0, conv_dtype_bytes=2, ssm_dtype_bytes=2)
    two = gdn_state_page(num_k_heads=16, num_v_heads=48, head_k_dim=128, head_v_dim=128, conv_kernel=4,
                         num_speculative_tokens=0, conv_dtype_bytes=2, ssm_dtype_bytes=2, tp_size=2)
    assert two.bytes * 2 == one.bytes


@pytest.mark.parametrize("attn,mamba,expected", [
    (4096, 1_777_664, 448),  # fp16 state, k=7: ceil(1777664 / (16*4096)) = 28 -> 28*16
    (4096, 3_350_528, 832),  # fp32 state, k=7: 52*16
    (4096, 65536, 16),  # exactly one 16-token page
    (4096, 65537, 32),
    (2080, 1_634_304, 800),  # int8_per_token_head: ceil(1634304/33280) = 50 -> 800
])
def test_hybrid_attention_block_size(attn, mamba, expected):
    bs = hybrid_attention_block_size(attn, mamba)
    assert bs == expected and bs % 16 == 0 and bs * attn >= mamba > (bs - 16) * attn


def test_block_size_never_below_configured():
    assert hybrid_attention_block_size(4096, 100, configured_block_size=64) == 64


def test_unify_pads_mamba_and_scales_attention():
    attn_small = LayerSpec("attention", 16, bytes_per_token=1024)  # page 16 KiB
    attn_big = LayerSpec("attention", 16, bytes_per_token=4096, label="d")  # page 64 KiB
    mamba = LayerSpec("mamba", 16, state_bytes=60_000)
    odd = LayerSpec("attention", 16, bytes_per_token=3000, label="o")  # 48,000 does not divide 65,536
    out = unify_page_sizes([attn_small, attn_big, mamba, odd])
    assert [s.page_size_bytes for s in out] == [65536] * 4
    assert out[0].block_size == 64 and out[0].page_size_padded is None  # scaled 4x
    assert out[2].page_size_padded == 65536  # mamba padded
    assert out[3].page_size_padded == 65536 and out[3].block_size == 16  # padded, not scaled


def test_group_layers_16_attention_48_gdn():
    a = LayerSpec("attention", 448, bytes_per_token=4096)
    m = LayerSpec("mamba", 448, state_bytes=1, page_size_padded=448 * 4096)
    groups = group_layers([m] * 48 + [a] * 16)
    assert sorted((g.spec.kind, g.num_layers) for g in groups) == [("attention", 16)] + [("mamba", 16)] * 3
    assert bytes_per_block(groups) == 16 * 448 * 4096


def test_group_layers_mtp_layer_makes_17_layer_groups():
    a = LayerSpec("attention", 448, bytes_per_token=4096)
    m = LayerSpec("mamba", 448, state_bytes=1, page_size_padded=448 * 4096)
    groups = group_layers([m] * 48 + [a] * 17)
    # 17 < 1.5 x 16 is false (min is 17, max 48): group size 17; GDN 48 -> 3 groups of 16 in 17-layer blocks.
    assert sorted((g.spec.kind, g.num_layers) for g in groups) == [("attention", 17)] + [("mamba", 16)] * 3
    assert bytes_per_block(groups) == 17 * 448 * 4096


def test_group_layers_close_counts_use_the_larger():
    a = LayerSpec("attention", 16, bytes_per_token=1)
    b = LayerSpec("attention", 16, bytes_per_token=1, label="other")
    groups = group_layers([a] * 12 + [b] * 13)  # 13 < 1.5 x 12: one group each, 13 layers wide
    assert sorted(g.num_layers for g in groups) == [12, 13]
    assert bytes_per_block(groups) == 13 * 16


@pytest.mark.parametrize("k,prefix,expected", [(0, True, 2), (7, True, 9), (0, False, 1), (3, False, 4)])
def test_state_blocks_per_request(k, prefix, expected):
    assert state_blocks_per_request(k, prefix) == expected


def _qwen38_layout(k=7, prefix=True, ssm=2):
    page = gdn_state_page(num_k_heads=16, num_v_heads=48, head_k_dim=128, head_v_dim=128, conv_kernel=4,
                          num_speculative_tokens=k, conv_dtype_bytes=2, ssm_dtype_bytes=ssm)
    return pool_layout(PoolInputs(num_attention_layers=16, num_gdn_layers=48, attn_bytes_per_token_layer=4096,
                                  gdn_page=page, num_speculative_tokens=k, prefix_caching=prefix,
                                  mtp_attention_layers=1 if k else 0))


def test_pool_tokens_for_the_reference_pool():
    lay = _qwen38_layout()
    pool = 5_583_457_484
    assert lay.bytes_per_block == 17 * 448 * 4096
    assert lay.num_blocks(pool) == pool // (17 * 448 * 4096) == 178
    assert lay.blocks_per_request(65536) == -(-65536 // 448) + 3 * 9 == 174
    assert lay.reported_tokens(pool, 65536) == int(178 / 174 * 65536)
    assert lay.fits_one_request(pool, 65536)
    assert lay.longest_request(pool) == (178 - 1 - 27) * 448  # null block and 27 state pages off
    assert not lay.fits_one_request(pool, lay.longest_request(pool) + 1)
    assert lay.resident_requests(pool, 4096) == 177 // (10 + 27)


def test_fp32_state_cannot_hold_65536_in_reference_pool():
    lay = _qwen38_layout(ssm=4)
    assert lay.attention_block_size == 832
    assert not lay.fits_one_request(5_583_457_484, 65536)


def test_pool_bytes_for_is_the_smallest_pool():
    lay = _qwen38_layout(k=3)
    need = lay.pool_bytes_for(32768, num_requests=2)
    assert lay.resident_requests(need, 32768) == 2
    assert lay.resident_requests(need - 1, 32768) == 1


def test_empty_pool_has_no_capacity():
    lay = _qwen38_layout(k=0, prefix=False)
    assert lay.longest_request(0) == 0 and lay.usable_blocks(0) == 0
    assert lay.longest_request(lay.bytes_per_block * 4) == 0  # 3 blocks usable, 3 state pages: no token


def test_group_dataclass_roundtrip():
    g = KvGroup(LayerSpec("mamba", 1, state_bytes=5), 2)
    assert g.spec.page_size_bytes == 5 and GdnStatePage(1, 2).bytes == 3
