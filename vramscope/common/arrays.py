"""Vectorized numpy helpers shared by the analysis and the viewer (no Python loop per item)."""
from __future__ import annotations

import numpy as np


def ragged(starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated `arange(s, s+l)` for every (start, length), and the owner of each.

    (`np.repeat` plus one cumulative offset: no Python loop over the ranges.)
    """
    lens = np.asarray(lens, dtype=np.int64)
    total = int(lens.sum())
    owner = np.repeat(np.arange(len(lens)), lens)
    if not total:
        return np.zeros(0, dtype=np.int64), owner
    seg_first = np.cumsum(lens) - lens
    pos = np.arange(total, dtype=np.int64)
    pos += np.repeat(np.asarray(starts, dtype=np.int64) - seg_first, lens)
    return pos, owner


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` for integers of a narrow range (stack ids,
    codes): marked in a table the size of their range, numbered by one running count over it
    and looked up, three passes where np.unique sorts (3 million stack ids: 20 ms, not 65).
    np.unique itself where the range is wide against the count (or the values not integers)."""
    v = np.asarray(values)
    if v.ndim != 1 or not len(v) or v.dtype.kind not in "iu":
        return np.unique(v, return_inverse=True)
    lo, hi = int(v.min()), int(v.max())
    span = hi - lo + 1
    if span > max(1 << 16, 2 * len(v)) or hi > np.iinfo(np.intp).max:
        return np.unique(v, return_inverse=True)
    k = v.astype(np.intp) - lo if lo else v
    present = np.zeros(span, dtype=bool)
    present[k] = True
    number = np.cumsum(present, dtype=np.intp)
    number -= 1
    return (np.flatnonzero(present) + lo).astype(v.dtype), number[k]


__all__ = ["ragged", "unique_inverse"]
