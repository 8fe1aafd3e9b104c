"""The whole-card budget: vLLM 0.32.0's order of events, KV_MEM / GPU_UTIL modes, outcomes and messages."""

from __future__ import annotations

import json

import pytest

from hyperqwen.config.settings import resolve_settings
from hyperqwen.config.sizes import GiB, MiB
from hyperqwen.memory import GpuFacts, Outcome, parse_gpu, plan_memory
from hyperqwen.memory.budget import activation_peak_estimate, default_cudagraph_capture_sizes
from hyperqwen.memory.cli import main as plan_main

CARD48 = GpuFacts.nominal(48 * GiB)
BASE = {"KV": "fp8", "STATE_DTYPE": "float16", "SPEC": "mtp", "DRAFT_TOKENS": "3", "MAX_LEN": "65536",
        "KV_MEM": str(8 * GiB)}


def plan(model_dir, env=None, gpu=CARD48, mode="single", **kwargs):
    settings = resolve_settings({**BASE, **(env or {})}, mode=mode)
    return plan_memory(settings, gpu, model_dir=model_dir, **kwargs)


def test_kv_mem_pins_the_pool(qwen38_dir):
    b = plan(qwen38_dir)
    assert b.pool_bytes == 8 * GiB and b.outcome is Outcome.FITS
    t = b.terms
    assert b.footprint_bytes == (t["weights"].value + t["activation_peak"].value + t["cuda_graphs"].value
                                 + t["uncounted_graphs"].value + 8 * GiB)
    assert b.pool_tokens == b.layout.reported_tokens(8 * GiB, 65536)
    assert t["profile_margin"].value == 0  # a pinned pool is not sized from a profile


def test_gpu_util_sizes_the_pool_and_context_stays_out_of_it(qwen38_dir):
    b = plan(qwen38_dir, {"KV_MEM": "", "GPU_UTIL": "0.9"})
    t = b.terms
    assert b.requested_bytes == -(-48 * GiB * 9 // 10)
    # determine_available_memory: requested - (weights + activation peak + graph estimate); not the context.
    assert b.pool_bytes == b.requested_bytes - t["weights"].value - t["activation_peak"].value - t["cuda_graphs"].value
    more_context = plan(qwen38_dir, {"KV_MEM": "", "GPU_UTIL": "0.9", "CUDA_CONTEXT": "2GiB"})
    assert more_context.pool_bytes == b.pool_bytes
    assert more_context.free_at_start_bytes == b.free_at_start_bytes - (2 * GiB - t["cuda_context"].value)


def test_context_counts_in_the_startup_check(qwen38_dir):
    """vLLM refuses when free memory after its CUDA context is below ceil(total x GPU_UTIL)."""
    card = parse_gpu("rtx3090")
    ok = plan(qwen38_dir, {"KV_MEM": "", "GPU_UTIL": "0.97", "CUDA_CONTEXT": "0", "HEADROOM_FLOOR": "0"}, card,
              mode="batch")
    assert not any("startup" in p or "GPU_UTIL=0.97 asks" in p for p in ok.problems)
    refused = plan(qwen38_dir, {"KV_MEM": "", "GPU_UTIL": "0.98"}, card, mode="batch")
    assert refused.outcome is Outcome.REFUSES_BOOT
    assert any("CUDA context" in p and "refuses to start" in p for p in refused.problems)
    # KV_MEM does not skip vLLM's startup check: GPU_UTIL (default 0.9) still applies.
    busy = GpuFacts.nominal(24 * GiB, reserved_bytes=4 * GiB)
    pinned = plan(qwen38_dir, {"KV_MEM": "1GiB", "MAX_LEN": "4096"}, busy)
    assert pinned.outcome is Outcome.REFUSES_BOOT and any("applied with KV_MEM too" in p for p in pinned.problems)


def test_card_full_after_boot_is_its_own_outcome(qwen38_dir):
    card = parse_gpu("rtx3090")
    b = plan(qwen38_dir, {"KV_MEM": "", "GPU_UTIL": "0.97", "MAX_LEN": "4096"}, card, mode="batch")
    assert b.outcome is Outcome.CARD_FULL and b.outcome.exit_code == 5
    assert any("HEADROOM_FLOOR" in p for p in b.problems)
    util = float(next(h for h in b.fix_hints if h.startswith("GPU_UTIL=")).split("=")[1].split()[0])
    assert plan(qwen38_dir, {"KV_MEM": "", "GPU_UTIL": str(util), "MAX_LEN": "4096"}, card, mode="batch").fits


def test_mtp_adds_its_weights_and_an_attention_layer(qwen38_dir):
    none = plan(qwen38_dir, {"SPEC": "none"})
    mtp = plan(qwen38_dir)
    assert mtp.weights["resident"] - none.weights["resident"] == mtp.weights["mtp"] > 0
    assert mtp.kv_bytes_per_token == none.kv_bytes_per_token * 17 // 16
    assert mtp.terms["load_transient"].value == 2 * 248320 * 5120 * 2


def test_mtp_plus_lookup_plans_the_mtp_head_at_the_whole_verify_block(qwen38_dir):
    """SPEC=mtp+lookup keeps the MTP head (weights, attention layer) and sizes everything that scales with the
    draft count (GDN state pages, graphs, logits) by the verify block max(DRAFT_TOKENS, LOOKUP_TOKENS)."""
    mtp3 = plan(qwen38_dir)
    mtp8 = plan(qwen38_dir, {"DRAFT_TOKENS": "8"})
    combined = plan(qwen38_dir, {"SPEC": "mtp+lookup", "DRAFT_TOKENS": "3", "LOOKUP_TOKENS": "8"})
    assert combined.weights == mtp3.weights and combined.kv_bytes_per_token == mtp3.kv_bytes_per_token
    assert combined.inputs.num_speculative_tokens == 8
    assert combined.layout == mtp8.layout != mtp3.layout
    assert combined.terms["activation_peak"].value == mtp8.terms["activation_peak"].value


def test_vision_tower_counts_only_when_loaded(qwen38_dir):
    lm = plan(qwen38_dir)
    vis = plan(qwen38_dir, {"VISION": "true"})
    assert vis.weights["resident"] - lm.weights["resident"] == lm.weights["vision"]


def test_too_long_max_len_is_shorter_with_the_length_that_fits(qwen38_dir):
    env = {"KV": "bf16", "STATE_DTYPE": "float32", "DRAFT_TOKENS": "7", "KV_MEM": "5583457484"}
    b = plan(qwen38_dir, env)
    assert b.outcome is Outcome.SHORTER and b.outcome.exit_code == 3
    msg = b.explain_failure()
    assert "MAX_LEN=65536" in msg and "vLLM refuses to start" in msg and "STATE_DTYPE=float16" in msg
    assert f"set MAX_LEN={b.largest_fitting_max_len}" in msg and 0 < b.largest_fitting_max_len < 65536
    assert plan(qwen38_dir, env, max_len=b.largest_fitting_max_len).fits
    assert not plan(qwen38_dir, env, max_len=b.largest_fitting_max_len + 1).fits


def test_no_length_fits_means_refused_boot(qwen38_dir):
    b = plan(qwen38_dir, {"KV_MEM": "64MiB"})
    assert b.outcome is Outcome.REFUSES_BOOT and b.largest_fitting_max_len == 0


def test_terms_are_knobs_and_can_be_overridden(qwen38_dir):
    b = plan(qwen38_dir, {"CUDA_GRAPHS": "7MiB", "HEADROOM_FLOOR": "1"})
    assert b.terms["cuda_graphs"].value == 7 * MiB and "(set)" in b.terms["cuda_graphs"].source
    assert b.terms["headroom_floor"].value == 1
    default = plan(qwen38_dir)
    assert "github.com/syv-ai/qwen38-27b-rtx3090" in default.terms["headroom_floor"].source
    assert plan(qwen38_dir, terms={"CUDA_GRAPHS": 5 * MiB}).terms["cuda_graphs"].value == 5 * MiB


def test_activation_peak_is_the_measurement_at_its_setting_and_grows_with_batched_tokens():
    at_measured = activation_peak_estimate(5120, 17408, 248320, 2, 2048, 64, 0).value
    assert at_measured == int(1.19 * GiB)  # batch, cold, on CUDA (docs/data/gpu)
    assert activation_peak_estimate(5120, 17408, 248320, 2, 2048, 4, 4, mtp=True).value == int(1.25 * GiB)
    a = activation_peak_estimate(5120, 17408, 248320, 2, 2048, 1, 0).value
    b = activation_peak_estimate(5120, 17408, 248320, 2, 4096, 1, 0).value
    assert b - a == 2048 * 2 * (3 * 17408 + 4 * 5120)


def test_dflash_needs_draft(qwen38_dir):
    with pytest.raises(Exception, match="DRAFT"):
        plan(qwen38_dir, {"SPEC": "dflash2"})


def test_max_concurrency_matches_vllms_log_line(qwen38_dir):
    b = plan(qwen38_dir)
    assert b.max_concurrency == round(b.num_blocks / b.layout.blocks_per_request(65536), 2)
    assert b.to_dict()["max_concurrency"] == b.max_concurrency


@pytest.mark.parametrize("gpu", ["12GiB", "16GiB", "24GiB", "32GiB", "48GiB"])
def test_cli_json_for_each_card(qwen38_dir, gpu, capsys):
    rc = plan_main(["--gpu", gpu, "--mode", "batch", "--json", "--model-dir", str(qwen38_dir),
                    "--set", "MAX_LEN=16384", "--set", "MAX_SEQS=64"])
    out = json.loads(capsys.readouterr().out)
    assert rc == out["exit_code"] and out["outcome"] in {o.value for o in Outcome}
    assert out["gpu"]["total_bytes"] == int(gpu.removesuffix("GiB")) * GiB
    assert out["fits"] == (gpu not in ("12GiB", "16GiB"))  # 16.6 GiB of W4A16 weights (bf16 lm_head)
    assert "max_concurrency" in out and "640" in out["resident_requests"]


def test_cli_table_shows_order_and_concurrency(qwen38_dir, capsys):
    rc = plan_main(["--gpu", "48GiB", "--wsl2", "--reserved", "1GiB", "--model-dir", str(qwen38_dir),
                    "--set", "KV_MEM=4GiB", "--set", "MAX_LEN=8192", "--set", "CUDA_GRAPHS=1GiB", "--verbose"])
    out = capsys.readouterr().out
    assert rc == 0 and "FITS (exit 0)" in out and "WSL2" in out and "CUDA_GRAPHS=1,073,741,824 B (set)" in out
    assert out.index("1. CUDA context") < out.index("2. startup check") < out.index("6. KV pool")
    assert "max concurrency at MAX_LEN" in out


@pytest.mark.parametrize("args,names", [
    (["--gpu", "0"], "--gpu='0'"), (["--gpu", "0.5"], "--gpu='0.5'"), (["--gpu", "1B"], "--gpu='1B'"),
    (["--gpu", "100000000TiB"], "--gpu='100000000TiB'"), (["--gpu", "nan"], "--gpu='nan'"),
    (["--gpu=-24GiB"], "--gpu='-24GiB'"), (["--gpu", "rtx9999"], "--gpu='rtx9999'"),
    (["--set", "MAX_LNE=5"], "MAX_LNE"), (["--set", "PREFIX_CACHE=maybe"], "PREFIX_CACHE='maybe'"),
    (["--set", "GPU_UTIL=nan"], "GPU_UTIL='nan'"), (["--set", "GPU_UTIL=0"], "GPU_UTIL='0'"),
    (["--set", "CUDA_GRAPHS=abc"], "CUDA_GRAPHS='abc'"), (["--set", "HEADROOM_FLOOR=-1"], "HEADROOM_FLOOR='-1'"),
    (["--set", "KV_MEM=0"], "KV_MEM='0'"), (["--reserved", "lots"], "--reserved='lots'"),
])
def test_cli_bad_input_exits_2_with_one_line(qwen38_dir, capsys, args, names):
    assert plan_main(["--model-dir", str(qwen38_dir), *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert names in err and "\n" not in err and "Traceback" not in err and captured.out == ""
    # --json: the same line as a JSON object on stdout, the same exit code.
    assert plan_main(["--model-dir", str(qwen38_dir), "--json", *args]) == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer["exit_code"] == 2 and names in answer["error"]


def test_cli_leads_with_the_short_answer(qwen38_dir, capsys):
    """Without --verbose: the verdict, context, seats, pool and the one change, in a few short lines."""
    base = ["--gpu", "rtx3090", "--model-dir", str(qwen38_dir)]
    assert plan_main([*base, "--set", "MAX_LEN=8192"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("FITS (exit 0) on ") and len(lines) <= 8 and max(map(len, lines)) <= 120
    for label in ("context   MAX_LEN=8,192", "seats", "pool      KV", "change    none needed", "--verbose"):
        assert label in out
    assert "1. CUDA context" not in out  # the table is under --verbose
    assert plan_main([*base, "--set", "MAX_LEN=262144", "--set", "SPEC=none"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("FITS ONLY WITH A SHORTER CONTEXT (exit 3)") and "change    set MAX_LEN=" in out


def test_cli_outcomes_have_distinct_exit_codes(qwen38_dir, capsys):
    base = ["--gpu", "rtx3090", "--model-dir", str(qwen38_dir), "--set", "KV=fp8", "--set", "MAX_SEQS=4"]
    assert plan_main([*base, "--set", "MAX_LEN=4096"]) == 0
    assert plan_main([*base, "--set", "MAX_LEN=262144"]) == 3
    assert plan_main([*base, "--set", "MAX_LEN=4096", "--set", "GPU_UTIL=0.98"]) == 4
    assert plan_main([*base, "--set", "MAX_LEN=4096", "--set", "GPU_UTIL=0.97"]) == 5
    out = capsys.readouterr().out
    for word in ("FITS (exit 0)", "FITS ONLY WITH A SHORTER CONTEXT (exit 3)", "VLLM WOULD REFUSE TO BOOT (exit 4)",
                 "CARD FULL AFTER BOOT (exit 5)"):
        assert word in out


def test_cli_empty_max_len_lets_plan_choose(qwen38_dir, capsys):
    rc = plan_main(["--gpu", "rtx3090", "--model-dir", str(qwen38_dir), "--json", "--set", "MAX_LEN="])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["max_model_len"] == out["largest_fitting_max_len"] > 0
    assert out["max_model_len"] != 65536


def test_cli_missing_model_dir(tmp_path, capsys):
    assert plan_main(["--model-dir", str(tmp_path)]) == 2
    assert "config.json: not found" in capsys.readouterr().err


@pytest.mark.parametrize(("where", "says"), [("/etc/passwd", "is a file, not a checkpoint directory"),
                                           ("missing", "does not exist"), ("config-is-a-dir", "cannot read")])
def test_cli_model_dir_that_is_not_a_checkpoint_directory(tmp_path, capsys, where, says):
    """A file, a missing path, or a checkpoint whose config.json cannot be read: one line, exit 2."""
    if where == "config-is-a-dir":
        (tmp_path / "config.json").mkdir()
        where = str(tmp_path)
    elif where == "missing":
        where = str(tmp_path / "missing")
    assert plan_main(["--model-dir", where]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err and captured.out == ""


def test_importing_the_planner_does_not_import_torch():
    import os
    import subprocess
    import sys

    code = "import sys, hyperqwen.memory, hyperqwen.memory.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ}).stdout.strip()
    assert out == "False"


def test_default_cudagraph_capture_sizes():
    # One request, no speculation: top = min(2, 512) = 2 -> sizes 1, 2.
    assert default_cudagraph_capture_sizes(1, 0, 8192) == [1, 2]
    assert default_cudagraph_capture_sizes(1, 3, 8192) == [1, 2, 4, 8]
    assert default_cudagraph_capture_sizes(64, 0, 8192) == [1, 2, 4] + list(range(8, 129, 8))
    sizes = default_cudagraph_capture_sizes(256, 0, 8192)
    assert sizes[-1] == 512 and 264 not in sizes and 272 in sizes
    assert default_cudagraph_capture_sizes(256, 0, 300)[-1] == 300
    assert default_cudagraph_capture_sizes(4, 7, 8192) == [1, 2, 4] + list(range(8, 65, 8))


def test_suggested_kv_mem_makes_the_plan_fit(qwen38_dir):
    card = GpuFacts.nominal(32 * GiB, reserved_bytes=4 * GiB, wsl2=True)
    env = {"KV": "bf16", "KV_MEM": str(12 * GiB), "MAX_LEN": "262144"}
    b = plan(qwen38_dir, env, card)
    assert not b.fits and b.largest_note == f" once KV_MEM={b.suggested_kv_mem}"
    # 4 GiB held by others: vLLM's startup check at the default GPU_UTIL 0.9 fails too; the hint says which.
    util = next(h for h in b.fix_hints if h.startswith("GPU_UTIL=")).split("=")[1].split()[0]
    fixed = plan(qwen38_dir, {**env, "KV_MEM": str(b.suggested_kv_mem), "GPU_UTIL": util}, card,
                 max_len=b.largest_fitting_max_len)
    assert fixed.fits and fixed.headroom_bytes >= fixed.terms["headroom_floor"].value
