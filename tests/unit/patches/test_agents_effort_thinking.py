"""Patch 0023: the rule that maps a request's reasoning effort onto thinking, with the operator's gate.

HYPERQWEN_CLIENT_THINKING (set by `hyperqwen serve` from CLIENT_THINKING) closes or opens the gate; the rule is
documented in docs/agents.md. Driven through the real request classes' build_chat_params, as the servers do.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.needs_patch("0023-client-effort-thinking-gate.patch")

EFFORTS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True, "xhigh": True}


def chat_kwargs(**fields):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}], **fields)
    return request.build_chat_params(None, "auto").chat_template_kwargs


def responses_kwargs(**fields):
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    request = ResponsesRequest(model="m", input="Hi", **fields)
    return request.build_chat_params(None, "auto").chat_template_kwargs


@pytest.mark.parametrize("effort", list(EFFORTS))
def test_gate_open_maps_effort_onto_thinking(monkeypatch, effort):
    monkeypatch.setenv("HYPERQWEN_CLIENT_THINKING", "1")
    assert chat_kwargs(reasoning_effort=effort).get("enable_thinking") is EFFORTS[effort]
    assert responses_kwargs(reasoning={"effort": effort}).get("enable_thinking") is EFFORTS[effort]


@pytest.mark.parametrize("effort", list(EFFORTS))
def test_gate_closed_leaves_thinking_to_the_server(monkeypatch, effort):
    monkeypatch.setenv("HYPERQWEN_CLIENT_THINKING", "0")
    assert "enable_thinking" not in chat_kwargs(reasoning_effort=effort)
    assert "enable_thinking" not in responses_kwargs(reasoning={"effort": effort})


def test_explicit_template_kwargs_win_either_way(monkeypatch):
    for gate in ("0", "1"):
        monkeypatch.setenv("HYPERQWEN_CLIENT_THINKING", gate)
        kwargs = chat_kwargs(reasoning_effort="high", chat_template_kwargs={"enable_thinking": False})
        assert kwargs["enable_thinking"] is False


@pytest.mark.parametrize(("thinking", "expected"), [({"type": "adaptive"}, "high"),
                                                    ({"type": "enabled", "budget_tokens": 2048}, "high")])
def test_anthropic_thinking_block_without_effort_reads_as_high(thinking, expected):
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    request = AnthropicMessagesRequest(model="m", max_tokens=4096, messages=[{"role": "user", "content": "Hi"}],
                                       thinking=thinking)
    chat = AnthropicServingMessages.to_chat_completion_request(request)
    assert chat.reasoning_effort == expected
