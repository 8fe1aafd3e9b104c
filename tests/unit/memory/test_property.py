"""Property: whatever valid knobs and card, a plan that says it fits never exceeds the card."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperqwen.memory import GpuFacts, MemoryKnobs, plan_memory
from hyperqwen.memory.budget import GiB, MiB
from hyperqwen.memory.kvcache import SUPPORTED_KV_DTYPES

knobs = st.builds(
    lambda kv, state, spec_k, prefix, max_len, seqs, pool, util, batched, vision: MemoryKnobs(
        kv_cache_dtype=kv, state_dtype=state, spec_method="mtp" if spec_k else "none",
        num_speculative_tokens=spec_k, prefix_caching=prefix, max_model_len=max_len, max_num_seqs=seqs,
        kv_cache_memory_bytes=pool, gpu_memory_utilization=util if pool is None else None,
        max_num_batched_tokens=batched, language_model_only=not vision),
    st.sampled_from(SUPPORTED_KV_DTYPES), st.sampled_from(("auto", "float16", "float32", "bfloat16")),
    st.integers(0, 8), st.booleans(), st.one_of(st.none(), st.integers(256, 262144)), st.integers(1, 256),
    st.one_of(st.none(), st.integers(64 * MiB, 40 * GiB)), st.floats(0.5, 0.99), st.integers(256, 32768),
    st.booleans())
cards = st.tuples(st.sampled_from((12, 16, 24, 32, 48)), st.integers(0, 4 * 1024), st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=knobs, card=cards)
def test_a_fitting_plan_never_exceeds_the_card(qwen38, qwen38_dir, k, card):
    size_gib, reserved_mib, wsl2 = card
    gpu = GpuFacts.nominal(size_gib * GiB, reserved_bytes=reserved_mib * MiB, wsl2=wsl2)
    b = plan_memory(qwen38_dir, k, gpu, checkpoint=qwen38)
    if b.fits:
        floor = b.terms["headroom_floor"].value
        assert b.footprint_bytes + floor <= gpu.free_bytes
        # While loading (before the profile run and graphs): weights, the MTP transient and the CUDA context.
        assert (b.weights["resident"] + b.terms["load_transient"].value + b.terms["cuda_context"].value
                <= gpu.free_bytes)
        assert b.layout.fits_one_request(b.pool_bytes, b.max_model_len)
        assert b.max_model_len >= 1 and b.pool_tokens >= 1
        assert b.longest_context >= b.max_model_len
    else:
        assert b.problems and b.explain_failure()
