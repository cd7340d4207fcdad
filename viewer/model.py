"""What the viewer shows, as numpy queries over one device (no Qt here).

`DeviceData` is built once per device, off the GUI thread, from the parser's
columns and the analysis. It keeps no Python object per event or per
allocation. Its parts, and why:

- an x axis: seconds since the first event when the trace has `time_us`, else
  the entry index (profiler-converted snapshots have no times);
- `MinMaxPyramid` over live and reserved bytes, for exact per-pixel envelopes;
- live bytes *per category* at any entry: a category per alloc/free event
  (`event_category`, one byte an event) plus checkpoints of the per-category
  totals every `CHECKPOINT` events. The composition after entry i is the
  nearest checkpoint plus fewer than CHECKPOINT/2 signed sizes. Nine full
  per-category curves would cost 72 bytes an event; this costs about 2.2.
- allocation rows sorted by size (the table's first order), computed here,
  off the GUI thread;
- allocator segments as intervals of entries (from `segment_*` events and the
  final state), for the segments at any moment.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..classifiers import CATEGORIES
from ..parsers.tables import A_ALLOC, A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP
from ..common.units import fmt_bytes
from .lod import MinMaxPyramid, ragged

CHECKPOINT = 64
NO_CATEGORY = 255
# Bottom to top: what stays for the whole run first, short-lived memory on top.
STACK_ORDER = ("weights", "quantization", "optimizer", "gradients", "inputs", "activations", "autograd",
               "temporary", "unknown")


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


@dataclass
class Finding:
    kind: str                       # peak | iteration_peak | leak | oom
    title: str
    detail: str
    index: int                      # trace entry to put the cursor on (-1: the start)
    zoom: tuple                     # (first_index, last_index) to show
    row: int = -1                   # allocation row to select, -1: none
    data: dict = field(default_factory=dict)


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


# -- frames -------------------------------------------------------------------
_PROFILER_FRAME = re.compile(r"^(.*\.py)\((\d+)\): (.*)$")
_INTERNAL = ("/torch/", "site-packages/", "dist-packages/", "<frozen", "/lib/python3", "torch/")


def split_frame(filename: str, line: int, name: str) -> tuple[str, int, str, bool]:
    """(file, line, function, is_python). Profiler-converted frames carry
    'path/file.py(123): func' in `name` with filename 'none'."""
    if filename == "none" and line == 0:
        m = _PROFILER_FRAME.match(name)
        if m:
            return m.group(1), int(m.group(2)), m.group(3), True
        return "", 0, name, False
    return filename, line, name, filename.endswith(".py") and line > 0


def is_internal(filename: str) -> bool:
    return filename.startswith("torch/") or any(s in filename for s in _INTERNAL)


def frame_label(filename: str, line: int, name: str) -> str:
    f, ln, fn, py = split_frame(filename, line, name)
    if py:
        return f"{fn}  ({os.path.basename(f)}:{ln})"
    return fn


# C++ frames that every CUDA allocation goes through: they say nothing about who allocated
_ALLOCATOR_FRAMES = ("torch::unwind::", "torch::CapturedTraceback::", "torch::cuda::(anonymous namespace)::gather",
                     "c10::cuda::CUDACachingAllocator::", "at::TensorBase at::detail::_empty", "at::detail::empty",
                     "at::detail::_empty", "c10::Allocator", "c10::StorageImpl", "at::empty")
_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply")
_ATEN_OP = re.compile(r"at::_ops::(\w+)::(?:call|redispatch)")


def is_allocator_frame(name: str) -> bool:
    return name.startswith(_ALLOCATOR_FRAMES)


def short_cpp(name: str, limit: int = 90) -> str:
    """A C++ signature without its argument list: 'at::native::add_out(…)'
    (only the trailing, balanced group: '(anonymous namespace)' stays)."""
    s = name.rstrip()
    if s.endswith(" const"):
        s = s[:-6]
    if s.endswith(")"):
        depth = 0
        for k in range(len(s) - 1, -1, -1):
            if s[k] == ")":
                depth += 1
            elif s[k] == "(":
                depth -= 1
                if depth == 0:
                    if k > 0:
                        s = s[:k] + "(…)"
                    break
    return s if len(s) <= limit else s[:limit - 1] + "…"


def cpp_label(frames) -> str | None:
    """For stacks with no Python frames (autograd's worker threads): the backward node
    or the ATen op that allocated."""
    for fr in frames:
        m = _AUTOGRAD_NODE.search(fr[2])
        if m:
            return f"{m.group(1)}  (autograd)"
    for fr in frames:
        m = _ATEN_OP.search(fr[2])
        if m:
            return f"aten::{m.group(1)}"
    for fr in frames:
        if not is_allocator_frame(fr[2]):
            return short_cpp(fr[2])
    return None


class StackLabels:
    """The one frame that best names a stack: the innermost Python frame outside
    torch and site-packages, else the innermost Python frame, else the first."""

    def __init__(self, snap):
        self.snap = snap
        self._cache: dict[int, str] = {}

    def __call__(self, sid: int) -> str:
        sid = int(sid)
        s = self._cache.get(sid)
        if s is None:
            s = self._cache[sid] = self._label(sid)
        return s

    def _label(self, sid: int) -> str:
        if sid < 0:
            return "(no stack)"
        frames = self.snap.stack_frames_list(sid)
        if not frames:
            return "(no stack)"
        first_py = None
        for fr in frames:
            f, ln, fn, py = split_frame(*fr)
            if py:
                if not is_internal(f):
                    return f"{fn}  ({os.path.basename(f)}:{ln})"
                if first_py is None:
                    first_py = f"{fn}  ({os.path.basename(f)}:{ln})"
        if first_py:
            return first_py
        for fr in frames:   # module frames of profiler snapshots ('nn.Module: Linear_0')
            if fr[2].startswith("nn.Module"):
                return fr[2]
        return cpp_label(frames) or short_cpp(frames[0][2])


# -- the device model -----------------------------------------------------------------
class DeviceData:
    def __init__(self, snap, analysis, device: int, progress=None):
        self.snap = snap
        self.analysis = analysis
        self.device = device
        da = analysis.devices[device]
        self.da = da
        self.categories = tuple(CATEGORIES)
        self.n_categories = len(self.categories)
        t = snap.trace(device)
        self.n = n = len(t)
        self.action = np.asarray(t.columns["action"])
        self.size = np.asarray(t.columns["size"])
        self.live = np.asarray(da.live.live_after)
        self.start_bytes = int(da.live.start_bytes)
        res = getattr(da.live, "reserved_after", None)
        self.reserved = None if res is None else np.asarray(res)
        self.reserved_start = None if res is None else int(da.live.reserved_start)
        self.peak_bytes = int(da.live.peak_bytes)
        self.peak_index = int(da.live.peak_index)
        self._step(progress, "timeline", 0.1)

        # x axis: seconds since the first event, or the entry index
        tus = np.asarray(t.columns["time_us"])
        self.has_time = bool(n) and int(tus.min()) >= 0
        if self.has_time:
            if n > 1 and not bool(np.all(tus[1:] >= tus[:-1])):
                tus = np.maximum.accumulate(tus)     # out-of-order stamps: keep the axis monotonic
            self.t0 = int(tus[0])
            self.tkey = tus
        else:
            self.t0 = 0
            self.tkey = None

        curves = [self.live] + ([self.reserved] if self.reserved is not None else [])
        self.pyramid = MinMaxPyramid(curves) if n else None
        self._step(progress, "timeline", 0.3)

        # allocations, their categories, and the category of every alloc/free event
        al = da.allocs
        self.allocs = al
        self.category = np.asarray(da.category)
        self.rule = np.asarray(da.rule)
        self.rule_names = list(getattr(analysis, "rule_names", []) or [])
        self.n_rows = len(al)
        self.alloc_index = np.asarray(al.alloc_index)
        self.free_index = np.asarray(al.free_index)
        if self.n_rows > 1 and not bool(np.all(self.alloc_index[1:] >= self.alloc_index[:-1])):
            self._alloc_order = np.argsort(self.alloc_index, kind="stable")
            self._sorted_alloc_index = self.alloc_index[self._alloc_order]
        else:
            self._alloc_order = None
        self.event_category = np.full(n, NO_CATEGORY, dtype=np.uint8)
        has_a = self.alloc_index >= 0
        self.event_category[self.alloc_index[has_a]] = self.category[has_a]
        has_f = self.free_index >= 0
        self.event_category[self.free_index[has_f]] = self.category[has_f]
        self._step(progress, "timeline", 0.5)
        self._build_checkpoints()
        self._step(progress, "timeline", 0.7)

        idx_t = np.int32 if self.n_rows < (1 << 31) else np.int64
        # the allocations table opens sorted by size: sort here, off the GUI thread
        self.rows_by_size = np.argsort(-np.asarray(al.size, dtype=np.int64), kind="stable").astype(idx_t)
        self.cat_present = np.bincount(self.category, minlength=self.n_categories) > 0
        self._step(progress, "timeline", 0.8)

        self._build_segments()
        self.stack_label = StackLabels(snap)
        self.iterations = _norm_iterations(da.iterations, n)
        self.findings = self._build_findings()
        self._step(progress, "timeline", 1.0)

    @staticmethod
    def _step(progress, label, frac):
        if progress is not None:
            progress.check()
            if frac <= 0.1:
                progress.start(label, 1.0)
            progress.update(frac)

    # -- per-category live bytes ---------------------------------------------------
    def _build_checkpoints(self):
        n, C = self.n, self.n_categories
        al = self.allocs
        pre = self.alloc_index < 0
        start = np.bincount(self.category[pre], weights=al.size[pre].astype(np.float64), minlength=C)
        start = np.rint(start).astype(np.int64)
        # whatever the rows do not explain (blocks whose trace size differs...) goes to
        # `unknown`, so the stacked categories always add up to the live line
        residual = self.start_bytes - int(start.sum())
        unknown = self.categories.index("unknown") if "unknown" in self.categories else C - 1
        start[unknown] += residual
        nblocks = -(-n // CHECKPOINT)
        cp = np.zeros((nblocks + 1, C), dtype=np.int64)
        cp[0] = start
        chunk = CHECKPOINT * 16384
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            cat = self.event_category[s:e]
            ev = np.flatnonzero(cat != NO_CATEGORY)
            d = self._signed(ev + s).astype(np.float64)
            blk = (ev // CHECKPOINT).astype(np.int64)
            nb = -(-(e - s) // CHECKPOINT)
            sums = np.bincount(blk * C + cat[ev], weights=d, minlength=nb * C).reshape(nb, C)
            cp[1 + s // CHECKPOINT: 1 + s // CHECKPOINT + nb] = np.rint(sums).astype(np.int64)
        np.cumsum(cp, axis=0, out=cp)
        self.checkpoints = cp

    def _signed(self, pos: np.ndarray) -> np.ndarray:
        """+size for an alloc, -size for a free (callers pass alloc/free entries only)."""
        a = self.action[pos]
        s = np.asarray(self.size[pos], dtype=np.int64)
        return np.where(a == A_ALLOC, s, -s)

    def composition(self, indices) -> np.ndarray:
        """Live bytes per category right after each entry (-1: before the first), (Q, C) float64."""
        idx = np.asarray(indices, dtype=np.int64)
        C = self.n_categories
        q = len(idx)
        s = np.clip(idx + 1, 0, self.n)             # events applied
        j_lo = s // CHECKPOINT
        last = len(self.checkpoints) - 1
        pos_lo = j_lo * CHECKPOINT
        pos_hi = np.minimum((j_lo + 1) * CHECKPOINT, self.n)
        j_hi = np.minimum(j_lo + 1, last)
        fwd = (s - pos_lo) <= (pos_hi - s)
        fwd |= j_lo >= last
        j = np.where(fwd, j_lo, j_hi)
        out = self.checkpoints[j].astype(np.float64)
        starts = np.where(fwd, pos_lo, s)
        lens = np.where(fwd, s - pos_lo, pos_hi - s)
        if lens.any():
            pos, owner = ragged(starts, lens)
            cat = self.event_category[pos]
            keep = cat != NO_CATEGORY
            pos, owner, cat = pos[keep], owner[keep], cat[keep]
            d = self._signed(pos).astype(np.float64)
            d[~fwd[owner]] *= -1.0                    # walking back from the next checkpoint
            out += np.bincount(owner * C + cat, weights=d, minlength=q * C).reshape(q, C)
        return out

    # -- x axis ------------------------------------------------------------------------
    def x_of_index(self, i):
        """Plot x of entry i (seconds since the first event, or the index)."""
        i = np.asarray(i, dtype=np.int64)
        if self.tkey is None:
            return np.maximum(i, 0).astype(np.float64)
        if self.n == 0:
            return np.zeros(i.shape)
        return (self.tkey[np.clip(i, 0, self.n - 1)] - self.t0) / 1e6

    def index_at_x(self, x):
        """The first entry whose x is >= x (n if none)."""
        x = np.asarray(x, dtype=np.float64)
        if self.tkey is None:
            return np.clip(np.ceil(x), 0, self.n).astype(np.int64)
        key = np.ceil(self.t0 + x * 1e6)
        key = np.clip(key, -(1 << 62), 1 << 62).astype(np.int64)
        return np.searchsorted(self.tkey, key, side="left").astype(np.int64)

    def index_before_x(self, x) -> int:
        """The last entry at or before x (-1: before the first): the state shown at x."""
        x = float(x)
        if self.tkey is None:
            return int(min(self.n - 1, np.floor(x)))
        key = int(np.floor(self.t0 + x * 1e6))
        return int(np.searchsorted(self.tkey, key, side="right")) - 1

    @property
    def x_range(self) -> tuple[float, float]:
        if self.n == 0:
            return 0.0, 1.0
        if self.tkey is None:
            return 0.0, float(self.n)
        x1 = (int(self.tkey[-1]) - self.t0) / 1e6
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
        has_res = self.reserved is not None
        if len(ne):
            qa, qb = a[ne], b[ne]
            mx, mn, arg = self.pyramid.query(qa, qb)
            prev_i = qa - 1
            last_i = qb - 1
            e_left = col_x[ne]
            live_prev = self._values(self.live, self.start_bytes, prev_i)
            live_last = self.live[last_i]
            line_x = np.repeat(e_left, 4)
            live_y = np.column_stack([live_prev, mx[:, 0], mn[:, 0], live_last]).ravel()
            res_y = None
            if has_res:
                rp = self._values(self.reserved, self.reserved_start, prev_i)
                res_y = np.column_stack([rp, mx[:, 1], mn[:, 1], self.reserved[last_i]]).ravel()
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
            col_live = self._column_ranges(buckets, ne, empty, r, live_prev, mx[:, 0], mn[:, 0], live_last)
            col_res = None
            if has_res:
                col_res = self._column_ranges(buckets, ne, empty, r, rp, mx[:, 1], mn[:, 1],
                                              self.reserved[last_i].astype(np.float64))
            end_live = float(live_last[-1])
            line_x = np.concatenate([[x0], line_x, [x1]])
            live_y = np.concatenate([[float(live_prev[0])], live_y, [end_live]]).astype(np.float64)
            if has_res:
                res_y = np.concatenate([[res_y[0]], res_y, [res_y[-1]]]).astype(np.float64)
            visible_max = float(max(mx[:, 0].max(), live_prev[0]))
            if has_res:
                visible_max = max(visible_max, float(mx[:, 1].max()))
            events = int(qb[-1] - qa[0])
        else:
            v = float(self.live_at(first_prev))
            line_x = np.array([x0, x1])
            live_y = np.array([v, v])
            res_y = None
            if has_res:
                r = float(self.reserved_at(first_prev))
                res_y = np.array([r, r])
            col_comp = np.repeat(self.composition([first_prev]), buckets, axis=0)
            col_live = np.full((buckets, 2), v)
            col_index = np.full(buckets, first_prev, dtype=np.int64)
            col_res = np.full((buckets, 2), res_y[0]) if has_res else None
            visible_max = max(v, res_y[0] if has_res else 0.0)
            events = 0
        return Envelope(x0, x1, line_x, live_y, res_y, col_x, col_comp, col_live, col_res, col_index,
                        visible_max, events)

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
        out = np.asarray(curve)[np.maximum(i, 0)].astype(np.float64) if len(curve) else np.zeros(len(i))
        out[i < 0] = start
        return out

    def range_peak(self, first: int, last: int) -> tuple[int, int]:
        """(bytes, index) of the highest live memory over entries [first, last]."""
        first = max(0, int(first))
        last = min(self.n - 1, int(last))
        if self.n == 0 or last < first:
            return self.start_bytes, -1
        mx, _, arg = self.pyramid.query(np.array([first]), np.array([last + 1]))
        return int(mx[0, 0]), int(arg[0])

    # -- allocations -------------------------------------------------------------------------
    def rows_allocated_by(self, i: int) -> int:
        """How many rows (in alloc order) were allocated at or before entry i."""
        ai = self.alloc_index if self._alloc_order is None else self._sorted_alloc_index
        # the value in the array's own dtype: an int64 key would make numpy copy an
        # int32 column (millions of rows) on every call
        return int(np.searchsorted(ai, ai.dtype.type(i), side="right"))

    def live_rows(self, i: int) -> np.ndarray:
        """Rows live right after entry i."""
        k = self.rows_allocated_by(i)
        rows = np.arange(k) if self._alloc_order is None else self._alloc_order[:k]
        f = self.free_index[rows]
        return rows[(f < 0) | (f > i)]

    def is_live(self, rows: np.ndarray, i: int) -> np.ndarray:
        f = self.free_index[rows]
        return (self.alloc_index[rows] <= i) & ((f < 0) | (f > i))

    def largest_live(self, i: int, k: int = 10, category: int | None = None) -> np.ndarray:
        """Rows of the k largest allocations live after entry i (optionally one category).

        The live set at any moment is small next to all rows, and `live_rows` finds
        it from the rows allocated so far (rows are in allocation order) in a few ms
        even at 10^7 events; scanning rows by size instead took 40 ms when the
        largest allocations were not live at i.
        """
        rows = self.live_rows(i)
        if category is not None:
            rows = rows[self.category[rows] == category]
        if not len(rows):
            return np.zeros(0, dtype=np.int64)
        size = np.asarray(self.allocs.size)[rows]
        if len(rows) > k:
            part = np.argpartition(-size, k - 1)[:k]
            rows, size = rows[part], size[part]
        order = np.lexsort((rows, -size))
        return rows[order].astype(np.int64)

    def allocation_at(self, x: float, y: float, visible: list[int]) -> tuple[int, int]:
        """(row, category) of the allocation drawn under (x, y): the band of the stacked
        categories that y falls in, and its largest live allocation at that moment."""
        return self.allocation_at_index(self.index_before_x(x), y, visible)

    def allocation_at_index(self, i: int, y: float, visible: list[int]) -> tuple[int, int]:
        comp = self.composition([i])[0]
        top = 0.0
        for c in visible:
            v = max(0.0, comp[c])
            if top <= y < top + v:
                rows = self.largest_live(i, 1, c)
                return (int(rows[0]) if len(rows) else -1), c
            top += v
        return -1, -1

    def row_of_alloc_event(self, i: int) -> int:
        """The row allocated by entry i, or -1."""
        return int(self.rows_of_alloc_events([i])[0])

    def rows_of_alloc_events(self, indices) -> np.ndarray:
        """The rows allocated by these entries (-1 where an entry is not an alloc)."""
        ai = self.alloc_index if self._alloc_order is None else self._sorted_alloc_index
        idx = np.asarray(indices, dtype=np.int64)
        if not len(ai):
            return np.full(len(idx), -1, dtype=np.int64)
        k = np.searchsorted(ai, idx.astype(ai.dtype), side="left")
        kc = np.minimum(k, len(ai) - 1)
        hit = (k < len(ai)) & (ai[kc] == idx) & (idx >= 0)
        rows = kc if self._alloc_order is None else self._alloc_order[kc]
        return np.where(hit, rows, -1).astype(np.int64)

    def rule_name(self, row: int) -> str:
        r = int(self.rule[row]) if len(self.rule) > row else -1
        return self.rule_names[r] if 0 <= r < len(self.rule_names) else "-"

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

    # -- segments ----------------------------------------------------------------------------
    def _build_segments(self):
        """Segment intervals [start, end) in entries, paired by address like allocations."""
        seg = self.snap.device_segments(self.device)
        self.segments_known = self.reserved is not None
        if not self.segments_known:
            self.seg_addr = self.seg_size = self.seg_start = self.seg_end = np.zeros(0, dtype=np.int64)
            return
        act = self.action
        up_mask = (act == A_SEGMENT_ALLOC) | (act == A_SEGMENT_MAP)
        ev = np.flatnonzero(up_mask | (act == A_SEGMENT_FREE) | (act == A_SEGMENT_UNMAP))
        addr_col = self.snap.trace(self.device).columns["addr"]
        ev_addr = np.asarray(addr_col[ev], dtype=np.int64)
        ev_size = np.asarray(self.size[ev], dtype=np.int64)
        ev_up = up_mask[ev]
        order = np.lexsort((ev, ev_addr))
        ev, ev_addr, ev_size, ev_up = ev[order], ev_addr[order], ev_size[order], ev_up[order]
        same_next = np.zeros(len(ev), dtype=bool)
        if len(ev) > 1:
            same_next[:-1] = ev_addr[:-1] == ev_addr[1:]
        nxt_down = np.zeros(len(ev), dtype=bool)
        nxt_down[:-1] = ~ev_up[1:]
        paired = ev_up & same_next & nxt_down
        big = self.n + 1
        starts, ends, addrs, sizes = [], [], [], []
        up_pos = np.flatnonzero(ev_up)
        end_of_up = np.full(len(up_pos), big, dtype=np.int64)
        p = paired[up_pos]
        end_of_up[p] = ev[up_pos[p] + 1]
        starts.append(ev[up_pos]); ends.append(end_of_up)
        addrs.append(ev_addr[up_pos]); sizes.append(ev_size[up_pos])
        prev_up = np.zeros(len(ev), dtype=bool)
        prev_up[1:] = ev_up[:-1] & same_next[:-1]
        lone_down = ~ev_up & ~prev_up                      # freed, never allocated in the trace
        starts.append(np.full(int(lone_down.sum()), -1, dtype=np.int64)); ends.append(ev[lone_down])
        addrs.append(ev_addr[lone_down]); sizes.append(ev_size[lone_down])
        alive_addr = ev_addr[up_pos][end_of_up == big]
        untraced = ~np.isin(seg["address"], alive_addr)    # live at the end, never allocated in the trace
        starts.append(np.full(int(untraced.sum()), -1, dtype=np.int64)); ends.append(np.full(int(untraced.sum()), big))
        addrs.append(np.asarray(seg["address"][untraced], dtype=np.int64))
        sizes.append(np.asarray(seg["total_size"][untraced], dtype=np.int64))
        self.seg_start = np.concatenate(starts).astype(np.int64)
        self.seg_end = np.concatenate(ends).astype(np.int64)
        self.seg_addr = np.concatenate(addrs).astype(np.int64)
        self.seg_size = np.concatenate(sizes).astype(np.int64)

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

    # -- findings ------------------------------------------------------------------------------
    def _zoom_around(self, i: int, first: int | None = None, last: int | None = None) -> tuple[int, int]:
        """Entries to show around entry i: close enough to see what happens there
        (an eighth of its iteration, or of the run), never fewer than 200."""
        if first is None or last is None or last <= first:
            first, last = 0, max(self.n - 1, 0)
            for s, e, _ in self.iterations:
                if s <= i <= e:
                    first, last = s, e
                    break
        half = max(100, (last - first) // 16)
        lo, hi = max(first, i - half), min(last, i + half)
        if hi - lo < 2 * half:        # near an edge: keep the width inside the range
            lo, hi = max(0, hi - 2 * half), min(max(self.n - 1, 0), lo + 2 * half)
        return lo, hi

    def _build_findings(self) -> list[Finding]:
        out: list[Finding] = []
        da = self.da
        pk = da.peak or {}
        p_idx = int(pk.get("index", self.peak_index) if pk.get("index") is not None else self.peak_index)
        p_bytes = int(pk.get("bytes", self.peak_bytes) or self.peak_bytes)
        ptype = str(pk.get("type") or "other")
        when = "at the start of the trace" if p_idx < 0 else f"at entry {p_idx:,}"
        if isinstance(pk.get("iteration"), (int, np.integer)):
            when += f", iteration {int(pk['iteration']) + 1}"
        if pk.get("phase"):
            when += f", {pk['phase']} phase"
        out.append(Finding("peak", f"Peak {fmt_bytes(p_bytes)} · {ptype}",
                           f"highest live memory {when}" + _by_cat_text(pk.get("by_category")),
                           p_idx, self._zoom_around(p_idx), self.row_of_alloc_event(p_idx),
                           {"bytes": p_bytes, "type": ptype}))
        for o in da.ooms or []:
            if not isinstance(o, dict):
                continue
            i = int(o.get("index", -1))
            req = o.get("requested")
            free = o.get("device_free")
            detail = f"requested {fmt_bytes(req)}, device free {fmt_bytes(free)}"
            if o.get("suggestion"):
                detail += f" — next step: {o['suggestion']}"
            out.append(Finding("oom", f"OOM at entry {i:,}: {fmt_bytes(req)} requested", detail, i,
                               self._zoom_around(i), -1, o))
        for lk in da.leaks or []:
            if not isinstance(lk, dict):
                continue
            rows = self._leak_rows(lk)
            i = _first_int(lk, ("index", "first_index", "alloc_index", "start_index", "alloc_indices", "indices"))
            if i is None:
                i = int(self.alloc_index[rows[-1]]) if len(rows) else -1
            row = _first_int(lk, ("row", "rows"))
            if row is None:
                row = int(rows[-1]) if len(rows) else self.row_of_alloc_event(i)
            per_it = lk.get("bytes_per_iteration")
            total = lk.get("total_bytes", lk.get("bytes", lk.get("leaked_bytes")))
            title = "Leak " + (f"{fmt_bytes(per_it)}/iteration" if per_it is not None else fmt_bytes(total))
            if lk.get("category"):
                title += f" · {lk['category']}"
            where = str(lk.get("where") or lk.get("function") or lk.get("frame") or "")
            detail = where
            if total is not None:
                detail += f" — {fmt_bytes(total)} never freed" + (f" in {lk['count']} allocations"
                                                                    if lk.get("count") else "")
            zoom = (0, max(self.n - 1, 0))
            out.append(Finding("leak", title, detail, i, zoom, row, {**lk, "_rows": rows}))
        if self.iterations:
            it_findings = []
            for k, (s, e, it) in enumerate(self.iterations):
                ipk = it.get("peak") if isinstance(it.get("peak"), dict) else {}
                b = ipk.get("bytes", it.get("peak_bytes"))
                i = ipk.get("index", it.get("peak_index"))
                if not isinstance(b, (int, np.integer)) or not isinstance(i, (int, np.integer)):
                    b, i = self.range_peak(s, e)
                b, i = int(b), int(i)
                typ = ipk.get("type") or it.get("peak_type") or ""
                it_findings.append(Finding("iteration_peak",
                                           f"Iteration {k + 1} peak {fmt_bytes(b)}" + (f" · {typ}" if typ else ""),
                                           f"entries {s:,}–{e:,}", i, self._zoom_around(i, s, e), -1,
                                           {"bytes": b, "iteration": k}))
            rows = self.rows_of_alloc_events([f.index for f in it_findings])   # one search for all
            for f, r in zip(it_findings, rows.tolist()):
                f.row = r
            out.extend(it_findings)
        return out

    def _leak_rows(self, lk: dict) -> np.ndarray:
        """Rows a leak finding is about: never-freed allocations made in the trace from its stack."""
        sid = lk.get("stack")
        if not isinstance(sid, (int, np.integer)) or isinstance(sid, bool):
            return np.zeros(0, dtype=np.int64)
        st = np.asarray(self.allocs.stack)
        return np.flatnonzero((st == int(sid)) & (self.free_index < 0) & (self.alloc_index >= 0))

    @property
    def nbytes(self) -> int:
        """What this model adds on top of the parser's and analysis' arrays."""
        n = self.event_category.nbytes + self.checkpoints.nbytes + self.rows_by_size.nbytes
        n += self.pyramid.nbytes if self.pyramid is not None else 0
        if self._alloc_order is not None:
            n += self._alloc_order.nbytes
        return n


def _first_int(d: dict, keys) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (list, tuple, np.ndarray)) and len(v):
            v = v[0]
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return int(v)
    return None


def _by_cat_text(by_cat) -> str:
    if not isinstance(by_cat, dict) or not by_cat:
        return ""
    top = sorted(by_cat.items(), key=lambda kv: -kv[1])[:3]
    return ": " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in top)


def _norm_iterations(iterations, n: int) -> list[tuple[int, int, dict]]:
    """[(start, end, dict)] with the phases normalised to [(name, start, end)] in dict['_phases']."""
    out = []
    for it in iterations or []:
        if not isinstance(it, dict):
            continue
        s, e = it.get("start_index"), it.get("end_index")
        if not isinstance(s, (int, np.integer)) or not isinstance(e, (int, np.integer)):
            continue
        phases = []
        ph = it.get("phases") or {}
        items = ph.items() if isinstance(ph, dict) else (
            ((p.get("phase") or p.get("name"), p) for p in ph if isinstance(p, dict)))
        for name, rng in items:
            if isinstance(rng, dict):
                rng = (rng.get("start_index"), rng.get("end_index"))
            if isinstance(rng, (list, tuple)) and len(rng) >= 2 and all(
                    isinstance(v, (int, np.integer)) for v in rng[:2]):
                phases.append((str(name), int(rng[0]), int(rng[1])))
        d = dict(it)
        d["_phases"] = phases
        out.append((int(s), int(e), d))
    out.sort(key=lambda t: t[0])
    return out
