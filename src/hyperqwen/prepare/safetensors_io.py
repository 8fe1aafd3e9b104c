"""Streaming safetensors I/O: read a tensor's rows in blocks and write a shard tensor by tensor.

The safetensors library reads a tensor whole and `save_file` needs every tensor in memory; a 2.5 GB
lm_head would then cost 2.5 GB+ of RAM. The format is simple (8-byte little-endian header length,
a JSON header of dtype/shape/data_offsets, then raw little-endian data), so the data is read and written
here with bounded buffers; headers are parsed by the one reader in `hyperqwen.formats.safetensors`.
Verification re-opens every output with `safetensors.safe_open`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from hyperqwen.formats.safetensors import (
    DTYPE_SIZES,
    FLOAT_DTYPES,
    SafetensorsError,
    SafetensorsHeader,
    TensorInfo,
    read_header,
)
from hyperqwen.prepare.errors import PrepareCheckpointError

__all__ = [
    "DTYPE_SIZES",
    "FLOAT_DTYPES",
    "OutTensor",
    "SafetensorsHeader",
    "TensorInfo",
    "build_header",
    "read_shard_header",
    "read_rows_f32",
]


def read_shard_header(path: Path, fix: str) -> SafetensorsHeader:
    """The one header parser (formats/safetensors.py) with prepare's error type; `fix` says what to do about a
    damaged file where it lies (a local source, a download, prepare's own output)."""
    try:
        return read_header(path)
    except SafetensorsError as exc:
        raise PrepareCheckpointError(str(exc), fix=fix) from None


def bf16_to_f32(raw_u16: np.ndarray) -> np.ndarray:
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (uint16). Inputs here are finite."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def to_float_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> the storage array of `dtype` (BF16 as uint16 bits)."""
    if dtype == "BF16":
        return f32_to_bf16_bits(values)
    if dtype == "F16":
        return values.astype("<f2")
    return values.astype("<f4")


def from_float_bits(stored: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return bf16_to_f32(stored)
    return stored.astype(np.float32)


STORAGE_DTYPES = {"BF16": "<u2", "F16": "<f2", "F32": "<f4"}


def read_rows_raw(
    handle: BinaryIO, info: TensorInfo, row_begin: int, row_end: int, buffer: np.ndarray | None = None
) -> np.ndarray:
    """Rows [row_begin, row_end) of a 2-D float tensor as stored (BF16 as uint16 bits), reading only those bytes."""
    cols = info.shape[1]
    storage = np.dtype(STORAGE_DTYPES[info.dtype])
    count = (row_end - row_begin) * cols
    if buffer is None or buffer.size < count or buffer.dtype != storage:
        buffer = np.empty(count, dtype=storage)
    target = buffer[:count]
    handle.seek(info.begin + row_begin * cols * storage.itemsize)
    got = handle.readinto(memoryview(target).cast("B"))  # type: ignore[attr-defined,arg-type]
    if got != count * storage.itemsize:
        raise PrepareCheckpointError(
            f"{info.name}: short read ({got} of {count * storage.itemsize} bytes)",
            fix="the source shard is truncated; run prepare again (a download is checked "
            "and fetched again) or replace the file in MODEL_SOURCE_DIR",
        )
    return target.reshape(row_end - row_begin, cols)


class MappedTensor:
    """A 2-D float tensor of a shard file seen through a read-only memory map, as stored (BF16 as uint16 bits).

    Quantizing straight from the page cache skips read()'s copy of every source byte into a buffer: the 2.37 GiB
    lm_head's read() took 0.56 s of a 4.5 s one-core prepare (cProfile, prepare benchmark). Mapped pages count
    as the process's resident memory, so `release` drops the rows already quantized from the map (the page cache
    keeps them). `close` unmaps once no row view is left (a view still held, e.g. by an exception's frame, keeps
    the map until it is collected)."""

    def __init__(self, handle: BinaryIO, info: TensorInfo) -> None:
        import mmap

        storage = np.dtype(STORAGE_DTYPES[info.dtype])
        fd = handle.fileno()
        # A file shorter than its header says would fault (SIGBUS) on the missing pages: refuse it here, by name.
        size, end = os.fstat(fd).st_size, info.begin + info.nbytes
        if size < end:
            raise PrepareCheckpointError(
                f"{info.name}: short file (it ends at byte {size}, the tensor at byte {end})",
                fix="the source shard is truncated; run prepare again (a download is checked "
                "and fetched again) or replace the file in MODEL_SOURCE_DIR",
            )
        self._map: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        with contextlib.suppress(OSError, AttributeError):
            self._map.madvise(mmap.MADV_SEQUENTIAL)
        self.rows = np.frombuffer(self._map, storage, info.numel, info.begin).reshape(info.shape)
        self._row_bytes = info.shape[1] * storage.itemsize
        self._begin = info.begin
        self._released = info.begin - info.begin % mmap.PAGESIZE

    def release(self, row_end: int) -> None:
        """Drop the mapping of the whole pages before row `row_end` (read-only file pages: nothing is lost)."""
        import mmap

        upto = self._begin + row_end * self._row_bytes
        upto -= upto % mmap.PAGESIZE
        if self._map is not None and upto > self._released:
            with contextlib.suppress(OSError, AttributeError, ValueError):
                self._map.madvise(mmap.MADV_DONTNEED, self._released, upto - self._released)
            self._released = upto

    def close(self) -> None:
        del self.rows
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a row view is still alive: the map goes with it
                self._map.close()
            self._map = None


def map_tensor(handle: BinaryIO, info: TensorInfo) -> MappedTensor | None:
    """The tensor through a memory map, or None where the handle is no mappable file (BytesIO, odd filesystems)."""
    try:
        handle.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    try:
        return MappedTensor(handle, info)
    except (OSError, ValueError):
        return None


def read_rows_f32(
    handle: BinaryIO, info: TensorInfo, row_begin: int, row_end: int, buffer: np.ndarray | None = None
) -> np.ndarray:
    """Rows [row_begin, row_end) of a 2-D float tensor as float32, reading only those bytes."""
    raw = read_rows_raw(handle, info, row_begin, row_end, buffer)
    return from_float_bits(raw.reshape(-1), info.dtype).reshape(raw.shape)


@dataclasses.dataclass(frozen=True)
class OutTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = DTYPE_SIZES[self.dtype]
        for d in self.shape:
            n *= d
        return n


def build_header(tensors: Iterable[OutTensor], metadata: dict[str, str] | None = None) -> bytes:
    """The header bytes (length prefix included) for tensors laid out back to back in the given order."""
    entries: dict[str, object] = {}
    if metadata:
        entries["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for t in tensors:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    body = json.dumps(entries, separators=(",", ":")).encode()
    # Pad with spaces to 8-byte alignment, as the reference serializer does, so data is aligned.
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def shard_size(tensors: Iterable[OutTensor], metadata: dict[str, str] | None = None) -> int:
    tensors = list(tensors)
    return len(build_header(tensors, metadata)) + sum(t.nbytes for t in tensors)
