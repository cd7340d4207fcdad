"""A window-modal progress dialog with Cancel for the requests of one worker (viewer/worker.py):
opening and comparing files, the exports. Shown only for work that takes a while (400 ms)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QProgressDialog, QWidget

from ..worker import Worker


class ProgressDialog:
    """Shows the worker's progress while a request runs; Cancel cancels it."""

    def __init__(self, parent: QWidget, worker: Worker):
        self.parent = parent
        self.worker = worker
        self.dialog: QProgressDialog | None = None
        self.title = ""
        worker.progressed.connect(self.on_progress)

    def show(self, label: str):
        self.hide()
        self.title = label
        dlg = QProgressDialog(label, "Cancel", 0, 1000, self.parent)
        dlg.setWindowTitle("vramscope")
        dlg.setWindowModality(Qt.WindowModality.WindowModal)
        dlg.setMinimumDuration(400)
        dlg.setAutoClose(False)
        dlg.setAutoReset(False)
        dlg.canceled.connect(self.worker.cancel)
        dlg.setValue(0)
        self.dialog = dlg

    def hide(self):
        dlg = self.dialog
        if dlg is not None:
            self.dialog = None
            dlg.canceled.disconnect(self.worker.cancel)
            dlg.reset()
            dlg.hide()
            dlg.deleteLater()

    def on_progress(self, label: str, done: float, total: float):
        dlg = self.dialog
        if dlg is None:
            return
        frac = 0.0 if total <= 0 else min(1.0, done / total)
        dlg.setLabelText(f"{self.title}\n{label.capitalize()}…")
        if frac <= 0.0:
            # a step that reports no progress of its own (the analysis of one device, the
            # timeline's model): a busy bar, not a bar stuck at 0%
            dlg.setRange(0, 0)
        else:
            if dlg.maximum() == 0:
                dlg.setRange(0, 1000)
            dlg.setValue(int(frac * 999))
