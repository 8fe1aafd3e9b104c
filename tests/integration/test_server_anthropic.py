"""`/v1/messages` answers the real Anthropic SDK (SmolLM2-135M-Instruct, float32, CPU).

Claude Code sends its key (ANTHROPIC_API_KEY) as the `x-api-key` header. Stock vLLM 0.32.0's auth middleware
reads only `Authorization: Bearer` (entrypoints/serve/middleware/authenticate.py) and answers it 401; patch
0001 (patches/LEDGER.md), applied in the image and the test environment, accepts it. The SDK's own `api_key=`
is sent as `Authorization: Bearer` by anthropic 2.x (its `_api_key_auth`).
"""

from __future__ import annotations

import anthropic
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.server]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# anthropic 2.x's Messages.create()/stream() take no `temperature` argument; vLLM's /v1/messages does.
GREEDY = {"temperature": 0}

def claude_code_client(server) -> anthropic.Anthropic:
    """What Claude Code sends: the key in `x-api-key`, no Authorization header."""
    return anthropic.Anthropic(base_url=server.base_url, api_key=None, auth_token=None,
                               default_headers={"X-Api-Key": server.api_key}, max_retries=0, timeout=120)


def sdk_client(server) -> anthropic.Anthropic:
    """The SDK configured the usual way (api_key=...): anthropic 2.x sends it as `Authorization: Bearer`."""
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=120)


def _check_message(message, server):
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == server.served_model_name
    text = "".join(block.text for block in message.content if block.type == "text")
    assert "Paris" in text, message
    assert message.usage.output_tokens > 0
    return text


def _stream_text(client, server) -> tuple[list[str], str]:
    pieces = []
    with client.messages.stream(
        model=server.served_model_name, max_tokens=30, messages=FRANCE, extra_body=GREEDY
    ) as stream:
        for text in stream.text_stream:
            pieces.append(text)
        final = stream.get_final_message()
    return pieces, _check_message(final, server)


def test_messages_create_with_sdk_api_key(smol_server):
    client = sdk_client(smol_server)
    message = client.messages.create(model=smol_server.served_model_name, max_tokens=30, messages=FRANCE,
                                      extra_body=GREEDY)
    _check_message(message, smol_server)


def test_messages_stream_with_sdk_api_key(smol_server):
    pieces, final_text = _stream_text(sdk_client(smol_server), smol_server)
    assert len(pieces) > 3, pieces
    assert "".join(pieces) == final_text


def test_messages_create_with_x_api_key_as_claude_code_sends_it(smol_server):
    client = claude_code_client(smol_server)
    message = client.messages.create(model=smol_server.served_model_name, max_tokens=30, messages=FRANCE,
                                      extra_body=GREEDY)
    _check_message(message, smol_server)


def test_messages_stream_with_x_api_key_as_claude_code_sends_it(smol_server):
    pieces, final_text = _stream_text(claude_code_client(smol_server), smol_server)
    assert "".join(pieces) == final_text


# About 1,900 tokens for SmolLM2 at MAX_LEN 2048 (see test_server_openai.py).
LONG_PROMPT = "Summarise this log. " + " ".join(f"line {i}: request served in {i % 97} ms." for i in range(140))


def _total_input(usage) -> int:
    """Anthropic counts a prompt as input + cache read + cache creation tokens."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


@pytest.mark.needs_patch("0020-max-tokens-clamp-to-context.patch")
def test_max_tokens_32000_is_clamped_to_a_max_tokens_stop(smol_server):
    """Claude Code's max_tokens 32000 on a 2048-token server: answered, filling the room left, stop_reason
    max_tokens (stock 0.32.0: 400 and the CLI exits 1)."""
    message = sdk_client(smol_server).messages.create(
        model=smol_server.served_model_name, max_tokens=32000, messages=[{"role": "user", "content": LONG_PROMPT}],
        extra_body={**GREEDY, "ignore_eos": True})
    assert message.stop_reason == "max_tokens", message
    assert _total_input(message.usage) + message.usage.output_tokens == int(smol_server.knobs["MAX_LEN"]), (
        message.usage)


def test_count_tokens_matches_the_prompt_the_model_sees(smol_server):
    """Claude Code calls count_tokens to size its context; vLLM renders the same chat prompt and counts it."""
    client = sdk_client(smol_server)
    kwargs = dict(model=smol_server.served_model_name, system="You are terse.",
                  messages=[{"role": "user", "content": "Count these tokens, please."}])
    counted = client.messages.count_tokens(**kwargs)
    message = client.messages.create(max_tokens=1, extra_body=GREEDY, **kwargs)
    assert counted.input_tokens == _total_input(message.usage) > 5


@pytest.mark.needs_patch("0002-auth-guard-every-route.patch")
def test_head_root_probe_gets_a_prompt_answer(smol_server):
    """Claude Code sends `HEAD /` to warm the connection and ignores the status. With a key configured every
    route but /health and /ping needs it (patch 0002), so the probe gets 401 without a body: harmless, and no
    route is opened for it."""
    import requests

    response = requests.head(f"{smol_server.base_url}/", timeout=10)
    assert response.status_code == 401
    assert not response.content


def test_cache_control_is_accepted_and_prefix_hits_are_reported_as_cache_reads(smol_server):
    """Prefix caching is on (PREFIX_CACHE=1) and `hyperqwen serve` passes --enable-prompt-tokens-details, so the
    second request with the same long system prefix reports its hit as cache_read_input_tokens."""
    client = sdk_client(smol_server)
    system = [{"type": "text", "text": "Rules. " + " ".join(f"rule {i}: be brief." for i in range(60)),
               "cache_control": {"type": "ephemeral"}}]
    usages = []
    for question in ("First question?", "Second question?"):
        message = client.messages.create(model=smol_server.served_model_name, max_tokens=4, system=system,
                                         messages=[{"role": "user", "content": question}], extra_body=GREEDY)
        usages.append(message.usage)
    assert (usages[1].cache_read_input_tokens or 0) >= 256, usages
    assert _total_input(usages[1]) > usages[1].cache_read_input_tokens, usages


@pytest.mark.needs_patch("0028-anthropic-stream-start-cached-usage.patch")
def test_streamed_usage_splits_cache_reads_the_same_in_message_start_and_message_delta(smol_server):
    """On a prefix-cache hit the streamed `message_start` counts cached tokens as cache_read_input_tokens, as the
    final `message_delta` does (stock 0.32.0: message_start put them all in input_tokens)."""
    client = sdk_client(smol_server)
    system = "Stream rules. " + " ".join(f"stream rule {i}: be brief." for i in range(60))
    for question in ("Warm the cache?", "Hit the cache?"):
        with client.messages.stream(model=smol_server.served_model_name, max_tokens=4, system=system,
                                    messages=[{"role": "user", "content": question}], extra_body=GREEDY) as stream:
            events = list(stream)
    start = next(e.message.usage for e in events if e.type == "message_start")
    delta = [e.usage for e in events if e.type == "message_delta"][-1]
    assert (delta.cache_read_input_tokens or 0) >= 256, delta
    assert start.cache_read_input_tokens == delta.cache_read_input_tokens, (start, delta)
    assert start.input_tokens == delta.input_tokens, (start, delta)
