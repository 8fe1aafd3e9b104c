"""The Qwen3.5 architecture on the vLLM CPU build, through `hyperqwen serve`: thinking switch, prefix caching,
MTP speculative decoding (exact). MTP together with prefix caching (the single-mode default) is tested on a
state-sensitive variant of this model in test_spec_mtp_prefix_cache.py.

The model is `tiny-qwen3.5-mtp` from `PYTHONPATH=tests python -m support.testmodels`: random weights, so the tests check
mechanics (where text lands, cache hits, token-for-token equality), never the meaning of the text.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.server]

HELLO = [{"role": "user", "content": "Say hello."}]
PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
]


def chat(server, *, messages=HELLO, max_tokens=16, **extra):
    return server.openai().chat.completions.create(
        model=server.served_model_name, messages=messages, max_tokens=max_tokens, temperature=0, **extra
    )


def greedy_token_ids(server, prompt: str, max_tokens: int = 24) -> list[int]:
    return server.greedy_token_ids(prompt, max_tokens, timeout=300)


# --- thinking ------------------------------------------------------------------------------------------


def test_thinking_is_off_by_default(tiny_qwen_prefix_server):
    message = chat(tiny_qwen_prefix_server).choices[0].message
    assert getattr(message, "reasoning", None) is None, message
    assert message.content, message


def test_thinking_turns_on_per_request(tiny_qwen_prefix_server):
    """enable_thinking=true opens a think block in the prompt; a model that never closes it answers in
    `reasoning` only (random weights: it never emits </think> in 16 greedy tokens)."""
    message = chat(
        tiny_qwen_prefix_server, extra_body={"chat_template_kwargs": {"enable_thinking": True}}
    ).choices[0].message
    assert getattr(message, "reasoning", None), message
    assert not message.content, message


def test_thinking_switch_changes_the_prompt(tiny_qwen_prefix_server):
    """The template renders the switch: thinking on and off give different prompts (seen by the server)."""
    def prompt_tokens(enable: bool) -> int:
        return chat(
            tiny_qwen_prefix_server, max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": enable}}
        ).usage.prompt_tokens

    # Off adds "<think>\n\n</think>\n\n", on adds "<think>\n": off is longer.
    assert prompt_tokens(False) > prompt_tokens(True)


# --- prefix caching ------------------------------------------------------------------------------------


def test_prefix_cache_hit_visible_in_metrics(tiny_qwen_prefix_server):
    """A later chat turn reuses the cached prefix of the earlier turns.

    On a hybrid model vLLM can resume only from a GDN state it saved at a block boundary ("align" mode;
    256-token blocks here). Observed on this build: the first request over a new prefix leaves nothing
    reusable, the second request over the same prefix saves a boundary state, and from the third on the
    prefix is a hit (first 0, then 0, then 1280 of 1431 tokens). So the conversation's first turn is sent
    twice before the follow-up turn is measured.
    """
    server = tiny_qwen_prefix_server
    # ~1400 tokens: five full 256-token blocks.
    turn_1 = [
        {"role": "system", "content": " ".join(f"item-{i}" for i in range(300))},
        {"role": "user", "content": "Which item comes first?"},
    ]
    first = chat(server, messages=turn_1, max_tokens=4)
    chat(server, messages=turn_1, max_tokens=4)
    before = server.metrics()
    turn_2 = turn_1 + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And which comes last?"},
    ]
    second = chat(server, messages=turn_2, max_tokens=4)
    after = server.metrics()
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert queries == second.usage.prompt_tokens, (queries, second.usage)
    assert hits >= 256, f"the follow-up turn should reuse at least one 256-token block: hits={hits}"
    assert hits % 256 == 0 and hits < queries, hits


# --- MTP speculative decoding --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_token_ids(tiny_qwen_prefix_server) -> dict[str, list[int]]:
    """Greedy output without speculation (the prefix-caching server: prefix caching does not change it)."""
    return {prompt: greedy_token_ids(tiny_qwen_prefix_server, prompt) for prompt in PROMPTS}


def test_no_speculation_output_is_the_successor_chain(tiny_qwen_prefix_server, reference_token_ids):
    """The planted chain is the no-speculation answer, so other modules (test_spec_dflash2.py) use it as theirs."""
    from transformers import AutoTokenizer

    from support.testmodels import tiny_qwen_successor

    succ = tiny_qwen_successor(tiny_qwen_prefix_server.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_prefix_server.model_dir)
    for prompt, output in reference_token_ids.items():
        chain = [succ[tokenizer(prompt)["input_ids"][-1]]]
        while len(chain) < len(output):
            chain.append(succ[chain[-1]])
        assert output == chain, prompt


def test_mtp_greedy_output_equals_no_speculation(tiny_qwen_mtp_server, reference_token_ids):
    for prompt, expected in reference_token_ids.items():
        assert greedy_token_ids(tiny_qwen_mtp_server, prompt) == expected, prompt


def test_mtp_drafts_visible_in_metrics(tiny_qwen_mtp_server):
    before = tiny_qwen_mtp_server.metrics()
    greedy_token_ids(tiny_qwen_mtp_server, "Count with me: one, two,", max_tokens=16)
    after = tiny_qwen_mtp_server.metrics()
    drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0)
    draft_tokens = after["vllm:spec_decode_num_draft_tokens_total"] - before.get(
        "vllm:spec_decode_num_draft_tokens_total", 0
    )
    accepted = after["vllm:spec_decode_num_accepted_tokens_total"] - before.get(
        "vllm:spec_decode_num_accepted_tokens_total", 0
    )
    assert drafts > 0
    assert draft_tokens == drafts * int(tiny_qwen_mtp_server.knobs["DRAFT_TOKENS"])
    # The tiny model's MTP head is built to guess the planted next token (testmodels), so drafts land.
    assert accepted > 0, (drafts, draft_tokens, accepted)


def test_mtp_server_serves_chat(tiny_qwen_mtp_server):
    response = chat(tiny_qwen_mtp_server)
    assert response.choices[0].message.content
    assert response.usage.completion_tokens > 0
