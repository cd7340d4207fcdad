"""What the recording itself says: actions it left out by design, and pinned host memory.

`skipped_actions` (torch 2.13+ `_record_memory_history(skip_actions=[...])`): torch never
records the listed actions and says so nowhere in the file, so we infer it, and only where
the trace proves it: every free of torch >= 2.1 is recorded as `free_requested` then
`free_completed`, so a trace with one and none of the other skipped it; allocations at
addresses that no segment of the snapshot holds, in a trace with no segment event at all,
lie in segments that came and went unrecorded. A trace without segment events whose
allocations all lie in the final segments proves nothing (its segments may all predate it)
and is not reported. Frees skipped as `free_completed` are counted when requested
(parsers.live.frees_at_request); skipped segment events leave reserved memory over the trace
unknown.

`host_memory` (torch 2.14 `record_pinned_host_memory=True`, pytorch #182407): the pinned
host allocator's own trace and segments, analysed like a device's live memory (the same
pairing of allocations, the same replay) as its own memory space: never part of a GPU's peak.
"""
from __future__ import annotations

import numpy as np

from ..parsers import Snapshot, allocations, live_model
from ..parsers.live import frees_at_request
from ..parsers.tables import (A_ALLOC, A_FREE, A_FREE_COMPLETED, A_FREE_REQUESTED, A_SEGMENT_ALLOC,
                              A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP, HOST_DEVICE)
from .results import HostMemory


MIN_ENTRIES = 8      # fewer say nothing: `enabled="state"` keeps one entry, a trimmed window a few


def skipped_actions(snap: Snapshot, device: int) -> tuple[str, ...]:
    """The actions the device's trace provably left out (see the module docstring)."""
    action = np.asarray(snap.trace(device).columns["action"])
    if len(action) < MIN_ENTRIES or snap.layout == "profiler":
        return ()
    n = np.bincount(action, minlength=256)
    out = []
    if n[A_FREE]:                        # torch 2.0: one `free` per free, neither of the two
        return ()
    if n[A_FREE_COMPLETED] and not n[A_FREE_REQUESTED]:
        out.append("free_requested")
    if n[A_FREE_REQUESTED] and not n[A_FREE_COMPLETED] and len(frees_at_request(snap, device)):
        out.append("free_completed")
    if not n[A_ALLOC] and (n[A_FREE_REQUESTED] or n[A_FREE_COMPLETED]):
        out.append("alloc")
    seg_events = n[A_SEGMENT_ALLOC] + n[A_SEGMENT_FREE] + n[A_SEGMENT_MAP] + n[A_SEGMENT_UNMAP]
    if n[A_ALLOC] and not seg_events and _allocs_outside_segments(snap, device, action):
        seg = snap.device_segments(device)
        expandable = bool(len(seg["is_expandable"]) and seg["is_expandable"].all())
        out += ["segment_map", "segment_unmap"] if expandable else ["segment_alloc", "segment_free"]
    return tuple(out)


def _allocs_outside_segments(snap: Snapshot, device: int, action: np.ndarray) -> bool:
    """Whether an allocation of the trace lies outside every segment the snapshot holds on
    `device` (none holds any when the device has no segments: a state cut from the file, or
    segments all released, or listed under another device)."""
    addr = np.asarray(snap.trace(device).columns["addr"])[action == A_ALLOC]
    seg = snap.device_segments(device)
    start = seg["address"]
    if not len(start):
        return bool(len(addr))
    order = np.argsort(start, kind="stable")
    start, end = start[order], start[order] + seg["total_size"][order]
    k = np.searchsorted(start, addr, side="right") - 1
    inside = (k >= 0) & (addr < end[np.maximum(k, 0)])
    return bool((~inside).any())


def host_memory(snap: Snapshot) -> HostMemory | None:
    """Pinned host memory over its own trace, or None when the file recorded none."""
    if not snap.has_host:
        return None
    rows = allocations(snap, HOST_DEVICE)
    live = live_model(snap, HOST_DEVICE, rows=rows)
    t = snap.trace(HOST_DEVICE)
    tus = np.asarray(t.columns["time_us"])
    p = live.peak_index
    segs = snap.device_segments(HOST_DEVICE)
    return HostMemory(entries=len(t), allocations=len(rows),
                      allocations_before_trace=int(np.count_nonzero(rows.alloc_index < 0)),
                      peak_bytes=int(live.peak_bytes), peak_index=int(p),
                      peak_time_us=int(tus[p]) if p >= 0 and tus[p] >= 0 else None,
                      start_live_bytes=int(live.start_bytes), end_live_bytes=int(live.end_bytes),
                      reserved_peak_bytes=None if live.reserved_peak is None else int(live.reserved_peak),
                      reserved_end_bytes=int(segs["total_size"].sum()), segments=len(segs["address"]),
                      skipped_actions=skipped_actions(snap, HOST_DEVICE))


__all__ = ["skipped_actions", "host_memory"]
