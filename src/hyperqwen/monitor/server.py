"""The monitor service: scrape the vLLM server's /metrics (and /hyperqwen/prefill) on a timer, serve the page and
its JSON.

Routes: `/` (the page), `/static/*` (its script and style), `/api/state` (everything the page shows),
`/healthz` (liveness for compose; reveals nothing, so it needs no key).

When the page is reachable beyond loopback, every route but /healthz needs the API key: either
`Authorization: Bearer KEY` (scripts) or HTTP Basic with the key as the password (browsers ask for it;
any user name). The key is never logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hmac
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import aiohttp
from aiohttp import web

from hyperqwen.exit_codes import Exit
from hyperqwen.monitor.config import MonitorConfig
from hyperqwen.monitor.history import History
from hyperqwen.monitor.metrics import MetricsFormatError, parse_scrape
from hyperqwen.monitor.prefill import PREFILL_PATH, PrefillFormatError, PrefillRow, parse_prefill

log = logging.getLogger("hyperqwen.monitor")

STATIC_FILES = {"app.js": "text/javascript", "style.css": "text/css"}
WINDOWS_S = {"1m": 60.0, "5m": 300.0, "15m": 900.0}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def static_text(name: str) -> str:
    return resources.files("hyperqwen.monitor").joinpath("static", name).read_text(encoding="utf-8")


@dataclass
class UpstreamStatus:
    up: bool = False
    error: str | None = "not scraped yet"
    last_success: float | None = None
    last_attempt: float | None = None
    scrapes: int = 0
    failures: int = 0


@dataclass
class PrefillStatus:
    """The latest answer of the server's /hyperqwen/prefill (patch 0060): prompts being filled right now."""

    rows: list[PrefillRow] = field(default_factory=list)
    available: bool | None = None  # None: not asked yet; False: the route is missing or failed (note says why)
    note: str | None = None


@dataclass
class Monitor:
    config: MonitorConfig
    history: History = field(init=False)
    status: UpstreamStatus = field(default_factory=UpstreamStatus)
    prefill: PrefillStatus = field(default_factory=PrefillStatus)

    def __post_init__(self) -> None:
        self.history = History(self.config.max_intervals)

    def upstream_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        now = time.time()
        self.status.last_attempt = now
        url = f"{self.config.upstream}/metrics"
        try:
            async with session.get(url, headers=self.upstream_headers()) as response:
                if response.status in (401, 403):
                    raise UpstreamError(
                        f"{url} answered {response.status}: the monitor's API key is missing or "
                        "differs from the server's (VLLM_API_KEY / API_KEY_FILE)"
                    )
                if response.status != 200:
                    raise UpstreamError(f"{url} answered HTTP {response.status}")
                text = await response.text()
            scrape = parse_scrape(text, now)
        except (TimeoutError, aiohttp.ClientError, UpstreamError, MetricsFormatError) as exc:
            message = str(exc) or type(exc).__name__
            if isinstance(exc, asyncio.TimeoutError):
                message = f"{url}: no answer within {self.scrape_timeout():.0f} s"
            elif isinstance(exc, aiohttp.ClientError) and not isinstance(exc, aiohttp.ClientResponseError):
                message = f"{url}: {type(exc).__name__}: {exc} (is the server up? it answers only once loaded)"
            if self.status.up or self.status.error != message:
                log.warning("upstream: %s", message)
            self.status.up, self.status.error = False, message
            self.status.failures += 1
            return
        if not self.status.up:
            log.info("upstream %s: scraping /metrics every %.1f s", self.config.upstream, self.config.interval_s)
        self.history.add(scrape)
        self.status.up, self.status.error = True, None
        self.status.last_success = now
        self.status.scrapes += 1
        await self.scrape_prefill(session)

    async def scrape_prefill(self, session: aiohttp.ClientSession) -> None:
        """Per-request prefill progress; a server without the route (stock vLLM) only loses this table."""
        url = f"{self.config.upstream}{PREFILL_PATH}"
        try:
            async with session.get(url, headers=self.upstream_headers()) as response:
                if response.status == 404:
                    self.prefill = PrefillStatus(
                        available=False,
                        note=f"{PREFILL_PATH} answered 404: this server's vLLM lacks patch 0060 (prefill progress)",
                    )
                    return
                if response.status != 200:
                    raise UpstreamError(f"{url} answered HTTP {response.status}")
                doc = await response.json(content_type=None)
            self.prefill = PrefillStatus(rows=parse_prefill(doc), available=True)
        except (TimeoutError, aiohttp.ClientError, UpstreamError, PrefillFormatError, ValueError) as exc:
            self.prefill = PrefillStatus(available=False, note=str(exc) or type(exc).__name__)

    def scrape_timeout(self) -> float:
        return max(5.0, self.config.interval_s)

    async def run_scraper(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.scrape_timeout())
        async with aiohttp.ClientSession(timeout=timeout) as session:
            loop = asyncio.get_running_loop()
            next_at = loop.time()
            while True:
                await self.scrape_once(session)
                # Fixed cadence (not interval + scrape time), so rates see even spacing.
                next_at += self.config.interval_s
                delay = next_at - loop.time()
                if delay < 0:
                    next_at, delay = loop.time(), 0
                await asyncio.sleep(delay)

    def state(self) -> dict[str, Any]:
        windows = {k: v for k, v in WINDOWS_S.items() if v <= max(self.config.history_s, 60)}
        now_window = max(5.0, 1.5 * self.config.interval_s)
        return {
            "upstream": {
                "url": self.config.upstream,
                "up": self.status.up,
                "error": self.status.error,
                "last_success": self.status.last_success,
                "scrapes": self.status.scrapes,
                "failures": self.status.failures,
            },
            "interval_s": self.config.interval_s,
            "history_s": self.config.history_s,
            "now_window_s": now_window,
            "server_time": time.time(),
            "prefill": {
                "available": self.prefill.available,
                "note": self.prefill.note,
                "requests": [row.as_dict() for row in self.prefill.rows] if self.status.up else [],
            },
            **self.history.state(windows, now_window),
        }


class UpstreamError(Exception):
    pass


def key_matches(header: str | None, key: str) -> bool:
    """Bearer KEY, or Basic with KEY as the password; compared in constant time."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.encode(), key.encode())
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        _, sep, password = decoded.partition(":")
        return bool(sep) and hmac.compare_digest(password.encode(), key.encode())
    return False


def make_app(monitor: Monitor, *, start_scraper: bool = True, replicas: Sequence[Monitor] = ()) -> web.Application:
    """replicas: more servers on the same page (docs/multi-gpu.md); `/api/state?replica=N` is server N's state."""
    config = monitor.config
    monitors = [monitor, *replicas]

    @web.middleware
    async def guard(request: web.Request, handler):
        if config.require_key and request.path != "/healthz":
            assert config.api_key  # load_config refuses require_key without a key
            if not key_matches(request.headers.get("Authorization"), config.api_key):
                return web.Response(
                    status=401,
                    text="401: this monitor needs the API key (as the password; any user name)\n",
                    headers={
                        "WWW-Authenticate": 'Basic realm="HyperQwen monitor", charset="UTF-8"',
                        **SECURITY_HEADERS,
                    },
                )
        response = await handler(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=static_text("index.html"), content_type="text/html")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        return web.Response(text=static_text(name), content_type=STATIC_FILES[name])

    async def api_state(request: web.Request) -> web.Response:
        raw = request.query.get("replica", "0")
        index = int(raw) if raw.isdigit() and int(raw) < len(monitors) else 0
        state = monitors[index].state()
        if len(monitors) > 1:  # the page lists every replica with its status; the charts are replica `index`'s
            state["replica"] = index
            state["replicas"] = [
                {"url": m.config.upstream, "up": m.status.up, "error": m.status.error} for m in monitors
            ]
        return web.json_response(state)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(middlewares=[guard])
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/state", api_state)
    app.router.add_get("/healthz", healthz)

    if start_scraper:

        async def scraper_ctx(app: web.Application):
            tasks = [asyncio.create_task(m.run_scraper()) for m in monitors]
            yield
            for task in tasks:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

        app.cleanup_ctx.append(scraper_ctx)
    return app


def run(config: MonitorConfig) -> int:
    monitors = [Monitor(dataclasses.replace(config, upstream=url, replicas=())) for url in config.upstreams]
    monitor = monitors[0]
    shown_host = "localhost" if config.listen_host in ("127.0.0.1", "::1") else config.listen_host
    key_note = "the API key is required (Basic auth password or Bearer)" if config.require_key else "no key needed"
    print(
        f"hyperqwen monitor: http://{shown_host}:{config.port}/  (upstream {config.upstream}, "
        f"every {config.interval_s:g} s, {config.history_s} s of history; {key_note})",
        flush=True,
    )
    web.run_app(
        make_app(monitor, replicas=monitors[1:]),
        host=config.listen_host,
        port=config.port,
        print=None,
        access_log=None,
        handle_signals=True,
    )
    return Exit.OK
