"""Check on a GPU what EMBED_ON_HOST (patch 0065) relies on: vLLM's quantized-embedding lookup reading a table
that lives in pinned host memory through a unified-addressing (UVA) view.

With `--cpu-offload-params embed_tokens`, vLLM 0.32.0's UVA offloader copies the embedding's parameters
(`weight_packed` int32, `weight_scale` bf16) to pinned host memory and replaces them by CUDA views of that memory
(`get_accelerator_view_from_cpu_tensor`: the device address of the pinned buffer). The lookup is the Triton
kernel `_dequant_gather_kernel` of `compressed_tensors_embedding.py`. This script takes that kernel (and patch
0005's torch twin) from the installed file without importing vLLM (the GPU machine has torch and Triton, no vLLM),
builds a table of the prepared model's shape in pinned memory, makes the CUDA views the same way (the device
pointer from cudaHostGetDevicePointer, wrapped through __cuda_array_interface__), and checks:

1. the views cost no GPU memory (allocator and CUDA free memory before and after);
2. the kernel gives the same bytes reading through the views as reading a device copy, and as the CPU twin;
3. how long a lookup takes both ways, for decode-sized and prefill-sized batches of token ids.

Usage (GPU machine with torch + Triton):
    python scripts/embed_uva_check.py --source <site-packages>/vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_embedding.py --out result.json

Without a CUDA device it says so and exits 2 (nothing checked).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import kernel_extract  # scripts/kernel_extract.py (run as `python scripts/...`: scripts/ is on the path)

FUNCTIONS = ("_dequant_gather_kernel", "_dequant_gather_triton", "_dequant_gather_torch")
HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n"
NUM_BITS = 8
GROUP = 128


def load_functions(source: Path) -> ModuleType:
    """A module holding the kernel, its launcher and the torch twin from `source`."""
    return kernel_extract.load_functions(source, FUNCTIONS, HEADER, "ct_embedding_kernels",
                                         "is patch 0005 applied to this file?")


def cudart() -> ctypes.CDLL | None:
    """The CUDA runtime torch loaded (its wheels bring one), for cudaHostGetDevicePointer."""
    import torch

    candidates = []
    for root in {Path(torch.__file__).parent, *map(Path, sys.path)}:
        candidates += glob.glob(str(root / "nvidia" / "cu*" / "lib" / "libcudart.so*"))
        candidates += glob.glob(str(root / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so*"))
        candidates += glob.glob(str(root / "lib" / "libcudart*.so*"))
    found = ctypes.util.find_library("cudart")
    if found:
        candidates.append(found)
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def uva_view(pinned, runtime: ctypes.CDLL | None):
    """A CUDA tensor over the pinned host buffer, as vLLM's get_cuda_view_from_cpu_tensor makes it."""
    import torch

    assert pinned.is_pinned()
    host = pinned.data_ptr()
    device_ptr = host
    how = "host pointer (unified addressing: the same address on the device)"
    if runtime is not None:
        out = ctypes.c_void_p()
        err = runtime.cudaHostGetDevicePointer(ctypes.byref(out), ctypes.c_void_p(host), 0)
        if err == 0 and out.value:
            device_ptr, how = out.value, "cudaHostGetDevicePointer"
    # __cuda_array_interface__ has no bfloat16 type string: share 16-bit tables as int16 and view them back.
    flat = pinned.view(torch.int16) if pinned.dtype == torch.bfloat16 else pinned
    typestr = {torch.int32: "<i4", torch.int16: "<i2"}[flat.dtype]

    class Interface:
        __cuda_array_interface__ = {
            "shape": tuple(flat.shape),
            "typestr": typestr,
            "data": (device_ptr, False),
            "version": 3,
            "strides": None,
        }

    view = torch.as_tensor(Interface(), device="cuda")
    return (view.view(torch.bfloat16) if pinned.dtype == torch.bfloat16 else view), how


def timed_ms(fn, repeats: int) -> float:
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="the installed compressed_tensors_embedding.py")
    parser.add_argument("--vocab", type=int, default=248_320, help="rows (the model's vocabulary)")
    parser.add_argument("--hidden", type=int, default=5_120, help="columns (hidden size)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)

    import torch
    import triton

    if not torch.cuda.is_available():
        print("no CUDA device: nothing checked", file=sys.stderr)
        return 2
    kernels = load_functions(args.source)
    torch.manual_seed(args.seed)
    vocab, hidden = args.vocab, args.hidden
    pack = 32 // NUM_BITS

    # The prepared table: int8 group-128 values packed four to an int32, bf16 scales, all in pinned host memory.
    packed = torch.randint(-(2**31), 2**31 - 1, (vocab, hidden // pack), dtype=torch.int32).pin_memory()
    scale = (torch.rand(vocab, hidden // GROUP) * 0.02 + 1e-4).to(torch.bfloat16).pin_memory()
    table_bytes = packed.numel() * 4 + scale.numel() * 2

    torch.cuda.synchronize()
    allocated_before = torch.cuda.memory_allocated()
    free_before, total = torch.cuda.mem_get_info()
    runtime = cudart()
    packed_view, how = uva_view(packed, runtime)
    scale_view, _ = uva_view(scale, runtime)
    torch.cuda.synchronize()
    allocated_after = torch.cuda.memory_allocated()
    free_after, _ = torch.cuda.mem_get_info()

    packed_dev, scale_dev = packed.cuda(), scale.cuda()  # the table as it is without EMBED_ON_HOST
    cases: list[dict[str, Any]] = []
    mismatches = 0
    for n in (1, 8, 64, 512, 2048, 8192):
        ids_cpu = torch.randint(0, vocab, (n,), dtype=torch.int64)
        ids_cpu[0], ids_cpu[-1] = 0, vocab - 1  # both ends of the table
        ids = ids_cpu.cuda()
        via_uva = kernels._dequant_gather_triton(ids, packed_view, scale_view, hidden, NUM_BITS)
        on_device = kernels._dequant_gather_triton(ids, packed_dev, scale_dev, hidden, NUM_BITS)
        twin = kernels._dequant_gather_torch(ids_cpu, packed, scale, hidden, NUM_BITS)
        same_device = torch.equal(via_uva, on_device)
        same_twin = torch.equal(via_uva.cpu(), twin)
        mismatches += (not same_device) + (not same_twin)
        uva_ms = timed_ms(lambda ids=ids: kernels._dequant_gather_triton(ids, packed_view, scale_view, hidden, 8),
                          args.repeats)
        dev_ms = timed_ms(lambda ids=ids: kernels._dequant_gather_triton(ids, packed_dev, scale_dev, hidden, 8),
                          args.repeats)
        cases.append({"tokens": n, "equal_to_device_table": same_device, "equal_to_cpu_twin": same_twin,
                      "uva_ms_median": round(uva_ms, 4), "device_ms_median": round(dev_ms, 4),
                      "bytes_read_over_pcie": n * (hidden + hidden // GROUP * 2)})

    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "source": str(args.source),
        "table": {"vocab": vocab, "hidden": hidden, "bits": NUM_BITS, "group": GROUP, "bytes": table_bytes},
        "view_made_with": how,
        "gpu_allocator_bytes_for_views": allocated_after - allocated_before,
        "cuda_free_bytes_drop_for_views": free_before - free_after,
        "cuda_total_bytes": total,
        "cases": cases,
        "all_equal": mismatches == 0,
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
