"""`isin` and `unique` (vramscope/common/arrays.py) are np.isin and np.unique for integers, without
numpy's hash table (2.3 and later find a plain np.unique's values in a hash set: 18 addresses
looked up among 3 million took 2.8 s of a 10^7-entry summary, where one sort takes 0.17 s)."""
from __future__ import annotations

import numpy as np
import numpy.lib._arraysetops_impl as setops
import pytest

from vramscope.common.arrays import isin, unique

DTYPES = [np.int64, np.int32, np.uint64, np.uint32, np.int8, np.uint8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("span", ["narrow", "wide"])
def test_isin_and_unique_are_numpys(dtype, span):
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    hi = 50 if span == "narrow" else int(min(info.max, 2**62))
    lo = 0 if info.min == 0 else max(info.min, -hi)
    for _ in range(300):
        n, m = (int(x) for x in rng.integers(0, 40, 2))
        a = rng.integers(lo, hi, n, endpoint=True).astype(dtype)
        b = rng.integers(lo, hi, m, endpoint=True).astype(dtype)
        if m and n:
            a[: n // 2] = rng.choice(b, n // 2)        # some of them found
        for invert in (False, True):
            assert np.array_equal(isin(a, b, invert), np.isin(a, b, invert=invert))
        u = unique(a)
        assert u.dtype == np.unique(a).dtype and np.array_equal(u, np.unique(a))


def test_shapes_lists_mixed_types_and_floats():
    a = np.arange(12).reshape(3, 4)
    assert np.array_equal(isin(a, [3, 5, 11]), np.isin(a, [3, 5, 11]))
    assert isin(np.array([-5, 3], dtype=np.int64), np.array([3, 200], dtype=np.uint8)).tolist() == [False, True]
    assert isin(np.array([2**64 - 1], dtype=np.uint64), np.array([-1], dtype=np.int64)).tolist() == [False]
    assert isin(np.array([0.5, 1.0]), [1.0]).tolist() == [False, True]
    assert unique(np.array([0.5, 0.25, 0.5])).tolist() == [0.25, 0.5]
    assert isin(np.zeros(0, dtype=np.int64), [1]).shape == (0,) and not isin([1, 2], []).any()


def test_wide_ranges_never_reach_numpys_hash_table(monkeypatch):
    """Addresses (wide, distinct): numpy's own isin and unique would hash them."""
    def refuse(*args, **kwargs):
        raise AssertionError("numpy's hash table")
    monkeypatch.setattr(setops, "_unique_hash", refuse)
    addrs = np.random.default_rng(0).integers(0, 2**40, 20_000) * 512
    with pytest.raises(AssertionError):
        np.isin(addrs[:18], addrs)                     # numpy's own: the test can fail
    assert isin(addrs[:18], addrs).all() and not isin(addrs[:18] + 1, addrs).any()
    assert isin(addrs, addrs[:100]).sum() >= 100
    assert len(unique(np.r_[addrs, addrs])) == len(set(addrs.tolist()))


def test_a_few_values_are_compared_in_the_elements_own_type():
    """A row's uint8 category among a few codes given as Python ints (int64): no copy of the
    rows in int64 (8 bytes an element) and no int64 positions for a table, one bool each;
    test values outside the elements' type match nothing, as numpy's own."""
    import tracemalloc
    cat = np.random.default_rng(5).integers(0, 12, 2_000_000).astype(np.uint8)
    codes = [1, 3, 4, 7, 300, -2]
    tracemalloc.start()
    try:
        got = isin(cat, codes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(got, np.isin(cat, codes))
    assert peak < 4 * len(cat), peak               # (the answer and one comparison: 2 bytes an element)
    assert np.array_equal(isin(cat, codes, invert=True), np.isin(cat, codes, invert=True))
    small = np.array([-3, 0, 127, -128], dtype=np.int8)
    assert isin(small, [127, -128, 128, -129]).tolist() == [False, False, True, True]
