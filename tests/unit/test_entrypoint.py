"""The container entrypoint, run as the container runs it (a subprocess): dispatch, init's folders and key,
prepare's permission message, the MODE check and the GPU lock between the two server profiles."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


def entrypoint(*args, env=None, cwd=None):
    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "hyperqwen.entrypoint", *args], capture_output=True, text=True,
                          env=environ, cwd=cwd, timeout=120)


def test_mode_refuses_to_start_when_verify_fails(tmp_path):
    # No model in MODELS_DIR (and no GPU here): verify reports FAIL lines and the server is not started.
    result = entrypoint("single", env={"MODELS_DIR": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 1
    assert "FAIL" in result.stdout
    assert "not starting the server" in result.stderr and "SKIP_VERIFY" in result.stderr


def test_skip_verify_goes_straight_to_serve(tmp_path):
    result = entrypoint("batch", env={"MODELS_DIR": str(tmp_path), "SKIP_VERIFY": "true"}, cwd=tmp_path)
    # serve's own preflight then stops on the missing model, naming prepare: proof it got to serve.
    assert result.returncode == 2
    assert "no checkpoint at" in result.stderr and "prepare" in result.stderr
    assert "FAIL" not in result.stdout


def test_bad_skip_verify_value_is_a_clean_error(tmp_path):
    result = entrypoint("single", env={"SKIP_VERIFY": "perhaps"}, cwd=tmp_path)
    # The settings loader's own message, in one line.
    [line] = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "SKIP_VERIFY='perhaps'" in line and "is not a boolean" in line


def test_init_reads_its_knobs_through_the_loader_and_ignores_unrelated_ones(tmp_path):
    # MAX_LEN is bad, but init reads only MODELS_DIR, API_KEY_FILE and VLLM_API_KEY: it still succeeds.
    env = {"MODELS_DIR": str(tmp_path / "m"), "XDG_CACHE_HOME": str(tmp_path / "c"), "API_KEY_FILE": "keys/k.txt",
           "MAX_LEN": "lots"}
    result = entrypoint("init", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m" / "keys" / "k.txt").is_file()


def test_init_refuses_a_bad_key_knob_in_one_line(tmp_path):
    env = {"MODELS_DIR": str(tmp_path / "m"), "XDG_CACHE_HOME": str(tmp_path / "c"), "VLLM_API_KEY": "zq9x"}
    result = entrypoint("init", env=env, cwd=tmp_path)
    [line] = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith("hyperqwen: VLLM_API_KEY") and "zq9x" not in line
    assert not (tmp_path / "m" / "api_key.txt").exists()


def test_bad_mode_is_one_line_naming_the_knob(tmp_path):
    result = entrypoint("single", env={"MODE": "both", "MODELS_DIR": str(tmp_path)}, cwd=tmp_path)
    [line] = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith("hyperqwen: MODE='both'") and "single | batch" in line


def test_any_other_command_is_executed(tmp_path):
    result = entrypoint("echo", "hello from the container", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "hello from the container\n"


def test_unknown_command_says_what_is_accepted(tmp_path):
    result = entrypoint("no-such-command-here", cwd=tmp_path)
    assert result.returncode == 127
    assert "single, batch" in result.stderr and "prepare, init, verify" in result.stderr


def test_verify_is_dispatched_with_its_arguments(tmp_path):
    result = entrypoint("verify", "--help", cwd=tmp_path)
    assert result.returncode == 0 and "--install" in result.stdout


# --- init / prepare: folders and permissions (issue: a root-owned ./models made prepare die in a traceback) ---

OTHER_UID = 1000  # the image's user; these tests run the entrypoint as that uid where the host lets them


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to create root-owned folders and to run as another uid (the container's case)")


@pytest.fixture
def shared_dir():
    """A world-traversable folder (pytest's tmp_path is 0700: another uid could not even reach it)."""
    path = Path(tempfile.mkdtemp(prefix="hq-entrypoint-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_init_creates_and_owns_root_owned_folders_and_the_key(shared_dir):
    """Docker creates a missing bind-mount folder as root; init (root, CHOWN only) hands it to the user."""
    needs_root()
    models, cache = shared_dir / "models", shared_dir / "cache"
    models.mkdir()
    (models / "leftover").mkdir()  # e.g. from an earlier root run
    os.chown(models, 0, 0)
    env = {"MODELS_DIR": str(models), "XDG_CACHE_HOME": str(cache), "HYPERQWEN_UID": "1000",
           "HYPERQWEN_GID": "1000", "HYPERQWEN_MODELS_HOST": "./models"}
    result = entrypoint("init", env=env, cwd=shared_dir)
    assert result.returncode == 0, result.stderr
    for path in (models, models / "leftover", cache):
        assert (path.stat().st_uid, path.stat().st_gid) == (1000, 1000), path
    key = models / "api_key.txt"
    assert key.stat().st_uid == 1000 and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(key.read_text().strip()) == 32  # secrets.token_hex(16), like `openssl rand -hex 16`
    assert "created an API key in ./models/api_key.txt" in result.stderr
    assert "Traceback" not in result.stderr
    # Run again: nothing to do, the key is kept.
    before = key.read_text()
    assert entrypoint("init", env=env, cwd=shared_dir).returncode == 0
    assert key.read_text() == before


def test_init_with_a_key_in_the_environment_writes_that_key(shared_dir):
    """The WebUI reads the key through a compose secret, whose file must exist even when .env holds the key."""
    needs_root()
    key = "hq-from-env-0123456789abcdef"
    result = entrypoint("init", env={"MODELS_DIR": str(shared_dir / "m"), "XDG_CACHE_HOME": str(shared_dir / "c"),
                                     "VLLM_API_KEY": key, "HYPERQWEN_UID": "1000", "HYPERQWEN_GID": "1000"},
                        cwd=shared_dir)
    assert result.returncode == 0, result.stderr
    path = shared_dir / "m" / "api_key.txt"
    assert path.read_text() == key + "\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key not in result.stdout + result.stderr, "the key is never printed"


def test_init_reports_a_folder_it_cannot_fix_in_one_line(shared_dir):
    """Not root (rootless Docker, init without its capabilities): the folder stays unwritable; one line, exit 1."""
    models = shared_dir / "models"
    unwritable_folder(models)
    result = run_unprivileged("init", env={"MODELS_DIR": str(models), "XDG_CACHE_HOME": str(shared_dir / "c"),
                                           "HYPERQWEN_MODELS_HOST": "./models"}, cwd=shared_dir)
    models.chmod(0o755)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "./models (" in result.stderr and "sudo chown -R" in result.stderr


def run_unprivileged(*args, env=None, cwd=None):
    """The entrypoint as a non-root user, as in the container: this user when not root (CI), else uid 1000."""
    environ = {"PATH": os.environ["PATH"], "HOME": "/tmp"}
    environ.update(env or {})
    argv = [sys.executable, "-m", "hyperqwen.entrypoint", *args]
    as_other = {"user": OTHER_UID, "group": OTHER_UID} if os.geteuid() == 0 else {}
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=environ, cwd=cwd, timeout=120, **as_other)
    except PermissionError:
        pytest.skip(f"running as root and uid {OTHER_UID} cannot execute {sys.executable}; runs as a non-root user")


def unwritable_folder(path: Path) -> tuple[int, int]:
    """A folder the unprivileged run cannot write (root-owned, as Docker creates it); returns its owner."""
    path.mkdir()
    if os.geteuid() == 0:
        os.chown(path, 0, 0)
        path.chmod(0o755)
        return 0, 0
    path.chmod(0o555)  # not root: our own folder, made read-only
    return os.getuid(), os.getgid()


def test_prepare_on_a_root_owned_folder_is_one_line_naming_the_chown(shared_dir):
    """What the user hits without init (plain `docker run ... prepare` on a folder Docker created as root)."""
    models = shared_dir / "models"
    owner = unwritable_folder(models)
    result = run_unprivileged("prepare", env={"MODELS_DIR": str(models), "HYPERQWEN_MODELS_HOST": "./models",
                                              "HF_HUB_OFFLINE": "1"}, cwd=shared_dir)
    models.chmod(0o755)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [ln for ln in result.stderr.splitlines() if ln.strip()]
    uid = OTHER_UID if os.geteuid() == 0 else os.getuid()
    assert line.startswith(f"hyperqwen: ./models ({models} in the container) is owned by {owner[0]}:{owner[1]}")
    assert f"sudo chown -R {uid}:" in line and line.endswith(" ./models")


def test_permission_line_names_the_host_path_and_the_fix(tmp_path, monkeypatch):
    from hyperqwen import entrypoint as ep

    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("HYPERQWEN_MODELS_HOST", "/srv/models")
    line = ep.permission_line(tmp_path / "qwen3.8-27b" / ".lock", 1000, 1000)
    assert line.startswith("/srv/models/qwen3.8-27b/.lock (")
    assert "sudo chown -R 1000:1000 /srv/models/qwen3.8-27b" in line
    cache_line = ep.permission_line(Path("/cache/vllm"), 1000, 1000)
    assert "docker compose run --rm --user 0 init" in cache_line


# --- single/batch: MODE from .env and the GPU lock -----------------------------------------------------------


def test_mode_in_env_that_contradicts_the_profile_is_refused(tmp_path):
    result = entrypoint("single", env={"MODE": "batch", "MODELS_DIR": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "MODE=batch" in line and "--profile batch" in line and "FAIL" not in result.stdout


def test_mode_in_env_that_agrees_with_the_profile_is_fine(tmp_path):
    result = entrypoint("batch", env={"MODE": "batch", "MODELS_DIR": str(tmp_path), "SKIP_VERIFY": "true"},
                        cwd=tmp_path)
    assert result.returncode == 2 and "no checkpoint at" in result.stderr  # reached serve's preflight


def _start(mode, lock, cwd):
    environ = {"PATH": os.environ["PATH"], "HOME": "/tmp", "MODELS_DIR": str(cwd), "HYPERQWEN_GPU_LOCK": str(lock),
               "HYPERQWEN_GPU_LOCK_SETTLE_S": "2"}
    return subprocess.Popen([sys.executable, "-m", "hyperqwen.entrypoint", mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environ, cwd=cwd)


def test_both_server_profiles_at_once_are_refused_before_either_loads(tmp_path):
    """`--profile single --profile batch`: both servers start together with the same lock on the shared volume
    (test_compose.py::test_both_server_profiles_share_one_gpu_lock renders that); both refuse, neither runs
    verify or loads, and both idle instead of exiting into the restart policy."""
    lock = tmp_path / "cache" / "locks" / "gpu-0"
    procs = [_start(mode, lock, tmp_path) for mode in ("single", "batch")]
    try:
        time.sleep(8)
        assert all(p.poll() is None for p in procs), "a refused server idles (no restart loop)"
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=30) for p in procs]
    for (stdout, stderr), other in zip(outputs, ("batch", "single"), strict=True):
        assert f"the {other} server of this stack is on the same GPU; select one server profile" in stderr
        assert "FAIL" not in stdout and "verify" not in stdout, "refused before verify or the model load"


def test_a_lone_server_passes_the_lock(tmp_path):
    lock = tmp_path / "cache" / "locks" / "gpu-0"
    proc = _start("single", lock, tmp_path)
    stdout, stderr = proc.communicate(timeout=120)
    # Past the lock: verify runs and fails on the missing model (no GPU, no checkpoint here).
    assert proc.returncode == 1 and "FAIL" in stdout and "same GPU" not in stderr


def test_a_later_second_profile_is_refused_while_the_first_runs(tmp_path):
    lock = tmp_path / "locks" / "gpu-0"
    lock.parent.mkdir(parents=True)
    with open(lock.with_name("gpu-0.single"), "w") as held:  # a running single server holds its lock
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = _start("batch", lock, tmp_path)
        time.sleep(5)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert "the single server of this stack is on the same GPU" in stderr
