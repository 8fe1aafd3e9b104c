"""Patches 0001 (x-api-key) and 0002 (every route but /health and /ping needs the key), on the real
AuthenticationMiddleware class of the installed vLLM, around a small Starlette app.

The server-level proof (every route the real app registers, over HTTP) is in
tests/integration/patched/test_patched_auth.py.
"""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

KEY = "hq-unit-key-0123456789"
OTHER_KEY = "hq-unit-second-key"
PATHS = ["/health", "/ping", "/metrics", "/metrics/", "/invocations", "/tokenize", "/v1/models",
         "/v1/messages", "/docs", "/openapi.json", "/load", "/version", "/healthz", "/health/x", "/pingx"]


def _ok(request):
    return PlainTextResponse("ok:" + request.url.path)


def make_client(auth_module, monkeypatch, metrics_public: str | None = None, root_path: str = "") -> TestClient:
    if metrics_public is None:
        monkeypatch.delenv(auth_module.METRICS_PUBLIC_ENV, raising=False)
    else:
        monkeypatch.setenv(auth_module.METRICS_PUBLIC_ENV, metrics_public)
    routes = [Route(p, _ok, methods=["GET", "POST"]) for p in PATHS if p not in ("/metrics", "/metrics/")]
    routes.append(Mount("/metrics", app=Starlette(routes=[Route("/", _ok)])))
    app = Starlette(routes=routes)
    app.add_middleware(auth_module.AuthenticationMiddleware, tokens=[KEY, OTHER_KEY])
    return TestClient(app, root_path=root_path, raise_server_exceptions=True)


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


def test_options_preflight_is_not_challenged(auth_module, monkeypatch):
    # Unchanged upstream behaviour: browsers send CORS preflights without credentials.
    client = make_client(auth_module, monkeypatch)
    assert client.options("/v1/models").status_code != 401
