"""Patch 0060 on the real CPU server: a prompt filled in many chunks reports its progress in the stream.

Runs right after test_long_context.py, on the same session server. The default 1 s interval on a ~50k-token
prefill (and Anthropic pings beside it) is in test_agents_streams_progress.py, on agents_server.

tiny_qwen_chunked_server prefills in 256-token chunks (MAX_BATCHED_TOKENS) and polls progress every
STREAM_PROGRESS s (conftest.py), so a 1,900-token prompt takes 8 chunks. The stream carries SSE comments
`: prefill COMPUTED/TOTAL` before its first token, and the openai and anthropic SDKs parse such a stream to the
same answer as the non-streamed request. `/hyperqwen/prefill` lists the prompts being filled (the monitor reads it).
"""

from __future__ import annotations

import random
import re
import secrets
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import requests

from hyperqwen.monitor.prefill import parse_prefill

pytestmark = [pytest.mark.integration, pytest.mark.server, pytest.mark.needs_patch("0060-prefill-progress.patch")]

PROMPT_TOKENS = 1900  # MAX_LEN is 2048
CHUNK = 256
PROGRESS = re.compile(r"^: prefill (\d+)/(\d+)$")


def fresh_ids(n: int = PROMPT_TOKENS) -> list[int]:
    """n random token ids, so no prefix-cache hit shortens the prefill (counts stay on chunk boundaries)."""
    rng = random.Random(secrets.randbits(64))
    return [1000 + rng.randrange(20000) for _ in range(n)]


def fresh_text(words: int = 240) -> str:
    """About 1,550 tokens (6.45 per entry with the tiny model's tokenizer, counted), new each call."""
    salt = secrets.token_hex(8)
    return f"[{salt}] " + " ".join(f"item {i} fine." for i in range(words))


def headers(server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.api_key}"}


def sse_lines(server, path: str, body: dict) -> list[str]:
    with requests.post(f"{server.base_url}{path}", json=body, headers=headers(server), stream=True,
                       timeout=600) as response:
        assert response.status_code == 200, response.text[:500]
        return [line for line in response.iter_lines(decode_unicode=True) if line]


def progress_before_first_event(lines: list[str]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(progress comments before the first token's event, progress comments after it)."""
    before: list[tuple[int, int]] = []
    after: list[tuple[int, int]] = []
    seen_token = False
    for line in lines:
        if match := PROGRESS.match(line):
            (after if seen_token else before).append((int(match[1]), int(match[2])))
        elif line.startswith("data:") and _carries_output(line):
            seen_token = True
    return before, after


def _carries_output(line: str) -> bool:
    # /v1/responses sends response.created / in_progress before the prefill; those are not output.
    return not any(kind in line for kind in ('"response.created"', '"response.in_progress"'))


def assert_progress_to(lines: list[str], total: int) -> list[tuple[int, int]]:
    before, after = progress_before_first_event(lines)
    assert after == [], after
    assert len(before) >= 2, lines[:20]
    counts = [computed for computed, _ in before]
    assert counts == sorted(set(counts)), counts  # strictly increasing
    assert all(t == total for _, t in before), before
    assert before[-1] == (total, total), before
    # Every earlier count is a chunk boundary: the engine reports after each 256-token chunk.
    assert all(c % CHUNK == 0 and 0 < c < total for c in counts[:-1]), counts
    return before


def test_completions_stream_reports_progress_up_to_the_prompt_length(tiny_qwen_chunked_server):
    server = tiny_qwen_chunked_server
    assert server.knobs["MAX_BATCHED_TOKENS"] == str(CHUNK)
    started = time.monotonic()
    lines = sse_lines(server, "/v1/completions", {
        "model": server.served_model_name, "prompt": fresh_ids(), "max_tokens": 4, "temperature": 0,
        "ignore_eos": True, "stream": True})
    progress = assert_progress_to(lines, PROMPT_TOKENS)
    print(f"completions: {len(progress)} progress lines in {time.monotonic() - started:.2f} s: {progress}")
    assert lines[-1] == "data: [DONE]"


def test_chat_and_responses_streams_report_progress(tiny_qwen_chunked_server):
    server = tiny_qwen_chunked_server
    chat = sse_lines(server, "/v1/chat/completions", {
        "model": server.served_model_name, "messages": [{"role": "user", "content": fresh_text()}],
        "max_tokens": 4, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    before, _ = progress_before_first_event(chat)
    usage = [line for line in chat if '"usage"' in line and '"prompt_tokens"' in line][-1]
    prompt_tokens = int(re.search(r'"prompt_tokens":\s*(\d+)', usage)[1])
    assert prompt_tokens > 4 * CHUNK, prompt_tokens
    assert_progress_to(chat, prompt_tokens)

    responses = sse_lines(server, "/v1/responses", {
        "model": server.served_model_name, "input": fresh_text(), "max_output_tokens": 4, "temperature": 0,
        "stream": True})
    before, after = progress_before_first_event(responses)
    assert len(before) >= 2 and before[-1][0] == before[-1][1] and after == [], (before, after)


def tee_client(httpx_module) -> tuple[object, list[bytearray]]:
    """A real HTTP client of `httpx_module` (the openai SDK takes httpx, anthropic 2.x httpx2: same API) that keeps
    a copy of every response body the SDK reads, so the test sees the raw SSE the SDK parsed."""
    bodies: list[bytearray] = []

    class TeeTransport(httpx_module.HTTPTransport):
        def handle_request(self, request):
            response = super().handle_request(request)
            body = bytearray()
            bodies.append(body)
            inner = response.stream

            class Tee(httpx_module.SyncByteStream):
                def __iter__(self) -> Iterator[bytes]:
                    for chunk in inner:
                        body.extend(chunk)
                        yield chunk

                def close(self) -> None:
                    inner.close()

            return httpx_module.Response(response.status_code, headers=response.headers, stream=Tee(),
                                         extensions=response.extensions)

    return httpx_module.Client(transport=TeeTransport(), timeout=300), bodies


def raw_progress(bodies: list[bytearray], index: int) -> list[tuple[int, int]]:
    text = bodies[index].decode()
    return [(int(a), int(b)) for a, b in re.findall(r"^: prefill (\d+)/(\d+)$", text, flags=re.M)]


def test_openai_sdk_parses_a_stream_with_progress_to_the_same_answer(tiny_qwen_chunked_server):
    server = tiny_qwen_chunked_server
    http_client, bodies = tee_client(httpx)
    client = server.openai(http_client=http_client)
    prompt = fresh_ids()
    args = {"model": server.served_model_name, "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "extra_body": {"ignore_eos": True}}
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **args)
                       if chunk.choices)
    progress = raw_progress(bodies, -1)
    assert len(progress) >= 2 and progress[-1] == (PROMPT_TOKENS, PROMPT_TOKENS), progress
    plain = client.completions.create(**args).choices[0].text
    assert streamed == plain and plain, (streamed, plain)

    messages = [{"role": "user", "content": fresh_text()}]
    chat_args = {"model": server.served_model_name, "messages": messages, "max_tokens": 8, "temperature": 0,
                 "extra_body": {"ignore_eos": True}}
    parts: list[str] = []
    for chunk in client.chat.completions.create(stream=True, **chat_args):
        if chunk.choices:
            delta = chunk.choices[0].delta
            parts.append((delta.content or "") + str((delta.model_extra or {}).get("reasoning") or ""))
    assert len(raw_progress(bodies, -1)) >= 2
    message = client.chat.completions.create(**chat_args).choices[0].message
    assert "".join(parts) == (message.content or "") + str((message.model_extra or {}).get("reasoning") or "")


def test_anthropic_sdk_parses_a_stream_with_progress_to_the_same_answer(tiny_qwen_chunked_server):
    import anthropic

    server = tiny_qwen_chunked_server
    httpx2 = pytest.importorskip("httpx2", reason="the anthropic SDK 2.x speaks through httpx2")
    http_client, bodies = tee_client(httpx2)
    client = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0,
                                 http_client=http_client)
    # This SDK has no temperature parameter; vLLM's Messages route takes it from the body.
    args = {"model": server.served_model_name, "max_tokens": 8, "extra_body": {"temperature": 0},
            "messages": [{"role": "user", "content": fresh_text()}]}
    with client.messages.stream(**args) as stream:
        streamed = stream.get_final_message()
    progress = raw_progress(bodies, -1)
    assert len(progress) >= 2 and progress[-1][0] == progress[-1][1], progress
    usage = streamed.usage  # Anthropic usage splits the prompt into uncached, cache-written and cache-read parts
    prompt_tokens = usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)
    assert progress[-1][1] == prompt_tokens, (progress, usage)
    plain = client.messages.create(**args)
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in plain.content]
    assert streamed.stop_reason == plain.stop_reason


def test_prefill_route_lists_a_prompt_while_it_fills(tiny_qwen_chunked_server):
    server = tiny_qwen_chunked_server
    docs: list[dict] = []
    done = threading.Event()

    def poll() -> None:
        with requests.Session() as session:
            while not done.is_set():
                doc = session.get(f"{server.base_url}/hyperqwen/prefill", headers=headers(server), timeout=30).json()
                if doc["requests"]:
                    docs.append(doc)
                time.sleep(0.01)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        response = requests.post(f"{server.v1_url}/completions", headers=headers(server), timeout=600, json={
            "model": server.served_model_name, "prompt": fresh_ids(), "max_tokens": 1, "temperature": 0})
        assert response.status_code == 200, response.text
    finally:
        done.set()
        poller.join(timeout=30)
    assert docs, "no row seen while the prompt filled"
    rows = [row for doc in docs for row in doc["requests"]]
    assert {row["id"] for row in rows} == {response.json()["id"] + "-0"}  # /v1/completions' engine id for prompt 0
    assert all(0 < row["computed_tokens"] < row["prompt_tokens"] == PROMPT_TOKENS for row in rows), rows
    # The monitor reads this route (hyperqwen.monitor.prefill): the real answers parse.
    parsed = [parse_prefill(doc)[0] for doc in docs]
    assert [p.computed_tokens for p in parsed] == sorted(p.computed_tokens for p in parsed)
    after = requests.get(f"{server.base_url}/hyperqwen/prefill", headers=headers(server), timeout=30).json()
    assert after["requests"] == [] and after["stream_interval_s"] == float(server.knobs["STREAM_PROGRESS"])
    assert requests.get(f"{server.base_url}/hyperqwen/prefill", timeout=30).status_code == 401



def test_progress_reports_do_not_count_as_iterations_in_metrics(tiny_qwen_chunked_server):
    """vllm:iteration_tokens_total is observed once per engine step that produced output. The 7 progress-only
    steps of an 8-chunk prefill must not add observations of 0: 4 output tokens = the last chunk's step plus
    3 decode steps = 4 observations, summing to the 1,900 prompt tokens plus 4 output tokens."""
    server = tiny_qwen_chunked_server
    before = server.metrics()
    lines = sse_lines(server, "/v1/completions", {
        "model": server.served_model_name, "prompt": fresh_ids(), "max_tokens": 4, "temperature": 0,
        "ignore_eos": True, "stream": True})
    assert len(progress_before_first_event(lines)[0]) >= 2
    after = server.metrics()
    count = after["vllm:iteration_tokens_total_count"] - before["vllm:iteration_tokens_total_count"]
    total = after["vllm:iteration_tokens_total_sum"] - before["vllm:iteration_tokens_total_sum"]
    assert (count, total) == (4, PROMPT_TOKENS + 4)
