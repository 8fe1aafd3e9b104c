"""The lab's wheel list is the image's lock, filtered, never a second list."""

from __future__ import annotations

import pytest
from gpu_lab.wheels import (
    HOST_PROVIDES,
    IMAGE_LOCK,
    NOT_LOADED_BY_A_LAB_BOOT,
    LockError,
    canonical,
    lab_pins,
    read_lock,
)


def test_lab_list_is_the_image_lock_less_the_skips():
    image = read_lock(IMAGE_LOCK)
    lab = lab_pins(image)
    skipped = {canonical(n) for n in (*HOST_PROVIDES, *NOT_LOADED_BY_A_LAB_BOOT)}
    assert lab == {name: version for name, version in image.items() if name not in skipped}
    assert lab["vllm"] == "0.32.0" and lab["torch"] == image["torch"]


def test_every_skip_names_a_package_the_image_pins():
    # A skip that matches nothing is a stale entry (the image's lock changed): keep the tables honest.
    image = read_lock(IMAGE_LOCK)
    stale = [n for n in (*HOST_PROVIDES, *NOT_LOADED_BY_A_LAB_BOOT) if canonical(n) not in image]
    assert stale == []


def test_a_lock_that_loses_a_need_is_refused():
    image = read_lock(IMAGE_LOCK)
    del image["tokenizers"]
    with pytest.raises(LockError, match="would lack tokenizers"):
        lab_pins(image)


def test_a_line_that_is_not_a_pin_is_refused(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("# comment\nvllm==0.32.0\ntorch>=2\n")
    with pytest.raises(LockError, match=r"lock.txt:3: 'torch>=2' is not a name==version pin"):
        read_lock(lock)
