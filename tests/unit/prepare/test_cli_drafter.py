"""PREPARE_DRAFTER decides whether `hyperqwen prepare` fetches the DFlash2 drafter after the main model.

The fetch itself (resumable, verified, atomic) is tested against the stand-in hub in test_drafter_fetch.py;
here a recorder stands in for it, so only the decision is under test.
"""

from __future__ import annotations

import argparse
import logging

import pytest

from hyperqwen.prepare import cli


@pytest.mark.parametrize("knobs,fetched", [
    ({}, False),
    ({"SPEC": "dflash2", "DRAFT": "Qwen3.8-27B-DFlash2-W4A16"}, True),
    ({"SPEC": "dflash2", "DRAFT": "Qwen3.8-27B-DFlash2-W4A16", "PREPARE_DRAFTER": "off"}, False),
    ({"PREPARE_DRAFTER": "on"}, True),
])
def test_prepare_drafter_knob(monkeypatch, tmp_path, knobs, fetched):
    import hyperqwen.prepare.drafter as drafter

    calls = []
    monkeypatch.setattr(drafter, "fetch_drafter", lambda options: calls.append(options) or tmp_path / "d")
    monkeypatch.chdir(tmp_path)
    for name in ("SPEC", "DRAFT", "PREPARE_DRAFTER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    args = argparse.Namespace(mode="single", env_file=None, set=None)
    result = cli._fetch_drafter_if_wanted(args, object(), logging.getLogger("test"))
    assert (result is not None) is fetched and len(calls) == int(fetched)
