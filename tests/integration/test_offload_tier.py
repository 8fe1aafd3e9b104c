"""The host-RAM tier (RAM_CACHE -> vLLM's native offloading) keeps serving once it starts evicting.

On vLLM 0.31 the 3090 reference saw the CPU tier serve nothing once it began evicting
(github.com/vllm-project/vllm/issues/51787). The connector's GPU<->CPU copies need CUDA, so this drives
vLLM 0.32.0's own tier bookkeeping directly (v1/kv_offload/cpu/manager.py CPUOffloadingManager: the lookup,
store and eviction decisions the scheduler side of the OffloadingConnector makes), on the CPU build: many
conversations are stored into a tier a third their size, and the newest must still be served. What remains
for a GPU: the copies themselves and the TTFT gain (docs/memory.md, "Conversation cache in host RAM").
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

CAPACITY = 32  # chunks in the tier
CHUNKS_PER_CONVERSATION = 4


def conversation_keys(n: int) -> list:
    return [make_offload_key(f"conv{n}-chunk{i}".encode().ljust(32, b"\0"), 0) for i in range(CHUNKS_PER_CONVERSATION)]


def store(manager: CPUOffloadingManager, n: int) -> list:
    ctx = ReqContext(req_id=f"store-{n}")
    keys = conversation_keys(n)
    out = manager.prepare_store(keys, ctx)
    assert out is not None, f"conversation {n}: the tier refused to store (eviction failed)"
    manager.complete_store(out.keys_to_store, ctx, success=True)
    manager.on_request_finished(ctx)
    return keys


def serve(manager: CPUOffloadingManager, n: int) -> bool:
    ctx = ReqContext(req_id=f"load-{n}")
    keys = conversation_keys(n)
    if not all(manager.lookup(k, ctx) is LookupResult.HIT for k in keys):
        return False
    manager.prepare_load(keys, ctx)
    manager.complete_load(keys, ctx)
    manager.on_request_finished(ctx)
    return True


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_tier_filled_past_capacity_still_serves_recent_conversations(policy):
    manager = CPUOffloadingManager(num_chunks=CAPACITY, cache_policy=policy)
    conversations = 3 * CAPACITY // CHUNKS_PER_CONVERSATION  # three times what fits: eviction on most stores
    for n in range(conversations):
        store(manager, n)
        assert serve(manager, n), f"conversation {n} was stored but is not served ({policy})"
    resident = CAPACITY // CHUNKS_PER_CONVERSATION
    recent = range(conversations - resident + 1, conversations)
    assert all(serve(manager, n) for n in recent), "recent conversations evicted although they fit"
    assert not serve(manager, 0), "the oldest conversation should have been evicted"


def test_a_conversation_being_read_is_not_evicted():
    manager = CPUOffloadingManager(num_chunks=CAPACITY)
    store(manager, 0)
    reader = ReqContext(req_id="reader")
    manager.prepare_load(conversation_keys(0), reader)  # in flight: ref_cnt 1
    for n in range(1, 2 * CAPACITY // CHUNKS_PER_CONVERSATION):
        ctx = ReqContext(req_id=f"s{n}")
        out = manager.prepare_store(conversation_keys(n), ctx)
        if out is not None:
            manager.complete_store(out.keys_to_store, ctx, success=True)
    assert all(manager.lookup(k, reader) is LookupResult.HIT for k in conversation_keys(0))
    manager.complete_load(conversation_keys(0), reader)
