"""`hyperqwen calibrate` (memory/calibrate.py) and the planner that then uses its file.

No CUDA card exists here, so the boot that succeeds is a fake that replays a real one: vLLM 0.32.0's log of the
GPU lab's cold single-mode boot on an H200 given a 3090's budget (tests/unit/gpu_lab/data). Everything after the
log (parsing, the file, the planner, `plan` and `serve --explain`) is the real code. The "no GPU" and "no vLLM"
answers are the real command on this machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hyperqwen.cli import main as hyperqwen_main
from hyperqwen.config.load import load_settings
from hyperqwen.config.sizes import GiB
from hyperqwen.exit_codes import Exit
from hyperqwen.memory import GpuFacts, plan_memory
from hyperqwen.memory.calibrate import Boot, run_calibrate
from hyperqwen.memory.calibration import CALIBRATION_FILE, read_calibration
from hyperqwen.memory.verdict import judge

ROOT = Path(__file__).resolve().parents[3]
H200_LOG = ROOT / "tests" / "unit" / "gpu_lab" / "data" / "serve-h200-as-rtx3090-single-cold.log"
RECORD = json.loads((ROOT / "docs/data/gpu/2026-12-02-h200-as-rtx3090-single-default-cold.json").read_text())
# The lab's card as `nvidia-smi`/CUDA gave it, and the GPU_UTIL that gave it a 3090's budget in that boot.
H200 = GpuFacts(RECORD["stack"]["cuda_total_bytes"], RECORD["stack"]["cuda_free_bytes"], "NVIDIA H200", "the lab")
LAB_UTIL = str(RECORD["emulated_gpu_util"])


@pytest.fixture
def model_dir(tmp_path, qwen38_dir) -> Path:
    """A writable copy of the header-only Qwen3.8-27B checkpoint (the planner reads only headers)."""
    target = tmp_path / "models" / "qwen"
    shutil.copytree(qwen38_dir, target)
    return target


def knobs(model_dir: Path, *more: str) -> list[str]:
    return [f"MODELS_DIR={model_dir.parent}", f"MODEL={model_dir.name}", f"GPU_UTIL={LAB_UTIL}", *more]


def args_for(model_dir: Path, *more: str, mode: str = "single") -> argparse.Namespace:
    return argparse.Namespace(mode=mode, env_file=None, set=knobs(model_dir, *more), timeout=60.0)


class ReplayedBoot:
    """A fake CUDA boot (no CUDA card here): hands back a captured vLLM log, and keeps what it was asked."""

    def __init__(self, log: str, served: bool = True):
        self.log, self.served, self.calls = log, served, []

    def __call__(self, serve_args, env, timeout_s):
        self.calls.append((list(serve_args), dict(env), timeout_s))
        return Boot(self.log, self.served, None if self.served else Path("/tmp/serve.log"))


def calibrate(model_dir: Path, boot: ReplayedBoot, *more: str, gpu: GpuFacts | None = H200) -> int:
    """The command with the lab's machine faked at its edges: vLLM 0.32.0 (the CUDA build is not installable here;
    the fast tier has no vLLM at all), the H200, the replayed boot."""
    return run_calibrate(args_for(model_dir, *more), {}, vllm_finder=lambda: "0.32.0", gpu_reader=lambda: gpu,
                         boot=boot, today=lambda: "2026-12-02")


def test_a_replayed_cuda_boot_is_written_and_the_planner_then_gives_vllms_pool(model_dir, capsys):
    boot = ReplayedBoot(H200_LOG.read_text())
    settings = load_settings({}, mode="single", overrides=knobs(model_dir))
    before = plan_memory(settings, H200)
    assert before.calibration == ""  # no file yet: the estimates

    assert calibrate(model_dir, boot) == Exit.OK
    (serve_args, env, _), = boot.calls
    assert serve_args[:2] == ["--mode", "single"] and f"MODEL={model_dir.name}" in serve_args
    assert Path(env["VLLM_CACHE_ROOT"]).name.startswith("hyperqwen-calibrate-cache-")  # a cold start
    assert not Path(env["VLLM_CACHE_ROOT"]).exists()  # and its cache is gone afterwards
    out = capsys.readouterr().out
    assert "vLLM gave a 5.31 GiB KV pool = 72,860 tokens" in out and CALIBRATION_FILE in out

    (m,) = read_calibration(model_dir)
    assert (m.mode, m.gpu_name, m.compile_cache, m.date) == ("single", "NVIDIA H200", "cold", "2026-12-02")
    assert m.vllm_version == "0.32.0"
    assert m.planner["pool_tokens"] == before.pool_tokens
    after = plan_memory(settings, H200)
    assert "measured on this card by `hyperqwen calibrate`" in after.calibration
    assert "hyperqwen calibrate" in after.terms["weights"].source
    # vLLM's pool = requested - consumed - peak; the planner now takes exactly those terms, so it lands on
    # vLLM's own numbers up to the log's two decimals (three terms of +-0.005 GiB).
    assert abs(after.pool_bytes - 5.31 * GiB) <= 0.02 * GiB, after.pool_bytes / GiB
    assert abs(after.pool_tokens / 72_860 - 1) <= 0.005, after.pool_tokens
    assert judge(settings, H200).notes[0] == after.calibration


def test_plan_and_serve_explain_say_they_use_the_measurement(model_dir, capsys):
    assert calibrate(model_dir, ReplayedBoot(H200_LOG.read_text())) == Exit.OK
    capsys.readouterr()
    sets = [arg for pair in knobs(model_dir) for arg in ("--set", pair)]
    assert hyperqwen_main(["plan", "--gpu", f"{H200.total_bytes}B", "--mode", "single", *sets, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "hyperqwen calibrate" in plan["calibration"] and plan["notes"][0] == plan["calibration"]
    assert "hyperqwen calibrate" in plan["terms"]["activation_peak"]["source"]
    assert hyperqwen_main(["serve", "--explain", "--gpu", f"{H200.total_bytes}B", "--mode", "single", *sets]) == 0
    assert "measured on this card by `hyperqwen calibrate`" in capsys.readouterr().out


def test_other_settings_or_another_card_keep_the_estimates_and_say_why(model_dir):
    assert calibrate(model_dir, ReplayedBoot(H200_LOG.read_text())) == Exit.OK
    other = load_settings({}, mode="single", overrides=knobs(model_dir, "MAX_SEQS=8"))
    b = plan_memory(other, H200)
    assert "(max_num_seqs differ)" in b.calibration and "safetensors headers" in b.terms["weights"].source
    card = GpuFacts(24 * GiB, 24 * GiB, "NVIDIA GeForce RTX 3090", "given")
    same = load_settings({}, mode="single", overrides=knobs(model_dir))
    assert "for NVIDIA H200, not NVIDIA GeForce RTX 3090" in plan_memory(same, card).calibration
    # A longer context only sizes the pool: the measurement still holds.
    longer = load_settings({}, mode="single", overrides=knobs(model_dir, "MAX_LEN=32768"))
    assert "hyperqwen calibrate" in plan_memory(longer, H200).calibration


def test_a_failed_boot_writes_nothing_and_keeps_the_file_there(model_dir, capsys):
    assert calibrate(model_dir, ReplayedBoot(H200_LOG.read_text())) == Exit.OK
    kept = (model_dir / CALIBRATION_FILE).read_bytes()
    oom = H200_LOG.read_text().splitlines()[0] + (
        "\n(EngineCore pid=1669) ERROR 12-02 15:38:40 [core.py:1093] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB.\n"
    )
    capsys.readouterr()
    assert calibrate(model_dir, ReplayedBoot(oom, served=False), "MAX_SEQS=8") == Exit.FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "the boot failed, nothing written: " in err[1] and "CUDA out of memory" in err[1]
    assert (model_dir / CALIBRATION_FILE).read_bytes() == kept
    assert sorted(p.name for p in model_dir.iterdir() if "calibration" in p.name) == [CALIBRATION_FILE]


def test_a_served_boot_whose_log_lacks_a_number_writes_nothing(model_dir, capsys):
    log = "\n".join(line for line in H200_LOG.read_text().splitlines() if "Available KV cache memory" not in line)
    assert calibrate(model_dir, ReplayedBoot(log)) == Exit.FAILED
    assert "vLLM's log lacks available_kv_gib" in capsys.readouterr().err
    assert not (model_dir / CALIBRATION_FILE).exists()


@pytest.mark.parametrize(
    "more,expected",
    [(("KV_MEM=4GiB",), "KV_MEM=4294967296 pins the pool"), (("TP=2",), "TP=2: calibrate measures one whole card")],
)
def test_settings_with_which_vllm_measures_nothing_are_refused_before_booting(model_dir, capsys, more, expected):
    boot = ReplayedBoot(H200_LOG.read_text())
    assert calibrate(model_dir, boot, *more) == Exit.BAD_INPUT
    assert expected in capsys.readouterr().err and boot.calls == []


def test_no_prepared_model_is_one_line(tmp_path, capsys):
    boot = ReplayedBoot(H200_LOG.read_text())
    assert calibrate(tmp_path / "models" / "nothing", boot) == Exit.BAD_INPUT
    assert "no prepared model at" in capsys.readouterr().err and boot.calls == []


def run_command(*prelude: str) -> subprocess.CompletedProcess[str]:
    code = "; ".join([*prelude, "from hyperqwen.cli import main", "raise SystemExit(main(['calibrate']))"])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_without_vllm_the_command_says_so_in_one_line():
    done = run_command("import sys", "sys.modules['vllm'] = None")  # vLLM hidden from this process
    assert done.returncode == Exit.BAD_INPUT
    assert done.stderr.strip() == (
        "hyperqwen calibrate: vLLM is not installed here; run calibrate where `hyperqwen serve` runs (the image, "
        "or its venv)"
    )


def test_without_a_gpu_the_command_says_so_in_one_line():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this venv (the fast tier's); the full tier runs this")
    done = run_command()
    assert done.returncode == Exit.BAD_INPUT
    assert done.stderr.strip().splitlines()[-1] == (
        "hyperqwen calibrate: no NVIDIA GPU here (nvidia-smi and torch.cuda see none): calibrate measures vLLM on "
        "the card"
    )


def test_the_boot_runner_reports_a_server_that_will_not_start(tmp_path):
    """The real runner around the real `hyperqwen serve`, which refuses a model folder without a checkpoint."""
    from hyperqwen.memory.calibrate import boot_server
    from hyperqwen.memory.calibration import failure_reason

    boot = boot_server(["--mode", "single", "--set", f"MODEL={tmp_path / 'none'}"], {**os.environ}, 60)
    assert not boot.served and boot.log_path is not None and boot.log_path.read_text() == boot.log
    assert failure_reason(boot.log).startswith(f"hyperqwen: error: MODEL={tmp_path / 'none'}: no checkpoint")
    shutil.rmtree(boot.log_path.parent)


def test_a_measurement_with_extra_args_is_found_again_from_the_file(model_dir):
    """EXTRA_ARGS is part of the settings key; it must compare equal after a round trip through the JSON file."""
    extra = "EXTRA_ARGS=--max-logprobs 5"
    assert calibrate(model_dir, ReplayedBoot(H200_LOG.read_text()), extra) == Exit.OK
    settings = load_settings({}, mode="single", overrides=knobs(model_dir, extra))
    assert "hyperqwen calibrate" in plan_memory(settings, H200).calibration
    plain = load_settings({}, mode="single", overrides=knobs(model_dir))
    assert "(extra_args differ)" in plan_memory(plain, H200).calibration
