"""LiteLLM (the SDK, as a proxy would use it) against the CPU server, with the configuration docs/agents.md gives:
`anthropic/MODEL` with the base URL *without* `/v1` (LiteLLM appends `/v1/messages`), and `openai/MODEL` with
`/v1`. Requests go through the recording proxy so the test sees which route each one reached. Each side: one
plain turn and one forced tool call whose arguments must validate against the tool's schema (LiteLLM translates
the OpenAI-style tool and tool_choice into the Anthropic shape on the anthropic/ side).
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
from agents_proxy import RecordingProxy

# LiteLLM fetches its model price map from GitHub at import unless told to use the copy it ships.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm", reason="litellm is installed by the test extra (pip install -e '.[test]')")

pytestmark = [pytest.mark.integration, pytest.mark.server]

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1,
                                                                           "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                                 "parameters": WEATHER_SCHEMA}}
SIDES = {
    # provider prefix -> (base URL suffix, the route the server must have seen)
    "anthropic": ("", "/v1/messages"),
    "openai": ("/v1", "/v1/chat/completions"),
}


def _call(proxy: RecordingProxy, server, provider: str, **kwargs):
    suffix, _ = SIDES[provider]
    return litellm.completion(model=f"{provider}/{server.served_model_name}", api_base=proxy.url + suffix,
                              api_key=server.api_key, messages=[{"role": "user", "content": "Hello"}],
                              temperature=0, timeout=300, num_retries=0, **kwargs)


@pytest.mark.parametrize("provider", sorted(SIDES))
def test_litellm_plain_turn_reaches_the_documented_route(agents_server, provider):
    with RecordingProxy(agents_server.base_url) as proxy:
        response = _call(proxy, agents_server, provider, max_tokens=8)
    route = SIDES[provider][1]
    assert [(e.method, e.path, e.status) for e in proxy.exchanges] == [("POST", route, 200)], proxy.summary()
    assert isinstance(response.choices[0].message.content, str)
    assert response.usage.completion_tokens == 8


@pytest.mark.parametrize("provider", sorted(SIDES))
def test_litellm_forced_tool_call_validates_against_its_schema(agents_server, provider):
    with RecordingProxy(agents_server.base_url) as proxy:
        response = _call(proxy, agents_server, provider, max_tokens=256, tools=[WEATHER_TOOL],
                         tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert [e.status for e in proxy.exchanges] == [200], proxy.summary()
    sent = proxy.exchanges[0].body
    if provider == "anthropic":  # LiteLLM's translation, as the server received it
        assert sent["tool_choice"] == {"type": "tool", "name": "get_weather"}, sent["tool_choice"]
    (call,) = response.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)
