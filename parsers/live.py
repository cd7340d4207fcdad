"""Live memory over time, allocation lifetimes and reserved memory, vectorized.

Definitions (DESIGN.md §2): an `alloc` adds its size, a `free_completed` (or the
legacy `free`) subtracts it. The state at the end of the trace is the snapshot's
blocks (`active_allocated` and `active_pending_free`, by `requested_size`, which
is what trace sizes are); replaying the trace backwards from there gives the
memory live before the trace began. Reserved memory does the same with segments
and `segment_*` events.

Live memory is computed from the allocation rows (`allocations`): at every moment it
is the sum of the rows live then, so the by-category totals at any moment add up to it
and it is never negative, whatever the trace holds. For a consistent trace that is the
definition above; a trace that dropped an event (two allocs at one address without a
free between, a free of a block already freed, a free whose size differs from its
alloc's) stays consistent with its own rows instead of giving a negative start. The
sort that pairing needs is done once when the caller already has the rows:
`live_model(snap, device, rows=allocations(snap, device))`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..common.arrays import isin
from .snapshot import Snapshot
from .tables import (A_ALLOC, A_FREE, A_FREE_COMPLETED, A_FREE_REQUESTED, A_SEGMENT_ALLOC, A_SEGMENT_FREE,
                     A_SEGMENT_MAP, A_SEGMENT_UNMAP, LIVE_BLOCK_STATES, release_mapped,
                     take_released)


@dataclass
class LiveModel:
    device: int
    n_events: int
    start_bytes: int
    end_bytes: int
    live_after: np.ndarray          # int64[n]: live bytes right after entry i
    peak_bytes: int
    peak_index: int                 # entry that reached the peak; -1 if the start is the peak
    reserved_start: int | None      # None: the snapshot has no allocator segments (profiler-converted)
    reserved_end: int | None
    reserved_peak: int | None
    # Reserved memory only changes at segment events (a few hundred even in huge traces):
    # kept sparse (the entries that change it, reserved bytes right after each of them),
    # made dense on first use of `reserved_after`.
    reserved_change_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    reserved_change_value: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _reserved_dense: np.ndarray | None = field(default=None, repr=False)

    def reserved_at(self, i: int) -> int | None:
        """Reserved bytes right after entry i (-1: at the start)."""
        if self.reserved_start is None:
            return None
        k = int(np.searchsorted(self.reserved_change_index, i, side="right")) - 1
        return self.reserved_start if k < 0 else int(self.reserved_change_value[k])

    @property
    def reserved_after(self) -> np.ndarray | None:
        """int64[n]: reserved bytes right after each entry (None: no allocator segments)."""
        if self.reserved_start is None:
            return None
        if self._reserved_dense is None:
            dense = np.full(self.n_events, self.reserved_start, dtype=np.int64)
            idx, val = self.reserved_change_index, self.reserved_change_value
            for k in range(len(idx)):      # one slice per segment event
                dense[idx[k]:idx[k + 1] if k + 1 < len(idx) else None] = val[k]
            self._reserved_dense = dense
        return self._reserved_dense


def live_model(snap: Snapshot, device: int, rows: "Allocations | None" = None) -> LiveModel:
    """Live and reserved memory of one device; `rows`: its allocation rows, when the caller
    has them already (they are computed otherwise)."""
    t = snap.trace(device)
    action = np.asarray(t.columns["action"])
    size = np.asarray(t.columns["size"])
    n = len(action)
    if rows is None:
        rows = allocations(snap, device)

    # live_after is built in place: one int64 array, no temporaries of that size.
    # Every alloc starts a row of its size (each `alloc` entry is one row: its size from the
    # rows, not the trace's column, whose pages may be let go by now); every free ends the one
    # row it ends.
    live_after = np.zeros(n, dtype=np.int64)
    made = rows.alloc_index >= 0
    live_after[rows.alloc_index[made]] = rows.size[made]
    del made
    ends = rows.free_index >= 0
    np.subtract.at(live_after, rows.free_index[ends], rows.size[ends])    # (numpy 2: 4x an indexed -=)
    del ends
    start_bytes = int(rows.size[rows.alloc_index < 0].sum())
    np.cumsum(live_after, out=live_after)
    live_after += start_bytes
    end_bytes = int(live_after[-1]) if n else start_bytes
    if n and int(live_after.max()) > start_bytes:
        peak_index = int(np.argmax(live_after))
        peak = int(live_after[peak_index])
    else:
        peak_index, peak = -1, start_bytes

    seg = snap.device_segments(device)
    reserved_end = int(seg["total_size"].sum())
    up = (action == A_SEGMENT_ALLOC) | (action == A_SEGMENT_MAP)
    down = (action == A_SEGMENT_FREE) | (action == A_SEGMENT_UNMAP)
    change = np.flatnonzero(up | down)
    del up, down
    a_ch = action[change]
    ch_size = take_released(size, change)      # (a part at a time: the sizes' pages were let go)
    signed = np.where((a_ch == A_SEGMENT_ALLOC) | (a_ch == A_SEGMENT_MAP), ch_size, -ch_size)
    del ch_size
    steps = np.cumsum(signed, dtype=np.int64)
    rtotal = int(steps[-1]) if len(steps) else 0
    reserved_start = reserved_end - rtotal
    values = steps + reserved_start
    reserved_peak = max(reserved_start, int(values.max()) if len(values) else reserved_start)
    if snap.layout == "profiler":
        return LiveModel(device, n, start_bytes, end_bytes, live_after, peak, peak_index, None, None, None,
                         change.astype(np.int64), values)
    live = LiveModel(device, n, start_bytes, end_bytes, live_after, peak, peak_index,
                     reserved_start, reserved_end, reserved_peak, change.astype(np.int64), values)
    return live


@dataclass
class Allocations:
    """One row per allocation: `alloc_index` -1 for blocks live before the trace began,
    `free_index` -1 for blocks still live at the end. `alloc_us`/`free_us` (-1 when unknown)
    are read from the trace's time stamps when first asked for (an export, a row's details):
    a `summary` never needs them, and at 10^7 events they were 80 MB of its peak memory."""
    device: int
    alloc_index: np.ndarray   # int32 (int64 for traces of 2^31 entries or more)
    free_index: np.ndarray    # same dtype
    addr: np.ndarray
    size: np.ndarray
    stack: np.ndarray         # int32
    time_us: np.ndarray | None = field(default=None, repr=False, compare=False)   # the trace's column
    _times: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.addr)

    @property
    def alloc_us(self) -> np.ndarray:
        return self._at("alloc", self.alloc_index)

    @property
    def free_us(self) -> np.ndarray:
        return self._at("free", self.free_index)

    def times_of(self, row: int) -> tuple[int, int]:
        """(alloc_us, free_us) of one row, without the whole columns."""
        return self._one(int(self.alloc_index[row])), self._one(int(self.free_index[row]))

    def _one(self, i: int) -> int:
        t = self.time_us
        return int(t[i]) if t is not None and 0 <= i < len(t) else -1

    def _at(self, key: str, idx: np.ndarray) -> np.ndarray:
        got = self._times.get(key)
        if got is None:
            t = np.asarray(self.time_us) if self.time_us is not None else np.zeros(0, dtype=np.int64)
            idx = np.asarray(idx)
            ok = (idx >= 0) & (idx < len(t))
            got = np.full(len(idx), -1, dtype=np.int64)
            got[ok] = t[idx[ok]]
            self._times[key] = got
        return got


def frees_at_request(snap: Snapshot, device: int) -> np.ndarray:
    """Trace indices of the `free_requested` entries that end an allocation: none in a
    trace that records `free_completed` (or torch 2.0's `free`); in one recorded with
    `skip_actions=["free_completed"]` (torch 2.13+), every `free_requested` but those of
    blocks still live at the end with no later alloc at their address (a free still pending
    on a stream when the snapshot was taken, or a window cut before its completion)."""
    t = snap.trace(device)
    action = np.asarray(t.columns["action"])
    none = np.zeros(0, dtype=np.int64)
    if not len(action) or (action == A_FREE_COMPLETED).any() or (action == A_FREE).any():
        return none
    fr = np.flatnonzero(action == A_FREE_REQUESTED)
    if not len(fr):
        return none
    addr = np.asarray(t.columns["addr"])
    blk = snap.device_blocks(device)
    live_end = blk["address"][np.isin(blk["state"], LIVE_BLOCK_STATES)]
    pending = isin(addr[fr], live_end)
    if pending.any():
        al = np.flatnonzero(action == A_ALLOC)
        a_addr = addr[al]
        order = np.lexsort((al, a_addr))          # by address, then index: the last is the latest
        a_addr, al = a_addr[order], al[order]
        k = np.searchsorted(a_addr, addr[fr[pending]], side="right") - 1
        if len(al):
            later = (k >= 0) & (a_addr[np.maximum(k, 0)] == addr[fr[pending]]) & (al[np.maximum(k, 0)] > fr[pending])
        else:
            later = np.zeros(len(k), dtype=bool)
        keep = np.ones(len(fr), dtype=bool)
        keep[np.flatnonzero(pending)[~later]] = False
        fr = fr[keep]
    return fr


def _by_address_then_time(ev: np.ndarray, ev_addr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The events `ev` (rising entry indices) and their addresses (int64, the caller's own:
    worked on in place), ordered by address, then entry. Where both fit one int64 (the
    addresses' common alignment shifted out, as CUDA's 512-byte blocks allow), one sort of those
    keys (ten times faster than a lexsort at 10^7 events); a lexsort where they do not."""
    n = len(ev)
    if n:
        lo = int(ev_addr.min())
        span = int(ev_addr.max()) - lo
        bits_ev = max(int(ev[-1]).bit_length(), 1)      # (ev rises: its last is its largest)
        low = int(np.bitwise_or.reduce(ev_addr - lo)) if span else 0
        shift = (low & -low).bit_length() - 1 if low else 0
        if (span >> shift).bit_length() + bits_ev <= 62:
            rel = ev_addr                               # (no copy of 8 bytes an event)
            rel -= lo
            rel >>= shift
            rel <<= bits_ev
            rel |= ev
            rel.sort()
            if ev.dtype == np.int32 and bits_ev <= 31:
                # the low 32 bits, then the entry's: no int64 temporary of the keys
                e_sorted = rel.astype(np.int32)
                e_sorted &= (1 << bits_ev) - 1
            else:
                e_sorted = (rel & ((1 << bits_ev) - 1)).astype(ev.dtype)
            rel >>= bits_ev
            rel <<= shift
            rel += lo
            return e_sorted, rel
    order = np.lexsort((ev, ev_addr))
    return ev[order], ev_addr[order]


def _by_first(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`first` (distinct entry indices, >= 0) sorted, `second` (entry indices or -1) along.
    Where the indices are dense (the allocations among a trace's entries), each `second` put at
    its `first` in a table of them and read back in order: no sort (3.3 million allocations of
    10^7 entries: 207 ms -> 83 ms, a 40 MB table for a moment)."""
    if len(first) and int(second.max()) < (1 << 31) - 2 and int(first.max()) < 8 * len(first):
        slot = np.zeros(int(first.max()) + 1, dtype=np.int32)
        slot[first] = second + 2                  # (0: no allocation there)
        f = np.flatnonzero(slot)
        s = slot[f].astype(np.int64)
        s -= 2
        return f.astype(first.dtype), s
    if len(first) and int(first.max()) < (1 << 31) and int(second.max()) < (1 << 31) - 1:
        key = first.astype(np.int64) << 32
        key |= second + 1
        key.sort()
        return (key >> 32).astype(first.dtype), (key & 0xFFFFFFFF) - 1
    order = np.argsort(first, kind="stable")
    return first[order], second[order]


def allocations(snap: Snapshot, device: int) -> Allocations:
    """Pair each `alloc` with the `free_completed` that ends it (same address, next
    event there; the `free_requested` of `frees_at_request` where the trace recorded no
    completions), vectorized: sort alloc/free events by (address, time)."""
    t = snap.trace(device)
    action = np.asarray(t.columns["action"])
    addr = np.asarray(t.columns["addr"])
    size = np.asarray(t.columns["size"])
    tus = np.asarray(t.columns["time_us"])
    stack = np.asarray(t.columns["stack"])
    idx_t = np.int32 if len(action) < (1 << 31) else np.int64
    is_ev = (action == A_ALLOC) | (action == A_FREE_COMPLETED) | (action == A_FREE)
    is_ev[frees_at_request(snap, device)] = True
    ev = np.flatnonzero(is_ev).astype(idx_t)
    del is_ev
    ev_addr = addr[ev].astype(np.int64, copy=False)
    # the column's pages let go once its events' addresses are copied out: the rows' own are
    # read again below a part at a time (at 10^7 entries its 76 MB, and the sizes', were in the
    # highest memory of the pairing, and of a cold `summary` of a torch 2.0 trace)
    release_mapped(addr)
    e_sorted, addr_sorted = _by_address_then_time(ev, ev_addr)
    del ev, ev_addr
    a_sorted = action[e_sorted] == A_ALLOC
    same_next = np.zeros(len(e_sorted), dtype=bool)
    if len(e_sorted) > 1:
        np.equal(addr_sorted[:-1], addr_sorted[1:], out=same_next[:-1])
    del addr_sorted
    # an alloc followed (at the same address) by a free: a closed interval
    paired = a_sorted & same_next
    paired[:-1] &= ~a_sorted[1:]
    paired[-1:] = False
    alloc_pos = np.flatnonzero(a_sorted)
    free_of_alloc = np.full(len(alloc_pos), -1, dtype=np.int64)
    paired_at = paired[alloc_pos]
    free_of_alloc[paired_at] = e_sorted[alloc_pos[paired_at] + 1]
    alloc_idx = e_sorted[alloc_pos]
    del paired, paired_at, alloc_pos
    # a free with no alloc before it at that address: the block predates the trace
    prev_is_alloc = np.zeros(len(e_sorted), dtype=bool)
    prev_is_alloc[1:] = a_sorted[:-1] & same_next[:-1]
    pre_free = np.sort(e_sorted[~a_sorted & ~prev_is_alloc])
    del prev_is_alloc, a_sorted, same_next, e_sorted

    # blocks live at the end with no alloc in the trace that is still live: predate it too
    blk = snap.device_blocks(device)
    live_blk = np.isin(blk["state"], LIVE_BLOCK_STATES)
    still_live_allocs = alloc_idx[free_of_alloc < 0]
    end_addrs = blk["address"][live_blk]
    untraced = ~isin(end_addrs, addr[still_live_allocs])
    pre_live_addr = end_addrs[untraced]
    pre_live_size = blk["requested_size"][live_blk][untraced]
    pre_live_stack = blk["stack"][live_blk][untraced]

    n_pf, n_pl = len(pre_free), len(pre_live_addr)
    alloc_idx, free_of_alloc = _by_first(alloc_idx, free_of_alloc)

    def cat(*xs, dtype=np.int64):
        return np.concatenate([np.asarray(x, dtype=dtype) for x in xs])

    # entry indices fit int32 for any trace under 2^31 entries: half the memory of
    # these and of every array the classifier derives from them
    a_index = cat(np.full(n_pl, -1), np.full(n_pf, -1), alloc_idx, dtype=idx_t)
    f_index = cat(np.full(n_pl, -1), pre_free, free_of_alloc, dtype=idx_t)
    out_addr = cat(pre_live_addr, take_released(addr, pre_free), take_released(addr, alloc_idx))
    out_size = cat(pre_live_size, take_released(size, pre_free), take_released(size, alloc_idx))
    out_stack = np.concatenate([pre_live_stack.astype(np.int32), stack[pre_free].astype(np.int32),
                                stack[alloc_idx].astype(np.int32)])
    return Allocations(device, a_index, f_index, out_addr, out_size, out_stack, tus)
