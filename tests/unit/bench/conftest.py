"""Fixtures of the bench tests. fake_openai_server: see fake_openai.py for what it fakes and why."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeConfig


class FakeServerHandle:
    def __init__(self, config: FakeConfig):
        self.config = config
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).parent / "fake_openai.py"),
                                         json.dumps(asdict(config))],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"fake OpenAI server did not start (said {line!r})")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}"
        self._check_clock()

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.base_url + path, timeout=10) as response:
            return json.loads(response.read())

    def _check_clock(self) -> None:
        # Truth and measurement must share one clock (CLOCK_MONOTONIC behind perf_counter on Linux).
        before = time.perf_counter()
        theirs = self._get("/_clock")["perf_counter"]
        after = time.perf_counter()
        if not before - 0.05 <= theirs <= after + 0.05:
            self.stop()
            pytest.skip("time.perf_counter is not shared between processes on this platform")

    @property
    def truth(self) -> dict:
        return {tag: SimpleNamespace(**t, ttft_s=t["t_writes"][0] - t["t_received"],
                                     decode_tok_s=(t["tokens"] - 1) / (t["t_writes"][-1] - t["t_writes"][0]))
                for tag, t in self._get("/_truth").items()}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def fake_openai_server():
    server = FakeServerHandle(FakeConfig())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake_server_factory():
    """Start fake servers with FakeConfig overrides (mode, rules, send_usage, ...); all stopped at the end."""
    started: list[FakeServerHandle] = []

    def start(**overrides) -> FakeServerHandle:
        # Fast timing: these tests check answers and exit codes, not timing accuracy.
        server = FakeServerHandle(FakeConfig(**{"ttft_s": 0.02, "step_s": 0.002, **overrides}))
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
