"""MTP speculative decoding together with prefix caching on the hybrid (Gated DeltaNet + attention) model.

This is the single-mode default (SPEC=mtp, PREFIX_CACHE=1). On a hybrid model it puts vLLM's GDN state cache
in "align" mode: every step copies each request's running conv/recurrent state across block boundaries
(`preprocess_mamba` -> `precopy_mamba_align_fused_kernel`, `postprocess_mamba_fused_kernel` in
vllm/v1/worker/mamba_utils.py), and a prefix-cache hit resumes from a state saved at a block boundary. Those
kernels are Triton-only; patch 0030 gives them a plain-torch twin where Triton has no backend, so the CPU
build runs this path.

The model is `tiny-qwen-recall` (support.testmodels): its every prediction needs the previous step's GDN
state, so a state copied wrongly at a block boundary, or a cached state from the wrong position or request,
changes the next token. Its oracle is known: on a succ-chain prompt, greedy output continues the chain.
Prompts are token ids (the completions API) so that their lengths land exactly where the tests need them
(block boundaries are 256 tokens here); a chat template would break the chain.

What the tests cannot see (docs/cpu-limitations.md): the recall model's memory is two tokens, so a wrong
state is visible at every decode step, but a wrong state at a cache-hit point is forgotten before the prompt
ends (with MTP the hit stops a block short, so at least 257 prompt tokens are recomputed after it); and the
GPU's code path (Model Runner V2, the Triton kernels themselves: those were checked against the twins on an
H200 by scripts/mamba_align_kernel_check.py).
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.server,
    pytest.mark.needs_patch("0030-mamba-align-precopy-cpu.patch"),
]

BLOCK = 256  # the hybrid model's unified block size on this build (cache_config_info block_size)
NO_SPEC_NO_CACHE = {"DTYPE": "bfloat16", "SPEC": "none", "PREFIX_CACHE": "0"}

# Per conversation, per turn: (prompt length, max_tokens). A later turn's prompt is the previous prompt,
# the previous answer, and a new user segment (a fresh chain) sized to reach the length. Lengths are chosen
# against the 256-token blocks: turn 1 decodes across a boundary at different offsets (state copies with
# different accepted-token biases); 257, 769, 1025 end one token after a boundary; B and C run long
# decodes across further boundaries; D shares A's first turn (a prefix cached by another conversation).
# Every user segment is at least two tokens, so every prompt ends in a chain link (the oracle holds).
CONVERSATIONS: dict[str, list[tuple[int, int]]] = {
    "A": [(500, 40), (769, 40), (1025, 30)],
    "B": [(509, 20), (531, 250), (1026, 8)],
    "C": [(250, 3), (257, 300), (770, 20)],
    "D": [(500, 12), (514, 24), (769, 10)],
}
SHARED_FIRST_SEGMENT = {"D": "A"}


@pytest.fixture(scope="module")
def succ(test_models) -> list[int]:
    from support.testmodels import recall_successor

    return recall_successor(test_models["tiny-qwen-recall"])


def complete(server, prompt: list[int], max_tokens: int) -> list[int]:
    return server.greedy_token_ids(prompt, max_tokens)


def segment_start(name: str, turn: int) -> int:
    """A deterministic ordinary token to start a conversation's user segment from."""
    name = SHARED_FIRST_SEGMENT.get(name, name) if turn == 0 else name
    return random.Random(f"{name}/{turn}").randrange(300, 40_000)


def run_conversations(server, succ: list[int], *, concurrent: bool) -> dict[str, list[list[int]]]:
    """Every conversation turn by turn; returns each turn's answer. Concurrent: one thread per conversation."""
    from support.testmodels import recall_chain

    prompts: dict[str, list[int]] = {}
    answers: dict[str, list[list[int]]] = {name: [] for name in CONVERSATIONS}
    for turn in range(max(len(turns) for turns in CONVERSATIONS.values())):
        jobs = {}
        for name, turns in CONVERSATIONS.items():
            length, max_tokens = turns[turn]
            history = prompts[name] + answers[name][-1] if turn else []
            assert length > len(history) + 1, (name, turn, length, len(history))
            prompts[name] = history + recall_chain(succ, segment_start(name, turn), length - len(history))
            jobs[name] = (list(prompts[name]), max_tokens)
        if concurrent:
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                futures = {name: pool.submit(complete, server, *job) for name, job in jobs.items()}
                for name, future in futures.items():
                    answers[name].append(future.result())
        else:
            for name, job in jobs.items():
                answers[name].append(complete(server, *job))
    return answers


def chain_answer(succ: list[int], prompt_last: int, n: int) -> list[int]:
    from support.testmodels import recall_chain

    return recall_chain(succ, succ[prompt_last], n)


@pytest.fixture(scope="module")
def reference(server_factory, succ) -> dict[str, object]:
    """The same conversations on the same model without speculation and without prefix caching."""
    with server_factory("recall-plain", "tiny-qwen-recall", NO_SPEC_NO_CACHE) as server:
        answers = run_conversations(server, succ, concurrent=False)
        # The probe that shows these tests can fail: a chain prompt whose next-to-last token is replaced.
        # The model recalls the previous token from its state, so the answer must follow the replaced
        # token (succ(succ(p))), not the last token's chain successor.
        from support.testmodels import recall_chain

        chain = recall_chain(succ, 4242, 40)
        broken = chain[:-2] + [7777, chain[-1]]
        probe = complete(server, broken, 1)
        metrics = server.metrics()
    return {"answers": answers, "probe": (broken, probe), "metrics": metrics}


def test_reference_follows_the_chain_and_depends_on_the_state(reference, succ):
    """The oracle holds on this build, and the next token is decided by the state (the recalled token)."""
    answers = reference["answers"]
    for name in CONVERSATIONS:
        for turn, answer in enumerate(answers[name]):
            # Every turn's prompt ends in a chain, so the answer continues it (the user segment's chain).
            assert answer[1:] == [succ[t] for t in answer[:-1]], (name, turn)
    broken, probe = reference["probe"]
    assert probe == [succ[succ[broken[-2]]]], (probe, broken[-2:])
    assert probe != [succ[broken[-1]]]
    assert reference["metrics"].get("vllm:prefix_cache_hits_total", 0) == 0


def test_mtp_with_prefix_caching_equals_no_speculation_no_cache(recall_mtp_prefix_server, reference, succ):
    """Concurrent multi-turn conversations, then the same conversations again one by one (now mostly
    served from the prefix cache): token for token the reference's answers, with cache hits and accepted
    drafts visible in /metrics."""
    server = recall_mtp_prefix_server
    before = server.spec_metrics()
    concurrent = run_conversations(server, succ, concurrent=True)
    middle = server.spec_metrics()
    sequential = run_conversations(server, succ, concurrent=False)
    after = server.spec_metrics()

    assert concurrent == reference["answers"]
    assert sequential == reference["answers"]

    def delta(a, b, name):
        return b.get(name, 0.0) - a.get(name, 0.0)

    hits_concurrent = delta(before, middle, "vllm:prefix_cache_hits_total")
    hits_sequential = delta(middle, after, "vllm:prefix_cache_hits_total")
    # Later turns extend earlier ones, and the second pass repeats every prompt: both must hit the cache
    # in whole blocks (hits are counted in tokens).
    # Measured on this build: 1,024 and 2,816 tokens.
    assert hits_concurrent >= BLOCK, hits_concurrent
    assert hits_sequential >= 4 * BLOCK, hits_sequential
    drafts = delta(before, after, "vllm:spec_decode_num_drafts_total")
    accepted = delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and accepted > 0, (drafts, accepted)
    # Steps that accepted 1, 2 and 3 drafts all happened, so the state copies ran with every token bias
    # (measured over both passes: 400, 180, 90 accepted at positions 1, 2, 3 of 842 drafts).
    per_position = server.accepted_per_position()
    assert all(per_position.get(p, 0) > 0 for p in range(3)), per_position


def test_repeated_prompts_at_block_boundaries(recall_mtp_prefix_server, succ):
    """A prompt one token past a block boundary, sent three times: the third is served from the cache, one
    block short of the boundary (with MTP, vLLM drops the last matched block so that the drafter's hidden
    states are recomputed: `drop_eagle_block` in vllm/v1/core/single_type_kv_cache_manager.py), and every
    answer continues the chain. Measured on this build: hits 0, 256, 512 for 257, 513, 769 tokens."""
    server = recall_mtp_prefix_server
    from support.testmodels import recall_chain

    chain = recall_chain(succ, 31337, 3 * BLOCK + 1)
    for length in (BLOCK + 1, 2 * BLOCK + 1, 3 * BLOCK + 1):
        prompt = chain[:length]
        first = complete(server, prompt, 4)
        complete(server, prompt, 4)  # the second request over a prefix saves its boundary states (0.32.0)
        before = server.metrics().get("vllm:prefix_cache_hits_total", 0.0)
        again = complete(server, prompt, 4)
        hits = server.metrics().get("vllm:prefix_cache_hits_total", 0.0) - before
        assert hits == (length - 1) - BLOCK, (length, hits)
        assert first == again == chain_answer(succ, prompt[-1], 4), length
