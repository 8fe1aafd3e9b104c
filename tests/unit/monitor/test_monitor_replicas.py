"""The monitor with several upstreams (the replicas profile): `--upstream A,B`, every replica on one page."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hyperqwen.config.settings import SettingsError
from hyperqwen.monitor import add_arguments
from hyperqwen.monitor.config import MonitorConfig, load_config
from hyperqwen.monitor.server import Monitor, make_app


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_comma_separated_upstreams(tmp_path: Path) -> None:
    config = load_config(_args("--upstream", "http://replica-0:18020, http://replica-1:18020/"),
                         {"MODELS_DIR": str(tmp_path)})
    assert config.upstream == "http://replica-0:18020"
    assert config.upstreams == ("http://replica-0:18020", "http://replica-1:18020")


def test_each_upstream_is_checked(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="/v1"):
        load_config(_args("--upstream", "http://replica-0:18020,http://replica-1:18020/v1"),
                    {"MODELS_DIR": str(tmp_path)})


def _config(url: str) -> MonitorConfig:
    return MonitorConfig(upstream=url, bind="127.0.0.1", listen_host="127.0.0.1", port=0, interval_s=1.0,
                         history_s=60, api_key=None, require_key=False)


def test_state_lists_every_replica_and_picks_one() -> None:
    async def scenario():
        monitors = [Monitor(_config(f"http://127.0.0.1:{9 + i}")) for i in range(3)]
        monitors[1].status.up = True
        client = TestClient(TestServer(make_app(monitors[0], start_scraper=False, replicas=monitors[1:])))
        await client.start_server()
        try:
            first = await (await client.get("/api/state")).json()
            second = await (await client.get("/api/state?replica=1")).json()
            bad = await (await client.get("/api/state?replica=7")).json()
        finally:
            await client.close()
        return first, second, bad

    first, second, bad = asyncio.run(scenario())
    assert [r["url"] for r in first["replicas"]] == [f"http://127.0.0.1:{9 + i}" for i in range(3)]
    assert [r["up"] for r in first["replicas"]] == [False, True, False]
    assert first["replica"] == 0 and second["replica"] == 1 and bad["replica"] == 0
    assert second["upstream"]["url"] == "http://127.0.0.1:10"


def test_one_upstream_keeps_the_old_state_shape() -> None:
    async def scenario():
        client = TestClient(TestServer(make_app(Monitor(_config("http://127.0.0.1:9")), start_scraper=False)))
        await client.start_server()
        try:
            return await (await client.get("/api/state")).json()
        finally:
            await client.close()

    assert "replicas" not in asyncio.run(scenario())
