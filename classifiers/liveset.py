"""What is live at a moment: masks, bytes by category, the largest allocations (vectorized).

`index` is a trace entry: "right after entry `index`", -1 for the state before the trace.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .categories import CATEGORIES


def live_mask(allocs, index: int) -> np.ndarray:
    """bool per allocation row: live right after trace entry `index` (-1: before the trace)."""
    a = allocs
    return (a.alloc_index <= index) & ((a.free_index < 0) | (a.free_index > index))


def by_category_at(category: np.ndarray, allocs, index: int) -> dict[str, int]:
    """Live bytes per category right after entry `index` (-1: at the start), non-zero only."""
    live = live_mask(allocs, index)
    sums = np.bincount(category[live], weights=allocs.size[live].astype(np.float64), minlength=len(CATEGORIES))
    return {c: int(s) for c, s in zip(CATEGORIES, sums) if s}


def by_category_evidence_at(category: np.ndarray, evidence: np.ndarray, allocs, index: int) -> dict[str, dict[str, int]]:
    """{category: {evidence: live bytes}} right after entry `index` (-1: at the start), non-zero only."""
    from .evidence import EVIDENCE
    live = np.flatnonzero(live_mask(allocs, index))
    if not len(live):
        return {}
    key = category[live].astype(np.int64) * len(EVIDENCE) + evidence[live]
    sums = np.bincount(key, weights=allocs.size[live].astype(np.float64), minlength=len(CATEGORIES) * len(EVIDENCE))
    out: dict[str, dict[str, int]] = {}
    for k in np.flatnonzero(sums).tolist():
        out.setdefault(CATEGORIES[k // len(EVIDENCE)], {})[EVIDENCE[k % len(EVIDENCE)]] = int(sums[k])
    return out


@dataclass(frozen=True)
class CategorySeries:
    """One category's live bytes over the trace, sparse: `start` before the first entry,
    then `value[k]` right after entry `index[k]` (the entries where it changes)."""
    start: int
    index: np.ndarray        # int64, increasing
    value: np.ndarray        # int64


def category_series(category: np.ndarray, allocs) -> list[CategorySeries]:
    """Per category code (CATEGORIES order): its live bytes over the trace, built from the
    allocation rows (one per allocation, not per event): an alloc adds its size at
    `alloc_index`, a free subtracts it at `free_index`."""
    a = allocs
    out = []
    for c in range(len(CATEGORIES)):
        sel = category == c
        size = a.size[sel].astype(np.int64)
        ai = a.alloc_index[sel]
        fi = a.free_index[sel]
        start = int(size[ai < 0].sum())
        ev = np.concatenate([ai[ai >= 0], fi[fi >= 0]]).astype(np.int64)
        delta = np.concatenate([size[ai >= 0], -size[fi >= 0]])
        order = np.argsort(ev, kind="stable")
        ev = ev[order]
        vals = np.cumsum(delta[order]) + start
        # one event, one block: two changes at one entry cannot happen, but keep the last
        if len(ev) > 1:
            last = np.ones(len(ev), dtype=bool)
            last[:-1] = ev[1:] != ev[:-1]
            ev, vals = ev[last], vals[last]
        out.append(CategorySeries(start, ev, vals))
    return out


def series_at(series: list[CategorySeries], at_indices) -> np.ndarray:
    """int64 [len(at_indices), len(series)]: each series right after each entry (-1: the start)."""
    at = np.asarray(at_indices, dtype=np.int64)
    out = np.zeros((len(at), len(series)), dtype=np.int64)
    for c, s in enumerate(series):
        if not len(s.index):
            out[:, c] = s.start
            continue
        k = np.searchsorted(s.index, at, side="right") - 1
        out[:, c] = np.where(k >= 0, s.value[np.maximum(k, 0)], s.start)
    return out


def live_by_category(category: np.ndarray, allocs, at_indices) -> np.ndarray:
    """int64 [len(at_indices), len(CATEGORIES)]: live bytes per category right after each
    entry index (-1 = the start state). For timelines: one call per view, any number of
    query points, O((allocations + queries) log) with no per-event array per category."""
    return series_at(category_series(category, allocs), at_indices)


def largest_live_rows(allocs, index: int, n: int = 10) -> np.ndarray:
    """Rows of the `n` largest allocations live right after entry `index`, biggest first
    (ties: the earlier row first)."""
    live = np.flatnonzero(live_mask(allocs, index))
    if not len(live):
        return live
    return live[np.argsort(-allocs.size[live], kind="stable")[:n]]


__all__ = ["live_mask", "by_category_at", "by_category_evidence_at", "live_by_category", "largest_live_rows", "CategorySeries",
           "category_series", "series_at"]
