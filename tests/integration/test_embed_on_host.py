"""EMBED_ON_HOST on the CPU build: the server starts with `--cpu-offload-gb 4 --cpu-offload-params embed_tokens`,
patch 0065 passes the Qwen3.5 embedding through vLLM's UVA offloader, and the output is token for token what the
same model gives without it.

What only a GPU shows: on the CPU platform the parameters already live in host memory, so the offloader leaves
them as they are (offloader/uva.py returns early for a CPU module); the move to pinned memory, the UVA view and
the Triton dequant-gather reading through it run only on CUDA. The planner's side (the table's bytes leave the
GPU weights, the host RAM check) is tested in tests/unit/memory/test_embed_on_host_plan.py.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.server]

PATCH = "0065-embed-tokens-host-uva.patch"
PROMPT = "The lighthouse keeper counted the ships that passed: one, two, three,"


@pytest.mark.needs_patch(PATCH)
def test_embed_on_host_serves_the_same_tokens(agents_server, tiny_qwen_prefix_server):
    assert agents_server.knobs["EMBED_ON_HOST"] == "1" and "EMBED_ON_HOST" not in tiny_qwen_prefix_server.knobs
    log = agents_server.log_path.read_text(errors="replace")
    # vLLM echoes the options it was given that differ from its defaults.
    assert "'cpu_offload_gb': 4.0" in log and "'cpu_offload_params': ['embed_tokens']" in log, log[-3000:]
    offloaded = agents_server.greedy_token_ids(PROMPT, 24)
    plain = tiny_qwen_prefix_server.greedy_token_ids(PROMPT, 24)
    assert offloaded == plain
