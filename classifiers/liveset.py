"""What is live at a moment: masks, bytes by category, the largest allocations (vectorized).

`index` is a trace entry: "right after entry `index`", -1 for the state before the trace.

Live bytes per category at an entry (the composition of live memory) have one definition
and one implementation, `Composition`: the allocation rows' sizes, each counted in its
row's category from its `alloc_index` (or from the start, before the trace) to its
`free_index`. The live line (parsers.LiveModel.live_after) is built from the same rows,
so the categories add up to it at every entry. Every surface reads it through
`DeviceAnalysis.live_by_category` / `by_category_at`: the summary's peak, the report's
PNG, the viewer's bands (one query per pixel column), the what-if model
(category_live.py), the Perfetto export.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common.arrays import ragged
from .categories import CATEGORIES


def live_mask(allocs, index: int) -> np.ndarray:
    """bool per allocation row: live right after trace entry `index` (-1: before the trace)."""
    a = allocs
    return (a.alloc_index <= index) & ((a.free_index < 0) | (a.free_index > index))


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


FEW_MOMENTS = 8          # moments from which by_category_evidence_at_many builds a Composition


def by_category_evidence_at_many(category: np.ndarray, evidence: np.ndarray, allocs, indices,
                                 n_entries: int) -> list[dict[str, dict[str, int]]]:
    """`by_category_evidence_at` at each of `indices`: a pass over the rows for each of a few;
    for more (a run that ran out of memory again and again: thousands of OOMs at 10^7 events
    took a pass over millions of rows each), one Composition of the (category, evidence) codes,
    sparse checkpoints, queried once for all of them. The same sums either way (float64 sums of
    whole bytes: exact)."""
    from .evidence import EVIDENCE
    idx = [int(i) for i in indices]
    if len(idx) <= FEW_MOMENTS:
        return [by_category_evidence_at(category, evidence, allocs, i) for i in idx]
    E = len(EVIDENCE)
    key = (np.asarray(category).astype(np.uint16) * E + np.asarray(evidence)).astype(np.uint16)
    sums = _SparseComposition(key, allocs, n_entries, len(CATEGORIES) * E).at(idx, np.float64)
    out = []
    for row in sums:
        got: dict[str, dict[str, int]] = {}
        for k in np.flatnonzero(row).tolist():
            got.setdefault(CATEGORIES[k // E], {})[EVIDENCE[k % E]] = int(row[k])
        out.append(got)
    return out


@dataclass(frozen=True)
class CategorySeries:
    """One category's live bytes over the trace, sparse: `start` before the first entry,
    then `value[k]` right after entry `index[k]` (the entries where it changes)."""
    start: int
    index: np.ndarray        # int64, increasing
    value: np.ndarray        # int64


class Composition:
    """Live bytes per category right after any trace entry, exact, for many entries at once.

    Why it is cheap. Nine full per-category curves would cost 72 bytes an entry. Instead:
    one code per entry naming the allocation row its alloc (`row`) or free (`~row`) event
    touches (4 bytes; the row gives the size and the category), and checkpoints of the
    per-category totals every CHECKPOINT entries (about 1.1 bytes an entry). The totals
    after entry i are the nearest checkpoint, before or after i, plus or minus fewer than
    CHECKPOINT / 2 signed sizes: a query for a whole row of pixel columns is a handful of
    numpy passes over about 16 events per column (DESIGN.md §7).
    """

    CHECKPOINT = 64
    ROWS_AT_ONCE = 1 << 20      # rows read at a time while building: bounded temporaries

    def __init__(self, category: np.ndarray, allocs, n_entries: int, n_categories: int | None = None,
                 codes: np.ndarray | None = None):
        self.n = n = int(n_entries)
        # (`n_categories`: other codes than the categories', e.g. one bin more for "the rest")
        self.n_categories = C = len(CATEGORIES) if n_categories is None else int(n_categories)
        self._category = np.asarray(category)
        self._size = np.asarray(allocs.size, dtype=np.int64)
        ai, fi = np.asarray(allocs.alloc_index), np.asarray(allocs.free_index)
        n_rows = len(self._size)
        code_t = np.int32 if n_rows < (1 << 31) - 1 else np.int64
        self.no_event = np.iinfo(code_t).min     # an entry that allocates and frees nothing
        # each entry is one action: an alloc starts one row, a free ends at most one
        # (parsers.allocations pairs them), so the codes never collide
        step = self.ROWS_AT_ONCE
        if codes is None or len(codes) != n or codes.dtype != code_t:
            codes = np.full(n, self.no_event, dtype=code_t)
            for r in range(0, n_rows, step):
                a, f = ai[r:r + step], fi[r:r + step]
                rows = np.arange(r, r + len(a), dtype=code_t)
                has_a, has_f = a >= 0, f >= 0
                codes[a[has_a]] = rows[has_a]
                codes[f[has_f]] = ~rows[has_f]
        self.codes = codes        # (another Composition's of the same rows may be handed in: shared)
        pre = ai < 0
        self.start = np.bincount(self._category[pre], weights=self._size[pre].astype(np.float64),
                                 minlength=C)[:C].round().astype(np.int64)
        # checkpoints from the rows, not the entries: each alloc adds its size to its
        # block, each free takes it away (float64 sums of at most CHECKPOINT sizes per bin:
        # exact far beyond any GPU's bytes), then one running sum over the blocks
        nb = -(-n // self.CHECKPOINT)
        sums = np.zeros((nb + 1) * C, dtype=np.float64)
        for r in range(0, n_rows, step):
            cat = self._category[r:r + step].astype(np.int64)
            size = self._size[r:r + step].astype(np.float64)
            for entry, sign in ((ai[r:r + step], 1.0), (fi[r:r + step], -1.0)):
                k = np.flatnonzero(entry >= 0)
                sums += np.bincount((entry[k] // self.CHECKPOINT + 1) * C + cat[k], weights=sign * size[k],
                                    minlength=len(sums))
        cp = np.rint(sums).astype(np.int64).reshape(nb + 1, C)
        cp[0] = self.start
        np.cumsum(cp, axis=0, out=cp)
        self.checkpoints = cp

    def _decode(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(category, signed size: + for an alloc, - for a free) of event codes."""
        codes = codes.astype(np.int64)
        rows = codes ^ (codes >> 63)                  # ~code for frees (negative codes)
        size = self._size[rows]
        return self._category[rows], np.where(codes < 0, -size, size)

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.checkpoints.nbytes)

    def at(self, indices, dtype=np.int64) -> np.ndarray:
        """[len(indices), n_categories]: live bytes per category (CATEGORIES order) right
        after each entry (-1: the start state; past the end: the end state). Summed in
        float64, exact (whole bytes far below 2^53); `dtype=np.float64` skips the conversion
        (the viewer draws floats)."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        C, n, step = self.n_categories, self.n, self.CHECKPOINT
        s = np.clip(idx + 1, 0, n)                    # entries applied
        last = len(self.checkpoints) - 1
        j_lo = s // step
        pos_lo = j_lo * step
        pos_hi = np.minimum((j_lo + 1) * step, n)
        # from the nearer checkpoint: forward from the one before, or back from the one after
        fwd = ((s - pos_lo) <= (pos_hi - s)) | (j_lo >= last)
        out = self.checkpoints[np.where(fwd, j_lo, np.minimum(j_lo + 1, last))].astype(np.float64)
        lens = np.where(fwd, s - pos_lo, pos_hi - s)
        if lens.any():
            pos, owner = ragged(np.where(fwd, pos_lo, s), lens)
            codes = self.codes[pos]
            keep = np.flatnonzero(codes != self.no_event)
            codes, owner = codes[keep], owner[keep]
            free = codes < 0
            rows = np.where(free, ~codes, codes)
            d = self._size[rows].astype(np.float64)
            d[free == fwd[owner]] *= -1.0             # a free walking forward, an alloc walking back
            out += np.bincount(owner * C + self._category[rows], weights=d, minlength=len(idx) * C).reshape(-1, C)
        return out if np.dtype(dtype) == np.float64 else out.astype(dtype)

    def rows_allocated_at(self, indices) -> np.ndarray:
        """The allocation row each entry allocates (-1: the entry allocates nothing)."""
        idx = np.asarray(indices, dtype=np.int64)
        inside = (idx >= 0) & (idx < self.n)
        codes = self.codes[np.clip(idx, 0, max(self.n - 1, 0))] if self.n else np.zeros(len(idx), self.codes.dtype)
        return np.where(inside & (codes >= 0), codes, -1).astype(np.int64)

    def by_category(self, index: int) -> dict[str, int]:
        """{category: live bytes} right after entry `index`, non-zero only, in CATEGORIES order."""
        return {c: int(v) for c, v in zip(CATEGORIES, self.at([index])[0]) if v}

    def series(self) -> list[CategorySeries]:
        """Per category code: its live bytes over the trace as the entries where it changes
        (for exports that keep every change: Perfetto's counter tracks)."""
        ev = np.flatnonzero(self.codes != self.no_event)
        cat, d = self._decode(self.codes[ev])
        out = []
        for c in range(self.n_categories):
            sel = cat == c
            out.append(CategorySeries(int(self.start[c]), ev[sel].astype(np.int64),
                                      np.cumsum(d[sel]) + int(self.start[c])))
        return out


class _SparseComposition(Composition):
    """A Composition over many codes (categories times evidence: 45 sums a checkpoint), its
    checkpoints 16 times sparser: 3.5 MB at 10^7 events, for a query of some thousands of
    moments, where every 64 entries they would take 56 MB."""

    CHECKPOINT = 1024


def category_series(category: np.ndarray, allocs, n_entries: int | None = None) -> list[CategorySeries]:
    """Per category code: its live bytes over the trace, sparse (`Composition.series` of
    these rows; `n_entries` defaults to the last entry the rows touch, plus one)."""
    if n_entries is None:
        ai, fi = np.asarray(allocs.alloc_index), np.asarray(allocs.free_index)
        n_entries = int(max(ai.max(initial=-1), fi.max(initial=-1))) + 1
    return Composition(category, allocs, n_entries).series()


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


class AllocOrder:
    """The rows in allocation order, to find the rows live at an entry among those allocated
    by then: the live set at any moment is small next to all rows, so this takes a few ms
    even at 10^7 events where a pass over every row (a mask) takes tens."""

    def __init__(self, allocs):
        ai = np.asarray(allocs.alloc_index)
        self._free = np.asarray(allocs.free_index)
        self.order: np.ndarray | None = None          # None: the rows are in allocation order already
        if len(ai) > 1 and not bool(np.all(ai[1:] >= ai[:-1])):
            self.order = np.argsort(ai, kind="stable")
            ai = ai[self.order]
        self.sorted_alloc_index = ai

    @property
    def nbytes(self) -> int:
        return int(self.order.nbytes) if self.order is not None else 0

    def allocated_by(self, index: int) -> int:
        """How many rows were allocated at or before entry `index`."""
        ai = self.sorted_alloc_index
        # the value in the array's own dtype: an int64 key would make numpy copy an int32
        # column (millions of rows) on every call
        return int(np.searchsorted(ai, ai.dtype.type(index), side="right"))

    def live_rows(self, index: int) -> np.ndarray:
        """Rows live right after entry `index` (-1: before the trace), in allocation order."""
        k = self.allocated_by(index)
        if self.order is None:          # the first k rows: their frees as they are, no index of them gathered
            f = self._free[:k]
            return np.flatnonzero((f < 0) | (f > index))
        rows = self.order[:k]
        f = self._free[rows]
        return rows[(f < 0) | (f > index)]


def largest_of(allocs, rows: np.ndarray, n: int = 10) -> np.ndarray:
    """The `n` largest of `rows`, biggest first (ties: the earlier row first)."""
    if not len(rows):
        return np.zeros(0, dtype=np.int64)
    size = np.asarray(allocs.size)[rows]
    if len(rows) > n:
        part = np.argpartition(-size, n - 1)[:n]
        rows, size = rows[part], size[part]
    return rows[np.lexsort((rows, -size))].astype(np.int64)


__all__ = ["live_mask", "by_category_evidence_at", "by_category_evidence_at_many", "AllocOrder", "largest_of",
           "Composition", "CategorySeries", "category_series", "series_at"]
