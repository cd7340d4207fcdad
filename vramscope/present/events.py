"""The allocator's events in words: the rows of an event list and the block map's header.

The numbers are the analysis' (classifiers/events.py: `event_window`, `allocation_rows`);
here each entry gets what a user reads: torch's name for its action, the code it came from
as briefly as a label can say it ('train.py:88'), the category of the allocation it belongs
to and how sure that is.

  event_rows(da, stacks, start, stop)   EventRow per entry of the window
  event_header(da, stacks, index)       'entry 1,234: free_completed 64.00 MiB (activations)
                                         at 0x7f3a2c000000, train.py:88'
"""
from __future__ import annotations

from dataclasses import dataclass

from ..classifiers.categories import CATEGORIES
from ..classifiers.events import EventWindow, event_window
from ..classifiers.evidence import EVIDENCE
from ..common.units import fmt_bytes
from .stacks import Stacks
from .words import EVIDENCE_WORDS


@dataclass(frozen=True)
class EventRow:
    """One trace entry as an event list shows it."""
    index: int
    action: str                     # torch's name: alloc, free_requested, free_completed, segment_map, ...
    addr: int
    size: int
    stream: int
    time_us: int | None             # None: not recorded
    where: str                      # the code it came from, briefly ('train.py:88')
    category: str                   # of the allocation it belongs to; '' for none (segment events)
    evidence: str                   # what that category rests on; '' for none
    row: int                        # that allocation's row, -1 none


def addr_text(addr: int) -> str:
    """An address as torch and memory_viz print it: '0x7f3a2c000000'."""
    return f"0x{int(addr) & ((1 << 64) - 1):x}"


def action_name(da, code: int) -> str:
    names = da.snapshot.action_names if da.snapshot is not None else []
    return str(names[code]) if 0 <= code < len(names) else f"action {code}"


FREES = ("free_requested", "free_completed", "free")


def window_rows(da, stacks: Stacks, w: EventWindow) -> list[EventRow]:
    """`w`'s entries as EventRows. A free whose own stack has no code of the user's (a C++
    destructor dropping the last reference: 'std::vector<at::Tensor>::~vector') is named
    by the allocation it frees: 'of train.py:88'."""
    out = []
    user = stacks.facts.user_frame
    alloc_stack = da.allocs.stack
    for k in range(len(w)):
        c, e, t, sid, row = int(w.category[k]), int(w.evidence[k]), int(w.time_us[k]), int(w.stack[k]), int(w.row[k])
        action = action_name(da, int(w.action[k]))
        # an entry on an allocation says when it has no frames; others (snapshot) say nothing
        where = stacks.site_short_of(sid, int(w.forward_stack[k])) if sid >= 0 or row >= 0 else ""
        if action in FREES and row >= 0 and not (0 <= sid < len(user) and user[sid] >= 0):
            made = int(alloc_stack[row])
            if made >= 0 and made != sid:
                where = f"of {stacks.site_short_of(made)}"
        out.append(EventRow(int(w.index[k]), action, int(w.addr[k]), int(w.size[k]),
                            int(w.stream[k]), t if t >= 0 else None, where,
                            CATEGORIES[c] if c >= 0 else "", EVIDENCE[e] if e >= 0 else "", row))
    return out


def event_rows(da, stacks: Stacks, start: int, stop: int) -> list[EventRow]:
    """Entries `start` .. `stop` - 1 of one device (clipped) as an event list's rows."""
    return window_rows(da, stacks, event_window(da, start, stop))


def event_row(da, stacks: Stacks, index: int) -> EventRow | None:
    rows = event_rows(da, stacks, index, index + 1)
    return rows[0] if rows else None


def event_text(ev: EventRow) -> str:
    """'free_completed 64.00 MiB (activations) at 0x7f3a2c000000, train.py:88'."""
    what = ev.action
    if ev.size:
        what += f" {fmt_bytes(ev.size)}"
    if ev.category:
        sure = f", {EVIDENCE_WORDS['guess']}" if ev.evidence == "guess" else ""
        what += f" ({ev.category}{sure})"
    if ev.addr:
        what += f" at {addr_text(ev.addr)}"
    return f"{what}, {ev.where}" if ev.where else what


def event_header(da, stacks: Stacks, index: int) -> str:
    """The block map's header for entry `index`: which event it is ('entry 1,234:
    free_completed 64.00 MiB (activations) at 0x7f3a2c000000, train.py:88'); before the
    trace: 'before the trace'."""
    if index < 0:
        return "before the trace"
    ev = event_row(da, stacks, index)
    if ev is None:
        return f"entry {index:,}: not in the trace ({da.n_entries:,} entries)"
    return f"entry {ev.index:,}: {event_text(ev)}"


__all__ = ["EventRow", "addr_text", "action_name", "window_rows", "event_rows", "event_row", "event_text",
           "event_header"]
