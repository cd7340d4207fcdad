"""The main window's File > Export actions: the report (Markdown, PNG, JSON), a trimmed
snapshot, a Perfetto trace; each runs through the services and says where it wrote."""
from __future__ import annotations

import os
import sys
import traceback

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMessageBox

from ...common.units import fmt_bytes
from ...present.words import error_text
from . import dialogs

TRIM_WINDOW = 2000        # entries around the peak in a trimmed export (as `vramscope export --around-peak`)
# what the store's undo/redo commands do, for the Edit menu's "Undo Add Note"



class ExportsMixin:
    """Mixed into MainWindow (viewer/window.py)."""

    # -- exports ------------------------------------------------------------------------------------------
    def export_image(self):
        start = self.settings.value("last_dir", "") if self.settings is not None else ""
        base = os.path.splitext(os.path.basename(self.path or "vramscope"))[0]
        path, _ = QFileDialog.getSaveFileName(self, "Save image", os.path.join(start or "", base + ".png"),
                                              "PNG images (*.png)")
        if path:
            self.grab().save(path, "PNG")

    def _export_start(self) -> str:
        if self.path:
            return os.path.dirname(self.path)
        return self.settings.value("last_dir", "") if self.settings is not None else ""

    def _base_name(self) -> str:
        return os.path.splitext(os.path.basename(self.path or "vramscope"))[0]

    def _run_export(self, what: str, fn):
        """Run an export on the GUI thread (the PNG needs Qt) under a busy cursor;
        errors become a message box."""
        self.statusBar().showMessage(f"Writing the {what}…")
        self.statusBar().repaint()
        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            return fn()
        except Exception as e:
            if not isinstance(e, (OSError, ValueError)):
                traceback.print_exc(file=sys.stderr)
            self.statusBar().showMessage(f"Could not write the {what}", 5000)
            self._show_error(f"Cannot export the {what}", _one_line(e))
            return None
        finally:
            QApplication.restoreOverrideCursor()

    def _show_error(self, title: str, msg: str):
        self._close_error()
        box = QMessageBox(QMessageBox.Icon.Warning, title, msg, QMessageBox.StandardButton.Ok, self)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.open()
        self.error_box = box

    def export_report(self):
        """report.md + timeline.png (notes drawn) + analysis.json into a folder, like `vramscope report`."""
        if self.result is None:
            return
        out = dialogs.ask_report_folder(self, self._export_start(), f"{self._base_name()}-report")
        if not out:
            return
        if os.path.exists(out) and not os.path.isdir(out):
            self._show_error("Cannot export the report", f"{out} is a file, not a folder")
            return
        from ...services.report import write_report
        from ..report_png import render_timeline
        notes = list(self.store) if self.store is not None else None     # None: the report reads the sidecar
        paths = self._run_export("report", lambda: write_report(self.result.analysis, out, annotations=notes,
                                                                render_png=render_timeline))
        if paths:
            self.statusBar().showMessage(
                f"Report written to {out}: " + ", ".join(os.path.basename(p) for p in paths), 15000)

    def _save_path(self, title: str, suggested: str, filt: str, ext: str) -> str | None:
        path, _ = QFileDialog.getSaveFileName(self, title, os.path.join(self._export_start(), suggested), filt)
        if not path:
            return None
        return path if os.path.splitext(path)[1] else path + ext

    def export_trimmed(self):
        """A window of the shown device's trace as a snapshot pickle: the marked range,
        the visible range (when zoomed in) or the entries around the peak."""
        d = self.data
        if self.result is None or d is None or d.n == 0:
            return
        from ...services.export import export_trimmed, window_around
        choices = []
        marked = self.timeline.marked_range()
        if marked is not None and (span := self._entries_in(*marked)) is not None:
            choices.append((f"The marked range: entries {span[0]:,}–{span[1]:,}", span))
        span = self._entries_in(*self.timeline.x_span())
        if span is not None and span[1] - span[0] + 1 < d.n:
            choices.append((f"The visible range: entries {span[0]:,}–{span[1]:,}", span))
        s, e = window_around(d.n, max(d.peak_index, 0), TRIM_WINDOW)
        choices.append((f"{e - s + 1:,} entries around the peak: entries {s:,}–{e:,}", (s, e)))
        if len(choices) > 1:
            item, ok = QInputDialog.getItem(self, "Export trimmed snapshot", f"Which entries of cuda:{d.device}:",
                                            [c[0] for c in choices], 0, False)
            if not ok:
                return
            span = next((c[1] for c in choices if c[0] == item), choices[0][1])
        else:
            span = choices[0][1]
        path = self._save_path("Export trimmed snapshot", f"{self._base_name()}.trimmed.pickle",
                               "Memory snapshots (*.pickle)", ".pickle")
        if not path:
            return
        snap = self.result.snapshot
        info = self._run_export("trimmed snapshot",
                                lambda: export_trimmed(snap, path, device=d.device, start=span[0], end=span[1]))
        if info:
            self.statusBar().showMessage(
                f"Wrote entries {info['start']:,}–{info['end']:,} of cuda:{info['device']} to {path} "
                f"({fmt_bytes(info['bytes'])})", 15000)

    def export_perfetto(self):
        """Live bytes per category as Perfetto counter tracks, every device."""
        if self.result is None:
            return
        from ...services.export import export_perfetto
        path = self._save_path("Export Perfetto trace", f"{self._base_name()}.perfetto.json",
                               "Chrome trace JSON (*.json)", ".json")
        if not path:
            return
        info = self._run_export("Perfetto trace", lambda: export_perfetto(self.result.analysis, path))
        if info:
            self.statusBar().showMessage(
                f"Wrote {info['counter_events']:,} counter events to {path}: open it in ui.perfetto.dev", 15000)


def _one_line(e: BaseException) -> str:
    """An exception for a message box: expected failures as they are, others marked."""
    text = error_text(e)
    return text if isinstance(e, (OSError, ValueError)) else f"unexpected error ({type(e).__name__}: {text})"
