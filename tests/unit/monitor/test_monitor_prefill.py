"""The monitor's per-request prefill progress: parsing /hyperqwen/prefill (vLLM patch 0060) and showing it.

The upstream here serves a captured /metrics text and a /hyperqwen/prefill document in the route's format
(tests/integration/test_long_context_progress.py parses the real route's answer with the same code).
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from aiohttp import web

from hyperqwen.monitor.config import MonitorConfig
from hyperqwen.monitor.prefill import PREFILL_PATH, PrefillFormatError, parse_prefill
from hyperqwen.monitor.server import Monitor, static_text

KEY = "hq-test-0123456789abcdef0123"
DOC = {
    "stream_interval_s": 1.0,
    "requests": [
        {"id": "cmpl-small-0", "computed_tokens": 512, "prompt_tokens": 1900, "tokens_per_s": None,
         "seconds_since_update": 0.1},
        {"id": "chatcmpl-big", "computed_tokens": 12288, "prompt_tokens": 100000, "tokens_per_s": 1000.0,
         "seconds_since_update": 0.5},
    ],
}


def config(upstream: str) -> MonitorConfig:
    return MonitorConfig(upstream=upstream, bind="127.0.0.1", listen_host="127.0.0.1", port=0, interval_s=1.0,
                         history_s=60, api_key=KEY, require_key=False)


def test_rows_largest_prompt_first_with_fraction_and_time_left() -> None:
    big, small = parse_prefill(DOC)
    assert big.id == "chatcmpl-big" and small.id == "cmpl-small-0"
    assert big.fraction == pytest.approx(0.12288)
    assert big.eta_s == pytest.approx((100000 - 12288) / 1000.0 - 0.5)  # counted from the last report
    assert small.eta_s is None  # one report only: no rate yet
    assert big.as_dict()["fraction"] == big.fraction and parse_prefill({"requests": []}) == []


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "'requests' list"),
        ({"requests": [{"computed_tokens": 1, "prompt_tokens": 2}]}, "string 'id'"),
        ({"requests": [{"id": "a", "computed_tokens": -1, "prompt_tokens": 2, "seconds_since_update": 0}]},
         "'computed_tokens' is -1"),
        ({"requests": [{"id": "a", "computed_tokens": 3, "prompt_tokens": 2, "seconds_since_update": 0}]},
         "computed_tokens 3 > prompt_tokens 2"),
        ({"requests": [{"id": "a", "computed_tokens": 1, "prompt_tokens": "2", "seconds_since_update": 0}]},
         "'prompt_tokens' is '2'"),
    ],
)
def test_a_malformed_answer_names_the_field(doc, message) -> None:
    with pytest.raises(PrefillFormatError, match=re.escape(message)):
        parse_prefill(doc)


async def _upstream(metrics_text: str, prefill_doc: dict | None) -> tuple[web.AppRunner, str]:
    """/metrics and (unless prefill_doc is None: stock vLLM) /hyperqwen/prefill, behind vLLM's Bearer check."""

    def authorized(request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {KEY}"

    async def metrics(request: web.Request) -> web.Response:
        if not authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.Response(text=metrics_text, content_type="text/plain")

    async def prefill(request: web.Request) -> web.Response:
        if not authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response(prefill_doc)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    if prefill_doc is not None:
        app.router.add_get(PREFILL_PATH, prefill)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def scrape(metrics_text: str, prefill_doc: dict | None) -> dict:
    async def scenario() -> dict:
        runner, url = await _upstream(metrics_text, prefill_doc)
        monitor = Monitor(config(url))
        try:
            async with aiohttp.ClientSession() as session:
                await monitor.scrape_once(session)
        finally:
            await runner.cleanup()
        return monitor.state()

    return asyncio.run(scenario())


def test_the_state_carries_the_prompts_being_filled(smol_capture) -> None:
    state = scrape(smol_capture.texts[-1], DOC)
    assert state["upstream"]["up"] is True
    prefill = state["prefill"]
    assert prefill["available"] is True and prefill["note"] is None
    assert [r["id"] for r in prefill["requests"]] == ["chatcmpl-big", "cmpl-small-0"]
    assert prefill["requests"][0]["computed_tokens"] == 12288 and prefill["requests"][0]["eta_s"] > 80


def test_a_server_without_the_route_still_shows_its_metrics(smol_capture) -> None:
    state = scrape(smol_capture.texts[-1], None)
    assert state["upstream"]["up"] is True and state["lifetime"] is not None
    assert state["prefill"]["available"] is False and state["prefill"]["requests"] == []
    assert "404" in state["prefill"]["note"] and "0060" in state["prefill"]["note"]


def test_a_malformed_answer_is_a_note_not_a_failed_scrape(smol_capture) -> None:
    state = scrape(smol_capture.texts[-1], {"requests": [{"id": 5}]})
    assert state["upstream"]["up"] is True
    assert state["prefill"]["available"] is False and "string 'id'" in state["prefill"]["note"]


def test_the_page_has_the_prefill_table() -> None:
    html, script = static_text("index.html"), static_text("app.js")
    assert 'id="prefill"' in html and 'id="prefill-note"' in html
    assert "renderPrefill(state.prefill)" in script
