"""Captured /metrics from the real vLLM CPU server (see capture_metrics.py) and helpers to load them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@dataclass
class Capture:
    """One capture run: scrapes in order (text, time) and what the client saw for each request."""

    name: str
    texts: list[str]
    times: list[float]
    notes: list[str]
    requests: list[dict]
    knobs: dict


def load_capture(name: str) -> Capture:
    folder = DATA / name
    manifest = json.loads((folder / "manifest.json").read_text())
    scrapes = manifest["scrapes"]
    return Capture(
        name=name,
        texts=[(folder / s["file"]).read_text() for s in scrapes],
        times=[s["time"] for s in scrapes],
        notes=[s["note"] for s in scrapes],
        requests=manifest["requests"],
        knobs=manifest["knobs"],
    )


@pytest.fixture(scope="session", params=["smollm2", "tiny-qwen-mtp"])
def capture(request) -> Capture:
    return load_capture(request.param)


@pytest.fixture(scope="session")
def mtp_capture() -> Capture:
    return load_capture("tiny-qwen-mtp")


@pytest.fixture(scope="session")
def smol_capture() -> Capture:
    return load_capture("smollm2")
