"""`hyperqwen router`: vLLM's own router (the `vllm-router` binary) in front of the replicas, behind a gate.

Why a gate: vllm-router 0.1.17 serves its admin API on the same port as the inference API, with no
authentication: `POST /add_worker?url=...` adds a worker, `/remove_worker`, `/flush_cache`, `/list_workers`,
`/get_loads` answer anyone, and its `--api-key` flag gates none of them (measured: docs/multi-gpu.md). A client
who could add a worker would receive every later prompt together with the users' API keys (the router forwards
the Authorization header). So the router listens on 127.0.0.1 inside its container only, and the published port
is this gate: it forwards only the inference routes, and when an API key is configured it refuses a request
without the key before the router sees it. On its OpenAI routes the router passes the client's Authorization
header through, so each replica (same key, same api_key.txt) checks it again; on routes it only passes through
(/v1/messages) it drops the client's headers and sends its own --api-key, which serve() sets to the same key.

The gate is not a load balancer: every routing decision is the router's.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from hyperqwen.commands import add_command
from hyperqwen.config.apikey import exposure_problem, read_api_key
from hyperqwen.config.load import add_settings_arguments, settings_from_args
from hyperqwen.config.settings import Problem, SettingsError, listen_host
from hyperqwen.exit_codes import Exit

# Written by `hyperqwen replicas` into compose.replicas.yaml: the replicas on the compose network.
REPLICA_URLS_ENV = "HYPERQWEN_REPLICA_URLS"
# The router's own ports, on loopback only (inside the router's container).
ROUTER_PORT_ENV = "HYPERQWEN_ROUTER_INTERNAL_PORT"
DEFAULT_ROUTER_PORT = 18028
# The API key handed to the vllm-router child through its environment (see serve()).
WORKER_KEY_ENV = "HYPERQWEN_ROUTER_WORKER_KEY"
# Health checking: vllm-router's defaults (60 s interval, 3 failures) take up to ~3 minutes to drop a dead
# replica; 5 s x 2 failures drops it within ~10 s (measured in tests/integration/test_replicas_router.py).
HEALTH_CHECK_INTERVAL_S = 5
HEALTH_FAILURE_THRESHOLD = 2
# A replica's first boot compiles for well over 10 minutes (compose.yaml's start_period is 20 minutes).
WORKER_STARTUP_TIMEOUT_S = 1800

# Routes the gate forwards (prefixes). Everything else, the router's admin API included, is answered 404 here.
# vllm-router forwards paths it has no route of its own for to a worker (measured: /v1/messages reaches it), so
# Anthropic clients (Claude Code) work through the gate too.
FORWARDED_PREFIXES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/v1/messages")
OPEN_PATHS = ("/health",)  # like one server: liveness without the key (answered by the router)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def parse_worker_urls(raw: str, source: str) -> tuple[list[str], list[Problem]]:
    """'http://a:18020, http://b:18020' (commas or spaces) -> URLs; problems name the knob and the bad entry."""
    urls = [part.rstrip("/") for part in raw.replace(",", " ").split()]
    problems = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            problems.append(
                Problem(
                    "error",
                    f"{source}: {url!r} is not a server base URL; write e.g. http://10.0.0.2:18020 (no /v1)",
                    "ROUTER_WORKERS",
                )
            )
    if len(set(urls)) != len(urls):
        problems.append(Problem("error", f"{source} names a server twice", "ROUTER_WORKERS"))
    if not urls:
        problems.append(
            Problem(
                "error",
                "the router has no replicas: run `hyperqwen replicas` (writes "
                "compose.replicas.yaml) or set ROUTER_WORKERS to the servers' URLs",
                "ROUTER_WORKERS",
            )
        )
    return urls, problems


def router_argv(
    worker_urls: Sequence[str], *, policy: str, port: int, prometheus_port: int, program: str = "vllm-router"
) -> list[str]:
    """The vllm-router command line: loopback only, the chosen policy, fast health checks."""
    return [
        program,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        policy,
        "--health-check-interval-secs",
        str(HEALTH_CHECK_INTERVAL_S),
        "--health-failure-threshold",
        str(HEALTH_FAILURE_THRESHOLD),
        "--worker-startup-timeout-secs",
        str(WORKER_STARTUP_TIMEOUT_S),
        "--worker-startup-check-interval",
        "5",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(prometheus_port),
    ]


def key_ok(headers: Mapping[str, str], api_key: str) -> bool:
    """Authorization: Bearer <key>, or Anthropic's x-api-key (what the replicas accept, patch 0001)."""
    auth = headers.get("Authorization", "")
    sent = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
    return hmac.compare_digest(sent.encode(), api_key.encode())


def allowed(path: str) -> bool:
    return path in OPEN_PATHS or any(path == p or path.startswith(p + "/") for p in FORWARDED_PREFIXES)


@dataclass(frozen=True)
class GateConfig:
    listen_host: str
    port: int
    upstream: str  # the router, e.g. http://127.0.0.1:18028
    api_key: str | None


def build_gate(config: GateConfig):
    """The aiohttp application: allowlist, key check, then a streaming pass-through to the router."""
    import aiohttp
    from aiohttp import web

    def error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "gate", "code": status}}, status=status)

    async def handle(request: web.Request) -> web.StreamResponse:
        if not allowed(request.path):
            return error(404, f"{request.path} is not served here")
        if config.api_key and request.path not in OPEN_PATHS and not key_ok(request.headers, config.api_key):
            return error(401, "missing or wrong API key (send Authorization: Bearer <key>)")
        session: aiohttp.ClientSession = request.app["session"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        try:
            async with session.request(
                request.method,
                config.upstream + request.path_qs,
                headers=headers,
                data=body or None,
                allow_redirects=False,
            ) as upstream:
                response = web.StreamResponse(
                    status=upstream.status,
                    headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
                )
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientConnectionError as exc:
            return error(502, f"router unavailable ({type(exc).__name__})")

    async def on_startup(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )

    async def on_cleanup(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=512 * 1024**2)
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        settings = settings_from_args(args, environ)
        api_key = read_api_key(settings)
        knobs = settings.knobs
        raw = knobs.router_workers or environ.get(REPLICA_URLS_ENV, "")
        source = "ROUTER_WORKERS" if knobs.router_workers else REPLICA_URLS_ENV
        urls, problems = parse_worker_urls(raw, source)
        exposed = exposure_problem(settings, api_key, "the router")
        if exposed is not None:
            problems.append(exposed)
        if problems:
            raise SettingsError(problems)
    except SettingsError as exc:
        for problem in exc.problems:
            print(f"hyperqwen router: {problem}", file=sys.stderr)
        return Exit.BAD_INPUT
    program = shutil.which("vllm-router") or shutil.which("vllm-router", path=os.path.dirname(sys.executable))
    if program is None or importlib.util.find_spec("vllm_router") is None:
        print("hyperqwen router: the vllm-router binary is not installed (pip install vllm-router)", file=sys.stderr)
        return Exit.BAD_INPUT
    internal = int(environ.get(ROUTER_PORT_ENV) or DEFAULT_ROUTER_PORT)
    argv = router_argv(urls, policy=knobs.router_policy, port=internal, prometheus_port=internal + 1, program=program)
    if args.print:
        print(" ".join(argv))
        return Exit.OK
    config = GateConfig(listen_host(environ, knobs.bind), knobs.port, f"http://127.0.0.1:{internal}", api_key)
    return serve(argv, config)


def serve(argv: Sequence[str], config: GateConfig) -> int:
    """Start vllm-router as a child, serve the gate until either ends; the child never outlives us."""
    from aiohttp import web

    # vllm-router's own launcher, run through child_main so the key reaches it from the environment, not argv
    # (where `ps` would show it): it sends that key to the replicas on the routes it passes through without the
    # client's headers (measured: /v1/messages); on its typed routes it forwards the client's Authorization.
    env = {**os.environ, WORKER_KEY_ENV: config.api_key or ""}
    child = subprocess.Popen(
        [sys.executable, "-m", "hyperqwen.replicas.router", *argv[1:]], env=env, stdin=subprocess.DEVNULL
    )
    print(
        f"hyperqwen router: vllm-router pid {child.pid} on 127.0.0.1:{argv[argv.index('--port') + 1]}; gate on "
        f"{config.listen_host}:{config.port} ({'API key required' if config.api_key else 'no API key'})",
        file=sys.stderr,
        flush=True,
    )

    async def main() -> int:
        runner = web.AppRunner(build_gate(config), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, config.listen_host, config.port).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set() and child.poll() is None:
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
        await runner.cleanup()
        return child.returncode or 0 if child.poll() is not None else Exit.OK

    try:
        code = asyncio.run(main())
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    if child.returncode not in (0, -signal.SIGTERM) and code == 0:
        print(f"hyperqwen router: vllm-router exited with {child.returncode}", file=sys.stderr)
        return Exit.FAILED
    return code


def child_main(argv: Sequence[str]) -> int:
    """Run vllm-router (its own Python launcher) with vllm-router's arguments and, from WORKER_KEY_ENV, the key it
    presents to the replicas (its --api-key)."""
    from vllm_router.launch_router import launch_router, parse_router_args

    args = parse_router_args(list(argv))
    key = os.environ.pop(WORKER_KEY_ENV, "")
    if key:
        args.api_key = key
    launch_router(args)
    return Exit.OK


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "router", func=run)
    parser.add_argument("--print", action="store_true", help="print the vllm-router command; start nothing")
    add_settings_arguments(parser, mode=False)


if __name__ == "__main__":  # the vllm-router child of serve()
    sys.exit(child_main(sys.argv[1:]))
