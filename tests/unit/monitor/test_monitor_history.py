"""Rates, windows and the recent-requests table, from real captured /metrics."""

from __future__ import annotations

import dataclasses

import pytest

from hyperqwen.monitor.history import REQUEST_ROWS, History, Interval, RequestRow
from hyperqwen.monitor.metrics import parse_scrape


def scrapes(capture, times=None):
    times = times or capture.times
    return [parse_scrape(text, t) for text, t in zip(capture.texts, times, strict=True)]


def test_one_request_per_scrape_gives_exact_rows(capture) -> None:
    history = History(max_intervals=100)
    for scrape in scrapes(capture):
        history.add(scrape)
    rows = list(history.requests)
    # The capture scraped after every request, so each row is exactly one request, in order.
    assert [r.count for r in rows] == [1] * len(capture.requests)
    for row, seen in zip(rows, capture.requests, strict=True):
        assert row.exact
        assert row.prompt_tokens == seen["prompt_tokens"]
        assert row.output_tokens == seen["completion_tokens"]
        assert row.finish_reasons == {seen["finish_reason"]: 1}
        # vLLM times from arrival at the API server; the client's clock starts earlier and ends later.
        assert 0 < row.duration_s <= seen["client_duration_s"]
        # Queue + prefill misses tokenization only: never above what the client saw.
        assert 0 < row.ttft_s <= seen["client_ttft_s"]
        assert row.ttft_s <= row.duration_s


def test_requests_between_the_same_two_scrapes_form_one_group_row(capture) -> None:
    history = History(max_intervals=10)
    everything = scrapes(capture)
    history.add(everything[0])
    history.add(everything[-1])
    [row] = history.requests
    n = len(capture.requests)
    assert row.count == n and not row.exact
    assert row.prompt_tokens == sum(r["prompt_tokens"] for r in capture.requests)
    assert row.output_tokens == sum(r["completion_tokens"] for r in capture.requests)
    reasons: dict[str, int] = {}
    for r in capture.requests:
        reasons[r["finish_reason"]] = reasons.get(r["finish_reason"], 0) + 1
    assert row.finish_reasons == reasons
    # Means: the group's e2e mean equals the mean of the exact rows.
    exact = History(max_intervals=100)
    for scrape in everything:
        exact.add(scrape)
    assert row.duration_s == pytest.approx(sum(r.duration_s for r in exact.requests) / n)
    assert row.ttft_s == pytest.approx(sum(r.ttft_s for r in exact.requests) / n)


def test_rates_are_counter_differences_over_time(capture) -> None:
    # Re-time the real scrapes 10 s apart so the expected rates are plain arithmetic.
    items = scrapes(capture, times=[1000.0 + 10 * i for i in range(len(capture.times))])
    history = History(max_intervals=100)
    for scrape in items:
        history.add(scrape)
    series = history.series()
    for i, (before, after) in enumerate(zip(items, items[1:])):
        assert series["t"][i] == after.time
        assert series["generation_tps"][i] == pytest.approx((after.generation_tokens - before.generation_tokens) / 10)
        assert series["prompt_tps"][i] == pytest.approx((after.prompt_tokens - before.prompt_tokens) / 10)
        d_count = after.histogram("ttft").count - before.histogram("ttft").count
        if d_count:
            expected = (after.histogram("ttft").sum - before.histogram("ttft").sum) / d_count
            assert series["ttft_s"][i] == pytest.approx(expected)
        else:
            assert series["ttft_s"][i] is None
        assert series["kv_usage"][i] == after.kv_usage
        assert series["running"][i] == after.running
    whole = history.summary(10_000)
    assert whole.seconds == 10 * (len(items) - 1)
    assert whole.generation_tps == pytest.approx(items[-1].generation_tokens / whole.seconds)
    assert whole.finished == len(capture.requests)
    # The last window of 10 s is the last interval only.
    last = history.summary(10)
    assert last.generation_tps == pytest.approx(series["generation_tps"][-1])


def test_speculative_acceptance_from_the_mtp_server(mtp_capture) -> None:
    history = History(max_intervals=100)
    for scrape in scrapes(mtp_capture):
        history.add(scrape)
    final = history.latest
    life = history.lifetime()
    assert life["spec_tokens_per_step"] == pytest.approx(1 + final.spec_accepted / final.spec_drafts)
    per_pos = life["spec_per_position"]
    assert len(per_pos) == int(mtp_capture.knobs["DRAFT_TOKENS"])
    assert all(0.0 <= p <= 1.0 for p in per_pos)
    # A draft token counts as accepted only if every earlier one was: acceptance never rises with position.
    assert per_pos == sorted(per_pos, reverse=True)
    # Tokens per step = 1 + the sum of the per-position acceptance rates.
    assert life["spec_tokens_per_step"] == pytest.approx(1 + sum(per_pos))
    summary = history.summary(10_000)
    assert summary.spec_tokens_per_step == pytest.approx(life["spec_tokens_per_step"])
    assert summary.spec_per_position == pytest.approx(per_pos)
    state = history.state({"1m": 60}, 5)
    assert state["speculative"] is True
    # vLLM exports prefix-cache counters even with caching off; the page must say "off" there.
    assert state["prefix_cache"] is False


def test_prefix_hit_rate(smol_capture) -> None:
    history = History(max_intervals=100)
    items = scrapes(smol_capture)
    for scrape in items:
        history.add(scrape)
    final = items[-1]
    assert history.lifetime()["prefix_hit_rate"] == pytest.approx(final.prefix_hits / final.prefix_queries)
    assert history.summary(10_000).prefix_hit_rate == pytest.approx(
        (final.prefix_hits - items[0].prefix_hits) / (final.prefix_queries - items[0].prefix_queries))
    state = history.state({"1m": 60}, 5)
    assert state["speculative"] is False and state["prefix_cache"] is True


def test_a_restarted_server_counts_from_zero(capture) -> None:
    items = scrapes(capture)
    history = History(max_intervals=10)
    history.add(items[-1])
    # Same server restarted: counters are back to the first scrape's (zero) values, then grow again.
    restarted = dataclasses.replace(items[1], time=items[-1].time + 5)
    interval = history.add(restarted)
    assert interval is not None
    assert interval.generation_tokens == items[1].generation_tokens
    assert interval.finished_total == items[1].finished_total
    [row] = history.requests
    assert row.count == round(items[1].finished_total)


def test_history_is_bounded(capture) -> None:
    items = scrapes(capture)
    history = History(max_intervals=2)
    for scrape in items:
        history.add(scrape)
    assert len(history.intervals) == 2
    assert history.intervals[-1].end == items[-1].time
    rows = History(max_intervals=1).requests
    assert rows.maxlen == REQUEST_ROWS


def test_a_scrape_not_newer_than_the_last_closes_no_interval(capture) -> None:
    items = scrapes(capture)
    history = History(max_intervals=10)
    history.add(items[1])
    assert history.add(dataclasses.replace(items[2], time=items[1].time)) is None
    assert not history.intervals


def test_empty_history_state_is_well_formed() -> None:
    state = History(max_intervals=5).state({"1m": 60.0}, 5.0)
    assert state["lifetime"] is None and state["requests"] == []
    assert state["now"]["generation_tps"] is None and state["series"]["t"] == []
    with pytest.raises(ValueError, match="max_intervals"):
        History(max_intervals=0)


def test_no_row_without_finished_requests(capture) -> None:
    items = scrapes(capture)
    idle = Interval.between(items[0], dataclasses.replace(items[0], time=items[0].time + 1))
    assert RequestRow.from_interval(idle) is None


def test_ram_cache_hits_over_a_window_and_in_all(smol_capture) -> None:
    """The host-RAM tier's hits (RAM_CACHE): tokens restored and the rate over the window; "off" while no
    connector answered a lookup. Counters set by hand on real captures (the connector needs CUDA)."""
    from test_monitor_metrics import with_connector_counters

    history = History(max_intervals=10)
    texts = smol_capture.texts[-3:]
    for t, (text, (queries, hits)) in enumerate(zip(texts, [(0, 0), (1000, 600), (3000, 2100)], strict=True)):
        history.add(parse_scrape(with_connector_counters(text, queries, hits), 100.0 + t))
    window = history.summary(10_000)
    assert window.ram_cache_hit_tokens == 2100 and window.ram_cache_hit_rate == pytest.approx(2100 / 3000)
    life = history.lifetime()
    assert life["ram_cache_hits"] == 2100 and life["ram_cache_hit_rate"] == pytest.approx(0.7)
    assert history.state({"5m": 300}, 60)["ram_cache"] is True
    plain = History(max_intervals=10)
    for t, text in enumerate(texts):
        plain.add(parse_scrape(text, 100.0 + t))
    assert plain.state({"5m": 300}, 60)["ram_cache"] is False and plain.summary(10_000).ram_cache_hit_rate is None
