"""`hyperqwen bench suite --quick` end to end against fake servers: one report (JSON, Markdown, plots), the
reference side by side, exit codes from the gates, and resuming from completed steps."""

from __future__ import annotations

import json

import pytest
from test_bench_gates import ENVIRONMENT, NEEDLE_RULE, _gsm8k_rules, _longdoc_rules

from hyperqwen.bench import report, suite
from hyperqwen.bench.cli import main

pytest.importorskip("matplotlib", reason="the bench extra's matplotlib draws the plots")


def _suite(server, out, *extra: str) -> int:
    return main(["bench", "suite", "--url", server.base_url, "--api-key", server.config.api_key, "--quick",
                 "--out", str(out), "--run-id", "s", *extra])


def test_quick_suite_on_a_correct_server(fake_server_factory, tmp_path, capsys):
    reproduce = [r"<document>\n(.*)\n</document>\n\nReproduce the document", r"\1"]
    server = fake_server_factory(mode="oracle", rules=[NEEDLE_RULE, reproduce, *_gsm8k_rules(), *_longdoc_rules()],
                                 environment=ENVIRONMENT, max_model_len=8192)
    # The fake has no /v1/completions with prompt_logprobs: perplexity fails its step, the rest still runs.
    code = _suite(server, tmp_path)
    err = capsys.readouterr().err
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["schema"] == report.REPORT_SCHEMA and doc["quick"] is True
    assert list(doc["steps"]) == list(suite.STEP_NAMES)
    assert doc["failed_gates"] == ["perplexity.ran"] and code == 1, doc["failed_gates"]
    for gate in ("needle.needle", "gsm8k.gsm8k", "longdoc.longdoc_exact", "ladder.outputs_match_greedy_reference",
                 "chat_greedy.requests"):
        assert doc["gates"][gate]["passed"], gate
    # Server environment, bench host apart; the reference beside ours with ratios.
    assert doc["environment"]["hardware"] == "gpu" and doc["environment"]["knobs"]["SPEC"] == "mtp"
    rows = {r["id"]: r for r in doc["reference"]}
    c1 = rows["decode-c1-mtp4-greedy"]
    assert c1["ours"] and c1["ratio"] == pytest.approx(c1["ours"] / 119.9) and c1["same_configuration"] is True
    assert rows["decode-c1-dflash7-greedy"]["same_configuration"] is False
    # Plots exist and are PNG files.
    for name in ("decode_vs_concurrency", "ttft_vs_prompt_length", "acceptance_per_position"):
        assert (tmp_path / doc["plots"][name]).read_bytes()[:4] == b"\x89PNG", name
    md = (tmp_path / "report.md").read_text()
    assert "## Against the reference" in md and "C x 1000 / mean TPOT" in md and "decode tok/s, ours" in md
    assert "```text\nhyperqwen field report (QUICK" in md and "NVIDIA GeForce RTX 3090" in md
    assert "perplexity: " in err and server.config.api_key not in md + err + json.dumps(doc)


def test_suite_resumes_and_fails_on_junk(fake_server_factory, tmp_path, capsys):
    junk = fake_server_factory(mode="junk")
    assert _suite(junk, tmp_path, "--only", "chat_greedy", "--only", "needle") == 1
    saved = tmp_path / "steps" / "chat_greedy.json"
    first = saved.read_text()
    capsys.readouterr()
    # Completed steps are kept: a re-run does not send them again.
    assert _suite(junk, tmp_path, "--only", "chat_greedy", "--only", "needle") == 1
    assert "chat_greedy: kept from an earlier run" in capsys.readouterr().err
    assert saved.read_text() == first
    doc = json.loads((tmp_path / "report.json").read_text())
    assert not doc["gates"]["needle.needle"]["passed"]
    assert not doc["gates"]["chat_greedy.outputs_match_greedy_reference"]["passed"]
    # --restart runs them again.
    assert _suite(junk, tmp_path, "--only", "chat_greedy", "--restart") == 1
    assert saved.read_text() != first


def test_reference_file_rows_cite_a_source_and_resolve():
    reference = report.load_reference()
    for row in reference["rows"]:
        assert row["source"] in reference["sources"], row["id"]
        assert row["ours"].split(".")[0] in suite.STEP_NAMES, row["id"]
        assert row["value"] > 0 and row["definition"]
    steps = {"ladder": {"results": {"steps": [{"concurrency": 8, "aggregate_tok_s": 300.0}]}},
             "prefill": {"results": {"rows": [{"target_tokens": 1024, "prefill_tok_s": {"median": 900.0}}]}}}
    assert report.resolve(steps, "ladder.steps[C=8].aggregate_tok_s") == 300.0
    assert report.resolve(steps, "prefill.rows[target=1024].prefill_tok_s.median") == 900.0
    assert report.resolve(steps, "ladder.steps[C=64].aggregate_tok_s") is None
    assert report.resolve(steps, "gsm8k.exact_match") is None


def test_quick_plan_fits_a_small_context():
    plan = suite.plan(quick=False, max_len=32768)
    by_name = {s.name: s for s in plan.steps}
    assert "100000" not in by_name["prefill"].options["lengths"]
    assert all(int(n) <= 32768 - 64 for n in by_name["prefill"].options["lengths"].split(","))
    assert by_name["reproduce"].options["context_tokens"] * 2.2 <= 32768
    full = suite.plan(quick=False, max_len=131072)
    assert "100000" in {s.name: s for s in full.steps}["prefill"].options["lengths"]


@pytest.mark.parametrize("max_len,expected", [(65536, []), (131072, []), (131072 + 128, ["needle_128k"]),
                                              (262144, ["needle_128k", "needle_200k"])])
def test_long_context_needles_run_only_where_the_served_context_holds_them(max_len, expected):
    steps = [s for s in suite.plan(quick=False, max_len=max_len).steps if s.name.startswith("needle_")]
    assert [s.name for s in steps] == expected
    for step in steps:
        assert step.workload == "needle"
        assert step.options["context_tokens"] + 128 <= max_len
    assert not [s for s in suite.plan(quick=True, max_len=262144).steps if s.name.startswith("needle_")]
