"""Level of detail for the timeline (DESIGN.md §7); numpy only, no Qt.

The timeline never hands millions of points to the painter. For each pixel's
time bucket it asks for the exact max and min of the curves (live and reserved
bytes) over the events in that bucket, so no peak can disappear at any zoom.

`MinMaxPyramid` answers those range queries for a whole row of buckets at
once. Level 0 holds the max/min of each run of `BASE` events; level j+1
combines pairs of level-j nodes (a segment tree stored bottom-up, Perfetto's
power-of-two mipmaps). A range query reads the raw events of its two ragged
edges (fewer than `BASE` each) and at most two nodes per level in between, so
its cost does not depend on how many events are visible, and it is vectorised
across buckets: about 20 numpy passes over arrays as long as the plot is wide.
Memory: two int64 per curve and one argmax index per node, about n/16 nodes.
"""
from __future__ import annotations

import numpy as np

from ...common.arrays import ragged

BASE = 32
_I64_MIN = np.iinfo(np.int64).min
_I64_MAX = np.iinfo(np.int64).max


class StepCurve:
    """A curve that changes at few entries, kept as its changes (reserved bytes: they change
    only at segment events, a few hundred even in huge traces): its values at any indices and
    its extremes per block of entries, without the dense int64 array of a value an entry
    (80 MB at 10^7 events, held for as long as the viewer shows the file)."""

    def __init__(self, n: int, start: int, change_index: np.ndarray, change_value: np.ndarray):
        ci = np.asarray(change_index, dtype=np.int64)
        cv = np.asarray(change_value, dtype=np.int64)
        last = np.ones(len(ci), dtype=bool)        # an entry named twice: its last value holds
        last[:-1] = ci[1:] != ci[:-1]
        self.n, self.start = int(n), int(start)
        self.change_index, self.change_value = ci[last], cv[last]

    def __len__(self) -> int:
        return self.n

    def take(self, idx) -> np.ndarray:
        """int64 values right after each entry of `idx` (entries 0..n-1)."""
        idx = np.asarray(idx, dtype=np.int64)
        if not len(self.change_index):
            return np.full(idx.shape, self.start, dtype=np.int64)
        k = np.searchsorted(self.change_index, idx, side="right") - 1
        return np.where(k >= 0, self.change_value[np.maximum(k, 0)], self.start)

    def __getitem__(self, idx):
        if isinstance(idx, (int, np.integer)):
            return int(self.take(np.array([idx]))[0])
        return self.take(idx)

    def block_extremes(self, nb: int, base: int) -> tuple[np.ndarray, np.ndarray]:
        """(max, min) over each of the `nb` blocks [j * base, (j + 1) * base): the value in force
        where a block begins, and every change inside it."""
        v0 = self.take(np.arange(nb, dtype=np.int64) * base)
        mx, mn = v0.copy(), v0.copy()
        inside = self.change_index < nb * base
        blk = self.change_index[inside] // base
        np.maximum.at(mx, blk, self.change_value[inside])
        np.minimum.at(mn, blk, self.change_value[inside])
        return mx, mn


def values_at(curve, idx) -> np.ndarray:
    """A curve's values at the entries `idx`: a dense array's, or a StepCurve's."""
    return curve.take(idx) if isinstance(curve, StepCurve) else np.asarray(curve)[idx]


class MinMaxPyramid:
    """Exact max/min over index ranges of K curves, plus the index of curve 0's max."""

    def __init__(self, curves: list):
        self.curves = curves
        self.k = len(curves)
        n = len(curves[0]) if curves else 0
        self.n = n
        self.levels_max: list[np.ndarray] = []    # (nodes, K) int64
        self.levels_min: list[np.ndarray] = []
        self.levels_arg: list[np.ndarray] = []    # (nodes,) index of curve 0's max
        nb = n // BASE                       # only whole base blocks get nodes
        if nb == 0:
            return
        idx_t = np.int32 if n < (1 << 31) else np.int64
        mx = np.empty((nb, self.k), dtype=np.int64)
        mn = np.empty((nb, self.k), dtype=np.int64)
        for j, c in enumerate(curves):
            if isinstance(c, StepCurve):
                mx[:, j], mn[:, j] = c.block_extremes(nb, BASE)
                assert j, "curve 0 (its argmax kept) is a dense one"
                continue
            view = np.asarray(c[:nb * BASE]).reshape(nb, BASE)
            mx[:, j] = view.max(axis=1)
            mn[:, j] = view.min(axis=1)
            if j == 0:
                arg = view.argmax(axis=1).astype(idx_t)
                arg += np.arange(0, nb * BASE, BASE, dtype=idx_t)
        self.levels_max.append(mx)
        self.levels_min.append(mn)
        self.levels_arg.append(arg)
        while len(mx) > 1:
            m = len(mx)
            even = mx[0:m - m % 2:2], mn[0:m - m % 2:2], arg[0:m - m % 2:2]
            odd = mx[1::2], mn[1::2], arg[1::2]
            nmx = np.maximum(even[0], odd[0])
            nmn = np.minimum(even[1], odd[1])
            narg = np.where(odd[0][:, 0] > even[0][:, 0], odd[2], even[2])
            if m % 2:                          # a lone last node goes up as it is
                nmx = np.vstack([nmx, mx[-1:]])
                nmn = np.vstack([nmn, mn[-1:]])
                narg = np.concatenate([narg, arg[-1:]])
            mx, mn, arg = nmx, nmn, narg
            self.levels_max.append(mx)
            self.levels_min.append(mn)
            self.levels_arg.append(arg)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for ls in (self.levels_max, self.levels_min, self.levels_arg) for a in ls)

    def query(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each non-empty range [a, b): max (Q, K), min (Q, K), argmax of curve 0 (Q,)."""
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        q = len(a)
        out_max = np.full((q, self.k), _I64_MIN, dtype=np.int64)
        out_min = np.full((q, self.k), _I64_MAX, dtype=np.int64)
        out_arg = np.full(q, -1, dtype=np.int64)
        if not q:
            return out_max, out_min, out_arg
        nb = len(self.levels_max[0]) if self.levels_max else 0
        # whole base blocks [A, B) inside the range; the ragged edges are read raw
        A = np.minimum(-(-a // BASE), nb)
        B = np.minimum(b // BASE, nb)
        has_blocks = A < B
        left_end = np.where(has_blocks, A * BASE, b)
        right_start = np.where(has_blocks, B * BASE, b)
        # left edge, then whole blocks, then right edge: ties keep the earliest max
        self._raw(a, left_end - a, np.arange(q), out_max, out_min, out_arg)
        if has_blocks.any():
            self._tree(A[has_blocks], B[has_blocks], np.flatnonzero(has_blocks), out_max, out_min, out_arg)
        self._raw(right_start, b - right_start, np.arange(q), out_max, out_min, out_arg)
        return out_max, out_min, out_arg

    def _raw(self, starts, lens, owners, out_max, out_min, out_arg):
        """Fold raw events [start, start+len) into each (unique) owner's result."""
        keep = lens > 0
        if not keep.any():
            return
        starts, lens, owners = starts[keep], lens[keep], owners[keep]
        pos, _ = ragged(starts, lens)
        seg = np.cumsum(lens) - lens
        for j, c in enumerate(self.curves):
            v = values_at(c, pos)
            smax = np.maximum.reduceat(v, seg)
            smin = np.minimum.reduceat(v, seg)
            if j == 0:
                # the first position in each segment that holds its max
                hit = np.where(v == np.repeat(smax, lens), pos, _I64_MAX)
                sarg = np.minimum.reduceat(hit, seg)
                better = smax > out_max[owners, 0]
                out_arg[owners[better]] = sarg[better]
            out_max[owners, j] = np.maximum(out_max[owners, j], smax)
            out_min[owners, j] = np.minimum(out_min[owners, j], smin)

    def _tree(self, lo, hi, owners, out_max, out_min, out_arg):
        lo = lo.copy()
        hi = hi.copy()
        for mx, mn, arg in zip(self.levels_max, self.levels_min, self.levels_arg):
            active = lo < hi
            if not active.any():
                break
            for side in (0, 1):
                if side == 0:
                    take = active & (lo & 1 == 1)
                    node = lo[take]
                    lo[take] += 1
                else:
                    take = active & (hi & 1 == 1)
                    hi[take] -= 1
                    node = hi[take]
                if not len(node):
                    continue
                o = owners[take]
                nmx = mx[node]
                better = nmx[:, 0] > out_max[o, 0]
                out_arg[o[better]] = arg[node[better]]
                out_max[o] = np.maximum(out_max[o], nmx)
                out_min[o] = np.minimum(out_min[o], mn[node])
            lo >>= 1
            hi >>= 1


def envelope(x: np.ndarray, live: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel bucket of x: the entry with the highest live bytes, and the lowest live bytes.

    Returns (indices of the max entry per non-empty bucket, min live per bucket)."""
    n = len(live)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lo, hi = float(x[0]), float(x[-1])
    edges = np.linspace(lo, hi, buckets + 1)
    starts = np.unique(np.searchsorted(x, edges[:-1], side="left"))
    starts = starts[starts < n]
    bmax = np.maximum.reduceat(live, starts)
    bmin = np.minimum.reduceat(live, starts)
    lens = np.diff(np.append(starts, n))
    hit = np.flatnonzero(live == np.repeat(bmax, lens))
    first_hit = hit[np.searchsorted(hit, starts, side="left")]
    return first_hit.astype(np.int64), bmin
