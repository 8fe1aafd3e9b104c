"""SIGKILL prepare at many seeded points; every re-run must finish with a byte-identical model.

Two kinds of kill, both a real SIGKILL of a real `python -m hyperqwen.prepare` process:
- at a chosen crash point (HYPERQWEN_PREPARE_CRASH_AT=N: the process kills itself when it reaches the N-th
  point: mid-tensor, before fsync, before rename, before recording progress, before publishing, ...);
- after a seeded random delay, from outside.
After each kill the model directory is either absent or a complete, verified old/new version.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hyperqwen.prepare.atomic import CRASH_ENV, CRASH_LOG_ENV
from hyperqwen.prepare.pipeline import MANIFEST_NAME
from hyperqwen.prepare.verify import verify_checkpoint

SEED = 20261130
SRC = str(Path(__file__).resolve().parents[3] / "src")


def _env(models: Path, source: Path, quantize_embed: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV, CRASH_LOG_ENV)}
    env.update(
        MODELS_DIR=str(models),
        MODEL="m",
        MODEL_SOURCE_DIR=str(source),
        QUANTIZE_EMBED="1" if quantize_embed else "0",
        PYTHONPATH=SRC + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hyperqwen.prepare", "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _assert_whole(model: Path, allowed: list[dict[str, bytes]]) -> None:
    """The model dir never shows a half state: absent, or exactly one of the allowed complete versions."""
    if not model.exists():
        return
    snap = _snapshot(model)
    assert MANIFEST_NAME in snap
    assert any(snap == version for version in allowed), sorted(snap)
    verify_checkpoint(model)


def _reference(tmp_path: Path, source: Path, quantize_embed: bool) -> dict[str, bytes]:
    models = tmp_path / f"reference-{quantize_embed}"
    result = _run(_env(models, source, quantize_embed))
    assert result.returncode == 0, result.stderr
    return _snapshot(models / "m")


def test_sigkill_at_seeded_crash_points_then_rerun_is_byte_identical(pristine_source, tmp_path):
    """~25-40 s on 2 cores (two or three ~1 s prepare processes per kill point, 14 points): slow because each
    kill needs a real process; kept to the fewest points that still cover every kind of crash point."""
    plain = _reference(tmp_path, pristine_source, False)
    embed = _reference(tmp_path, pristine_source, True)
    # How many crash points does an uninterrupted run pass? (fresh build, and a rebuild over an old model)
    counts = {}
    for name, prior in (("fresh", None), ("replace", False)):
        models = tmp_path / f"count-{name}"
        if prior is not None:
            assert _run(_env(models, pristine_source, prior)).returncode == 0
        log = tmp_path / f"count-{name}.log"
        assert _run(_env(models, pristine_source, True, **{CRASH_LOG_ENV: str(log)})).returncode == 0
        counts[name] = len(log.read_text().splitlines())
    assert counts["fresh"] > 20 and counts["replace"] > 10
    rng = random.Random(SEED)
    cases = [("fresh", n) for n in rng.sample(range(1, counts["fresh"] + 1), 8)]
    cases += [("replace", n) for n in rng.sample(range(1, counts["replace"] + 1), 6)]
    for i, (scenario, point) in enumerate(cases):
        models = tmp_path / f"crash-{i}"
        allowed = [embed]
        if scenario == "replace":
            assert _run(_env(models, pristine_source, False)).returncode == 0
            allowed.append(plain)
        killed = _run(_env(models, pristine_source, True, **{CRASH_ENV: str(point)}))
        assert killed.returncode == -signal.SIGKILL, (scenario, point, killed.stderr)
        _assert_whole(models / "m", allowed)
        finished = _run(_env(models, pristine_source, True))
        assert finished.returncode == 0, (scenario, point, finished.stderr)
        assert _snapshot(models / "m") == embed, (scenario, point)
        leftovers = [
            p.name
            for p in models.iterdir()
            if p.name not in ("m",) and not p.name.endswith(("-lock", "-verified.json"))
        ]
        assert leftovers == [], (scenario, point)


def test_sigkill_after_seeded_random_delays_then_rerun_is_byte_identical(pristine_source, tmp_path):
    started = time.monotonic()
    reference = _reference(tmp_path, pristine_source, True)
    # Kill within the time a whole run takes on this machine (import included), so kills land before, during
    # and after the work whether the machine is idle or loaded.
    whole_run_s = time.monotonic() - started
    rng = random.Random(SEED + 1)
    models = tmp_path / "timed"
    env = _env(models, pristine_source, True)
    kills = 0
    for _ in range(12):
        process = subprocess.Popen(
            [sys.executable, "-m", "hyperqwen.prepare", "--no-progress"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.02, 0.7) * whole_run_s)
        process.send_signal(signal.SIGKILL)
        killed = process.wait() == -signal.SIGKILL
        kills += killed
        _assert_whole(models / "m", [reference])
        if not killed:
            # The run finished before its kill (the machine got faster than when whole_run_s was measured):
            # every later run would be a no-op, so start the next one from nothing again.
            shutil.rmtree(models)
        if kills == 6:
            break
    assert kills >= 3
    finished = _run(env)
    assert finished.returncode == 0, finished.stderr
    assert _snapshot(models / "m") == reference
