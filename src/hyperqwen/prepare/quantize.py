"""int8 symmetric group-128 weight quantization in compressed-tensors `pack-quantized` layout.

Layout (what vLLM 0.32.0's CompressedTensorsWNA16 and compressed_tensors 0.17.0's
PackedQuantizationCompressor read): for a weight W [out, in],
  weight_packed int32 [out, in*8/32]: q + 128 as uint8, four per int32, lowest bits first, along `in`;
  weight_scale  [out, in/group] in the weight's float dtype; W ~= q * scale per group;
  weight_shape  int64 [2] = [out, in].
Rows are processed in blocks, so the working set is bounded by the block size, not the tensor size.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import BinaryIO, Callable

import numpy as np

from hyperqwen.prepare.errors import CheckpointError
from hyperqwen.prepare.safetensors_io import (
    FLOAT_DTYPES,
    STORAGE_DTYPES,
    OutTensor,
    TensorInfo,
    f32_to_bf16_bits,
    from_float_bits,
    read_rows_f32,
    to_float_bits,
)

NUM_BITS = 8
GROUP_SIZE = 128
QMAX = 127  # symmetric: q in [-127, 127]; -128 unused so +/- ranges match
PACK_FACTOR = 32 // NUM_BITS


def weight_scheme() -> dict:
    """The compressed-tensors QuantizationArgs for the weights we write."""
    return {"num_bits": NUM_BITS, "type": "int", "symmetric": True, "strategy": "group",
            "group_size": GROUP_SIZE, "dynamic": False, "actorder": None, "observer": "minmax",
            "observer_kwargs": {}, "block_structure": None}


def module_of(weight_name: str) -> str:
    if not weight_name.endswith(".weight"):
        raise ValueError(weight_name)
    return weight_name[: -len(".weight")]


def quantized_outputs(info: TensorInfo) -> list[OutTensor]:
    """The three tensors that replace `<module>.weight`."""
    check_quantizable(info)
    rows, cols = info.shape
    module = module_of(info.name)
    return [
        OutTensor(f"{module}.weight_packed", "I32", (rows, cols // PACK_FACTOR)),
        OutTensor(f"{module}.weight_scale", info.dtype, (rows, cols // GROUP_SIZE)),
        OutTensor(f"{module}.weight_shape", "I64", (2,)),
    ]


def check_quantizable(info: TensorInfo) -> None:
    if info.dtype not in FLOAT_DTYPES or len(info.shape) != 2:
        raise CheckpointError(
            f"{info.name}: expected a 2-D float weight to quantize, found {info.dtype}{list(info.shape)}",
            fix="this checkpoint does not have the expected layout; use the default MODEL_REPO")
    if info.shape[1] % GROUP_SIZE:
        raise CheckpointError(
            f"{info.name}: input dimension {info.shape[1]} is not a multiple of the group size {GROUP_SIZE}")


def rows_per_block(cols: int, block_bytes: int) -> int:
    # ~6 float32-sized temporaries per element are live at once (w, |w|, q, dequant, diff, ...).
    return max(1, block_bytes // (cols * 4 * 6))


def group_scales(weight_groups: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    return scales_from_amax(np.abs(weight_groups).max(axis=2), dtype)


def scales_from_amax(amax: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-group scales, rounded to the stored dtype *upwards*, so amax/scale <= 127 never clips.

    Returns (stored values in the tensor's dtype, the same values as float32)."""
    ideal = amax / np.float32(QMAX)
    if dtype == "BF16":
        bits = f32_to_bf16_bits(ideal)
        rounded = from_float_bits(bits, "BF16")
        bits = bits + (rounded < ideal).astype(np.uint16)  # next bf16 up (positive values)
        stored = bits
    else:
        stored = to_float_bits(ideal, dtype)
        rounded = from_float_bits(stored, dtype)
        low = rounded < ideal
        if low.any():
            stored = stored.copy()
            stored[low] = np.nextafter(stored[low], np.inf)
    scale = from_float_bits(stored, dtype)
    # An all-zero group: any scale dequantizes to 0; use 1 (not 0) so no kernel ever divides by it.
    zero = scale == 0
    if zero.any():
        one = to_float_bits(np.ones(1, np.float32), dtype)[0]
        stored = stored.copy()
        stored[zero] = one
        scale = from_float_bits(stored, dtype)
    return stored, scale


@dataclasses.dataclass
class QuantStats:
    name: str
    shape: tuple[int, ...]
    err_sq: float = 0.0
    ref_sq: float = 0.0

    @property
    def rel_error(self) -> float:
        if self.ref_sq == 0:
            return 0.0 if self.err_sq == 0 else math.inf
        return math.sqrt(self.err_sq / self.ref_sq)


def _numba_kernels():
    """Fused one-pass kernels (numba ships with vLLM). None when numba is unavailable: numpy does the same
    arithmetic (identical bytes; the reported error may differ in the last digits from summation order)."""
    if os.environ.get("HYPERQWEN_PREPARE_NUMPY") == "1":
        return None
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(cache=True, nogil=True)
    def group_amax(wg):  # pragma: no cover - compiled
        rows, groups, size = wg.shape
        out = np.empty((rows, groups), np.float32)
        for i in range(rows):
            for g in range(groups):
                m = np.float32(0)
                for k in range(size):
                    v = abs(wg[i, g, k])
                    if v > m:
                        m = v
                out[i, g] = m
        return out

    @numba.njit(cache=True, nogil=True)
    def quantize_rows(wg, inv_scale, scale, out_u8, err_rows, ref_rows):  # pragma: no cover - compiled
        rows, groups, size = wg.shape
        for i in range(rows):
            e = 0.0
            r = 0.0
            for g in range(groups):
                s = scale[i, g]
                inv = inv_scale[i, g]
                eg = np.float32(0)
                rg = np.float32(0)
                for k in range(size):
                    x = wg[i, g, k]
                    q = np.rint(x * inv)  # |x * inv| <= 127 (+ rounding): the scale was rounded up
                    d = x - q * s
                    eg += d * d
                    rg += x * x
                    out_u8[i, g * size + k] = np.uint8(np.int32(q) + 128)
                e += eg
                r += rg
            err_rows[i] = e
            ref_rows[i] = r

    return group_amax, quantize_rows


_KERNELS: list = []
WORKERS = max(1, min(4, len(os.sched_getaffinity(0))))
_POOL: list = []


def _pool():
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(WORKERS, thread_name_prefix="hyperqwen-quantize"))
    return _POOL[0]


def kernels():
    if not _KERNELS:
        _KERNELS.append(_numba_kernels())
    return _KERNELS[0]


# Below this many elements numpy is quicker than compiling (or loading) the fused kernels.
FUSED_MIN_ELEMENTS = 16 << 20


def quantize_block(w: np.ndarray, dtype: str, use_fused: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """float32 rows -> (packed int32 rows, stored scales, error^2, reference^2)."""
    rows, cols = w.shape
    wg = w.reshape(rows, cols // GROUP_SIZE, GROUP_SIZE)
    fused = kernels() if use_fused else None
    if fused is not None:
        group_amax, quantize_rows = fused
        stored = np.empty((rows, cols // GROUP_SIZE), STORAGE_DTYPES[dtype])
        out = np.empty((rows, cols), np.uint8)
        err_rows = np.empty(rows, np.float64)
        ref_rows = np.empty(rows, np.float64)

        def run(begin: int, end: int) -> None:  # the kernels release the GIL: row slices run in parallel
            part = wg[begin:end]
            stored_part, scale = scales_from_amax(group_amax(part), dtype)
            stored[begin:end] = stored_part
            quantize_rows(part, np.float32(1) / scale, scale, out[begin:end], err_rows[begin:end],
                          ref_rows[begin:end])

        workers = _pool()
        step = -(-rows // WORKERS)
        list(workers.map(lambda b: run(b, min(rows, b + step)), range(0, rows, step)))
        return out.view("<i4"), stored, float(err_rows.sum()), float(ref_rows.sum())
    stored, scale = group_scales(wg, dtype)
    q = wg * (np.float32(1) / scale)[:, :, None]
    np.rint(q, out=q)
    q8 = q.astype(np.int8)
    # Error of exactly what a reader will reconstruct: q * stored scale.
    np.multiply(q, scale[:, :, None], out=q)
    np.subtract(wg, q, out=q)
    err_sq = float(np.einsum("ijk,ijk->", q, q, dtype=np.float64))
    ref_sq = float(np.einsum("ijk,ijk->", wg, wg, dtype=np.float64))
    # q + 128 as uint8 == flipping the sign bit; 4 little-endian bytes per int32 == pack_to_int32.
    packed = (q8.view(np.uint8) ^ np.uint8(0x80)).reshape(rows, cols).view("<i4")
    return packed, stored, err_sq, ref_sq


def quantize_tensor(handle: BinaryIO, info: TensorInfo, write: Callable[[memoryview], None],
                    block_bytes: int, on_block: Callable[[int], None] | None = None) -> QuantStats:
    """Stream `<module>.weight_packed`, then `weight_scale`, then `weight_shape` through `write`.

    Only the scales ([out, in/128], 1/64 of the weight in bf16) stay in memory for the whole tensor.
    """
    check_quantizable(info)
    rows, cols = info.shape
    step = rows_per_block(cols, block_bytes)
    stats = QuantStats(info.name, info.shape)
    scale_parts: list[np.ndarray] = []
    # One raw read buffer for all blocks (the float32 conversion copies out of it).
    buffer = np.empty(min(step, rows) * cols, dtype=STORAGE_DTYPES[info.dtype])
    for begin in range(0, rows, step):
        end = min(rows, begin + step)
        w = read_rows_f32(handle, info, begin, end, buffer)
        packed, stored, err_sq, ref_sq = quantize_block(w, info.dtype, info.numel >= FUSED_MIN_ELEMENTS)
        stats.err_sq += err_sq
        stats.ref_sq += ref_sq
        write(memoryview(np.ascontiguousarray(packed)).cast("B"))
        scale_parts.append(stored)
        if on_block is not None:
            on_block((end - begin) * cols * (info.nbytes // info.numel))
    scales = np.concatenate(scale_parts, axis=0)
    write(memoryview(np.ascontiguousarray(scales)).cast("B"))
    write(memoryview(np.array([rows, cols], dtype="<i8")).cast("B"))
    return stats


def dequantize(packed: np.ndarray, scale: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Our own inverse (the tests also use compressed-tensors' decompressor)."""
    rows, cols = shape
    q = (packed.view(np.uint8) ^ np.uint8(0x80)).view(np.int8).reshape(rows, cols).astype(np.float32)
    return (q.reshape(rows, cols // GROUP_SIZE, GROUP_SIZE) * scale[:, :, None]).reshape(rows, cols)
