"""Properties: a plan that says it fits never exceeds the card; more card or a shorter context never fits less."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperqwen.config.knobs import KV_DTYPES
from hyperqwen.config.settings import resolve_settings
from hyperqwen.config.sizes import GiB, MiB
from hyperqwen.memory import GpuFacts, Outcome, plan_memory

knob_env = st.fixed_dictionaries({
    "KV": st.sampled_from(tuple(KV_DTYPES)),
    "STATE_DTYPE": st.sampled_from(("auto", "float16", "float32")),
    "SPEC": st.sampled_from(("none", "mtp")),
    "DRAFT_TOKENS": st.integers(1, 8).map(str),
    "PREFIX_CACHE": st.booleans().map(str),
    "MAX_LEN": st.integers(256, 262144).map(str),
    "MAX_SEQS": st.integers(1, 256).map(str),
    "KV_MEM": st.one_of(st.just(""), st.integers(64 * MiB, 40 * GiB).map(str)),
    "GPU_UTIL": st.floats(0.5, 0.99).map(lambda x: f"{x:.3f}"),
    "MAX_BATCHED_TOKENS": st.integers(256, 32768).map(str),
    "VISION": st.booleans().map(str),
})
cards = st.tuples(st.sampled_from((12, 16, 24, 32, 48)), st.integers(0, 4 * 1024), st.booleans())
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _plan(qwen38, env, gpu, **kwargs):
    return plan_memory(resolve_settings(env, mode="batch"), gpu, checkpoint=qwen38, **kwargs)


@SETTINGS
@given(env=knob_env, card=cards)
def test_a_fitting_plan_never_exceeds_the_card(qwen38, env, card):
    size_gib, reserved_mib, wsl2 = card
    gpu = GpuFacts.nominal(size_gib * GiB, reserved_bytes=reserved_mib * MiB, wsl2=wsl2)
    b = _plan(qwen38, env, gpu)
    if b.fits:
        context = b.terms["cuda_context"].value
        assert b.requested_bytes <= gpu.free_bytes - context  # vLLM's startup check passes
        assert b.footprint_bytes + context + b.terms["headroom_floor"].value <= gpu.free_bytes
        assert b.weights["resident"] + b.terms["load_transient"].value + context <= gpu.free_bytes
        assert b.layout.fits_one_request(b.pool_bytes - b.terms["profile_margin"].value, b.max_model_len)
        assert b.pool_tokens >= 1 and b.longest_context >= b.max_model_len
    else:
        assert b.problems and b.explain_failure() and b.outcome is not Outcome.FITS


@SETTINGS
@given(env=knob_env, size=st.sampled_from((16, 24, 32)), extra=st.integers(1, 16))
def test_more_card_never_fits_less(qwen38, env, size, extra):
    small = _plan(qwen38, env, GpuFacts.nominal(size * GiB))
    large = _plan(qwen38, env, GpuFacts.nominal((size + extra) * GiB))
    assert large.largest_fitting_max_len >= small.largest_fitting_max_len
    if small.fits:
        assert large.fits


@SETTINGS
@given(env=knob_env, shorter=st.integers(256, 262144))
def test_a_shorter_context_never_fits_less(qwen38, env, shorter):
    gpu = GpuFacts.nominal(24 * GiB)
    longer = _plan(qwen38, env, gpu)
    short = _plan(qwen38, env, gpu, max_len=min(shorter, longer.max_model_len))
    if longer.fits:
        assert short.fits
