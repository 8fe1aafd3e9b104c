"""The monitor's HTTP side: key guard, page, JSON state, and scraping an upstream.

The upstream here replays /metrics text captured from the real vLLM CPU server, one capture per scrape,
behind the same Bearer check vLLM applies (tests/integration/test_monitor_browser.py runs the real server).
"""

from __future__ import annotations

import asyncio
import base64

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hyperqwen.monitor.config import MonitorConfig
from hyperqwen.monitor.server import Monitor, key_matches, make_app, static_text

KEY = "hq-test-0123456789abcdef0123"


def config(upstream: str = "http://127.0.0.1:9", *, require_key: bool = False, api_key: str | None = KEY,
           interval: float = 1.0) -> MonitorConfig:
    return MonitorConfig(upstream=upstream, bind="127.0.0.1", listen_host="127.0.0.1", port=0,
                         interval_s=interval, history_s=60, api_key=api_key, require_key=require_key)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_key_matches() -> None:
    assert key_matches(f"Bearer {KEY}", KEY)
    assert key_matches(basic("anyone", KEY), KEY)
    assert key_matches(basic("", KEY), KEY)
    assert not key_matches(f"Bearer {KEY}x", KEY)
    assert not key_matches(basic(KEY, "wrong"), KEY)
    assert not key_matches("Basic not-base64!", KEY)
    assert not key_matches(None, KEY) and not key_matches("", KEY) and not key_matches(KEY, KEY)


def run(coro):
    return asyncio.run(coro)


async def _client(monitor: Monitor) -> TestClient:
    client = TestClient(TestServer(make_app(monitor, start_scraper=False)))
    await client.start_server()
    return client


def test_guard_when_the_key_is_required() -> None:
    async def scenario():
        client = await _client(Monitor(config(require_key=True)))
        try:
            page = await client.get("/")
            assert page.status == 401
            assert page.headers["WWW-Authenticate"].startswith("Basic realm=")
            assert KEY not in await page.text()
            assert (await client.get("/api/state", headers={"Authorization": "Bearer nope"})).status == 401
            assert (await client.get("/static/app.js")).status == 401
            health = await client.get("/healthz")
            assert health.status == 200
            page = await client.get("/", headers={"Authorization": basic("me", KEY)})
            assert page.status == 200 and "HyperQwen monitor" in await page.text()
            state = await client.get("/api/state", headers={"Authorization": f"Bearer {KEY}"})
            assert state.status == 200 and (await state.json())["upstream"]["up"] is False
        finally:
            await client.close()

    run(scenario())


def test_open_on_loopback_and_serves_its_files() -> None:
    async def scenario():
        client = await _client(Monitor(config(require_key=False)))
        try:
            page = await client.get("/")
            assert page.status == 200 and page.content_type == "text/html"
            html = await page.text()
            assert '<script src="/static/app.js">' in html and '/static/style.css' in html
            assert "default-src 'self'" in page.headers["Content-Security-Policy"]
            script = await client.get("/static/app.js")
            assert script.content_type == "text/javascript" and "/api/state" in await script.text()
            assert (await client.get("/static/style.css")).status == 200
            assert (await client.get("/static/../__init__.py")).status == 404
            assert (await client.get("/static/index.html")).status == 404
        finally:
            await client.close()

    run(scenario())


def test_page_has_an_element_for_every_number_the_script_sets() -> None:
    import re

    html, script = static_text("index.html"), static_text("app.js")
    ids = set(re.findall(r'\bset\("([a-z0-9-]+)"', script)) | set(re.findall(r'\$\("([a-z0-9-]+)"\)', script))
    missing = [i for i in sorted(ids) if f'id="{i}"' not in html]
    assert ids and not missing, missing


async def _replay_upstream(texts: list[str], key: str) -> tuple[web.AppRunner, str, list[int]]:
    """Serves the captured scrapes in order (the last one repeats), behind vLLM's Bearer check."""
    served = [0]

    async def metrics(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        text = texts[min(served[0], len(texts) - 1)]
        served[0] += 1
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", served


def test_scraping_a_replayed_server_fills_the_state(capture) -> None:
    async def scenario():
        runner, url, served = await _replay_upstream(capture.texts, KEY)
        monitor = Monitor(config(url))
        try:
            async with aiohttp.ClientSession() as session:
                for _ in capture.texts:
                    await monitor.scrape_once(session)
        finally:
            await runner.cleanup()
        assert served[0] == len(capture.texts)
        state = monitor.state()
        assert state["upstream"]["up"] is True and state["upstream"]["scrapes"] == len(capture.texts)
        assert state["lifetime"]["finished_total"] == len(capture.requests)
        assert state["lifetime"]["generation_tokens"] == sum(r["completion_tokens"] for r in capture.requests)
        rows = state["requests"]  # newest first
        assert [r["output_tokens"] for r in rows] == [r["completion_tokens"] for r in reversed(capture.requests)]
        assert state["model_name"] == "qwen3.8-27b"

    run(scenario())


def test_wrong_key_and_dead_upstream_are_reported_without_the_key(capture) -> None:
    async def scenario():
        runner, url, _ = await _replay_upstream(capture.texts, "hq-some-other-key-0000000000")
        monitor = Monitor(config(url))
        try:
            async with aiohttp.ClientSession() as session:
                await monitor.scrape_once(session)
        finally:
            await runner.cleanup()
        assert monitor.status.up is False and "401" in monitor.status.error
        assert "VLLM_API_KEY" in monitor.status.error and KEY not in monitor.status.error

        dead = Monitor(config(url))  # the replay server is gone now
        async with aiohttp.ClientSession() as session:
            await dead.scrape_once(session)
        assert dead.status.up is False and "is the server up" in dead.status.error
        assert dead.state()["lifetime"] is None

    run(scenario())


def test_scraper_task_runs_on_its_cadence(capture) -> None:
    async def scenario():
        runner, url, served = await _replay_upstream(capture.texts, KEY)
        monitor = Monitor(config(url, interval=0.2))
        client = TestClient(TestServer(make_app(monitor)))
        await client.start_server()
        try:
            await asyncio.sleep(1.1)
            state = await (await client.get("/api/state")).json()
        finally:
            await client.close()
            await runner.cleanup()
        assert 3 <= served[0] <= 8  # ~6 at 0.2 s; slack for a loaded machine
        assert state["upstream"]["up"] is True and len(state["series"]["t"]) == state["upstream"]["scrapes"] - 1

    run(scenario())
