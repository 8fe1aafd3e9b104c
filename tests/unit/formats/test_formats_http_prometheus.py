"""hyperqwen.formats.http (the one urllib helper) and hyperqwen.formats.prometheus (the one /metrics parser)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from hyperqwen.formats import http, prometheus

KEY = "sk-helper-test-0123456789"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/slow":
            threading.Event().wait(2)
        authorized = self.headers.get("Authorization") == f"Bearer {KEY}"
        body = json.dumps({"authorized": authorized}).encode()
        self.send_response(200 if authorized else 401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        length = int(self.headers["Content-Length"])
        payload = json.loads(self.rfile.read(length))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps({"echo": payload, "type": self.headers["Content-Type"]}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def local_server():
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_http_helper_statuses_auth_and_payload(local_server):
    assert http.get(local_server + "/x").status == 401
    ok = http.get(local_server + "/x", api_key=KEY)
    assert ok.ok and ok.json() == {"authorized": True}
    posted = http.post(local_server + "/p", {"a": 1})
    assert posted.json() == {"echo": {"a": 1}, "type": "application/json"}


def test_http_helper_errors_never_carry_the_key(local_server, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(http.HttpError) as info:
        http.get(local_server + "/slow", api_key=KEY, timeout=0.3)
    with pytest.raises(http.HttpError) as refused:
        http.get("http://127.0.0.1:9/x", api_key=KEY, timeout=5)
    for exc in (info.value, refused.value):
        assert KEY not in str(exc) and KEY not in repr(exc) and exc.url.startswith("http://127.0.0.1")
    assert isinstance(info.value, OSError)  # callers that catch OSError keep working
    assert KEY not in caplog.text


def test_prometheus_samples_and_sums():
    registry = CollectorRegistry()
    counter = Counter("vllm:spec_decode_num_drafts", "d", ["engine"], registry=registry)
    counter.labels("0").inc(3)
    counter.labels("1").inc(4)
    text = generate_latest(registry).decode()
    names = {s.name for s in prometheus.samples(text)}
    assert "vllm:spec_decode_num_drafts_total" in names
    assert prometheus.sum_by_name(text, {"vllm:spec_decode_num_drafts_total"}) == {
        "vllm:spec_decode_num_drafts_total": 7.0}
    with pytest.raises(prometheus.PrometheusFormatError):
        list(prometheus.samples("this is { not prometheus"))
