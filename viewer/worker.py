"""The window's worker: request -> worker -> result applied on the GUI thread.

One worker (a QThreadPool of one thread, napari-style): a new request cancels
the one in flight through its `Progress`, and a result that arrives for a
request that is no longer the current one is dropped. The work itself (opening,
analyzing, modelling, comparing, exporting) knows nothing of Qt; it reports through
the GUI-neutral `Progress`, whose callback here only emits a queued signal.
"""
from __future__ import annotations

import sys
import traceback
from typing import Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from ..parsers import Cancelled, Progress, SnapshotError


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
