"""Work off the GUI thread: request -> worker -> result applied on the GUI thread.

One `Worker` is one thread (a QThreadPool of one, napari-style): a new request cancels
the one in flight through its `Progress`, and a result that arrives for a request that
is no longer the current one is dropped. The work itself (opening, analyzing, modelling,
comparing, the What-if panel's model, exporting) knows nothing of Qt; it reports through
the GUI-neutral `parsers.Progress`, whose callback here only emits a queued signal.

The window keeps one worker per kind of work (files, exports, the What-if model), so an
export never cancels an open and a new file cancels the work of the old one.

`GuiThread` is the way back for the rare step that needs the GUI thread (the report's
PNG is drawn with Qt widgets): the worker asks, waits, and stays cancellable.
"""
from __future__ import annotations

import sys
import threading
import traceback
from typing import Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from ..parsers import Cancelled, Progress, SnapshotError
from ..present.words import error_text


class _Signals(QObject):
    progress = Signal(int, str, float, float)
    done = Signal(int, object)
    failed = Signal(int, str)
    cancelled = Signal(int)


class _Job(QRunnable):
    def __init__(self, req: int, fn: Callable[[Progress], object], progress: Progress, signals: _Signals,
                 expected: tuple[type[BaseException], ...]):
        super().__init__()
        self.req, self.fn, self.progress, self.signals, self.expected = req, fn, progress, signals, expected

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
            sig.failed.emit(req, "not enough memory for this snapshot")
        except Exception as e:
            if isinstance(e, self.expected):          # a folder that cannot be written, a bad range
                sig.failed.emit(req, error_text(e))
            else:                                     # a bug: one line in the dialog, the traceback on stderr
                traceback.print_exc(file=sys.stderr)
                msg = " ".join(f"{type(e).__name__}: {e}".split())
                sig.failed.emit(req, f"unexpected error ({msg})")
        else:
            sig.done.emit(req, result)
        finally:
            self.fn = None


class Worker(QObject):
    """Runs one job at a time; only the latest request's outcome is reported."""

    progressed = Signal(str, float, float)
    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, parent: QObject | None = None):
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

    @property
    def request(self) -> int:
        """The id of the latest request (what `submit` returned; 0 before any)."""
        return self._req

    def submit(self, fn: Callable[[Progress], object], expected: tuple[type[BaseException], ...] = ()) -> int:
        """Run fn(progress) on the worker; cancels (and silences) the request before it.
        An exception of the `expected` kinds fails the request with its one line, without
        a traceback (any other is a bug: its traceback goes to stderr)."""
        self.cancel()
        self._req += 1
        req = self._req
        sig = self._signals
        progress = Progress(lambda label, done, total: sig.progress.emit(req, label, done, total))
        self._progress = progress
        self._busy = True
        self.pool.start(_Job(req, fn, progress, sig, expected))
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


class GuiThread(QObject):
    """Made on the GUI thread, it runs there what a worker hands it (a queued signal): for the
    rare step of a job that needs the GUI thread (the report's PNG is drawn with Qt widgets)."""

    _call = Signal(object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._call.connect(self._run)

    @staticmethod
    def _run(request):
        fn, box, done = request
        try:
            box.append(("ok", fn()))
        except BaseException as e:       # handed back to the worker, which raises it there
            box.append(("error", e))
        finally:
            done.set()

    def runner(self, progress: Progress) -> Callable[[Callable[[], object]], object]:
        """A function for a worker: run(fn) runs fn() on the GUI thread and returns its result
        (or raises its exception). The worker waits, checking `progress` every 50 ms: a
        cancelled request stops waiting, so the window's shutdown (which cancels first) never
        waits on a worker that waits on it."""
        def run(fn: Callable[[], object]) -> object:
            box: list = []
            done = threading.Event()
            self._call.emit((fn, box, done))
            while not done.wait(0.05):
                progress.check()
            kind, value = box[0]
            if kind == "error":
                raise value
            return value
        return run


__all__ = ["Worker", "GuiThread"]
