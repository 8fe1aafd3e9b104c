"""A fake Hugging Face hub for prepare's tests: a local HTTP server speaking the few endpoints
huggingface_hub's snapshot_download uses (repo info, tree listing, resolve with HEAD/GET/Range), and the error
answers (status + X-Error-Code/X-Error-Message headers) the real hub gives. Not the real hub (no network here);
huggingface_hub's client code on the other side is real.

    with FakeHub({"config.json": b"{}"}) as hub:
        ... PrepareOptions(hf_endpoint=hub.endpoint, ...)
"""

from __future__ import annotations

import hashlib
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlparse

from support.httpserver import LoopbackServer

REPO = "org/qwen-tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """Weight shards are LFS files (sha256 in the metadata), the rest plain git files (blob id), like the hub.

    Every request is logged as (method, path, Range header); `sent` logs (path, first byte, bytes sent) per GET.
    `kill_at` = (path, absolute offset, callback): once that many bytes of the file went out, call back (the
    tests SIGKILL the prepare process there) and cut the connection."""

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.served = dict(files)  # what GET returns (a test may make it differ from the metadata)
        self.requests: list[tuple[str, str, str | None]] = []
        self.sent: list[tuple[str, int, int]] = []
        self.truncate_once: set[str] = set()  # first GET of these paths stops half-way
        self.kill_at: tuple[str, int, object] | None = None
        self.status: int | None = None  # answer every request with this status (401, 403, ...)
        # ... with these headers (X-Error-Code, X-Error-Message: what the real hub sends) and error text
        self.error_headers: dict[str, str] = {}
        self.error_message = "Invalid credentials in Authorization header"
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, data):
                body = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _meta(self, path: str) -> dict:
                data = hub.files[path]
                return {
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "oid": git_blob_id(data),
                    "lfs": path.endswith(".safetensors"),
                }

            def do_GET(self):
                self._handle(head=False)

            def do_HEAD(self):
                self._handle(head=True)

            def _status(self, status: int):
                body = json.dumps({"error": hub.error_message}).encode()
                self.send_response(status)
                for key, value in hub.error_headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _handle(self, head: bool):
                url = urlparse(self.path)
                path = unquote(url.path)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                if hub.status is not None:
                    return self._status(hub.status)
                if path.startswith(f"/api/models/{REPO}/revision/"):
                    siblings = []
                    for name in sorted(hub.files):
                        m = self._meta(name)
                        entry = {"rfilename": name, "size": m["size"], "blobId": m["oid"]}
                        if m["lfs"]:
                            entry["lfs"] = {"sha256": m["sha256"], "size": m["size"], "pointerSize": 130}
                        siblings.append(entry)
                    return self._json(
                        {
                            "id": REPO,
                            "modelId": REPO,
                            "sha": COMMIT,
                            "siblings": siblings,
                            "private": False,
                            "gated": False,
                            "tags": [],
                            "downloads": 0,
                            "likes": 0,
                        }
                    )
                if path.startswith(f"/api/models/{REPO}/tree/"):
                    entries = []
                    for name in sorted(hub.files):
                        m = self._meta(name)
                        entry = {"type": "file", "path": name, "size": m["size"], "oid": m["oid"]}
                        if m["lfs"]:
                            entry["lfs"] = {"oid": m["sha256"], "size": m["size"], "pointerSize": 130}
                        entries.append(entry)
                    return self._json(entries)
                prefix = f"/{REPO}/resolve/{COMMIT}/"
                if path.startswith(prefix) and path[len(prefix) :] in hub.files:
                    name = path[len(prefix) :]
                    meta = self._meta(name)
                    data = hub.served[name]
                    start = 0
                    if self.headers.get("Range"):
                        start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    body = data[start:]
                    self.send_response(206 if start else 200)
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("ETag", f'"{meta["sha256"]}"')
                    self.send_header("X-Linked-Etag", f'"{meta["sha256"]}"')
                    self.send_header("X-Linked-Size", str(meta["size"]))
                    self.send_header("Content-Length", str(len(body)))
                    if start:
                        self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                    self.end_headers()
                    if head:
                        return
                    if name in hub.truncate_once and not start:
                        hub.truncate_once.discard(name)
                        self.wfile.write(body[: len(body) * 2 // 3])
                        self.wfile.flush()
                        hub.sent.append((name, start, len(body) * 2 // 3))
                        self.close_connection = True
                        return
                    sent = 0
                    step = 256 << 10
                    try:
                        while sent < len(body):
                            kill = hub.kill_at
                            if kill is not None and kill[0] == name and start + sent >= kill[1]:
                                hub.kill_at = None
                                kill[2]()
                                self.close_connection = True
                                return
                            self.wfile.write(body[sent : sent + step])
                            sent += len(body[sent : sent + step])
                    except (BrokenPipeError, ConnectionResetError):
                        self.close_connection = True
                    finally:
                        hub.sent.append((name, start, sent))
                    return
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.http = LoopbackServer(Handler)

    @classmethod
    def of_folder(cls, directory: Path) -> FakeHub:
        """A hub whose repo holds every file below `directory` (a checkpoint folder)."""
        return cls(
            {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
        )

    def __enter__(self) -> FakeHub:
        self.http.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.http.__exit__(*exc_info)

    def fail_every_request(self, status: int, headers: dict[str, str]) -> None:
        """Answer everything with `status` and the hub's error headers, as the real hub does for a missing
        repo, a gated one, a wrong token or a missing revision."""
        self.status = status
        self.error_headers = dict(headers)
        self.error_message = headers.get("X-Error-Message", "error")

    @property
    def endpoint(self) -> str:
        return self.http.url

    def gets(self, name: str) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == "GET" and r[1].endswith("/" + name)]
