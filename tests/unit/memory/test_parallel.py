"""Tensor parallel: which TP sizes the model takes, and what one rank holds (memory/parallel.py)."""

from __future__ import annotations

import gzip
import json

import pytest

from hyperqwen.memory.bundled import BUNDLE, load_bundled_checkpoint
from hyperqwen.memory.checkpoint import DTYPE_BYTES
from hyperqwen.memory.kvcache import attention_bytes_per_token_layer, gdn_state_page
from hyperqwen.memory.parallel import (
    Heads,
    kv_heads_per_rank,
    load_heads,
    rank_checkpoint,
    rank_shape,
    tp_problems,
    valid_tp_sizes,
)


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads(gzip.decompress(BUNDLE.read_bytes()))["config"]


@pytest.fixture(scope="module")
def heads(config) -> Heads:
    return Heads.from_config(config)


def test_heads_come_from_the_checkpoint_config(heads, qwen38_dir):
    assert heads == Heads(num_attention_heads=24, num_kv_heads=4, linear_num_key_heads=16, linear_num_value_heads=48,
                          intermediate_size=17408, quant_group_size=128)
    from_dir, where = load_heads(qwen38_dir)
    assert from_dir == heads and where.endswith("config.json")


def test_load_heads_falls_back_to_the_bundled_config(tmp_path, heads):
    got, where = load_heads(tmp_path / "qwen3.8-27b")
    assert got == heads and "bundled" in where


def test_valid_tp_sizes_for_qwen38_27b(heads):
    # 24 query heads, 4 KV heads, 16 GDN key heads, 48 GDN value heads: 1, 2, 4 and 8 divide them all.
    assert valid_tp_sizes(heads) == [1, 2, 4, 8]


@pytest.mark.parametrize(("tp", "field"), [(3, "num_key_value_heads=4"), (3, "linear_num_key_heads=16"),
                                           (5, "num_attention_heads=24"), (6, "linear_num_key_heads=16"),
                                           (16, "num_attention_heads=24")])
def test_tp_that_does_not_divide_the_heads_is_refused_naming_tp_and_the_field(heads, tp, field):
    problems = tp_problems(heads, tp, "config.json")
    assert problems and all(p.startswith(f"TP={tp}") for p in problems)
    assert any(field in p for p in problems), problems


def test_tp_above_the_kv_heads_must_be_a_multiple_of_them():
    h = Heads(num_attention_heads=24, num_kv_heads=4, linear_num_key_heads=0, linear_num_value_heads=0,
              intermediate_size=4096)
    assert tp_problems(h, 8) == []  # KV heads replicated twice over
    three_kv = Heads(24, 3, 0, 0, 4096)
    assert any("not a multiple" in p for p in tp_problems(three_kv, 4))


def test_quantization_groups_must_split_evenly():
    h = Heads(num_attention_heads=8, num_kv_heads=8, linear_num_key_heads=0, linear_num_value_heads=0,
              intermediate_size=1152, quant_group_size=128)  # 1152 / 2 = 576 = 4.5 groups of 128
    assert any("quantization groups" in p for p in tp_problems(h, 2))
    assert tp_problems(h, 1) == []


def test_kv_heads_per_rank_split_then_replicate():
    assert [kv_heads_per_rank(4, tp) for tp in (1, 2, 4, 8)] == [4, 2, 1, 1]


def test_rank_shape_divides_what_vllm_divides():
    ckpt = load_bundled_checkpoint()
    s2 = rank_shape(ckpt.shape, 2)
    assert (s2.num_kv_heads, s2.linear_num_key_heads, s2.linear_num_value_heads, s2.intermediate_size) == \
        (2, 8, 24, 8704)
    assert (s2.hidden_size, s2.vocab_size, s2.head_dim) == (ckpt.shape.hidden_size, ckpt.shape.vocab_size, 256)


def test_per_rank_kv_and_gdn_pages_halve_with_tp2():
    ckpt = load_bundled_checkpoint()
    one, two = ckpt.shape, rank_shape(ckpt.shape, 2)
    for kv in ("auto", "fp8"):
        assert attention_bytes_per_token_layer(kv, two.num_kv_heads, two.head_dim, 2) * 2 == \
            attention_bytes_per_token_layer(kv, one.num_kv_heads, one.head_dim, 2)
    whole = gdn_state_page(num_k_heads=16, num_v_heads=48, head_k_dim=128, head_v_dim=128, conv_kernel=4,
                           num_speculative_tokens=3, conv_dtype_bytes=2, ssm_dtype_bytes=2)
    rank = gdn_state_page(num_k_heads=two.linear_num_key_heads, num_v_heads=two.linear_num_value_heads,
                          head_k_dim=128, head_v_dim=128, conv_kernel=4, num_speculative_tokens=3,
                          conv_dtype_bytes=2, ssm_dtype_bytes=2)
    assert rank.bytes * 2 == whole.bytes


def test_per_rank_gdn_state_matches_vllms_own_shape_calculator():
    """The per-rank heads, fed to our page arithmetic with tp_size=1, give the shapes vLLM 0.32.0 computes for
    rank state with tp_world_size=TP (model_executor/layers/mamba/mamba_utils.py)."""
    mamba_utils = pytest.importorskip("vllm.model_executor.layers.mamba.mamba_utils",
                                      reason="needs the vLLM CPU build (.venv)")
    shape = load_bundled_checkpoint().shape
    for tp in (1, 2, 4, 8):
        for k in (0, 3):
            conv, ssm = mamba_utils.MambaStateShapeCalculator.gated_delta_net_state_shape(
                tp, shape.linear_num_key_heads, shape.linear_num_value_heads, shape.linear_key_head_dim,
                shape.linear_value_head_dim, shape.linear_conv_kernel_dim, k)
            rank = rank_shape(shape, tp)
            page = gdn_state_page(num_k_heads=rank.linear_num_key_heads, num_v_heads=rank.linear_num_value_heads,
                                  head_k_dim=rank.linear_key_head_dim, head_v_dim=rank.linear_value_head_dim,
                                  conv_kernel=rank.linear_conv_kernel_dim, num_speculative_tokens=k,
                                  conv_dtype_bytes=2, ssm_dtype_bytes=4)
            assert page.conv_bytes == conv[0] * conv[1] * 2
            assert page.ssm_bytes == ssm[0] * ssm[1] * ssm[2] * 4


def test_rank_weights_are_a_tp_th_share_plus_the_replicated_norms():
    ckpt = load_bundled_checkpoint()
    mdb = DTYPE_BYTES["bfloat16"]
    whole = ckpt.weights(mdb)
    norms = sum(t.numel * mdb for t in ckpt.tensors if t.name.endswith("norm.weight")
                and not t.name.startswith("mtp.") and ".visual." not in t.name and not t.name.startswith("visual"))
    for tp in (2, 4):
        rank = rank_checkpoint(ckpt, tp).weights(mdb)
        expected = (whole.body - norms) / tp + norms
        # Within 0.1%: the vocabulary is padded to a multiple of 64 before the split.
        assert rank.body == pytest.approx(expected, rel=1e-3), tp
    assert rank_checkpoint(ckpt, 1) is ckpt
