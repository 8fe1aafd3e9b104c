"""Streaming safetensors I/O: read a tensor's rows in blocks and write a shard tensor by tensor.

The safetensors library reads a tensor whole and `save_file` needs every tensor in memory; a 2.5 GB
lm_head would then cost 2.5 GB+ of RAM. The format is simple (8-byte little-endian header length,
a JSON header of dtype/shape/data_offsets, then raw little-endian data), so we read and write it
directly with bounded buffers. Verification re-opens every output with `safetensors.safe_open`.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from hyperqwen.prepare.errors import CheckpointError

DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
FLOAT_DTYPES = ("BF16", "F16", "F32")
MAX_HEADER_BYTES = 100 << 20


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offset of the first byte
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclasses.dataclass(frozen=True)
class ShardHeader:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    file_size: int


def read_header(path: Path) -> ShardHeader:
    """Parse and sanity-check a shard's header (offsets inside the file, sizes match dtype x shape)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            raw_len = handle.read(8)
            if len(raw_len) != 8:
                raise CheckpointError(f"{path}: too short to be a safetensors file ({size} bytes)",
                                      fix="delete it and run prepare again to fetch it")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise CheckpointError(f"{path}: header length {header_len} does not fit the file ({size} bytes)",
                                      fix="the file is truncated or not safetensors; delete it and run prepare again")
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read safetensors header ({exc})",
                              fix="delete the file and run prepare again") from None
    data_start = 8 + header_len
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        dtype = entry.get("dtype")
        shape = tuple(int(d) for d in entry.get("shape", ()))
        begin, end = entry.get("data_offsets", (0, -1))
        if dtype not in DTYPE_SIZES:
            raise CheckpointError(f"{path}: tensor {name} has unknown dtype {dtype!r}")
        expected = DTYPE_SIZES[dtype]
        for d in shape:
            expected *= d
        if end - begin != expected or begin < 0 or data_start + end > size:
            raise CheckpointError(
                f"{path}: tensor {name} ({dtype}{list(shape)}) has data_offsets {begin}..{end}, "
                f"expected {expected} bytes inside a {size}-byte file",
                fix="the shard is truncated or corrupt; delete it and run prepare again")
        tensors[name] = TensorInfo(name, dtype, shape, data_start + begin, expected)
    return ShardHeader(path, tensors, metadata, size)


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


def read_rows_f32(handle: BinaryIO, info: TensorInfo, row_begin: int, row_end: int,
                  buffer: np.ndarray | None = None) -> np.ndarray:
    """Rows [row_begin, row_end) of a 2-D float tensor as float32, reading only those bytes."""
    cols = info.shape[1]
    storage = np.dtype(STORAGE_DTYPES[info.dtype])
    count = (row_end - row_begin) * cols
    if buffer is None or buffer.size < count or buffer.dtype != storage:
        buffer = np.empty(count, dtype=storage)
    target = buffer[:count]
    handle.seek(info.begin + row_begin * cols * storage.itemsize)
    got = handle.readinto(memoryview(target).cast("B"))
    if got != count * storage.itemsize:
        raise CheckpointError(f"{info.name}: short read ({got} of {count * storage.itemsize} bytes)",
                              fix="the source shard is truncated; delete it and run prepare again")
    return from_float_bits(target, info.dtype).reshape(row_end - row_begin, cols)


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
