"""`hyperqwen draft-vocab-recount` against the real vLLM CPU server (SmolLM2, the session's `smol_server`):
the counts it writes are exactly the ids the server generates, as the same greedy request with vLLM's
`return_tokens_as_token_ids` logprobs reports them. Cost: two 16-token generations on a running server."""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest

from hyperqwen.prepare import draft_vocab as dv
from hyperqwen.prepare.errors import PrepareError

pytestmark = [pytest.mark.integration, pytest.mark.server]


def test_recount_counts_the_ids_the_server_generates(smol_server, tmp_path):
    key_file = tmp_path / "key.txt"
    key_file.write_text(smol_server.api_key + "\n")
    out = tmp_path / "counts.json"
    parser = argparse.ArgumentParser()
    dv.register(parser.add_subparsers())
    args = parser.parse_args(["draft-vocab-recount", "--url", smol_server.base_url, "--api-key-file", str(key_file),
                              "--out", str(out), "--prompts", "1", "--max-tokens", "16"])
    assert args.func(args) == 0
    data = json.loads(out.read_text())
    assert data["format"] == dv.COUNTS_FORMAT and data["model"] == smol_server.served_model_name
    counts = Counter({int(k): v for k, v in data["counts"].items()})
    assert sum(counts.values()) == data["generated_tokens"] > 0

    reply = smol_server.openai().chat.completions.create(
        model=smol_server.served_model_name, messages=[{"role": "user", "content": dv.RECOUNT_PROMPTS[0]}],
        max_tokens=16, temperature=0, logprobs=True, extra_body={"return_tokens_as_token_ids": True})
    tokens = [item.token for item in reply.choices[0].logprobs.content]
    assert all(t.startswith("token_id:") for t in tokens)
    assert Counter(int(t.split(":", 1)[1]) for t in tokens) == counts


def test_recount_with_a_wrong_key_is_a_clear_error(smol_server):
    with pytest.raises(PrepareError, match="HTTP 401"):
        dv.recount(smol_server.base_url, "wrong-key", prompts=1, max_tokens=4, model=smol_server.served_model_name)
