"""Where the user's notes sit on a device's trace (no Qt here).

The notes themselves live in `vramscope.services.annotations.AnnotationStore` (Qt-free, undo,
atomic autosave); these functions map them onto the entries of the device shown.
"""
from __future__ import annotations

import os
from typing import Literal

import numpy as np

from .device import DeviceData


def _index_of_us(d: DeviceData, us: int, side: Literal["left", "right"]) -> int:
    assert d.tkey is not None
    return int(np.searchsorted(d.tkey, int(us), side=side))


def note_span(d: DeviceData | None, ann) -> tuple[int, int] | None:
    """(first, last) trace entries a note is attached to on the shown device, or None
    when it belongs to another device or cannot be placed (a range with neither
    entries nor times, times on a trace without them)."""
    if d is None or (ann.device is not None and ann.device != d.device):
        return None
    last_entry = max(d.n - 1, 0)

    def clip(i):
        return int(min(max(int(i), -1), last_entry))
    if ann.kind == "range":
        if ann.start_index is not None and ann.end_index is not None:
            a, b = sorted((clip(ann.start_index), clip(ann.end_index)))
            return a, b
        if ann.start_us is not None and ann.end_us is not None and d.tkey is not None and d.n:
            a = _index_of_us(d, min(ann.start_us, ann.end_us), "left")
            b = _index_of_us(d, max(ann.start_us, ann.end_us), "right") - 1
            return clip(a), clip(max(a, b))
        return None
    if ann.kind == "peak":
        if ann.index is not None:
            i = ann.index
        elif ann.time_us is not None and d.tkey is not None and d.n:
            i = _index_of_us(d, ann.time_us, "left")
        else:
            i = d.peak_index
        return clip(i), clip(i)
    if ann.alloc_index is not None:
        i = clip(ann.alloc_index)
        return i, i
    row = note_row(d, ann)
    if row >= 0:
        i = clip(int(d.alloc_index[row]))
        return i, i
    return None


def note_row(d: DeviceData | None, ann) -> int:
    """The allocation row an 'allocation' note points at (-1: none on this device)."""
    if d is None or ann.kind != "allocation" or (ann.device is not None and ann.device != d.device):
        return -1
    addr = np.asarray(d.allocs.addr)
    if ann.alloc_index is not None and ann.alloc_index >= 0:
        row = d.row_of_alloc_event(ann.alloc_index)
        if row >= 0 and (ann.addr is None or int(addr[row]) == ann.addr):
            return row
        return -1
    if ann.addr is None:
        return -1
    # live before the trace began: the pre-existing block at that address
    hit = np.flatnonzero((addr == ann.addr) & (d.alloc_index < 0))
    if not len(hit) and ann.alloc_index is None:
        hit = np.flatnonzero(addr == ann.addr)
    return int(hit[0]) if len(hit) else -1


def first_line(text: str, limit: int = 60) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


def home_short(path: str) -> str:
    home = os.path.expanduser("~")
    if home and home != os.sep and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home):]
    return path


def location_notice(store, short: bool = False) -> str | None:
    """A sentence saying where the notes go when that is not next to the snapshot
    (`short`: the folder rather than the file, for the status bar)."""
    if store is None or store.path == store.next_to_snapshot:
        return None
    folder = os.path.dirname(store.snapshot_path)
    where = home_short(os.path.dirname(store.path) if short else store.path)
    return f"Notes are saved to {where} because {home_short(folder)} is read-only."
