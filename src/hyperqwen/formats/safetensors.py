"""Reading safetensors headers: the one parser every command uses (prepare, the memory planner, verify).

The format (https://github.com/huggingface/safetensors#format): an 8-byte little-endian header length N,
N bytes of JSON mapping tensor names to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative
to the first byte after the header) plus an optional `"__metadata__"` string map, then the raw data. Only
the header is read here, so a 15 GB checkpoint is described in milliseconds; the safetensors library itself
reads tensors whole, which is why prepare streams the data with its own code (prepare/safetensors_io.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

# Bytes per element of every dtype code the format defines.
DTYPE_SIZES: Mapping[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
FLOAT_DTYPES = ("BF16", "F16", "F32")
# Real headers of a 27B checkpoint are 1-3 MB; a larger length means the file is not safetensors (or is
# corrupt), and allocating it would be the first thing to go wrong.
MAX_HEADER_BYTES = 100 << 20


class SafetensorsError(ValueError):
    """A file is not a readable safetensors file. The message starts with the file's path."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a header. `begin` is the absolute file offset of its first data byte."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES[self.dtype]

    @property
    def stored_bytes(self) -> int:
        """Bytes the tensor takes in the file (the memory planner's name for nbytes)."""
        return self.nbytes


@dataclasses.dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    tensors: dict[str, TensorInfo]  # in file order
    metadata: dict[str, str]
    file_size: int
    data_start: int  # 8 + header length


def read_header(path: Path | str, *, check_data: bool = True) -> SafetensorsHeader:
    """Parse one file's header; raises SafetensorsError naming the file and what is wrong.

    check_data: every tensor's bytes must lie inside the file and match dtype x shape (a truncated or
    corrupt shard fails here). The planner passes False: its test fixtures hold headers without data.
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            raw_len = handle.read(8)
            if len(raw_len) != 8:
                raise SafetensorsError(
                    path,
                    f"shorter than the 8-byte safetensors header length ({size} bytes): "
                    "truncated, or not a safetensors file",
                )
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > MAX_HEADER_BYTES:
                raise SafetensorsError(
                    path,
                    f"header length {header_len} B is not plausible (limit "
                    f"{MAX_HEADER_BYTES} B); is this a safetensors file?",
                )
            raw = handle.read(header_len)
    except OSError as exc:
        raise SafetensorsError(path, f"cannot read the safetensors header ({exc.strerror or exc})") from None
    if len(raw) != header_len:
        raise SafetensorsError(
            path, f"truncated: the header says {header_len} B but the file ends after {len(raw)} B of it"
        )
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise SafetensorsError(path, f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(path, f"header is a JSON {type(header).__name__}, not an object")
    data_start = 8 + header_len
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsError(path, "__metadata__ is not a string map")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise SafetensorsError(path, f"tensor {name!r}: entry is not an object")
        dtype = str(entry.get("dtype"))
        if dtype not in DTYPE_SIZES:
            raise SafetensorsError(
                path, f"tensor {name!r} has unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_SIZES))}"
            )
        try:
            shape = tuple(int(d) for d in entry.get("shape", ()))
            begin, end = (int(x) for x in entry.get("data_offsets", (0, 0)))
        except (TypeError, ValueError):
            raise SafetensorsError(path, f"tensor {name!r}: shape or data_offsets are not integers") from None
        info = TensorInfo(name, dtype, shape, data_start + begin)
        if check_data and (end - begin != info.nbytes or begin < 0 or data_start + end > size):
            raise SafetensorsError(
                path,
                f"truncated or corrupt: tensor {name} ({dtype}{list(shape)}) has data_offsets {begin}..{end}, "
                f"expected {info.nbytes} bytes inside a {size}-byte file",
            )
        tensors[name] = info
    return SafetensorsHeader(path, tensors, {str(k): str(v) for k, v in metadata.items()}, size, data_start)


def data_end(header: SafetensorsHeader) -> int:
    """The file size the header needs: its last tensor's last byte."""
    return max((t.begin + t.nbytes for t in header.tensors.values()), default=header.data_start)
