"""Loading off the GUI thread: request -> worker -> result applied on the GUI thread.

One worker (a QThreadPool of one thread, napari-style): a new request cancels
the one in flight through its `Progress`, and a result that arrives for a
request that is no longer the current one is dropped. The parser and the
analysis know nothing of Qt; they report through the GUI-neutral `Progress`,
whose callback here only emits a queued signal.
"""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from ..classifiers import Analysis, analyze
from ..parsers import Cancelled, Progress, Snapshot, SnapshotError, open_snapshot
from ..present.stacks import Stacks
from ..services.compare import compare_analyses, compare_devices, compare_document
from .compare_data import CompareResult
from .model import DeviceData


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
         progress: Progress | None = None) -> LoadResult:
    """Open, analyze and model one snapshot (any thread). Raises SnapshotError, Cancelled."""
    progress = progress or Progress()
    snap = open_snapshot(path, progress=progress, use_cache=use_cache)
    progress.check()
    progress.start("analyzing", 1.0)
    an = analyze(snap, progress=progress)
    progress.check()
    dev = pick_device(an, device)
    stacks = Stacks(an)
    data = DeviceData(snap, an, dev, progress, stacks) if dev is not None else None
    return LoadResult(path, snap, an, dev, data, stacks)


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
    return CompareResult(a, b, cmp, compare_document(cmp, a.path, b.path))


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


class _Signals(QObject):
    progress = Signal(int, str, float, float)
    done = Signal(int, object)
    failed = Signal(int, str)
    cancelled = Signal(int)


class _Job(QRunnable):
    def __init__(self, req: int, fn: Callable, progress: Progress, signals: _Signals):
        super().__init__()
        self.req, self.fn, self.progress, self.signals = req, fn, progress, signals

    def run(self):
        req, sig = self.req, self.signals
        try:
            self.progress.check()
            result = self.fn(self.progress)
        except Cancelled:
            sig.cancelled.emit(req)
        except SnapshotError as e:
            sig.failed.emit(req, e.one_line())
        except MemoryError:
            sig.failed.emit(req, "not enough memory to open this snapshot")
        except Exception as e:  # a bug: one line in the dialog, the traceback on stderr
            traceback.print_exc(file=sys.stderr)
            msg = " ".join(f"{type(e).__name__}: {e}".split())
            sig.failed.emit(req, f"unexpected error ({msg})")
        else:
            sig.done.emit(req, result)
        finally:
            self.fn = None


class Loader(QObject):
    """Runs one job at a time; only the latest request's outcome is reported."""

    progressed = Signal(str, float, float)
    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(1)
        self._signals = _Signals(self)
        self._signals.progress.connect(self._on_progress)
        self._signals.done.connect(self._on_done)
        self._signals.failed.connect(self._on_failed)
        self._signals.cancelled.connect(self._on_cancelled)
        self._req = 0
        self._progress: Progress | None = None
        self._busy = False

    @property
    def busy(self) -> bool:
        return self._busy

    def submit(self, fn: Callable[[Progress], object]) -> int:
        """Run fn(progress) on the worker; cancels (and silences) the request before it."""
        self.cancel()
        self._req += 1
        req = self._req
        sig = self._signals
        progress = Progress(lambda label, done, total: sig.progress.emit(req, label, done, total))
        self._progress = progress
        self._busy = True
        self.pool.start(_Job(req, fn, progress, sig))
        return req

    def cancel(self):
        if self._progress is not None:
            self._progress.cancel()

    def shutdown(self):
        """Cancel and wait for the worker (before the window goes away)."""
        self.cancel()
        self.pool.waitForDone()
        self._busy = False

    def _on_progress(self, req, label, done, total):
        if req == self._req:
            self.progressed.emit(label, done, total)

    def _finish(self, req) -> bool:
        if req != self._req:
            return False
        self._busy = False
        self._progress = None
        return True

    def _on_done(self, req, result):
        if self._finish(req):
            self.finished.emit(result)

    def _on_failed(self, req, msg):
        if self._finish(req):
            self.failed.emit(msg)

    def _on_cancelled(self, req):
        if self._finish(req):
            self.cancelled.emit()
