"""Load and bad input against the server `hyperqwen serve` starts (SmolLM2-135M-Instruct, float32, CPU)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time

import openai
import pytest
import requests

from hyperqwen.config.knobs import KNOBS_BY_NAME

pytestmark = [pytest.mark.integration, pytest.mark.server]

# The MAX_HEADER_BYTES and MAX_BODY_BYTES defaults (the test servers keep them).
DEFAULT_MAX_HEADER_BYTES = int(KNOBS_BY_NAME["MAX_HEADER_BYTES"].default)
DEFAULT_MAX_BODY_BYTES = int(KNOBS_BY_NAME["MAX_BODY_BYTES"].default)

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
# --- hostile bodies (patch 0016) and limits before work (patch 0017) ------------------------------------

TRACEBACK_MARKERS = ("Traceback (most recent call last)", "Exception in ASGI application")


def _new_log(server, offset: int) -> str:
    time.sleep(0.5)  # the log line of the answer just sent is written after the response
    return server.log_text()[offset:]


def _assert_no_traceback_since(server, offset: int) -> None:
    new = _new_log(server, offset)
    assert not [m for m in TRACEBACK_MARKERS if m in new], new[-4000:]


def _nested(depth: int, leaf: object) -> object:
    """A JSON value `depth` objects deep with `leaf` at the bottom."""
    value = leaf
    for _ in range(depth):
        value = {"k": value}
    return value


def _chat(server, **extra) -> dict:
    return {"model": server.served_model_name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            **extra}


def _completion(server, **extra) -> dict:
    return {"model": server.served_model_name, "prompt": "Hi", "max_tokens": 4, **extra}


def _messages(server, **extra) -> dict:
    return {"model": server.served_model_name, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
            **extra}


SELF_REF_SCHEMA = {"type": "json_schema", "json_schema": {"name": "loop", "schema": {"$ref": "#"}}}
REF_CYCLE_SCHEMA = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
                    "$ref": "#/$defs/a"}
# Every object must hold another: no finite JSON text matches it.
ENDLESS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "endless", "schema": {
    "type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}}}

# (id, path, body builder, words the error message must hold). Each was a 500 with a traceback, or minutes of
# work, before patch 0016; a 4xx naming the field now.
HOSTILE_BODIES = [
    ("structured-outputs-string", "/v1/chat/completions",
     lambda s: _chat(s, structured_outputs="json"), ["structured_outputs", "string"]),
    ("structured-outputs-array", "/v1/completions",
     lambda s: _completion(s, structured_outputs=["json"]), ["structured_outputs", "array"]),
    ("top-k-2**64", "/v1/chat/completions", lambda s: _chat(s, top_k=2**64), ["top_k", "2**63"]),
    ("top-k-minus-2**70", "/v1/completions", lambda s: _completion(s, top_k=-(2**70)), ["top_k"]),
    ("thinking-token-budget-2**64", "/v1/chat/completions",
     lambda s: _chat(s, thinking_token_budget=2**64), ["thinking_token_budget"]),
    ("stream-interval-2**64", "/v1/chat/completions",
     lambda s: _chat(s, stream_interval=2**64, stream=True), ["stream_interval"]),
    ("messages-top-k-2**64", "/v1/messages", lambda s: _messages(s, top_k=2**64), ["top_k"]),
    ("beam-length-penalty-minus-1e308", "/v1/chat/completions",
     lambda s: _chat(s, use_beam_search=True, n=2, length_penalty=-1e308), ["length_penalty", "32"]),
    ("beam-length-penalty-1e308", "/v1/completions",
     lambda s: _completion(s, use_beam_search=True, n=2, length_penalty=1e308), ["length_penalty"]),
    ("schema-ref-to-itself", "/v1/chat/completions", lambda s: _chat(s, response_format=SELF_REF_SCHEMA),
     ["$ref", "'#'"]),
    ("schema-ref-cycle-through-defs", "/v1/completions",
     lambda s: _completion(s, structured_outputs={"json": REF_CYCLE_SCHEMA}), ["$ref", "#/$defs/a"]),
    ("schema-never-finishes", "/v1/chat/completions", lambda s: _chat(s, response_format=ENDLESS_SCHEMA), []),
    ("grammar-never-finishes", "/v1/completions",
     lambda s: _completion(s, structured_outputs={"grammar": 'root ::= "a" root'}), []),
    ("temperature-nan", "/v1/chat/completions",
     lambda s: _chat(s, temperature=float("nan")), ["temperature", "finite"]),
    ("repetition-penalty-infinity", "/v1/completions",
     lambda s: _completion(s, repetition_penalty=float("inf")), ["repetition_penalty", "finite"]),
    ("surrogate-100-deep-chat", "/v1/chat/completions",
     lambda s: _chat(s, messages=[{"role": "user", "content": [
         {"type": "text", "text": "Hi", "meta": _nested(100, "\ud800")}]}]),
     ["messages[0].content[0].meta.k", "U+D800"]),
    ("surrogate-100-deep-messages", "/v1/messages",
     lambda s: _messages(s, metadata=_nested(100, "x\udc00")), ["metadata.k", "U+DC00"]),
    ("surrogate-600-deep-chat", "/v1/chat/completions",
     lambda s: _chat(s, chat_template_kwargs=_nested(600, "\ud800")), ["chat_template_kwargs", "U+D800"]),
    # Deeper than Python's json module nests (its recursion limit): written by hand, refused while parsing.
    ("surrogate-5000-deep-chat", "/v1/chat/completions",
     lambda s: json.dumps(_chat(s)).replace('"Hi"', '{"k": ' * 5000 + '"\\ud800"' + "}" * 5000).encode(), []),
]


@pytest.mark.needs_patch("0016-request-values-validated.patch")
@pytest.mark.parametrize(("path", "build", "words"), [case[1:] for case in HOSTILE_BODIES],
                         ids=[case[0] for case in HOSTILE_BODIES])
def test_hostile_body_is_4xx_naming_the_field(smol_server, path, build, words):
    offset = len(smol_server.log_text())
    started = time.monotonic()
    # json.dumps writes a lone surrogate as the escape "\ud800", as a hostile client would send it.
    body = build(smol_server)
    response = _post(smol_server, path, data=body if isinstance(body, bytes) else json.dumps(body).encode())
    elapsed = time.monotonic() - started
    if words:
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:2000])
        message = _error_message(response)
        for word in words:
            assert word in message, (word, message)
    elif response.status_code == 200:
        # A schema that no finite text matches may still be served: it ends at max_tokens, never hangs.
        body = response.json()
        assert body["choices"][0]["finish_reason"] == "length", body
    else:
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:2000])
        assert _error_message(response), response.text
    assert elapsed < 60, f"{elapsed:.0f} s for a request that should be refused or cut at max_tokens"
    _assert_no_traceback_since(smol_server, offset)


@pytest.mark.needs_patch("0017-request-size-limits.patch")
@pytest.mark.parametrize("with_key", [True, False], ids=["with-key", "without-key"])
def test_websocket_to_metrics_is_refused_without_traceback(smol_server, with_key):
    """Prometheus's ASGI app under /metrics takes HTTP only; a WebSocket handshake there is closed before
    accept (403) whether the key is sent (as with METRICS_PUBLIC=true, when the key check lets it through)
    or not."""
    websockets = pytest.importorskip("websockets.sync.client")
    url = smol_server.base_url.replace("http://", "ws://") + "/metrics"
    headers = {"Authorization": f"Bearer {smol_server.api_key}"} if with_key else None
    offset = len(smol_server.log_text())
    with pytest.raises(Exception) as refused:  # websockets raises InvalidStatus for a refused handshake
        websockets.connect(url, additional_headers=headers, open_timeout=30).close()
    assert "403" in str(refused.value)
    _assert_no_traceback_since(smol_server, offset)
    assert_still_serving(smol_server)


def _raw_head_status(server, head: bytes) -> bytes:
    """Send a request head as raw bytes; the status line of the answer."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        try:
            sock.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading the rest
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while b"\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
    return answer.split(b"\r\n", 1)[0]


def _head_of_size(size: int) -> bytes:
    start = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Pad: "
    end = b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


@pytest.mark.needs_patch("0017-request-size-limits.patch")
def test_request_head_size_edges(smol_server):
    """A head of exactly MAX_HEADER_BYTES reaches the key check (401); one byte more is 431, before the key
    check; a 16 MiB head is cut off long before it is all read."""
    limit = DEFAULT_MAX_HEADER_BYTES
    assert _raw_head_status(smol_server, _head_of_size(limit)).startswith(b"HTTP/1.1 401"), "just under"
    assert _raw_head_status(smol_server, _head_of_size(limit + 1)).startswith(b"HTTP/1.1 431"), "just over"
    started = time.monotonic()
    assert _raw_head_status(smol_server, _head_of_size(16 * 1024**2)).startswith(b"HTTP/1.1 431")
    assert time.monotonic() - started < 10
    assert_still_serving(smol_server)


@pytest.mark.needs_patch("0017-request-size-limits.patch")
def test_request_body_size_edges(smol_server):
    """MAX_BODY_BYTES: a body of exactly the limit is read and answered; one byte more is 413 before the key is
    checked (no key sent) or the JSON parsed; a chunked upload is cut off once it passes the limit."""
    limit = DEFAULT_MAX_BODY_BYTES
    url = f"{smol_server.base_url}/v1/chat/completions"
    over = b" " * (limit + 1)
    refused = requests.post(url, data=over, headers={"Content-Type": "application/json"}, timeout=120)
    assert refused.status_code == 413, refused.text[:500]
    assert "MAX_BODY_BYTES" in _error_message(refused) and str(limit) in _error_message(refused)
    unauthenticated = requests.post(url, data=b" " * limit, headers={"Content-Type": "application/json"},
                                    timeout=120)
    assert unauthenticated.status_code == 401, "a body at the limit reaches the key check"

    body = _chat(smol_server, max_tokens=1)
    body["padding"] = ""
    padding = limit - len(json.dumps(body).encode())
    body["padding"] = "a" * padding
    exact = json.dumps(body).encode()
    assert len(exact) == limit
    answered = _post(smol_server, "/v1/chat/completions", data=exact)
    assert answered.status_code == 200, answered.text[:500]

    def chunks():
        piece = b" " * (1024 * 1024)
        for _ in range(limit // len(piece) + 2):
            yield piece

    offset = len(smol_server.log_text())
    chunked = _post(smol_server, "/v1/chat/completions", data=chunks())
    assert chunked.status_code == 413, chunked.text[:500]
    _assert_no_traceback_since(smol_server, offset)
    assert_still_serving(smol_server)


@pytest.mark.needs_patch("0017-request-size-limits.patch")
def test_tokenize_is_bounded_by_the_context(smol_server):
    max_len = int(smol_server.knobs["MAX_LEN"])
    ok = _post(smol_server, "/tokenize", json={"model": smol_server.served_model_name, "prompt": "Hello there"})
    assert ok.status_code == 200 and ok.json()["count"] > 0, ok.text
    started = time.monotonic()
    big = _post(smol_server, "/tokenize", json={"model": smol_server.served_model_name, "prompt": "word " * 800_000})
    assert time.monotonic() - started < 10
    assert big.status_code == 400, big.text[:500]
    assert str(max_len) in _error_message(big), big.text[:500]
    chat = _post(smol_server, "/tokenize", json={"model": smol_server.served_model_name,
                                                 "messages": [{"role": "user", "content": "word " * (max_len + 64)}]})
    assert chat.status_code == 400 and str(max_len) in _error_message(chat), chat.text[:500]


# --- a seeded fuzz of bodies ----------------------------------------------------------------------------

FUZZ_SECONDS = 40
FUZZ_SEED = 26
HOSTILE_VALUES: list[object] = [
    None, True, False, -1, 0, 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**40, 0.5, -0.0, 1e308, -1e308,
    float("nan"), float("inf"), float("-inf"), "", "\ud800", "x\udfffy", "%s%n{0}", "{{", "\x00", "é" * 3,
    "a" * 5000, [], [None], [[[]]], {}, {"": ""}, {"type": None}, _nested(150, 1), _nested(150, "\udc80"),
    [{"type": "text", "text": "\ud800"}], {"$ref": "#"},
]
CHAT_FIELDS = [
    "model", "messages", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "logprobs", "top_logprobs",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "response_format",
    "structured_outputs", "tools", "tool_choice", "stream_options", "length_penalty", "thinking_token_budget",
    "stream_interval", "truncate_prompt_tokens", "chat_template_kwargs", "prompt_logprobs",
    "skip_special_tokens", "include_stop_str_in_output", "bad_words", "allowed_token_ids", "priority",
    "user", "metadata",
]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"]
COMPLETION_FIELDS = ["prompt", "echo", "suffix", "top_k", "logprobs", "stop", "seed", "structured_outputs",
                     "truncate_prompt_tokens", "temperature", "length_penalty", "logit_bias", "min_p"]
ANTHROPIC_FIELDS = ["system", "messages", "stop_sequences", "temperature", "top_k", "top_p", "tools", "tool_choice",
                    "thinking", "metadata"]
TOKENIZE_FIELDS = ["prompt", "add_special_tokens", "return_token_strs", "messages"]


def _fuzz_cases(server, rng: random.Random):
    while True:
        endpoint = rng.choice(["chat", "chat", "completion", "messages", "tokenize"])
        value = rng.choice(HOSTILE_VALUES)
        if endpoint == "chat":
            body, path = _chat(server, max_tokens=2), "/v1/chat/completions"
            if rng.random() < 0.3:
                body["messages"][0][rng.choice(MESSAGE_FIELDS)] = value
            else:
                body[rng.choice(CHAT_FIELDS)] = value
            if rng.random() < 0.2:
                body["stream"] = True
        elif endpoint == "completion":
            body, path = _completion(server, max_tokens=2), "/v1/completions"
            body[rng.choice(COMPLETION_FIELDS)] = value
        elif endpoint == "messages":
            body, path = _messages(server, max_tokens=2), "/v1/messages"
            body[rng.choice(ANTHROPIC_FIELDS)] = value
        else:
            body, path = {"model": server.served_model_name, "prompt": "Hi"}, "/tokenize"
            body[rng.choice(TOKENIZE_FIELDS)] = value
        yield path, body


@pytest.mark.needs_patch("0016-request-values-validated.patch", "0017-request-size-limits.patch")
def test_body_fuzz_no_5xx_no_traceback(smol_server):
    """FUZZ_SECONDS of seeded hostile bodies (one field replaced by a hostile value: huge and non-finite
    numbers, lone surrogates, deep nesting, wrong JSON types): no answer is a 5xx and the server log gains no
    traceback. Replay a failure with the printed case."""
    rng = random.Random(FUZZ_SEED)
    offset = len(smol_server.log_text())
    deadline = time.monotonic() + FUZZ_SECONDS
    failures, sent = [], 0
    for path, body in _fuzz_cases(smol_server, rng):
        if time.monotonic() > deadline:
            break
        data = json.dumps(body).encode()  # NaN/Infinity as Python's json writes them (vLLM's parser reads them)
        try:
            response = _post(smol_server, path, data=data)
        except requests.RequestException as exc:
            failures.append((path, data[:300], repr(exc)))
            continue
        sent += 1
        if response.status_code >= 500:
            failures.append((path, data[:300], response.status_code, response.text[:300]))
    assert sent > 20, f"only {sent} requests in {FUZZ_SECONDS} s"
    assert not failures, failures[:10]
    _assert_no_traceback_since(smol_server, offset)
    assert_still_serving(smol_server)
