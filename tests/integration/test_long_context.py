"""Long-context correctness on the vLLM CPU build (tiny Qwen3.5, random weights: mechanics, not meaning).

- a prompt at the server's full MAX_LEN is accepted and answered; one token over is a 400 naming both lengths;
- prefill in many 256-token chunks gives the same greedy tokens as one chunk (MAX_BATCHED_TOKENS 2048);
- fp8 KV, the quantized KV dtype the CPU platform runs (v1/attention/backends/cpu_attn.py supported dtypes:
  auto, fp8, fp8_e4m3, fp8_e5m2; the per-token-head and turboquant dtypes need the GPU's Triton backends),
  stays within a stated logprob tolerance of bf16.
The tests that use tiny_qwen_prefix_server come first, so that server is stopped before the others start.
"""

from __future__ import annotations

import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.server]

MAX_LEN = 2048  # BASE_KNOBS in conftest.py
# fp8 KV against bf16: the greedy first token must agree and its logprob may move by at most this much (nats).
FP8_LOGPROB_TOLERANCE = 0.1
_single_chunk: dict[int, list[int]] = {}
_bf16_first: dict[int, tuple[str, float]] = {}


def prompt_ids(n: int, seed: int = 0) -> list[int]:
    """n deterministic token ids inside the tiny model's vocabulary (ordinary text-token range)."""
    return [1000 + (i * 7919 + seed * 104729) % 20000 for i in range(n)]


def complete(server, prompt: list[int], max_tokens: int, **extra) -> requests.Response:
    return requests.post(
        f"{server.v1_url}/completions",
        headers={"Authorization": f"Bearer {server.api_key}"},
        json={"model": server.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
              "ignore_eos": True, "return_token_ids": True, **extra},
        timeout=600,
    )


def greedy(server, prompt: list[int], max_tokens: int = 12) -> list[int]:
    response = complete(server, prompt, max_tokens)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def first_token(server, prompt: list[int]) -> tuple[str, float]:
    response = complete(server, prompt, 1, logprobs=1)
    assert response.status_code == 200, response.text
    logprobs = response.json()["choices"][0]["logprobs"]
    return logprobs["tokens"][0], logprobs["token_logprobs"][0]


# --- on tiny_qwen_prefix_server (bf16, one prefill chunk) -----------------------------------------------------

def test_a_prompt_at_the_full_length_is_answered(tiny_qwen_prefix_server):
    tokens = greedy(tiny_qwen_prefix_server, prompt_ids(MAX_LEN - 1), max_tokens=1)
    assert len(tokens) == 1


def test_one_token_over_the_limit_is_a_400_naming_both_lengths(tiny_qwen_prefix_server):
    over = MAX_LEN + 1
    response = complete(tiny_qwen_prefix_server, prompt_ids(over), 1)
    assert response.status_code == 400, response.text
    message = response.text
    assert str(MAX_LEN) in message and str(over) in message, message


def test_record_single_chunk_and_bf16_references(tiny_qwen_prefix_server):
    for seed in range(3):
        _single_chunk[seed] = greedy(tiny_qwen_prefix_server, prompt_ids(1900, seed))
        _bf16_first[seed] = first_token(tiny_qwen_prefix_server, prompt_ids(600, seed))
    assert all(len(t) == 12 for t in _single_chunk.values())


# --- chunked prefill ---------------------------------------------------------------------------------------

def test_many_chunks_give_the_single_chunk_output(tiny_qwen_chunked_server):
    if not _single_chunk:
        pytest.skip("the single-chunk reference test did not run")
    assert tiny_qwen_chunked_server.knobs["MAX_BATCHED_TOKENS"] == "256"  # a 1,900-token prompt: 8 chunks
    for seed, expected in _single_chunk.items():
        assert greedy(tiny_qwen_chunked_server, prompt_ids(1900, seed)) == expected, seed


# --- fp8 KV ------------------------------------------------------------------------------------------------

def test_fp8_kv_stays_close_to_bf16(server_factory):
    if not _bf16_first:
        pytest.skip("the bf16 reference test did not run")
    knobs = {"DTYPE": "bfloat16", "SPEC": "none", "PREFIX_CACHE": "1", "KV": "fp8"}
    with server_factory("tiny-qwen-fp8-kv", "tiny-qwen", knobs) as server:
        for seed, (token, logprob) in _bf16_first.items():
            fp8_token, fp8_logprob = first_token(server, prompt_ids(600, seed))
            assert fp8_token == token, (seed, token, fp8_token)
            assert abs(fp8_logprob - logprob) <= FP8_LOGPROB_TOLERANCE, (seed, logprob, fp8_logprob)
    # Stopped the way `docker stop` and Ctrl-C stop it (SIGTERM; conftest.stop_server): a normal shutdown logs no
    # traceback (patch 0041: the engine's stop used to reach the output handler as an EngineDeadError).
    shutdown = server.log_text().split("[shutdown]", 1)[-1]
    assert "Traceback" not in shutdown and "EngineDeadError" not in shutdown, shutdown[-3000:]
