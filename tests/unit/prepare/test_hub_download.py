"""The download path through huggingface_hub's real client against a fake hub (a local HTTP server that
speaks the few endpoints snapshot_download uses: repo info, tree listing, resolve with HEAD/GET/Range).
Not the real hub (no network here), but everything on our side and huggingface_hub's side is real."""

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from hyperqwen.prepare.errors import SourceError
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.pipeline import MANIFEST_NAME, prepare
from hyperqwen.prepare.source import COMPLETE_MARKER

REPO = "org/qwen-tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.served = dict(files)  # what GET returns (a test may make it differ from the metadata)
        self.requests: list[tuple[str, str, str | None]] = []
        self.truncate_once: set[str] = set()  # first GET of these paths stops half-way
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
                return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "oid": hashlib.sha1(data).hexdigest()}

            def do_GET(self):
                self._handle(head=False)

            def do_HEAD(self):
                self._handle(head=True)

            def _handle(self, head: bool):
                url = urlparse(self.path)
                path = unquote(url.path)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                if path.startswith(f"/api/models/{REPO}/revision/"):
                    siblings = []
                    for name in sorted(hub.files):
                        m = self._meta(name)
                        siblings.append({"rfilename": name, "size": m["size"], "blobId": m["oid"],
                                         "lfs": {"sha256": m["sha256"], "size": m["size"], "pointerSize": 130}})
                    return self._json({"id": REPO, "modelId": REPO, "sha": COMMIT, "siblings": siblings,
                                       "private": False, "gated": False, "tags": [], "downloads": 0, "likes": 0})
                if path.startswith(f"/api/models/{REPO}/tree/"):
                    entries = []
                    for name in sorted(hub.files):
                        m = self._meta(name)
                        entries.append({"type": "file", "path": name, "size": m["size"], "oid": m["oid"],
                                        "lfs": {"oid": m["sha256"], "size": m["size"], "pointerSize": 130}})
                    return self._json(entries)
                prefix = f"/{REPO}/resolve/{COMMIT}/"
                if path.startswith(prefix) and path[len(prefix):] in hub.files:
                    name = path[len(prefix):]
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
                        self.close_connection = True
                        return
                    self.wfile.write(body)
                    return
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def _serve(directory: Path):
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    fake = FakeHub(files)
    fake.thread.start()
    return fake


@pytest.fixture
def hub(pristine_source):
    fake = _serve(pristine_source)
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def big_hub(tmp_path):
    """A checkpoint whose lm_head shard (~21 MB) is larger than huggingface_hub's 10 MB download chunk, so a
    cut connection leaves whole chunks on disk to resume from."""
    from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint

    write_synthetic_checkpoint(tmp_path / "big", SyntheticShape(vocab=40960))
    fake = _serve(tmp_path / "big")
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def _options(tmp_path: Path, hub: FakeHub, **overrides) -> PrepareOptions:
    values = dict(output_dir=tmp_path / "models" / "m", models_dir=tmp_path / "models", repo_id=REPO,
                  revision="main", hf_endpoint=hub.endpoint, show_progress=False)
    values.update(overrides)
    return PrepareOptions(**values)


def test_download_verify_prepare_and_noop(tmp_path, hub, pristine_source):
    options = _options(tmp_path, hub)
    result = prepare(options)
    assert result.changed and "lm_head.weight" in result.quant_errors
    marker = json.loads((options.source_download_dir / COMPLETE_MARKER).read_text())
    assert marker["commit"] == COMMIT and set(marker["files"]) == set(hub.files)
    for name, data in hub.files.items():
        assert (options.source_download_dir / name).read_bytes() == data
    manifest = json.loads((options.output_dir / MANIFEST_NAME).read_text())
    assert manifest["source"] == {"kind": "hub", "repo": REPO, "revision": "main", "commit": COMMIT}
    # Re-run: no-op, and not a single request to the hub.
    before = len(hub.requests)
    assert not prepare(options).changed
    assert len(hub.requests) == before


def test_a_corrupted_download_is_caught_and_refetched(tmp_path, hub):
    shard = "model-00002-of-00003.safetensors"
    good = hub.served[shard]
    hub.served[shard] = good[:-8] + b"\0" * 8  # same size, different bytes than the hub's sha256
    options = _options(tmp_path, hub)
    with pytest.raises(SourceError) as info:
        prepare(options)
    assert shard in str(info.value) and "sha256" in str(info.value) and "run prepare again" in str(info.value)
    assert not (options.source_download_dir / shard).exists()  # deleted, not trusted
    assert not options.output_dir.exists()
    hub.served[shard] = good
    assert prepare(options).changed


def test_an_interrupted_download_resumes(tmp_path, big_hub):
    hub = big_hub
    shard = "model-00002-of-00003.safetensors"
    assert len(hub.files[shard]) > 15 << 20
    hub.truncate_once.add(shard)
    options = _options(tmp_path, hub)
    try:
        prepare(options)
    except SourceError:
        pass  # huggingface_hub may give up on the cut connection; the next run must continue
    result = prepare(options) if not options.output_dir.exists() else None
    assert options.output_dir.is_dir()
    ranged = [r for r in hub.requests if r[0] == "GET" and r[1].endswith(shard) and r[2]]
    assert ranged, [r for r in hub.requests if r[1].endswith(shard)]  # the second attempt asked only for the missing bytes
    assert (options.source_download_dir / shard).read_bytes() == hub.files[shard]
    assert result is None or result.changed


def test_download_preflight_on_a_small_disk(tmp_path, hub):
    import subprocess
    import uuid

    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    try:
        options = _options(tmp_path, hub, models_dir=mount, output_dir=mount / "m")
        from hyperqwen.prepare.errors import DiskSpaceError

        with pytest.raises(DiskSpaceError) as info:
            prepare(options)
        assert "the download needs" in str(info.value) and "requantized copy" in str(info.value)
        assert not any(r[0] == "GET" and "/resolve/" in r[1] for r in hub.requests)  # nothing fetched
    finally:
        subprocess.run(["umount", str(mount)], check=False)
