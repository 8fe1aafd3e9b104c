"""A recording HTTP proxy between a coding-agent CLI and the test server (used by test_agents_clients.py).

It forwards every request unchanged except where a test asks it to force a tool call (the random-weight test
model never calls a tool on its own; the point is the protocol round trip), streams the answer back as it
arrives (SSE included), and records what the server received and answered: method, path, status, the JSON body.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from support.httpserver import LoopbackServer

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding"}


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    body: Any  # parsed JSON request body (after any rewrite), or None
    response_bytes: bytes = b""


@dataclass
class RecordingProxy:
    """`with RecordingProxy(server.base_url, rewrite) as proxy:` then point the client at proxy.url.

    rewrite(path, body) may return a changed body (a dict) for a JSON request, or None to leave it.
    """

    target: str
    rewrite: Callable[[str, dict], dict | None] | None = None
    exchanges: list[Exchange] = field(default_factory=list)
    keep_response_bytes: int = 200_000

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        parts = urlsplit(self.target)
        self._host, self._port = parts.hostname, parts.port
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: the test reads `exchanges`
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = None
                if raw and "json" in (self.headers.get("Content-Type") or ""):
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = None
                if isinstance(body, dict) and proxy.rewrite is not None:
                    changed = proxy.rewrite(self.path, body)
                    if changed is not None:
                        body = changed
                        raw = json.dumps(body).encode()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                headers["Content-Length"] = str(len(raw))
                upstream = http.client.HTTPConnection(proxy._host, proxy._port, timeout=600)
                upstream.request(self.command, self.path, body=raw or None, headers=headers)
                answer = upstream.getresponse()
                exchange = Exchange(self.command, self.path, answer.status, body)
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_HEADERS:
                        self.send_header(key, value)
                self.send_header("Connection", "close")
                self.end_headers()
                kept = bytearray()
                if self.command != "HEAD":
                    while chunk := answer.read1(65536):
                        if len(kept) < proxy.keep_response_bytes:
                            kept += chunk
                        self.wfile.write(chunk)
                        self.wfile.flush()
                exchange.response_bytes = bytes(kept)
                upstream.close()
                self.close_connection = True
                with proxy._lock:
                    proxy.exchanges.append(exchange)

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_OPTIONS = _forward

        self._http = LoopbackServer(Handler)

    @property
    def url(self) -> str:
        return self._http.url

    def __enter__(self) -> RecordingProxy:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__(*exc)

    def summary(self) -> list[tuple[str, str, int]]:
        with self._lock:
            return [(e.method, e.path, e.status) for e in self.exchanges]

    def posts(self, path_prefix: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.method == "POST" and e.path.startswith(path_prefix)]
