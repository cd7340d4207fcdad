"""The window's files: open, reload, another device, drag and drop, Open Recent, and the
progress dialog with Cancel while the worker opens, analyzes and models a file
(model/load.py). The comparison (window/compare.py) loads its second file through the
same worker: one file operation at a time."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

from ...parsers import Progress
from ..model.compare import CompareResult
from ..model.load import load, switch_device
from ..model.notes import home_short
from ..ranks_part import RanksLoad
from ..worker import Worker
from .progress import ProgressDialog

if TYPE_CHECKING:
    from .main import MainWindow

FILE_FILTER = "Memory snapshots (*.pickle *.pkl *.pck *.p);;All files (*)"
MAX_RECENT = 10


def recent_labels(paths: list[str], width: int = 60) -> list[str]:
    """Menu texts for recent files: the name, then its folder (two runs' `memory.pickle`
    are told apart), the folder shortened in the middle."""
    out = []
    for p in paths:
        folder = home_short(os.path.dirname(p))
        if len(folder) > width:
            folder = folder[:width // 3] + "…" + folder[-(width - width // 3 - 1):]
        out.append(f"{os.path.basename(p)}    {folder}")
    return out


class Loading:
    """Loads files for the window on its worker; the window applies the result."""

    def __init__(self, window: MainWindow):
        self.win = window
        self.worker = Worker(window)
        self.progress = ProgressDialog(window, self.worker)
        self.pending = "open"                 # what the worker is doing: "open" or "compare"
        self.begun = None                     # a reading begun before the window, followed by the worker
        self.worker.finished.connect(self._on_loaded)
        self.worker.failed.connect(self._on_failed)
        self.worker.cancelled.connect(self._on_cancelled)

    # -- requests --------------------------------------------------------------------------
    def open_dialog(self):
        w = self.win
        start = w.settings.value("last_dir", "") if w.settings is not None else ""
        path, _ = QFileDialog.getOpenFileName(w, "Open memory snapshot", start or "", FILE_FILTER)
        if path:
            self.open_path(path)

    def open_path(self, path: str, device: int | None = None):
        """Load in the background (a newer request replaces an older one)."""
        path = os.path.abspath(path)
        if os.path.isdir(path):              # a folder of per-rank snapshots: the Ranks panel
            return self.win.ranks.open_folder(path)
        use_cache = self.win.use_cache
        self.submit("open", lambda progress: load(path, device, use_cache, progress),
                    f"Opening {os.path.basename(path)}…")
        self.win.statusBar().showMessage(f"Opening {path}…")

    def open_begun(self, begun):
        """`open_path` for a file whose reading began before the window (model/load.py Begun):
        the worker follows it, with this window's progress and Cancel."""
        self.submit("open", begun.follow, f"Opening {os.path.basename(begun.path)}…")
        self.begun = begun
        self.win.statusBar().showMessage(f"Opening {begun.path}…")

    def _let_go_begun(self):
        """A reading begun before the window, no longer wanted (cancelled, replaced, the window
        closed): stopped, even where the worker was cancelled before it began to follow it."""
        begun, self.begun = self.begun, None
        if begun is not None and not begun.done():
            begun.cancel()

    def submit(self, what: str, fn: Callable[[Progress], object], label: str):
        """Run a load ("open") or a comparison ("compare") on the worker, with progress."""
        self._let_go_begun()
        self.win.close_error()
        self.pending = what
        self.worker.submit(fn)
        self.progress.show(label)

    def reload(self):
        w = self.win
        if w.path:
            self.open_path(w.path, w.data.device if w.data is not None else None)

    def show_device(self, dev: int):
        """Show another device of the open snapshot (the toolbar's combo box and the device
        overview both come here), modelled off the GUI thread."""
        w = self.win
        result = w.result
        if result is None or dev not in result.analysis.devices or (w.data is not None and dev == w.data.device):
            self.sync_device_choice()
            return
        self.submit("open", lambda progress: switch_device(result, dev, progress), f"Preparing cuda:{dev}…")

    def on_device_chosen(self, idx: int):
        dev = self.win.device_combo.itemData(idx)
        if dev is not None:
            self.show_device(int(dev))

    def sync_device_choice(self):
        """The combo box and the overview name the device shown (after a cancel or a failure
        too: a click checks its button before the device is ready)."""
        w = self.win
        dev = w.data.device if w.data is not None else None
        k = w.device_combo.findData(dev) if dev is not None else -1
        if k >= 0:
            w.device_combo.setCurrentIndex(k)
        w.device_strip.set_current(dev)

    # -- outcomes ------------------------------------------------------------------------------
    def _on_loaded(self, result):
        self.begun = None
        self.progress.hide()
        self.win.statusBar().clearMessage()
        if isinstance(result, CompareResult):
            self.win.compare.apply(result)
        elif isinstance(result, RanksLoad):
            self.win.ranks.apply(result)
        else:
            self.win.apply_result(result)

    def _on_failed(self, msg: str):
        self._let_go_begun()
        self.progress.hide()
        self.sync_device_choice()
        comparing = self.pending == "compare"
        self.win.statusBar().showMessage("Could not compare" if comparing else "Could not open the snapshot", 5000)
        title = "Cannot compare" if comparing else "Cannot open snapshot"
        if comparing:
            msg = f"The two files cannot be compared.\n\n{msg}"
        self.win.show_error(title, msg)

    def _on_cancelled(self):
        self._let_go_begun()
        self.progress.hide()
        self.sync_device_choice()
        self.win.statusBar().showMessage("Loading cancelled", 5000)

    def shutdown(self):
        self._let_go_begun()
        self.worker.shutdown()
        self.progress.hide()

    # -- drag and drop ------------------------------------------------------------------------
    @staticmethod
    def accepts(mime) -> bool:
        return mime.hasUrls() and any(u.isLocalFile() for u in mime.urls())

    def drop(self, mime) -> bool:
        for u in mime.urls():
            if u.isLocalFile():
                self.open_path(u.toLocalFile())
                return True
        return False

    # -- Open Recent ---------------------------------------------------------------------------
    def recent_files(self) -> list[str]:
        settings = self.win.settings
        if settings is None:
            return []
        v = settings.value("recent", [])
        if isinstance(v, str):
            v = [v]
        return [p for p in v if isinstance(p, str)] if isinstance(v, list) else []

    def add_recent(self, path: str):
        settings = self.win.settings
        if settings is None:
            return
        rec = [path] + [p for p in self.recent_files() if p != path]
        settings.setValue("recent", rec[:MAX_RECENT])
        settings.setValue("last_dir", os.path.dirname(path))

    def fill_recent(self):
        menu = self.win.recent_menu
        menu.clear()
        rec = self.recent_files()
        if not rec:
            a = menu.addAction("(none)")
            a.setEnabled(False)
            return
        menu.setToolTipsVisible(True)
        for p, label in zip(rec, recent_labels(rec)):
            a = menu.addAction(label, lambda p=p: self.open_path(p))
            a.setToolTip(p)
            a.setEnabled(os.path.exists(p))
        menu.addSeparator()
        settings = self.win.settings
        menu.addAction("Clear", lambda: settings.setValue("recent", []) if settings is not None else None)


def error_box(parent, title: str, msg: str) -> QMessageBox:
    """A warning whose text can be selected (and copied into a bug report), shown window-modal."""
    box = QMessageBox(QMessageBox.Icon.Warning, title, msg, QMessageBox.StandardButton.Ok, parent)
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    box.open()
    return box


__all__ = ["Loading", "FILE_FILTER", "recent_labels", "error_box"]
