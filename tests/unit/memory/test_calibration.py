"""The planner against the 3090 reference's published KV pools (github.com/syv-ai/qwen38-27b-rtx3090).

That deployment ran vLLM 0.27.1 on a headless RTX 3090 (CUDA total 23.56 GiB) with --max-num-batched-tokens
2048, fp16 GDN state, prefix caching off, and published its pools as vLLM's log line "GPU KV cache size: N
tokens". Conversion back to bytes: the log line is int(num_blocks / blocks_per_request(MAX_LEN) x MAX_LEN)
(kv_cache_utils.get_kv_cache_capacity; the same formula gives the reference's own "1.49x concurrency at
150k" for 223,821 tokens), so exactly one block count reproduces each published number, and the pool is
that count times the bytes per block of the layout those settings give. Weights: 14.26 GiB "model loading"
with --language-model-only (its docs/gotchas.md 9), plus the MTP head from the bundled shapes for MTP.
"""

from __future__ import annotations

import pytest

from hyperqwen.config.settings import resolve_settings
from hyperqwen.config.sizes import GiB
from hyperqwen.memory import GpuFacts, plan_memory
from hyperqwen.memory.bundled import load_bundled_checkpoint
from hyperqwen.memory.gpu import CARDS

RTX3090 = GpuFacts.of_card(CARDS["rtx3090"])
BODY = int(14.26 * GiB)

# (name, settings, MAX_LEN, published "GPU KV cache size" tokens)
SETUPS = [
    ("single-user CTX=fast: MTP k=4, bf16 KV, 64k, GPU_UTIL 0.93",
     {"SPEC": "mtp", "DRAFT_TOKENS": "4", "KV": "bf16", "GPU_UTIL": "0.93", "MAX_SEQS": "8"}, 65536, 73_777),
    ("batch: fp8 KV, 150k, 64 sequences, GPU_UTIL 0.972",
     {"SPEC": "none", "KV": "fp8", "GPU_UTIL": "0.972", "MAX_SEQS": "64"}, 150_000, 223_821),
]
COMMON = {"STATE_DTYPE": "float16", "PREFIX_CACHE": "false", "MAX_BATCHED_TOKENS": "2048"}


def implied_pool_bytes(budget, max_len: int, tokens: int) -> int:
    """The one pool (whole blocks) whose get_kv_cache_capacity line reads `tokens` at `max_len`."""
    per_request = budget.layout.blocks_per_request(max_len)
    counts = [n for n in range(1, 10_000) if int(n / per_request * max_len) == tokens]
    assert len(counts) == 1, counts
    return counts[0] * budget.layout.bytes_per_block


def plan_setup(env: dict, max_len: int, **extra: str):
    checkpoint = load_bundled_checkpoint()
    settings = resolve_settings({**COMMON, **env, **extra}, mode="batch")
    mtp = checkpoint.weights(2).mtp if env["SPEC"] == "mtp" else 0
    return plan_memory(settings, RTX3090, max_len=max_len, checkpoint=checkpoint, terms={"WEIGHTS": BODY + mtp})


@pytest.mark.parametrize("name,env,max_len,tokens", SETUPS, ids=[s[0].split(":")[0] for s in SETUPS])
def test_pool_within_3_percent_of_the_published_pool(name, env, max_len, tokens):
    b = plan_setup(env, max_len)
    published = implied_pool_bytes(b, max_len, tokens)
    assert abs(b.pool_bytes - published) <= 0.03 * published, (name, b.pool_bytes / GiB, published / GiB)


def test_batch_with_prefix_caching_is_within_the_documented_profile_swing():
    """The third published pool (193,298 tokens, PREFIX_CACHE=1) converts to 0.85 GiB less than the run
    without prefix caching, while vLLM 0.32.0's arithmetic charges prefix caching only 3 state pages per
    request in the pool, not memory outside it. The reference documents a 0.87 GiB swing of the profiled
    activation peak between starts (docs/gotchas.md 9) and a cold compile cache costing ~0.87 GiB once
    (gotcha 16): the planner lands within that swing (+3%), not within 3%. Said plainly in docs/memory.md."""
    env = {"SPEC": "none", "KV": "fp8", "GPU_UTIL": "0.972", "MAX_SEQS": "64"}
    b = plan_setup(env, 150_000, PREFIX_CACHE="true")
    published = implied_pool_bytes(b, 150_000, 193_298)
    assert 0 <= b.pool_bytes - published <= int(0.87 * GiB) + 0.03 * published


def test_the_defaults_get_what_a_linux_3090_gives():
    """Single mode fits 65,536 tokens with MTP; batch admits 64 concurrent 128-in/512-out requests."""
    single = plan_memory(resolve_settings({}, mode="single"), RTX3090)
    assert single.fits and single.max_model_len == 65536 and single.inputs.spec_method == "mtp"
    batch = plan_memory(resolve_settings({}, mode="batch"), RTX3090)
    assert batch.fits and batch.resident_requests[640] == 64 == batch.inputs.max_num_seqs
