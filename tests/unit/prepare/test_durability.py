"""Durability order, shown with an fsync-recording shim (a SIGKILL cannot show lost writes; a power cut can).

The shim wraps os.fsync, os.replace and os.rename (and the directory exchange) and records, in order, which
inode was fsynced and which name was published. The claims checked are the ones prepare/README.md makes:
  - a downloaded file's data and its directory entry are fsynced before the download's completion marker;
  - every file of the model (hard-linked shards included) and every directory of it are fsynced before the
    manifest that says "complete" is written, and the manifest itself before the directory is published;
  - the models folder is fsynced after the publish rename.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyperqwen.prepare import pipeline
from hyperqwen.prepare.pipeline import MANIFEST_NAME, prepare
from hyperqwen.prepare.source import COMPLETE_MARKER


class Recorder:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, int | str, str]] = []
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename
        real_exchange = pipeline.exchange_dirs

        def fsync(fd: int) -> None:
            real_fsync(fd)
            self.events.append(("fsync", os.fstat(fd).st_ino, os.readlink(f"/proc/self/fd/{fd}")))

        def replace(src, dst, **kwargs) -> None:
            real_replace(src, dst, **kwargs)
            self.events.append(("publish", os.stat(dst).st_ino, str(dst)))

        def rename(src, dst, **kwargs) -> None:
            real_rename(src, dst, **kwargs)
            self.events.append(("publish", os.stat(dst).st_ino, str(dst)))

        def exchange(a: Path, b: Path) -> bool:
            done = real_exchange(a, b)
            if done:
                self.events.append(("publish", os.stat(b).st_ino, str(b)))
            return done

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(pipeline, "exchange_dirs", exchange)

    def index(self, kind: str, path_suffix: str) -> int:
        hits = [i for i, e in enumerate(self.events) if e[0] == kind and str(e[2]).endswith(path_suffix)]
        assert hits, f"no {kind} of *{path_suffix} in {self.events}"
        return hits[-1]

    def last_fsync_of(self, inode: int, before: int) -> int:
        hits = [i for i, e in enumerate(self.events[:before]) if e[0] == "fsync" and e[1] == inode]
        return hits[-1] if hits else -1


def _check_model(recorder: Recorder, output: Path) -> None:
    manifest_at = recorder.index("publish", f"{MANIFEST_NAME}")
    publish_at = recorder.index("publish", f"/{output.name}")
    assert manifest_at < publish_at
    for path in sorted(output.rglob("*")):
        inode = path.stat().st_ino
        if path.name == MANIFEST_NAME:
            assert recorder.last_fsync_of(inode, manifest_at) >= 0, path
            continue
        # The file's data, before the manifest says the directory is complete.
        assert recorder.last_fsync_of(inode, manifest_at) >= 0, f"{path} was not fsynced before the manifest"
    for directory in [output, *(p for p in output.rglob("*") if p.is_dir())]:
        inode = directory.stat().st_ino
        # The directory's entries, after its last file arrived and before publish (the manifest's own rename
        # into it is followed by a directory fsync too).
        synced = recorder.last_fsync_of(inode, publish_at)
        assert synced > manifest_at or directory != output, f"{directory} not fsynced after the manifest"
        assert synced >= 0, f"{directory} was never fsynced before publish"
    parent = output.parent.stat().st_ino
    assert any(e[0] == "fsync" and e[1] == parent for e in recorder.events[publish_at + 1 :]), (
        "the models folder was not fsynced after the publish rename"
    )


def test_local_source_fsync_order(pristine_source, models_dir, make_options, monkeypatch):
    options = make_options(pristine_source, models_dir)
    recorder = Recorder(monkeypatch)
    assert prepare(options).changed
    _check_model(recorder, options.output_dir)


def test_hub_download_fsync_order(tmp_path, monkeypatch, pristine_source):
    from hyperqwen.prepare.options import PrepareOptions
    from support.fakehub import REPO, FakeHub

    with FakeHub.of_folder(pristine_source) as hub:
        options = PrepareOptions(
            output_dir=tmp_path / "models" / "m",
            models_dir=tmp_path / "models",
            repo_id=REPO,
            revision="main",
            hf_endpoint=hub.endpoint,
            show_progress=False,
        )
        recorder = Recorder(monkeypatch)
        assert prepare(options).changed
    download = options.source_download_dir
    marker_at = recorder.index("publish", COMPLETE_MARKER)
    for name in hub.files:
        path = download / name
        inode = path.stat().st_ino
        file_synced = recorder.last_fsync_of(inode, marker_at)
        placed = recorder.index("publish", str(path))
        assert 0 <= file_synced < placed < marker_at, f"{name}: data fsync, rename, marker out of order"
        dir_synced = recorder.last_fsync_of(path.parent.stat().st_ino, marker_at)
        assert placed < dir_synced < marker_at, f"{name}: its directory was not fsynced before the marker"
    _check_model(recorder, options.output_dir)
