"""Drafting from the context (SPEC=ngram, vLLM's prompt lookup) on the CPU build, with SmolLM2.

SmolLM2 has no MTP head, so prompt lookup is the only speculation it can use. Continuing a second copy of a
~1,000-token passage, the answer copies the prompt: lookup should fill most of each 8-token verify block
(LOOKUP_TOKENS=8 on the test server), and greedy output must be exactly what the same model says without
speculation.

The no-speculation answer comes from the shared `smol_server` in the first test and is kept for the later
ones, so that (when this file runs alone) that server is stopped before the lookup server starts.
"""

from __future__ import annotations

import difflib
import inspect
import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.server]

# The json module's docstring: 947 SmolLM2 tokens of prose and code, fixed by the venv's Python. SmolLM2-135M
# does not follow a chat instruction to repeat it (measured: it wrote about the text instead, longest copied
# run 29 characters), but as a completion it continues a second copy of a text it has just read, which is
# the "answer quotes the prompt" case lookup is for.
PASSAGE = inspect.getdoc(json)
PROMPT = f"{PASSAGE}\n\n-----\n\n{PASSAGE[:120]}"
MAX_TOKENS = 600
_REFERENCE: dict[str, list[int]] = {}


def answer_token_ids(server) -> tuple[list[int], str]:
    import requests

    response = requests.post(
        f"{server.v1_url}/completions",
        headers={"Authorization": f"Bearer {server.api_key}"},
        json={"model": server.served_model_name, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
              "return_token_ids": True},
        timeout=900,
    )
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return choice["token_ids"], choice["text"]


def test_reference_answer_without_speculation(smol_server):
    token_ids, text = answer_token_ids(smol_server)
    _REFERENCE["token_ids"] = token_ids
    # The model does copy: the answer reproduces a long stretch of the passage (else lookup has nothing to do).
    match = difflib.SequenceMatcher(None, PASSAGE, text, autojunk=False).find_longest_match()
    assert match.size >= 300, (match, text[:600])


def test_lookup_copies_several_tokens_per_step_with_identical_output(smol_lookup_server):
    if "token_ids" not in _REFERENCE:
        pytest.fail("the reference answer is missing: run this file whole (test_reference_answer_without_speculation)")
    server = smol_lookup_server
    before = server.metrics()
    token_ids, _ = answer_token_ids(server)
    after = server.metrics()
    assert token_ids == _REFERENCE["token_ids"]

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    drafts = delta("vllm:spec_decode_num_drafts_total")
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    print(f"\nsmol lookup: {len(token_ids)} tokens, {drafts:.0f} verify steps with drafts, {accepted:.0f} accepted "
          f"({accepted / max(drafts, 1):.2f} per step)")
    assert drafts > 0
    assert accepted / drafts >= 3, (accepted, drafts)
