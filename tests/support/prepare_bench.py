"""Benchmark prepare against a plain copy of the same bytes (a script, not a test).

    PYTHONPATH=src:tests python -m support.prepare_bench --workdir /tmp/prepare-bench [--body-gib 2]
        [--scenario lm_head] [--pairs 5] [--cpus 0] [--json results.json]

Scenarios (synthetic checkpoints written once per scenario):
  lm_head:    one shard holding a synthetic full-size lm_head (248,320 x 5,120 bf16, 2.37 GiB);
              prepare requantizes it to int8 group-128.
  checkpoint: a multi-GB multi-shard checkpoint: W4A16 body shards (hard-linked by prepare), the full-size
              lm_head and a full-size MTP head (both requantized), tokenizer and config.
Each pair runs, alternating which goes first, (1) `cp -r SOURCE DEST && sync` and (2) `python -m hyperqwen.prepare`
into an empty models directory followed by `sync`, both pinned with `taskset -c CPUS` when --cpus is given. The
ratio copy seconds / prepare seconds is the speed of prepare relative to the copy (1.0 = as fast); the median over
the pairs is reported. Peak RSS is prepare's own VmHWM; CPU seconds its user+sys over all threads. The written
lm_head is decoded back from the file and compared with the source, so a wrong result cannot pass as fast.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hyperqwen.prepare.safetensors_io import OutTensor, build_header, f32_to_bf16_bits
from support.synthetic_checkpoint import FULL, Spec, config_for, write_tokenizer

# Runs a module or a script in the child and, at exit, writes the child's own peak RSS (VmHWM). rusage's
# ru_maxrss is not used: it also counts the forked copy of this (larger) parent before exec.
PEAK_WRAPPER = """
import runpy, sys
peak_file, kind, target, *rest = sys.argv[1:]
sys.argv = [target, *rest]
try:
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        exec(compile(target, "<bench>", "exec"), {"__name__": "__main__"})
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
finally:
    import resource
    peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    open(peak_file, "w").write(f"{peak} {usage.ru_utime + usage.ru_stime}")
"""


def _run_child(
    kind: str,
    target: str,
    args: list[str],
    peak_file: Path,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB, CPU seconds) of `python -m target args` (kind "module") or a script."""
    argv = [*(prefix or []), sys.executable, "-c", PEAK_WRAPPER, str(peak_file), kind, target, *args]
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{target[:40]!r} failed:\n{done.stderr[-3000:]}")
    peak_kib, cpu_seconds = peak_file.read_text().split()
    return seconds, int(peak_kib) / 1024, float(cpu_seconds)  # VmHWM is in KiB


def _dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.name.startswith("."))


def _write_shard_fast(path: Path, specs: list[Spec], seed: int = 0) -> None:
    """Like synthetic._write_shard but quick for multi-GB files: a pool of 64 Mi seeded N(0, 0.02) bf16
    (or random int32) values, written at a different random offset each block. Statistically the same
    for quantization; generating gigabytes of fresh normals would dominate the benchmark's run time."""
    rng = np.random.default_rng(seed)
    pool_elems = 32 << 20
    bf16_pool = f32_to_bf16_bits(rng.standard_normal(pool_elems * 2, dtype=np.float32) * np.float32(0.02))
    i32_pool = rng.integers(-(2**31), 2**31, pool_elems * 2, dtype=np.int64).astype("<i4")
    with open(path, "wb") as out:
        out.write(build_header([OutTensor(x.name, x.dtype, x.shape) for x in specs], {"format": "pt"}))
        for spec in specs:
            count = int(np.prod(spec.shape))
            if spec.kind == "shape":
                out.write(np.array(spec.value, "<i8").tobytes())
                continue
            if spec.kind == "ones":
                out.write(f32_to_bf16_bits(np.ones(count, np.float32)).tobytes())
                continue
            if spec.kind == "scale4":
                out.write(f32_to_bf16_bits(rng.uniform(0.001, 0.004, count).astype(np.float32)).tobytes())
                continue
            pool = i32_pool if spec.kind == "packed4" else bf16_pool
            left = count
            while left:
                n = min(left, pool_elems)
                start = int(rng.integers(0, pool_elems))
                out.write(pool[start : start + n].tobytes())
                left -= n


def make_checkpoint(directory: Path, body_gib: float, with_mtp: bool) -> None:
    """Full-size lm_head (+ MTP) plus `body_gib` of W4A16-shaped body shards, written in row blocks."""
    s = FULL
    directory.mkdir(parents=True)
    shards: list[list[Spec]] = []
    ignore = ["lm_head"]
    # Body: full-size MLP layers in W4A16 layout until body_gib is reached, ~1 GiB per shard.
    body: list[Spec] = []
    layer, total = 0, 0
    while total < body_gib * 2**30:
        p = f"model.language_model.layers.{layer}.mlp"
        for proj, (o, i) in {
            "gate_proj": (s.intermediate, s.hidden),
            "up_proj": (s.intermediate, s.hidden),
            "down_proj": (s.hidden, s.intermediate),
        }.items():
            specs = [
                Spec(f"{p}.{proj}.weight_packed", "I32", (o, i // 8), "packed4"),
                Spec(f"{p}.{proj}.weight_scale", "BF16", (o, i // 128), "scale4"),
                Spec(f"{p}.{proj}.weight_shape", "I64", (2,), "shape", (o, i)),
            ]
            body += specs
            total += sum(OutTensor(x.name, x.dtype, x.shape).nbytes for x in specs)
        if sum(OutTensor(x.name, x.dtype, x.shape).nbytes for x in body) >= 2**30:
            shards.append(body)
            body = []
        layer += 1
    if body:
        shards.append(body)
    shards.append([Spec("lm_head.weight", "BF16", (s.vocab, s.hidden))])
    if with_mtp:
        h, q_out, kv_out = s.hidden, s.heads * s.head_dim * 2, s.kv_heads * s.head_dim
        mtp = [Spec("mtp.fc.weight", "BF16", (h, 2 * h))]
        dims = {
            "self_attn.q_proj": (q_out, h),
            "self_attn.k_proj": (kv_out, h),
            "self_attn.v_proj": (kv_out, h),
            "self_attn.o_proj": (h, s.heads * s.head_dim),
            "mlp.gate_proj": (s.intermediate, h),
            "mlp.up_proj": (s.intermediate, h),
            "mlp.down_proj": (h, s.intermediate),
        }
        mtp += [Spec(f"mtp.layers.0.{k}.weight", "BF16", v) for k, v in dims.items()]
        mtp += [
            Spec(f"mtp.{n}.weight", "BF16", (h,), "ones")
            for n in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding")
        ]
        shards.append(mtp)
    weight_map, size = {}, 0
    for i, specs in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        _write_shard_fast(directory / name, specs, seed=i)
        for x in specs:
            weight_map[x.name] = name
            size += OutTensor(x.name, x.dtype, x.shape).nbytes
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}, indent=2)
    )
    config = config_for(s, ignore)
    config["text_config"]["num_hidden_layers"] = max(1, layer)
    config["text_config"]["layer_types"] = ["linear_attention"] * max(1, layer)
    config["text_config"]["mtp_num_hidden_layers"] = 1 if with_mtp else 0
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(directory, s.vocab)


def check_lm_head(source: Path, prepared: Path, rows: int = 4096) -> float:
    """Decode a slice of the written int8 lm_head from the file and compare with the source rows, so the
    benchmark cannot report the speed of a wrong result."""
    from hyperqwen.formats.safetensors import read_header
    from hyperqwen.prepare.quantize import dequantize
    from hyperqwen.prepare.safetensors_io import from_float_bits, read_rows_f32

    index = json.loads((prepared / "model.safetensors.index.json").read_text())["weight_map"]
    src_index = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    src_info = read_header(source / src_index["lm_head.weight"]).tensors["lm_head.weight"]
    out = read_header(prepared / index["lm_head.weight_packed"]).tensors
    total, cols = src_info.shape
    begin = total // 2
    with open(source / src_index["lm_head.weight"], "rb") as handle:
        original = read_rows_f32(handle, src_info, begin, begin + rows)
    with open(prepared / index["lm_head.weight_packed"], "rb") as handle:
        packed_info, scale_info = out["lm_head.weight_packed"], out["lm_head.weight_scale"]
        handle.seek(packed_info.begin + begin * (cols // 4) * 4)
        packed = np.frombuffer(handle.read(rows * cols), "<i4").reshape(rows, cols // 4)
        handle.seek(scale_info.begin + begin * (cols // 128) * 2)
        scale = from_float_bits(np.frombuffer(handle.read(rows * (cols // 128) * 2), "<u2").reshape(rows, -1), "BF16")
    restored = dequantize(packed, scale, (rows, cols))
    return float(np.linalg.norm(restored - original) / np.linalg.norm(original))


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def _pin(cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


def bench(
    workdir: Path,
    body_gib: float,
    scenarios: tuple[str, ...] = ("lm_head", "checkpoint"),
    pairs: int = 5,
    cpus: str | None = None,
) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    start_load = os.getloadavg()
    for scenario, gib, mtp in (("lm_head", 0.0, False), ("checkpoint", body_gib, True)):
        if scenario not in scenarios:
            continue
        root = workdir / scenario
        if root.exists():
            shutil.rmtree(root)
        source = root / "source"
        t0 = time.perf_counter()
        make_checkpoint(source, gib, mtp)
        made = time.perf_counter() - t0
        subprocess.run(["sync"], check=True)
        nbytes = _dir_bytes(source)
        peak = root / "peak-kib"
        env = {
            **os.environ,
            "MODELS_DIR": str(root / "models"),
            "MODEL": "m",
            "MODEL_SOURCE_DIR": str(source),
            "QUANTIZE_EMBED": "0",
        }
        runs = []
        for i in range(pairs):
            order = ("copy", "prepare") if i % 2 == 0 else ("prepare", "copy")
            seconds: dict[str, float] = {}
            for what in order:
                if what == "copy":
                    seconds["copy"] = _timed(
                        ["sh", "-c", f'{" ".join(_pin(cpus))} cp -r "$0" "$1" && sync', str(source), str(root / "copy")]
                    )
                    shutil.rmtree(root / "copy")
                else:
                    shutil.rmtree(root / "models", ignore_errors=True)
                    start = time.perf_counter()
                    _, rss, cpu = _run_child(
                        "module", "hyperqwen.prepare", ["--no-progress"], peak, env, prefix=_pin(cpus)
                    )
                    subprocess.run(["sync"], check=True)
                    seconds["prepare"] = time.perf_counter() - start
                    seconds["rss"], seconds["cpu"] = rss, cpu
            runs.append(seconds)
            print(
                f"{scenario} pair {i + 1}: copy {seconds['copy']:.2f} s, prepare {seconds['prepare']:.2f} s "
                f"(ratio {seconds['copy'] / seconds['prepare']:.2f}), peak RSS {seconds['rss']:.0f} MiB",
                flush=True,
            )
        manifest = json.loads((root / "models" / "m" / "hyperqwen-manifest.json").read_text())
        sample_error = check_lm_head(source, root / "models" / "m")
        if not sample_error < 0.01:
            raise SystemExit(f"the written lm_head decodes with relative error {sample_error}: wrong result")
        noop_s, noop_rss, _ = _run_child("module", "hyperqwen.prepare", ["--no-progress"], peak, env, prefix=_pin(cpus))
        ratios = sorted(r["copy"] / r["prepare"] for r in runs)
        results[scenario] = {
            "source_bytes": nbytes,
            "source_gib": round(nbytes / 2**30, 3),
            "generate_seconds": round(made, 1),
            "pairs": [{k: round(v, 2) for k, v in r.items()} for r in runs],
            "copy_seconds_median": round(statistics.median(r["copy"] for r in runs), 2),
            "prepare_seconds_median": round(statistics.median(r["prepare"] for r in runs), 2),
            "prepare_speed_vs_copy_median": round(statistics.median(ratios), 3),
            "prepare_speed_vs_copy_range": [round(ratios[0], 3), round(ratios[-1], 3)],
            "prepare_peak_rss_mib_max": round(max(r["rss"] for r in runs), 1),
            "prepare_cpu_seconds_median": round(statistics.median(r["cpu"] for r in runs), 2),
            "prepare_noop_rerun": {"seconds": round(noop_s, 2), "peak_rss_mib": round(noop_rss, 1)},
            "loadavg_1min_after": round(os.getloadavg()[0], 1),
            "rel_frobenius_error": {k: v["rel_frobenius_error"] for k, v in manifest["quantized"].items()},
            "lm_head_rows_decoded_from_file_rel_error": round(sample_error, 6),
        }
        print(
            json.dumps({scenario: {k: v for k, v in results[scenario].items() if k != "pairs"}}, indent=2), flush=True
        )
        shutil.rmtree(root)
    return {
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_model": _cpu_model(),
            "cpus_online": os.cpu_count(),
            "pinned_to": cpus or "(not pinned)",
            "loadavg_at_start": start_load,
            "loadavg_at_end": os.getloadavg(),
            "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "numpy": np.__version__,
            "numba": _version("numba"),
        },
        "results": results,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


TARGETS = {1: 0.5, 2: 0.8}  # prepare speed vs the copy: one core, two cores


def render_markdown(runs: list[dict]) -> str:
    """docs/prepare-benchmark.md from the JSON of one or more runs (each with the command that made it), so the
    document holds only measured numbers."""
    lines = [
        "# prepare benchmark: requantizing vs a plain copy",
        "",
        "Generated by `python -m support.prepare_bench --render` from the JSON the runs below wrote; do not edit",
        "the numbers by hand, run the commands again.",
        "",
        "## Commands",
        "",
        "A script, not a test (it writes 2.4-5.2 GiB of synthetic checkpoints and cleans up after itself; needs about",
        "4x that free):",
        "",
        "```",
        *(run["command"] for run in runs),
        f"PYTHONPATH=src:tests python -m support.prepare_bench --render docs/prepare-benchmark.md "
        f"{' '.join(run['json_name'] for run in runs)}",
        "```",
        "",
        "What it does (`tests/support/prepare_bench.py`): writes a synthetic checkpoint per scenario, `sync`s, then",
        "runs the pairs, alternating which side goes first: (1) `taskset -c CPUS cp -r SOURCE COPY && sync`, (2)",
        "`taskset -c CPUS python -m hyperqwen.prepare --no-progress` into an empty models directory, then `sync`.",
        "The disk sync is inside the timing on both sides; the source is in the page cache for both (written, then",
        "synced, just before). Speed of prepare relative to the copy = copy seconds / prepare seconds (1.0 = as fast);",
        "the median over the pairs is reported. Peak RSS is prepare's own `VmHWM`; CPU seconds its user+sys over all",
        "threads. At the end it decodes 4,096 rows of the written int8 lm_head from the file and compares them with",
        "the source, so a wrong result cannot pass as fast, and runs prepare once more (the no-op re-run).",
        "",
        "Scenarios:",
        "- **lm_head**: one shard with a full-size `lm_head` (248,320 x 5,120 bf16, 2.37 GiB), requantized to int8",
        "  g128. Every byte is quantized: the worst case for prepare.",
        "- **checkpoint**: 5.21 GiB in 4 shards: 2 GiB of full-size W4A16 MLP shards (hard-linked and hashed), the",
        "  full-size lm_head, and a full-size MTP head (`mtp.fc` 5,120 x 10,240 and one decoder layer; requantized).",
        "",
        "## Results",
        "",
        "Each run below, in the order given to `--render`; every run's rows are in the table.",
        "",
    ]
    for run in runs:
        env = run["environment"]
        lines += [
            f"`{run['command']}` ({run['started']} to {run['finished']} UTC):",
            f"{env['cpu_model']}, {env['cpus_online']} CPUs online, {env['ram_gib']} GiB RAM, Python {env['python']},",
            f"numpy {env['numpy']}, numba {env['numba']}; pinned to CPUs {env['pinned_to']}; load average (1, 5, 15",
            f"min) {_load(env['loadavg_at_start'])} at the start, {_load(env['loadavg_at_end'])} at the end.",
            "",
        ]
    lines += [
        "| scenario | cores | copy (cp -r + sync) | prepare (+ sync) | prepare speed vs copy: median (range) "
        "| target | prepare peak RSS | prepare CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for run in runs:
        cores = len(run["environment"]["pinned_to"].split(","))
        target = TARGETS.get(cores)
        for scenario, r in run["results"].items():
            low, high = r["prepare_speed_vs_copy_range"]
            ratio = r["prepare_speed_vs_copy_median"]
            met = target is not None and ratio >= target
            verdicts.append(met)
            lines.append(
                f"| {scenario} | {cores} (`taskset -c {run['environment']['pinned_to']}`) "
                f"| {r['copy_seconds_median']:.2f} s | {r['prepare_seconds_median']:.2f} s "
                f"| **{ratio:.3f}x** ({low:.2f}-{high:.2f}) | >= {target}x: {'met' if met else 'NOT met'} "
                f"| {r['prepare_peak_rss_mib_max']:.0f} MiB | {r['prepare_cpu_seconds_median']:.2f} |"
            )
    lines += ["", "Every pair (seconds; copy / prepare):", ""]
    for run in runs:
        for scenario, r in run["results"].items():
            pairs = ", ".join(f"{p['copy']:.2f} / {p['prepare']:.2f}" for p in r["pairs"])
            lines.append(f"- {scenario}, CPUs {run['environment']['pinned_to']}: {pairs}")
    lines.append("")
    for run in runs:
        for scenario, r in run["results"].items():
            errors = sorted(set(r["rel_frobenius_error"].values()))
            lines.append(
                f"- {scenario}, CPUs {run['environment']['pinned_to']}: no-op re-run "
                f"{r['prepare_noop_rerun']['seconds']:.2f} s, {r['prepare_noop_rerun']['peak_rss_mib']:.0f} MiB peak "
                f"RSS; relative Frobenius error of the requantized tensors (manifest) "
                f"{min(errors) * 100:.3f}-{max(errors) * 100:.3f}%, rows decoded back from the file "
                f"{r['lm_head_rows_decoded_from_file_rel_error'] * 100:.3f}%."
            )
    rss = max(r["prepare_peak_rss_mib_max"] for run in runs for r in run["results"].values())
    lines += [
        "",
        "## Against the targets",
        "",
        f"- Peak RSS under 1 GiB: {'met' if rss < 1024 else 'NOT met'} (at most {rss:.0f} MiB).",
        f"- Speed: {sum(verdicts)} of {len(verdicts)} scenario/core rows meet their target (>= 0.5x of the copy on "
        "one core, >= 0.8x on two).",
        "",
    ]
    return "\n".join(lines)


def _load(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.prepare_bench", allow_abbrev=False)
    parser.add_argument("--workdir", type=Path, help="scratch directory (needs ~4x the data size)")
    parser.add_argument(
        "--render",
        nargs="+",
        type=Path,
        metavar=("MARKDOWN", "JSON"),
        help="write MARKDOWN from the JSON files earlier runs wrote (no benchmark is run)",
    )
    parser.add_argument("--body-gib", type=float, default=2.0, help="GiB of W4A16 body shards in 'checkpoint'")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=["lm_head", "checkpoint"],
        help="run only this scenario (repeatable; default: both)",
    )
    parser.add_argument("--pairs", type=int, default=5, help="alternated copy/prepare pairs per scenario (median)")
    parser.add_argument("--cpus", help="pin both sides with taskset -c CPUS (e.g. 0 for one core, 0,1 for two)")
    args = parser.parse_args(argv)
    if args.render:
        if len(args.render) < 2:
            parser.error("--render needs the markdown file and at least one JSON file")
        runs = [json.loads(path.read_text()) | {"json_name": str(path)} for path in args.render[1:]]
        args.render[0].write_text(render_markdown(runs))
        return 0
    if args.workdir is None:
        parser.error("--workdir is required to run the benchmark")
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    out = bench(args.workdir, args.body_gib, tuple(args.scenario or ("lm_head", "checkpoint")), args.pairs, args.cpus)
    niceness = os.nice(0)
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd() + os.sep) else "python"
    out["command"] = (
        f"PYTHONPATH=src:tests {f'nice -n {niceness} ' if niceness else ''}{python} -m support.prepare_bench "
        + " ".join(sys.argv[1:] if argv is None else argv)
    )
    out["started"], out["finished"] = started, time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
