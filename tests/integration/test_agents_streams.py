"""Streams stay alive while a long prompt fills: keep-alive on every streaming route, and the SDKs still parse them.

agents_server runs the tiny model at MAX_LEN 65536 with STREAM_KEEPALIVE=1 (`--sse-keep-alive-interval 1`) and
2048-token prefill chunks, so a ~50k-token prompt keeps the stream silent for several seconds on the CPU build.
vLLM 0.32.0 sends `: keep-alive` SSE comments on /v1/chat/completions and /v1/completions only; patch 0022 adds
them to /v1/responses and sends Anthropic `ping` events on /v1/messages (what Anthropic's API sends; Claude Code
warns after 150 s without a chunk and gives up at 300 s).
"""

from __future__ import annotations

import secrets
import time

import anthropic
import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.server]

PATCH = "0022-stream-keepalive-messages-responses.patch"


def long_prompt(tokens: int = 50_000) -> str:
    """About `tokens` tokens for the tiny model's tokenizer (SmolLM2's: ~8 per entry, measured), new each call so
    no prefix-cache hit shortens the prefill."""
    salt = secrets.token_hex(8)
    return f"[{salt}] Read the log and say OK. " + " ".join(f"entry {i} ok." for i in range(tokens // 8))


def raw_stream(server, path: str, body: dict) -> tuple[list[str], float]:
    """The SSE lines of one streamed request, and the seconds until its first data/event line."""
    started = time.monotonic()
    first_data = None
    lines: list[str] = []
    with requests.post(f"{server.base_url}{path}", json=body, stream=True, timeout=600,
                       headers={"Authorization": f"Bearer {server.api_key}"}) as response:
        assert response.status_code == 200, response.text[:500]
        for line in response.iter_lines(decode_unicode=True):
            if line is None:
                continue
            if first_data is None and (line.startswith("data:") or line.startswith("event:")) and "ping" not in line:
                first_data = time.monotonic() - started
            lines.append(line)
    return lines, first_data or 0.0


def keepalives_before_first_data(lines: list[str], marker: str) -> int:
    count = 0
    for line in lines:
        if line.startswith(marker):
            count += 1
        elif line.startswith("data:") or (line.startswith("event:") and "ping" not in line):
            break
    return count


def test_chat_stream_sends_keepalive_comments_during_a_long_prefill(agents_server):
    body = {"model": agents_server.served_model_name, "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": long_prompt()}]}
    lines, first = raw_stream(agents_server, "/v1/chat/completions", body)
    assert first > 2.0, f"the prefill took only {first:.1f} s: too short to show keep-alive (test setup)"
    assert keepalives_before_first_data(lines, ": keep-alive") >= 1, lines[:5]


@pytest.mark.needs_patch(PATCH)
def test_responses_stream_sends_keepalive_comments_during_a_long_prefill(agents_server):
    body = {"model": agents_server.served_model_name, "stream": True, "max_output_tokens": 4,
            "input": long_prompt()}
    lines, first = raw_stream(agents_server, "/v1/responses", body)
    assert first > 0.0
    assert any(line.startswith(": keep-alive") for line in lines), lines[:5]


@pytest.mark.needs_patch(PATCH)
def test_messages_stream_sends_anthropic_ping_events_during_a_long_prefill(agents_server):
    body = {"model": agents_server.served_model_name, "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": long_prompt()}]}
    lines, _ = raw_stream(agents_server, "/v1/messages", body)
    pings = [i for i, line in enumerate(lines) if line == "event: ping"]
    assert pings, lines[:5]
    assert lines[pings[0] + 1] == 'data: {"type": "ping"}', lines[pings[0]: pings[0] + 2]


@pytest.mark.needs_patch(PATCH)
def test_sdks_parse_streams_with_keepalives(agents_server):
    """The openai SDK (chat, responses) and the anthropic SDK read such streams to the end as usual."""
    client = agents_server.openai()
    chunks = list(client.chat.completions.create(
        model=agents_server.served_model_name, stream=True, max_tokens=4,
        messages=[{"role": "user", "content": long_prompt()}]))
    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop"), chunks[-1:]
    events = list(client.responses.create(model=agents_server.served_model_name, stream=True,
                                          max_output_tokens=16, input=long_prompt()))
    assert events[-1].type == "response.completed", [e.type for e in events[-3:]]
    anthropic_client = anthropic.Anthropic(base_url=agents_server.base_url, api_key=agents_server.api_key,
                                           max_retries=0, timeout=600)
    with anthropic_client.messages.stream(model=agents_server.served_model_name, max_tokens=4,
                                          messages=[{"role": "user", "content": long_prompt()}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("max_tokens", "end_turn"), final
    usage = final.usage  # Anthropic splits the prompt: input + cache read + cache creation
    total = usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    assert total > 40_000, usage
