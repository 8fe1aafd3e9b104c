"""Patches 0001/0002 on the real server: every route the app registers, with and without a key.

The route list is not hand-written: it is read from the app vLLM's own build_app makes for the argv
`hyperqwen serve` planned for the server under test (and cross-checked against that server's live
/openapi.json), so a route a flag or a vLLM update adds is probed too.
"""

from __future__ import annotations

import json
import re

import pytest
import requests

pytestmark = [
    pytest.mark.integration,
    pytest.mark.server,
    pytest.mark.needs_patch("0001-auth-accept-x-api-key.patch", "0002-auth-guard-every-route.patch"),
]

OPEN_PATHS = frozenset({"/health", "/ping"})
METRICS_PUBLIC_ENV = "HYPERQWEN_METRICS_PUBLIC"


def build_real_app(server):
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(server.planned_vllm_args())
    return build_app(args, ("generate",))


def app_routes(app) -> list[tuple[str, str]]:
    from starlette.routing import Mount

    routes: set[tuple[str, str]] = set()
    for route in app.routes:
        if isinstance(route, Mount):
            routes.add(("GET", route.path))
            continue
        for method in (getattr(route, "methods", None) or {"GET"}) - {"HEAD"}:
            routes.add((method, route.path))
    return sorted(routes)


@pytest.fixture(scope="module")
def routes(smol_server) -> list[tuple[str, str]]:
    return app_routes(build_real_app(smol_server))


def probe(server, method: str, path: str, headers: dict[str, str] | None = None) -> requests.Response:
    concrete = re.sub(r"\{[^}]+\}", "probe-id", path)
    kwargs = {"json": {}} if method in ("POST", "PUT", "PATCH", "DELETE") else {}
    return requests.request(method, server.base_url + concrete, headers=headers or {}, timeout=120, **kwargs)


def test_route_list_matches_the_running_server(routes, smol_server):
    """Every operation the live server documents is in the list probed below (and the list is not tiny)."""
    response = requests.get(f"{smol_server.base_url}/openapi.json",
                            headers={"x-api-key": smol_server.api_key}, timeout=30)
    assert response.status_code == 200
    live = {(m.upper(), p) for p, ops in response.json()["paths"].items() for m in ops}
    assert live <= set(routes), sorted(live - set(routes))
    assert len(routes) >= 25, routes


def test_without_key_only_health_and_ping_answer(routes, smol_server):
    answers = {(m, p): probe(smol_server, m, p).status_code for m, p in routes}
    wrongly_open = {k: v for k, v in answers.items() if k[1] not in OPEN_PATHS and v != 401}
    wrongly_closed = {k: v for k, v in answers.items() if k[1] in OPEN_PATHS and v != 200}
    assert not wrongly_open, f"answered without a key: {wrongly_open}"
    assert not wrongly_closed, f"liveness probes must answer without a key: {wrongly_closed}"
    assert {p for _, p in answers} >= OPEN_PATHS | {"/metrics", "/invocations", "/tokenize", "/v1/models"}


@pytest.mark.parametrize("header", ["Authorization", "x-api-key"])
def test_wrong_key_is_refused_everywhere(routes, smol_server, header):
    value = "Bearer not-the-key" if header == "Authorization" else "not-the-key"
    refused = {(m, p): probe(smol_server, m, p, {header: value}).status_code
               for m, p in routes if p not in OPEN_PATHS}
    assert set(refused.values()) == {401}, {k: v for k, v in refused.items() if v != 401}


@pytest.mark.parametrize("header", ["Authorization", "x-api-key"])
def test_right_key_passes_everywhere(routes, smol_server, header):
    """With the key in either header, no route says 401 (the handler's own answer, e.g. 400/422 for the
    empty probe body, shows the request got past the middleware)."""
    value = f"Bearer {smol_server.api_key}" if header == "Authorization" else smol_server.api_key
    answers = {(m, p): probe(smol_server, m, p, {header: value}).status_code for m, p in routes}
    assert not {k: v for k, v in answers.items() if v == 401}
    assert answers[("GET", "/v1/models")] == 200
    assert answers[("GET", "/metrics")] == 200
    assert smol_server.is_alive()


def test_anthropic_sdk_with_x_api_key(smol_server):
    import anthropic

    client = anthropic.Anthropic(base_url=smol_server.base_url, api_key=smol_server.api_key,
                                 max_retries=0, timeout=120)
    # temperature through extra_body: anthropic 2.x's messages.create() has no temperature parameter.
    message = client.messages.create(model=smol_server.served_model_name, max_tokens=20,
                                     extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in "".join(b.text for b in message.content if b.type == "text")
    wrong = anthropic.Anthropic(base_url=smol_server.base_url, api_key="not-the-key", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=smol_server.served_model_name, max_tokens=5,
                              messages=[{"role": "user", "content": "Hi"}])


def test_metrics_public_opens_metrics_and_nothing_else(routes, smol_server, monkeypatch):
    """METRICS_PUBLIC reaches vLLM as HYPERQWEN_METRICS_PUBLIC=1: the same real app, built in this process
    with that variable set, is driven without an engine (no lifespan). The middleware answers before any
    handler, so the 401s are exactly the server's; /metrics is served by vLLM's Prometheus app."""
    from starlette.testclient import TestClient

    monkeypatch.setenv(METRICS_PUBLIC_ENV, "1")
    monkeypatch.setenv("VLLM_API_KEY", smol_server.api_key)
    client = TestClient(build_real_app(smol_server), raise_server_exceptions=False)
    answers = {}
    for method, path in routes:
        concrete = re.sub(r"\{[^}]+\}", "probe-id", path)
        kwargs = {"json": {}} if method == "POST" else {}
        answers[(method, path)] = client.request(method, concrete, **kwargs).status_code
    open_now = {k for k, v in answers.items() if v != 401}
    assert {p for _, p in open_now} == OPEN_PATHS | {"/metrics"}, answers
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "# TYPE" in metrics.text


# --- patches 0010 and 0011: invalid text and client errors -------------------------------------------------------


def post_raw(server, path: str, body: bytes) -> requests.Response:
    return requests.post(server.base_url + path, data=body, timeout=120,
                         headers={"Content-Type": "application/json", "x-api-key": server.api_key})


@pytest.mark.needs_patch("0010-request-text-must-be-unicode.patch")
@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v1/chat/completions", b'{"model": "M", "max_tokens": 2, "messages": [{"role": "user", "content": "ok"}, '
         b'{"role": "user", "content": [{"type": "text", "text": "ab\\ud800"}]}]}', "messages[1].content[0].text"),
        ("/v1/chat/completions", b'{"model": "M", "max_tokens": 2, "messages": [{"role": "user", '
         # CESU-8 surrogate bytes: json.loads decodes them with surrogatepass
         b'"content": "x\xed\xa0\x80"}]}', "messages[0].content"),
        ("/v1/completions", b'{"model": "M", "max_tokens": 2, "prompt": "\\udfff"}', "prompt"),
        ("/v1/messages", b'{"model": "M", "max_tokens": 2, "messages": [{"role": "user", "content": "\\ud800"}]}',
         "messages[0].content"),
        ("/v1/messages/count_tokens", b'{"model": "M", "messages": [{"role": "user", "content": "a\\udbff"}]}',
         "messages[0].content"),
    ],
)
def test_invalid_text_is_a_400_naming_the_field(smol_server, path, body, where):
    body = body.replace(b'"M"', json.dumps(smol_server.served_model_name).encode())
    before = len(smol_server.log_text().splitlines())
    response = post_raw(smol_server, path, body)
    assert response.status_code == 400, response.text
    message = json.dumps(response.json())
    assert f"{where} is not valid Unicode text" in message, message
    assert "TextEncodeInput" not in message
    new = smol_server.log_text().splitlines()[before:]
    assert not [line for line in new if "Traceback" in line], new
    assert smol_server.is_alive()


@pytest.mark.needs_patch("0010-request-text-must-be-unicode.patch")
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_invalid_utf8_bytes_are_a_400_naming_the_byte(smol_server, path):
    """Bytes that are not UTF-8 at all (0xFF) fail in the JSON decoder, before any model: a 400 that says which
    byte where (FastAPI alone says "There was an error parsing the body"), no traceback."""
    before = len(smol_server.log_text().splitlines())
    body = b'{"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "\xff\xfe"}]}'
    response = post_raw(smol_server, path, body)
    assert response.status_code == 400, response.text
    offset = body.index(b"\xff")
    assert f"not valid UTF-8: byte 0xff at offset {offset}" in response.text, response.text
    new = smol_server.log_text().splitlines()[before:]
    assert not [line for line in new if "Traceback" in line], new


@pytest.mark.needs_patch("0011-messages-client-errors-without-traceback.patch")
def test_messages_client_error_logs_one_line(smol_server):
    """A prompt longer than the context is the client's error: a 400, and one WARNING line, no traceback."""
    before = len(smol_server.log_text().splitlines())
    body = {"model": smol_server.served_model_name, "max_tokens": 16,
            "messages": [{"role": "user", "content": "word " * 5000}]}
    response = requests.post(smol_server.base_url + "/v1/messages", json=body, timeout=120,
                             headers={"x-api-key": smol_server.api_key})
    assert response.status_code == 400, response.text
    import time

    time.sleep(0.5)
    new = smol_server.log_text().splitlines()[before:]
    assert not [line for line in new if "Traceback" in line or "ERROR" in line], new
    assert [line for line in new if "create_messages: client error 400" in line], new
