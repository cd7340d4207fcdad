"""`unique_inverse` (vramscope/common/arrays.py) is np.unique(..., return_inverse=True), by a
table over the values' range where it is narrow: the same values, dtype and inverse."""
from __future__ import annotations

import numpy as np
import pytest

from vramscope.common.arrays import unique_inverse


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16, np.uint8, np.uint32])
@pytest.mark.parametrize("case", ["narrow", "negative", "one value", "wide", "empty", "big ids"])
def test_unique_inverse_is_np_unique(dtype, case):
    rng = np.random.default_rng(3)
    if case == "narrow":
        v = rng.integers(0, 200, 5000)
    elif case == "negative":
        v = rng.integers(-3, 100, 5000)
    elif case == "one value":
        v = np.full(100, 7)
    elif case == "wide":
        v = rng.integers(0, 1 << 30, 300)
    elif case == "empty":
        v = np.zeros(0)
    else:
        v = rng.integers(1 << 20, (1 << 20) + 4000, 10000)
    if np.dtype(dtype).kind == "u":
        v = np.abs(v)
    info = np.iinfo(dtype)
    v = np.clip(v, info.min, info.max).astype(dtype)
    u, inv = unique_inverse(v)
    eu, einv = np.unique(v, return_inverse=True)
    assert u.dtype == eu.dtype and np.array_equal(u, eu)
    assert np.array_equal(inv, einv.reshape(-1)) and np.array_equal(u[inv], v)


def test_unsigned_values_past_the_signed_range_go_to_np_unique():
    v = np.array([2**64 - 1, 2**64 - 3, 2**64 - 1], dtype=np.uint64)
    u, inv = unique_inverse(v)
    assert u.tolist() == [2**64 - 3, 2**64 - 1] and inv.tolist() == [1, 0, 1]


def test_floats_go_to_np_unique():
    v = np.array([0.5, 0.25, 0.5])
    u, inv = unique_inverse(v)
    assert u.tolist() == [0.25, 0.5] and inv.tolist() == [1, 0, 1]
