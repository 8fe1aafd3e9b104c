"""The server `hyperqwen serve` starts answers the real OpenAI SDK (SmolLM2-135M-Instruct, float32, CPU)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.server]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_health_and_models_list_served_name(smol_server):
    assert requests.get(f"{smol_server.base_url}/health", timeout=10).status_code == 200
    models = smol_server.openai().models.list()
    assert [m.id for m in models.data] == [smol_server.served_model_name]


def test_models_list_tells_clients_the_real_context_window(smol_server):
    """docs/agents.md tells each agent to use this number (Claude Code CLAUDE_CODE_MAX_CONTEXT_TOKENS, Codex
    model_context_window, opencode limit.context) so it compacts before the server's limit."""
    response = requests.get(f"{smol_server.v1_url}/models", timeout=10,
                            headers={"Authorization": f"Bearer {smol_server.api_key}"})
    assert response.status_code == 200
    assert response.json()["data"][0]["max_model_len"] == int(smol_server.knobs["MAX_LEN"])


def test_metrics_counters_increase_after_requests(smol_server):
    before = smol_server.metrics()
    assert any(name.startswith("vllm:") for name in before), sorted(before)[:20]
    smol_server.openai().chat.completions.create(
        model=smol_server.served_model_name, messages=FRANCE, max_tokens=5, temperature=0
    )
    after = smol_server.metrics()
    assert after["vllm:request_success_total"] >= before.get("vllm:request_success_total", 0) + 1
    assert after["vllm:generation_tokens_total"] > before.get("vllm:generation_tokens_total", 0)
    assert after["vllm:prompt_tokens_total"] > before.get("vllm:prompt_tokens_total", 0)


def test_chat_capital_of_france_is_paris(smol_server):
    response = smol_server.openai().chat.completions.create(
        model=smol_server.served_model_name, messages=FRANCE, max_tokens=30, temperature=0
    )
    text = response.choices[0].message.content
    assert "Paris" in text, text
    assert response.model == smol_server.served_model_name
    assert response.usage.completion_tokens > 0


def test_streaming_chat_arrives_incrementally_and_equals_greedy_text(smol_server):
    client = smol_server.openai()
    kwargs = dict(model=smol_server.served_model_name, messages=FRANCE, max_tokens=30, temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    pieces = []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert len(pieces) > 3, pieces  # incremental, not one blob
    assert "".join(pieces) == whole


def test_completions_endpoint(smol_server):
    response = smol_server.openai().completions.create(
        model=smol_server.served_model_name, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    choice = response.choices[0]
    assert "Paris" in choice.text, choice.text
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= response.usage.completion_tokens <= 8


def test_responses_endpoint(smol_server):
    response = smol_server.openai().responses.create(
        model=smol_server.served_model_name, input="What is the capital of France?", max_output_tokens=40,
        temperature=0,
    )
    assert response.status == "completed", response
    assert "Paris" in response.output_text, response.output_text


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def test_json_schema_structured_output_validates(smol_server):
    response = smol_server.openai().chat.completions.create(
        model=smol_server.served_model_name,
        messages=[{"role": "user", "content": "Describe a person who lives in France as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}},
        max_tokens=100,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), PERSON_SCHEMA)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
OTHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}


def _forced_weather_call(server):
    return server.openai().chat.completions.create(
        model=server.served_model_name,
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[OTHER_TOOL, WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )


def test_forced_named_tool_call_names_the_tool_with_json_arguments(smol_server):
    response = _forced_weather_call(smol_server)
    calls = response.choices[0].message.tool_calls
    assert calls and len(calls) == 1, response
    assert calls[0].function.name == "get_weather"
    assert isinstance(json.loads(calls[0].function.arguments), dict)


@pytest.mark.needs_patch("0021-tool-call-grammar-bounded-whitespace.patch")
def test_forced_named_tool_call_has_schema_valid_arguments(smol_server):
    """Once a strict xfail: 0.32.0's default --tool-strict-level auto holds only the '<function=NAME>' frame of a
    forced call; `hyperqwen serve` passes `parameter`, so the arguments are grammar-held to the schema too
    (test_agents_tools.py checks it over many seeds on every route)."""
    calls = _forced_weather_call(smol_server).choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER_TOOL["function"]["parameters"])


def test_logprobs(smol_server):
    response = smol_server.openai().chat.completions.create(
        model=smol_server.served_model_name, messages=FRANCE, max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=3,
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert entry.logprob == pytest.approx(max(t.logprob for t in entry.top_logprobs), abs=1e-4)


# About 1,900 tokens of prompt for SmolLM2 at MAX_LEN 2048: the room left is far below what agents ask for.
LONG_PROMPT = "Summarise this log. " + " ".join(f"line {i}: request served in {i % 97} ms." for i in range(140))


@pytest.mark.needs_patch("0020-max-tokens-clamp-to-context.patch")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_max_tokens_beyond_the_context_is_clamped_to_a_length_stop(smol_server, stream):
    """Claude Code asks max_tokens 32000 whatever the context; stock 0.32.0 refused it (400 "cannot be greater
    than max_model_len"). Clamped, the reply fills exactly the room the prompt leaves and ends as a length stop."""
    kwargs = dict(model=smol_server.served_model_name, messages=[{"role": "user", "content": LONG_PROMPT}],
                  max_tokens=32000, temperature=0, extra_body={"ignore_eos": True})
    client = smol_server.openai()
    if stream:
        finish, usage = None, None
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            usage = chunk.usage or usage
    else:
        response = client.chat.completions.create(**kwargs)
        finish, usage = response.choices[0].finish_reason, response.usage
    max_len = int(smol_server.knobs["MAX_LEN"])
    assert usage.prompt_tokens > max_len - 400, f"the prompt should nearly fill MAX_LEN: {usage}"
    assert finish == "length"
    assert usage.prompt_tokens + usage.completion_tokens == max_len, usage
