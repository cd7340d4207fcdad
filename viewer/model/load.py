"""Opening, analyzing and modelling a snapshot for the viewer (any thread, no Qt here).

The window's worker (viewer/worker.py) runs these; each reports through the GUI-neutral
`parsers.Progress` and raises `Cancelled` when asked to stop.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ...classifiers import Analysis, analyze
from ...common.later import Later, in_order
from ...common.memory import give_back_freed_pages
from ...parsers import Cancelled, Progress, Snapshot, open_snapshot
from ...present.stacks import Stacks
from ...services.compare import compare_analyses, compare_devices
from .compare import CompareResult
from .device import DeviceData, DevicePrep


@dataclass
class LoadResult:
    path: str
    snapshot: Snapshot
    analysis: Analysis
    device: int | None
    data: DeviceData | None
    stacks: Stacks


def pick_device(analysis: Analysis, wanted: int | None) -> int | None:
    """The device asked for, else the one to look at first (an OOM, else the highest peak)."""
    if wanted is not None and wanted in analysis.devices:
        return wanted
    return analysis.primary_device()


def load(path: str, device: int | None = None, use_cache: bool = True,
         progress: Progress | None = None, on_read: Callable[[], object] | None = None) -> LoadResult:
    """Open, analyze and model one snapshot (any thread). Raises SnapshotError, Cancelled.
    `on_read()`: called once the file is read, before its analysis."""
    progress = progress or Progress()
    snap = open_snapshot(path, progress=progress, use_cache=use_cache)
    if on_read is not None:
        on_read()
    progress.check()
    progress.start("analyzing", 1.0)
    # the device's times and allocator history made as soon as its rows are classified, while
    # the analysis goes on: for the device asked for, else the only one (with several, the one
    # shown is known once all are analyzed: its model is all made after)
    preps: dict[int, DevicePrep] = {}

    def beside(da) -> None:
        if da.device == device or (device is None and len(snap.devices) == 1):
            preps[da.device] = DevicePrep.beside_analysis(snap, da)
    an = analyze(snap, progress=progress, beside=beside)
    give_back_freed_pages()         # (the analysis' temporaries: the model's arrays come next)
    progress.check()
    dev = pick_device(an, device)
    stacks = Stacks(an)
    data = DeviceData(snap, an, dev, progress, stacks, preps.get(dev)) if dev is not None else None
    # analyzed and modelled: the pages of the columns the stages read whole, and the heap's pages
    # their temporaries freed, handed back before the window draws (at 10^7 entries 230 MB of
    # the heap, and up to 40 MB a column, were held from here on)
    for t in snap.traces.values():
        t.release(tuple(t.columns))
    give_back_freed_pages()
    return LoadResult(path, snap, an, dev, data, stacks)


class Begun:
    """A file's opening begun on a thread of its own before Qt and the window are set up (the
    command line's `vramscope FILE`, `view FILE [--screenshot]`: at 10^7 events Qt's import and the
    window take a second, spent beside the reading instead of before it). Its progress goes to
    whoever `follow`s it, from the moment they do; `cancel` stops it."""

    def __init__(self, path: str, device: int | None = None, use_cache: bool = True):
        self.path = os.path.abspath(path)
        self._to: Progress | None = None
        self._last: tuple[str, float, float] | None = None
        self.progress = Progress(self._report)
        self._read = threading.Event()
        path_, progress, read = self.path, self.progress, self._read

        def job() -> LoadResult:
            try:
                return load(path_, device, use_cache, progress, on_read=read.set)
            finally:
                read.set()
        self.job: Later[LoadResult] = Later(job)
        in_order([self.job], name="vramscope-load")

    def _report(self, label: str, done: float, total: float) -> None:       # on the reading's thread
        self._last = (label, done, total)
        to = self._to
        if to is not None:
            try:
                _relay(to, label, done, total)
            except Cancelled:             # the follower was cancelled: so is the reading, at its next check
                self.progress.cancel()

    def follow(self, progress: Progress) -> LoadResult:
        """Wait for the result (on the window's worker), its progress reported through
        `progress`; when `progress` is cancelled, so is the reading (Cancelled raised here)."""
        self._to = progress
        last = self._last
        if last is not None:
            _relay(progress, *last)
        while not self.job.wait(0.05):
            if progress.cancelled:
                self.cancel()
                raise Cancelled()
        return self.job.take()

    def done(self) -> bool:
        return self.job.wait(0)

    def wait_read(self) -> None:
        """Wait until the file is read (its analysis begun), or the reading has ended otherwise."""
        while not self._read.wait(0.1):      # (a timeout: Ctrl-C is seen between two waits)
            pass

    def cancel(self, wait: float = 0.0) -> None:
        """Stop the reading; with `wait`, wait that long for it to have stopped (its helper
        processes are stopped by it, not cut off at the interpreter's exit)."""
        self.progress.cancel()
        if wait:
            self.job.wait(wait)


def _relay(to: Progress, label: str, done: float, total: float) -> None:
    if label != to.label or total != to.total:
        to.start(label, total)
    to.update(done)


def switch_device(result: LoadResult, device: int, progress: Progress | None = None) -> LoadResult:
    data = DeviceData(result.snapshot, result.analysis, device, progress, result.stacks)
    return LoadResult(result.path, result.snapshot, result.analysis, device, data, result.stacks)


def compare_results(a: LoadResult, b: LoadResult, progress: Progress | None = None,
                    across_devices: bool = False) -> CompareResult:
    """A and B compared as `vramscope compare A B` compares them (any thread), or, with
    `across_devices`, the device each shows (two ranks, each on its own GPU). Raises
    CompareError (a SnapshotError: no device in common, a side with no data)."""
    if progress is not None:
        progress.start("comparing", 1.0)
    if across_devices and a.device is not None and b.device is not None:
        cmp = compare_devices(a.analysis, a.device, b.analysis, b.device)
    else:
        cmp = compare_analyses(a.analysis, b.analysis)
    if progress is not None:
        progress.check()
    return CompareResult(a, b, cmp)


def load_compare(a: LoadResult, path_b: str, use_cache: bool = True,
                 progress: Progress | None = None, across_devices: bool = False) -> CompareResult:
    """Open, analyze and model B (on the device A shows, where B has it), then compare."""
    progress = progress or Progress()
    b = load(path_b, a.device, use_cache, progress)
    progress.check()
    return compare_results(a, b, progress, across_devices)


def swap_compare(cr: CompareResult, device: int | None, progress: Progress | None = None) -> CompareResult:
    """B becomes A (the file the timeline shows, on `device` where it has it) and A becomes B."""
    b = cr.b
    if device is not None and device in b.analysis.devices and (b.data is None or b.data.device != device):
        b = switch_device(b, device, progress)
    return compare_results(b, cr.a, progress, any(dc.a.device != dc.b.device for dc in cr.comparison.devices))
