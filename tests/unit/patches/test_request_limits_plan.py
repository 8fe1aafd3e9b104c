"""MAX_HEADER_BYTES and MAX_BODY_BYTES reach patch 0017 as HYPERQWEN_MAX_HEADER_BYTES / HYPERQWEN_MAX_BODY_BYTES.

Patch 0017 reads both in vLLM's launcher and middleware (whole bytes); `hyperqwen serve` always sets them from
the knobs, so the limits the docs table shows are the ones enforced, and a value the knob refuses never starts.
"""

from __future__ import annotations

import pytest

from hyperqwen.config.settings import SettingsError, resolve_settings
from hyperqwen.launch.command import build_command


def _plan_env(tmp_path, **knobs: str) -> dict[str, str]:
    environ = {"MODELS_DIR": str(tmp_path), "MODEL": str(tmp_path), "BIND": "127.0.0.1", **knobs}
    return build_command(resolve_settings(environ, mode="single"), api_key="k" * 32).env


def test_defaults_are_64_kib_of_head_and_32_mib_of_body(tmp_path):
    env = _plan_env(tmp_path)
    assert env["HYPERQWEN_MAX_HEADER_BYTES"] == str(64 * 1024)
    assert env["HYPERQWEN_MAX_BODY_BYTES"] == str(32 * 1024**2)


def test_a_user_can_raise_both_in_any_size_spelling(tmp_path):
    env = _plan_env(tmp_path, MAX_HEADER_BYTES="128KiB", MAX_BODY_BYTES="1G")
    assert env["HYPERQWEN_MAX_HEADER_BYTES"] == "131072"
    assert env["HYPERQWEN_MAX_BODY_BYTES"] == str(1024**3)


@pytest.mark.parametrize(("knob", "value"), [("MAX_HEADER_BYTES", "lots"), ("MAX_HEADER_BYTES", "100"),
                                             ("MAX_BODY_BYTES", "10TiB"), ("MAX_BODY_BYTES", "-1")])
def test_bad_values_name_the_knob_and_the_value(tmp_path, knob, value):
    with pytest.raises(SettingsError) as caught:
        _plan_env(tmp_path, **{knob: value})
    assert knob in str(caught.value) and value in str(caught.value)
