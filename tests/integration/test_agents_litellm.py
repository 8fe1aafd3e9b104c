"""LiteLLM (the SDK, as a proxy would use it) against the CPU server, with the configuration docs/agents.md gives:
`anthropic/MODEL` with the base URL *without* `/v1` (LiteLLM appends `/v1/messages`), and `openai/MODEL` with
`/v1`. Requests go through the recording proxy so the test sees which route each one reached. Each side: one
plain turn and one forced tool call whose arguments must validate against the tool's schema (LiteLLM translates
the OpenAI-style tool and tool_choice into the Anthropic shape on the anthropic/ side).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import jsonschema
import pytest
import requests
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


# ---------------------------------------------------------------------------------------------------------
# The LiteLLM proxy server (requirements/python-clis.txt: its own virtualenv under .venv-clients/litellm), started
# with the config.yaml docs/agents.md gives, in front of the server; clients speak to the proxy with its own key.

PROXY_MASTER_KEY = "sk-litellm-proxy-test-0123456789"


def proxy_config(tmp_path, upstream: str) -> Path:
    """docs/agents.md's config.yaml, pointed at the recording proxy, plus the proxy's own key."""
    path = tmp_path / "litellm.yaml"
    path.write_text(
        "model_list:\n  - model_name: qwen3.8-27b\n"
        f"    litellm_params: {{model: openai/qwen3.8-27b, api_base: \"{upstream}/v1\", "
        "api_key: os.environ/HYPERQWEN_API_KEY}\n"
        f"general_settings:\n  master_key: {PROXY_MASTER_KEY}\n"
    )
    return path


@contextmanager
def litellm_proxy(tmp_path, upstream: str, api_key: str):
    """The proxy process on a free loopback port; yields (base URL, off-host peers seen so far)."""
    from netwatch import Watching
    from test_agents_clients import python_cli

    binary = python_cli("litellm", "litellm")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HYPERQWEN_API_KEY": api_key,
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    log = tmp_path / "litellm.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(binary), "--config", str(proxy_config(tmp_path, upstream)), "--host",
                                    "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                                   env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with Watching(process) as peers:
            deadline = time.monotonic() + PROXY_START_TIMEOUT_S
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    if requests.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.5)
            else:
                pytest.fail(f"the LiteLLM proxy did not start: {log.read_text(errors='replace')[-3000:]}")
            yield url, peers
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


PROXY_START_TIMEOUT_S = 180


def test_litellm_proxy_with_the_documented_config_serves_both_apis(agents_server, tmp_path):
    """The proxy itself: OpenAI chat and Anthropic Messages clients on its side, the server's chat route behind
    it, every answer 200, and nothing off the machine (its price map and telemetry stay local)."""
    import anthropic
    import openai
    from test_agents_clients import PINNED_REPLY, REPLY

    with RecordingProxy(agents_server.base_url) as upstream, \
            litellm_proxy(tmp_path, upstream.url, agents_server.api_key) as (url, peers):
        chat = openai.OpenAI(base_url=f"{url}/v1", api_key=PROXY_MASTER_KEY, max_retries=0, timeout=300)
        answer = chat.chat.completions.create(
            model="qwen3.8-27b", messages=[{"role": "user", "content": "Say hello."}], max_tokens=32, temperature=0,
            **{k: v for k, v in PINNED_REPLY["/v1/chat/completions"].items() if k != "tool_choice"})
        assert json.loads(answer.choices[0].message.content) == REPLY and answer.choices[0].finish_reason == "stop"
        messages = anthropic.Anthropic(base_url=url, api_key=PROXY_MASTER_KEY, max_retries=0, timeout=300)
        reply = messages.messages.create(model="qwen3.8-27b", max_tokens=8,
                                         messages=[{"role": "user", "content": "Say hello."}])
        assert reply.type == "message" and reply.stop_reason == "max_tokens" and reply.content[0].type == "text"
        # Without a database the proxy knows only its master key; any other key is refused (400 "No connected db.").
        with pytest.raises(openai.APIStatusError) as refused:
            openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).models.list()
        assert refused.value.status_code in (400, 401), refused.value
    routes = [(e.method, e.path, e.status) for e in upstream.exchanges if e.method == "POST"]
    # LiteLLM's Messages-to-OpenAI bridge calls the Responses API, whose max_output_tokens it raises to 16.
    assert routes == [("POST", "/v1/chat/completions", 200), ("POST", "/v1/responses", 200)], upstream.summary()
    assert upstream.exchanges[-1].body["max_output_tokens"] == 16 and reply.usage.output_tokens == 16
    assert not peers, peers
