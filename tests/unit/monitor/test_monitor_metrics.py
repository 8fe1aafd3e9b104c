"""Parsing real /metrics text captured from the vLLM 0.32.0 CPU server."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hyperqwen.monitor.metrics import HISTOGRAMS, MetricsFormatError, parse_scrape


def samples_by_name(text: str) -> dict[str, float]:
    """Every sample summed by name: the plain reduction the monitor's numbers must agree with."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def test_every_scrape_agrees_with_the_raw_samples(capture) -> None:
    for text, time in zip(capture.texts, capture.times, strict=True):
        raw = samples_by_name(text)
        scrape = parse_scrape(text, time)
        assert scrape.time == time
        assert scrape.generation_tokens == raw["vllm:generation_tokens_total"]
        assert scrape.prompt_tokens == raw["vllm:prompt_tokens_total"]
        assert scrape.finished_total == raw["vllm:request_success_total"]
        assert scrape.running == raw["vllm:num_requests_running"]
        assert scrape.waiting == raw["vllm:num_requests_waiting"]
        assert scrape.kv_usage == raw["vllm:kv_cache_usage_perc"]
        for key, name in HISTOGRAMS.items():
            assert scrape.histogram(key).sum == raw[f"{name}_sum"], key
            assert scrape.histogram(key).count == raw[f"{name}_count"], key
        assert scrape.model_name == "qwen3.8-27b"


def test_finished_requests_match_what_the_client_saw(capture) -> None:
    final = parse_scrape(capture.texts[-1], capture.times[-1])
    assert final.finished_total == len(capture.requests)
    reasons: dict[str, int] = {}
    for request in capture.requests:
        reasons[request["finish_reason"]] = reasons.get(request["finish_reason"], 0) + 1
    assert {r: round(n) for r, n in final.finished.items() if n} == reasons
    assert final.histogram("request_prompt_tokens").sum == sum(r["prompt_tokens"] for r in capture.requests)
    assert final.histogram("request_generation_tokens").sum == sum(r["completion_tokens"] for r in capture.requests)
    # Every prompt token the engine counted came from these requests (idle server before).
    assert final.prompt_tokens == sum(r["prompt_tokens"] for r in capture.requests)
    assert final.generation_tokens == sum(r["completion_tokens"] for r in capture.requests)


def test_idle_server_reads_as_zero(capture) -> None:
    idle = parse_scrape(capture.texts[0], capture.times[0])
    assert idle.generation_tokens == 0 and idle.finished_total == 0
    assert idle.running == 0 and idle.waiting == 0
    assert idle.kv_usage == 0


def test_speculative_counters_only_with_speculation(mtp_capture, smol_capture) -> None:
    smol = parse_scrape(smol_capture.texts[-1], 0.0)
    assert smol.spec_drafts is None and smol.spec_accepted_per_pos == {}
    mtp = parse_scrape(mtp_capture.texts[-1], 0.0)
    raw = samples_by_name(mtp_capture.texts[-1])
    assert mtp.spec_drafts == raw["vllm:spec_decode_num_drafts_total"] > 0
    assert mtp.spec_accepted == raw["vllm:spec_decode_num_accepted_tokens_total"]
    assert mtp.spec_draft_tokens == raw["vllm:spec_decode_num_draft_tokens_total"]
    # One counter per draft position (DRAFT_TOKENS of the capture's server).
    assert sorted(mtp.spec_accepted_per_pos) == list(range(int(mtp_capture.knobs["DRAFT_TOKENS"])))
    assert sum(mtp.spec_accepted_per_pos.values()) == mtp.spec_accepted


def test_prefix_cache_counters(smol_capture) -> None:
    final = parse_scrape(smol_capture.texts[-1], 0.0)
    raw = samples_by_name(smol_capture.texts[-1])
    assert final.prefix_queries == raw["vllm:prefix_cache_queries_total"] > 0
    assert final.prefix_hits == raw["vllm:prefix_cache_hits_total"]
    assert final.cache_info.get("enable_prefix_caching") == "True"


@pytest.mark.parametrize("text", ["", "# HELP x y\n# TYPE x counter\nx_total 3\n", "<html>login</html>\n"])
def test_non_vllm_answers_are_refused(text: str) -> None:
    with pytest.raises(MetricsFormatError):
        parse_scrape(text, 0.0)


def with_connector_counters(text: str, queries: float, hits: float) -> str:
    """A real capture with the KV connector's two counters set by hand, as a server with RAM_CACHE (vLLM's native
    offloading connector) exports them: the connector's copies need CUDA, so no CPU capture has nonzero values."""
    out = []
    for line in text.splitlines():
        if line.startswith("vllm:external_prefix_cache_queries_total{"):
            line = line.rsplit(" ", 1)[0] + f" {queries}"
        elif line.startswith("vllm:external_prefix_cache_hits_total{"):
            line = line.rsplit(" ", 1)[0] + f" {hits}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_ram_cache_counters_are_zero_without_a_connector_and_read_with_one(smol_capture) -> None:
    text = smol_capture.texts[-1]
    plain = parse_scrape(text, 0.0)
    assert plain.ram_cache_queries == 0 and plain.ram_cache_hits == 0
    offloading = parse_scrape(with_connector_counters(text, 40_000.0, 30_000.0), 0.0)
    assert (offloading.ram_cache_queries, offloading.ram_cache_hits) == (40_000.0, 30_000.0)
    assert offloading.prefix_hits == plain.prefix_hits  # the GPU pool's own hits stay apart
