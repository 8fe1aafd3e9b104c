"""Records from a boot: vLLM's numbers parsed from a captured log, and no partial record taken as truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpu_lab.records import RecordError, build_record, failure_reason, parse_vllm_log

DATA = Path(__file__).parent / "data"
# vLLM 0.32.0's own lines from the first lab boot (single mode, an H200 given a 3090's budget, cold), trimmed to
# the lines a record reads: scripts/gpu_lab/device.py wrote the whole log.
CAPTURED = DATA / "serve-h200-as-rtx3090-single-cold.log"


def test_numbers_from_a_captured_cuda_log():
    found = parse_vllm_log(CAPTURED.read_text())
    assert found["model_loading_gib"] == 14.8
    assert found["available_kv_gib"] == 5.31
    assert (found["pool_tokens"], found["max_model_len"], found["max_concurrency"]) == (72860, 65536, 1.11)
    assert (found["consumed_gib"], found["peak_activation_gib"], found["cuda_graph_gib"]) == (15.11, 1.5, 0.11)
    assert found["non_torch_gib"] == 0.31
    assert found["graph_capture_gib"] == [0.23, 0.11]
    assert found["graph_estimate_gib"] == 0.25
    assert (found["init_seconds"], found["compile_seconds"]) == (337.46, 71.15)
    assert found["first_profile_run_seconds"] == 102.84  # the backbone's, not the drafter head's 0.01 s
    assert (found["gpu_util"], found["requested_gib"]) == (0.156725, 21.91)


def _boot(tmp_path: Path, status: str, log: str, plan: dict | None = None) -> Path:
    boot = tmp_path / "00-single-default"
    boot.mkdir()
    meta = {"name": "single-default", "mode": "single", "set": {}, "card": "rtx3090", "emulated_gpu_util": 0.156725,
            "compile_cache": "cold", "triton_cache_entries_before": 0, "stack": {"gpu": "NVIDIA H200"},
            "boot_seconds": 490.3, "status": status, "requests": {"roundtrip": {"status": 200}}}
    (boot / "meta.json").write_text(json.dumps(meta))
    (boot / "serve.log").write_text(log)
    (boot / "plan.json").write_text(json.dumps(plan or {
        "pool_bytes": 5_544_597_259, "pool_tokens": 70_933, "max_concurrency": 1.08, "max_model_len": 65536,
        "outcome": "fits", "terms": {"weights": {"bytes": 1, "source": "x"}},
        "weights_bytes": {"body": 15_178_606_368, "vision": 921_460_192, "mtp": 431_361_152, "drafter": 431_361_152,
                          "resident": 15_899_877_812},
        "resolved": {"language_model_only": True}}))
    return boot


def test_a_served_boot_becomes_a_record_with_the_planner_beside_vllm(tmp_path):
    boot = _boot(tmp_path, "served", CAPTURED.read_text())
    record = build_record(boot, "2026-12-02")
    assert record["vllm"]["pool_tokens"] == 72860 and record["planner"]["pool_tokens"] == 70933
    assert record["planner_vs_vllm_pool"] == round(70933 / 72860 - 1, 4)
    # the headers' weights (body + the drafter's own), not the planner's term (+ CUDA's load overhead)
    assert record["planner"]["header_weights_bytes"] == 15_178_606_368 + 431_361_152


def test_a_served_boot_whose_log_lacks_a_number_is_not_recorded(tmp_path):
    lines = [line for line in CAPTURED.read_text().splitlines() if "KV cache size" not in line]
    boot = _boot(tmp_path, "served", "\n".join(lines))
    with pytest.raises(RecordError, match="lacks pool_tokens, max_concurrency; not recorded as truth"):
        build_record(boot, "2026-12-02")


def test_a_failed_boot_is_recorded_as_a_failure_with_vllms_reason(tmp_path):
    # The shape of vLLM's own out-of-memory line at boot (constructed: no lab boot has run out of memory yet).
    log = CAPTURED.read_text().splitlines()[0] + (
        "\n(EngineCore pid=1669) ERROR 12-02 15:38:40 [core.py:1093] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB\n"
    )
    record = build_record(_boot(tmp_path, "failed", log), "2026-12-02")
    assert "CUDA out of memory" in record["failure"] and "vllm" not in record
    # what vLLM had logged before it failed is kept apart from a served boot's numbers
    assert record["vllm_before_failure"] == {"model_loading_gib": 14.8, "model_loading_seconds": 20.989571}


def test_the_committed_recordings_hold_what_a_record_needs():
    for path in sorted((Path(__file__).resolve().parents[3] / "docs" / "data" / "gpu").glob("*.json")):
        record = json.loads(path.read_text())
        assert record["stack"]["vllm"] == "0.32.0" and record["emulated_card"] == "rtx3090", path.name
        if record["status"] == "served":
            assert record["vllm"]["pool_tokens"] > 0 and record["planner"]["pool_tokens"] > 0, path.name


def test_a_failed_engine_start_is_recorded_with_the_root_cause_not_the_line_pointing_at_it(tmp_path):
    # The shape of vLLM 0.32.0's log when the engine core fails to start (a RAM_CACHE boot on the lab's H200,
    # 2026-12-03): the engine's traceback, the front end's copy, then a RuntimeError pointing back at them.
    cause = "OSError: Can't load image processor for '/tmp/models/m'."
    log = "\n".join([
        "(EngineCore pid=3923) ERROR 12-03 07:38:05 [core.py:1510] EngineCore failed to start.",
        "(EngineCore pid=3923) ERROR 12-03 07:38:05 [core.py:1510] Traceback (most recent call last):",
        "(EngineCore pid=3923) ERROR 12-03 07:38:05 [core.py:1510]     raise OSError(",
        f"(EngineCore pid=3923) ERROR 12-03 07:38:05 [core.py:1510] {cause}",
        "Traceback (most recent call last):",
        '  File "/x/vllm/v1/engine/core_client.py", line 3, in <module>',
        "    raise RuntimeError(",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ])
    assert failure_reason(log) == cause
    record = build_record(_boot(tmp_path, "failed", log), "2026-12-03")
    assert record["failure"] == cause


def test_a_served_boot_keeps_its_speed_run_its_draft_counts_and_the_gpu_memory_in_use(tmp_path):
    boot = _boot(tmp_path, "served", CAPTURED.read_text())
    meta = json.loads((boot / "meta.json").read_text())
    (boot / "meta.json").write_text(json.dumps({**meta, "gpu_used_mib_serving": 21735}))
    (boot / "metrics.txt").write_text(
        'vllm:spec_decode_num_drafts_total{engine="0"} 276.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 2208.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 1559.0\n'
    )
    ladder = {"params": {"concurrency": "1,4"}, "gates": {"requests": {"passed": True}},
              "results": {"steps": [{"requests": 1, "aggregate_tok_s": 71.1}]}, "environment": {"bench_host": {}}}
    (boot / "bench-ladder.json").write_text(json.dumps(ladder))
    record = build_record(boot, "2026-12-03")
    assert record["gpu_used_mib_serving"] == 21735
    assert record["spec_decode"] == {"drafts": 276.0, "draft_tokens": 2208.0, "accepted_tokens": 1559.0}
    assert record["bench_ladder"] == {key: ladder[key] for key in ("params", "gates", "results")}
