"""Each gate fails the run against a junk server and passes against a correct one (fake servers: no real
engine gives a known-correct or known-broken answer on demand; the integration tier runs the real vLLM)."""

from __future__ import annotations

import json
import re

import pytest

from hyperqwen.bench import checks, data
from hyperqwen.bench.cli import main

ENVIRONMENT = {
    "format": "hyperqwen-environment/1",
    "gpus": [{"name": "NVIDIA GeForce RTX 3090", "memory_total": "24576 MiB", "driver": "580.95",
              "power_limit": "250.00 W"}],
    "platform": "linux",
    "patch_series": {"patches": [{"name": "0001-auth-accept-x-api-key.patch", "sha256": "0" * 64}]},
    "model": {"manifest": "hyperqwen-manifest.json", "repo": "example/model", "revision": "abc123",
              "files_sha256": "f" * 64},
    "knobs": {"MODE": "single", "SPEC": "mtp", "VLLM_API_KEY": "****"},
    "live": {"vllm_version": "0.32.0", "torch": "2.9.0", "torch_cuda": "12.8"},
}


def _run(server, *argv: str) -> int:
    return main(["bench", *argv, "--url", server.base_url, "--api-key", server.config.api_key, "--run-id", "g"])


def _result(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


# ---- pure checks ------------------------------------------------------------------------------------------
def test_token_level_match_is_not_substring():
    assert not checks.contains_tokens("It closed in 2011.", "11")
    assert checks.contains_tokens("There were 11 of them.", "11")
    assert checks.contains_tokens("It measures 304.8 mm", "304.8")
    assert not checks.answer_matches("2011", ["11"])
    assert checks.answer_matches("1938.", ["1938"])
    # An echo of a whole document contains the answer but is far longer than an answer.
    assert not checks.answer_matches("In 1938 the last cargo passed; " * 20, ["1938"])


def test_needle_check_rejects_echo_and_decoy():
    code, decoy = checks.needle_code("r", "needle-0"), checks.needle_code("r", "decoy-0")
    assert checks.CODE_PATTERN.fullmatch(code) and code != decoy
    assert checks.needle_check(f" {code}\n", code)["passed"]
    assert checks.needle_check(f"The code is `{code}`.", code)["passed"]
    assert not checks.needle_check(decoy, code)["passed"]
    echo = f"... pump house on Garnet Ledge is {code}. ... ferry office on Stanning Quay is {decoy}. ..."
    assert not checks.needle_check(echo, code)["passed"]


def test_greedy_agreement():
    text = " ".join(f"word{i}" for i in range(100))
    assert checks.greedy_agreement(text, text)["agrees"]
    # A late fork (batched kernels reorder sums) still agrees; garbage does not.
    assert checks.greedy_agreement(text, text[:400] + " other words")["agrees"]
    assert not checks.greedy_agreement(text, "lorem ipsum dolor")["agrees"]
    assert not checks.greedy_agreement(text, "")["agrees"]


# ---- needle -------------------------------------------------------------------------------------------------
NEEDLE_RULE = [r"pump house on Garnet Ledge is ([A-Z2-9]{4}-[A-Z2-9]{4}-[A-Z2-9]{4})\.", r"\1"]


@pytest.mark.parametrize("mode,passes", [("oracle", True), ("echo", False), ("junk", False)])
def test_needle_gate(fake_server_factory, capsys, mode, passes):
    server = fake_server_factory(mode=mode, rules=[NEEDLE_RULE])
    code = _run(server, "needle", "--context-tokens", "1500", "--depths", "0,0.5,1")
    doc = _result(capsys)
    assert doc["gates"]["needle"]["passed"] is passes
    assert code == (0 if passes else 1)
    assert doc["results"]["found"] == (3 if passes else 0)


# ---- GSM8K --------------------------------------------------------------------------------------------------
def _gsm8k_rules() -> list[list[str]]:
    rows = data.read_jsonl(data.data_dir() / "gsm8k_sample.jsonl")
    return [[re.escape(row["question"][:80]), "The answer is " + row["answer"].split("####")[-1].strip() + "."]
            for row in rows]


@pytest.mark.parametrize("mode,passes", [("oracle", True), ("junk", False)])
def test_gsm8k_gate(fake_server_factory, capsys, mode, passes):
    server = fake_server_factory(mode=mode, rules=_gsm8k_rules())
    code = _run(server, "gsm8k", "--concurrency", "4")
    doc = _result(capsys)
    gate = doc["gates"]["gsm8k"]
    assert gate["passed"] is passes and gate["pass_mark"] == 0.85 and gate["questions"] == 20
    assert code == (0 if passes else 1)


# ---- long-document tasks ------------------------------------------------------------------------------------
def _longdoc_rules() -> list[list[str]]:
    root = data.data_dir()
    tasks = json.loads((root / "longdoc_tasks.json").read_text())
    paragraphs = data.corpus_paragraphs(root)

    def paragraph(starts: str) -> str:
        return next(p.text for p in paragraphs if p.text.startswith(starts)).replace("\\", "\\\\")

    rules = []
    for task in tasks["copy"]:
        starts = task["paragraph_starts"]
        rules.append([re.escape(f'begins with "{starts}" exactly'), paragraph(starts)])
    for task in tasks["edit"]:
        rules.append([re.escape(f'begins with "{task["paragraph_starts"]}", with every'),
                      paragraph(task["paragraph_starts"]).replace(task["replace"], task["with"])])
    for task in tasks["answer"]:
        rules.append([re.escape(task["question"]), task["accept"][0]])
    return rules


def test_longdoc_gate_passes_a_correct_server(fake_server_factory, capsys):
    server = fake_server_factory(mode="oracle", rules=_longdoc_rules())
    assert _run(server, "longdoc", "--context-tokens", "6000") == 0
    doc = _result(capsys)
    assert doc["gates"]["longdoc_exact"]["passed"] and not doc["gates"]["longdoc_exact"]["failed"]


def test_longdoc_gate_fails_an_echoing_server(fake_server_factory, capsys):
    server = fake_server_factory(mode="echo")
    assert _run(server, "longdoc", "--context-tokens", "6000") == 1
    doc = _result(capsys)
    answers = [t for t in doc["results"]["tasks"] if t.get("kind") == "answer"]
    assert answers and not any(t["passed"] for t in answers)  # the document holds every answer: not enough


# ---- failed requests, missing usage, greedy reference ---------------------------------------------------------
def test_all_requests_failing_exits_non_zero(fake_server_factory, capsys):
    server = fake_server_factory(mode="error")
    assert _run(server, "chat", "--concurrency", "2", "--max-tokens", "8", "--check-samples", "0") == 1
    doc = _result(capsys)
    gate = doc["gates"]["requests"]
    assert not gate["passed"] and gate["failed"] == gate["requests"] == 4 and "HTTP 500" in gate["first_error"]


def test_missing_usage_warns_and_counts_with_tokenize(fake_server_factory, capsys):
    server = fake_server_factory(mode="oracle", rules=[[r"\[bench", "one two three four five six seven eight"]],
                                 send_usage=False)
    assert _run(server, "chat", "--concurrency", "1", "--requests", "1", "--max-tokens", "64") == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    [cohort] = doc["results"]["cohorts"]
    assert cohort["output_tokens_source"] == "tokenize"
    # The fake's tokenizer counts 4 characters per token.
    assert cohort["per_request"][0]["output_tokens"] == len("one two three four five six seven eight") // 4
    assert "no_usage" in doc["warnings"] and "warning: the server sent no `usage`" in captured.err


def test_missing_usage_and_tokenize_falls_back_to_chunks_loudly(fake_server_factory, capsys):
    server = fake_server_factory(send_usage=False, tokenize=False)
    _run(server, "chat", "--concurrency", "1", "--requests", "1", "--max-tokens", "30", "--check-samples", "0")
    doc = _result(capsys)
    assert doc["results"]["cohorts"][0]["output_tokens_source"] == "chunks"
    assert "unreliable" in doc["warnings"]["no_usage_no_tokenize"]


@pytest.mark.parametrize("mode,passes", [("count", True), ("junk", False)])
def test_speed_outputs_checked_against_greedy_reference(fake_server_factory, capsys, mode, passes):
    server = fake_server_factory(mode=mode)
    code = _run(server, "chat", "--concurrency", "2", "--max-tokens", "24", "--check-samples", "2")
    doc = _result(capsys)
    gate = doc["gates"]["outputs_match_greedy_reference"]
    assert gate["checked"] == 2 and gate["passed"] is passes and code == (0 if passes else 1)


# ---- environment from the server ----------------------------------------------------------------------------
def test_environment_comes_from_the_server_route(fake_server_factory, capsys):
    server = fake_server_factory(environment=ENVIRONMENT)
    _run(server, "chat", "--concurrency", "1", "--requests", "1", "--max-tokens", "4", "--check-samples", "0")
    env = _result(capsys)["environment"]
    assert env["hardware"] == "gpu" and env["hardware_source"] == "server environment"
    assert env["server"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 3090"
    assert env["knobs"]["SPEC"] == "mtp" and env["knobs_source"] == "server environment"
    assert "cpus" in env["bench_host"]  # the bench host is recorded, separately


def test_environment_route_missing_is_said(fake_server_factory, capsys):
    server = fake_server_factory()
    _run(server, "chat", "--concurrency", "1", "--requests", "1", "--max-tokens", "4", "--check-samples", "0")
    env = _result(capsys)["environment"]
    assert env["server"] is None and "404" in env["server_note"] and env["hardware"] == "unknown"
