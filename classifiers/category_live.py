"""Live bytes per category over the whole trace, compact enough for 10^7 events, and the
exact peak of any per-category scaling of them (DESIGN.md §8).

    cl = CategoryLive.build(da)                 # once per device (O(events), bounded memory)
    cl.peak(factors)                            # -> ScaledPeak(bytes, index, by_category)
    cl.live_at(index) / cl.live_at_many(idx)    # per-category live bytes at any moment
    cl.max_bytes                                # each category's maximum over the run

The scaled total at a moment t is  sum over categories c of  round(f_c * live_c(t)),
`round` being float64 multiplication followed by round-half-to-even (`np.rint`; Python's
`round(live * f)` on the same numbers gives the same integer). Factor 1 leaves a category
exact (live bytes stay far below 2^53), so the unscaled peak is the summary's.

Why it is cheap. A per-category int64 series per trace entry costs 8 bytes x categories
per entry (720 MB at 10^7 entries and 9 categories). Instead we keep:
  * one int32 (int64 past 2^31 allocation rows) per alloc/free event, in trace order,
    naming the allocation row (its size and category are gathered from the row columns);
  * per block of BLOCK events: each category's live bytes at the block's start and its
    maximum over the block, the maximum of the total, and of the total minus each
    category (about 0.6 B per event at BLOCK = 128 and 7 categories).
The scaled total can only reach a new maximum at an event (a free lowers it, other
entries leave it unchanged). Every block gets an upper bound on its scaled total from
those maxima (`_bounds`: live bytes are >= 0, round() moves a term by at most 1/2, and
not at all for a whole factor); blocks are visited best bound first and dropped once
their bound cannot beat the best exact value found. Inside a visited block a float64
estimate of the total after each event, with a rigorous bound on its error, leaves a
handful of events, which are evaluated exactly. The answer is exact; only the blocks
near the maximum cost anything (one per training iteration in the worst case: their
peaks look alike).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .categories import CATEGORIES

BLOCK = 128            # events per block: small enough to replay, large enough to prune
_CHUNK_BLOCKS = 256    # blocks per chunk of the build pass (bounds its temporaries)


def scale_live(live, factors) -> np.ndarray:
    """round(f * live) elementwise (float64 product, round half to even), as int64.
    `live` is [..., C] and `factors` [C]; the one rounding used everywhere."""
    return np.rint(np.asarray(live, dtype=np.float64) * np.asarray(factors, dtype=np.float64)).astype(np.int64)


def scaled_series(live_by_category, factors):
    """For the viewer: per-category live bytes at its sample points (int64 [K, C], e.g.
    from `live_at_many` or classifiers.live_by_category) scaled by `factors` ([C], all
    CATEGORIES or the model's categories, matching the columns). Returns (scaled [K, C],
    total [K], first argmax of total or -1 when K == 0). The exact peak between sample
    points comes from CategoryLive.peak."""
    scaled = scale_live(live_by_category, factors)
    total = scaled.sum(axis=1) if scaled.ndim == 2 else scaled
    return scaled, total, (int(np.argmax(total)) if len(total) else -1)


@dataclass(frozen=True)
class ScaledPeak:
    bytes: int
    index: int               # trace entry that reached it; -1: the start state
    by_category: dict        # {category: scaled live bytes}, non-zero only, in CATEGORIES order


class CategoryLive:
    """Per-category live bytes of one device (see the module docstring)."""

    def __init__(self, categories, row_cat, alloc_index, free_index, size, ev_code, start,
                 block_start, block_max, block_first_entry, block_total_max, block_rest_max, composition):
        self.categories = tuple(categories)      # the categories present (names), model order
        self._composition = composition          # liveset.Composition: live bytes per category at an entry
        self._present = np.array([CATEGORIES.index(c) for c in self.categories], dtype=np.int64)
        self.cat_slot = np.array([self.categories.index(c) if c in self.categories else -1
                                  for c in CATEGORIES], dtype=np.int64)   # CATEGORIES index -> slot
        self._row_cat = row_cat                  # uint8 per allocation row: slot
        self._alloc_index = alloc_index
        self._free_index = free_index
        self._size = size
        self.ev_code = ev_code                   # per event, in trace order: row (alloc) or ~row (free)
        self.start = start                       # int64 [C]: live before the trace
        self.block_start = block_start           # int64 [nb, C]: live before each block's first event
        self.block_max = block_max               # int64 [nb, C]: max over each block's events
        self.block_first_entry = block_first_entry   # int64 [nb]
        self.block_total_max = block_total_max   # int64 [nb]: max of the total over each block
        self.block_rest_max = block_rest_max     # int64 [nb, C]: max of (total - category c)
        # float64 copies for the bounds (matrix-vector products; exact below 2^53 bytes)
        self._fmax = block_max.astype(np.float64)
        self._fstart = block_start.astype(np.float64)
        self._ftot = block_total_max.astype(np.float64)
        self._frest = block_rest_max.astype(np.float64)
        mx = start.copy()
        if len(block_max):
            np.maximum(mx, block_max.max(axis=0), out=mx)
        self._max = mx

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def build(cls, da) -> "CategoryLive":
        """From a DeviceAnalysis: `allocs` (rows) and `category` (uint8 per row)."""
        a = da.allocs
        cat = np.asarray(da.category)
        present = np.flatnonzero(np.bincount(cat, minlength=len(CATEGORIES)))
        categories = [CATEGORIES[int(c)] for c in present]
        lut = np.zeros(max(len(CATEGORIES), int(cat.max()) + 1 if len(cat) else 0), dtype=np.uint8)
        lut[present] = np.arange(len(present), dtype=np.uint8)
        row_cat = lut[cat]
        C = len(categories)
        ai = np.asarray(a.alloc_index)
        fi = np.asarray(a.free_index)
        size = np.asarray(a.size, dtype=np.int64)
        start = np.zeros(C, dtype=np.int64)
        pre = ai < 0
        np.add.at(start, row_cat[pre], size[pre])

        comp = da.composition()
        ev_code = comp.codes[comp.codes != comp.no_event]      # every alloc (row) and free (~row), in trace order
        E = len(ev_code)
        nb = (E + BLOCK - 1) // BLOCK
        block_start = np.zeros((nb, C), dtype=np.int64)
        block_max = np.zeros((nb, C), dtype=np.int64)
        block_first_entry = np.zeros(nb, dtype=np.int64)
        block_total_max = np.zeros(nb, dtype=np.int64)
        block_rest_max = np.zeros((nb, C), dtype=np.int64)
        carry = start.copy()
        step = BLOCK * _CHUNK_BLOCKS
        for s in range(0, E, step):
            codes = ev_code[s:s + step]
            cum, entries = _replay(codes, row_cat, ai, fi, size, C, carry)
            m = len(codes)
            b0 = s // BLOCK
            nbc = (m + BLOCK - 1) // BLOCK
            pad = nbc * BLOCK - m
            if pad:        # repeat the last state: leaves the maxima unchanged
                cum = np.concatenate([cum, np.repeat(cum[-1:], pad, axis=0)])
            cum3 = cum.reshape(nbc, BLOCK, C)
            block_max[b0:b0 + nbc] = cum3.max(axis=1)
            tot = cum3.sum(axis=2)
            block_total_max[b0:b0 + nbc] = tot.max(axis=1)
            block_rest_max[b0:b0 + nbc] = (tot[:, :, None] - cum3).max(axis=1)
            del tot
            block_start[b0] = carry
            block_start[b0 + 1:b0 + nbc] = cum3[:-1, -1]
            block_first_entry[b0:b0 + nbc] = entries[::BLOCK]
            carry = cum[m - 1].copy()
        return cls(categories, row_cat, ai, fi, size, ev_code, start, block_start, block_max, block_first_entry,
                   block_total_max, block_rest_max, comp)

    # -- queries ------------------------------------------------------------------------------
    @property
    def n_events(self) -> int:
        return len(self.ev_code)

    @property
    def nbytes(self) -> int:
        """Memory this model holds of its own (the row columns are the Allocations')."""
        return int(self.ev_code.nbytes + self.block_start.nbytes + self.block_max.nbytes
                   + self.block_first_entry.nbytes + self.block_total_max.nbytes + self.block_rest_max.nbytes
                   + self._row_cat.nbytes)

    @property
    def max_bytes(self) -> dict:
        """{category: its highest live bytes over the run (the start state included)}."""
        return {c: int(v) for c, v in zip(self.categories, self._max)}

    def factors(self, scales: dict | None) -> np.ndarray:
        """float64 [C] in model order from {category: factor} (absent: 1; categories
        not present in this run are ignored). Validation is the caller's (whatif)."""
        f = np.ones(len(self.categories), dtype=np.float64)
        for name, v in (scales or {}).items():
            if name in self.categories:
                f[self.categories.index(name)] = float(v)
        return f

    def live_at(self, index: int) -> np.ndarray:
        """int64 [C]: live bytes per category right after trace entry `index` (-1: start)."""
        return self.live_at_many(np.array([index]))[0]

    def live_at_many(self, indices) -> np.ndarray:
        """int64 [K, C]: live bytes per category right after each entry (-1: the start), in
        model order: the analysis' one composition (liveset.Composition), for the categories
        present. Factor-independent: compute once per view, then `scaled_series` per slider
        move."""
        return self._composition.at(indices)[:, self._present]

    def by_category(self, live_row) -> dict:
        """{category: bytes} of a [C] row, non-zero only, in CATEGORIES order."""
        return {c: int(v) for c, v in zip(self.categories, live_row) if v}

    def peak(self, factors=None) -> ScaledPeak:
        """The exact maximum over the run of sum_c round(f_c * live_c(t)), its first
        moment (-1 when nothing beats the start state, as LiveModel.peak_index) and what
        each category contributes there. `factors`: float64 [C] in model order, or a
        {category: factor} dict (see `factors`).

        Three filters, each provably keeping the answer: blocks whose bound cannot reach
        the best exact value found; within the remaining blocks, events whose float64
        estimate sum_c f_c * live_c (computed per event without a per-category array,
        with a rigorous bound on its error and on the rounding) cannot reach it; the
        events left are evaluated exactly."""
        f = self.factors(factors) if factors is None or isinstance(factors, dict) else \
            np.asarray(factors, dtype=np.float64)
        if len(f) != len(self.categories) or not np.all(np.isfinite(f)) or (f < 0).any():
            raise ValueError("factors: one finite, non-negative factor per category of the model")
        best = [int(scale_live(self.start, f).sum()), -1]       # value, entry (-1: start)
        nb = len(self.block_max)
        if nb:
            bound = self._bounds(f)
            if nb > 1:     # block starts are real states: the highest one prunes at once
                self._exact_before_block(1 + int(np.argmax(self._fstart[1:] @ f)), f, best)
            cand = np.flatnonzero(_keep(bound, self.block_first_entry, *best))
            cand = cand[np.lexsort((cand, -bound[cand]))]
            take = 16
            while len(cand):
                chunk, cand = cand[:take], cand[take:]
                take *= 2
                self._scan_blocks(chunk, f, best)
                if len(cand):
                    cand = cand[_keep(bound[cand], self.block_first_entry[cand], *best)]
        best_val, best_pos = best
        scaled = scale_live(self.live_at(best_pos), f)
        assert int(scaled.sum()) == best_val
        return ScaledPeak(best_val, best_pos, self.by_category(scaled))

    def _bounds(self, f):
        """int64 [nb]: an upper bound of the scaled total over each block, the least of:
          box   sum_c f_c * max_c
          mix   lam * max(total) + sum_c (f_c - lam) * max_c   with lam = min f
          rest  for each category c whose factor differs from the most common one (m):
                m * max(total - c) + f_c * max_c + sum_(c' != c) (f_c' - m)+ * max_c'
        (each term bounded separately: live bytes are >= 0), plus 1/2 per non-integer
        factor for the rounding and a margin for float64's own. `rest` is tight when one
        slider moves and the others stay equal, where the box is loose: it adds maxima
        reached at different moments of a block."""
        mx = self._fmax
        box = mx @ f
        lam = float(f.min())
        best = np.minimum(box, lam * self._ftot + mx @ (f - lam))
        vals, counts = np.unique(f, return_counts=True)
        mode = float(vals[np.argmax(counts)])
        odd = np.flatnonzero(f != mode)
        if 0 < len(odd) <= 3:
            up = np.maximum(f - mode, 0.0)
            for c in odd.tolist():
                others = up.copy()
                others[c] = f[c]
                np.minimum(best, mode * self._frest[:, c] + mx @ others, out=best)
        # every term is >= 0, so float64's error on these few (< 16) terms is below
        # 16 * 2^-53 of the value: 1e-12 relative covers it (and whole factors on whole
        # bytes are exact)
        return np.floor(best * (1 + 1e-12) + 0.5 * _rounding_terms(f)).astype(np.int64)

    def _gather(self, blocks):
        """The events of `blocks` as [k, BLOCK] arrays: valid, rows, sign, category slot."""
        pos = blocks[:, None] * BLOCK + np.arange(BLOCK)[None, :]
        valid = pos < self.n_events
        codes = self.ev_code[np.minimum(pos, self.n_events - 1)]
        rows, sign = _rows_signs(codes)
        return valid, rows, sign, self._row_cat[rows]

    def _scan_blocks(self, blocks, f, best):
        """Update `best` with the events of `blocks` that may beat it."""
        pos = blocks[:, None] * BLOCK + np.arange(BLOCK)[None, :]
        valid = pos < self.n_events
        codes = self.ev_code[np.minimum(pos, self.n_events - 1)].astype(np.int64)
        rows = codes ^ (codes >> 63)                 # ~code for frees (negative codes)
        size = self._size[rows].astype(np.float64)
        x = f[self._row_cat[rows]] * np.where(codes < 0, -size, size)
        x[~valid] = 0.0
        base = (self.block_start[blocks] * f).sum(axis=1)            # float64 [k]
        est = np.cumsum(x, axis=1)
        est += base[:, None]
        # |estimate - exact real sum| <= gamma_n * (sum of |terms|) for n float64 terms and
        # products (gamma_n = n u / (1 - n u), u = 2^-53; 2 n u is safely above it), and
        # each category's round() moves its term by at most 1/2 (not at all for a whole
        # factor: f * live is then an integer below 2^53, exact in float64)
        mag = base + np.abs(x).sum(axis=1)
        slack = (2.0 * (BLOCK + len(f) + 2) * 2.0 ** -53) * mag + 0.5 * _rounding_terms(f)
        hi = np.floor(est + slack[:, None])
        hi[~valid] = -np.inf
        # events that may beat `best` need their trace entry; the rest never do
        maybe = np.flatnonzero(hi.ravel() >= best[0])
        if not len(maybe):
            return
        r = rows.ravel()[maybe]
        entries = np.where(codes.ravel()[maybe] >= 0, self._alloc_index[r], self._free_index[r]).astype(np.int64)
        self._exact_events(hi.ravel()[maybe], entries, f, best)

    def _exact_before_block(self, b, f, best):
        """Update `best` with the state right before block `b`: after block b-1's last event."""
        valid, rows, sign, _ = self._gather(np.array([b - 1]))
        e = int(np.where(sign > 0, self._alloc_index[rows], self._free_index[rows])[valid][-1])
        val = int(scale_live(self.live_at(e), f).sum())
        if val > best[0]:
            best[0], best[1] = val, e

    def _exact_events(self, hi, entries, f, best):
        """Evaluate exactly, best estimate first, the events whose upper estimate `hi`
        can still beat `best` (a higher value, or an equal one earlier)."""
        live = np.flatnonzero(_keep(hi, entries, *best))
        if not len(live):
            return
        live = live[np.lexsort((entries[live], -hi[live]))]
        batch = 8
        while len(live):
            pick, live = live[:batch], live[batch:]
            batch *= 2
            vals = scale_live(self.live_at_many(entries[pick]), f).sum(axis=1)
            for v, e in zip(vals.tolist(), entries[pick].tolist()):
                if v > best[0] or (v == best[0] and e < best[1]):
                    best[0], best[1] = v, e
            if len(live):
                live = live[_keep(hi[live], entries[live], *best)]


def _rounding_terms(f) -> int:
    """Categories whose round(f * live) may differ from f * live (non-integer factors)."""
    return int(np.count_nonzero(f != np.floor(f)))


def _keep(bound, first_entry, best_val, best_pos):
    """Blocks that may still hold the first maximum: a higher bound, or an equal one
    starting before the best moment found so far."""
    return (bound > best_val) | ((bound == best_val) & (first_entry < best_pos))


def _rows_signs(codes):
    codes = codes.astype(np.int64, copy=False)
    neg = codes < 0
    rows = np.where(neg, ~codes, codes)
    sign = np.where(neg, -1, 1)
    return rows, sign


def _replay(codes, row_cat, ai, fi, size, C, carry):
    """Per-category live bytes after each event of `codes` (int64 [m, C]) from `carry`,
    and each event's trace entry."""
    rows, sign = _rows_signs(codes)
    m = len(codes)
    d = np.zeros((m, C), dtype=np.int64)
    d[np.arange(m), row_cat[rows]] = sign * size[rows]
    np.cumsum(d, axis=0, out=d)
    d += carry
    entries = np.where(sign > 0, ai[rows], fi[rows]).astype(np.int64)
    return d, entries


__all__ = ["CategoryLive", "ScaledPeak", "scale_live", "scaled_series", "BLOCK"]
