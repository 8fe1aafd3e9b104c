"""Drafting from the context: SPEC=mtp+lookup (patch 0031) and SPEC=ngram on the CPU build.

SPEC=mtp+lookup runs vLLM's MTP drafter and then, once the step's tokens are on the CPU, overwrites the front of
each request's draft block with the tokens that followed the longest 2..5-token match of its context (prompt +
output so far; vLLM's own n-gram search, `batch_propose_numba`). The block is LOOKUP_TOKENS = 8 wide; the MTP
head drafts DRAFT_TOKENS = 3 of it, so verify slots 3..7 can only be accepted when the lookup filled them.

The state-sensitive recall model (support.testmodels; see test_spec_mtp_prefix_cache.py) makes the check sharp:
every prediction needs the previous step's GDN state, and its greedy output on a succ-chain prompt continues the
chain (the oracle, checked against a no-speculation/no-cache server by
test_spec_mtp_prefix_cache.py::test_reference_follows_the_chain_and_depends_on_the_state). A later turn whose
user segment re-enters a chain from an earlier turn makes the answer a copy of context, so the lookup fires on a
turn that starts from a prefix-cache hit: the case the public 3090 reference reported corrupted (an adaptive
lookup block, turn 2, prefix caching on; github.com/syv-ai/qwen38-27b-rtx3090). Here the block has a fixed width.

SmolLM2 has no MTP head, so the "repeat a passage" measurement runs vLLM's plain prompt lookup (SPEC=ngram, the
same n-gram search and 2..5 window) against the no-speculation smol_server.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.server]

BLOCK = 256  # the hybrid model's unified block size on this build (test_spec_mtp_prefix_cache.py)
DRAFTER_TOKENS = 3  # RECALL_MTP_LOOKUP_KNOBS DRAFT_TOKENS
VERIFY_BLOCK = 8  # RECALL_MTP_LOOKUP_KNOBS LOOKUP_TOKENS


@pytest.fixture(scope="module")
def succ(test_models) -> list[int]:
    from support.testmodels import recall_successor

    return recall_successor(test_models["tiny-qwen-recall"])


def chain(succ: list[int], start: int, length: int) -> list[int]:
    from support.testmodels import recall_chain

    return recall_chain(succ, start, length)


def oracle(succ: list[int], prompt: list[int], n: int) -> list[int]:
    """The no-speculation greedy answer to a prompt that ends in a chain link: the chain continued."""
    return chain(succ, succ[prompt[-1]], n)


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def junk(seed: str, n: int) -> list[int]:
    """Ordinary tokens that are not a chain (the recall model's oracle does not cover them)."""
    rng = random.Random(seed)
    return [rng.randrange(300, 40_000) for _ in range(n)]


def conversations(succ: list[int]) -> dict[str, list[tuple[list[int], int]]]:
    """Per conversation, its turns as (user segment, max_tokens); a turn's prompt is the history plus its segment.

    copy: turn 2 (a 1,100-token prompt) re-enters turn 1's chain at token 300, so its answer copies turn 1 from
      token 591 on (lookup all the way); turn 1's 769 tokens are three whole blocks, so turn 2 starts from a
      cache hit.
    diverge: turn 1 holds a chain piece followed by junk; turn 2 re-enters the piece 20 tokens before the
      junk, so the lookup proposes the junk there and the target must reject it mid-block, then MTP takes over.
    plain: fresh chains only (the MTP drafter alone), run beside the others in the concurrent pass.
    """
    copied = chain(succ, 1234, 769)
    piece = chain(succ, 4321, 400)
    return {
        "copy": [(copied, 40), (chain(succ, copied[300], 1100 - 769 - 40), 200)],
        "diverge": [(piece[:280] + junk("diverge", 30) + chain(succ, 8765, 459), 24), (piece[100:260], 120)],
        "plain": [(chain(succ, 5555, 520), 30), (chain(succ, 6666, 300), 60)],
    }


def run(server, succ: list[int], *, concurrent: bool) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Every conversation turn by turn; returns each turn's (prompt, answer)."""
    plan = conversations(succ)
    history: dict[str, list[int]] = {name: [] for name in plan}
    turns: dict[str, list[tuple[list[int], list[int]]]] = {name: [] for name in plan}
    for turn in range(2):
        jobs = {}
        for name, steps in plan.items():
            segment, max_tokens = steps[turn]
            jobs[name] = (history[name] + segment, max_tokens)
        if concurrent:
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                futures = {name: pool.submit(server.greedy_token_ids, *job) for name, job in jobs.items()}
                answers = {name: future.result() for name, future in futures.items()}
        else:
            answers = {name: server.greedy_token_ids(*job) for name, job in jobs.items()}
        for name, (prompt, _) in jobs.items():
            turns[name].append((prompt, answers[name]))
            history[name] = prompt + answers[name]
    return turns


@pytest.mark.needs_patch("0030-mamba-align-precopy-cpu.patch", "0031-context-lookup-before-drafter.patch")
def test_mtp_plus_lookup_equals_no_speculation_over_turns_with_cache_hits(recall_mtp_lookup_server, succ):
    """Concurrent, then sequential (now from the prefix cache): every answer is the no-speculation answer token
    for token, turn 2 starts from a cache hit, and lookup-filled slots (past the drafter's 3) were accepted."""
    server = recall_mtp_lookup_server
    assert "Async scheduling is not compatible with speculative context_lookup" in server.log_text()
    before = server.spec_metrics()
    concurrent = run(server, succ, concurrent=True)
    middle = server.spec_metrics()
    positions_before = server.accepted_per_position()
    sequential = run(server, succ, concurrent=False)
    after = server.spec_metrics()

    for turns in (concurrent, sequential):
        for name, answered in turns.items():
            for turn, (prompt, answer) in enumerate(answered):
                assert answer == oracle(succ, prompt, len(answer)), (name, turn)

    # The second pass repeats every prompt: whole blocks come from the cache (0.32.0 saves a hybrid model's
    # block-boundary states on the second request over a prefix, so the first pass has no hits to show).
    assert delta(middle, after, "vllm:prefix_cache_hits_total") >= 4 * BLOCK
    assert delta(before, middle, "vllm:spec_decode_num_drafts_total") > 0
    # The sequential pass accepted tokens in the slots only the lookup fills (the drafter drafts 3 of 8).
    positions = server.accepted_per_position()
    lookup_only = sum(positions.get(p, 0.0) - positions_before.get(p, 0.0) for p in range(DRAFTER_TOKENS, 8))
    assert lookup_only > 0, positions


@pytest.mark.needs_patch("0030-mamba-align-precopy-cpu.patch", "0031-context-lookup-before-drafter.patch")
def test_copying_turn_fills_the_block_from_the_context(recall_mtp_lookup_server, succ):
    """A turn-2 answer that copies turn 1 (after a cache hit): at least 3 accepted tokens per verify step
    (measured on this build: 8.0 of 8, every block filled from the context), and the answer is exact."""
    server = recall_mtp_lookup_server
    first = chain(succ, 27531, 3 * BLOCK + 1)
    answer1 = server.greedy_token_ids(first, 16)
    assert server.greedy_token_ids(first, 16) == answer1  # the second request saves the boundary states
    history = first + answer1
    prompt = history + chain(succ, first[200], 1000 - len(history))
    before = server.spec_metrics()
    answer2 = server.greedy_token_ids(prompt, 240)
    after = server.spec_metrics()
    assert answer1 == oracle(succ, first, 16)
    assert answer2 == oracle(succ, prompt, 240)
    assert delta(before, after, "vllm:prefix_cache_hits_total") >= 2 * BLOCK
    drafts = delta(before, after, "vllm:spec_decode_num_drafts_total")
    accepted = delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and accepted / drafts >= 3, (accepted, drafts)


def test_smol_prompt_lookup_repeats_a_passage_as_without_speculation(smol_lookup_server, smol_server, test_models):
    """SmolLM2 asked to repeat a 983-token passage: SPEC=ngram gives the no-speculation output token for token,
    with at least 3 accepted tokens per verify step (measured on this build: 6.3).

    SmolLM2-135M (the Q4_1 GGUF) copies only the first ~190 characters verbatim and then drifts into its own
    repetitive text; the lookup matches both the passage and that repetition (it searches prompt + output)."""
    from transformers import AutoTokenizer

    from support.passages import DECLARATION

    tokenizer = AutoTokenizer.from_pretrained(test_models["smollm2"])
    # This exact wording (with the final newline) is one that SmolLM2-135M starts to copy; small changes to it
    # made the model comment on the text instead of repeating it.
    messages = [
        {"role": "user", "content": "Repeat the following text exactly, word for word:\n\n" + DECLARATION + "\n"}
    ]
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    max_tokens = min(len(tokenizer.encode(DECLARATION)), 2040 - len(prompt))  # MAX_LEN 2048 (BASE_KNOBS)
    before = smol_lookup_server.spec_metrics()
    answer = smol_lookup_server.greedy_token_ids(prompt, max_tokens)
    after = smol_lookup_server.spec_metrics()
    assert answer == smol_server.greedy_token_ids(prompt, max_tokens)
    assert DECLARATION[:150] in tokenizer.decode(answer)
    drafts = delta(before, after, "vllm:spec_decode_num_drafts_total")
    accepted = delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and accepted / drafts >= 3, (accepted, drafts)
