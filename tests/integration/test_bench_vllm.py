"""The bench harness end to end against the real vLLM CPU server (SmolLM2-135M-Instruct, float32).

Speed numbers here are CPU numbers; the assertions check the harness's mechanics against the server's own
accounting (token counters, pool size, version), not speed. Budget: about a minute of requests on 2 cores,
sharing the session's smol_server.
"""

from __future__ import annotations

import argparse
import asyncio
import math

import pytest

from hyperqwen.bench.cli import register, run_workload
from hyperqwen.bench.render import render

pytestmark = [pytest.mark.integration, pytest.mark.server]


def bench(server, *argv: str) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *argv, "--url", server.base_url, "--api-key", server.api_key,
                              "--label", "integration (CPU)"])
    return asyncio.run(run_workload(args))


def test_chat_cohorts_count_what_the_server_counted(smol_server, tmp_path):
    import vllm

    before = smol_server.metrics()
    doc = bench(smol_server, "chat", "--concurrency", "1,2", "--requests", "2", "--max-tokens", "24")
    after = smol_server.metrics()

    cohorts = doc["results"]["cohorts"]
    assert [c["concurrency"] for c in cohorts] == [1, 2]
    records = [r for c in cohorts for r in c["per_request"]]
    assert all(c["errors"] == 0 for c in cohorts), [c.get("first_error") for c in cohorts]
    assert all(r["output_tokens_source"] == "usage" for r in records)
    # The harness's token total is the server's own generation counter delta (nothing else ran meanwhile).
    generated = after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0)
    assert sum(r["output_tokens"] for r in records) == generated
    for r in records:
        assert r["ttft_s"] > 0 and r["prompt_tokens"] > 0
        if r["decode_tok_s"] is not None:
            assert r["tpot_ms"] == pytest.approx(1000 / r["decode_tok_s"])
    for c in cohorts:
        assert c["aggregate_tok_s"] > 0 and c["decode_tok_s"]["median"] > 0
        assert c["spec_decode"] is None  # no speculation on this server: no counters, no made-up numbers
    env = doc["environment"]
    assert env["vllm_version"] == vllm.__version__
    assert env["hardware"] == "cpu" and env["pool"]["pool_tokens"] > 0
    path = tmp_path / "chat.json"
    path.write_text(__import__("json").dumps(doc))
    markdown = render([path])
    assert "CPU numbers" in markdown and "| 2 | 2 | 0 |" in markdown


def test_gates_run_against_the_real_server(smol_server):
    doc = bench(smol_server, "gates", "--max-tokens", "96", "--repeats", "2")
    gates = doc["results"]
    assert set(gates) == {"verbatim_copy", "tool_call_round_trip", "json_schema", "greedy_repeatable"}
    assert gates["greedy_repeatable"]["passed"], gates["greedy_repeatable"]
    # Structured outputs make even a 135M model emit schema-valid JSON.
    assert gates["json_schema"]["passed"], gates["json_schema"]
    # A 135M model need not copy 50 words exactly; the check itself must have run character by character.
    copy = gates["verbatim_copy"]
    assert copy["expected_chars"] > 250 and ("first_mismatch_at" in copy) != copy["passed"]
    assert doc["gates"] == {name: {"passed": value["passed"]} for name, value in gates.items()}


def test_prefill_and_prefix_cache(smol_server):
    prefill = bench(smol_server, "prefill", "--lengths", "256,1024", "--repeats", "1")["results"]
    assert prefill["tokens_exact"] is True  # sized with vLLM's /tokenize
    for row in prefill["rows"]:
        assert row["errors"] == 0, row["first_error"]
        # The whole prompt (template, salt, instruction) is sized to the target with the server's /tokenize.
        assert row["target_tokens"] - 20 <= row["prompt_tokens"]["median"] <= row["target_tokens"] + 5
        assert row["prefill_tok_s"]["median"] > 0
    prefix = bench(smol_server, "prefix", "--context-tokens", "1024", "--repeats", "1", "--max-tokens", "8")
    result = prefix["results"]
    assert result["errors"] == 0
    # Turn 2 repeats turn 1's prompt: the server reports cache hits (PREFIX_CACHE=1 on this server).
    assert result["prefix_cache"]["hit_tokens"] > 0
    assert result["ttft_turn2_s"]["median"] > 0


def test_quality_harnesses(smol_server):
    ppl = bench(smol_server, "perplexity", "--limit", "1", "--window-chars", "1500")["results"]
    assert ppl["tokens_scored"] > 100 and math.isfinite(ppl["perplexity"]) and ppl["perplexity"] > 1
    gsm = bench(smol_server, "gsm8k", "--limit", "2", "--max-tokens", "48", "--concurrency", "2")["results"]
    assert gsm["questions"] == 2 and 0 <= gsm["correct"] <= 2
    assert all(item["error"] is None for item in gsm["items"])


def test_long_document_tasks_and_needle(smol_server):
    longdoc = bench(smol_server, "longdoc", "--context-tokens", "1500", "--max-tokens", "48")["results"]
    kinds = {t.get("kind") for t in longdoc["tasks"] if "skipped" not in t}
    assert {"copy", "answer"} <= kinds
    assert longdoc["scored"] == sum(1 for t in longdoc["tasks"] if "passed" in t) > 0
    needle = bench(smol_server, "needle", "--context-tokens", "1200", "--depths", "0,1", "--max-tokens", "24")
    rows = needle["results"]["rows"]
    assert [r["depth"] for r in rows] == [0.0, 1.0]
    assert all(r["request"]["prompt_tokens"] > 1000 for r in rows)
