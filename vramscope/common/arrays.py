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


__all__ = ["ragged"]
