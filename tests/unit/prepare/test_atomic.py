"""atomic_write's large-file path (O_DIRECT chunks + a buffered tail) and the early writeback of the buffered one."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from hyperqwen.prepare import atomic
from hyperqwen.prepare.atomic import DirectSink, atomic_write


def _pieces(seed: int) -> list[bytes]:
    """Odd-sized pieces, so chunk and page boundaries fall inside them: a header, blocks, a tail."""
    rng = np.random.default_rng(seed)
    sizes = [8 + 8 * 37, *rng.integers(1, 50_000, 40).tolist(), 3 * 8192 + 5, 16]
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


@pytest.mark.parametrize("owned", [False, True])
def test_a_large_file_is_written_whole_through_the_direct_sink(tmp_path, monkeypatch, owned):
    monkeypatch.setattr(DirectSink, "CHUNK", 8192)  # many chunks from a small file
    pieces = _pieces(1)
    target = tmp_path / "shard.safetensors"
    direct_opened = []
    real_open = DirectSink.open

    def recording_open(path, buffered_fd):
        sink = real_open(path, buffered_fd)
        direct_opened.append(sink is not None)
        return sink

    monkeypatch.setattr(DirectSink, "open", staticmethod(recording_open))
    with atomic_write(target, expected_size=atomic.DIRECT_MIN_BYTES) as out:
        for piece in pieces:
            (out.write_owned if owned else out.write)(memoryview(piece))
    expected = b"".join(pieces)
    assert direct_opened == [True] or direct_opened == [False]  # False: this file system refuses O_DIRECT
    assert target.read_bytes() == expected
    assert out.size == len(expected)
    assert out.sha256.hexdigest() == hashlib.sha256(expected).hexdigest()
    assert not list(tmp_path.glob("*.hyperqwen-tmp"))


def test_a_failed_large_write_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(DirectSink, "CHUNK", 8192)
    target = tmp_path / "shard.safetensors"
    with pytest.raises(RuntimeError, match="stop"):
        with atomic_write(target, expected_size=atomic.DIRECT_MIN_BYTES) as out:
            for piece in _pieces(2)[:10]:
                out.write_owned(memoryview(piece))
            raise RuntimeError("stop")
    assert not target.exists() and not list(tmp_path.iterdir())


def test_small_files_and_buffered_writes_are_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic.HashingWriter, "WRITEBACK_BYTES", 10_000)  # start writeback many times
    pieces = _pieces(3)
    target = tmp_path / "small.json"
    with atomic_write(target) as out:
        for piece in pieces:
            out.write(piece)
    assert target.read_bytes() == b"".join(pieces)
    assert out.sha256.hexdigest() == hashlib.sha256(b"".join(pieces)).hexdigest()


def test_start_writeback_accepts_a_real_file_and_reports_a_bad_descriptor(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10_000)
    fd = os.open(path, os.O_RDWR)
    try:
        assert atomic.start_writeback(fd, 0, 10_000)
    finally:
        os.close(fd)
    assert not atomic.start_writeback(fd, 0, 10_000)  # closed: EBADF, reported as False, never raised
