"""One GUI-neutral progress object for long work.

The parser reports through it; the command line draws a bar on stderr, the viewer
a dialog with Cancel. Reporting is throttled so that a hot loop can call
`update` freely: it only looks at the clock every `check_every` calls.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from .errors import Cancelled


class Progress:
    """Tracks done/total for a named task; `cancel()` may be called from any thread."""

    def __init__(self, callback: Callable[[str, float, float], None] | None = None,
                 min_interval: float = 0.1):
        self._callback = callback
        self._min_interval = min_interval
        self._last = 0.0
        self._cancel = threading.Event()
        self.label = ""
        self.done = 0.0
        self.total = 0.0

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self) -> None:
        """Raise `Cancelled` if somebody asked us to stop."""
        if self._cancel.is_set():
            raise Cancelled()

    def start(self, label: str, total: float) -> None:
        self.label, self.total, self.done = label, float(total), 0.0
        self._emit(force=True)

    def update(self, done: float) -> None:
        self.done = float(done)
        if self._cancel.is_set():
            raise Cancelled()
        self._emit()

    def finish(self) -> None:
        self.done = self.total
        self._emit(force=True)

    def _emit(self, force: bool = False) -> None:
        if self._callback is None:
            return
        now = time.monotonic()
        if force or now - self._last >= self._min_interval:
            self._last = now
            self._callback(self.label, self.done, self.total)


class TerminalProgress(Progress):
    """A progress bar on stderr, shown only for work that takes a while."""

    def __init__(self, stream=None, delay: float = 0.5):
        super().__init__(self._draw, min_interval=0.1)
        self._stream = stream or sys.stderr
        self._t0 = time.monotonic()
        self._delay = delay
        self._drawn = False
        try:
            self._tty = self._stream.isatty()
        except (AttributeError, ValueError):
            self._tty = False

    def _draw(self, label: str, done: float, total: float) -> None:
        if not self._tty or (time.monotonic() - self._t0 < self._delay and not self._drawn):
            return
        frac = 0.0 if total <= 0 else min(1.0, done / total)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        self._stream.write(f"\r{label:<12} [{bar}] {frac * 100:5.1f}%")
        if done >= total and self._drawn:
            self._stream.write("\n")
        self._stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn and self.done < self.total:
            self._stream.write("\n")
            self._stream.flush()
