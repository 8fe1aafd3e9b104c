"""Structured JSON output ends when the JSON ends, on every API, through the real openai and anthropic SDKs.

With vLLM 0.32.0's own grammar settings (backend auto, whitespace allowed between JSON tokens) a JSON-schema
reply could stop after `{"answer"` and pad with whitespace until max_tokens. `hyperqwen serve` passes
STRUCTURED_OUTPUT (default xgrammar-compact: xgrammar, no whitespace outside strings), so the reply closes its
object and the model must end the turn: a parseable object and a `stop` / `end_turn` finish, in a small part of
max_tokens. SmolLM2-135M-Instruct (float32, CPU; smol_server) answers.
"""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import pydantic
import pytest

from hyperqwen.launch.command import argv_value

pytestmark = [pytest.mark.integration, pytest.mark.server]

MAX_TOKENS = 200
# A compact answer is ~15 tokens; a whitespace-padded one hits MAX_TOKENS.
WELL_BEFORE = MAX_TOKENS // 4
QUESTION = "What is the capital of France? Answer in JSON."
MESSAGES = [{"role": "user", "content": QUESTION}]


class Capital(pydantic.BaseModel):
    answer: Literal["Paris", "London", "Berlin", "Madrid"]
    sure: bool


SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["Paris", "London", "Berlin", "Madrid"]},
                   "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "capital", "schema": SCHEMA, "strict": True}}


def _check(text: str) -> dict:
    value = json.loads(text)
    Capital.model_validate(value)
    return value


def test_server_passes_the_compact_grammar_by_default(smol_server):
    args = smol_server.planned_vllm_args()
    assert argv_value(args, "--structured-outputs-config.disable_any_whitespace") == "true", args
    assert argv_value(args, "--structured-outputs-config.backend") == "xgrammar", args


def test_chat_parse_returns_the_object_and_stops(smol_server):
    completion = smol_server.openai().chat.completions.parse(
        model=smol_server.served_model_name, messages=MESSAGES, response_format=Capital, max_tokens=MAX_TOKENS,
        temperature=0)
    choice = completion.choices[0]
    assert isinstance(choice.message.parsed, Capital), choice.message
    assert choice.finish_reason == "stop", choice
    assert completion.usage.completion_tokens < WELL_BEFORE, completion.usage


def test_chat_stream_with_json_schema_stops(smol_server):
    pieces, finish, usage = [], None, None
    for chunk in smol_server.openai().chat.completions.create(
            model=smol_server.served_model_name, messages=MESSAGES, response_format=RESPONSE_FORMAT,
            max_tokens=MAX_TOKENS, temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    _check("".join(pieces))
    assert finish == "stop"
    assert usage.completion_tokens < WELL_BEFORE, usage


def test_chat_json_object_stops(smol_server):
    """json_object has no schema: any object; compact JSON still ends when it closes."""
    completion = smol_server.openai().chat.completions.create(
        model=smol_server.served_model_name, messages=MESSAGES, response_format={"type": "json_object"},
        max_tokens=MAX_TOKENS, temperature=0)
    choice = completion.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict), choice.message.content
    # A 135M model may write a long object; what must not happen is whitespace padding.
    assert "\n\n" not in choice.message.content, choice.message.content


@pytest.mark.needs_patch("0029-completions-grammar-from-first-token.patch")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_with_json_schema_stop(smol_server, stream):
    client = smol_server.openai()
    kwargs = dict(model=smol_server.served_model_name, prompt=QUESTION + "\n", max_tokens=MAX_TOKENS,
                  temperature=0, extra_body={"response_format": RESPONSE_FORMAT})
    if stream:
        pieces, finish = [], None
        for chunk in client.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                pieces.append(choice.text)
                finish = choice.finish_reason or finish
        text = "".join(pieces)
    else:
        completion = client.completions.create(**kwargs)
        text, finish = completion.choices[0].text, completion.choices[0].finish_reason
        assert completion.usage.completion_tokens < WELL_BEFORE, completion.usage
    _check(text)
    assert finish == "stop"


def test_responses_parse_with_text_format_completes(smol_server):
    response = smol_server.openai().responses.parse(
        model=smol_server.served_model_name, input=QUESTION, text_format=Capital, max_output_tokens=MAX_TOKENS,
        temperature=0)
    assert isinstance(response.output_parsed, Capital), response.output
    assert response.status == "completed", response
    assert response.usage.output_tokens < WELL_BEFORE, response.usage


def test_responses_stream_with_text_format_completes(smol_server):
    text_format = {"format": {"type": "json_schema", "name": "capital", "schema": SCHEMA, "strict": True}}
    final = None
    with smol_server.openai().responses.stream(
            model=smol_server.served_model_name, input=QUESTION, text=text_format, max_output_tokens=MAX_TOKENS,
            temperature=0) as stream:
        for _event in stream:
            pass
        final = stream.get_final_response()
    _check(final.output_text)
    assert final.status == "completed", final
    assert final.usage.output_tokens < WELL_BEFORE, final.usage


def _anthropic(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=120)


OUTPUT_CONFIG = {"format": {"type": "json_schema", "schema": SCHEMA}}


def test_messages_output_config_format_ends_the_turn(smol_server):
    message = _anthropic(smol_server).messages.create(
        model=smol_server.served_model_name, max_tokens=MAX_TOKENS, messages=MESSAGES,
        extra_body={"output_config": OUTPUT_CONFIG, "temperature": 0})
    _check("".join(block.text for block in message.content if block.type == "text"))
    assert message.stop_reason == "end_turn", message
    assert message.usage.output_tokens < WELL_BEFORE, message.usage


def test_messages_stream_output_config_format_ends_the_turn(smol_server):
    with _anthropic(smol_server).messages.stream(
            model=smol_server.served_model_name, max_tokens=MAX_TOKENS, messages=MESSAGES,
            extra_body={"output_config": OUTPUT_CONFIG, "temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    _check(text)
    assert final.stop_reason == "end_turn", final
    assert final.usage.output_tokens < WELL_BEFORE, final.usage


def test_llm_cli_schema_answer_is_the_object_alone(smol_server, tmp_path):
    """`llm --schema` (Simon Willison's llm, its own virtualenv: requirements/python-clis.txt) with the
    configuration docs/agents.md gives: one JSON object and the end of the reply (stock settings: hundreds of blank
    lines), over loopback only."""
    import os
    from pathlib import Path

    from netwatch import run_watched

    root = Path(os.environ.get("HYPERQWEN_PYTHON_CLIS", Path(__file__).resolve().parents[2] / ".venv-clients"))
    binary = root / "llm" / "bin" / "llm"
    if not binary.exists():
        pytest.skip(f"llm is not installed under {root / 'llm'}: python3 scripts/test.py installs it")
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: hyperqwen\n  model_name: {smol_server.served_model_name}\n  api_base: {smol_server.v1_url}\n"
        "  api_key_name: hyperqwen\n  supports_schema: true\n  supports_tools: true\n")
    (home / "keys.json").write_text(json.dumps({"hyperqwen": smol_server.api_key}))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LLM_USER_PATH": str(home)}
    result, peers = run_watched([str(binary), "-m", "hyperqwen", "--schema", json.dumps(SCHEMA), "-o", "temperature",
                                 "0", "-o", "max_tokens", str(MAX_TOKENS), QUESTION], env, tmp_path, 300)
    assert result.returncode == 0, result.stderr
    _check(result.stdout)
    assert result.stdout.strip().count("\n") == 0, result.stdout
    assert not peers, peers
