"""Load and bad input against the server `hyperqwen serve` starts (SmolLM2-135M-Instruct, float32, CPU)."""

from __future__ import annotations

import asyncio

import openai
import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.server]

def assert_still_serving(server):
    assert requests.get(f"{server.base_url}/health", timeout=10).status_code == 200
    response = server.openai().chat.completions.create(
        model=server.served_model_name, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30, temperature=0,
    )
    assert "Paris" in response.choices[0].message.content


# --- load ----------------------------------------------------------------------------------------------


def test_16_concurrent_streams_all_complete(smol_server):
    async def one_stream(client, i: int) -> tuple[int, str, str | None, int]:
        text, finish, chunks = [], None, 0
        stream = await client.chat.completions.create(
            model=smol_server.served_model_name,
            messages=[{"role": "user", "content": f"Count from {i} to {i + 5}."}],
            max_tokens=24, temperature=0, stream=True,
        )
        async for chunk in stream:
            chunks += 1
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        return i, "".join(text), finish, chunks

    async def run_all():
        client = smol_server.async_openai()
        try:
            return await asyncio.gather(*(one_stream(client, i) for i in range(16)))
        finally:
            await client.close()

    results = asyncio.run(run_all())
    assert sorted(r[0] for r in results) == list(range(16))
    for i, text, finish, chunks in results:
        assert text, f"stream {i} returned no text"
        assert finish in ("stop", "length"), (i, finish)
        assert chunks > 2, (i, chunks)
    assert_still_serving(smol_server)


def test_100_sequential_requests_all_complete(smol_server):
    client = smol_server.openai()
    answers = []
    for i in range(100):
        response = client.completions.create(
            model=smol_server.served_model_name, prompt=f"{i} + 1 =", max_tokens=3, temperature=0
        )
        answers.append(response.choices[0])
    assert len(answers) == 100
    assert all(choice.finish_reason in ("stop", "length") for choice in answers)
    assert all(choice.text is not None for choice in answers)
    assert_still_serving(smol_server)


# --- bad input -----------------------------------------------------------------------------------------


def _post(server, path: str, **kwargs) -> requests.Response:
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    return requests.post(f"{server.base_url}{path}", headers=headers, timeout=60, **kwargs)


def _error_message(response: requests.Response) -> str:
    body = response.json()
    error = body.get("error", body)
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(body.get("detail") or error)


def test_malformed_json_is_400(smol_server):
    response = _post(smol_server, "/v1/chat/completions", data=b'{"model": "qwen3.8-27b", "messages": [')
    assert 400 <= response.status_code < 500, response.text
    assert "json" in response.text.lower(), response.text
    assert_still_serving(smol_server)


def test_unknown_model_is_404_naming_the_model(smol_server):
    with pytest.raises(openai.NotFoundError) as caught:
        smol_server.openai().chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert "no-such-model" in str(caught.value)
    assert_still_serving(smol_server)


@pytest.mark.needs_patch("0020-max-tokens-clamp-to-context.patch")
def test_max_tokens_beyond_context_is_clamped_not_refused(smol_server):
    """Agents ask for more output than the context holds (Claude Code: 32,000); the server fills the room left
    and reports a length stop instead of a 400 (patch 0020)."""
    max_len = int(smol_server.knobs["MAX_LEN"])
    reply = smol_server.openai().chat.completions.create(
        model=smol_server.served_model_name, messages=[{"role": "user", "content": "Hi"}],
        max_tokens=max_len * 4, temperature=0, extra_body={"min_tokens": 0},
    )
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= max_len
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert_still_serving(smol_server)


def test_prompt_beyond_context_is_400_naming_the_limit(smol_server):
    max_len = int(smol_server.knobs["MAX_LEN"])
    with pytest.raises(openai.BadRequestError) as caught:
        smol_server.openai().chat.completions.create(
            model=smol_server.served_model_name, messages=[{"role": "user", "content": "word " * (max_len + 64)}],
            max_tokens=8,
        )
    assert str(max_len) in str(caught.value), str(caught.value)
    assert_still_serving(smol_server)


def test_empty_message_list_is_4xx(smol_server):
    response = _post(smol_server, "/v1/chat/completions",
                     json={"model": smol_server.served_model_name, "messages": [], "max_tokens": 2})
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert _error_message(response), response.text
    assert_still_serving(smol_server)


# --- one-token prompts on a Gated-DeltaNet model (patch 0012) ------------------------------------------------


@pytest.mark.needs_patch("0012-gdn-conv1d-one-token-prefill-cpu.patch")
@pytest.mark.parametrize("fixture", ["tiny_qwen_prefix_server", "tiny_qwen_mtp_server"])
def test_one_token_prompt_keeps_engine_alive(fixture, request):
    """A one-token prefill made vLLM 0.32.0's CPU GDN conv kernel raise "expect x to be transposed" and the
    engine died (every later request 500, /health red), with prefix caching on (tiny_qwen_prefix_server) and
    with SPEC=mtp (tiny_qwen_mtp_server). Both reuse the session's servers: no new server for this test."""
    server = request.getfixturevalue(fixture)
    headers = {"Authorization": f"Bearer {server.api_key}"}
    one_token = requests.post(f"{server.base_url}/tokenize", json={"model": server.served_model_name, "prompt": "hi"},
                              headers=headers, timeout=60).json()["tokens"][:1]
    for body in ({"prompt": "hi"}, {"prompt": one_token}):
        response = requests.post(f"{server.v1_url}/completions", headers=headers, timeout=300,
                                 json={"model": server.served_model_name, "max_tokens": 2, "temperature": 0, **body})
        assert response.status_code == 200, response.text[:500]
    chat = requests.post(f"{server.v1_url}/chat/completions", headers=headers, timeout=300, json={
        "model": server.served_model_name, "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 2, "temperature": 0, "truncate_prompt_tokens": 1})
    assert chat.status_code in (200, 400), chat.text[:500]  # a 400 (truncation refused) is fine; a dead engine not
    assert requests.get(f"{server.base_url}/health", timeout=10).status_code == 200
    normal = requests.post(f"{server.v1_url}/completions", headers=headers, timeout=300, json={
        "model": server.served_model_name, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert normal.status_code == 200 and normal.json()["choices"][0]["text"] is not None
    assert "expect x to be transposed" not in server.log_text()
