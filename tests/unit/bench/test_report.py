"""The field report carries what `hyperqwen calibrate` measured beside the server's model (bench/report.py), read
from the environment file the server writes (launch/serverside.py)."""

from __future__ import annotations

from pathlib import Path

from hyperqwen.bench import report
from hyperqwen.launch import serverside
from hyperqwen.memory.calibration import CALIBRATION_FILE, Measurement, parse_vllm_log, write_calibration

# vLLM 0.32.0's log of the GPU lab's cold single-mode boot (an H200 given a 3090's budget).
H200_LOG = Path(__file__).resolve().parents[1] / "gpu_lab" / "data" / "serve-h200-as-rtx3090-single-cold.log"


def test_the_report_shows_the_calibration_beside_the_model(tmp_path):
    assert report.calibration_text(serverside.collect_environment(model_dir=tmp_path)).startswith("none (")
    measurement = Measurement(
        mode="single", date="2026-12-02", gpu_name="NVIDIA H200", gpu_total_bytes=150_109_880_320,
        vllm_version="0.32.0", compile_cache="cold", key={"spec_method": "mtp"},
        vllm=parse_vllm_log(H200_LOG.read_text()), planner={"pool_tokens": 70_933},
    )
    write_calibration(tmp_path, measurement)
    server = serverside.collect_environment(model_dir=tmp_path)
    assert server["calibration"]["measurements"][0]["vllm"]["pool_tokens"] == 72_860
    text = report.calibration_text(server)
    assert text == ("NVIDIA H200 2026-12-02 single (cold): vLLM 72,860 pool tokens, model loading 14.8 GiB, peak "
                    "activation 1.5 GiB, planner estimate 70,933 (-2.6%)")
    (tmp_path / CALIBRATION_FILE).write_text("{broken")
    assert report.calibration_text(serverside.collect_environment(model_dir=tmp_path)).startswith("unusable (")
    assert report.calibration_text({}) == "not reported by the server"
