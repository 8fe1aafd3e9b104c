"""API-key protection of the server `hyperqwen serve` starts, route by route (SmolLM2 server, CPU).

Stock vLLM 0.32.0's AuthenticationMiddleware (vllm/entrypoints/serve/middleware/authenticate.py) checks
`Authorization: Bearer` only on paths starting with /v1, /v2, /inference or /cohere; everything else the app
registers answers without a key. Patch 0002 (patches/LEDGER.md), applied in the image and the test
environment, guards every route but /health and /ping: these tests hold the server to that.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.server]

# Open by design: liveness probes for compose/Kubernetes.
OPEN_BY_DESIGN = frozenset({"/health", "/ping"})
# Guarded by vLLM 0.32.0's middleware (its GUARDED_PREFIX).
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
# Reachable without a key in vLLM 0.32.0 with our server flags (read from the app's routes; see
# test_every_registered_route_is_classified). What each one exposes, for the record:
OPEN_IN_VLLM_0_32 = {
    "/invocations": "SageMaker-style full chat/completion inference",
    "/tokenize": "tokenizer; reveals the model's vocabulary and chat template use",
    "/detokenize": "detokenizer",
    "/generative_scoring": "runs the model to score candidate outputs",
    "/scale_elastic_ep": "asks the engine to rescale data parallelism",
    "/is_scaling_elastic_ep": "engine scaling state",
    "/load": "server load counters",
    "/metrics": "Prometheus metrics (request counts, token counts, latencies)",
    "/version": "vLLM version",
    "/kv_event_sources": "KV event publisher endpoints",
    "/openapi.json": "the full API schema",
    "/docs": "Swagger UI",
    "/docs/oauth2-redirect": "Swagger UI helper",
    "/redoc": "ReDoc UI",
}


def registered_routes(server) -> list[tuple[str, str]]:
    """(method, path) of every route vLLM's build_app registers for the argv `hyperqwen serve` planned.

    Built in this process with vLLM's own parser and app factory, so a route that a flag or a vLLM update
    adds is seen here before it is seen in production.
    """
    from starlette.routing import Mount
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(server.planned_vllm_args())
    app = build_app(args, ("generate",))
    routes: set[tuple[str, str]] = set()
    for route in app.routes:
        if isinstance(route, Mount):
            routes.add(("GET", route.path))
            continue
        methods = sorted((getattr(route, "methods", None) or {"GET"}) - {"HEAD"})
        for method in methods:
            routes.add((method, route.path))
    return sorted(routes)


@pytest.fixture(scope="module")
def routes(smol_server) -> list[tuple[str, str]]:
    """The app's routes, plus every operation the running server itself documents in /openapi.json (read with
    the key), so a route the live server has and the in-process app lacks is probed too."""
    found = set(registered_routes(smol_server))
    response = requests.get(f"{smol_server.base_url}/openapi.json",
                            headers={"Authorization": f"Bearer {smol_server.api_key}"}, timeout=30)
    response.raise_for_status()
    live = {(method.upper(), path) for path, ops in response.json()["paths"].items() for method in ops}
    assert len(live) >= 20, live
    return sorted(found | live)


def probe(server, method: str, path: str, headers: dict[str, str] | None = None) -> requests.Response:
    concrete = re.sub(r"\{[^}]+\}", "probe-id", path)
    kwargs = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    return requests.request(method, server.base_url + concrete, headers=headers or {}, timeout=60, **kwargs)


def is_guarded(path: str) -> bool:
    return path.startswith(GUARDED_PREFIXES)


def test_every_registered_route_is_classified(routes, smol_server, server_log_dir):
    """Probe every registered route without a key, record the answers, and check none is a surprise."""
    table = []
    for method, path in routes:
        response = probe(smol_server, method, path)
        table.append({"method": method, "path": path, "status": response.status_code})
    (server_log_dir / "routes-without-key.json").write_text(json.dumps(table, indent=2) + "\n")

    reachable = {row["path"] for row in table if row["status"] != 401}
    guarded_but_open = sorted(p for p in reachable if is_guarded(p))
    assert not guarded_but_open, f"guarded paths answered without a key: {guarded_but_open}"
    for path in OPEN_BY_DESIGN:
        assert path in reachable, f"{path} must answer without a key: {table}"
    assert reachable == OPEN_BY_DESIGN, (
        f"routes reachable without a key besides {sorted(OPEN_BY_DESIGN)}: {sorted(reachable - OPEN_BY_DESIGN)}; "
        "patch 0002 must guard them"
    )


def test_v1_routes_reject_missing_and_wrong_key(routes, smol_server):
    v1_routes = [(m, p) for m, p in routes if is_guarded(p)]
    assert len(v1_routes) >= 10, v1_routes
    wrong = {"Authorization": "Bearer not-the-key"}
    failures = []
    for method, path in v1_routes:
        for label, headers in (("no key", None), ("wrong key", wrong)):
            response = probe(smol_server, method, path, headers)
            if response.status_code != 401:
                failures.append((label, method, path, response.status_code))
    assert not failures


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")],
)
def test_right_key_is_accepted(smol_server, method, path):
    headers = {"Authorization": f"Bearer {smol_server.api_key}"}
    body = {
        "/v1/chat/completions": {"model": smol_server.served_model_name, "max_tokens": 2,
                                 "messages": [{"role": "user", "content": "Hi"}]},
        "/v1/completions": {"model": smol_server.served_model_name, "max_tokens": 2, "prompt": "Hi"},
    }.get(path)
    response = requests.request(method, smol_server.base_url + path, headers=headers, json=body, timeout=120)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", sorted(OPEN_BY_DESIGN))
def test_health_probes_answer_without_key(smol_server, path):
    assert requests.get(smol_server.base_url + path, timeout=10).status_code == 200


@pytest.mark.parametrize("path", sorted(OPEN_IN_VLLM_0_32))
def test_route_requires_key(routes, smol_server, path):
    methods = [m for m, p in routes if p == path]
    assert methods, f"{path} is not registered any more; drop it from OPEN_IN_VLLM_0_32"
    for method in methods:
        assert probe(smol_server, method, path).status_code == 401


def test_api_key_never_in_server_log(smol_server):
    # The key went to the server (VLLM_API_KEY in the environment) and requests with it were made above
    # and here; the log must not carry it in any form we can spot.
    smol_server.openai().models.list()
    log = smol_server.log_text()
    assert "vLLM API server version" in log or "Starting vLLM" in log or "Uvicorn" in log or "startup" in log
    assert smol_server.api_key not in log
    assert smol_server.api_key[8:] not in log  # the random part alone


def test_api_key_not_in_print_output(smol_server):
    """`hyperqwen serve --print` shows the exact command; the key appears masked."""
    result = subprocess.run(
        [sys.executable, "-m", "hyperqwen.cli", "serve", "--mode", "single", "--print"],
        env=smol_server.env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "vllm.entrypoints.openai.api_server" in result.stdout
    assert "VLLM_API_KEY" in result.stdout
    assert smol_server.api_key not in result.stdout + result.stderr


# --- every method x every route x path tricks, raw HTTP (no client-side path normalisation) -------------------

# Every method a client can put on the request line: the standard ones, WebDAV's and a made-up one. vLLM's
# /metrics mount answers any of them, so none may be special (OPTIONS used to skip the key).
PROBE_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND", "FOO")
# Spellings of protected paths a proxy, router or the server itself might resolve differently.
PATH_TRICKS = ("/v1/../metrics", "//metrics", "/%2Fmetrics", "/metrics%2F", "/METRICS", "/Metrics", "/metrics;x",
               "/health/../metrics", "/health%2F..%2Fmetrics", "/ping/../invocations", "/./metrics", "/metrics/",
               "/metricsX", "/metrics/x/y", "/v1/models/../../metrics", "/%6detrics", "/health;/../metrics",
               "/health?/../metrics", "/health#/../metrics", "/v1%2fmodels", "/V1/models", "//v1/models")
HOST_TRICKS = ({"Host": "localhost"}, {"Host": "127.0.0.1:1"}, {"X-Forwarded-Prefix": "/health"},
               {"X-Forwarded-For": "127.0.0.1"}, {"X-Original-URL": "/health"}, {"X-Rewrite-URL": "/health"},
               {"X-Forwarded-Host": "localhost", "X-Forwarded-Proto": "https"})


def raw_request(server, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request with the path exactly as given (requests/httpx would resolve `..` and `%2F` first)."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        body = b"{}" if method in ("POST", "PUT", "PATCH") else None
        sent = {"Content-Type": "application/json"} if body else {}
        conn.request(method, path, body=body, headers={**sent, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def live_paths(routes) -> list[str]:
    return sorted({re.sub(r"\{[^}]+\}", "probe-id", path) for _, path in routes})


def test_every_method_on_every_route_needs_the_key(routes, smol_server):
    """Each route the live app registers x each method, without a key and with wrong keys: only /health and
    /ping answer, and nothing that looks like metrics or a model answer comes back."""
    failures = []
    for path in live_paths(routes):
        for method in PROBE_METHODS:
            for headers in (None, {"Authorization": "Bearer not-the-key"}, {"x-api-key": "not-the-key"},
                            {"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}):
                status, body = raw_request(smol_server, method, path, headers)
                if path in OPEN_BY_DESIGN:
                    continue
                # uvicorn's HTTP parser refuses a method it does not know before any app code runs.
                refused_by_parser = method == "FOO" and status == 400 and body == b"Invalid HTTP request received."
                if (status != 401 and not refused_by_parser) or b"vllm:" in body:
                    failures.append((method, path, headers, status, body[:80]))
    assert not failures, failures[:20]


@pytest.mark.parametrize("path", PATH_TRICKS)
def test_path_tricks_are_refused(smol_server, path):
    for method in ("GET", "POST", "OPTIONS"):
        for headers in (None, *HOST_TRICKS):
            status, body = raw_request(smol_server, method, path, headers)
            # "/health?/../metrics" is /health with a query string: the liveness answer (empty) is right there.
            is_probe = re.split(r"[?#]", path, maxsplit=1)[0] in OPEN_BY_DESIGN
            probe_answer = is_probe and status in (200, 405) and body in (b"", b'{"detail":"Method Not Allowed"}')
            assert status in (401, 404) or probe_answer, (method, path, headers, status, body[:200])
            assert b"vllm:" not in body and b"# TYPE" not in body


def test_refused_websocket_logs_one_line(smol_server):
    """A WebSocket without the key is closed before accept (HTTP 403); the server logs that one line and no
    'ASGI callable returned without completing handshake' error."""
    websockets = pytest.importorskip("websockets.sync.client")
    url = smol_server.base_url.replace("http://", "ws://") + "/v1/realtime"
    before = len(smol_server.log_text().splitlines())
    with pytest.raises(Exception) as refused:  # websockets raises InvalidStatus for a refused handshake
        websockets.connect(url, open_timeout=30).close()
    assert "403" in str(refused.value)
    import time

    time.sleep(1)
    new = smol_server.log_text().splitlines()[before:]
    assert not [line for line in new if "without completing handshake" in line or "Traceback" in line], new
    assert [line for line in new if "/v1/realtime" in line and "403" in line], new
