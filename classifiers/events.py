"""The allocator's events of one device, as rows for an event list (no Python object per event).

    w = event_window(da, start, stop)        # EventWindow: entries start..stop-1 as columns
    allocation_rows(da, indices)             # the allocation row each entry belongs to, -1 none
    segment_events(da)                       # entries that map or unmap device memory
    next_segment_event(da, index, step)      # the next (step +1) / previous (-1) one, -1 none
    prepare_events(da)                       # build the per-device parts now (a loader thread)

An entry belongs to an allocation when it is that allocation's `alloc`, its `free_completed`
(torch 2.0: `free`; a trace recorded without completions: the `free_requested` that ends it),
its `free_requested`, or an `annotate` of it (torch 2.14): the row at the entry's address
that is live there. Segment events (`segment_alloc`, `segment_free`, `segment_map`,
`segment_unmap`) belong to none. Everything is read from the trace's columns and the
allocation rows; the allocator's simulation is not needed.

A window costs a slice of each column and two binary searches per entry: a few hundred rows
take well under a millisecond at 10^6 events. What is built once per device (an order of
the rows by address, the segment events) is memoized.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..parsers.tables import (
    A_ALLOC,
    A_ANNOTATE,
    A_FREE,
    A_FREE_COMPLETED,
    A_FREE_REQUESTED,
    A_SEGMENT_ALLOC,
    A_SEGMENT_FREE,
    A_SEGMENT_MAP,
    A_SEGMENT_UNMAP,
)

SEGMENT_ACTIONS = (A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP)


@dataclass(frozen=True, eq=False)
class EventWindow:
    """Trace entries `index` (consecutive, from `start`) of one device, as columns."""
    start: int
    index: np.ndarray               # int64: the entries
    action: np.ndarray              # uint8: codes into the snapshot's `action_names`
    addr: np.ndarray                # int64
    size: np.ndarray                # int64
    stream: np.ndarray              # int64
    time_us: np.ndarray             # int64, -1 unknown
    stack: np.ndarray               # int32: the entry's stack, -1 none
    forward_stack: np.ndarray       # int32: torch 2.13's forward stack of the entry, -1 none
    row: np.ndarray                 # int64: the allocation row it belongs to, -1 none
    category: np.ndarray            # int16: that row's category (CATEGORIES), -1 none
    evidence: np.ndarray            # int16: that row's evidence (EVIDENCE), -1 none

    def __len__(self) -> int:
        return len(self.index)


@dataclass(frozen=True, eq=False)
class _AddressOrder:
    """Allocation rows by (address, alloc index), as one sorted int64 key."""
    rows: np.ndarray                # the rows in that order
    addrs: np.ndarray               # their addresses
    key: np.ndarray                 # address rank * (entries + 2) + alloc index + 1, increasing
    rank: np.ndarray                # the address rank of each


_ORDER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()      # DeviceAnalysis -> _AddressOrder
_SEGMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # DeviceAnalysis -> np.ndarray


def _address_order(da) -> _AddressOrder:
    o = _ORDER.get(da)
    if o is None:
        a = da.allocs
        # rows come in alloc-index order (parsers.allocations): a stable sort by address
        # leaves each address's rows in that order
        rows = np.argsort(a.addr, kind="stable")
        addrs = np.asarray(a.addr)[rows]
        rank = np.zeros(len(rows), dtype=np.int64)
        if len(rows) > 1:
            np.cumsum(addrs[1:] != addrs[:-1], out=rank[1:])
        key = rank * (da.n_entries + 2) + np.asarray(a.alloc_index, dtype=np.int64)[rows] + 1
        o = _ORDER[da] = _AddressOrder(rows, addrs, key, rank)
    return o


def allocation_rows(da, indices) -> np.ndarray:
    """int64 per entry of `indices`: the allocation row the entry belongs to (see the module
    docstring), -1 for none."""
    idx = np.asarray(indices, dtype=np.int64)
    out = np.full(len(idx), -1, dtype=np.int64)
    if not len(idx) or not len(da.allocs):
        return out
    cols = da.snapshot.trace(da.device).columns
    action = np.asarray(cols["action"])[idx]
    addr = np.asarray(cols["addr"])[idx]
    block = np.isin(action, (A_ALLOC, A_FREE_REQUESTED, A_FREE_COMPLETED, A_FREE, A_ANNOTATE))
    if not block.any():
        return out
    o = _address_order(da)
    q, qa, qi = np.flatnonzero(block), addr[block], idx[block]
    lo = np.searchsorted(o.addrs, qa, side="left")
    same = (lo < len(o.addrs)) & (o.addrs[np.minimum(lo, len(o.addrs) - 1)] == qa)
    qkey = o.rank[np.minimum(lo, len(o.addrs) - 1)] * (da.n_entries + 2) + qi + 1
    p = np.searchsorted(o.key, qkey, side="right") - 1     # the last row there allocated by then
    ok = same & (p >= lo)
    row = np.where(ok, o.rows[np.maximum(p, 0)], -1)
    a = da.allocs
    r = np.maximum(row, 0)
    ai, fi, act = np.asarray(a.alloc_index)[r], np.asarray(a.free_index)[r], action[block]
    live_then = (fi < 0) | (fi >= qi)
    ok &= np.where(act == A_ALLOC, ai == qi,
                   np.where((act == A_FREE_COMPLETED) | (act == A_FREE), fi == qi, live_then))
    out[q[ok]] = row[ok]
    return out


def event_window(da, start: int, stop: int) -> EventWindow:
    """Entries `start` .. `stop` - 1 of one device (clipped to the trace) as columns."""
    n = da.n_entries
    start, stop = max(0, int(start)), min(n, int(stop))
    stop = max(start, stop)
    cols = da.snapshot.trace(da.device).columns
    sl = slice(start, stop)
    idx = np.arange(start, stop, dtype=np.int64)
    fwd = da.trace_forward_stack
    row = allocation_rows(da, idx)
    has = row >= 0
    cat = np.full(len(idx), -1, dtype=np.int16)
    ev = np.full(len(idx), -1, dtype=np.int16)
    cat[has] = da.category[row[has]]
    if len(da.evidence):
        ev[has] = da.evidence[row[has]]
    return EventWindow(start, idx, np.asarray(cols["action"][sl]), np.asarray(cols["addr"][sl], dtype=np.int64),
                       np.asarray(cols["size"][sl], dtype=np.int64), np.asarray(cols["stream"][sl], dtype=np.int64),
                       np.asarray(cols["time_us"][sl], dtype=np.int64), np.asarray(cols["stack"][sl], dtype=np.int32),
                       np.asarray(fwd[sl], dtype=np.int32) if fwd is not None
                       else np.full(len(idx), -1, dtype=np.int32), row, cat, ev)


def prepare_events(da) -> None:
    """Build what every window of this device shares (the rows by address, the segment
    events) now, off the GUI thread: the first window then costs no more than the others."""
    _address_order(da)
    segment_events(da)


def segment_events(da) -> np.ndarray:
    """int64: the entries that map or unmap device memory (segment_alloc / free / map /
    unmap), in order; computed once per device."""
    s = _SEGMENTS.get(da)
    if s is None:
        s = _SEGMENTS[da] = np.flatnonzero(np.isin(da.trace_action, SEGMENT_ACTIONS)).astype(np.int64)
    return s


def next_segment_event(da, index: int, step: int = 1) -> int:
    """The first segment event after entry `index` (`step` > 0) or before it (`step` < 0),
    -1 when there is none."""
    seg = segment_events(da)
    if step > 0:
        k = int(np.searchsorted(seg, index, side="right"))
        return int(seg[k]) if k < len(seg) else -1
    k = int(np.searchsorted(seg, index, side="left")) - 1
    return int(seg[k]) if k >= 0 else -1


__all__ = ["EventWindow", "SEGMENT_ACTIONS", "event_window", "allocation_rows", "prepare_events", "segment_events",
           "next_segment_event"]
