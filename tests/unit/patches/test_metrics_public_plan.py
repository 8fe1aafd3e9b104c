"""METRICS_PUBLIC reaches patch 0002 as the environment variable HYPERQWEN_METRICS_PUBLIC ("1" or "0").

Patch 0002 reads HYPERQWEN_METRICS_PUBLIC in vLLM's auth middleware; `hyperqwen serve` must set it from the
METRICS_PUBLIC knob in the plan's environment, always explicitly, so a value inherited from the shell cannot
open /metrics.
"""

from __future__ import annotations

import pytest

from hyperqwen.config.settings import resolve_settings
from hyperqwen.launch.command import build_command

METRICS_PUBLIC_ENV = "HYPERQWEN_METRICS_PUBLIC"


@pytest.mark.parametrize(("knob", "expected"), [("1", "1"), ("on", "1"), ("0", "0"), (None, "0")])
def test_plan_sets_metrics_public_for_the_auth_patch(tmp_path, knob, expected):
    environ = {"MODELS_DIR": str(tmp_path), "MODEL": str(tmp_path), "BIND": "127.0.0.1"}
    if knob is not None:
        environ["METRICS_PUBLIC"] = knob
    plan = build_command(resolve_settings(environ, mode="single"), api_key="k")
    assert plan.env.get(METRICS_PUBLIC_ENV) == expected
