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
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from hyperqwen.prepare.errors import PrepareCheckpointError, QuantizationError
from hyperqwen.prepare.safetensors_io import (
    FLOAT_DTYPES,
    STORAGE_DTYPES,
    MappedTensor,
    OutTensor,
    TensorInfo,
    f32_to_bf16_bits,
    from_float_bits,
    map_tensor,
    read_rows_f32,
    read_rows_raw,
    to_float_bits,
)

NUM_BITS = 8
GROUP_SIZE = 128
QMAX = 127  # symmetric: q in [-127, 127]; -128 unused so +/- ranges match
PACK_FACTOR = 32 // NUM_BITS


def weight_scheme() -> dict:
    """The compressed-tensors QuantizationArgs for the weights we write."""
    return {
        "num_bits": NUM_BITS,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": GROUP_SIZE,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
        "observer_kwargs": {},
        "block_structure": None,
    }


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
        raise PrepareCheckpointError(
            f"{info.name}: expected a 2-D float weight to quantize, found {info.dtype}{list(info.shape)}",
            fix="this checkpoint does not have the expected layout; use the default MODEL_REPO",
        )
    if info.shape[1] % GROUP_SIZE:
        raise PrepareCheckpointError(
            f"{info.name}: input dimension {info.shape[1]} is not a multiple of the group size {GROUP_SIZE}"
        )


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
    # The worst 128-group: relative error of its weights other than the largest one, and where it is.
    worst_group_error: float = 0.0
    worst_group_row: int = -1
    worst_group_index: int = -1

    @property
    def rel_error(self) -> float:
        if self.ref_sq == 0:
            return 0.0 if self.err_sq == 0 else math.inf
        return math.sqrt(self.err_sq / self.ref_sq)


def _prefer_512_bit_vectors() -> None:
    """On AVX-512 hosts let LLVM use 512-bit vectors in our kernels: its default tuning for Intel server chips
    prefers 256 bits. The bf16 kernel ran 0.67 -> 0.56 ns per element (one core, 546 x 5,120 block, identical
    bytes). Numba fixes its target machine's features when its CPU target is first built, from
    NUMBA_CPU_FEATURES: set only for that moment (child processes do not inherit it). A user's own setting, or
    numba already in use in this process, stays as it is."""
    import platform
    import sys

    if "NUMBA_CPU_FEATURES" in os.environ or "numba" in sys.modules or platform.machine() not in ("x86_64", "AMD64"):
        return
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        features = llvm.get_host_cpu_features().flatten()
    except (ImportError, RuntimeError, OSError):
        return
    if "+avx512f" not in features.split(","):
        return
    os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
    try:
        from numba.core.registry import cpu_target

        cpu_target.target_context.codegen()  # builds the target machine with these features
    except ImportError:
        pass
    finally:
        del os.environ["NUMBA_CPU_FEATURES"]


def _numba_kernels():
    """Fused one-pass kernels (numba ships with vLLM). None when numba is unavailable: numpy does the same
    arithmetic (identical bytes; the reported error may differ in the last digits from summation order)."""
    if os.environ.get("HYPERQWEN_PREPARE_NUMPY") == "1":
        return None
    _prefer_512_bit_vectors()
    try:
        import numba
    except ImportError:
        return None

    return _group_amax_kernel(numba), _quantize_rows_kernel(numba), _quantize_bf16_rows_kernel(numba)


def _group_amax_kernel(numba: Any) -> Any:
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

    return group_amax


def _quantize_rows_kernel(numba: Any) -> Any:
    @numba.njit(cache=True, nogil=True)
    def quantize_rows(
        wg, inv_scale, scale, amax, out_u8, err_rows, ref_rows, rest_err, rest_ref
    ):  # pragma: no cover - compiled
        rows, groups, size = wg.shape
        for i in range(rows):
            e = np.float64(0.0)
            r = np.float64(0.0)
            for g in range(groups):
                s = scale[i, g]
                inv = inv_scale[i, g]
                m = amax[i, g]
                eg = np.float32(0)
                rg = np.float32(0)
                reg = np.float32(0)
                rrg = np.float32(0)
                skipped = False
                for k in range(size):
                    x = wg[i, g, k]
                    q = np.rint(x * inv)  # |x * inv| <= 127 (+ rounding): the scale was rounded up
                    d = x - q * s
                    dd = d * d
                    xx = x * x
                    eg += dd
                    rg += xx
                    if not skipped and abs(x) == m:
                        skipped = True  # the group's largest weight: exact to half a step by construction
                    else:
                        reg += dd
                        rrg += xx
                    out_u8[i, g * size + k] = np.uint8(np.int32(q) + 128) if q == q else np.uint8(128)
                rest_err[i, g] = reg
                rest_ref[i, g] = rrg
                e += eg
                r += rg
            err_rows[i] = e
            ref_rows[i] = r

    return quantize_rows


def _quantize_bf16_rows_kernel(numba: Any) -> Any:
    # One pass per 128-group for bfloat16 input, straight from the file's bytes: widen to float32, find the
    # group's largest magnitude, round its scale up to the next bfloat16 (the same bits as scales_from_amax),
    # quantize, and sum the errors, all while the row sits in L1. Reassociation lets LLVM vectorize the sums
    # (they only feed the error check); the quantized bytes do not depend on it (no reciprocal or FMA flags).
    # Ties with the largest magnitude are counted in the float loop (a separate integer loop ran in 64-bit lanes:
    # numba widens integer arithmetic to int64), and the group's full sums are its rest plus the ties: 0.73 -> 0.56
    # ns per element (one core, best process time of 15, a 546 x 5,120 block).
    @numba.njit(cache=True, nogil=True, fastmath={"reassoc", "nsz"})
    def quantize_bf16_rows(raw, stored, out_u8, err_rows, ref_rows, rest_err, rest_ref):  # pragma: no cover
        rows, cols = raw.shape
        groups = cols // 128
        bits = np.empty(cols, np.uint32)  # one row widened to float32 (20 KiB for 5,120 columns: stays in L1)
        f = bits.view(np.float32)
        mbits = np.empty(groups, np.uint32)
        mf = mbits.view(np.float32)
        ideal = np.empty(groups, np.float32)
        ideal_bits = ideal.view(np.uint32)
        sbits = np.empty(groups, np.uint32)
        sf = sbits.view(np.float32)
        inv = np.empty(groups, np.float32)
        for i in range(rows):
            for g in range(groups):
                base = g * 128
                # |x| of a bfloat16 is its bits without the sign; their integer order is the float order (NaN
                # sorts above Inf, so a NaN makes the maximum NaN and the row's sums non-finite: reported by name).
                m16 = np.uint16(0)
                for k in range(128):
                    v = raw[i, base + k]
                    bits[base + k] = np.uint32(v) << np.uint32(16)
                    m16 = max(m16, v & np.uint16(0x7FFF))
                mbits[g] = np.uint32(m16) << np.uint32(16)
            # The row's scales in separate loops over its groups, not one dependent chain (max, divide, round,
            # divide) in front of each group's quantization: 0.70 -> 0.59 ns per element (same block as above).
            for g in range(groups):
                ideal[g] = mf[g] / np.float32(127)
            for g in range(groups):
                b = ideal_bits[g]
                b16 = (b + ((b >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)) >> np.uint32(16)
                sbits[g] = b16 << np.uint32(16)  # round to nearest even bfloat16, as f32_to_bf16_bits
            for g in range(groups):
                b16 = sbits[g] >> np.uint32(16)
                if sf[g] < ideal[g]:
                    b16 += np.uint32(1)  # the next bfloat16 up, so amax / scale <= 127 never clips
                    sbits[g] = b16 << np.uint32(16)
                if sf[g] == 0:
                    b16 = np.uint32(0x3F80)  # bfloat16 1.0: an all-zero group dequantizes to 0 with any scale
                    sbits[g] = b16 << np.uint32(16)
                stored[i, g] = np.uint16(b16)
            for g in range(groups):
                inv[g] = np.float32(1) / sf[g]
            e = np.float64(0.0)
            r = np.float64(0.0)
            for g in range(groups):
                base = g * 128
                s = sf[g]
                iv = inv[g]
                m = mf[g]
                reg = np.float32(0)
                rrg = np.float32(0)
                kept = np.float32(0)
                for k in range(128):
                    x = f[base + k]
                    q = np.rint(x * iv)
                    d = x - q * s
                    keep = np.float32(abs(x) != m)
                    # Inf times the 0 of an excluded Inf is NaN: a non-finite weight always makes the row non-finite.
                    reg += d * d * keep
                    rrg += x * x * keep
                    kept += keep
                    out_u8[i, base + k] = np.uint8(np.int32(q) + 128)
                # The weights equal to the largest magnitude all have its error: the group's sums add them back
                # (exact small integer counts), the rest sums all of them but exactly one.
                ties = np.float32(128) - kept
                qm = np.rint(m * iv)
                dm = m - qm * s
                eg = reg + ties * (dm * dm)
                rg = rrg + ties * (m * m)
                if ties > 1:
                    reg += (ties - np.float32(1)) * (dm * dm)
                    rrg += (ties - np.float32(1)) * (m * m)
                rest_err[i, g] = reg
                rest_ref[i, g] = rrg
                e += eg
                r += rg
            err_rows[i] = e
            ref_rows[i] = r

    return quantize_bf16_rows


_KERNELS: list = []
# Threads for the quantization kernel: one core is left to the thread that hashes the output as it is written
# (atomic.HashingWriter). On two cores, two kernel threads beside the hash thread took 2.90-3.06 s for the
# benchmark's lm_head, one 2.50-2.67 s (alternated, `taskset -c 0,1`, load average 2.5).
WORKERS = max(1, min(4, len(os.sched_getaffinity(0)) - 1))
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


@dataclasses.dataclass
class BlockResult:
    packed: np.ndarray  # int32 [rows, cols / 4]
    stored: np.ndarray  # scales in the stored dtype [rows, groups]
    err_sq: float
    ref_sq: float
    rest_err: np.ndarray  # float32 [rows, groups]: squared error of each group's weights but its largest
    rest_ref: np.ndarray  # float32 [rows, groups]: their squared norm
    row_ref: np.ndarray  # float64 [rows]: squared norm of each row (non-finite when the row holds NaN/Inf)


def quantize_block(w: np.ndarray, dtype: str, use_fused: bool = False) -> tuple[np.ndarray, np.ndarray, float, float]:
    """float32 rows -> (packed int32 rows, stored scales, error^2, reference^2)."""
    block = quantize_block_stats(w, dtype, use_fused)
    return block.packed, block.stored, block.err_sq, block.ref_sq


def quantize_block_stats(w: np.ndarray, dtype: str, use_fused: bool = False) -> BlockResult:
    """Quantize float32 rows and measure the error per tensor, per row and per 128-group."""
    rows, cols = w.shape
    groups = cols // GROUP_SIZE
    wg = w.reshape(rows, groups, GROUP_SIZE)
    fused = kernels() if use_fused else None
    rest_err = np.empty((rows, groups), np.float32)
    rest_ref = np.empty((rows, groups), np.float32)
    if fused is not None:
        group_amax, quantize_rows, _ = fused
        stored = np.empty((rows, groups), STORAGE_DTYPES[dtype])
        out = np.empty((rows, cols), np.uint8)
        err_rows = np.empty(rows, np.float64)
        ref_rows = np.empty(rows, np.float64)

        def run(begin: int, end: int) -> None:  # the kernels release the GIL: row slices run in parallel
            part = wg[begin:end]
            amax = group_amax(part)
            stored_part, scale = scales_from_amax(amax, dtype)
            stored[begin:end] = stored_part
            quantize_rows(
                part,
                np.float32(1) / scale,
                scale,
                amax,
                out[begin:end],
                err_rows[begin:end],
                ref_rows[begin:end],
                rest_err[begin:end],
                rest_ref[begin:end],
            )

        workers = _pool()
        step = -(-rows // WORKERS)
        with np.errstate(all="ignore"):  # NaN/Inf rows are reported by the caller, by name
            list(workers.map(lambda b: run(b, min(rows, b + step)), range(0, rows, step)))
        return BlockResult(
            out.view("<i4"), stored, float(err_rows.sum()), float(ref_rows.sum()), rest_err, rest_ref, ref_rows
        )
    with np.errstate(all="ignore"):
        absw = np.abs(wg)
        amax = absw.max(axis=2)
        top = absw.argmax(axis=2)[:, :, None]
        stored, scale = scales_from_amax(amax, dtype)
        q = wg * (np.float32(1) / scale)[:, :, None]
        np.rint(q, out=q)
        q8 = q.astype(np.int8)  # NaN rows are refused by the caller
        # Error of exactly what a reader will reconstruct: q * stored scale.
        np.multiply(q, scale[:, :, None], out=q)
        np.subtract(wg, q, out=q)
        err_groups = np.einsum("ijk,ijk->ij", q, q)
        row_ref = np.einsum("ij,ij->i", w, w, dtype=np.float64)
        # The same sums without each group's largest weight (its error is at most half a step by construction).
        np.put_along_axis(q, top, 0, axis=2)
        np.einsum("ijk,ijk->ij", q, q, out=rest_err)
        np.put_along_axis(absw, top, 0, axis=2)
        np.einsum("ijk,ijk->ij", absw, absw, out=rest_ref)
    err_sq = float(err_groups.sum(dtype=np.float64))
    ref_sq = float(row_ref.sum())
    # q + 128 as uint8 == flipping the sign bit; 4 little-endian bytes per int32 == pack_to_int32.
    packed = (q8.view(np.uint8) ^ np.uint8(0x80)).reshape(rows, cols).view("<i4")
    return BlockResult(packed, stored, err_sq, ref_sq, rest_err, rest_ref, row_ref)


def quantize_bf16_raw(raw: np.ndarray) -> BlockResult | None:
    """The fused one-pass kernel on bfloat16 rows as stored (uint16 [rows, cols]); None without numba."""
    fused = kernels()
    if fused is None:
        return None
    kernel = fused[2]
    rows, cols = raw.shape
    groups = cols // GROUP_SIZE
    stored = np.empty((rows, groups), np.uint16)
    out = np.empty((rows, cols), np.uint8)
    err_rows = np.empty(rows, np.float64)
    ref_rows = np.empty(rows, np.float64)
    rest_err = np.empty((rows, groups), np.float32)
    rest_ref = np.empty((rows, groups), np.float32)

    def run(begin: int, end: int) -> None:  # the kernel releases the GIL: row slices run in parallel
        kernel(
            raw[begin:end],
            stored[begin:end],
            out[begin:end],
            err_rows[begin:end],
            ref_rows[begin:end],
            rest_err[begin:end],
            rest_ref[begin:end],
        )

    if WORKERS == 1:  # one core: a hop through the pool only adds two thread switches per block
        run(0, rows)
    else:
        step = -(-rows // WORKERS)
        list(_pool().map(lambda b: run(b, min(rows, b + step)), range(0, rows, step)))
    return BlockResult(
        out.view("<i4"), stored, float(err_rows.sum()), float(ref_rows.sum()), rest_err, rest_ref, ref_rows
    )


def group_rel_errors(rest_err: np.ndarray, rest_ref: np.ndarray) -> np.ndarray:
    """Per-group relative error of the weights other than the largest; 0 where they are all zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.sqrt(rest_err / rest_ref)
    return np.where(rest_ref > 0, rel, np.where(rest_err > 0, np.inf, 0.0))


def _non_finite_error(name: str, w: np.ndarray, first_row: int) -> QuantizationError:
    bad_rows = np.flatnonzero(~np.isfinite(w).all(axis=1))
    if len(bad_rows):
        row = int(bad_rows[0])
        col = int(np.flatnonzero(~np.isfinite(w[row]))[0])
        value = w[row, col]
        return QuantizationError(
            f"{name}: non-finite value {value} at row {first_row + row}, column {col} "
            f"({len(bad_rows)} row(s) of this block affected)",
            fix="the source checkpoint is corrupt or was saved with overflowing values; fetch it again or use another "
            "checkpoint (prepare never writes NaN/Inf into a quantized tensor)",
        )
    return QuantizationError(
        f"{name}: the squared norm of a row starting at {first_row} overflows float32",
        fix="the weights are far outside any trained model's range; use another checkpoint",
    )


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B")  # type: ignore[arg-type]  # numpy arrays are buffers


class _LazyRows:
    """float32 view of raw rows, made only when an error message needs the values."""

    def __init__(self, raw: np.ndarray, dtype: str) -> None:
        self.raw, self.dtype = raw, dtype

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return from_float_bits(self.raw, self.dtype).reshape(self.raw.shape)


def quantize_tensor(
    handle: BinaryIO,
    info: TensorInfo,
    write: Callable[[memoryview], None],
    block_bytes: int,
    on_block: Callable[[int], None] | None = None,
    max_group_rel_error: float = 1.0,
) -> QuantStats:
    """Stream `<module>.weight_packed`, then `weight_scale`, then `weight_shape` through `write`.

    Only the scales ([out, in/128], 1/64 of the weight in bf16) stay in memory for the whole tensor.
    Raises QuantizationError naming the row for a non-finite value, and for the first 128-group whose weights
    other than its largest are reconstructed with a relative error above `max_group_rel_error`.
    """
    check_quantizable(info)
    rows, cols = info.shape
    step = rows_per_block(cols, block_bytes)
    stats = QuantStats(info.name, info.shape)
    # A packed block is a fresh array: a writer that can take ownership writes and hashes it in the background.
    write_block = getattr(getattr(write, "__self__", None), "write_owned", write)
    fused_raw = info.dtype == "BF16" and info.numel >= FUSED_MIN_ELEMENTS and kernels() is not None
    # The fused kernel reads the rows where the page cache holds them; elsewhere one raw read buffer serves all
    # blocks (the float32 conversion copies out of it).
    mapped = map_tensor(handle, info) if fused_raw else None
    buffer = None if mapped else np.empty(min(step, rows) * cols, dtype=STORAGE_DTYPES[info.dtype])
    try:
        return _quantize_blocks(
            handle, info, write, write_block, step, stats, fused_raw, mapped, buffer, on_block, max_group_rel_error
        )
    finally:
        if mapped is not None:
            mapped.close()


def _quantize_blocks(
    handle: BinaryIO,
    info: TensorInfo,
    write: Callable[[memoryview], None],
    write_block: Callable[[memoryview], None],
    step: int,
    stats: QuantStats,
    fused_raw: bool,
    mapped: MappedTensor | None,
    buffer: np.ndarray | None,
    on_block: Callable[[int], None] | None,
    max_group_rel_error: float,
) -> QuantStats:
    rows, cols = info.shape
    scale_parts: list[np.ndarray] = []
    for begin in range(0, rows, step):
        end = min(rows, begin + step)
        w: np.ndarray | _LazyRows
        if fused_raw:
            raw = mapped.rows[begin:end] if mapped else read_rows_raw(handle, info, begin, end, buffer)
            fused_block = quantize_bf16_raw(raw)
            assert fused_block is not None
            block = fused_block
            w = _LazyRows(raw, info.dtype)
        else:
            rows_f32 = read_rows_f32(handle, info, begin, end, buffer)
            block = quantize_block_stats(rows_f32, info.dtype, info.numel >= FUSED_MIN_ELEMENTS)
            w = rows_f32
        if not np.isfinite(block.row_ref).all():
            raise _non_finite_error(info.name, np.asarray(w), begin)
        rel = group_rel_errors(block.rest_err, block.rest_ref)
        worst = int(np.argmax(rel))
        worst_rel = float(rel.flat[worst])
        if worst_rel > stats.worst_group_error:
            row, group = divmod(worst, rel.shape[1])
            stats.worst_group_error = worst_rel
            stats.worst_group_row, stats.worst_group_index = begin + row, group
        if worst_rel > max_group_rel_error:
            row, group = divmod(worst, rel.shape[1])
            values = np.asarray(w)[row, group * GROUP_SIZE : (group + 1) * GROUP_SIZE]
            largest = float(np.abs(values).max())
            others_rms = float(np.sqrt(np.mean(np.sort(np.abs(values))[:-1] ** 2)))
            raise QuantizationError(
                f"{info.name}: row {begin + row}, columns {group * GROUP_SIZE}..{(group + 1) * GROUP_SIZE - 1}: "
                f"int8 group-128 loses {worst_rel * 100:.1f}% of the group's weights other than its largest "
                f"(bound {max_group_rel_error * 100:.0f}% per group); the largest is {largest:.4g}, "
                f"the others' RMS {others_rms:.4g}",
                fix="an outlier weight makes the other 127 of its group round to few levels or zero; keep this "
                "tensor in bf16 (use a checkpoint where it is already quantized) and report the model",
            )
        stats.err_sq += block.err_sq
        stats.ref_sq += block.ref_sq
        write_block(_bytes(np.ascontiguousarray(block.packed)))
        scale_parts.append(block.stored)
        if mapped is not None:
            mapped.release(end)
        if on_block is not None:
            on_block((end - begin) * cols * (info.nbytes // info.numel))
    scales = np.concatenate(scale_parts, axis=0)
    write(_bytes(np.ascontiguousarray(scales)))
    write(_bytes(np.array([rows, cols], dtype="<i8")))
    return stats


def dequantize(packed: np.ndarray, scale: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Our own inverse (the tests also use compressed-tensors' decompressor)."""
    rows, cols = shape
    q = (packed.view(np.uint8) ^ np.uint8(0x80)).view(np.int8).reshape(rows, cols).astype(np.float32)
    return (q.reshape(rows, cols // GROUP_SIZE, GROUP_SIZE) * scale[:, :, None]).reshape(rows, cols)
