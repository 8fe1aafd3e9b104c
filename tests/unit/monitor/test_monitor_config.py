"""`hyperqwen monitor` settings: defaults, exposure needs a key, bad values name the knob."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyperqwen.config.settings import SettingsError
from hyperqwen.monitor import add_arguments, register
from hyperqwen.monitor.config import load_config

KEY = "hq-test-0123456789abcdef0123"


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser)
    return parser.parse_args(list(argv))


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # MODELS_DIR points at an empty folder: no api_key.txt unless a test writes one.
    return {"MODELS_DIR": str(tmp_path), **extra}


def test_defaults_are_loopback_without_key(tmp_path: Path) -> None:
    config = load_config(args(), env(tmp_path))
    assert config.upstream == "http://127.0.0.1:18020"
    assert (config.bind, config.listen_host, config.port) == ("127.0.0.1", "127.0.0.1", 18021)
    assert config.interval_s == 2.0 and config.history_s == 900 and config.max_intervals == 450
    assert config.api_key is None and config.require_key is False


def test_upstream_follows_port_and_flags_win(tmp_path: Path) -> None:
    config = load_config(args("--port", "19000", "--interval", "0.5", "--history", "60"),
                         env(tmp_path, PORT="18555", MONITOR_PORT="18999", MONITOR_INTERVAL="3"))
    assert config.upstream == "http://127.0.0.1:18555"
    assert config.port == 19000 and config.interval_s == 0.5 and config.max_intervals == 120


def test_knobs_from_the_environment(tmp_path: Path) -> None:
    config = load_config(args(), env(tmp_path, MONITOR_PORT="18999", MONITOR_INTERVAL="1.5", MONITOR_HISTORY="300"))
    assert (config.port, config.interval_s, config.history_s) == (18999, 1.5, 300)


def test_exposed_without_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        load_config(args(), env(tmp_path, BIND="0.0.0.0"))
    message = str(caught.value.problems[0])
    assert "BIND=0.0.0.0" in message and "API key" in message and "api_key.txt" in message
    with pytest.raises(SettingsError):
        load_config(args("--bind", "192.168.1.20"), env(tmp_path))


def test_exposed_with_key_requires_it_from_visitors(tmp_path: Path) -> None:
    config = load_config(args(), env(tmp_path, BIND="0.0.0.0", VLLM_API_KEY=KEY))
    assert config.require_key and config.api_key == KEY


def test_key_file_under_models_dir(tmp_path: Path) -> None:
    (tmp_path / "api_key.txt").write_text(KEY + "\n")
    config = load_config(args(), env(tmp_path, BIND="0.0.0.0"))
    assert config.api_key == KEY and config.require_key


def test_container_listens_everywhere_but_judges_exposure_by_bind(tmp_path: Path) -> None:
    config = load_config(args(), env(tmp_path, HYPERQWEN_LISTEN_HOST="0.0.0.0"))
    assert config.listen_host == "0.0.0.0" and config.bind == "127.0.0.1" and not config.require_key


def test_require_key_on_loopback(tmp_path: Path) -> None:
    assert load_config(args("--require-key"), env(tmp_path, VLLM_API_KEY=KEY)).require_key
    with pytest.raises(SettingsError, match="--require-key needs an API key"):
        load_config(args("--require-key"), env(tmp_path))


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("MONITOR_PORT", "eighty", "MONITOR_PORT='eighty' (in the environment) is not a whole number"),
    ("MONITOR_PORT", "70000", "MONITOR_PORT='70000' (in the environment) is above the maximum"),
    ("MONITOR_INTERVAL", "0", "MONITOR_INTERVAL='0' (in the environment) is below the minimum"),
    ("MONITOR_HISTORY", "1.5", "MONITOR_HISTORY='1.5' (in the environment) is not a whole number"),
])
def test_bad_knob_values_name_the_knob(tmp_path: Path, name: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_config(args(), env(tmp_path, **{name: value}))
    text = str(caught.value.problems[0])
    assert expected in text, text
    assert "allowed" in text


@pytest.mark.parametrize(("url", "expected"), [
    ("127.0.0.1:18020", "is not an http(s) URL"),
    ("http://127.0.0.1:18020/v1", "without /v1"),
    ("http://127.0.0.1:18020/metrics", "without /metrics"),
])
def test_bad_upstream(tmp_path: Path, url: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_config(args("--upstream", url), env(tmp_path))


def test_register_adds_the_monitor_command() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    parsed = parser.parse_args(["monitor", "--upstream", "http://server:18020", "--port", "18021"])
    assert parsed.func.__module__ == "hyperqwen.monitor" and parsed.upstream == "http://server:18020"


def test_cli_refuses_exposure_without_key_and_starts_nothing(tmp_path: Path) -> None:
    clean = {"PATH": os.environ.get("PATH", ""), "MODELS_DIR": str(tmp_path), "BIND": "0.0.0.0",
             "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "hyperqwen.monitor"], env=clean, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert "exposes the monitor" in proc.stderr and "nothing was started" in proc.stderr
