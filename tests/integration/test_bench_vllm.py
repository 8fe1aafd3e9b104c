"""The bench harness end to end against the real vLLM CPU server (SmolLM2-135M-Instruct, float32).

Speed numbers here are CPU numbers; the assertions check the harness's mechanics against the server's own
accounting (token counters, pool size, version), not speed. Budget: about a minute of requests on 2 cores,
sharing the session's smol_server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    # No greedy re-run here: the token total must be the cohorts' alone.
    doc = bench(smol_server, "chat", "--concurrency", "1,2", "--requests", "2", "--max-tokens", "24",
                "--check-samples", "0")
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
    assert doc["gates"].pop("requests")["passed"]  # every request of the run answered
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


# ---- patch 0050: the server's environment, behind the key --------------------------------------------------
def _route_app(tokens: list[str] | None):
    """The patched router in a bare FastAPI app, with vLLM's own auth middleware when tokens are given."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.entrypoints.serve.instrumentator.basic import router
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    app = FastAPI()
    app.include_router(router)
    if tokens:
        app.add_middleware(AuthenticationMiddleware, tokens=tokens)
    return TestClient(app)


@pytest.mark.needs_patch("0050-bench-environment-route.patch")
def test_environment_route_is_private_without_a_key(monkeypatch, tmp_path):
    from hyperqwen.launch.serverside import ENVIRONMENT_FILE_ENV, ROUTE, write_environment_file

    write_environment_file(tmp_path / "env.json")
    monkeypatch.setenv(ENVIRONMENT_FILE_ENV, str(tmp_path / "env.json"))
    # No API key on the server: vLLM installs no auth middleware, so the route must refuse by itself.
    response = _route_app(None).get(ROUTE)
    assert response.status_code == 403 and "API key" in response.json()["error"]
    client = _route_app(["k-0123456789"])
    assert client.get(ROUTE).status_code == 401
    body = client.get(ROUTE, headers={"Authorization": "Bearer k-0123456789"}).json()
    assert body["format"] == "hyperqwen-environment/1" and body["live"]["vllm_version"]
    assert body["platform"] in ("linux", "wsl2") and body["patch_series"]["patches"]


@pytest.mark.needs_patch("0050-bench-environment-route.patch")
def test_environment_route_on_the_server(smol_server):
    import requests
    import vllm

    from hyperqwen.launch.serverside import ROUTE

    url = smol_server.base_url + ROUTE
    assert requests.get(url, timeout=30).status_code == 401
    body = requests.get(url, headers={"Authorization": f"Bearer {smol_server.api_key}"}, timeout=30).json()
    assert body["live"]["vllm_version"] == vllm.__version__ and "device" not in body["live"]  # a CPU server
    assert smol_server.api_key not in json.dumps(body)
    if "knobs" in body:  # `hyperqwen serve` wrote the file: the knobs in effect, the key masked
        assert body["knobs"]["SPEC"] == "none" and body["knobs"]["VLLM_API_KEY"] == "****"


@pytest.mark.needs_patch("0050-bench-environment-route.patch")
def test_quick_suite_against_the_cpu_server(smol_server, tmp_path):
    """The whole field report, shrunk, on the real engine: every step runs, the report and plots exist, and
    the correctness gates are evaluated (a 135M model fails GSM8K: the run must exit 1, not 0)."""
    from hyperqwen.bench.cli import main

    code = main(["bench", "suite", "--quick", "--url", smol_server.base_url, "--api-key", smol_server.api_key,
                 "--out", str(tmp_path), "--skip", "longdoc"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["environment"]["hardware"] == "cpu"
    assert not [g for g in report["failed_gates"] if g.endswith((".requests", ".ran"))], report["failed_gates"]
    assert "gsm8k.gsm8k" in report["gates"] and "needle.needle" in report["gates"]
    assert code == (1 if report["failed_gates"] else 0)
    assert (tmp_path / "plots" / "decode_vs_concurrency.png").is_file()
    ladder = report["steps"]["ladder"]["results"]["steps"]
    assert [s["concurrency"] for s in ladder] == [1, 2, 4] and all(s["decode_reference_tok_s"] for s in ladder)
    md = (tmp_path / "report.md").read_text()
    assert "CPU numbers" in md and "```text" in md and smol_server.api_key not in md
