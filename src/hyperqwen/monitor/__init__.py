"""`hyperqwen monitor`: a live page for a running server (throughput, TTFT, speculation, KV, requests).

It scrapes the vLLM server's Prometheus /metrics (sending the API key as Bearer), keeps a bounded history
and serves a plain HTML/JS page with charts. See docs/monitor.md for what each number means and what
/metrics cannot tell.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping

from hyperqwen.commands import add_command
from hyperqwen.exit_codes import Exit


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    from hyperqwen.config.settings import SettingsError
    from hyperqwen.monitor.config import load_config

    environ = os.environ if environ is None else environ
    try:
        config = load_config(args, environ)
    except SettingsError as exc:
        for problem in exc.problems:
            print(f"hyperqwen monitor: {problem}", file=sys.stderr)
        print("hyperqwen monitor: nothing was started.", file=sys.stderr)
        return Exit.BAD_INPUT
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from hyperqwen.monitor.server import run as serve

    try:
        return serve(config)
    except OSError as exc:  # port taken, address not on this host, ...
        print(
            f"hyperqwen monitor: cannot listen on {config.listen_host}:{config.port}: {exc.strerror or exc}; "
            "pick another port with --port or MONITOR_PORT",
            file=sys.stderr,
        )
        return Exit.BAD_INPUT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hyperqwen.config.load import add_settings_arguments

    add_settings_arguments(parser)
    parser.add_argument(
        "--upstream", metavar="URL", help="base URL of the vLLM server (default: http://127.0.0.1:PORT)"
    )
    parser.add_argument(
        "--bind",
        metavar="HOST",
        help="address to serve the page on (default: BIND, i.e. 127.0.0.1); beyond loopback the API key is required",
    )
    parser.add_argument("--port", type=int, metavar="N", help="port of the page (default: MONITOR_PORT, 18021)")
    parser.add_argument(
        "--interval", type=float, metavar="SECONDS", help="scrape period (default: MONITOR_INTERVAL, 2)"
    )
    parser.add_argument(
        "--history", type=int, metavar="SECONDS", help="history kept for the charts (default: MONITOR_HISTORY, 900)"
    )
    parser.add_argument("--require-key", action="store_true", help="ask visitors for the API key even on loopback")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "monitor", func=run)
    add_arguments(parser)
