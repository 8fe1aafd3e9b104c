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
import time
from pathlib import Path

import pytest

from hyperqwen.prepare.errors import SourceError
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.pipeline import MANIFEST_NAME, prepare
from hyperqwen.prepare.source import COMPLETE_MARKER, DOWNLOAD_CHUNK, RemoteFile, part_path
from support.fakehub import COMMIT, REPO, FakeHub


@pytest.fixture
def hub(pristine_source):
    with FakeHub.of_folder(pristine_source) as fake:
        yield fake


@pytest.fixture
def big_hub(tmp_path):
    """A checkpoint whose lm_head shard (~21 MB) is larger than huggingface_hub's 10 MB download chunk, so a
    cut connection leaves whole chunks on disk to resume from."""
    from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint

    write_synthetic_checkpoint(tmp_path / "big", SyntheticShape(vocab=40960))
    with FakeHub.of_folder(tmp_path / "big") as fake:
        yield fake


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
    with FakeHub.of_folder(pristine_source) as fake:
        del fake.files["config.json"]
        options = _options(tmp_path, fake)
        for _ in range(2):
            with pytest.raises(SourceError) as info:
                prepare(options)
            text = str(info.value)
            assert "has no config.json" in text and "MODEL_REPO" in text and "run prepare again" not in text
        assert not [r for r in fake.requests if "/resolve/" in r[1]]  # nothing downloaded for nothing
