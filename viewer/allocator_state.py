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
from .segments import SMALL_SEGMENT

ROUND = 512           # CUDACachingAllocator kMinBlockSize

FREE, ALLOCATED, ROUNDING, PENDING = range(4)      # kinds of drawn pieces


def rounded(size: np.ndarray) -> np.ndarray:
    s = np.asarray(size, dtype=np.int64)
    return np.maximum(ROUND, (s + ROUND - 1) // ROUND * ROUND)


def free_requested_index(d) -> np.ndarray:
    """Per allocation row, the entry of its `free_requested` (-1: none recorded): pairs each
    free_requested with the last allocation at its address before it (as frees are paired)."""
    cached = getattr(d, "_free_requested", None)
    if cached is not None:
        return cached
    act = d.action
    addr = np.asarray(d.snap.trace(d.device).columns["addr"], dtype=np.int64) if d.n else np.zeros(0, np.int64)
    fr = np.flatnonzero(act == A_FREE_REQUESTED)
    out = np.full(d.n_rows, -1, dtype=np.int64)
    if len(fr) and d.n_rows:
        ai = d.alloc_index.astype(np.int64)
        row_addr = np.asarray(d.allocs.addr, dtype=np.int64)
        # alloc events (row ids) and free_requested events (-1), by address then entry
        ev_entry = np.concatenate([ai, fr])
        ev_addr = np.concatenate([row_addr, addr[fr]])
        ev_row = np.concatenate([np.arange(d.n_rows, dtype=np.int64), np.full(len(fr), -1, dtype=np.int64)])
        order = np.lexsort((ev_entry, ev_addr))
        e, a, r = ev_entry[order], ev_addr[order], ev_row[order]
        # for each event, the latest row allocated at its address so far
        is_row = r >= 0
        last_row_pos = np.where(is_row, np.arange(len(r)), -1)
        np.maximum.accumulate(last_row_pos, out=last_row_pos)
        k = np.flatnonzero(~is_row)
        src = last_row_pos[k]
        ok = src >= 0
        ok[ok] = a[src[ok]] == a[k[ok]]
        rows = r[src[ok]]
        fe = e[k[ok]]
        # a row's own free_requested comes before its free_completed
        fi = d.free_index[rows].astype(np.int64)
        good = (fi < 0) | (fe <= fi)
        out[rows[good]] = fe[good]
    d._free_requested = out
    return out


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
            segs.append(SegmentView(base, n_bytes, int(st[k]), n_bytes == SMALL_SEGMENT,
                                    int(psz[~pp].sum()), int((pr[~pp] - psz[~pp]).sum()), int(pr[pp].sum()),
                                    max(0, n_bytes - used), int(gaps.max()) if len(gaps) else n_bytes, a, b - a))
        return cls(i, segs, ra, size, rnd, rows, pending)
