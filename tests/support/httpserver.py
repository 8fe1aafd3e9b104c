"""A local HTTP server for tests that stand in for something on the network (the hub, a vLLM server, a proxy):
a ThreadingHTTPServer on a free 127.0.0.1 port, answering on a daemon thread while a `with` block runs.

    with LoopbackServer(Handler) as server:
        ... requests to server.url ...
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler], *, poll_interval: float = 0.5):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": poll_interval}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
