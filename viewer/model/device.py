"""What the viewer shows of one device, as numpy queries (no Qt here).

`DeviceData` is built once per device, off the GUI thread, from the parser's
columns and the analysis. It keeps no Python object per event or per
allocation, and it computes no fact of its own: what is live, by category, at
any entry is the analysis' (`DeviceAnalysis.live_by_category`, classifiers/
liveset.py), the peak, iterations and findings are the analysis' typed results.
What it adds is the view of them:

- an x axis: seconds since the first event when the trace has `time_us`, else
  the entry index (profiler-converted snapshots have no times);
- `MinMaxPyramid` over live and reserved bytes, for exact per-pixel envelopes;
- allocation rows sorted by size (the table's first order), computed here,
  off the GUI thread;
- allocator segments as intervals of entries (from `segment_*` events and the
  final state), for the segments at any moment.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...classifiers import CATEGORIES, Finding, Iteration
from ...classifiers.allocator import AllocatorHistory
from ...classifiers.evidence import E_GUESS
from ...classifiers.structure import BACKGROUND_ROWS
from ...classifiers.timeaxis import XAxis, choose_x_axis
from ...common.arrays import stable_order
from ...common.later import Later, in_order
from ...common.units import fmt_seconds
from ...present.stacks import Stacks
from ...present.words import finding_detail, finding_title
from .segments import SegmentBands
from .alloc_stack import AllocStack
from .lod import MinMaxPyramid, StepCurve, values_at



@dataclass
class Envelope:
    """Vertices for one view: lines (live, reserved) and stacked-band samples."""
    x0: float
    x1: float
    line_x: np.ndarray
    live_y: np.ndarray
    reserved_y: np.ndarray | None
    col_x: np.ndarray               # the centre of each pixel column
    col_comp: np.ndarray            # (columns, n_categories) live bytes per category drawn there
    col_live: np.ndarray            # (columns, 2) lowest and highest live bytes drawn in each column
    col_reserved: np.ndarray | None
    col_index: np.ndarray           # the entry each column shows (its bucket's highest moment)
    visible_max: float
    events: int                     # events inside the view
    col_comp_last: np.ndarray | None = None   # (columns, n_categories) at each bucket's last entry
    col_index_last: np.ndarray | None = None  # that entry (what-if: a second candidate per column)


class FindingList(Sequence):
    """The viewer's findings in their order (`DeviceAnalysis.findings`): `head`, every one
    but the iterations' peaks, made at once; then one per iteration, made when read (by its
    position: the list, N / Shift+N) and kept. A loop over the list makes them all: what looks
    for a kind reads `head`, or `iteration_peaks()` for the positions of the rest."""

    def __init__(self, head: list[FindingView], n_iterations: int, make: Callable[[int], FindingView]):
        self.head = head
        self.n_iterations = n_iterations
        self._make = make
        self._made: dict[int, FindingView] = {}

    def __len__(self) -> int:
        return len(self.head) + self.n_iterations

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(len(self))[k]]
        k = int(k)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError("finding index out of range")
        if k < len(self.head):
            return self.head[k]
        j = k - len(self.head)
        f = self._made.get(j)
        if f is None:
            f = self._made[j] = self._make(j)
        return f

    def iteration_peaks(self) -> range:
        """The positions of the iterations' peaks in the list."""
        return range(len(self.head), len(self))


@dataclass
class FindingView:
    """A finding as the viewer lists it: the analysis' typed finding, its words (from the
    presentation layer), the entries to zoom to and the allocation to select."""
    finding: Finding
    title: str
    detail: str
    zoom: tuple[int, int]           # (first_index, last_index) to show
    entry_row: int = -1             # the allocation the finding's entry made, -1: none
    rows: np.ndarray | None = None  # a leak's allocations
    place: str = ""                 # a leak's site, briefly ('train.py:180')
    # a moment's largest live allocations (DeviceAnalysis.largest_live_rows), asked when
    # `row` is first read: a long run has hundreds of iteration peaks, most never opened
    largest: Callable[[int, int], np.ndarray] | None = field(default=None, repr=False)
    _row: int | None = field(default=None, init=False, repr=False)

    @property
    def row(self) -> int:
        """The allocation to select, -1: none. At a peak or an OOM, what makes the moment:
        its largest live allocation, not whatever the entry allocated (often a few KiB of
        scratch)."""
        if self._row is None:
            self._row = self.entry_row
            if self.largest is not None:
                biggest = self.largest(self.index, 1)
                if len(biggest):
                    self._row = int(biggest[0])
        return self._row

    @property
    def kind(self) -> str:
        return self.finding.kind

    @property
    def index(self) -> int:
        return self.finding.index

    @property
    def subject(self):
        return self.finding.subject


# -- what the view reads of the analysis' first stages, made beside the rest -------------
class DevicePrep:
    """Two parts of a device's view that read nothing the analysis finds after it has
    classified the device's rows, and hold little memory: the times and the x axis
    (classifiers/timeaxis.py's rule over the iterations' bounds), and the allocator's history.
    The viewer's load starts one as soon as the analysis has classified the device (`analyze(
    ..., beside=...)`): on a big run they are made on a thread while the analysis finds its
    peaks, run facts and levers, and DeviceData takes them from here (otherwise it makes them
    itself). The composition and the table's size order, which hold tens of MB more, stay for
    after the analysis: made beside its levers, they raised the open's highest memory."""

    def __init__(self, snap, da):
        t = snap.trace(da.device)
        iterations = da.iterations              # their bounds: later stages add only their peaks
        self.da = da
        self.big = len(da.allocs) >= BACKGROUND_ROWS
        self.times: Later[tuple] = Later(lambda: _times(t, da, iterations))
        self.history: Later[AllocatorHistory] = Later(lambda: AllocatorHistory(snap, da))

    @classmethod
    def beside_analysis(cls, snap, da) -> DevicePrep:
        """Started while the analysis goes on: on a thread on a big run, here on a small one."""
        prep = cls(snap, da)
        if prep.big:
            in_order([prep.times, prep.history], name="vramscope-device-early")
        else:
            prep.times.run()
            prep.history.run()
        return prep


def _times(t, da, iterations) -> tuple[bool, np.ndarray, int, XAxis]:
    """(the trace has times, the time stamps made monotonic (empty without times), the first
    one (0 without), the x axis it starts with). The times are read whole here (their order,
    the axis' rule), then a moment at a time: their pages handed back (DeviceTrace.release)."""
    n = len(t)
    tus = np.asarray(t.columns["time_us"])
    if not (n and int(tus.min()) >= 0):
        return False, np.zeros(0, dtype=np.int64), 0, XAxis("entries", "no_times", False)
    if n > 1 and not bool(np.all(tus[1:] >= tus[:-1])):
        tus = np.maximum.accumulate(tus)     # out-of-order stamps: keep the axis monotonic
    # the rule over these times (made monotonic once, here, not again inside it)
    axis = choose_x_axis(tus, iterations)
    t.release(("time_us",))
    return True, tus, int(tus[0]), axis


# -- the device model -----------------------------------------------------------------
class DeviceData:
    def __init__(self, snap, analysis, device: int, progress=None, stacks: Stacks | None = None,
                 prep: DevicePrep | None = None):
        self.snap = snap
        self.analysis = analysis
        self.device = device
        da = analysis.devices[device]
        self.da = da
        # on a big run, the table's order by size on a thread beside the curves and the
        # composition, and the times and the allocator's history on another (neither reads
        # what the other builds), unless begun beside the analysis (`prep`)
        al = da.allocs
        by_size: Later[np.ndarray] = Later(lambda: stable_order(al.size, descending=True))
        if prep is None or prep.da is not da:
            prep = DevicePrep(snap, da)
            if prep.big:                   # (two threads: a CPU each where there are more)
                in_order([prep.times, by_size], name="vramscope-device")
                in_order([prep.history], name="vramscope-allocator")
            else:
                for job in (prep.times, prep.history, by_size):
                    job.run()
        elif prep.big:
            in_order([by_size], name="vramscope-device")
        else:
            by_size.run()
        self.categories = tuple(CATEGORIES)
        self.n_categories = len(self.categories)
        t = snap.trace(device)
        self.n = n = len(t)
        self.action = np.asarray(t.columns["action"])
        self.size = np.asarray(t.columns["size"])
        self.live = np.asarray(da.live.live_after)
        self.start_bytes = int(da.live.start_bytes)
        lm = da.live
        # reserved bytes (None: no allocator segments), as their changes: not a value an entry
        known = da.reserved_known()
        self.reserved = None if not known else \
            StepCurve(n, lm.reserved_start, lm.reserved_change_index, lm.reserved_change_value)
        self.reserved_start = None if not known else int(lm.reserved_start)
        self.peak_bytes = int(da.live.peak_bytes)
        self.peak_index = int(da.live.peak_index)
        self._step(progress, "timeline", 0.1)

        # x axis: seconds since the first event, or the entry index; the time stamps, monotonic
        # (empty without times); `tkey` the same, None without times
        self.has_time, self.times, self.t0, self.x_axis = prep.times.get()
        self.tkey: np.ndarray | None = self.times if self.has_time else None
        self.time_axis = self.has_time and self.x_axis.seconds

        curves = [self.live] + ([self.reserved] if self.reserved is not None else [])
        self.pyramid = MinMaxPyramid(curves) if n else None
        self._step(progress, "timeline", 0.3)

        # the allocation rows and their categories (the analysis')
        self.allocs = al
        self.category = np.asarray(da.category)
        self.rule = np.asarray(da.rule)
        self.n_rows = len(al)
        self.alloc_index = np.asarray(al.alloc_index)
        self.free_index = np.asarray(al.free_index)
        self.da.alloc_order()
        self._step(progress, "timeline", 0.5)
        self.da.composition()             # all built here, off the GUI thread, on first use
        self.da.guessed_composition()     # (the pale bands: the bytes that are a guess)
        self._step(progress, "timeline", 0.7)

        # the allocations table opens sorted by size: sorted here (above), off the GUI thread
        self.rows_by_size = by_size.get()
        self.cat_present = np.bincount(self.category, minlength=self.n_categories) > 0
        self._step(progress, "timeline", 0.8)

        self._rank: np.ndarray | None = None
        self._alloc_stack: AllocStack | None = None
        self.allocator = analysis.allocator(device, made=prep.history.get())
        self.segments = SegmentBands(self.allocator, self.n)
        self.stacks = stacks or Stacks(analysis)
        self.iterations: Sequence[Iteration] = da.iterations      # (iterations.Iterations: columns)
        self.findings = self._build_findings()
        self._step(progress, "timeline", 1.0)

    @property
    def state_only(self) -> bool:
        """A snapshot without a trace (the run's fact): its peak is the state it recorded."""
        return self.da.state_only

    @staticmethod
    def _step(progress, label, frac):
        if progress is not None:
            progress.check()
            if frac <= 0.1:
                progress.start(label, 1.0)
            progress.update(frac)

    # -- per-category live bytes ---------------------------------------------------
    def composition(self, indices) -> np.ndarray:
        """Live bytes per category right after each entry (-1: before the first), (Q, C)
        float64 for drawing: the analysis' (DeviceAnalysis.live_by_category), never our own."""
        return self.da.live_by_category(indices, np.float64)

    def guessed_composition(self, indices) -> np.ndarray | None:
        """Of `composition(indices)`, the bytes whose category is a guess (the analysis'
        DeviceAnalysis.guessed_by_category), (Q, C) float64; None when nothing is a guess."""
        return self.da.guessed_by_category(indices, np.float64)

    # -- x axis ------------------------------------------------------------------------
    def set_time_axis(self, on: bool) -> bool:
        """x in seconds (when the trace has times) or in entries; returns the axis now in use."""
        self.time_axis = bool(on) and self.has_time
        return self.time_axis

    def x_of_index(self, i):
        """Plot x of entry i (seconds since the first event, or the index)."""
        i = np.asarray(i, dtype=np.int64)
        if not self.time_axis:
            return np.maximum(i, 0).astype(np.float64)
        if self.n == 0:
            return np.zeros(i.shape)
        return (self.times[np.clip(i, 0, self.n - 1)] - self.t0) / 1e6

    def seconds_of(self, i):
        """Seconds since the first event at entry i (needs times), whatever the x axis."""
        i = np.asarray(i, dtype=np.int64)
        if self.tkey is None or self.n == 0:
            return np.zeros(i.shape)
        return (self.times[np.clip(i, 0, self.n - 1)] - self.t0) / 1e6

    @property
    def time_span(self) -> float:
        """Seconds from the first event to the last (0 without times)."""
        return (int(self.times[-1]) - self.t0) / 1e6 if self.tkey is not None and self.n else 0.0

    def x_of_us(self, us):
        """Plot x of a time stamp (µs since the epoch): where it falls among the entries on
        an entry axis."""
        us = np.asarray(us, dtype=np.int64)
        if self.time_axis:
            return (us - self.t0) / 1e6
        if self.tkey is None or self.n == 0:
            return np.zeros(us.shape)
        return np.searchsorted(self.times, us, side="left").astype(np.float64)

    def index_at_x(self, x):
        """The first entry whose x is >= x (n if none)."""
        x = np.asarray(x, dtype=np.float64)
        if not self.time_axis:
            return np.clip(np.ceil(x), 0, self.n).astype(np.int64)
        key = np.ceil(self.t0 + x * 1e6)
        key = np.clip(key, -(1 << 62), 1 << 62).astype(np.int64)
        return np.searchsorted(self.times, key, side="left").astype(np.int64)

    def index_before_x(self, x) -> int:
        """The last entry at or before x (-1: before the first): the state shown at x."""
        x = float(x)
        if not self.time_axis:
            return int(min(self.n - 1, np.floor(x)))
        key = int(np.floor(self.t0 + x * 1e6))
        return int(np.searchsorted(self.times, key, side="right")) - 1

    @property
    def x_range(self) -> tuple[float, float]:
        if self.n == 0:
            return 0.0, 1.0
        if not self.time_axis:
            return 0.0, float(self.n)
        x1 = (int(self.times[-1]) - self.t0) / 1e6
        return 0.0, x1 if x1 > 0 else 1e-6

    def live_at(self, i: int) -> int:
        return self.start_bytes if i < 0 or self.n == 0 else int(self.live[min(i, self.n - 1)])

    def reserved_at(self, i: int) -> int | None:
        if self.reserved is None:
            return None
        return self.reserved_start if i < 0 or self.n == 0 else int(self.reserved[min(i, self.n - 1)])

    # -- the envelope --------------------------------------------------------------------
    def envelope(self, x0: float, x1: float, buckets: int) -> Envelope:
        """Per-bucket exact envelope of the view [x0, x1] (DESIGN.md §7).

        One bucket per pixel column. Lines: for each non-empty bucket, a vertical
        stroke through the value entering it, the max, the min and the value leaving
        it; empty buckets add nothing (the horizontal step carries on). Bands: each
        column shows the composition at the moment of its bucket's highest total (so
        the stacked top meets the live max exactly), an empty column the composition
        the last busy one left behind. The timeline draws the bands as one vertical
        line per column and category: filling thousands-of-vertex polygons costs
        Qt's rasteriser up to a second; lines cost 2 ms.
        """
        buckets = max(1, int(buckets))
        if not x1 > x0:
            x1 = x0 + 1e-9
        edges = np.linspace(x0, x1, buckets + 1)
        col_x = (edges[:-1] + edges[1:]) / 2
        idx = self.index_at_x(edges)
        a, b = idx[:-1], idx[1:]
        ne = np.flatnonzero(b > a)
        first_prev = int(a[0]) - 1
        res = self.reserved
        res_y: np.ndarray | None = None
        col_res: np.ndarray | None = None
        if len(ne) and self.pyramid is not None:
            qa, qb = a[ne], b[ne]
            mx, mn, arg = self.pyramid.query(qa, qb)
            prev_i = qa - 1
            last_i = qb - 1
            e_left = col_x[ne]
            live_prev = self._values(self.live, self.start_bytes, prev_i)
            live_last = self.live[last_i]
            line_x = np.repeat(e_left, 4)
            live_y = np.column_stack([live_prev, mx[:, 0], mn[:, 0], live_last]).ravel()
            if res is not None:
                rp = self._values(res, self.reserved_start, prev_i)
                res_y = np.column_stack([rp, mx[:, 1], mn[:, 1], res[last_i]]).ravel()
            comp_idx = np.empty(1 + 2 * len(ne), dtype=np.int64)
            comp_idx[0] = prev_i[0]
            comp_idx[1::2] = arg
            comp_idx[2::2] = last_i
            comp = self.composition(comp_idx)
            # each column: the composition at its highest moment, or (no events in
            # it) the one the last busy column left behind
            is_ne = np.zeros(buckets, dtype=bool)
            is_ne[ne] = True
            rank = np.cumsum(is_ne) - 1
            col_comp = np.empty((buckets, self.n_categories))
            col_comp[ne] = comp[1::2]
            empty = np.flatnonzero(~is_ne)
            r = rank[empty]
            col_comp[empty] = np.where((r >= 0)[:, None], comp[2::2][np.maximum(r, 0)], comp[0])
            # the lines per column: the range a busy column goes through (from the value
            # entering it), the carried value in an empty one
            col_index = np.empty(buckets, dtype=np.int64)
            col_index[ne] = arg
            col_index[empty] = np.where(r >= 0, last_i[np.maximum(r, 0)], first_prev)
            col_last = col_comp.copy()
            col_last[ne] = comp[2::2]
            col_index_last = col_index.copy()
            col_index_last[ne] = last_i
            col_live = self._column_ranges(buckets, ne, empty, r, live_prev, mx[:, 0], mn[:, 0], live_last)
            if res is not None:
                col_res = self._column_ranges(buckets, ne, empty, r, rp, mx[:, 1], mn[:, 1],
                                              res[last_i].astype(np.float64))
            end_live = float(live_last[-1])
            line_x = np.concatenate([[x0], line_x, [x1]])
            live_y = np.concatenate([[float(live_prev[0])], live_y, [end_live]]).astype(np.float64)
            if res_y is not None:
                res_y = np.concatenate([[res_y[0]], res_y, [res_y[-1]]]).astype(np.float64)
            visible_max = float(max(mx[:, 0].max(), live_prev[0]))
            if res is not None:
                visible_max = max(visible_max, float(mx[:, 1].max()))
            events = int(qb[-1] - qa[0])
        else:
            v = float(self.live_at(first_prev))
            line_x = np.array([x0, x1])
            live_y = np.array([v, v])
            carried = self.reserved_at(first_prev)
            if carried is not None:
                res_y = np.array([float(carried)] * 2)
                col_res = np.full((buckets, 2), float(carried))
            col_comp = np.repeat(self.composition([first_prev]), buckets, axis=0)
            col_live = np.full((buckets, 2), v)
            col_index = np.full(buckets, first_prev, dtype=np.int64)
            visible_max = max(v, float(carried) if carried is not None else 0.0)
            events = 0
            col_last, col_index_last = col_comp, col_index
        return Envelope(x0, x1, line_x, live_y, res_y, col_x, col_comp, col_live, col_res, col_index,
                        visible_max, events, col_last, col_index_last)

    @staticmethod
    def _column_ranges(w, ne, empty, rank, prev, mx, mn, last) -> np.ndarray:
        out = np.empty((w, 2))
        out[ne, 0] = np.minimum(prev, mn)
        out[ne, 1] = np.maximum(prev, mx)
        carried = np.where(rank >= 0, last[np.maximum(rank, 0)], prev[0])
        out[empty, 0] = carried
        out[empty, 1] = carried
        return out

    @staticmethod
    def _values(curve, start, i):
        i = np.asarray(i, dtype=np.int64)
        out = values_at(curve, np.maximum(i, 0)).astype(np.float64) if len(curve) else np.zeros(len(i))
        out[i < 0] = start
        return out

    def range_peak(self, first: int, last: int) -> tuple[int, int]:
        """(bytes, index) of the highest live memory over entries [first, last]."""
        first = max(0, int(first))
        last = min(self.n - 1, int(last))
        if self.pyramid is None or last < first:
            return self.start_bytes, -1
        mx, _, arg = self.pyramid.query(np.array([first]), np.array([last + 1]))
        return int(mx[0, 0]), int(arg[0])

    # -- allocations -------------------------------------------------------------------------
    def live_rows(self, i: int) -> np.ndarray:
        """Rows live right after entry i, in allocation order (the analysis')."""
        return self.da.live_rows(i)

    def is_live(self, rows: np.ndarray, i: int) -> np.ndarray:
        f = self.free_index[rows]
        return (self.alloc_index[rows] <= i) & ((f < 0) | (f > i))

    def largest_live(self, i: int, k: int = 10, category: int | None = None) -> np.ndarray:
        """Rows of the k largest allocations live after entry i (optionally one category): the
        analysis' (`summary`'s top list is the same query)."""
        return self.da.largest_live_rows(i, k, category)

    def allocation_at(self, x: float, y: float, visible: list[int]) -> tuple[int, int]:
        """(row, category) of the allocation drawn under (x, y): the band of the stacked
        categories that y falls in, and its largest live allocation at that moment."""
        return self.allocation_at_index(self.index_before_x(x), y, visible)

    def allocation_at_index(self, i: int, y: float, visible: list[int]) -> tuple[int, int]:
        """(row, category) of the allocation drawn at bytes y after entry i in the category
        view: the category band y falls in, then, inside it, the allocation at that height
        with the band's allocations stacked oldest first (as the per-allocation view and
        the selection outline stack them)."""
        comp = self.composition([i])[0]
        top = 0.0
        for c in visible:
            v = max(0.0, comp[c])
            if top <= y < top + v:
                rows = self.live_rows(i)
                rows = rows[self.category[rows] == c]
                if not len(rows):
                    return -1, c
                cum = np.cumsum(np.asarray(self.allocs.size)[rows])
                k = int(np.searchsorted(cum, y - top, side="right"))
                return int(rows[min(k, len(rows) - 1)]), c
            top += v
        return -1, -1

    def older_in_category(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """The allocations of `row`'s category live when it was allocated and older than it
        (below it in its band): (their free entries, -1 never; their sizes)."""
        a = int(self.alloc_index[row])
        rows = self.live_rows(a) if a >= 0 else np.flatnonzero(self.alloc_index < 0)
        rank = self.alloc_rank()
        rows = rows[(self.category[rows] == self.category[row]) & (rank[rows] < rank[row])]
        return self.free_index[rows].astype(np.int64), np.asarray(self.allocs.size)[rows].astype(np.int64)

    def offset_in_category(self, row: int, moments) -> np.ndarray:
        """Bytes below `row` inside its category's band at each moment of its lifetime
        (older allocations of its category still live): the band drops as they are freed."""
        ends, sizes = self.older_in_category(row)
        ends = np.where(ends < 0, np.iinfo(np.int64).max, ends)
        order = np.argsort(ends, kind="stable")
        ends, sizes = ends[order], sizes[order]
        still = np.concatenate([np.cumsum(sizes[::-1])[::-1], [0]])   # bytes freed after ends[k-1]
        k = np.searchsorted(ends, np.asarray(moments, dtype=np.int64), side="right")
        return still[k]

    def alloc_rank(self) -> np.ndarray:
        """Each row's position in allocation order (the stacks' order: older lower)."""
        rank = self._rank
        if rank is None:
            order = self.da.alloc_order().order
            if order is None:
                rank = np.arange(self.n_rows, dtype=np.int64)
            else:
                rank = np.empty(self.n_rows, dtype=np.int64)
                rank[order] = np.arange(self.n_rows)
            self._rank = rank
        return rank

    def alloc_stack(self):
        """Every allocation as a band (model/alloc_stack.py), built on first use."""
        if self._alloc_stack is None:
            self._alloc_stack = AllocStack(self.alloc_index, self.free_index, self.allocs.size, self.stack_keys(),
                                           self.n)
        return self._alloc_stack

    def guessed_rows(self) -> np.ndarray:
        """bool per allocation row: its category is a guess (the analysis' evidence: guess or
        none, as the category view's pale bands count them)."""
        return np.asarray(self.da.evidence) >= E_GUESS

    def guessed(self, row: int) -> bool:
        """Whether one allocation's category is a guess (the analysis' evidence)."""
        return int(self.da.evidence[row]) >= E_GUESS

    def stack_keep(self, categories) -> np.ndarray:
        """The keys to keep (AllocStack.columns' `keep`) when these categories are shown: each
        category's own rows and its guessed ones (stack_keys)."""
        keep = np.zeros(256, dtype=bool)
        cats = np.asarray(list(categories), dtype=np.int64)
        keep[cats] = True
        keep[cats + self.n_categories] = True
        return keep

    def stack_keys(self) -> np.ndarray:
        """Each row's colour key when stacked by allocation: its category, or the category
        plus n_categories where the category is a guess (drawn in the paler shade)."""
        return (self.category.astype(np.int64) + self.n_categories * self.guessed_rows()).astype(np.uint8)

    def row_of_alloc_event(self, i: int) -> int:
        """The row allocated by entry i, or -1."""
        return int(self.rows_of_alloc_events([i])[0])

    def rows_of_alloc_events(self, indices) -> np.ndarray:
        """The rows allocated by these entries (-1 where an entry is not an alloc)."""
        return self.da.composition().rows_allocated_at(indices)

    def rule_name(self, row: int) -> str:
        """The id of the rule that gave the row its category (the analysis')."""
        return self.da.rule_name(int(self.rule[row]))

    def rule_why(self, row: int) -> str:
        """Why the classifier chose this row's category (its rule's description), or ''."""
        try:
            why = self.analysis.rule_why
            r = int(self.rule[row])
            return str(why[r]) if 0 <= r < len(why) and why[r] else ""
        except (AttributeError, IndexError, TypeError):
            return ""

    def category_name(self, c: int) -> str:
        return self.categories[c] if 0 <= c < self.n_categories else "unknown"

    def row_span(self, row: int) -> tuple[int, int]:
        """(first, last) entries of a row's lifetime, clipped to the trace."""
        a = int(self.alloc_index[row])
        f = int(self.free_index[row])
        return (max(a, 0), f if f >= 0 else max(self.n - 1, 0))

    # -- findings ------------------------------------------------------------------------------
    def zoom_around(self, i: int, first: int | None = None, last: int | None = None) -> tuple[int, int]:
        """Entries to show around entry i: close enough to see what happens there
        (an eighth of its iteration, or of the run), never fewer than 200."""
        if first is None or last is None or last <= first:
            first, last = 0, max(self.n - 1, 0)
            it = self.da.iteration_at(i)      # the analysis' own map of entries to iterations
            if it is not None:
                first, last = it.start_index, it.end_index
        half = max(100, (last - first) // 16)
        lo, hi = max(first, i - half), min(last, i + half)
        if hi - lo < 2 * half:        # near an edge: keep the width inside the range
            lo, hi = max(0, hi - 2 * half), min(max(self.n - 1, 0), lo + 2 * half)
        return lo, hi

    def _build_findings(self) -> FindingList:
        """Every finding but the iterations' peaks made now; those (a million on a run of short
        steps) when one is read (FindingList)."""
        found = self.da.findings(iteration_peaks=False)
        return FindingList(self._finding_views(found), len(self.iterations), self._iteration_finding)

    def _iteration_finding(self, k: int) -> FindingView:
        return self._finding_views([self.da.iteration_finding(k)])[0]

    def _finding_views(self, found: list) -> list[FindingView]:
        out: list[FindingView] = []
        da = self.da
        state_only = self.state_only
        rows = self.rows_of_alloc_events([f.index for f in found])      # one search for all
        for f, row in zip(found, rows.tolist()):
            leak_rows = None
            where = place = ""
            largest = da.largest_live_rows if f.kind in ("peak", "iteration_peak", "oom") else None
            if f.kind == "leak":
                leak_rows = da.leak_rows(f.subject)
                # the leak's largest allocation (the latest of the largest)
                row = int(leak_rows[len(leak_rows) - 1 - np.argmax(self.allocs.size[leak_rows][::-1])]) \
                    if len(leak_rows) else -1
                zoom = (0, max(self.n - 1, 0))
                where = self.stacks.site(f.subject.site, f.subject.stack)
                place = self.stacks.site_short(f.subject.site, f.subject.stack)
            elif f.kind == "iteration_peak":
                zoom = self.zoom_around(f.index, f.subject.start_index, f.subject.end_index)
            else:
                zoom = self.zoom_around(f.index)
            out.append(FindingView(f, finding_title(f, where, state_only), finding_detail(f, where, state_only), zoom, row,
                                   leak_rows, place, largest))
        return out

    def stack_label(self, sid: int) -> str:
        """The compact name of a stack for tables and hover (present.stacks)."""
        return self.stacks.label(int(sid))

    def row_label(self, row: int) -> str:
        """The compact name of an allocation: its stack's, or its forward stack's (2.13)."""
        return self.stacks.label_of(self.da.allocation(int(row)))

    @property
    def nbytes(self) -> int:
        """What this model adds on top of the parser's and analysis' arrays (the analysis'
        composition and allocation order, which it builds, included)."""
        n = self.rows_by_size.nbytes + self.da.composition().nbytes + self.da.alloc_order().nbytes
        n += self.pyramid.nbytes if self.pyramid is not None else 0
        return n


def when_text(d: DeviceData, i: int) -> str:
    """Entry i in words: its time since the first event (when the trace has times) and its number."""
    if i < 0:
        return "before the trace"
    if d.has_time:
        return f"{fmt_seconds(float(d.seconds_of(i)), 1e-4)} (entry {i:,})"
    return f"entry {i:,}"
