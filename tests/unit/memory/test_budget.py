"""The whole-card budget: terms, modes (KV_MEM / GPU_UTIL), card reductions and failure messages."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hyperqwen.memory import GpuFacts, MemoryKnobs, MemoryPlanError, largest_max_len_that_fits, plan_memory
from hyperqwen.memory.budget import (
    CUDA_GRAPHS,
    GiB,
    HEADROOM_FLOOR,
    MiB,
    WSL2_REDUCTION,
    activation_peak_estimate,
    parse_size,
    read_gpu_facts,
)
from hyperqwen.memory.cli import main as plan_main

CARD48 = GpuFacts.nominal(48 * GiB)
BASE = MemoryKnobs(kv_cache_dtype="fp8", state_dtype="float16", spec_method="mtp", num_speculative_tokens=3,
                   max_model_len=65536, kv_cache_memory_bytes=8 * GiB)


def test_kv_mem_pins_the_pool(qwen38_dir):
    b = plan_memory(qwen38_dir, BASE, CARD48)
    assert b.pool_bytes == 8 * GiB and b.fits
    t = b.terms
    assert b.footprint_bytes == (b.weights["resident"] + t["cuda_context"].value + t["activation_peak"].value
                                 + t["cuda_graphs"].value + t["uncounted_graphs"].value + 8 * GiB)
    assert b.headroom_bytes == CARD48.free_bytes - b.footprint_bytes
    assert b.pool_tokens == b.layout.reported_tokens(8 * GiB, 65536)


def test_gpu_util_sizes_the_pool(qwen38_dir):
    b = plan_memory(qwen38_dir, replace(BASE, kv_cache_memory_bytes=None, gpu_memory_utilization=0.9), CARD48)
    counted = b.footprint_bytes - b.pool_bytes - b.terms["uncounted_graphs"].value
    assert b.requested_bytes == -(-int(48 * GiB * 9) // 10) or abs(b.requested_bytes - 0.9 * 48 * GiB) < 2
    assert b.pool_bytes == b.requested_bytes - counted


def test_mtp_adds_its_weights_and_an_attention_layer(qwen38_dir):
    none = plan_memory(qwen38_dir, replace(BASE, spec_method="none", num_speculative_tokens=0), CARD48)
    mtp = plan_memory(qwen38_dir, BASE, CARD48)
    assert mtp.weights["resident"] - none.weights["resident"] == mtp.weights["mtp"] > 0
    assert mtp.kv_bytes_per_token == none.kv_bytes_per_token * 17 // 16
    assert mtp.terms["load_transient"].value == 2 * 248320 * 5120 * 2


def test_vision_tower_counts_only_when_loaded(qwen38_dir):
    lm = plan_memory(qwen38_dir, BASE, CARD48)
    vis = plan_memory(qwen38_dir, replace(BASE, language_model_only=False), CARD48)
    assert vis.weights["resident"] - lm.weights["resident"] == lm.weights["vision"]


def test_wsl2_and_reserved_reduce_free_memory():
    g = GpuFacts.nominal(24 * GiB, reserved_bytes=int(1.5 * GiB), wsl2=True)
    assert g.free_bytes == 24 * GiB - int(1.5 * GiB) - WSL2_REDUCTION.value
    assert "WSL2" in g.source and "reserved" in g.source


def test_too_long_max_len_says_why_what_fits_and_which_knob(qwen38_dir):
    k = replace(BASE, kv_cache_dtype="auto", state_dtype="float32", num_speculative_tokens=7,
                kv_cache_memory_bytes=5_583_457_484)
    b = plan_memory(qwen38_dir, k, CARD48)
    assert not b.fits
    msg = b.explain_failure()
    assert "MAX_LEN=65536" in msg and "vLLM refuses to start" in msg
    assert f"set MAX_LEN={b.largest_fitting_max_len}" in msg and 0 < b.largest_fitting_max_len < 65536
    assert "STATE_DTYPE=float16" in msg
    with pytest.raises(MemoryPlanError, match="Largest MAX_LEN"):
        b.raise_if_not_fits()
    ok = plan_memory(qwen38_dir, replace(k, max_model_len=b.largest_fitting_max_len), CARD48)
    assert ok.fits
    assert not plan_memory(qwen38_dir, replace(k, max_model_len=b.largest_fitting_max_len + 1), CARD48).fits


def test_largest_max_len_helper(qwen38_dir):
    n = largest_max_len_that_fits(qwen38_dir, BASE, CARD48)
    assert n == min(plan_memory(qwen38_dir, BASE, CARD48).layout.longest_request(8 * GiB), 262144)


def test_unset_max_len_is_chosen(qwen38_dir):
    b = plan_memory(qwen38_dir, replace(BASE, max_model_len=None, kv_cache_memory_bytes=2 * GiB), CARD48)
    assert b.max_model_len == b.longest_context and b.fits


def test_headroom_floor_violation_names_kv_mem(qwen38_dir):
    card = GpuFacts.nominal(24 * GiB)
    b = plan_memory(qwen38_dir, replace(BASE, kv_cache_memory_bytes=6 * GiB, max_model_len=4096), card)
    assert not b.fits and any("headroom floor" in p for p in b.problems)
    hint = next(h for h in b.fix_hints if h.startswith("KV_MEM="))
    fixed = int(hint.split("=")[1].split()[0])
    assert plan_memory(qwen38_dir, replace(BASE, kv_cache_memory_bytes=fixed, max_model_len=4096), card).fits


def test_gpu_util_above_free_memory(qwen38_dir):
    card = GpuFacts.nominal(24 * GiB, reserved_bytes=4 * GiB)
    b = plan_memory(qwen38_dir, replace(BASE, kv_cache_memory_bytes=None, gpu_memory_utilization=0.95), card)
    assert any("GPU_UTIL=0.95" in p for p in b.problems)


def test_overrides_replace_measured_terms(qwen38_dir):
    b = plan_memory(qwen38_dir, BASE, CARD48, {"CUDA_GRAPHS": 7 * MiB, "HEADROOM_FLOOR": 1})
    assert b.terms["cuda_graphs"].value == 7 * MiB and b.terms["cuda_graphs"].source == "user override"
    assert b.terms["headroom_floor"].value == 1
    assert CUDA_GRAPHS.value == 1400 * MiB and HEADROOM_FLOOR.value == 400 * MiB


def test_activation_peak_grows_with_batched_tokens():
    a = activation_peak_estimate(5120, 17408, 248320, 2, 2048, 1, 0).value
    b = activation_peak_estimate(5120, 17408, 248320, 2, 4096, 1, 0).value
    logits = 248320 * 4
    assert b - a == 2048 * 2 * (3 * 17408 + 4 * 5120) and a > logits


@pytest.mark.parametrize("field,value,knob", [
    ("kv_cache_dtype", "int3", "KV"), ("spec_method", "eagle", "SPEC"), ("state_dtype", "fp8", "STATE_DTYPE"),
    ("max_num_seqs", 0, "MAX_SEQS"), ("gpu_memory_utilization", 1.5, "GPU_UTIL"), ("kv_cache_memory_bytes", 0, "KV_MEM"),
])
def test_bad_knobs_name_the_knob(field, value, knob):
    with pytest.raises(MemoryPlanError, match=knob):
        MemoryKnobs(**{field: value})


def test_spec_without_tokens_is_rejected():
    with pytest.raises(MemoryPlanError, match="DRAFT_TOKENS"):
        MemoryKnobs(spec_method="mtp", num_speculative_tokens=0)


def test_from_knobs_uses_contract_names():
    k = MemoryKnobs.from_knobs({"KV": "fp8", "SPEC": "dflash2", "DFLASH_TOKENS": 7, "DRAFT_TOKENS": 3,
                                "PREFIX_CACHE": False, "STATE_DTYPE": "float16", "KV_MEM": 123, "MAX_LEN": 4096,
                                "MAX_SEQS": 2, "GPU_UTIL": 0.8, "VISION": True, "DRAFT": "d"})
    assert (k.num_speculative_tokens, k.prefix_caching, k.language_model_only, k.draft_dir) == (7, False, False, "d")
    assert (k.kv_cache_memory_bytes, k.max_model_len, k.max_num_seqs, k.gpu_memory_utilization) == (123, 4096, 2, 0.8)


def test_dflash_needs_draft(qwen38_dir):
    with pytest.raises(MemoryPlanError, match="DRAFT"):
        plan_memory(qwen38_dir, MemoryKnobs(spec_method="dflash2", num_speculative_tokens=7), CARD48)


@pytest.mark.parametrize("text,expected", [("24GiB", 24 * GiB), ("24GB", 24 * GiB), ("512MiB", 512 * MiB),
                                           ("5583457484", 5583457484), ("1.5G", int(1.5 * GiB))])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_error_names_input():
    with pytest.raises(MemoryPlanError, match="--gpu='lots'"):
        parse_size("lots", "--gpu")


def test_read_gpu_facts_without_gpu_returns_none():
    # This machine has no GPU (and no nvidia-smi): the planner must say "unknown", not crash or guess.
    assert read_gpu_facts() is None


@pytest.mark.parametrize("gpu", ["12GiB", "16GiB", "24GiB", "32GiB", "48GiB"])
def test_cli_json_for_each_card(qwen38_dir, gpu, capsys):
    # Knobs pinned here so the expectation does not move with the batch profile's defaults.
    rc = plan_main(["--gpu", gpu, "--mode", "batch", "--json", "--model-dir", str(qwen38_dir),
                    "--set", "MAX_LEN=16384", "--set", "MAX_BATCHED_TOKENS=8192", "--set", "MAX_SEQS=64"])
    out = json.loads(capsys.readouterr().out)
    assert rc == (0 if out["fits"] else 1)
    assert out["gpu"]["total_bytes"] == parse_size(gpu)
    assert out["fits"] == (gpu not in ("12GiB", "16GiB"))  # 16.6 GiB of W4A16 weights (bf16 lm_head) need > 16 GiB


def test_cli_table_and_overrides(qwen38_dir, capsys):
    rc = plan_main(["--gpu", "48GiB", "--wsl2", "--reserved", "1GiB", "--model-dir", str(qwen38_dir),
                    "--set", "KV_MEM=4GiB", "--set", "MAX_LEN=8192", "--set", "CUDA_GRAPHS=1GiB"])
    out = capsys.readouterr().out
    assert rc == 0 and "FITS" in out and "WSL2" in out and "user override" in out


def test_cli_bad_set_is_a_clear_error(qwen38_dir, capsys):
    assert plan_main(["--model-dir", str(qwen38_dir), "--set", "MAX_LNE=5"]) == 2
    assert "MAX_LNE" in capsys.readouterr().err
    assert plan_main(["--model-dir", str(qwen38_dir), "--set", "PREFIX_CACHE=maybe"]) == 2
    assert "PREFIX_CACHE='maybe'" in capsys.readouterr().err


def test_cli_missing_model_dir(tmp_path, capsys):
    assert plan_main(["--model-dir", str(tmp_path)]) == 2
    assert "config.json: not found" in capsys.readouterr().err


def test_read_gpu_facts_from_fake_nvidia_smi(tmp_path, monkeypatch):
    """No GPU here: a fake nvidia-smi printing what the real one prints for this query (MiB, no units)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   "case \"$*\" in *memory.total,memory.free,name*) echo '24576, 23117, NVIDIA GeForce RTX 3090';;"
                   " *) exit 9;; esac\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    g = read_gpu_facts()
    assert g == GpuFacts(24576 * MiB, 23117 * MiB, "NVIDIA GeForce RTX 3090", "nvidia-smi")


def test_importing_the_planner_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, hyperqwen.memory, hyperqwen.memory.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__('os').environ}).stdout.strip()
    assert out == "False"


def test_default_cudagraph_capture_sizes():
    from hyperqwen.memory.budget import default_cudagraph_capture_sizes

    # One request, no speculation: top = min(2, 512) = 2 -> sizes 1, 2.
    assert default_cudagraph_capture_sizes(1, 0, 8192) == [1, 2]
    # One request, k=3: top = 8; grid 1, 2, 4, 8; decode 1x4 = 4, 2x? (only n <= 1 request) -> [1, 2, 4, 8].
    assert default_cudagraph_capture_sizes(1, 3, 8192) == [1, 2, 4, 8]
    # 64 requests, no speculation: top 128 -> 1, 2, 4, 8..128 step 8; decode size 64 already in.
    assert default_cudagraph_capture_sizes(64, 0, 8192) == [1, 2, 4] + list(range(8, 129, 8))
    # 256 requests: capped at 512 -> 8..248 step 8, 256..512 step 16.
    sizes = default_cudagraph_capture_sizes(256, 0, 8192)
    assert sizes[-1] == 512 and 264 not in sizes and 272 in sizes
    # MAX_BATCHED_TOKENS below the ceiling caps it and is captured itself.
    assert default_cudagraph_capture_sizes(256, 0, 300)[-1] == 300
    # k=7, 4 requests: top 64; decode sizes 8, 16, 32 (1, 2, 4 requests x 8 tokens) are on the grid.
    assert default_cudagraph_capture_sizes(4, 7, 8192) == [1, 2, 4] + list(range(8, 65, 8))


def test_suggested_values_make_the_plan_fit(qwen38_dir):
    card = GpuFacts.nominal(32 * GiB, reserved_bytes=4 * GiB, wsl2=True)
    k = replace(BASE, kv_cache_dtype="auto", kv_cache_memory_bytes=12 * GiB, max_model_len=262144)
    b = plan_memory(qwen38_dir, k, card)
    assert not b.fits and b.largest_note == f" once KV_MEM={b.suggested_kv_mem}"
    assert 0 < b.largest_fitting_max_len < 262144 and f"once KV_MEM={b.suggested_kv_mem}" in b.explain_failure()
    fixed = plan_memory(qwen38_dir, replace(k, kv_cache_memory_bytes=b.suggested_kv_mem,
                                            max_model_len=b.largest_fitting_max_len), card)
    assert fixed.fits and fixed.headroom_bytes >= fixed.terms["headroom_floor"].value
    # GPU_UTIL mode: the hinted GPU_UTIL fits (with the MAX_LEN it was computed for).
    u = plan_memory(qwen38_dir, replace(k, kv_cache_memory_bytes=None, gpu_memory_utilization=0.97), card)
    util_hint = next(h for h in u.fix_hints if h.startswith("GPU_UTIL="))
    util = float(util_hint.split("=")[1].split()[0])
    fixed_u = plan_memory(qwen38_dir, replace(k, kv_cache_memory_bytes=None, gpu_memory_utilization=util,
                                              max_model_len=u.largest_fitting_max_len), card)
    assert fixed_u.fits, fixed_u.explain_failure()
