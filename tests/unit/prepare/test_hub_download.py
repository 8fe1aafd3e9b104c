"""The download path through huggingface_hub's real client against a fake hub (a local HTTP server that
speaks the few endpoints snapshot_download uses: repo info, tree listing, resolve with HEAD/GET/Range).
Not the real hub (no network here), but everything on our side and huggingface_hub's side is real."""

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from hyperqwen.prepare.errors import SourceError
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.pipeline import MANIFEST_NAME, prepare
from hyperqwen.prepare.source import COMPLETE_MARKER, DOWNLOAD_CHUNK, RemoteFile, part_path

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
                body = b'{"error": "Invalid credentials in Authorization header"}'
                self.send_response(status)
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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def gets(self, name: str) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == "GET" and r[1].endswith("/" + name)]


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
    values = dict(
        output_dir=tmp_path / "models" / "m",
        models_dir=tmp_path / "models",
        repo_id=REPO,
        revision="main",
        hf_endpoint=hub.endpoint,
        show_progress=False,
    )
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
    assert not list(options.source_download_dir.rglob("*.hyperqwen-part"))  # a wrong partial is not continued
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
    assert ranged, [
        r for r in hub.requests if r[1].endswith(shard)
    ]  # the second attempt asked only for the missing bytes
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


SHARD = "model-00002-of-00003.safetensors"

# The prepare process the tests SIGKILL: the real pipeline, in its own interpreter.
CHILD = """
import json, sys
from pathlib import Path
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.pipeline import prepare
a = json.loads(sys.argv[1])
prepare(PrepareOptions(output_dir=Path(a["out"]), models_dir=Path(a["models"]), repo_id=a["repo"], revision="main",
                       hf_endpoint=a["endpoint"], show_progress=False))
"""


def _socket_slack() -> int:
    """Bytes the hub may have sent that never reached the killed process: the kernel's TCP buffers."""
    total = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        try:
            total += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
        except (OSError, ValueError, IndexError):
            total += 8 << 20
    return total


def _orphans(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith((".hyperqwen-part", ".incomplete", ".hyperqwen-tmp"))]


def test_a_download_killed_three_times_in_new_processes_continues_with_range_requests(tmp_path, big_hub):
    hub = big_hub
    data = hub.files[SHARD]
    size = len(data)
    options = _options(tmp_path, hub)
    part = part_path(options.source_download_dir, RemoteFile(SHARD, size, hashlib.sha256(data).hexdigest()))
    args = json.dumps(
        {"out": str(options.output_dir), "models": str(options.models_dir), "repo": REPO, "endpoint": hub.endpoint}
    )
    kills = (size // 5, size // 2, size * 4 // 5)  # three different byte counts
    partials = []
    def kill_once_written(holder: dict) -> None:
        # The hub sends nothing more while this runs; give the child a moment to write what it has read (on a
        # loaded machine it may lag far behind the socket), so every kill leaves a partial file to resume from.
        deadline, last, still_since = time.monotonic() + 15, -1, time.monotonic()
        while time.monotonic() < deadline:
            have = part.stat().st_size if part.exists() else 0
            if have != last:
                last, still_since = have, time.monotonic()
            elif have > 0 and time.monotonic() - still_since > 0.5:
                break
            time.sleep(0.05)
        os.kill(holder["proc"].pid, signal.SIGKILL)

    for offset in kills:
        holder: dict = {}
        hub.kill_at = (SHARD, offset, lambda holder=holder: kill_once_written(holder))
        holder["proc"] = subprocess.Popen(
            [sys.executable, "-c", CHILD, args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        _, err = holder["proc"].communicate(timeout=300)
        assert holder["proc"].returncode == -signal.SIGKILL, err.decode()[-2000:]
        assert not options.output_dir.exists()
        partials.append(part.stat().st_size)
    result = prepare(options)  # the fourth run, in this process, completes
    assert result.changed and (options.source_download_dir / SHARD).read_bytes() == data

    gets = hub.gets(SHARD)
    ranged = [r for r in gets if r[2]]
    assert len(gets) == 4 and len(ranged) == 3, gets
    # Each new process asked for exactly what its predecessor had not written yet.
    assert [int(r[2].split("=")[1].rstrip("-")) for r in ranged] == partials
    assert 0 < partials[0] < partials[1] < partials[2] < size
    # What a kill loses: at most one read chunk plus what sat in the kernel's socket buffers.
    for offset, have in zip(kills, partials):
        assert offset - have <= DOWNLOAD_CHUNK + _socket_slack(), (offset, have)
    served = [sent for name, start, sent in hub.sent if name == SHARD]
    assert served[-1] == size - partials[-1]  # the last run fetched only the missing bytes
    # Files completed before a kill were never fetched again.
    for name in hub.files:
        if name != SHARD:
            assert len(hub.gets(name)) <= 1, name
    assert not _orphans(tmp_path / "models"), _orphans(tmp_path / "models")


def test_a_missing_or_truncated_source_file_is_fetched_again(tmp_path, hub, caplog):
    options = _options(tmp_path, hub)
    prepare(options)
    directory = options.source_download_dir
    other = "model-00003-of-00003.safetensors"
    with open(directory / SHARD, "r+b") as handle:
        handle.truncate(len(hub.files[SHARD]) // 2)
    (directory / other).unlink()
    hub.requests.clear()
    with caplog.at_level(logging.WARNING, logger="hyperqwen.prepare"):
        result = prepare(options)
    assert result.changed
    assert (
        f"{SHARD}: {len(hub.files[SHARD]) // 2} bytes, the hub says" in caplog.text
        and "fetching it again" in caplog.text
    )
    assert f"{other}: missing from the earlier download; fetching it again" in caplog.text
    assert (directory / SHARD).read_bytes() == hub.files[SHARD] and (directory / other).read_bytes() == hub.files[other]
    assert len(hub.gets(SHARD)) == 1 and len(hub.gets(other)) == 1
    assert not [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1] and not r[1].endswith((SHARD, other))]
    assert not prepare(options).changed


@pytest.mark.parametrize("status", [401, 403])
def test_a_rejected_token_is_never_taken_for_an_unreachable_hub(tmp_path, hub, caplog, status):
    token = "hf_wrong_token_0123456789abcdef"
    options = _options(tmp_path, hub, token=token)
    prepare(options)  # an earlier verified download exists
    import shutil

    shutil.rmtree(options.output_dir)  # so the next run needs the source (a no-op run never asks the hub)
    hub.status = status
    with caplog.at_level(logging.INFO, logger="hyperqwen.prepare"), pytest.raises(SourceError) as info:
        prepare(options)
    text = str(info.value)
    assert "HF_TOKEN (****)" in text and f"HTTP {status}" in text and "unreachable" not in text.lower()
    assert "HF_HUB_OFFLINE=1" in text
    assert token not in text + caplog.text and "unreachable" not in caplog.text
    assert not options.output_dir.exists()
    # With the offline knob the earlier verified download is used, without asking the hub.
    asked = len(hub.requests)
    import dataclasses

    assert prepare(dataclasses.replace(options, offline=True)).changed
    assert len(hub.requests) == asked


def test_a_repo_without_config_json_says_so_every_time(tmp_path, pristine_source):
    files = {
        p.relative_to(pristine_source).as_posix(): p.read_bytes()
        for p in sorted(pristine_source.rglob("*"))
        if p.is_file() and p.name != "config.json"
    }
    fake = FakeHub(files)
    fake.thread.start()
    try:
        options = _options(tmp_path, fake)
        for _ in range(2):
            with pytest.raises(SourceError) as info:
                prepare(options)
            text = str(info.value)
            assert "has no config.json" in text and "MODEL_REPO" in text and "run prepare again" not in text
        assert not [r for r in fake.requests if "/resolve/" in r[1]]  # nothing downloaded for nothing
    finally:
        fake.server.shutdown()
        fake.server.server_close()
