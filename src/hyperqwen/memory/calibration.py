"""Calibration: vLLM's own start numbers on the user's card, kept beside the model, used by the planner.

`hyperqwen calibrate` boots a mode once and reads what vLLM 0.32.0 logs while it sizes the KV pool (the
model loading, the profiled activation peak, the CUDA-graph estimate, the non-torch memory, the pool). This
module owns that log's grammar (parse_vllm_log, also used by the GPU lab's records), the calibration file
(CALIBRATION_FILE in the model folder: one measurement per configuration and card) and the match the planner
makes: a measurement applies when the card and every setting that changes the non-KV terms are the same.

How a measurement becomes planner terms (vLLM's arithmetic, v1/worker/gpu_worker.py): the pool it sizes is
requested - consumed - peak, where consumed = weights + non-torch and peak = activation + graph estimate.
So WEIGHTS = model loading, CUDA_GRAPHS = graph estimate + non-torch (consumed - model loading) and
ACTIVATION_PEAK = peak - graph estimate: their sum is exactly what vLLM took from the pool, whatever the split.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperqwen.config.sizes import GiB, MiB

if TYPE_CHECKING:
    from hyperqwen.memory.gpu import GpuFacts

CALIBRATION_FILE = "hyperqwen-calibration.json"
FORMAT = 1
# Two readings of one card's total (nvidia-smi through the card table, or CUDA) differ by far less than this;
# two different cards of one name and different memory (a 3080 10 GB and 12 GB) by far more.
SAME_CARD_TOLERANCE = 256 * MiB

# vLLM 0.32.0's own log lines (file: format string), parsed as written there.
VLLM_LOG_PATTERNS = {
    # vllm/v1/worker/gpu_model_runner.py: "Model loading took %s GiB memory and %.6f seconds"
    "model_loading": re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds"),
    # vllm/v1/worker/gpu_worker.py: "Available KV cache memory: %s GiB"
    "available_kv": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    # vllm/v1/core/kv_cache_utils.py: "%s KV cache size: %s tokens, Maximum concurrency for %s tokens ..."
    "pool": re.compile(
        r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
    ),
    # vllm/v1/worker/gpu_worker.py, after graph capture: the consumed/peak/graph split of the start profile
    "usage": re.compile(
        r"Actual usage is ([\d.]+) GiB for consumed memory \(weights \+ non-torch\), ([\d.]+) GiB "
        r"for peak activation, and ([\d.]+) GiB for CUDAGraph memory"
    ),
    "requested": re.compile(r"Desired GPU memory utilization is \(([\d.]+), ([\d.]+) GiB\)"),
    # vllm/v1/worker/gpu_model_runner.py: "Graph capturing finished in %.0f secs, took %.2f GiB"
    "graphs": re.compile(r"Graph capturing finished in (\d+) secs, took ([\d.]+) GiB"),
    # vllm/v1/engine/core.py: "init engine (profile, create kv cache, warmup model) took %.2f s ..."
    "init": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s(?: \(compilation: ([\d.]+) s)?"
    ),
    # vllm/compilation/monitor.py: "Initial profiling/warmup run took %.2f s" (once per compiled model: the
    # target's backbone, then a drafter's head)
    "first_profile_run": re.compile(r"Initial profiling/warmup run took ([\d.]+) s"),
    # vllm/v1/worker/gpu_worker.py: "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), ..."
    "graph_pool": re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\), ([\d.]+) GiB \(estimated\)"),
}
# The numbers a measurement cannot do without (the rest are kept when vLLM printed them).
REQUIRED = (
    "model_loading_gib",
    "available_kv_gib",
    "pool_tokens",
    "max_concurrency",
    "consumed_gib",
    "peak_activation_gib",
    "cuda_graph_gib",
    "init_seconds",
)
# A boot that failed: the last line that names the cause, as vLLM or Python printed it.
FAILURE = re.compile(r"(Error|error|Exception|CUDA out of memory|No available memory|exceeds)")


class CalibrationError(ValueError):
    """A calibration file that cannot be used, or a log that lacks a number: one line naming it."""


def parse_vllm_log(text: str) -> dict[str, Any]:
    """vLLM's start numbers from its log; a key is absent when its line is (the last line wins)."""
    found: dict[str, Any] = {}

    def last(name: str) -> re.Match[str] | None:
        matches = list(VLLM_LOG_PATTERNS[name].finditer(text))
        return matches[-1] if matches else None

    if m := last("model_loading"):
        found["model_loading_gib"], found["model_loading_seconds"] = float(m[1]), float(m[2])
    if m := last("available_kv"):
        found["available_kv_gib"] = float(m[1])
    if m := last("pool"):
        found["pool_tokens"] = int(m[1].replace(",", ""))
        found["max_model_len"] = int(m[2].replace(",", ""))
        found["max_concurrency"] = float(m[3])
    if m := last("usage"):
        found["consumed_gib"], found["peak_activation_gib"], found["cuda_graph_gib"] = map(float, m.groups())
    if m := last("requested"):
        found["gpu_util"], found["requested_gib"] = float(m[1]), float(m[2])
    graphs = list(VLLM_LOG_PATTERNS["graphs"].finditer(text))
    if graphs:
        found["graph_capture_gib"] = [float(g[2]) for g in graphs]
    if m := last("init"):
        found["init_seconds"] = float(m[1])
        if m[2]:
            found["compile_seconds"] = float(m[2])
    runs = [float(m[1]) for m in VLLM_LOG_PATTERNS["first_profile_run"].finditer(text)]
    if runs:
        found["first_profile_run_seconds"] = max(runs)
    if m := last("graph_pool"):
        found["graph_pool_actual_gib"], found["graph_estimate_gib"] = float(m[1]), float(m[2])
    if "consumed_gib" in found and "model_loading_gib" in found:
        found["non_torch_gib"] = round(found["consumed_gib"] - found["model_loading_gib"], 2)
    return found


def missing_numbers(numbers: Mapping[str, Any]) -> list[str]:
    return [key for key in REQUIRED if key not in numbers]


# vLLM's front end ends a failed engine start with a line that only points back at the real cause
# ("RuntimeError: Engine core initialization failed. See root cause above."): the reason is the line before it.
WRAPPER = re.compile(r"See root cause above|EngineCore failed to start|^Traceback|\] Traceback")
# A traceback's source lines (`raise RuntimeError(`, `File "...", line 3`) name an error class, not a reason.
TRACEBACK_CODE = re.compile(r"(raise |File \"|\^)")
# vLLM's log prefix: "(EngineCore pid=3923) ERROR 12-03 07:38:05 [core.py:1510] ".
VLLM_PREFIX = re.compile(r"^\([^)]*\)\s+[A-Z]+\s+\S+\s+\S+\s+\[[^\]]*\]\s*")


def _message(line: str) -> str:
    return VLLM_PREFIX.sub("", line)


def failure_reason(text: str) -> str:
    """The last line of a log that names why a boot failed (vLLM's or Python's), without vLLM's log prefix and
    cut to one screen line; past a line that only points back at an earlier cause."""
    lines = [line.strip() for line in text.splitlines() if FAILURE.search(line) and "Warning" not in line]
    causes = [line for line in lines if not WRAPPER.search(line) and not TRACEBACK_CODE.match(_message(line))]
    chosen = causes or lines
    return _message(chosen[-1])[:400] if chosen else "no error line in the log (timed out?)"


def measured_terms(numbers: Mapping[str, Any]) -> dict[str, int]:
    """Planner terms (knob names) from vLLM's numbers: what vLLM took from the pool, split as the planner does."""
    estimate = float(numbers.get("graph_estimate_gib", 0.0))
    return {
        "WEIGHTS": round(numbers["model_loading_gib"] * GiB),
        "CUDA_GRAPHS": round((numbers["consumed_gib"] - numbers["model_loading_gib"] + estimate) * GiB),
        "ACTIVATION_PEAK": max(round((numbers["peak_activation_gib"] - estimate) * GiB), 0),
    }


def _card_name(name: str) -> str:
    return re.sub(r"^(nvidia\s+)?(geforce\s+)?", "", name.strip().lower())


@dataclass(frozen=True)
class Measurement:
    """One calibrated boot: the card, the settings key, vLLM's numbers and the planner's guess beside them."""

    mode: str
    date: str
    gpu_name: str
    gpu_total_bytes: int
    vllm_version: str
    compile_cache: str  # "cold": a fresh compile cache, as a first start or any changed setting gets
    key: Mapping[str, Any]
    vllm: Mapping[str, Any]
    planner: Mapping[str, Any] = field(default_factory=dict)

    @property
    def terms(self) -> dict[str, int]:
        return measured_terms(self.vllm)

    def same_card(self, gpu: GpuFacts) -> bool:
        same_size = abs(gpu.total_bytes - self.gpu_total_bytes) <= SAME_CARD_TOLERANCE
        return same_size or _card_name(gpu.name) == _card_name(self.gpu_name)

    def describe(self) -> str:
        return (
            f"{self.gpu_name}, {self.date}, {self.mode} mode, {self.compile_cache} start: vLLM gave "
            f"{self.vllm['available_kv_gib']:.2f} GiB = {self.vllm['pool_tokens']:,} tokens"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "date": self.date,
            "gpu": {"name": self.gpu_name, "total_bytes": self.gpu_total_bytes},
            "vllm_version": self.vllm_version,
            "compile_cache": self.compile_cache,
            "key": dict(self.key),
            "vllm": dict(self.vllm),
            "terms_bytes": self.terms,
            "planner": dict(self.planner),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str) -> Measurement:
        try:
            measurement = cls(
                mode=str(doc["mode"]),
                date=str(doc["date"]),
                gpu_name=str(doc["gpu"]["name"]),
                gpu_total_bytes=int(doc["gpu"]["total_bytes"]),
                vllm_version=str(doc["vllm_version"]),
                compile_cache=str(doc["compile_cache"]),
                key=dict(doc["key"]),
                vllm=dict(doc["vllm"]),
                planner=dict(doc.get("planner") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"{where}: a measurement lacks {exc} (rerun `hyperqwen calibrate`)") from None
        missing = missing_numbers(measurement.vllm)
        if missing:
            raise CalibrationError(f"{where}: a measurement lacks vLLM's {', '.join(missing)} (rerun calibrate)")
        return measurement


def calibration_path(model_dir: Path) -> Path:
    return Path(model_dir) / CALIBRATION_FILE


def read_calibration(model_dir: Path) -> list[Measurement]:
    """The measurements beside the model ([] without a file). A file that cannot be used: CalibrationError."""
    path = calibration_path(model_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CalibrationError(f"{path}: not JSON ({exc}); delete it or rerun `hyperqwen calibrate`") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("measurements"), list):
        raise CalibrationError(
            f"{path}: not a format-{FORMAT} calibration file; delete it or rerun `hyperqwen calibrate`"
        )
    return [Measurement.from_dict(m, str(path)) for m in doc["measurements"]]


def find_measurement(
    measurements: list[Measurement], key: Mapping[str, Any], gpu: GpuFacts
) -> tuple[Measurement | None, str]:
    """The newest measurement for this card and settings key, and one line saying what was (not) used."""
    if not measurements:
        return None, ""
    on_card = [m for m in measurements if m.same_card(gpu)]
    matching = [m for m in on_card if dict(m.key) == dict(key)]
    if matching:
        best = max(matching, key=lambda m: m.date)
        return best, f"memory terms measured on this card by `hyperqwen calibrate` ({best.describe()})"
    if not on_card:
        cards = ", ".join(sorted({m.gpu_name for m in measurements}))
        return None, f"calibration beside the model is for {cards}, not {gpu.name}: planner estimates used"
    differs = sorted(k for k in key if all(m.key.get(k) != key[k] for m in on_card))
    return None, (
        f"calibration beside the model was measured with other settings ({', '.join(differs) or 'several'} "
        "differ): planner estimates used; `hyperqwen calibrate` with these settings measures them"
    )


def merged_document(existing: list[Measurement], new: Measurement) -> dict[str, Any]:
    """The file's new content: the new measurement replaces an older one of the same card and settings key."""
    kept = [
        m
        for m in existing
        if not (dict(m.key) == dict(new.key) and abs(m.gpu_total_bytes - new.gpu_total_bytes) <= SAME_CARD_TOLERANCE)
    ]
    return {"format": FORMAT, "measurements": [m.to_dict() for m in [*kept, new]]}


def write_calibration(model_dir: Path, new: Measurement) -> Path:
    """Add a measurement to the model's calibration file, atomically: a crash leaves the old file whole."""
    path = calibration_path(model_dir)
    try:
        existing = read_calibration(model_dir)
    except CalibrationError:
        existing = []  # an unusable file is replaced, not merged
    payload = json.dumps(merged_document(existing, new), indent=1) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
