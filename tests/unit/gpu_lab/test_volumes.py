"""The wheelhouse as volumes: split, manifest, and the refusals a bad transfer must get."""

from __future__ import annotations

import json
import os

import pytest
from gpu_lab.volumes import MANIFEST, VolumeError, unpack, write_volumes


@pytest.fixture
def house(tmp_path):
    root = tmp_path / "house"
    (root / "bin").mkdir(parents=True)
    files = []
    for i in range(3):
        path = root / f"pkg{i}-1.0-py3-none-any.whl"
        path.write_bytes(os.urandom(700_000 + i))
        files.append(path)
    (root / "bin" / "patch").write_bytes(b"#!/bin/sh\n")
    files.append(root / "bin" / "patch")
    return root, files


def test_volumes_round_trip_with_manifest(house, tmp_path):
    root, files = house
    manifest = write_volumes(files, tmp_path / "vol", 1 << 20, root=root)
    assert [v["name"] for v in manifest["volumes"]] == ["p00", "p01", "p02"]
    assert all(v["bytes"] <= 1 << 20 for v in manifest["volumes"])
    names = unpack(tmp_path / "vol", tmp_path / "out")
    assert sorted(names) == sorted(p.relative_to(root).as_posix() for p in files)
    for path in files:
        assert (tmp_path / "out" / path.relative_to(root)).read_bytes() == path.read_bytes()


def test_missing_volume_is_named(house, tmp_path):
    root, files = house
    write_volumes(files, tmp_path / "vol", 1 << 20, root=root)
    (tmp_path / "vol" / "p01").unlink()
    with pytest.raises(VolumeError, match=r"volume p01 is missing .*ship it again"):
        unpack(tmp_path / "vol", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_corrupt_volume_is_named_and_nothing_unpacked(house, tmp_path):
    root, files = house
    write_volumes(files, tmp_path / "vol", 1 << 20, root=root)
    data = bytearray((tmp_path / "vol" / "p02").read_bytes())
    data[10] ^= 0xFF
    (tmp_path / "vol" / "p02").write_bytes(bytes(data))
    with pytest.raises(VolumeError, match=r"volume p02 is corrupt"):
        unpack(tmp_path / "vol", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_or_foreign_manifest(house, tmp_path):
    root, files = house
    write_volumes(files, tmp_path / "vol", 1 << 20, root=root)
    (tmp_path / "vol" / MANIFEST).write_text(json.dumps({"format": 99}))
    with pytest.raises(VolumeError, match="not a format-1 volume manifest"):
        unpack(tmp_path / "vol", tmp_path / "out")
    (tmp_path / "vol" / MANIFEST).unlink()
    with pytest.raises(VolumeError, match="manifest.json is missing"):
        unpack(tmp_path / "vol", tmp_path / "out")


def test_repacking_leaves_no_stale_volume(house, tmp_path):
    root, files = house
    write_volumes(files, tmp_path / "vol", 1 << 20, root=root)
    manifest = write_volumes(files[:1], tmp_path / "vol", 1 << 20, root=root)
    assert sorted(p.name for p in (tmp_path / "vol").iterdir()) == ["manifest.json", "p00"]
    assert len(manifest["volumes"]) == 1


def test_volume_size_too_small(house, tmp_path):
    root, files = house
    with pytest.raises(VolumeError, match="at least 1 MiB"):
        write_volumes(files, tmp_path / "vol", 1000, root=root)
