"""Two recordings of one run on one x axis, for the viewer's comparison (no Qt here).

`CompareResult` is what the worker hands the window: both loaded files and the typed
comparison (classifiers/compare.py, through `services.compare.compare_analyses`, as
`vramscope compare` computes it): the numbers the panel shows are its, so the viewer and
the command line cannot disagree.

`AlignedSide` puts one side's live memory on the shared axis, without a per-entry array:
  * "start": aligned at the first iteration's start (`CompareSide.origin_index` /
    `origin_us`), in seconds when both sides' own axis is (model/axis.py), else in entries;
  * "iteration": each iteration drawn one unit wide (iteration k from k - 1 to k), so
    iteration 3 of A sits over iteration 3 of B whatever their lengths.
Its `envelope` is exact per pixel column (the `MinMaxPyramid` of DESIGN.md §7): each column
holds the value entering it, its max and min and the value leaving it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...classifiers.compare import CompareSide, Comparison, DeviceComparison
from ...services.compare import comparison_notes
from .axis import axis_of, trace_times
from .lod import MinMaxPyramid

if TYPE_CHECKING:
    from .load import LoadResult

ALIGN_START, ALIGN_ITERATION = "start", "iteration"


@dataclass
class CompareResult:
    """What the worker hands the window for a comparison: both loaded files and the typed
    comparison of the two (`classifiers.compare.Comparison`, as `vramscope compare` computes
    it through `services.compare.compare_analyses`): the panel reads its numbers, so the
    viewer and the command line cannot disagree."""
    a: LoadResult                    # the file shown in the timeline
    b: LoadResult                    # the file compared with it
    comparison: Comparison

    def device(self, dev: int | None) -> DeviceComparison | None:
        """The comparison of one device (None: not compared)."""
        return next((dc for dc in self.comparison.devices if dc.device == dev), None)

    @property
    def devices(self) -> list[int]:
        return [dc.device for dc in self.comparison.devices]

    def notes(self) -> list[str]:
        """What a reader must know to read the numbers right (devices left out, state-only
        sides), as `vramscope compare` words it."""
        return comparison_notes(self.comparison, self.a.path, self.b.path)


def usable_times(da) -> bool:
    """Whether a side's time stamps carry the axis: the one rule (classifiers/timeaxis.py,
    through model/axis.py) the main timeline follows, so a run is never in entries in the
    timeline and squeezed into seconds here."""
    return axis_of(da).seconds


class AlignedSide:
    """One side's live memory (one device of one file) on the comparison's x axis."""

    def __init__(self, analysis, side: CompareSide, pyramid: MinMaxPyramid | None = None):
        da = analysis.devices[side.device]
        self.side = side
        self.live = np.asarray(da.live.live_after)
        self.start_bytes = int(da.live.start_bytes)
        self.n = len(self.live)
        tus = trace_times(da)
        self.has_time = usable_times(da) and tus is not None and side.origin_us is not None
        self.tus: np.ndarray = tus if tus is not None else np.zeros(0, dtype=np.int64)
        self.origin_us = side.origin_us if side.origin_us is not None else 0
        self.origin = max(side.origin_index, 0)
        # iteration k (from 0) spans entries [bounds[k], bounds[k + 1]): up to the next one's
        # start, so the steps between iterations (evaluation, logging) belong to the one before
        its = side.iterations
        if its:
            self.bounds = np.array([it.start_index for it in its] + [its[-1].end_index + 1], dtype=np.int64)
            self.bounds = np.maximum.accumulate(self.bounds)
        else:
            self.bounds = np.zeros(0, dtype=np.int64)
        self._pyramid = pyramid

    @property
    def pyramid(self) -> MinMaxPyramid:
        if self._pyramid is None:
            self._pyramid = MinMaxPyramid([self.live])
        return self._pyramid

    # -- the axis ------------------------------------------------------------------------------
    def x_of_index(self, i, mode: str, seconds: bool) -> np.ndarray:
        """x of entry i on the shared axis."""
        i = np.asarray(i, dtype=np.int64)
        if mode == ALIGN_ITERATION and len(self.bounds) > 1:
            return self._iteration_x(i.astype(np.float64))
        if seconds:
            return (self.tus[np.clip(i, 0, max(self.n - 1, 0))] - self.origin_us) / 1e6
        return (i - self.origin).astype(np.float64)

    def _iteration_x(self, i: np.ndarray) -> np.ndarray:
        b = self.bounds.astype(np.float64)
        k = np.clip(np.searchsorted(b, i, side="right") - 1, 0, len(b) - 2)
        width = np.maximum(b[k + 1] - b[k], 1.0)
        return k + (i - b[k]) / width

    def index_at_x(self, x, mode: str, seconds: bool) -> np.ndarray:
        """The first entry whose x is >= x (0..n)."""
        x = np.asarray(x, dtype=np.float64)
        if mode == ALIGN_ITERATION and len(self.bounds) > 1:
            b = self.bounds.astype(np.float64)
            k = np.clip(np.floor(x), 0, len(b) - 2).astype(np.int64)
            width = np.maximum(b[k + 1] - b[k], 1.0)
            pos = b[k] + (x - k) * width
            return np.clip(np.ceil(pos - 1e-9), 0, self.n).astype(np.int64)
        if seconds:
            key = np.ceil(self.origin_us + x * 1e6)
            key = np.clip(key, -(1 << 62), 1 << 62).astype(np.int64)
            return np.searchsorted(self.tus, key, side="left").astype(np.int64)
        return np.clip(np.ceil(x + self.origin), 0, self.n).astype(np.int64)

    def x_span(self, mode: str, seconds: bool) -> tuple[float, float]:
        if self.n == 0:
            return 0.0, 0.0
        xs = self.x_of_index([0, self.n - 1], mode, seconds)
        return float(xs[0]), float(xs[1])

    def live_before_x(self, x: float, mode: str, seconds: bool) -> int | None:
        """Live bytes at x (the state after the last entry at or before it); None off the trace."""
        if self.n == 0:
            return self.start_bytes
        lo, hi = self.x_span(mode, seconds)
        if x < lo or x > hi:
            return None
        i = int(self.index_at_x(np.nextafter(x, np.inf), mode, seconds)) - 1
        return self.start_bytes if i < 0 else int(self.live[min(i, self.n - 1)])

    # -- the curve -----------------------------------------------------------------------------
    def envelope(self, x0: float, x1: float, buckets: int, mode: str, seconds: bool) -> tuple[np.ndarray, np.ndarray]:
        """(x, live bytes) vertices over [x0, x1], one column per bucket: the value entering
        it, its max, its min, the value leaving it; nothing outside the side's own trace."""
        if self.n == 0:
            return np.array([x0, x1]), np.array([self.start_bytes, self.start_bytes], dtype=np.float64)
        lo, hi = self.x_span(mode, seconds)
        x0, x1 = max(x0, lo), min(x1, hi)
        if not x1 > x0:
            return np.zeros(0), np.zeros(0)
        buckets = max(1, int(buckets))
        edges = np.linspace(x0, x1, buckets + 1)
        idx = self.index_at_x(edges, mode, seconds)
        idx[-1] = max(idx[-1], min(self.n, int(self.index_at_x(np.nextafter(x1, np.inf), mode, seconds))))
        a, b = idx[:-1], idx[1:]
        ne = np.flatnonzero(b > a)
        if not len(ne):
            v = float(self.live_before_x(x0, mode, seconds) or 0)
            return np.array([x0, x1]), np.array([v, v])
        qa, qb = a[ne], b[ne]
        mx, mn, _ = self.pyramid.query(qa, qb)
        prev = np.where(qa > 0, self.live[np.maximum(qa - 1, 0)], self.start_bytes).astype(np.float64)
        last = self.live[qb - 1].astype(np.float64)
        cx = ((edges[:-1] + edges[1:]) / 2)[ne]
        xs = np.repeat(cx, 4)
        ys = np.column_stack([prev, mx[:, 0], mn[:, 0], last]).ravel().astype(np.float64)
        return np.concatenate([[x0], xs, [x1]]), np.concatenate([[prev[0]], ys, [last[-1]]])


def aligned_sides(result: CompareResult, dc: DeviceComparison) -> tuple[AlignedSide, AlignedSide]:
    """Both sides of one device, reusing a side's pyramid where its window already built one."""
    out = []
    for res, side in ((result.a, dc.a), (result.b, dc.b)):
        data = getattr(res, "data", None)
        pyr = data.pyramid if data is not None and data.device == side.device else None
        out.append(AlignedSide(res.analysis, side, pyr))
    return out[0], out[1]


def shared_seconds(a: AlignedSide, b: AlignedSide) -> bool:
    """Seconds on the axis when both sides can carry it, else entries."""
    return a.has_time and b.has_time


def can_align_iterations(a: AlignedSide, b: AlignedSide) -> bool:
    return len(a.bounds) > 1 and len(b.bounds) > 1


__all__ = ["CompareResult", "AlignedSide", "aligned_sides", "usable_times", "shared_seconds",
           "can_align_iterations", "ALIGN_START", "ALIGN_ITERATION"]
