"""Patch 0012 at the function level, on CPU torch with vLLM's own C++ kernel (no server).

vLLM 0.32.0's CPU `causal_conv1d_fwd_cpu` requires x (dim, tokens) with strides exactly (1, dim). A one-token
x that is "contiguous" in torch's sense can still have other strides (a size-1 dimension's stride is free),
and the kernel raised "expect x to be transposed". The patched `_causal_conv1d_fwd_cpu` copies such an x into
the layout the kernel checks; its answer must equal vLLM's pure-torch reference (`causal_conv1d_fn_cpu`).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.needs_patch("0012-gdn-conv1d-one-token-prefill-cpu.patch")]

torch = pytest.importorskip("torch", reason="needs the vLLM CPU build (.venv)")
DIM, WIDTH = 256, 4


def one_token_x() -> torch.Tensor:
    """(DIM, 1) with strides (1, 1): what a one-token prefill slice looks like after transpose/contiguous."""
    torch.manual_seed(0)
    x = torch.randn(DIM, 1).to(torch.bfloat16).transpose(0, 1).contiguous().transpose(0, 1)
    assert x.stride() == (1, 1) and x.is_contiguous()
    return x


def conv_inputs():
    torch.manual_seed(1)
    weight = torch.randn(DIM, WIDTH).to(torch.bfloat16)
    bias = torch.randn(DIM).to(torch.bfloat16)
    # The SD layout (vLLM's default): (slots, state_len, dim) storage seen as (slots, dim, state_len).
    conv_states = torch.zeros(2, WIDTH - 1, DIM, dtype=torch.bfloat16).transpose(1, 2)
    return dict(weight=weight, bias=bias, conv_states=conv_states,
                query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
                cache_indices=torch.tensor([1], dtype=torch.int32),
                has_initial_state=torch.tensor([False]))


def test_one_token_prefill_passes_the_kernel_and_matches_the_reference():
    gdn = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_fn_cpu

    x = one_token_x()
    inputs = conv_inputs()
    reference_inputs = {**inputs, "conv_states": inputs["conv_states"].clone()}
    reference = causal_conv1d_fn_cpu(x=x.clone(), activation="silu", **reference_inputs)
    out = gdn._causal_conv1d_fwd_cpu(x=x, silu_activation=True, is_weight_packed=False, **inputs)
    assert out.shape == (DIM, 1)
    torch.testing.assert_close(out.float(), reference.float(), rtol=2e-2, atol=2e-2)
    # The conv state the next decode step reads holds the token, as the reference's does.
    torch.testing.assert_close(inputs["conv_states"][1].float(), reference_inputs["conv_states"][1].float())


def test_the_stock_kernel_refuses_that_layout():
    """Why the patch exists: the kernel itself (vLLM's op, unpatched) refuses the one-token layout."""
    ops = pytest.importorskip("vllm._custom_ops")
    inputs = conv_inputs()
    with pytest.raises(RuntimeError, match="expect x to be transposed"):
        ops.causal_conv1d_fwd_cpu(x=one_token_x(), silu_activation=True, is_weight_packed=False, **inputs)
