"""Patches 0001 (x-api-key) and 0002 (every route but /health and /ping needs the key), on the real
AuthenticationMiddleware class of the installed vLLM, around a small Starlette app.

The server-level proof (every route the real app registers, over HTTP) is in
tests/integration/patched/test_patched_auth.py.
"""

from __future__ import annotations

import re

import pytest

from support.tools import require_modules

require_modules("starlette", "vllm", why="the middleware under test is the installed vLLM's")
from starlette.applications import Starlette  # noqa: E402
from starlette.middleware.cors import CORSMiddleware  # noqa: E402
from starlette.responses import PlainTextResponse  # noqa: E402
from starlette.routing import Mount, Route, WebSocketRoute  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from starlette.websockets import WebSocketDisconnect  # noqa: E402

KEY = "hq-unit-key-0123456789"
OTHER_KEY = "hq-unit-second-key"
PATHS = ["/health", "/ping", "/metrics", "/metrics/", "/invocations", "/tokenize", "/v1/models",
         "/v1/messages", "/docs", "/openapi.json", "/load", "/version", "/healthz", "/health/x", "/pingx"]


def _ok(request):
    return PlainTextResponse("ok:" + request.url.path)


async def _metrics_app(scope, receive, send):
    """Like prometheus_client's make_asgi_app: answers every method and path it is given."""
    await PlainTextResponse("vllm:secret_counter 1\n")(scope, receive, send)


def make_client(auth_module, monkeypatch, metrics_public: str | None = None, root_path: str = "",
                cors_origins: list[str] | None = None) -> TestClient:
    if metrics_public is None:
        monkeypatch.delenv(auth_module.METRICS_PUBLIC_ENV, raising=False)
    else:
        monkeypatch.setenv(auth_module.METRICS_PUBLIC_ENV, metrics_public)
    routes = [Route(p, _ok, methods=["GET", "POST"]) for p in PATHS if p not in ("/metrics", "/metrics/")]
    routes.append(WebSocketRoute("/v1/realtime", _ws_echo))
    metrics = Mount("/metrics", app=_metrics_app)
    metrics.path_regex = re.compile("^/metrics(?P<path>.*)$")  # as vLLM's instrumentator/metrics.py mounts it
    routes.append(metrics)
    app = Starlette(routes=routes)
    # The order vLLM's register.py adds them: CORS first, so the auth middleware runs before it.
    app.add_middleware(CORSMiddleware, allow_origins=cors_origins or [], allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(auth_module.AuthenticationMiddleware, tokens=[KEY, OTHER_KEY],
                       cors_origins=cors_origins or [])
    return TestClient(app, root_path=root_path, raise_server_exceptions=True)


async def _ws_echo(websocket):
    await websocket.accept()
    await websocket.send_text("hello")
    await websocket.close()


pytestmark = pytest.mark.needs_patch("0001-auth-accept-x-api-key.patch", "0002-auth-guard-every-route.patch")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, 401),
        ({"Authorization": f"Bearer {KEY}"}, 200),
        ({"Authorization": f"bearer {OTHER_KEY}"}, 200),  # any configured key; scheme is case-insensitive
        ({"x-api-key": KEY}, 200),  # what the anthropic SDK and Claude Code send
        ({"X-Api-Key": OTHER_KEY}, 200),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"x-api-key": "wrong"}, 401),
        ({"x-api-key": ""}, 401),
        ({"x-api-key": f"Bearer {KEY}"}, 401),  # x-api-key carries the bare key
        ({"Authorization": KEY}, 401),  # no scheme
        ({"Authorization": f"Basic {KEY}"}, 401),
        ({"x-api-key": "wrong", "Authorization": f"Bearer {KEY}"}, 200),  # one matching credential is enough
        ({"x-api-key": KEY, "Authorization": "Bearer wrong"}, 200),
    ],
)
def test_credentials_on_v1(auth_module, monkeypatch, headers, expected):
    client = make_client(auth_module, monkeypatch)
    assert client.get("/v1/models", headers=headers).status_code == expected
    assert client.post("/v1/messages", headers=headers).status_code == expected


@pytest.mark.parametrize("path", PATHS)
def test_only_health_and_ping_are_open(auth_module, monkeypatch, path):
    client = make_client(auth_module, monkeypatch)
    open_paths = {"/health", "/ping"}
    for method in ("GET", "POST"):
        status = client.request(method, path).status_code
        assert (status != 401) == (path in open_paths), (method, path, status)
        # and with the key every one of them is let through
        assert client.request(method, path, headers={"x-api-key": KEY}).status_code != 401


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_metrics_public_opens_only_metrics(auth_module, monkeypatch, value):
    client = make_client(auth_module, monkeypatch, metrics_public=value)
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics/").status_code == 200
    for path in ("/invocations", "/v1/models", "/tokenize", "/load"):
        assert client.get(path).status_code == 401, path


@pytest.mark.parametrize("value", [None, "", "0", "false", "No", "off"])
def test_metrics_protected_by_default_and_when_off(auth_module, monkeypatch, value):
    client = make_client(auth_module, monkeypatch, metrics_public=value)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_bad_metrics_public_value_is_a_clear_error(auth_module, monkeypatch):
    monkeypatch.setenv(auth_module.METRICS_PUBLIC_ENV, "maybe")
    with pytest.raises(ValueError, match=r"HYPERQWEN_METRICS_PUBLIC='maybe' is not a boolean; use one of 1/0"):
        auth_module.metrics_public_from_env()


def test_root_path_is_stripped_before_matching(auth_module, monkeypatch):
    # vLLM serves under --root-path; the open list applies to the path below it.
    client = make_client(auth_module, monkeypatch, root_path="/api")
    assert client.get("/api/health").status_code == 200
    assert client.get("/api/invocations").status_code == 401


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND")
PREFLIGHT = {"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("path", ["/metrics", "/metrics/", "/metricsX", "/metrics/x/y", "/v1/models", "/invocations"])
def test_every_method_needs_the_key(auth_module, monkeypatch, method, path):
    """OPTIONS /metrics used to return the whole Prometheus page: no method is special without CORS."""
    client = make_client(auth_module, monkeypatch)
    for headers in ({}, PREFLIGHT, {"Authorization": "Bearer wrong"}):
        response = client.request(method, path, headers=headers)
        assert response.status_code == 401, (method, path, headers, response.status_code)
        assert b"secret_counter" not in response.content
    assert client.request(method, path, headers={"x-api-key": KEY}).status_code != 401


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("path", ["/metrics", "/metrics/", "/metricsX", "/metrics/x/y"])
def test_metrics_public_covers_every_method_and_path_of_the_mount(auth_module, monkeypatch, method, path):
    client = make_client(auth_module, monkeypatch, metrics_public="1")
    assert client.request(method, path).status_code == 200


def test_preflight_passes_only_with_cors_configured_and_never_carries_a_body(auth_module, monkeypatch):
    client = make_client(auth_module, monkeypatch, cors_origins=["https://app.example"])
    for path in ("/metrics", "/v1/models", "/invocations"):
        allowed = client.options(path, headers={**PREFLIGHT, "Origin": "https://app.example"})
        assert allowed.status_code == 200, path
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert allowed.content == b"" and allowed.headers["content-length"] == "0"
        other = client.options(path, headers=PREFLIGHT)  # an origin CORS does not allow: refused, no body
        assert other.status_code == 400 and other.content == b""
        # Not a preflight (no Access-Control-Request-Method): an OPTIONS like any other method.
        assert client.options(path, headers={"Origin": "https://app.example"}).status_code == 401
        assert client.options(path).status_code == 401


@pytest.mark.parametrize("path", ["//metrics", "/METRICS", "/Health", "/health/", "/health;x", "/ping/..",
                                  "/v1/../metrics", "/%2Fmetrics", "/health%2F..%2Fmetrics", "/health/../metrics"])
def test_path_tricks_are_not_open(auth_module, monkeypatch, path):
    """Only exact route paths are open; the HTTP-level probe of the live server is in
    tests/integration/test_server_auth.py."""
    client = make_client(auth_module, monkeypatch)
    response = client.get(path)
    assert response.status_code in (401, 404), (path, response.status_code)
    assert b"secret_counter" not in response.content


def test_refused_websocket_is_closed_before_accept(auth_module, monkeypatch):
    client = make_client(auth_module, monkeypatch)
    with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/v1/realtime"):
        pass
    assert refused.value.code == auth_module.WS_POLICY_VIOLATION
    with client.websocket_connect("/v1/realtime", headers={"x-api-key": KEY}) as ws:
        assert ws.receive_text() == "hello"
