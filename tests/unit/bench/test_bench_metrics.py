"""Definitions, /metrics parsing and the checks the workloads apply."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from hyperqwen.bench import prom
from hyperqwen.bench.client import BenchError, normalize_base_url
from hyperqwen.bench.definitions import (
    RequestRecord,
    cohort_summary,
    percentile,
    summarize,
)
from hyperqwen.bench.workloads import (
    ANSWER_SCHEMA,
    extract_final_number,
    first_mismatch,
    gsm8k_target,
    numbers_equal,
    prompt_token_logprobs,
    validate_json,
    verbatim_check,
)


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5, 1, 4, 2, 3], list(np.random.default_rng(3).random(37))])
@pytest.mark.parametrize("q", [0, 10, 50, 90, 100])
def test_percentile_is_numpy_linear(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_rejects_empty_and_bad_q():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_request_record_definitions():
    record = RequestRecord(t_sent=10.0, t_first=10.5, t_last=12.5, t_end=12.6, output_tokens=41, prompt_tokens=300)
    assert record.ttft_s == pytest.approx(0.5)
    assert record.decode_tok_s == pytest.approx(40 / 2.0)
    assert record.tpot_ms == pytest.approx(50.0)
    assert record.e2e_s == pytest.approx(2.6)
    assert record.prefill_tok_s == pytest.approx(600.0)
    # One token, or one chunk: no decode rate (undefined, not zero or infinite).
    assert RequestRecord(t_sent=0, t_first=1, t_last=1, output_tokens=5).decode_tok_s is None
    assert RequestRecord(t_sent=0, t_first=1, t_last=2, output_tokens=1).decode_tok_s is None


def test_cohort_summary_aggregate_counts_tokens_over_wall_time():
    records = [RequestRecord(t_sent=0.0, t_first=0.2, t_last=1.2, t_end=1.3, output_tokens=11),
               RequestRecord(t_sent=0.1, t_first=0.4, t_last=2.4, t_end=2.5, output_tokens=21),
               RequestRecord(t_sent=0.1, t_end=0.2, error="HTTP 500: boom")]
    summary = cohort_summary(records, 0.0, 2.5)
    assert summary["errors"] == 1 and summary["requests"] == 3
    assert summary["aggregate_tok_s"] == pytest.approx(32 / 2.5)
    assert summary["decode_tok_s"]["median"] == pytest.approx((10.0 + 10.0) / 2)
    assert summary["ttft_s"]["n"] == 2
    assert summarize([None, None]) is None


def _vllm_like_metrics(drafts: int, accepted: list[int], k: int = 3, engines: int = 1) -> str:
    """Exposition text produced by prometheus_client with vLLM 0.32.0's metric names and labels."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    c_drafts = Counter("vllm:spec_decode_num_drafts", "d", labels, registry=registry)
    c_tokens = Counter("vllm:spec_decode_num_draft_tokens", "d", labels, registry=registry)
    c_acc = Counter("vllm:spec_decode_num_accepted_tokens", "d", labels, registry=registry)
    c_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "d", labels + ["position"], registry=registry)
    info = Gauge("vllm:cache_config_info", "i", ["block_size", "num_gpu_blocks", "kv_cache_size_tokens", "engine"],
                 registry=registry)
    for e in range(engines):
        c_drafts.labels("m", str(e)).inc(drafts)
        c_tokens.labels("m", str(e)).inc(drafts * k)
        c_acc.labels("m", str(e)).inc(sum(accepted))
        for pos, value in enumerate(accepted):
            c_pos.labels("m", str(e), str(pos)).inc(value)
    info.labels("16", "1000", "None", "0").set(1)
    return generate_latest(registry).decode()


def test_spec_decode_delta_from_real_prometheus_exposition():
    before = prom.CounterSnapshot.from_text(_vllm_like_metrics(100, [80, 50, 20]))
    after = prom.CounterSnapshot.from_text(_vllm_like_metrics(300, [240, 160, 70]))
    delta = prom.spec_decode_delta(before, after)
    assert delta["drafts"] == 200
    assert delta["tokens_per_verify_step"] == pytest.approx(1 + (470 - 150) / 200)
    assert delta["acceptance_per_position"] == pytest.approx([160 / 200, 110 / 200, 50 / 200])
    assert delta["acceptance_rate"] == pytest.approx(320 / 600)


def test_spec_decode_sums_engines_and_handles_absence():
    two = prom.CounterSnapshot.from_text(_vllm_like_metrics(10, [5, 2, 1], engines=2))
    assert two.drafts == 20 and two.accepted_per_pos == {0: 10, 1: 4, 2: 2}
    none = prom.CounterSnapshot.from_text("# no speculation here\nvllm:num_requests_running 0\n")
    assert prom.spec_decode_delta(none, none) is None


def test_pool_size_from_metrics_and_log():
    pool = prom.pool_size_from_metrics(_vllm_like_metrics(1, [0, 0, 0]))
    assert pool["pool_tokens"] == 16000  # kv_cache_size_tokens "None" -> blocks x block size
    log = "INFO ... GPU KV cache size: 69,758 tokens, Maximum concurrency for 65,536 tokens per request: 1.06x\n"
    assert prom.pool_size_from_log(log) == {"source": "server log", "pool_tokens": 69758}
    assert prom.pool_size_from_log("nothing") is None


def test_verbatim_check_reports_first_mismatch():
    assert verbatim_check("abc def", "  abc def\n")["passed"]
    assert verbatim_check("abc def", "```\nabc def\n```")["passed"]
    failed = verbatim_check("abc def", "abc dXf")
    assert not failed["passed"] and failed["first_mismatch_at"] == 5
    assert first_mismatch("abc", "abcd") == 3


def test_gsm8k_extraction():
    assert gsm8k_target("so 5 + 5 = 10\n#### 1,110") == "1110"
    assert extract_final_number("12 + 3 = 15. The answer is 1,110.") == "1110"
    assert extract_final_number("first 3 then 21.6") == "21.6"
    assert numbers_equal("21.60", "21.6") and not numbers_equal(None, "3") and not numbers_equal("4", "3")
    with pytest.raises(BenchError):
        gsm8k_target("no marker")


def test_validate_json_schema():
    assert validate_json({"title": "x", "year": 1797, "locks": 23, "reopened": True}, ANSWER_SCHEMA) == []
    assert validate_json({"title": "x", "year": "1797", "locks": 23, "reopened": True}, ANSWER_SCHEMA)
    assert validate_json({"title": "x", "year": 1797, "locks": 23}, ANSWER_SCHEMA)


def test_prompt_token_logprobs_picks_actual_token():
    choice = {"prompt_token_ids": [5, 9, 2],
              "prompt_logprobs": [None, {"9": {"logprob": -1.5}, "4": {"logprob": -0.5}}, {"2": {"logprob": -0.25}}]}
    assert prompt_token_logprobs(choice) == [-1.5, -0.25]
    with pytest.raises(BenchError):
        prompt_token_logprobs({"prompt_logprobs": None})


@pytest.mark.parametrize("url,root", [("http://h:1", "http://h:1"), ("http://h:1/v1/", "http://h:1"),
                                      ("https://h/x/v1", "https://h/x")])
def test_normalize_base_url(url, root):
    assert normalize_base_url(url) == root


def test_normalize_base_url_rejects_missing_scheme():
    with pytest.raises(BenchError, match="--url"):
        normalize_base_url("localhost:18020")
