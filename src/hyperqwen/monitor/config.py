"""The monitor's settings: command-line flags over knobs (environment / .env), checked before anything starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from hyperqwen.config.apikey import exposure_problem, read_api_key
from hyperqwen.config.load import settings_from_args
from hyperqwen.config.settings import KNOBS_BY_NAME, Problem, SettingsError, is_loopback, listen_host


@dataclass(frozen=True)
class MonitorConfig:
    upstream: str  # base URL of the vLLM server, e.g. http://127.0.0.1:18020
    bind: str  # the address the page is reachable on (host side): decides whether the key is required
    listen_host: str  # the address this process listens on
    port: int
    interval_s: float
    history_s: int
    api_key: str | None  # sent upstream as Bearer; required from page visitors when require_key
    require_key: bool
    # More servers shown on the same page (the replicas profile: `--upstream URL1,URL2,...`); upstream is the first.
    replicas: tuple[str, ...] = ()

    @property
    def upstreams(self) -> tuple[str, ...]:
        return (self.upstream, *self.replicas)

    @property
    def max_intervals(self) -> int:
        return max(1, math.ceil(self.history_s / self.interval_s))


def check_upstream(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(
            [
                Problem(
                    "error",
                    f"--upstream {url!r} is not an http(s) URL; use the server's base "
                    "URL, e.g. http://127.0.0.1:18020 (without /v1 or /metrics)",
                )
            ]
        )
    if parts.path.rstrip("/") in ("/v1", "/metrics"):
        raise SettingsError(
            [
                Problem(
                    "error",
                    f"--upstream {url!r}: give the server's base URL without "
                    f"{parts.path.rstrip('/')}, e.g. {parts.scheme}://{parts.netloc}",
                )
            ]
        )
    return url.rstrip("/")


def load_config(args: argparse.Namespace, environ: Mapping[str, str]) -> MonitorConfig:
    """Resolve flags and knobs. Raises SettingsError (naming the knob or flag) on anything wrong."""
    settings = settings_from_args(args, environ)
    knobs = settings.knobs
    api_key = read_api_key(settings)
    bind = args.bind or knobs.bind
    listen = args.bind or listen_host(environ, bind)
    # A flag, when given, is checked against the same schema entry as its knob, and wins over the knob's value.
    flags = {
        "MONITOR_PORT": ("--port", args.port, knobs.monitor_port),
        "MONITOR_INTERVAL": ("--interval", args.interval, knobs.monitor_interval),
        "MONITOR_HISTORY": ("--history", args.history, knobs.monitor_history),
    }
    for name, (flag, value, _) in flags.items():
        knob = KNOBS_BY_NAME[name]
        if value is not None and not knob.min <= value <= knob.max:
            raise SettingsError(
                [Problem("error", f"{flag} {value} is out of range; allowed: {knob.allowed_text()}", name)]
            )
    port, interval, history = (configured if value is None else value for _, value, configured in flags.values())
    # Several servers (replicas behind a router): comma separated, each checked like one.
    upstreams = [
        check_upstream(url.strip())
        for url in (args.upstream or f"http://127.0.0.1:{knobs.port}").split(",")
        if url.strip()
    ] or [check_upstream("")]
    upstream = upstreams[0]
    exposed = not is_loopback(bind)
    problem = exposure_problem(settings, api_key, "the monitor", bind)
    if problem is not None:
        raise SettingsError([problem])
    if args.require_key and not api_key:
        raise SettingsError(
            [Problem("error", "--require-key needs an API key: set VLLM_API_KEY or API_KEY_FILE", "VLLM_API_KEY")]
        )
    return MonitorConfig(
        upstream=upstream,
        bind=bind,
        listen_host=listen,
        port=int(port),
        interval_s=float(interval),
        history_s=int(history),
        api_key=api_key,
        require_key=exposed or bool(args.require_key),
        replicas=tuple(upstreams[1:]),
    )
