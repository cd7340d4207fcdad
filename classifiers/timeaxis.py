"""Seconds or entries: which x axis shows a run, and why (one rule for every timeline).

    ax = x_axis(da)                              # a DeviceAnalysis -> XAxis
    ax = choose_x_axis(time_us, iterations)      # the same from the columns

A seconds axis tells how long things took; an entry axis gives every allocator event the
same room. Seconds mislead when they squeeze most of the run into a sliver: loading before
the first step, a first iteration slowed by warm-up or compilation (the H100 LoRA run in
tests/data: iteration 1 takes 3.04 s of 3.51 s, and iterations 2-4, three quarters of the
entries, sit in the right 2.5% of the axis). The rule, in order:

  no_times             no usable time stamps (profiler-converted files have none; -1 is
                       unknown; all equal)                                     -> entries
  one_pause            one gap between two entries takes over half the run    -> entries
  iterations_squeezed  with two iterations or more: all but the slowest would get under a
                       quarter of the room on a seconds axis that they get on an entry axis
                       (an iteration's room: from its start to the next one's start, the
                       last to its end)
                                                                              -> entries
  idle                 with two iterations or more: the longest gaps, one per iteration,
                       take over three quarters of the run (a loop that sleeps, waits for
                       data or for another rank between short bursts of work): the work
                       itself, its phases, would get under a quarter of the axis -> entries
  crowded              the densest stretch holding half of the entries takes under a
                       quarter of that share of the run's time (under 12.5%)  -> entries
  even                 none of these                                          -> seconds

Time stamps out of order (several streams) are read as their running maximum, as the
timeline draws them. The words are vramscope/present/timeaxis.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .iterations import Iterations, starts_ends

SQUEEZE = 4.0           # a stretch given under 1/SQUEEZE of the room entries give it is squeezed
PAUSE_SHARE = 0.5       # one gap longer than this share of the run: entries
AXIS_REASONS = ("no_times", "one_pause", "iterations_squeezed", "idle", "crowded", "even")


@dataclass(frozen=True)
class XAxis:
    """The x axis a timeline of one device starts with, and the facts that decided it."""
    unit: str                       # "seconds" | "entries"
    reason: str                     # AXIS_REASONS
    has_times: bool                 # seconds are possible (a switch can offer them)
    span_us: int = 0                # first entry to last (0 without times)
    pause_us: int = 0               # the longest gap between two entries ...
    pause_before: int = -1          # ... and the entry after it
    # the stretch a seconds axis would squeeze (iterations_squeezed, crowded), or the one
    # that was looked at (even): its entries, and its shares of the entries and of the time
    first: int = -1
    last: int = -1
    entries_share: float = 0.0
    seconds_share: float = 0.0
    iterations: tuple[int, ...] = ()   # iterations_squeezed: the squeezed iterations (Iteration.number)
    slowest: int = 0                # iterations_squeezed: the slowest iteration's number ...
    slowest_us: int = 0             # ... and its room on a seconds axis (to the next one's start)
    idle_us: int = 0                # idle: the time in the longest gaps, one per iteration ...
    idle_gaps: int = 0              # ... and how many gaps that is

    @property
    def seconds(self) -> bool:
        return self.unit == "seconds"

    @property
    def squeeze(self) -> float:
        """How many times less room the stretch gets in seconds than in entries (1: even)."""
        return self.entries_share / self.seconds_share if self.seconds_share > 0 else float("inf")


def choose_x_axis(time_us, iterations=()) -> XAxis:
    """The x axis for a trace with time stamps `time_us` (µs, -1 unknown) and the analysis'
    `iterations` (results.Iteration, numbered from 1); see the module docstring."""
    tus = np.asarray(time_us, dtype=np.int64)
    n = len(tus)
    if n < 2 or int(tus.min()) < 0:
        return XAxis("entries", "no_times", False)
    t = np.maximum.accumulate(tus) if not bool(np.all(tus[1:] >= tus[:-1])) else tus
    span = int(t[-1] - t[0])
    if span <= 0:
        return XAxis("entries", "no_times", False)
    k, pause = _longest_gap(t)
    base = XAxis("entries", "one_pause", True, span_us=span, pause_us=pause, pause_before=k + 1)
    if pause > PAUSE_SHARE * span:
        return base

    if isinstance(iterations, Iterations):
        S, E, num = iterations.start, iterations.end, iterations.numbers
    else:
        S, E = starts_ends(iterations)
        num = np.fromiter((it.number for it in iterations), np.int64, len(iterations))
    ok = (S >= 0) & (S <= E) & (E < n)
    S, E, num = S[ok], E[ok], num[ok]
    if len(S) >= 2:
        # the room an iteration takes on the axis: from its start to the next one's (a pause
        # between two steps is the earlier one's), the last to its end
        nxt = np.r_[S[1:], E[-1]]
        took = t[nxt] - t[S]
        slow = int(np.argmax(took))
        rest = np.ones(len(S), dtype=bool)
        rest[slow] = False
        e_share = int((nxt[rest] - S[rest]).sum()) / n
        s_share = int(took[rest].sum()) / span
        if s_share * SQUEEZE < e_share:
            return replace(base, reason="iterations_squeezed", first=int(S[rest][0]), last=int(E[rest][-1]),
                           entries_share=e_share, seconds_share=s_share, iterations=tuple(num[rest].tolist()),
                           slowest=int(num[slow]), slowest_us=int(took[slow]))

        # the longest gaps, as many as there are iterations: when they hold most of the run,
        # the work between them is a sliver of a seconds axis
        g = min(len(S), n - 1)
        idle = _longest_gaps_sum(t, g)
        if idle * SQUEEZE > (SQUEEZE - 1) * span:
            return replace(base, reason="idle", idle_us=idle, idle_gaps=g,
                           entries_share=1.0, seconds_share=(span - idle) / span)

    # the densest stretch of half the entries: the shortest time between entry i and i + w
    w = (n - 1) // 2
    if w < 1:
        return replace(base, unit="seconds", reason="even")
    i, shortest = _shortest_stretch(t, w)
    e_share, s_share = (w + 1) / n, float(shortest) / span
    crowded = s_share * SQUEEZE < e_share
    return replace(base, unit="entries" if crowded else "seconds", reason="crowded" if crowded else "even",
                   first=i, last=i + w, entries_share=e_share, seconds_share=s_share)


# The passes over the times, a part at a time: no full-length temporaries (at 10^7 entries the
# gaps alone were 80 MB, made while the viewer's open held its most memory).
_PART = 1 << 20
_GAPS_PART = 1 << 18      # ... and by `_longest_gaps_sum`, which runs beside the analysis in the viewer's open


def _longest_gap(t: np.ndarray) -> tuple[int, int]:
    """(k, t[k + 1] - t[k]) of the longest gap between two entries, the first such."""
    best_k, best = 0, None
    for lo in range(0, len(t) - 1, _PART):
        g = np.diff(t[lo:lo + _PART + 1])
        j = int(np.argmax(g))
        if best is None or int(g[j]) > best:
            best_k, best = lo + j, int(g[j])
    return best_k, int(best or 0)


def _longest_gaps_sum(t: np.ndarray, g: int) -> int:
    """The sum of the `g` longest gaps between two entries."""
    if g <= 0:
        return 0
    # only gaps at least as long as the g-th longest of a sample of them can be among the g
    # longest of all: the parts' gaps are filtered by that floor (raised as longer ones are
    # kept), not each part partitioned (0.54 s at 10^7 entries and 2,000 iterations). Gaps
    # equal to the floor are counted, not kept: times stamped in whole microseconds make
    # many equal gaps (55,659 iterations at 10^7 entries: a fifth of all gaps were at least
    # the floor, kept and partitioned again and again, 1.2 s beside the viewer's open)
    n = len(t) - 1
    # (a sample of a part's size at most: any sample's g-th longest is a floor for all of them;
    # 55,000 iterations at 10^7 entries made it 5 million gaps, 80 MB with its partition)
    step = max(1, n // (64 * g), n // _GAPS_PART)
    floor = 0
    if step > 1:
        m = (n - 1) // step + 1
        sample = t[1::step][:m] - t[0::step][:m]
        if len(sample) >= g:
            floor = int(np.partition(sample, len(sample) - g)[len(sample) - g])
    # at least g gaps are >= floor throughout: `kept` holds those above it, and what the g
    # longest hold beyond those is gaps of the floor's length
    kept = np.zeros(0, dtype=np.int64)
    for lo in range(0, n, _GAPS_PART):
        part = np.diff(t[lo:lo + _GAPS_PART + 1])
        kept = np.concatenate([kept, part[part > floor]])
        if len(kept) > max(4 * g, _GAPS_PART):  # bounded: the g longest so far set the floor
            floor = int(np.partition(kept, len(kept) - g)[len(kept) - g])
            kept = kept[kept > floor]
    if len(kept) >= g:
        return int(np.partition(kept, len(kept) - g)[len(kept) - g:].sum())
    return int(kept.sum()) + (g - len(kept)) * floor


def _shortest_stretch(t: np.ndarray, w: int) -> tuple[int, int]:
    """(i, t[i + w] - t[i]) of the shortest stretch of w entries, the first such."""
    best_i, best = 0, None
    m = len(t) - w
    for lo in range(0, m, _PART):
        d = t[lo + w:min(lo + _PART, m) + w] - t[lo:min(lo + _PART, m)]
        j = int(np.argmin(d))
        if best is None or int(d[j]) < best:
            best_i, best = lo + j, int(d[j])
    return best_i, int(best or 0)


def x_axis(da) -> XAxis:
    """The x axis for one device of an analysis (a DeviceAnalysis)."""
    cols = da.snapshot.trace(da.device).columns if da.snapshot is not None else {}
    tus = cols.get("time_us")
    if tus is None:
        return XAxis("entries", "no_times", False)
    return choose_x_axis(np.asarray(tus), da.iterations)


__all__ = ["XAxis", "AXIS_REASONS", "SQUEEZE", "PAUSE_SHARE", "choose_x_axis", "x_axis"]
