"""Prove that patch 0030's plain-torch state copies do what vLLM's Triton kernels do.

vLLM 0.32.0 runs the mamba "align" state copies of speculative decoding + prefix caching as two Triton
kernels in `vllm/v1/worker/mamba_utils.py` (`precopy_mamba_align_fused_kernel`,
`postprocess_mamba_fused_kernel`). Patch 0030 adds torch twins for platforms where Triton has no backend
(the CPU build). This script takes both from one (patched) `mamba_utils.py`, without importing vLLM (the
GPU machine that runs it has torch and Triton but no vLLM): it extracts the kernel and twin functions by
name into a scratch module, builds random state caches and block tables in the layouts vLLM uses, runs
the Triton kernels on the GPU and the twins on CPU copies of the same inputs, and compares every state
byte and the accepted-token output.

Usage (GPU machine with torch + Triton):
    python scripts/mamba_align_kernel_check.py --source .venv/lib/python3.11/site-packages/vllm/v1/worker/mamba_utils.py

Without a CUDA device it says so and exits 2 (nothing proven).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import kernel_extract  # scripts/kernel_extract.py (run as `python scripts/...`: scripts/ is on the path)

KERNELS = ("_memcpy_u64_tiled", "_copy_mamba_state_block", "precopy_mamba_align_fused_kernel",
           "postprocess_mamba_fused_kernel")
TWINS = ("_copy_mamba_state_block_torch", "_copy_mamba_states_torch", "precopy_mamba_align_torch",
         "postprocess_mamba_torch")

HEADER = '''
import torch
import triton
import triton.language as tl

CONV_STATE_DIM_FIRST = False


def is_conv_state_dim_first():
    return CONV_STATE_DIM_FIRST

'''


def load_functions(source: Path) -> ModuleType:
    """A module holding the kernels and twins of `source` (Triton's jit needs them in a real file)."""
    return kernel_extract.load_functions(source, KERNELS + TWINS, HEADER, "mamba_align_extract",
                                         "is patch 0030 applied to this file?")


def _i64(value: int) -> int:
    return value if value < (1 << 63) else value - (1 << 64)


def build_case(torch: Any, rng: random.Random, *, dim_first: bool, padded: bool, dtype: Any,
               num_groups: int = 2, layers_per_group: int = 2, num_blocks: int = 100, max_reqs: int = 8,
               max_cols: int = 12, conv_width: int = 3) -> dict[str, Any]:
    """State caches shaped like a GDN layer's (conv + temporal per layer) and per-group block tables."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    states: list[tuple[Any, bool, int]] = []
    for group in range(num_groups):
        for _ in range(layers_per_group):
            conv_dim = 96
            shape = (num_blocks, conv_dim, conv_width) if dim_first else (num_blocks, conv_width, conv_dim)
            conv = torch.randn(shape, generator=gen).to(dtype)
            temporal_inner = (2, 16, 24)
            if padded:
                # vLLM's unified page size: a temporal state viewed with a page stride larger than its data.
                page = 2 * 16 * 24 + 40
                flat = torch.randn(num_blocks * page, generator=gen).to(dtype)
                temporal = flat.as_strided((num_blocks, *temporal_inner), (page, 16 * 24, 24, 1))
            else:
                temporal = torch.randn((num_blocks, *temporal_inner), generator=gen).to(dtype)
            states.append((conv, True, group))
            states.append((temporal, False, group))
    tables = []
    for _ in range(num_groups):
        # vLLM never gives two running requests the same writable block: block ids are distinct across rows.
        ids = rng.sample(range(num_blocks), max_reqs * max_cols)
        tables.append(torch.tensor(ids, dtype=torch.int32).reshape(max_reqs, max_cols))
    return {"states": states, "tables": tables, "max_reqs": max_reqs, "max_cols": max_cols}


def metadata(torch: Any, states: list[tuple[Any, bool, int]], dim_first: bool, device: str) -> dict[str, Any]:
    """The flattened layout arrays, computed the way MambaSpecDecodeGPUContext._populate_metadata does."""
    rows: dict[str, list[int]] = {k: [] for k in ("base", "stride", "elem", "inner", "width", "group", "drc", "drs")}
    for state, is_conv, group in states:
        rows["base"].append(_i64(state.data_ptr()))
        rows["stride"].append(state.stride(0) * state.element_size())
        rows["elem"].append(state.element_size())
        rows["group"].append(group)
        if is_conv:
            if dim_first:
                rows["width"].append(state.size(2))
                rows["inner"].append(1)
                rows["drc"].append(state.size(1))
                rows["drs"].append(state.stride(1) * state.element_size())
            else:
                rows["width"].append(state.size(1))
                rows["inner"].append(state.stride(1))
                rows["drc"].append(0)
                rows["drs"].append(0)
        else:
            rows["width"].append(0)
            rows["inner"].append(state[0].numel())
            rows["drc"].append(0)
            rows["drs"].append(0)
    i64, i32 = torch.int64, torch.int32
    return {
        "base": torch.tensor(rows["base"], dtype=i64, device=device),
        "stride": torch.tensor(rows["stride"], dtype=i64, device=device),
        "elem": torch.tensor(rows["elem"], dtype=i32, device=device),
        "inner": torch.tensor(rows["inner"], dtype=i64, device=device),
        "width": torch.tensor(rows["width"], dtype=i32, device=device),
        "group": torch.tensor(rows["group"], dtype=i32, device=device),
        "drc": torch.tensor(rows["drc"], dtype=i32, device=device),
        "drs": torch.tensor(rows["drs"], dtype=i64, device=device),
    }


def clone_states(torch: Any, states: list[tuple[Any, bool, int]], device: str) -> list[tuple[Any, bool, int]]:
    out = []
    for state, is_conv, group in states:
        if state.is_contiguous():
            copy = state.to(device).clone()
        else:  # keep the padded page layout (and the padding bytes) on the copy
            storage = torch.empty(state.untyped_storage().nbytes() // state.element_size(), dtype=state.dtype)
            storage.copy_(torch.as_strided(state, (storage.numel(),), (1,), 0))
            storage = storage.to(device)
            copy = storage.as_strided(state.shape, state.stride(), 0)
        out.append((copy, is_conv, group))
    return out


def raw_bytes(torch: Any, state: Any) -> Any:
    flat = torch.as_strided(state, (state.untyped_storage().nbytes() // state.element_size(),), (1,), 0)
    return flat.cpu().contiguous().view(torch.uint8)


def run_case(torch: Any, mod: ModuleType, rng: random.Random, kind: str, dim_first: bool, padded: bool,
             dtype: Any, v2: bool = False) -> dict[str, Any]:
    """One random case. v2: Model Runner V2's calling convention (a batch-to-slot idx_mapping with a skipped
    row; post-process with the post-step computed count precomputed and the accepted counts updated in place)."""
    mod.CONV_STATE_DIM_FIRST = dim_first
    case = build_case(torch, rng, dim_first=dim_first, padded=padded, dtype=dtype)
    num_reqs, max_cols, block_size = case["max_reqs"], case["max_cols"], 16
    gpu_states = clone_states(torch, case["states"], "cuda")
    cpu_states = clone_states(torch, case["states"], "cpu")
    gpu_tables = [t.cuda() for t in case["tables"]]
    cpu_tables = [t.clone() for t in case["tables"]]
    meta = metadata(torch, [s for s in gpu_states], dim_first, "cuda")
    table_ptrs = torch.tensor([_i64(t.data_ptr()) for t in gpu_tables], dtype=torch.int64, device="cuda")
    ctx = SimpleNamespace(torch_states=cpu_states, torch_block_tables=cpu_tables)
    i32 = torch.int32
    grid = (num_reqs, len(gpu_states), 16)
    result: dict[str, Any] = {"kind": kind, "dim_first": dim_first, "padded": padded, "dtype": str(dtype), "v2": v2}
    idx_cpu = None
    if v2:
        order = list(range(num_reqs))
        rng.shuffle(order)
        order[rng.randrange(num_reqs)] = -1
        idx_cpu = torch.tensor(order, dtype=i32)
    idx_gpu = idx_cpu.cuda() if idx_cpu is not None else None
    if kind == "precopy":
        dst = [rng.randrange(1, max_cols - 4) for _ in range(num_reqs)]
        src, bias = [], []
        for i in range(num_reqs):
            choice = rng.random()
            src.append(-1 if choice < 0.15 else dst[i] if choice < 0.3 else rng.randrange(0, dst[i]))
            bias.append(rng.randrange(0, 3))  # < conv width, src + bias stays inside the row
        state_idx, src_col, token_bias = (torch.tensor(v, dtype=i32) for v in (dst, src, bias))
        mod.precopy_mamba_align_fused_kernel[grid](
            state_idx.cuda(), src_col.cuda(), token_bias.cuda(), table_ptrs, gpu_tables[0].stride(0),
            meta["base"], meta["stride"], meta["elem"], meta["inner"], meta["width"], meta["group"],
            meta["drc"], meta["drs"], idx_gpu, num_reqs,
            COPY_BLOCK_SIZE=1024, CONV_STATE_DIM_FIRST=dim_first, HAS_IDX_MAPPING=v2, TEMPORAL_TILES=16,
        )
        mod.precopy_mamba_align_torch(ctx, state_idx, src_col, token_bias, idx_cpu, num_reqs)
        result["copying_requests"] = sum(1 for i in range(num_reqs) if src[i] >= 0 and src[i] != dst[i])
    else:
        k = 3  # draft tokens
        accepted, state_col, scheduled, computed, drafts = [], [], [], [], []
        for _ in range(num_reqs):
            n_draft = rng.choice([0, k])
            n_sched = n_draft + 1
            n_comp = rng.randrange(block_size, block_size * 6)
            running = n_comp + n_sched - n_draft
            accepted.append(rng.randrange(1, n_draft + 2))
            # the running block column preprocess_mamba assigned: cdiv(computed + scheduled) - 1
            state_col.append(-(-(n_comp + n_sched) // block_size) - 1 - rng.choice([0, 0, 1]))
            scheduled.append(n_sched)
            computed.append(n_comp)
            drafts.append(n_draft)
            del running
        t = {name: torch.tensor(v, dtype=i32) for name, v in
             (("acc", accepted), ("col", state_col), ("sch", scheduled), ("comp", computed), ("dr", drafts))}
        out_gpu = t["acc"].cuda().clone()
        out_cpu = t["acc"].clone()
        if v2:
            new_computed = torch.tensor(
                [c + s_ - d + a - 1 for c, s_, d, a in zip(computed, scheduled, drafts, accepted)], dtype=i32
            )
            mod.postprocess_mamba_fused_kernel[grid](
                t["acc"].cuda(), t["col"].cuda(), None, new_computed.cuda(), None, table_ptrs,
                gpu_tables[0].stride(0), meta["base"], meta["stride"], meta["elem"], meta["inner"], meta["width"],
                meta["group"], meta["drc"], meta["drs"], out_gpu, idx_gpu, num_reqs,
                block_size=block_size, COPY_BLOCK_SIZE=1024, CONV_STATE_DIM_FIRST=dim_first, HAS_IDX_MAPPING=True,
                PRECOMPUTED_NEW_COMPUTED=True, TEMPORAL_TILES=16,
            )
            mod.postprocess_mamba_torch(ctx, t["acc"], t["col"], None, new_computed, None, out_cpu, idx_cpu,
                                        num_reqs, block_size, precomputed_new_computed=True)
        else:
            mod.postprocess_mamba_fused_kernel[grid](
                t["acc"].cuda(), t["col"].cuda(), t["sch"].cuda(), t["comp"].cuda(), t["dr"].cuda(), table_ptrs,
                gpu_tables[0].stride(0), meta["base"], meta["stride"], meta["elem"], meta["inner"], meta["width"],
                meta["group"], meta["drc"], meta["drs"], out_gpu, None, num_reqs,
                block_size=block_size, COPY_BLOCK_SIZE=1024, CONV_STATE_DIM_FIRST=dim_first, TEMPORAL_TILES=16,
            )
            mod.postprocess_mamba_torch(ctx, t["acc"], t["col"], t["sch"], t["comp"], t["dr"], out_cpu, None,
                                        num_reqs, block_size, precomputed_new_computed=False)
        result["num_accepted_out_equal"] = bool(torch.equal(out_gpu.cpu(), out_cpu))
    torch.cuda.synchronize()
    changed = 0
    equal = True
    differing = []
    for index, ((g, is_conv, _), (c, _, _), (orig, _, _)) in enumerate(zip(gpu_states, cpu_states, case["states"])):
        gb, cb = raw_bytes(torch, g), raw_bytes(torch, c)
        if not torch.equal(gb, cb):
            equal = False
            differing.append({"state": index, "conv": is_conv, "bytes": int((gb != cb).sum())})
        changed += int((gb != raw_bytes(torch, orig)).sum())
    result["differing_states"] = differing
    result["states_equal"] = equal
    result["bytes_changed_by_kernel"] = changed
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="a mamba_utils.py with patch 0030 applied")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: the Triton kernels cannot run here; nothing proven", file=sys.stderr)
        return 2
    mod = load_functions(args.source)
    results = []
    for seed in range(args.seeds):
        rng = random.Random(seed)
        for kind in ("precopy", "postprocess"):
            for dim_first in (False, True):
                for padded in (False, True):
                    for dtype in (torch.float16, torch.float32):
                        for v2 in (False, True):
                            res = run_case(torch, mod, rng, kind, dim_first, padded, dtype, v2)
                            res["seed"] = seed
                            results.append(res)
    failures = [r for r in results if not r["states_equal"] or r.get("num_accepted_out_equal") is False]
    summary = {
        "cases": len(results),
        "failures": len(failures),
        "bytes_changed_total": sum(r["bytes_changed_by_kernel"] for r in results),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
    }
    print(json.dumps(summary, indent=2))
    for failure in failures[:10]:
        print("FAIL", json.dumps(failure))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
