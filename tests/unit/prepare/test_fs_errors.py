"""What the kernel refuses, end to end: one line naming the path and the fix, exit status 3, nothing published
half-way. Real file systems (tmpfs mounts: read-only, tiny, out of inodes), real over-long names, a real
SIGINT/SIGTERM of a real `python -m hyperqwen.prepare`; tests needing a mount skip where mounting is not allowed."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hyperqwen.prepare.errors import EXIT_FILESYSTEM, EXIT_SIGINT, EXIT_SIGTERM, FilesystemError, filesystem_error
from hyperqwen.prepare.pipeline import prepare

SRC = str(Path(__file__).resolve().parents[3] / "src")


@pytest.fixture
def mount_tmpfs(tmp_path):
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode:
            pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)


def _remount_ro(point: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)


def _cli(env_extra: dict[str, str], **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **env_extra}
    return subprocess.Popen(
        [sys.executable, "-m", "hyperqwen.prepare", "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("prepare: options:")]


def test_nothing_to_do_on_a_read_only_models_folder_succeeds(pristine_source, mount_tmpfs, make_options):
    models = mount_tmpfs("size=256m")
    options = make_options(pristine_source, models)
    assert prepare(options).changed
    _remount_ro(models)
    result = prepare(options)
    assert not result.changed
    # A run that would have to write says so in one line, naming the path and the fix, and keeps the model.
    import dataclasses

    with pytest.raises(FilesystemError) as info:
        prepare(dataclasses.replace(options, quantize_embed=True))
    text = str(info.value)
    assert "read-only" in text and str(models) in text and "fix:" in text and "MODELS_DIR" in text
    assert info.value.exit_code == EXIT_FILESYSTEM
    assert not prepare(options).changed  # the published model is untouched


def test_read_only_models_folder_through_the_cli_exits_3_with_one_message(pristine_source, mount_tmpfs):
    models = mount_tmpfs("size=8m")
    _remount_ro(models)
    proc = _cli({"MODELS_DIR": str(models / "sub"), "MODEL": "m", "MODEL_SOURCE_DIR": str(pristine_source)})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_FILESYSTEM, err
    assert "Traceback" not in err
    lines = _error_lines(err)
    assert lines[0].startswith(f"prepare: {models / 'sub'}: the file system is read-only"), err
    assert lines[1].strip().startswith("fix:")


def test_full_disk_with_free_inodes_is_not_called_out_of_inodes(mount_tmpfs):
    """ENOSPC on a file system with inodes to spare is a byte shortage, whatever digits the free count has
    (a count ending in 0, like 20, once read as "0 free inodes")."""
    models = mount_tmpfs("size=64k,nr_inodes=21")  # the root takes one: 20 free
    assert os.statvfs(models).f_favail == 20
    text = str(filesystem_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(models / "x"))))
    assert "no space left" in text and "20 free inodes" in text and "free space there" in text, text


def test_no_free_inodes(pristine_source, mount_tmpfs, make_options):
    models = mount_tmpfs("size=256m,nr_inodes=12")
    options = make_options(pristine_source, models)
    with pytest.raises(FilesystemError) as info:
        prepare(options)
    text = str(info.value)
    assert str(models) in text and "free inodes" in text and "fix:" in text, text
    assert not options.output_dir.exists()


def test_a_name_too_long(pristine_source, models_dir, make_options):
    options = make_options(pristine_source, models_dir, output_dir=models_dir / ("m" * 300))
    with pytest.raises(FilesystemError) as info:
        prepare(options)
    assert "file name too long" in str(info.value) and "shorter" in str(info.value)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errno.EACCES, "permission denied for user"),
        (errno.EPERM, "permission denied for user"),
        (errno.EDQUOT, "disk quota exceeded"),
        (errno.ENOSPC, "no space left"),
        (errno.EROFS, "read-only"),
        (errno.ENAMETOOLONG, "file name too long"),
    ],
)
def test_every_errno_class_names_the_path_and_a_fix(tmp_path, code, expected):
    # As root (these tests' usual user) EACCES and EDQUOT cannot be provoked for real; the message is checked here.
    error = filesystem_error(OSError(code, os.strerror(code), str(tmp_path / "x")))
    text = str(error)
    assert text.startswith(f"{tmp_path / 'x'}: ") and expected in text and "\n  fix: " in text
    assert error.exit_code == EXIT_FILESYSTEM


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, EXIT_SIGINT), (signal.SIGTERM, EXIT_SIGTERM)])
def test_ctrl_c_and_sigterm_end_with_one_line_and_nothing_published(tmp_path, sig, status):
    from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint

    source = tmp_path / "source"
    write_synthetic_checkpoint(source, SyntheticShape(vocab=40960, hidden=1024))  # a few seconds of work
    models = tmp_path / "models"
    proc = _cli({"MODELS_DIR": str(models), "MODEL": "m", "MODEL_SOURCE_DIR": str(source), "QUANTIZE_EMBED": "0"})
    deadline = time.monotonic() + 60
    while not (models / ".m.hyperqwen-staging").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("prepare finished before the signal arrived")
    assert proc.returncode == status, err
    assert "Traceback" not in err
    lines = _error_lines(err)
    # Progress lines may come first; the end is one line, the last one.
    assert "nothing was published half-way" in lines[-1], err
    assert sum("half-way" in line for line in lines) == 1, err
    assert not (models / "m").exists()
    assert not list(models.rglob("*.hyperqwen-tmp"))
