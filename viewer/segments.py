"""The allocator's segments of one device over the trace (numpy, no Qt): address ranges
with the entries they live over, from `segment_*` events and the final state; what is
allocated in them at any entry; every segment as a band (reserved memory by segment).
Mixed into DeviceData (viewer/model.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..parsers.tables import A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP
from ..present.words import segment_pool_words, segment_stream_words

SMALL_SEGMENT = 2 << 20        # the caching allocator's small-pool segment (kSmallBuffer)
SMALL_ALLOC_MAX = 1 << 20      # the small pool serves requests up to 1 MiB (kSmallSize)


def small_pool(seg_addr: np.ndarray, seg_size: np.ndarray, alloc_addr: np.ndarray,
               alloc_size: np.ndarray) -> np.ndarray:
    """bool per segment (or mapped piece): the small pool's. Its segments are 2 MiB and never
    hold a request over 1 MiB; size alone cannot tell, since an expandable large-pool segment
    grows by 2 MiB pages too (a 2 MiB piece of one was called small pool)."""
    small = np.asarray(seg_size) == SMALL_SEGMENT
    idx = np.flatnonzero(small)
    big = np.asarray(alloc_size) > SMALL_ALLOC_MAX
    if not len(idx) or not big.any():
        return small
    order = np.argsort(np.asarray(alloc_addr)[big], kind="stable")
    starts = np.asarray(alloc_addr)[big][order]
    reach = np.maximum.accumulate((starts + np.asarray(alloc_size)[big][order]))
    p0 = np.asarray(seg_addr)[idx]
    hi = np.searchsorted(starts, p0 + SMALL_SEGMENT, side="left")     # big ones starting before its end
    overlaps = (hi > 0) & (reach[np.maximum(hi - 1, 0)] > p0)           # ... one of which reaches into it
    small[idx[overlaps]] = False
    return small


@dataclass
class Segments:
    """The allocator's segments live after one entry, and what is allocated in them."""
    address: np.ndarray
    size: np.ndarray
    allocated: np.ndarray
    known: bool = True              # False: the snapshot has no allocator segments

    @property
    def reserved_bytes(self) -> int:
        return int(self.size.sum())

    @property
    def allocated_bytes(self) -> int:
        return int(self.allocated.sum())

    @property
    def fragmentation(self) -> float:
        """Reserved but unallocated, as a fraction of reserved."""
        r = self.reserved_bytes
        return 0.0 if r <= 0 else max(0.0, 1.0 - self.allocated_bytes / r)


class SegmentsMixin:
    """Mixed into DeviceData: `seg_start`, `seg_end` (entries), `seg_addr`, `seg_size`,
    `seg_stream`, `seg_expandable`, `seg_key` per segment (or mapped piece), `streams`."""

    def segment_stack(self):
        """Every allocator segment as a band (reserved memory by segment), keyed by its
        stream (several streams) or its pool (small / large), built on first use."""
        if self._segment_stack is None and self.segments_known:
            from .model.alloc_stack import AllocStack
            end = np.where(self.seg_end > self.n, -1, self.seg_end)
            self._segment_stack = AllocStack(self.seg_start, end, self.seg_size, self.seg_key, self.n)
        return self._segment_stack

    def segment_keys(self) -> list[tuple[int, str]]:
        """(key, what it is) for each colour key the segment bands use (`seg_key`; the colour
        is theme.SEGMENT_COLORS[key % len]): a stream when there are several, else a pool."""
        present = np.unique(self.seg_key).tolist()
        if len(self.streams) > 1:
            return [(k, segment_stream_words(int(self.streams[k]))) for k in present]
        return [(k, segment_pool_words(small=k == 0)) for k in present]

    def _build_segments(self):
        """Segment intervals [start, end) in entries, paired by address like allocations."""
        seg = self.snap.device_segments(self.device)
        self.segments_known = self.reserved is not None
        if not self.segments_known:
            self.seg_addr = self.seg_size = self.seg_start = self.seg_end = np.zeros(0, dtype=np.int64)
            self.seg_stream = self.seg_key = np.zeros(0, dtype=np.int64)
            self.seg_expandable = self.seg_small = np.zeros(0, dtype=bool)
            self.streams = np.zeros(0, dtype=np.int64)
            return
        cols = self.snap.trace(self.device).columns
        stream_col = np.asarray(cols["stream"]) if "stream" in cols else np.zeros(self.n, dtype=np.int64)
        act = self.action
        up_mask = (act == A_SEGMENT_ALLOC) | (act == A_SEGMENT_MAP)
        ev = np.flatnonzero(up_mask | (act == A_SEGMENT_FREE) | (act == A_SEGMENT_UNMAP))
        ev_addr = np.asarray(cols["addr"][ev], dtype=np.int64).tolist()
        ev_size = np.asarray(self.size[ev], dtype=np.int64).tolist()
        ev_up = up_mask[ev].tolist()
        ev_stream = stream_col[ev].tolist()
        big = self.n + 1
        # Address ranges, not whole segments: an expandable segment maps and unmaps pieces of
        # itself, and an unmap may cover several maps or part of one. A free or unmap of a
        # range nobody mapped in the trace was mapped before it began. Segment events are
        # rare (one per thousands of entries), so a plain loop over them is cheap.
        ev_map = np.isin(act[ev], (A_SEGMENT_MAP, A_SEGMENT_UNMAP)).tolist()
        out: list[tuple[int, int, int, int, int, bool]] = []   # (start, end, address, size, stream, mapped)
        live: dict[int, tuple[int, int, int, bool]] = {}       # start address -> (end address, entry, stream, mapped)
        for e, a, n_bytes, up, st, mapped in zip(ev.tolist(), ev_addr, ev_size, ev_up, ev_stream, ev_map):
            b = a + n_bytes
            if up:
                live[a] = (b, e, st, mapped)
                continue
            covered = 0
            for pa in [pa for pa, (pb, _, _, _) in live.items() if pa < b and pb > a]:
                pb, pe, pst, pm = live.pop(pa)
                out.append((pe, e, pa, pb - pa, pst, pm))
                covered += min(pb, b) - max(pa, a)
                if pa < a:                                  # the parts outside the range stay
                    live[pa] = (a, e, pst, pm)
                if pb > b:
                    live[b] = (pb, e, pst, pm)
            if n_bytes - covered > 0:
                out.append((-1, e, a, n_bytes - covered, st, mapped))
        for pa, (pb, pe, pst, pm) in live.items():
            out.append((pe, big, pa, pb - pa, pst, pm))
        # segments of the final state that no live range covers: mapped before the trace
        alive = sorted((pa, pb) for pa, (pb, _, _, _) in live.items())
        for sa, sz, sst, sx in zip(np.asarray(seg["address"]).tolist(), np.asarray(seg["total_size"]).tolist(),
                                   np.asarray(seg["stream"]).tolist(), np.asarray(seg["is_expandable"]).tolist()):
            cur, sb = sa, sa + sz
            for pa, pb in alive:
                if pb <= cur or pa >= sb:
                    continue
                if pa > cur:
                    out.append((-1, big, cur, pa - cur, sst, bool(sx)))
                cur = max(cur, pb)
            if cur < sb:
                out.append((-1, big, cur, sb - cur, sst, bool(sx)))
        cols_ = list(zip(*out)) if out else [[], [], [], [], [], []]
        out_start, out_end, out_addr, out_size, out_stream, out_mapped = cols_
        self.seg_start = np.asarray(out_start, dtype=np.int64)
        self.seg_end = np.asarray(out_end, dtype=np.int64)
        self.seg_addr = np.asarray(out_addr, dtype=np.int64)
        self.seg_size = np.asarray(out_size, dtype=np.int64)
        self.seg_stream = np.asarray(out_stream, dtype=np.int64)
        self.seg_expandable = np.asarray(out_mapped, dtype=bool)
        self.streams = np.unique(self.seg_stream)
        self.seg_small = small_pool(self.seg_addr, self.seg_size, np.asarray(self.allocs.addr),
                                    np.asarray(self.allocs.size))
        if len(self.streams) > 1:
            self.seg_key = np.searchsorted(self.streams, self.seg_stream).astype(np.int64)
        else:
            self.seg_key = (~self.seg_small).astype(np.int64)

    def allocated_in_segment(self, seg: int, i: int) -> int:
        """Bytes of the allocations live after entry i inside segment `seg`'s address range."""
        rows = self.live_rows(i)
        a0 = int(self.seg_addr[seg])
        ra = np.asarray(self.allocs.addr)[rows]
        inside = (ra >= a0) & (ra < a0 + int(self.seg_size[seg]))
        return int(np.asarray(self.allocs.size)[rows][inside].sum())

    def segments_at(self, i: int) -> Segments:
        if not self.segments_known:
            z = np.zeros(0, dtype=np.int64)
            return Segments(z, z, z, known=False)
        live = (self.seg_start <= i) & (self.seg_end > i)
        addr, size = self.seg_addr[live], self.seg_size[live]
        order = np.argsort(addr)
        addr, size = addr[order], size[order]
        rows = self.live_rows(i)
        allocated = np.zeros(len(addr), dtype=np.int64)
        if len(addr) and len(rows):
            ra = np.asarray(self.allocs.addr[rows], dtype=np.int64)
            k = np.searchsorted(addr, ra, side="right") - 1
            ok = k >= 0
            ok[ok] = ra[ok] < addr[k[ok]] + size[k[ok]]
            allocated = np.bincount(k[ok], weights=self.allocs.size[rows][ok].astype(np.float64),
                                    minlength=len(addr)).astype(np.int64)
        return Segments(addr, size, allocated)
