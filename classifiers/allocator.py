"""The caching allocator of one device over the trace (numpy only, no Qt): its segments as
intervals of entries, and the blocks in them after any entry.

    h = AllocatorHistory(snap, da)       # once per device: segments from `segment_*` events
    h.segments_at(i)                     # -> Segments: each live segment and its allocated bytes
    h.state_at(i)                        # -> AllocatorState: every segment and block, the totals
    h.allocated_in_segment(k, i)

`i` is a trace entry: the state right after it, -1 before the trace.

What each block is, after entry i:
  allocated      rows live after i (allocated at or before i, `free_completed` after): their
                 trace `size` is the requested size. A block whose free the program asked for
                 (`free_requested`) is still allocated until its stream is done with it
                 (`free_completed`), as torch counts it; `pending_free` is that part of it.
  rounding       the allocator hands out whole 512-byte units (kMinBlockSize: a request is
                 rounded up to a multiple of 512 B, at least 512 B); the difference is waste
                 inside the block (an estimate: `roundup_power2_divisions` rounds further, and
                 a large-pool block too small to split keeps its remainder)
  cached         the rest of each segment: reserved, free for new requests of its pool

The allocator's memory is named by what each figure measures, once, here (a figure has one
name and one definition everywhere: the OOM reports, the summary and report, the viewer):
  reserved but unallocated  `reserved_unallocated(reserved, allocated)`: bytes the allocator
                 holds in segments that no live allocation asked for (cached, rounding): what
                 `expandable_segments` gives back (DESIGN.md §5 "reserved minus allocated")
  cached outside the largest free block  `AllocatorState.cached_outside_largest_free`: the
                 share of the cached bytes a single request cannot use, because it lies
                 outside the largest free block (0 when the cache is one piece, near 1 when it
                 is spread in small pieces: a larger request needs a new segment, or fails)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..parsers.tables import (A_FREE_REQUESTED, A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP,
                              take_released)

SMALL_SEGMENT = 2 << 20        # the caching allocator's small-pool segment (kSmallBuffer)
SMALL_ALLOC_MAX = 1 << 20      # the small pool serves requests up to 1 MiB (kSmallSize)
ROUND = 512                    # CUDACachingAllocator kMinBlockSize
_PART = 1 << 19                # live rows at a time (segments_at)


def reserved_unallocated(reserved: int | None, allocated: int) -> int | None:
    """Reserved but unallocated bytes: what the caching allocator holds in its segments beyond
    the live allocations' requested bytes (its cache and the rounding of blocks). None when
    the snapshot has no allocator segments (profiler-converted)."""
    return None if reserved is None else int(reserved) - int(allocated)


def rounded(size: np.ndarray) -> np.ndarray:
    """The bytes the allocator gives a request of `size` (whole 512-byte units, at least one)."""
    s = np.asarray(size, dtype=np.int64)
    return np.maximum(ROUND, (s + ROUND - 1) // ROUND * ROUND)


def small_pool(seg_addr: np.ndarray, seg_size: np.ndarray, alloc_addr: np.ndarray,
               alloc_size: np.ndarray, part: int = 1 << 18) -> np.ndarray:
    """bool per segment (or mapped piece): the small pool's. Its segments are 2 MiB and never
    hold a request over 1 MiB; size alone cannot tell, since an expandable large-pool segment
    grows by 2 MiB pages too (a 2 MiB piece of one was called small pool). The requests are
    read `part` at a time (a run of millions of big requests: bounded temporaries)."""
    small = np.asarray(seg_size) == SMALL_SEGMENT
    idx = np.flatnonzero(small)
    if not len(idx):
        return small
    a_addr, a_size = np.asarray(alloc_addr), np.asarray(alloc_size)
    p0 = np.asarray(seg_addr)[idx].astype(np.int64)
    by_addr = np.argsort(p0, kind="stable")
    starts = p0[by_addr]
    # each big request marks the segments it reaches into, [first, last) of them in address
    # order, by +1 at the first and -1 past the last: the few segments searched for each request
    # (not the requests of each part sorted: at 10^7 events, 3.3 million rows, 0.14 s -> 0.07 s)
    marks = np.zeros(len(idx) + 1, dtype=np.int64)
    for lo in range(0, len(a_size), part):
        size = a_size[lo:lo + part]
        big = size > SMALL_ALLOC_MAX
        if not big.any():
            continue
        start = a_addr[lo:lo + part][big].astype(np.int64)
        end = start + size[big]
        # a segment [p, p + 2 MiB) and a request [start, end) overlap where start - 2 MiB < p < end
        first = np.searchsorted(starts, start - SMALL_SEGMENT, side="right")
        last = np.searchsorted(starts, end, side="left")
        some = first < last
        marks += np.bincount(first[some], minlength=len(marks))
        marks -= np.bincount(last[some], minlength=len(marks))
    overlaps = np.zeros(len(idx), dtype=bool)
    overlaps[by_addr] = np.cumsum(marks[:-1]) > 0
    small[idx[overlaps]] = False
    return small


def _segment_events(ev: np.ndarray, fields: tuple, up_mask: np.ndarray, act: np.ndarray, part: int = 1 << 16):
    """(entry, address, size, maps or allocates, stream, a mapping) of each segment event `ev`,
    in order, as Python values made `part` events at a time. `fields`: the events' (address,
    size, stream) arrays."""
    addr, size, stream = fields
    for lo in range(0, len(ev), part):
        e = ev[lo:lo + part]
        yield from zip(e.tolist(), addr[lo:lo + part].tolist(), size[lo:lo + part].tolist(), up_mask[e].tolist(),
                       stream[lo:lo + part].tolist(), np.isin(act[e], (A_SEGMENT_MAP, A_SEGMENT_UNMAP)).tolist())


def _made_only(ev: np.ndarray, fields: tuple, act: np.ndarray) -> tuple[np.ndarray, ...]:
    """`segment_ranges`' live ranges where every event `ev` makes a segment or maps a range (none
    is freed or unmapped: a run's warm-up, the caching allocator keeping what it reserved): each
    is live at the end; (address, end address, entry, stream, mapped) arrays in the order
    `segment_ranges` puts them, the latest made at an address in the first one's place. Arrays,
    without its search per event and without a Python value per range (847,000 segments made in
    a real trace tiled to 10^7 entries: 4.3 s, and 300 MB while the viewer opened it)."""
    a, size, stream = fields
    order = np.argsort(a, kind="stable")
    by_addr = a[order]
    first = np.flatnonzero(np.r_[True, by_addr[1:] != by_addr[:-1]]) if len(a) else np.zeros(0, dtype=np.int64)
    last = np.r_[first[1:] - 1, len(a) - 1] if len(a) else first
    place, value = order[first], order[last]        # an address's first event, its latest
    value = value[np.argsort(place, kind="stable")]
    e = ev[value]
    return (a[value], a[value] + size[value], e.astype(np.int64), stream[value], act[e] == A_SEGMENT_MAP)


def _overlap(addr: np.ndarray, size: np.ndarray, start: np.ndarray, end: np.ndarray, most: int = 1 << 22) -> bool:
    """Whether two of these segments, made at entry `start` (-1: before the trace) and freed at
    `end`, at different addresses, overlap in address while both are live (a segment made inside
    another's live range: a trace that lost an event). Each segment is paired with those that
    begin inside its range (the driver reuses a freed segment's addresses, so there are some);
    True where more than `most` such pairs would be looked at (answered by the search instead)."""
    order = np.argsort(addr, kind="stable")
    a, z, s, e = addr[order], size[order], start[order], end[order]
    lo = np.searchsorted(a, a, side="right")
    hi = np.searchsorted(a, a + z, side="left")
    count = np.maximum(hi - lo, 0)
    total = int(count.sum())
    if total > most:
        return True
    if not total:
        return False
    i = np.repeat(np.arange(len(a)), count)
    j = lo[i] + (np.arange(total) - np.repeat(np.cumsum(count) - count, count))
    return bool(((s[i] < e[j]) & (s[j] < e[i])).any())


def _whole_segments(ev: np.ndarray, fields: tuple, up_mask: np.ndarray, act: np.ndarray):
    """`segment_ranges`' answer, as arrays, where every segment is made and freed whole (no
    mapping, the caching allocator's segments): ([start entry, end entry, address, size, stream,
    mapped] of the ranges that ended, in the order of their frees; (address, end address, entry,
    stream, mapped) of those live at the end, in the order of their making), without a Python
    value per event (a trace whose segments come and go: 10^6 segment events tiled from a real
    file took 1 s and 120 MB more of the viewer's open). None where that does not hold, for
    `segment_ranges` to answer: a mapping, a size not above zero, two makings (or frees) in a row
    at one address, a free of another size than the making before it, or two segments live at
    once over the same addresses (`_overlap`)."""
    a, size, stream = fields
    acts = act[ev]
    if not len(ev) or bool(np.isin(acts, (A_SEGMENT_MAP, A_SEGMENT_UNMAP)).any()) or bool((size <= 0).any()):
        return None
    up = up_mask[ev]
    order = np.argsort(a, kind="stable")            # by address, then in the trace's order
    by_a, up_s, size_s = a[order], up[order], size[order]
    same = np.zeros(len(order), dtype=bool)
    same[1:] = by_a[1:] == by_a[:-1]
    if bool((same[1:] & (up_s[1:] == up_s[:-1])).any()):
        return None
    closes = same & ~up_s                             # a free of the making right before it
    k = np.flatnonzero(closes)
    if bool((size_s[k] != size_s[k - 1]).any()):
        return None
    # the frees, in the trace's order: each ends the making before it at its address (or a
    # segment made before the trace: start -1, its own stream)
    frees = np.flatnonzero(~up_s)
    frees = frees[np.argsort(order[frees], kind="stable")]
    made = closes[frees]
    maker = np.where(made, order[np.maximum(frees - 1, 0)], -1)
    fo = order[frees]
    start = np.where(made, ev[np.maximum(maker, 0)], -1).astype(np.int64)
    st = np.where(made, stream[np.maximum(maker, 0)], stream[fo])
    ended = [start, ev[fo].astype(np.int64), a[fo], size[fo], st, np.zeros(len(fo), dtype=bool)]
    # the makings no free follows: live at the end, in the order they were made
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ~same[1:]
    keep = np.sort(order[up_s & last])
    if _overlap(np.concatenate([a[fo], a[keep]]), np.concatenate([size[fo], size[keep]]),
                np.concatenate([start, ev[keep]]), np.concatenate([ev[fo], np.full(len(keep), int(ev[-1]) + 1)])):
        return None
    return ended, (a[keep], a[keep] + size[keep], ev[keep].astype(np.int64), stream[keep],
                   np.zeros(len(keep), dtype=bool))


def segment_ranges(events) -> tuple[list[tuple[int, int, int, int, int, bool]], dict[int, tuple[int, int, int, bool]]]:
    """The segments' address ranges from their events `(entry, address, size, maps or allocates,
    stream, a mapping)` in order: (the ranges that ended, as (start entry, end entry, address,
    size, stream, mapped), start -1 for one mapped before the trace; the ranges live at the end,
    {start address: (end address, entry, stream, mapped)}).

    Address ranges, not whole segments: an expandable segment maps and unmaps pieces of itself,
    and an unmap may cover several maps or part of one. A free or unmap of a range nobody mapped
    in the trace was mapped before it began. The ranges a free or an unmap reaches are found by a
    search of the live ranges' sorted starts, which do not overlap in a trace that lost no event:
    each is O(log n), where a look over every live range made a run that maps and unmaps all the
    time quadratic (400,000 events with thousands of pieces mapped: minutes). Where the live
    ranges do overlap (a trace that lost events, untrusted input), every live range is looked at,
    as before. Either way the answer, and its order, are those of that look: the ranges reached,
    in the order they were put in."""
    from sortedcontainers import SortedList
    out: list[tuple[int, int, int, int, int, bool]] = []
    live: dict[int, tuple[int, int, int, bool]] = {}
    starts = SortedList()           # the live ranges' start addresses
    order: dict[int, int] = {}      # start address -> when it was put in `live` (the dict's order)
    count = 0
    disjoint = True                 # no two live ranges ever overlapped: the search is exact

    def put(pa: int, value: tuple[int, int, int, bool]) -> None:
        nonlocal count
        if pa not in live:
            starts.add(pa)
            order[pa] = count
            count += 1
        live[pa] = value

    def take(pa: int) -> tuple[int, int, int, bool]:
        starts.remove(pa)
        del order[pa]
        return live.pop(pa)

    def before(x: int, inclusive: bool):
        """The live range starting last before `x` (or at it): its start, or None. The last of
        all without a search where it is (the driver mostly maps at rising addresses; an index
        into a SortedList that grows rebuilds its positional index)."""
        if not starts:
            return None
        last = starts[-1]
        if last < x or (inclusive and last == x):
            return last
        return next(starts.irange(maximum=x, inclusive=(True, inclusive), reverse=True), None)

    for e, a, n_bytes, up, st, mapped in events:
        b = a + n_bytes
        if up:
            if disjoint:
                # the new range overlaps none: none starts inside it, and the one starting last
                # before it ends by its start (one starting at the same address is the one it
                # replaces); one search in the common case, the last start before its end
                q = before(b, False) if n_bytes > 0 else None
                if q == a:
                    q = before(a, False)
                disjoint = n_bytes > 0 and (q is None or (q < a and live[q][0] <= a))
            put(a, (b, e, st, mapped))
            continue
        if disjoint and n_bytes > 0:
            whole = live.get(a)
            if whole is not None and whole[0] >= b:
                reached = [a]                   # (a segment freed whole, a piece unmapped from its start)
            else:
                p = before(a, True)
                reached = [p] if p is not None and live[p][0] > a else []
                reached += starts.irange(a, b, inclusive=(False, False))
                if len(reached) > 1:
                    reached.sort(key=order.__getitem__)
        else:
            reached = [pa for pa, (pb, _, _, _) in live.items() if pa < b and pb > a]
        covered = 0
        for pa in reached:
            pb, pe, pst, pm = take(pa)
            out.append((pe, e, pa, pb - pa, pst, pm))
            covered += min(pb, b) - max(pa, a)
            if pa < a:                                  # the parts outside the range stay
                put(pa, (a, e, pst, pm))
            if pb > b:
                put(b, (pb, e, pst, pm))
        if n_bytes - covered > 0:
            out.append((-1, e, a, n_bytes - covered, st, mapped))
    return out, live


# -- typed results -------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Segments:
    """The allocator's segments live after one entry (address order), and the requested bytes
    of the allocations inside each."""
    address: np.ndarray
    size: np.ndarray
    allocated: np.ndarray
    known: bool = True              # False: the snapshot has no allocator segments


@dataclass(frozen=True)
class SegmentView:
    address: int
    size: int
    stream: int
    small: bool                  # the small pool (2 MiB segments)
    allocated: int               # requested bytes of live blocks (pending free included)
    rounding: int                # their rounding to whole 512-byte units
    pending: int                 # requested bytes of the live blocks whose free is pending
    cached: int                  # free: size minus the blocks' rounded bytes
    largest_free: int            # the longest free stretch inside it
    first_block: int             # blocks[first_block:first_block + n_blocks] are inside it
    n_blocks: int


@dataclass(frozen=True, eq=False)
class AllocatorState:
    """Every segment after entry `index` and the blocks in them (address order), with the
    totals (see the module docstring for what each figure measures)."""
    index: int
    segments: tuple[SegmentView, ...]
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
        return int(self.block_size.sum())

    @property
    def pending_free(self) -> int:
        """The part of `allocated` freed by the program whose stream has not finished with it."""
        return int(self.block_size[self.block_pending].sum())

    @property
    def rounding(self) -> int:
        return int((self.block_rounded - self.block_size).sum())

    @property
    def cached(self) -> int:
        return sum(s.cached for s in self.segments)

    @property
    def largest_free(self) -> int:
        return max((s.largest_free for s in self.segments), default=0)

    @property
    def reserved_unallocated(self) -> int | None:
        return reserved_unallocated(self.reserved, self.allocated) if self.known else None

    @property
    def cached_outside_largest_free(self) -> float:
        """The share of cached bytes outside the largest free block (0 with nothing cached)."""
        c = self.cached
        return 0.0 if c <= 0 else 1.0 - self.largest_free / c

    @property
    def streams(self) -> list[int]:
        return sorted({s.stream for s in self.segments})


# -- the history -----------------------------------------------------------------------------------
class AllocatorHistory:
    """One device's allocator segments as intervals of entries, per segment (or mapped piece
    of an expandable segment): `start`, `end` (live for start <= i < end; -1 / n + 1 when
    before / after the trace), `address`, `size`, `stream`, `expandable`, `small` (the small
    pool), and `streams` (the distinct streams). `known` is False when the snapshot has no
    allocator segments (profiler-converted) or the recording left their events out
    (skip_actions); every query then answers an empty state."""

    def __init__(self, snap, da):
        self.da = da
        self.n = n = int(da.n_entries)
        # (no segments, their events left out by the recording, or events that do not add up)
        self.known = da.reserved_known()
        self._free_requested: np.ndarray | None = None
        self._snap = snap
        z = np.zeros(0, dtype=np.int64)
        self.start = self.end = self.address = self.size = self.stream = z
        self.expandable = self.small = np.zeros(0, dtype=bool)
        self.streams = z
        if not self.known:
            return
        cols = snap.trace(da.device).columns
        act = np.asarray(da.trace_action)
        up_mask = (act == A_SEGMENT_ALLOC) | (act == A_SEGMENT_MAP)
        events = np.flatnonzero(up_mask | (act == A_SEGMENT_FREE) | (act == A_SEGMENT_UNMAP))
        # the events' fields, read a part of each column at a time and its pages handed back: the
        # events are spread over the trace (take_released)
        fields = tuple(np.asarray(take_released(cols[k], events), dtype=np.int64) if k in cols
                       else np.zeros(len(events), dtype=np.int64) for k in ("addr", "size", "stream"))
        big = n + 1
        # Address ranges, not whole segments (segment_ranges); the events' fields made Python
        # values a part at a time (at once, 400,000 events' took 140 MB)
        all_up = bool(up_mask[events].all())
        whole = None if all_up else _whole_segments(events, fields, up_mask, act)
        if all_up:
            ended = [np.zeros(0, dtype=np.int64)] * 5 + [np.zeros(0, dtype=bool)]
            la, lb, le, lst, lm = _made_only(events, fields, act)
        elif whole is not None:
            ended, (la, lb, le, lst, lm) = whole
        else:
            out, live = segment_ranges(_segment_events(events, fields, up_mask, act))
            ended = [np.asarray(c, dtype=np.int64) for c in (zip(*out) if out else [[]] * 6)]
            ended[5] = ended[5].astype(bool)
            la, lb, le, lst, lm = (np.fromiter(it, dtype=np.int64, count=len(live)) for it in (
                iter(live), (v[0] for v in live.values()), (v[1] for v in live.values()),
                (v[2] for v in live.values()), (v[3] for v in live.values())))
            lm = lm.astype(bool)
            del out, live
        # segments of the final state that no live range covers: mapped before the trace. Each
        # segment looks at the live ranges (by address) from the first that reaches past its start,
        # by the running highest end, to the first that starts at or past its end: not at all of them
        seg = snap.device_segments(da.device)
        by_addr = np.lexsort((lb, la))
        alive_a, alive_b = la[by_addr], lb[by_addr]
        reach = np.maximum.accumulate(alive_b) if len(alive_b) else alive_b
        before: list[tuple[int, int, int, int, int, bool]] = []
        for sa, sz, sst, sx in zip(np.asarray(seg["address"]).tolist(), np.asarray(seg["total_size"]).tolist(),
                                   np.asarray(seg["stream"]).tolist(), np.asarray(seg["is_expandable"]).tolist()):
            cur, sb = sa, sa + sz
            k0 = int(np.searchsorted(reach, sa, side="right"))
            k1 = max(k0, int(np.searchsorted(alive_a, sb, side="left")))
            for pa, pb in zip(alive_a[k0:k1].tolist(), alive_b[k0:k1].tolist()):
                if pb <= cur:
                    continue
                if pa > cur:
                    before.append((-1, big, cur, pa - cur, sst, bool(sx)))
                cur = max(cur, pb)
            if cur < sb:
                before.append((-1, big, cur, sb - cur, sst, bool(sx)))
        pre = [np.asarray(c, dtype=np.int64) for c in (zip(*before) if before else [[]] * 6)]
        n_live = len(la)
        parts = [(ended[0], le, pre[0]), (ended[1], np.full(n_live, big, dtype=np.int64), pre[1]),
                 (ended[2], la, pre[2]), (ended[3], lb - la, pre[3]), (ended[4], lst, pre[4])]
        self.start, self.end, self.address, self.size, self.stream = (np.concatenate(p) for p in parts)
        self.expandable = np.concatenate([ended[5].astype(bool), lm.astype(bool), pre[5].astype(bool)])
        self.streams = np.unique(self.stream)
        self.small = small_pool(self.address, self.size, np.asarray(da.allocs.addr), np.asarray(da.allocs.size))

    def live_at(self, i: int) -> np.ndarray:
        """bool per segment: live right after entry i."""
        return (self.start <= i) & (self.end > i)

    def allocated_in_segment(self, seg: int, i: int) -> int:
        """Bytes of the allocations live after entry i inside segment `seg`'s address range."""
        al = self.da.allocs
        rows = self.da.live_rows(i)
        a0 = int(self.address[seg])
        ra = np.asarray(al.addr)[rows]
        inside = (ra >= a0) & (ra < a0 + int(self.size[seg]))
        return int(np.asarray(al.size)[rows][inside].sum())

    def segments_at(self, i: int) -> Segments:
        if not self.known:
            z = np.zeros(0, dtype=np.int64)
            return Segments(z, z, z, known=False)
        live = self.live_at(i)
        addr, size = self.address[live], self.size[live]
        order = np.argsort(addr)
        addr, size = addr[order], size[order]
        al = self.da.allocs
        rows = self.da.live_rows(i)
        allocated = np.zeros(len(addr), dtype=np.int64)
        if len(addr) and len(rows):
            # a part of the live rows at a time: a moment of millions of live allocations (the
            # moment panel's, at the peak) held 140 MB of temporaries over all of them at once
            for s in range(0, len(rows), _PART):
                part = rows[s:s + _PART]
                ra = np.asarray(al.addr[part], dtype=np.int64)
                k = np.searchsorted(addr, ra, side="right") - 1
                ok = k >= 0
                ok[ok] = ra[ok] < addr[k[ok]] + size[k[ok]]
                # (float sums of sizes inside one segment: exact integers)
                allocated += np.bincount(k[ok], weights=al.size[part][ok].astype(np.float64),
                                         minlength=len(addr)).astype(np.int64)
        return Segments(addr, size, allocated)

    def state_at(self, i: int) -> AllocatorState:
        z = np.zeros(0, dtype=np.int64)
        if not self.known:
            return AllocatorState(i, (), z, z, z, z, np.zeros(0, dtype=bool), known=False)
        live = self.live_at(i)
        sa, ss, st, ex = self.address[live], self.size[live], self.stream[live], self.expandable[live]
        order = np.argsort(sa, kind="stable")
        sa, ss, st, ex = sa[order], ss[order], st[order], ex[order]
        # mapped pieces of one expandable segment that touch, on one stream: one segment
        if len(sa) > 1:
            join = np.zeros(len(sa), dtype=bool)
            join[1:] = (sa[1:] == sa[:-1] + ss[:-1]) & (st[1:] == st[:-1]) & ex[1:] & ex[:-1]
            first = np.flatnonzero(~join)
            ss = np.add.reduceat(ss, first)
            sa, st = sa[first], st[first]
        # blocks: the allocations live after i (those whose free is pending among them)
        al = self.da.allocs
        rows = self.da.live_rows(i)
        fr = self.free_requested_index()
        pending = (fr[rows] >= 0) & (fr[rows] <= i)
        ra = np.asarray(al.addr, dtype=np.int64)[rows]
        o = np.argsort(ra, kind="stable")
        rows, ra, pending = rows[o], ra[o], pending[o]
        size = np.asarray(al.size, dtype=np.int64)[rows]
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
            segs.append(SegmentView(base, n_bytes, int(st[k]), small, int(psz.sum()), int((pr - psz).sum()),
                                    int(psz[pp].sum()), max(0, n_bytes - used),
                                    int(gaps.max()) if len(gaps) else n_bytes, a, b - a))
        return AllocatorState(i, tuple(segs), ra, size, rnd, rows, pending)

    def free_requested_index(self) -> np.ndarray:
        """Per allocation row, the entry of its `free_requested` (-1: none recorded), computed once.

        Nearly always the entry right before the row's `free_completed` at the same address
        (the stream had nothing pending): those pair in one pass over the rows. The others (a
        free held back by another stream) are few; each is paired with the allocation live at
        its address when it happened."""
        if self._free_requested is not None:
            return self._free_requested
        da, n = self.da, self.n
        al = da.allocs
        n_rows = len(al)
        out = np.full(n_rows, -1, dtype=np.int32 if n < (1 << 31) - 1 else np.int64)
        act = np.asarray(da.trace_action)
        if n and n_rows:
            addr = self._snap.trace(da.device).columns["addr"]
            fi = np.asarray(al.free_index)
            row_addr = np.asarray(al.addr)
            step = 1 << 20                       # rows at a time: bounded temporaries at 10^7 events
            for s in range(0, n_rows, step):
                prev = fi[s:s + step].astype(np.int64) - 1
                k = np.flatnonzero(prev >= 0)
                pe = prev[k]
                instant = (act[pe] == A_FREE_REQUESTED) & (np.asarray(addr[pe]) == row_addr[s + k])
                out[s + k[instant]] = pe[instant]
            is_fr = act == A_FREE_REQUESTED
            if int(np.count_nonzero(is_fr)) > int(np.count_nonzero(out >= 0)):
                is_fr[out[out >= 0]] = False          # the rest: frees some stream held back
                rest = np.flatnonzero(is_fr)
                _pair_the_rest(al, rest, np.asarray(addr[rest], dtype=np.int64),
                               np.asarray(row_addr, dtype=np.int64), out)
        self._free_requested = out
        return out


def _pair_the_rest(al, fr, fr_addr, row_addr, out) -> None:
    """Each free_requested in `fr` to the row live at its address then (rows sorted by
    address, then allocation)."""
    ai = np.asarray(al.alloc_index, dtype=np.int64)
    fi = np.asarray(al.free_index, dtype=np.int64)
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


__all__ = ["AllocatorHistory", "AllocatorState", "SegmentView", "Segments", "reserved_unallocated", "rounded",
           "small_pool", "ROUND", "SMALL_SEGMENT", "SMALL_ALLOC_MAX"]
