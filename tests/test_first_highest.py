"""`first_highest` (classifiers/peaks.py): each iteration's peak entry, the first of the highest
live bytes in its range, for all iterations at once: the answer of `argmax` on each range."""
from __future__ import annotations

import numpy as np
import pytest

from vramscope.classifiers import peaks


def one_by_one(live, starts, ends):
    return np.array([s + int(np.argmax(live[s:e + 1])) if e >= s and s < len(live) else -1
                     for s, e in zip(starts.tolist(), ends.tolist())], dtype=np.int64)


@pytest.mark.parametrize("part", [1, 7, 100, 1 << 20])
def test_first_highest_is_argmax_of_each_range(monkeypatch, part):
    monkeypatch.setattr(peaks, "PART", part)           # ranges compared a few at a time, or all
    monkeypatch.setattr(peaks, "SHORT", 10**9)         # vectorized, however long the ranges
    rng = np.random.default_rng(part)
    for _ in range(150):
        n = int(rng.integers(1, 3000))
        live = rng.integers(0, int(rng.choice([3, 50, 10**9])), n).astype(np.int64)   # ties, and not
        cuts = np.sort(rng.choice(np.arange(n + 1), size=min(n + 1, int(rng.integers(2, 60))), replace=False))
        starts, ends = [], []
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            gap = int(rng.integers(0, max(1, (b - a) // 3)))          # gaps between ranges, and none
            if a + gap <= b - 1 and rng.random() < 0.8:
                starts.append(a + gap)
                ends.append(b - 1)
        s, e = np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)
        assert np.array_equal(peaks.first_highest(live, s, e), one_by_one(live, s, e))


def test_ranges_out_of_order_or_empty_are_each_searched():
    live = np.array([5, 9, 9, 1, 7, 7, 3], dtype=np.int64)
    s, e = np.array([4, 0, 3]), np.array([6, 2, 2])
    assert peaks.first_highest(live, s, e).tolist() == [4, 1, -1]
    assert peaks.first_highest(live, np.zeros(0), np.zeros(0)).tolist() == []
