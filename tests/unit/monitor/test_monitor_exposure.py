"""An exposed monitor (BIND beyond loopback) shows nothing without the API key: the same rule as the API.

The monitor is configured the way `hyperqwen monitor` is (load_config from knobs and a real key file), holds
real metrics (captured from the vLLM CPU server, tests/unit/monitor/data), and is asked by an unauthenticated
client for every route, with every method and path spellings that might slip past an exact-path check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hyperqwen.config.settings import SettingsError
from hyperqwen.monitor import add_arguments
from hyperqwen.monitor.config import load_config
from hyperqwen.monitor.metrics import parse_scrape
from hyperqwen.monitor.server import Monitor, make_app

KEY = "hq-exposure-0123456789abcdef"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND")
PATHS = ("/", "/api/state", "/api/state/", "/API/state", "//api/state", "/static/app.js", "/static/style.css",
         "/index.html", "/metrics", "/healthz/../api/state", "/healthz/%2e%2e/api/state", "/healthz%2F..%2Fapi/state",
         "/healthz;/../api/state", "/healthz/", "/api/state;x", "/nope")


def monitor_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser)
    return parser.parse_args(list(argv))


def exposed_monitor(tmp_path: Path, smol_capture) -> Monitor:
    (tmp_path / "api_key.txt").write_text(KEY + "\n")
    config = load_config(monitor_args(), {"MODELS_DIR": str(tmp_path), "BIND": "0.0.0.0"})
    assert config.require_key and config.api_key == KEY
    monitor = Monitor(config)
    for text, time in zip(smol_capture.texts, smol_capture.times, strict=True):
        monitor.history.add(parse_scrape(text, time))
    monitor.status.up = True
    return monitor


def test_exposed_monitor_without_a_key_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="BIND=0.0.0.0 exposes the monitor"):
        load_config(monitor_args(), {"MODELS_DIR": str(tmp_path), "BIND": "0.0.0.0"})
    with pytest.raises(SettingsError, match="BIND=192.168.1.5 exposes the monitor"):
        load_config(monitor_args(), {"MODELS_DIR": str(tmp_path), "BIND": "192.168.1.5"})
    with pytest.raises(SettingsError, match="exposes the monitor"):
        load_config(monitor_args("--bind", "0.0.0.0"), {"MODELS_DIR": str(tmp_path)})


def test_exposed_monitor_refuses_a_short_key(tmp_path: Path) -> None:
    (tmp_path / "api_key.txt").write_text("short\n")
    with pytest.raises(SettingsError, match="at least 16"):
        load_config(monitor_args(), {"MODELS_DIR": str(tmp_path), "BIND": "0.0.0.0"})


def test_unauthenticated_requests_see_no_metrics(tmp_path: Path, smol_capture) -> None:
    monitor = exposed_monitor(tmp_path, smol_capture)
    state = json.dumps(monitor.state())
    assert "qwen3.8-27b" in state and monitor.history  # the monitor does hold metrics to leak

    async def scenario() -> list[tuple]:
        client = TestClient(TestServer(make_app(monitor, start_scraper=False), skip_url_asserts=True))
        await client.start_server()
        leaks = []
        try:
            for method in METHODS:
                for path in PATHS:
                    for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"},
                                    {"Authorization": "Basic d3Jvbmc6d3Jvbmc="}, {"x-api-key": KEY},
                                    {"X-Forwarded-For": "127.0.0.1", "Host": "localhost"}):
                        response = await client.request(method, path, headers=headers, allow_redirects=False)
                        body = await response.text()
                        if response.status != 401 or "qwen3.8-27b" in body or "vllm:" in body or "lifetime" in body:
                            leaks.append((method, path, headers, response.status, body[:80]))
                        if method == "GET":
                            assert response.headers.get("WWW-Authenticate", "").startswith("Basic realm=")
            health = await client.get("/healthz")
            assert health.status == 200 and (await health.text()) == "ok\n"
            allowed = await client.get("/api/state", headers={"Authorization": f"Bearer {KEY}"})
            assert allowed.status == 200 and (await allowed.json())["model_name"] == "qwen3.8-27b"
        finally:
            await client.close()
        return leaks

    assert asyncio.run(scenario()) == []
