"""A wheelhouse as volumes a size-limited transfer can carry: one tar split into fixed-size parts, with a
manifest (every volume's size and sha256, and the whole tar's) checked before anything is unpacked."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = 1


class VolumeError(ValueError):
    """A volume set that cannot be installed: the message names the volume and what to do."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_volumes(files: Iterable[Path], out: Path, volume_bytes: int, *, root: Path) -> dict:
    """Tar `files` (stored under their path relative to `root`), split the tar into `volume_bytes` parts
    p00, p01, ... in `out`, and write the manifest last (a crash leaves no manifest, so no half set)."""
    if volume_bytes < 1 << 20:
        raise VolumeError(f"volume size {volume_bytes} B is too small: use at least 1 MiB (e.g. 60MiB)")
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("p[0-9][0-9]"), out / MANIFEST]:
        stale.unlink(missing_ok=True)
    buffer = io.BytesIO()
    names = []
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(files):
            arcname = path.relative_to(root).as_posix()
            tar.add(path, arcname=arcname, recursive=False)
            names.append(arcname)
    data = buffer.getvalue()
    count = -(-len(data) // volume_bytes)
    if count > 100:
        raise VolumeError(f"{count} volumes of {volume_bytes} B: more than p00..p99; choose a larger volume size")
    volumes = []
    for index in range(count):
        part = data[index * volume_bytes : (index + 1) * volume_bytes]
        name = f"p{index:02d}"
        (out / name).write_bytes(part)
        volumes.append({"name": name, "bytes": len(part), "sha256": _sha256(part)})
    manifest = {"format": FORMAT, "tar_bytes": len(data), "tar_sha256": _sha256(data), "files": names,
                "volumes": volumes}
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(out / MANIFEST)
    return manifest


def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise VolumeError(f"{path} is missing: ship manifest.json with the volumes (pack.py writes it)") from None
    except (OSError, ValueError) as exc:
        raise VolumeError(f"{path} is unreadable ({exc}): ship it again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not manifest.get("volumes"):
        raise VolumeError(f"{path} is not a format-{FORMAT} volume manifest: pack the wheelhouse again")
    return manifest


def joined_tar(directory: Path) -> bytes:
    """The verified tar: every volume present with its size and sha256, and the whole tar's sha256."""
    manifest = read_manifest(directory)
    parts = []
    for volume in manifest["volumes"]:
        path = directory / volume["name"]
        if not path.is_file():
            raise VolumeError(f"volume {volume['name']} is missing from {directory}: ship it again")
        data = path.read_bytes()
        if len(data) != volume["bytes"] or _sha256(data) != volume["sha256"]:
            raise VolumeError(
                f"volume {volume['name']} is corrupt ({len(data)} B, expected {volume['bytes']} B with sha256 "
                f"{volume['sha256'][:12]}...): ship it again"
            )
        parts.append(data)
    data = b"".join(parts)
    if _sha256(data) != manifest["tar_sha256"]:
        raise VolumeError(f"the joined volumes in {directory} do not match the manifest: pack and ship them again")
    return data


def unpack(directory: Path, destination: Path) -> list[str]:
    """Verify, then extract into `destination`; returns the member names."""
    data = joined_tar(directory)
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(destination, filter="data")
        return tar.getnames()
