"""GPUS and TP checks: refused before anything starts, naming the knob (replicas/gpus.py)."""

from __future__ import annotations

import pytest

from hyperqwen.replicas.gpus import Gpu, check_gpus, parse_gpu_list, replica_groups

# A fake machine for the device checks (no GPU here): four cards as nvidia-smi would list them.
FOUR = [Gpu(str(i), f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd") for i in range(4)]


def test_a_list_of_indexes_and_uuids_parses():
    gpus, problems = parse_gpu_list(" 0, 1,GPU-00000002-aaaa-bbbb-cccc-dddddddddddd ,03")
    assert problems == []
    assert gpus == ("0", "1", "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd", "3")


@pytest.mark.parametrize("raw", ["", "0,,1", "0,", "zero", "0;1", "gpu0"])
def test_malformed_lists_are_refused_naming_gpus(raw):
    _, problems = parse_gpu_list(raw)
    assert problems and all(p.knob == "GPUS" and p.severity == "error" for p in problems)


@pytest.mark.parametrize("raw", ["0,1,1", "1,01", "0,GPU-x1,GPU-x1"])
def test_duplicates_are_refused(raw):
    _, problems = parse_gpu_list(raw)
    assert any("twice" in p.message for p in problems)
    assert all(p.knob == "GPUS" for p in problems)


def test_a_missing_device_is_refused_listing_what_the_machine_has():
    problems = check_gpus(("0", "4"), FOUR, 1)
    assert len(problems) == 1 and problems[0].knob == "GPUS"
    assert "device 4" in problems[0].message and "3 (GPU-00000003" in problems[0].message


def test_an_index_and_its_uuid_are_the_same_card():
    problems = check_gpus(("1", FOUR[1].uuid), FOUR, 1)
    assert len(problems) == 1 and "one card twice" in problems[0].message


def test_unknown_machine_checks_only_the_grouping():
    assert check_gpus(("0", "7"), None, 1) == []
    problems = check_gpus(("0", "1", "2"), None, 2)
    assert [p.knob for p in problems] == ["TP"] and "groups of TP=2" in problems[0].message


def test_groups_of_tp_consecutive_cards():
    assert replica_groups(("0", "1", "2", "3"), 1) == [("0",), ("1",), ("2",), ("3",)]
    assert replica_groups(("0", "1", "2", "3"), 2) == [("0", "1"), ("2", "3")]
    assert check_gpus(("0", "1", "2", "3"), FOUR, 2) == []
