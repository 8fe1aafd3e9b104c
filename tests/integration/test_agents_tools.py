"""Forced tool calls are valid by construction, on every route an agent uses (tiny random-weight Qwen3.5 model).

`hyperqwen serve` passes `--tool-strict-level parameter` with the tool parser (launch/command.py): under a forced
`tool_choice` (named or required) vLLM 0.32.0 then holds the whole call, arguments included, to the tool's JSON
schema with an xgrammar structural tag (vllm/tool_parsers/structural_tag_registry.py). Two patches close the gaps
that a random-weight model finds at once (patches/LEDGER.md):
- 0021 bounds whitespace runs in that grammar (unbounded, a call spent its whole max_tokens on blank lines and
  came back as `{}` with finish_reason "length"), and makes the Qwen3 argument parser trim the one whitespace
  character the grammar allows around a value (else an enum value arrived as "fahrenheit\\t").

The weights are random, so whatever the call holds comes from the grammar, not from the model knowing the format:
if every call over many seeds parses and validates, the constraint holds.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.server]

SEEDS = range(4)
# Temperature 1.5 (not greedy) so the seeds give different calls; max_tokens generous for the tiny schemas.
SAMPLING = {"temperature": 1.5, "max_tokens": 400}

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
LIST_FILES = {"name": "list_files", "description": "List the files (no arguments)",
              "parameters": {"type": "object", "properties": {}}}
EDIT = {
    "name": "edit_file",
    "description": "Apply edits to a file",
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string", "maxLength": 30},
            "edits": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {"old": {"type": "string", "maxLength": 12},
                                   "new": {"type": "string", "maxLength": 12}},
                    "required": ["old", "new"],
                    "additionalProperties": False,
                },
            },
            "dry_run": {"type": "boolean"},
        },
        "required": ["path", "edits"],
        "additionalProperties": False,
    },
}
FUNCTIONS = [WEATHER, LIST_FILES, EDIT]
SCHEMAS = {f["name"]: f["parameters"] for f in FUNCTIONS}
CHAT_TOOLS = [{"type": "function", "function": f} for f in FUNCTIONS]
MESSAGES_TOOLS = [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
                  for f in FUNCTIONS]
RESPONSES_TOOLS = [{"type": "function", **f} for f in FUNCTIONS]
ASK = "Use a tool."


def _check_calls(calls: list[tuple[str, object]], forced: str | None, context: str) -> None:
    """Every call names a known tool (the forced one if named) and its arguments validate against its schema."""
    assert calls, f"{context}: no tool call"
    for name, arguments in calls:
        if forced is not None:
            assert name == forced, f"{context}: called {name!r}, forced {forced!r}"
        assert name in SCHEMAS, f"{context}: unknown tool {name!r}"
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        try:
            jsonschema.validate(parsed, SCHEMAS[name])
        except jsonschema.ValidationError as exc:
            raise AssertionError(f"{context}: {name}({parsed!r}) violates its schema: {exc.message}") from exc
        if name == "list_files":
            assert parsed == {}, f"{context}: the parameterless tool got {parsed!r}"


CHOICES = [pytest.param(f["name"], id=f["name"]) for f in FUNCTIONS] + [pytest.param(None, id="required")]


def _chat_calls(client, model: str, forced: str | None, seed: int, stream: bool) -> tuple[list, str | None]:
    tool_choice = {"type": "function", "function": {"name": forced}} if forced else "required"
    kwargs = dict(model=model, messages=[{"role": "user", "content": ASK}], tools=CHAT_TOOLS,
                  tool_choice=tool_choice, seed=seed, **SAMPLING)
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []], choice.finish_reason
    parts: dict[int, list[str]] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = parts.setdefault(delta.index, ["", ""])
            if delta.function and delta.function.name:
                entry[0] += delta.function.name
            if delta.function and delta.function.arguments:
                entry[1] += delta.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    return [(name, args) for _, (name, args) in sorted(parts.items())], finish


@pytest.mark.needs_patch("0021-tool-call-grammar-bounded-whitespace.patch")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("forced", CHOICES)
def test_chat_forced_tool_calls_validate_over_seeds(tiny_qwen_prefix_server, forced, stream):
    client = tiny_qwen_prefix_server.openai()
    for seed in SEEDS:
        calls, finish = _chat_calls(client, tiny_qwen_prefix_server.served_model_name, forced, seed, stream)
        _check_calls(calls, forced, f"chat stream={stream} seed={seed}")
        # Named: "stop", as OpenAI answers a forced named call. Required: "tool_calls", or "length": after a call the
        # grammar allows more calls or text until the model stops, which random weights never do (the calls made
        # are still whole).
        expected = ("tool_calls", "length") if forced is None else ("stop", "tool_calls")
        assert finish in expected, f"seed {seed}: finish_reason {finish!r}"


def _anthropic(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=120)


@pytest.mark.needs_patch("0021-tool-call-grammar-bounded-whitespace.patch")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("forced", CHOICES)
def test_messages_forced_tool_use_validates_over_seeds(tiny_qwen_prefix_server, forced, stream):
    """`tool_choice: {type: "tool"}` and `{type: "any"}` on /v1/messages."""
    client = _anthropic(tiny_qwen_prefix_server)
    tool_choice = {"type": "tool", "name": forced} if forced else {"type": "any"}
    for seed in SEEDS:
        kwargs = dict(model=tiny_qwen_prefix_server.served_model_name, max_tokens=SAMPLING["max_tokens"],
                      messages=[{"role": "user", "content": ASK}], tools=MESSAGES_TOOLS, tool_choice=tool_choice,
                      extra_body={"temperature": SAMPLING["temperature"], "seed": seed})
        if stream:
            with client.messages.stream(**kwargs) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(**kwargs)
        calls = [(block.name, block.input) for block in message.content if block.type == "tool_use"]
        _check_calls(calls, forced, f"messages stream={stream} seed={seed}")
        assert message.stop_reason == "tool_use" or (forced is None and message.stop_reason == "max_tokens"), (
            f"seed {seed}: {message.stop_reason!r}")


@pytest.mark.needs_patch("0021-tool-call-grammar-bounded-whitespace.patch")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("forced", CHOICES)
def test_responses_forced_function_call_validates_over_seeds(tiny_qwen_prefix_server, forced, stream):
    client = tiny_qwen_prefix_server.openai()
    tool_choice = {"type": "function", "name": forced} if forced else "required"
    for seed in SEEDS:
        kwargs = dict(model=tiny_qwen_prefix_server.served_model_name, input=ASK, tools=RESPONSES_TOOLS,
                      tool_choice=tool_choice, temperature=SAMPLING["temperature"],
                      max_output_tokens=SAMPLING["max_tokens"], extra_body={"seed": seed})
        if stream:
            response = None
            for event in client.responses.create(stream=True, **kwargs):
                if event.type == "response.completed":
                    response = event.response
            assert response is not None, "no response.completed event"
        else:
            response = client.responses.create(**kwargs)
        calls = [(item.name, item.arguments) for item in response.output if item.type == "function_call"]
        _check_calls(calls, forced, f"responses stream={stream} seed={seed}")


@pytest.mark.needs_patch("0023-client-effort-thinking-gate.patch")
def test_client_effort_does_not_switch_thinking_by_default(tiny_qwen_prefix_server):
    """CLIENT_THINKING is off by default: an effort (Claude Code sends `high` on every request, Codex `medium`)
    leaves THINKING (off here) in charge; an explicit chat_template_kwargs still switches it. Seen in the prompt:
    the tiny model's template closes an empty think block when thinking is off, so the prompt is longer."""
    server = tiny_qwen_prefix_server
    client = server.openai()
    messages = [{"role": "user", "content": "Hi there."}]

    def chat_prompt_tokens(**extra) -> int:
        return client.chat.completions.create(model=server.served_model_name, messages=messages, max_tokens=1,
                                              **extra).usage.prompt_tokens

    off = chat_prompt_tokens()
    assert chat_prompt_tokens(reasoning_effort="high") == off
    assert chat_prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": True}}) < off

    def responses_input_tokens(**extra) -> int:
        return client.responses.create(model=server.served_model_name, input="Hi there.", max_output_tokens=16,
                                       **extra).usage.input_tokens

    assert responses_input_tokens(reasoning={"effort": "high"}) == responses_input_tokens()

    messages_client = _anthropic(server)

    def messages_input_tokens(**extra) -> int:
        usage = messages_client.messages.create(model=server.served_model_name, max_tokens=1,
                                                messages=messages, **extra).usage
        return usage.input_tokens + (usage.cache_read_input_tokens or 0)

    claude_code_like = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}
    assert messages_input_tokens(extra_body=claude_code_like) == messages_input_tokens() == off
