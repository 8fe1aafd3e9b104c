"""Patch 0060 at its default interval on a long prefill, beside patch 0022's keep-alive (agents_server).

Runs right after test_agents_streams.py, on the same session server. The chunk-by-chunk checks and the SDK
round trips are in test_long_context_progress.py.
"""

from __future__ import annotations

import re
import secrets
import time

import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.server, pytest.mark.needs_patch("0060-prefill-progress.patch")]

PROGRESS = re.compile(r"^: prefill (\d+)/(\d+)$")


def test_default_interval_on_a_long_messages_prefill_keeps_the_pings(agents_server):
    """agents_server: the default STREAM_PROGRESS (1 s), 2048-token chunks, STREAM_KEEPALIVE=1 (conftest.py).

    A ~50k-token prompt on /v1/messages (Claude Code's route): progress lines at least ~1 s apart, on chunk
    boundaries, ending at the prompt length; Anthropic pings still go out on their own schedule."""
    assert "STREAM_PROGRESS" not in agents_server.knobs  # the default
    salt = secrets.token_hex(8)
    prompt = f"[{salt}] Read the log and say OK. " + " ".join(f"entry {i} ok." for i in range(6250))
    body = {"model": agents_server.served_model_name, "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": prompt}]}
    started = time.monotonic()
    stamped: list[tuple[float, str]] = []
    with requests.post(f"{agents_server.base_url}/v1/messages", json=body, headers={"Authorization": f"Bearer {agents_server.api_key}"},
                       stream=True, timeout=600) as response:
        assert response.status_code == 200, response.text[:500]
        for line in response.iter_lines(decode_unicode=True):
            if line:
                stamped.append((time.monotonic() - started, line))
    first_event = next(i for i, (_, line) in enumerate(stamped)
                       if line.startswith("event:") and line != "event: ping")
    before = stamped[:first_event]
    progress = [(t, tuple(map(int, m.groups()))) for t, line in before if (m := PROGRESS.match(line))]
    pings = [t for t, line in before if line == "event: ping"]
    prefill_s = stamped[first_event][0]
    print(f"messages: prefill {prefill_s:.1f} s, {len(pings)} pings, progress {[(round(t, 1), p) for t, p in progress]}")
    assert prefill_s > 3.0, f"the prefill took only {prefill_s:.1f} s: too short for this test (setup)"
    assert len(pings) >= 1
    assert len(progress) >= 2
    counts = [c for _, (c, _) in progress]
    total = progress[-1][1][1]
    assert counts == sorted(set(counts)) and progress[-1][1] == (total, total) and total > 40_000
    # Chunk boundaries are multiples of 2048, except that with prefix caching on a hybrid model vLLM's 'align'
    # Mamba cache mode may end the last chunk early at a KV-block boundary (seen: 47104, 48896, 48925), so the
    # line before the final one may be that block-aligned split inside the last 2048 tokens.
    assert all(c % 2048 == 0 for c in counts[:-2]), counts
    assert len(counts) < 2 or counts[-2] % 2048 == 0 or (total - 2048 < counts[-2] and counts[-2] % 16 == 0), counts
    gaps = [b - a for (a, _), (b, _) in zip(progress[:-2], progress[1:-1])]  # the final line follows the last chunk
    assert all(gap >= 0.9 for gap in gaps), gaps  # the 1 s poll, minus the client's read jitter
    assert len(progress) - 1 <= prefill_s + 1
    assert not any(PROGRESS.match(line) for _, line in stamped[first_event:])
