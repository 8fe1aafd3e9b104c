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
