"""Patch 0060's stream wrapper (`vllm/entrypoints/serve/utils/sse_keep_alive.py` of the installed vLLM): how often
`: prefill N/M` comments go out, that they stop at the first token, and that keep-alives do not hold them back.

The module is loaded by path (it needs only asyncio), driven by real async generators and a progress function
standing in for the engine's per-request counts. The server-level proof is
tests/integration/test_long_context_progress.py and test_agents_streams_progress.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_patch("0060-prefill-progress.patch")

PROGRESS = re.compile(r"^: prefill (\d+)/(\d+)\n\n$")


@pytest.fixture(scope="module")
def sse():
    vllm = importlib.util.find_spec("vllm")  # found without importing vLLM (which pulls in torch)
    if vllm is None or not vllm.submodule_search_locations:
        pytest.skip("vLLM is not installed in this environment")
    path = Path(list(vllm.submodule_search_locations)[0]) / "entrypoints/serve/utils/sse_keep_alive.py"
    spec = importlib.util.spec_from_file_location("hyperqwen_test_vllm_sse_keep_alive", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Prefill:
    """A prompt of `total` tokens that fills evenly over `seconds`, then streams three tokens `gap` s apart.

    progress() answers like OutputProcessor.get_prefill_progress: (computed, total, still filling)."""

    def __init__(self, total: int, seconds: float, gap: float = 0.0) -> None:
        self.total, self.seconds, self.gap, self.started = total, seconds, gap, time.monotonic()
        self.finished = False
        self.calls_after_prefill = 0

    def progress(self) -> tuple[int, int, bool]:
        if self.finished:
            self.calls_after_prefill += 1
            return self.total, self.total, False
        elapsed = time.monotonic() - self.started
        return min(self.total - 1, int(self.total * elapsed / self.seconds)), self.total, True

    async def stream(self) -> AsyncGenerator[str, None]:
        await asyncio.sleep(self.seconds)
        self.finished = True
        for text in ("a", "b", "c"):
            yield f"data: {text}\n\n"
            await asyncio.sleep(self.gap)


def collect(sse, stream, interval: float, progress) -> list[str]:
    async def run() -> list[str]:
        return [chunk async for chunk in sse._prefill_progress_stream(stream, interval, progress)]

    return asyncio.run(run())


def progress_counts(chunks: list[str]) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for chunk in chunks if (m := PROGRESS.match(chunk))]


def test_progress_is_throttled_to_the_interval_and_ends_at_the_prompt_length(sse):
    prefill = Prefill(total=100_000, seconds=0.6)  # the count moves every millisecond
    chunks = collect(sse, prefill.stream(), 0.1, prefill.progress)
    first_data = next(i for i, c in enumerate(chunks) if c.startswith("data:"))
    counts = progress_counts(chunks)
    assert progress_counts(chunks[first_data:]) == []
    assert 3 <= len(counts) <= 7, counts  # 0.6 s at one line per 0.1 s at most
    assert [c for c, _ in counts] == sorted({c for c, _ in counts})
    assert chunks[first_data - 1] == ": prefill 100000/100000\n\n"
    assert chunks[first_data:] == ["data: a\n\n", "data: b\n\n", "data: c\n\n"]


def test_an_unchanged_count_is_not_repeated(sse):
    prefill = Prefill(total=10, seconds=0.3)
    chunks = collect(sse, prefill.stream(), 0.02, lambda: (10, 10, False) if prefill.finished else (4, 10, True))
    assert [c for c in chunks if c.startswith(":")] == [": prefill 4/10\n\n", ": prefill 10/10\n\n"]


def test_a_short_prompt_gets_no_progress_line(sse):
    prefill = Prefill(total=10, seconds=0.0)
    chunks = collect(sse, prefill.stream(), 0.05, prefill.progress)
    assert chunks == ["data: a\n\n", "data: b\n\n", "data: c\n\n"]


def test_polling_stops_at_the_first_chunk_after_the_prefill(sse):
    """Decoding pays nothing: 0.5 s of tokens at a 10 ms interval, and progress() is asked once after the prefill
    (for the chunk that ends it), never again."""
    prefill = Prefill(total=1000, seconds=0.2, gap=0.25)
    chunks = collect(sse, prefill.stream(), 0.01, prefill.progress)
    assert chunks[-3:] == ["data: a\n\n", "data: b\n\n", "data: c\n\n"]
    assert prefill.calls_after_prefill == 1


def test_events_before_the_prefill_do_not_stop_progress(sse):
    """/v1/responses sends response.created before the engine has the request (no progress yet: None)."""
    prefill = Prefill(total=1000, seconds=0.5)

    async def stream() -> AsyncGenerator[str, None]:
        yield "event: response.created\n\n"
        async for chunk in prefill.stream():
            yield chunk

    started = time.monotonic()
    chunks = collect(sse, stream(), 0.05, lambda: None if time.monotonic() - started < 0.1 else prefill.progress())
    assert chunks[0] == "event: response.created\n\n"
    assert len(progress_counts(chunks)) >= 3 and chunks[-4] == ": prefill 1000/1000\n\n", chunks


def test_keep_alives_do_not_hold_progress_back(sse):
    """The keep-alive wrapper sits inside (it sends pings on its own schedule); its comments arrive every 20 ms,
    more often than the progress interval, and progress still goes out every 0.1 s."""
    prefill = Prefill(total=1000, seconds=0.6)
    inner = sse.with_sse_keep_alive(prefill.stream(), 0.02, sse.ANTHROPIC_PING_EVENT)
    chunks = collect(sse, inner, 0.1, prefill.progress)
    assert chunks.count(sse.ANTHROPIC_PING_EVENT) >= 5
    assert len(progress_counts(chunks)) >= 4, chunks


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 1.0), ("", 1.0), ("0.25", 0.25), ("2", 2.0), ("0", 0.0), ("-1", 0.0), ("inf", 0.0), ("soon", 1.0)],
)
def test_interval_from_the_environment(sse, monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(sse.PREFILL_PROGRESS_INTERVAL_ENV, raising=False)
    else:
        monkeypatch.setenv(sse.PREFILL_PROGRESS_INTERVAL_ENV, value)
    assert sse.prefill_progress_interval() == expected
