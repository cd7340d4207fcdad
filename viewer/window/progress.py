"""A window-modal progress dialog with Cancel for the requests of one worker (viewer/worker.py):
opening and comparing files, the exports. Shown only for work that takes a while (400 ms).

Not a QProgressDialog: a modal QProgressDialog runs the event loop inside `setValue`
(QCoreApplication::processEvents), so a progress report could deliver the request's own
result in the middle of `setValue`, whose handler deletes that very dialog (a deferred
delete posted from inside the nested loop runs in it): a segmentation fault in
`on_progress` (issue 33). Setting a QProgressBar's value only repaints; nothing here
re-enters the event loop.

Progress reaches only the dialog of the request it belongs to (the worker drops a stale
request's reports; the dialog remembers its request and ignores any other), and never a
dialog or window that is gone: the controller is a QObject child of the window, so its
connection to the worker dies with the window, and a dialog deleted by Qt is let go.
"""
from __future__ import annotations

import shiboken6
from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QDialog, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from ..worker import Worker

SHOW_AFTER_MS = 400
STEPS = 1000


class ProgressWindow(QDialog):
    """The dialog itself: a label, a bar (busy or 0..STEPS) and Cancel (Esc too)."""

    canceled = Signal()

    def __init__(self, parent: QWidget, label: str):
        super().__init__(parent)
        self.setWindowTitle("vramscope")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.label = QLabel(label, self)
        self.label.setWordWrap(True)
        self.bar = QProgressBar(self)
        self.bar.setRange(0, STEPS)
        self.bar.setValue(0)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.clicked.connect(self.canceled)
        lay = QVBoxLayout(self)
        lay.addWidget(self.label)
        lay.addWidget(self.bar)
        lay.addWidget(self.cancel_button, 0, Qt.AlignmentFlag.AlignRight)
        self.setMinimumWidth(min(360, max(200, parent.width() - 40)) if parent is not None else 300)
        self._show_timer = QTimer(self)
        self._show_timer.setSingleShot(True)
        self._show_timer.timeout.connect(self.show)

    def show_after(self, ms: int):
        self._show_timer.start(ms)

    def stop(self):
        self._show_timer.stop()
        self.hide()

    def reject(self):               # Esc and the title bar's close: cancel the request
        self.canceled.emit()

    # the parts of QProgressDialog's interface the window and the tests read
    def labelText(self) -> str:
        return self.label.text()

    def setLabelText(self, text: str):
        self.label.setText(text)

    def maximum(self) -> int:
        return self.bar.maximum()

    def value(self) -> int:
        return self.bar.value()

    def set_fraction(self, frac: float | None):
        """None: a busy bar (a step that reports no progress of its own); else 0..1."""
        if frac is None:
            if self.bar.maximum() != 0:
                self.bar.setRange(0, 0)
            return
        if self.bar.maximum() == 0:
            self.bar.setRange(0, STEPS)
        self.bar.setValue(int(frac * (STEPS - 1)))


class ProgressDialog(QObject):
    """Shows the worker's progress while a request runs; Cancel cancels it."""

    def __init__(self, parent: QWidget, worker: Worker):
        super().__init__(parent)
        self.parent_widget = parent
        self.worker = worker
        self.dialog: ProgressWindow | None = None
        self.request = -1                       # the worker's request the dialog belongs to
        self.title = ""
        worker.progressed.connect(self.on_progress)

    def show(self, label: str):
        """The dialog of the worker's current request (shown after SHOW_AFTER_MS)."""
        self.hide()
        self.title = label
        self.request = self.worker.request
        dlg = ProgressWindow(self.parent_widget, label)
        dlg.canceled.connect(self.worker.cancel)
        dlg.destroyed.connect(self._on_destroyed)
        dlg.show_after(SHOW_AFTER_MS)
        self.dialog = dlg

    def _on_destroyed(self, *_):
        self.dialog = None

    def hide(self):
        dlg, self.dialog = self.dialog, None
        self.request = -1
        if dlg is not None and shiboken6.isValid(dlg):
            dlg.canceled.disconnect(self.worker.cancel)
            dlg.destroyed.disconnect(self._on_destroyed)
            dlg.stop()
            dlg.deleteLater()

    def on_progress(self, label: str, done: float, total: float):
        dlg = self.dialog
        if dlg is None or self.request != self.worker.request or not shiboken6.isValid(dlg):
            return
        frac = 0.0 if total <= 0 else min(1.0, done / total)
        dlg.setLabelText(f"{self.title}\n{label.capitalize()}…")
        # a step that reports no progress of its own (the analysis of one device, the
        # timeline's model): a busy bar, not a bar stuck at 0%
        dlg.set_fraction(None if frac <= 0.0 else frac)


__all__ = ["ProgressDialog", "ProgressWindow", "SHOW_AFTER_MS"]
