"""The caching allocator's state after any trace entry: its segments and the blocks in
them (numpy only, no Qt).

    st = AllocatorState.at(d, i)      # d: DeviceData, i: entry (-1: before the trace)
    st.segments (address order), st.blocks (address order), st.reserved, st.allocated,
    st.pending_free, st.rounding, st.cached, st.largest_free, st.fragmentation

What each block is, after entry i:
  allocated      live rows (alloc at or before i, not yet freed); their trace `size` is
                 the requested size
  rounding       the allocator hands out whole 512-byte units (kMinBlockSize: a request is
                 rounded up to a multiple of 512 B, at least 512 B); the difference is
                 waste inside the block (an estimate: `roundup_power2_divisions` rounds
                 further, and a large-pool block too small to split keeps its remainder)
  pending free   freed by the program (`free_requested`) but not yet returned to the
                 cache (`free_completed`: the stream that used it has not finished)
  cached         the rest of each segment: reserved, free for new requests of its pool
Fragmentation: 1 - (largest free stretch inside one segment) / (all cached bytes): 0 when
the free memory is one piece, close to 1 when it is spread in many small ones (a request
larger than the largest piece needs a new segment, or fails).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..parsers.tables import A_FREE_REQUESTED
from .segments import SMALL_ALLOC_MAX, SMALL_SEGMENT

ROUND = 512           # CUDACachingAllocator kMinBlockSize

FREE, ALLOCATED, ROUNDING, PENDING = range(4)      # kinds of drawn pieces


def rounded(size: np.ndarray) -> np.ndarray:
    s = np.asarray(size, dtype=np.int64)
    return np.maximum(ROUND, (s + ROUND - 1) // ROUND * ROUND)


def free_requested_index(d) -> np.ndarray:
    """Per allocation row, the entry of its `free_requested` (-1: none recorded).

    Nearly always the entry right before the row's `free_completed` at the same address
    (the stream had nothing pending): those pair in one pass over the rows. The others (a
    free held back by another stream) are few; each is paired with the allocation live at
    its address when it happened."""
    cached = getattr(d, "_free_requested", None)
    if cached is not None:
        return cached
    out = np.full(d.n_rows, -1, dtype=np.int32 if d.n < (1 << 31) - 1 else np.int64)
    act = d.action
    if d.n and d.n_rows:
        addr = d.snap.trace(d.device).columns["addr"]
        fi = np.asarray(d.free_index)
        row_addr = np.asarray(d.allocs.addr)
        step = 1 << 20                       # rows at a time: bounded temporaries at 10^7 events
        for s in range(0, d.n_rows, step):
            prev = fi[s:s + step].astype(np.int64) - 1
            k = np.flatnonzero(prev >= 0)
            pe = prev[k]
            instant = (act[pe] == A_FREE_REQUESTED) & (np.asarray(addr[pe]) == row_addr[s + k])
            out[s + k[instant]] = pe[instant]
        is_fr = act == A_FREE_REQUESTED
        if int(np.count_nonzero(is_fr)) > int(np.count_nonzero(out >= 0)):
            is_fr[out[out >= 0]] = False          # the rest: frees some stream held back
            rest = np.flatnonzero(is_fr)
            _pair_the_rest(d, rest, np.asarray(addr[rest], dtype=np.int64), np.asarray(row_addr, dtype=np.int64),
                           out)
    d._free_requested = out
    return out


def _pair_the_rest(d, fr, fr_addr, row_addr, out):
    """Each free_requested in `fr` to the row live at its address then (rows sorted by
    address, then allocation)."""
    ai = np.asarray(d.alloc_index, dtype=np.int64)
    fi = np.asarray(d.free_index, dtype=np.int64)
    order = np.lexsort((ai, row_addr))
    sa = row_addr[order]
    lo = np.searchsorted(sa, fr_addr, side="left")
    hi = np.searchsorted(sa, fr_addr, side="right")
    for e, a, b in zip(fr.tolist(), lo.tolist(), hi.tolist()):
        if a == b:
            continue
        rows = order[a:b]
        j = int(np.searchsorted(ai[rows], e, side="left")) - 1       # the last allocated before e
        if j >= 0:
            r = int(rows[j])
            if (fi[r] < 0 or fi[r] >= e) and out[r] < 0:
                out[r] = e


@dataclass
class SegmentView:
    address: int
    size: int
    stream: int
    small: bool                  # the small pool (2 MiB segments)
    allocated: int               # requested bytes of live blocks
    rounding: int
    pending: int
    cached: int
    largest_free: int
    first_block: int             # blocks[first_block:first_block + n_blocks] are inside it
    n_blocks: int


@dataclass
class AllocatorState:
    index: int
    segments: list[SegmentView]
    block_addr: np.ndarray       # int64, address order
    block_size: np.ndarray       # requested bytes
    block_rounded: np.ndarray    # bytes the allocator gave it
    block_row: np.ndarray        # allocation row
    block_pending: np.ndarray    # bool: freed by the program, not yet by its stream
    known: bool = True           # False: the snapshot has no allocator segments

    @property
    def reserved(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def allocated(self) -> int:
        return int(self.block_size[~self.block_pending].sum())

    @property
    def pending_free(self) -> int:
        return int(self.block_rounded[self.block_pending].sum())

    @property
    def rounding(self) -> int:
        live = ~self.block_pending
        return int((self.block_rounded[live] - self.block_size[live]).sum())

    @property
    def cached(self) -> int:
        return sum(s.cached for s in self.segments)

    @property
    def largest_free(self) -> int:
        return max((s.largest_free for s in self.segments), default=0)

    @property
    def fragmentation(self) -> float:
        """1 - largest free stretch / all free (cached) bytes; 0 with nothing free."""
        c = self.cached
        return 0.0 if c <= 0 else 1.0 - self.largest_free / c

    @property
    def streams(self) -> list[int]:
        return sorted({s.stream for s in self.segments})

    @classmethod
    def at(cls, d, i: int) -> "AllocatorState":
        z = np.zeros(0, dtype=np.int64)
        if not d.segments_known:
            return cls(i, [], z, z, z, z, np.zeros(0, dtype=bool), known=False)
        live = (d.seg_start <= i) & (d.seg_end > i)
        sa, ss, st, ex = d.seg_addr[live], d.seg_size[live], d.seg_stream[live], d.seg_expandable[live]
        order = np.argsort(sa, kind="stable")
        sa, ss, st, ex = sa[order], ss[order], st[order], ex[order]
        # mapped pieces of one expandable segment that touch, on one stream: one segment
        if len(sa) > 1:
            join = np.zeros(len(sa), dtype=bool)
            join[1:] = (sa[1:] == sa[:-1] + ss[:-1]) & (st[1:] == st[:-1]) & ex[1:] & ex[:-1]
            first = np.flatnonzero(~join)
            ss = np.add.reduceat(ss, first)
            sa, st = sa[first], st[first]
        # blocks: allocations live after i, and those freed but still pending
        rows = d.live_rows(i)
        fr = free_requested_index(d)
        pending = (fr[rows] >= 0) & (fr[rows] <= i)
        ra = np.asarray(d.allocs.addr, dtype=np.int64)[rows]
        o = np.argsort(ra, kind="stable")
        rows, ra, pending = rows[o], ra[o], pending[o]
        size = np.asarray(d.allocs.size, dtype=np.int64)[rows]
        rnd = rounded(size)
        seg_of = np.searchsorted(sa, ra, side="right") - 1
        inside = seg_of >= 0
        inside[inside] = ra[inside] < sa[seg_of[inside]] + ss[seg_of[inside]]
        rows, ra, pending, size, rnd, seg_of = (x[inside] for x in (rows, ra, pending, size, rnd, seg_of))
        start = np.searchsorted(seg_of, np.arange(len(sa)), side="left")
        stop = np.searchsorted(seg_of, np.arange(len(sa)), side="right")
        segs = []
        for k in range(len(sa)):
            a, b = int(start[k]), int(stop[k])
            base, n_bytes = int(sa[k]), int(ss[k])
            pa, pr, pp, psz = ra[a:b], rnd[a:b], pending[a:b], size[a:b]
            used = int(pr.sum())
            # free stretches: before the first block, between blocks, after the last
            ends = np.concatenate([[base], pa + pr])
            starts = np.concatenate([pa, [base + n_bytes]])
            gaps = np.maximum(starts - ends, 0)
            small = n_bytes == SMALL_SEGMENT and not bool((psz > SMALL_ALLOC_MAX).any())
            segs.append(SegmentView(base, n_bytes, int(st[k]), small,
                                    int(psz[~pp].sum()), int((pr[~pp] - psz[~pp]).sum()), int(pr[pp].sum()),
                                    max(0, n_bytes - used), int(gaps.max()) if len(gaps) else n_bytes, a, b - a))
        return cls(i, segs, ra, size, rnd, rows, pending)
