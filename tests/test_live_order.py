"""The pairing of allocs and frees orders events by address, then entry, with one sort of packed
keys where they fit: the same order as a lexsort, whatever the addresses."""
from __future__ import annotations

import numpy as np
import pytest

from vramscope.parsers.live import _by_address_then_time, _by_first


@pytest.mark.parametrize("addrs", [
    "aligned", "unaligned", "huge span", "one address", "negative",
])
def test_packed_sort_orders_as_a_lexsort(addrs, monkeypatch):
    rng = np.random.default_rng(7)
    n = 5000
    ev = np.sort(rng.choice(3 * n, n, replace=False)).astype(np.int32)
    ev[-1] = 40_000_000                       # entry indices past the count of events
    if addrs == "aligned":
        a = 0x7F0000000000 + 512 * rng.integers(0, 300, n)
    elif addrs == "unaligned":
        a = 0x7F0000000000 + rng.integers(0, 3000, n)
    elif addrs == "huge span":
        a = rng.integers(0, 1 << 62, n)
    elif addrs == "one address":
        a = np.full(n, 0x7F0000000200)
    else:
        a = rng.integers(-(1 << 30), 1 << 30, n)
    a = a.astype(np.int64)
    order = np.lexsort((ev, a))
    if addrs in ("aligned", "one address", "negative"):
        # keys that fit 62 bits: one sort, no lexsort (ten times slower at 10^7 events)
        from vramscope.parsers import live
        monkeypatch.setattr(live.np, "lexsort", None)
    e_sorted, a_sorted = _by_address_then_time(ev, a.copy())     # (its addresses are worked on in place)
    assert e_sorted.dtype == ev.dtype
    assert (e_sorted == ev[order]).all() and (a_sorted == a[order]).all()


def test_allocs_sorted_with_their_frees():
    first = np.array([9, 2, 40_000_000, 5], dtype=np.int32)
    second = np.array([-1, 3, 7, -1], dtype=np.int64)
    f, s = _by_first(first, second)
    assert f.tolist() == [2, 5, 9, 40_000_000] and s.tolist() == [3, -1, -1, 7]
    assert f.dtype == np.int32


def test_allocs_sorted_with_their_frees_dense_and_sparse():
    """Dense indices (a table, no sort) and sparse ones (a sort) give the same order."""
    rng = np.random.default_rng(4)
    for n, k in ((1000, 900), (1000, 300), (10_000_000, 50), (100, 100)):
        first = rng.choice(n, k, replace=False).astype(np.int32)
        second = np.where(rng.random(k) < 0.8, rng.integers(0, n, k), -1).astype(np.int64)
        f, s = _by_first(first, second)
        order = np.argsort(first, kind="stable")
        assert f.dtype == np.int32 and s.dtype == np.int64
        assert (f == first[order]).all() and (s == second[order]).all()
