"""The main window's loading: open, reload, another device, drag and drop, and the progress
dialog with Cancel (the work runs on the loader's worker, viewer/loader.py). Mixed into
MainWindow (viewer/window.py)."""
from __future__ import annotations

import os

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox, QProgressDialog

from ..model.compare import CompareResult
from ..model.load import load, switch_device

FILE_FILTER = "Memory snapshots (*.pickle *.pkl *.pck *.p);;All files (*)"


class LoadingMixin:
    """Mixed into MainWindow (viewer/window.py)."""

    def open_dialog(self):
        start = self.settings.value("last_dir", "") if self.settings is not None else ""
        path, _ = QFileDialog.getOpenFileName(self, "Open memory snapshot", start or "", FILE_FILTER)
        if path:
            self.open_path(path)

    def open_path(self, path: str, device: int | None = None):
        """Load in the background (a newer request replaces an older one)."""
        path = os.path.abspath(path)
        use_cache = self.use_cache
        self._close_error()
        self._pending_what = "open"
        self.loader.submit(lambda progress: load(path, device, use_cache, progress))
        self._show_progress(f"Opening {os.path.basename(path)}…")
        self.statusBar().showMessage(f"Opening {path}…")

    def reload(self):
        if self.path:
            self.open_path(self.path, self.data.device if self.data is not None else None)

    def _show_progress(self, label: str):
        self._hide_progress()
        self._progress_title = label
        dlg = QProgressDialog(label, "Cancel", 0, 1000, self)
        dlg.setWindowTitle("vramscope")
        dlg.setWindowModality(Qt.WindowModality.WindowModal)
        dlg.setMinimumDuration(400)
        dlg.setAutoClose(False)
        dlg.setAutoReset(False)
        dlg.canceled.connect(self.loader.cancel)
        dlg.setValue(0)
        self.progress_dialog = dlg

    def _hide_progress(self):
        dlg = self.progress_dialog
        if dlg is not None:
            self.progress_dialog = None
            dlg.canceled.disconnect(self.loader.cancel)
            dlg.reset()
            dlg.hide()
            dlg.deleteLater()

    def _on_progress(self, label: str, done: float, total: float):
        dlg = self.progress_dialog
        if dlg is None:
            return
        frac = 0.0 if total <= 0 else min(1.0, done / total)
        dlg.setLabelText(f"{self._progress_title}\n{label.capitalize()}…")
        if frac <= 0.0:
            # a step that reports no progress of its own (the analysis of one device, the
            # timeline's model): a busy bar, not a bar stuck at 0%
            dlg.setRange(0, 0)
        else:
            if dlg.maximum() == 0:
                dlg.setRange(0, 1000)
            dlg.setValue(int(frac * 999))

    def _on_loaded(self, result):
        self._hide_progress()
        self.statusBar().clearMessage()
        if isinstance(result, CompareResult):
            self.apply_compare(result)
        else:
            self.apply_result(result)

    def _on_failed(self, msg: str):
        self._hide_progress()
        self._sync_device_choice()
        comparing = self._pending_what == "compare"
        self.statusBar().showMessage("Could not compare" if comparing else "Could not open the snapshot", 5000)
        self._close_error()
        title = "Cannot compare" if comparing else "Cannot open snapshot"
        if comparing:
            msg = f"The two files cannot be compared.\n\n{msg}"
        box = QMessageBox(QMessageBox.Icon.Warning, title, msg, QMessageBox.StandardButton.Ok, self)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.open()
        self.error_box = box

    def _close_error(self):
        if self.error_box is not None:
            self.error_box.close()
            self.error_box.deleteLater()
            self.error_box = None

    def _on_cancelled(self):
        self._hide_progress()
        self._sync_device_choice()
        self.statusBar().showMessage("Loading cancelled", 5000)

    def _on_device_chosen(self, idx: int):
        dev = self.device_combo.itemData(idx)
        if dev is not None:
            self.show_device(int(dev))

    def show_device(self, dev: int):
        """Show another device of the open snapshot (the toolbar's combo box and the device
        overview both come here), modelled off the GUI thread."""
        if self.result is None or dev not in self.result.analysis.devices or \
                (self.data is not None and dev == self.data.device):
            self._sync_device_choice()
            return
        result = self.result
        self._pending_what = "open"
        self.loader.submit(lambda progress: switch_device(result, dev, progress))
        self._show_progress(f"Preparing cuda:{dev}…")

    def _sync_device_choice(self):
        """The combo box and the overview name the device shown (after a cancel or a failure
        too: a click checks its button before the device is ready)."""
        dev = self.data.device if self.data is not None else None
        k = self.device_combo.findData(dev) if dev is not None else -1
        if k >= 0:
            self.device_combo.setCurrentIndex(k)
        self.device_strip.set_current(dev)

    def dragEnterEvent(self, ev):
        if ev.mimeData().hasUrls() and any(u.isLocalFile() for u in ev.mimeData().urls()):
            ev.acceptProposedAction()

    def dropEvent(self, ev):
        for u in ev.mimeData().urls():
            if u.isLocalFile():
                self.open_path(u.toLocalFile())
                ev.acceptProposedAction()
                return
