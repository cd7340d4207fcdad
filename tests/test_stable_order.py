"""common/arrays.py `stable_order`: numpy's stable argsort (ties in their order), by one sort of
composite keys where they fit an int64, by the argsort itself where they do not."""
from __future__ import annotations

import numpy as np
import pytest

from vramscope.common.arrays import stable_order


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.uint64])
def test_the_same_order_as_a_stable_argsort(descending, dtype):
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    for key in (rng.integers(0, 50, 10_000),                                 # many ties
                rng.integers(max(info.min, -(1 << 40)), min(info.max, 1 << 40), 10_000, dtype=np.int64),
                np.zeros(7, dtype=np.int64), np.arange(5)[::-1], np.array([3])):
        key = key.astype(dtype)
        want = np.argsort(-key.astype(np.float64) if descending else key, kind="stable")
        got = stable_order(key, descending=descending)
        assert got.dtype == np.int32
        assert np.array_equal(got, want)


def test_keys_too_wide_for_one_int64_fall_back_to_the_argsort():
    key = np.array([1 << 62, -(1 << 62), 0, 1 << 62, 5], dtype=np.int64)
    assert np.array_equal(stable_order(key), np.argsort(key, kind="stable"))
    assert np.array_equal(stable_order(key, descending=True), [0, 3, 4, 2, 1])


def test_the_ends_of_an_integer_type_keep_their_order():
    i64 = np.iinfo(np.int64)
    key = np.array([i64.min, 0, i64.max, i64.min, 7], dtype=np.int64)
    assert np.array_equal(stable_order(key), [0, 3, 1, 4, 2])
    assert np.array_equal(stable_order(key, descending=True), [2, 4, 1, 0, 3])
    u = np.array([2**64 - 1, 0, 2**63, 2**64 - 1], dtype=np.uint64)
    assert np.array_equal(stable_order(u), [1, 2, 0, 3])
    assert np.array_equal(stable_order(u, descending=True), [0, 3, 2, 1])


def test_empty_and_non_integer_keys():
    assert len(stable_order(np.zeros(0, dtype=np.int64))) == 0
    f = np.array([0.5, -1.0, 0.5, 2.0])
    assert np.array_equal(stable_order(f, descending=True), [3, 0, 2, 1])
