"""One byte-size rule for every knob and flag (config/sizes.py): GB = 10^9, GiB = 2^30, bare G = GiB."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperqwen.config.sizes import UNITS, SizeError, parse_size


@pytest.mark.parametrize("text,expected", [
    ("5368709120", 5368709120), ("5GiB", 5 * 1024**3), ("5G", 5 * 1024**3), ("5g", 5 * 1024**3),
    ("5GB", 5 * 10**9), ("5gb", 5 * 10**9), ("512MiB", 512 * 1024**2), ("512MB", 512 * 10**6),
    ("1.5G", 1610612736), ("24 GiB", 24 * 1024**3), ("1TB", 10**12), ("1TiB", 1024**4), ("7B", 7),
])
def test_examples(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-5GiB", "5 GiBs", "5XB", "1.5", "1e9", "nan", "inf", "5,0G", "0x10"])
def test_not_sizes(text):
    with pytest.raises(SizeError):
        parse_size(text)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(UNITS)))
def test_whole_numbers_multiply_by_the_unit(number, unit):
    assert parse_size(f"{number}{unit}") == number * UNITS[unit]
    assert parse_size(f"{number}{unit.upper()}") == number * UNITS[unit]


@given(st.integers(min_value=1, max_value=10**4))
def test_decimal_and_binary_units_differ_by_the_rule(number):
    assert parse_size(f"{number}GB") == number * 10**9
    assert parse_size(f"{number}GiB") == parse_size(f"{number}G") == number * 2**30
    assert parse_size(f"{number}GB") < parse_size(f"{number}GiB")
