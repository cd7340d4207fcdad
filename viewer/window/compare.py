"""The main window's comparison (issue 15): File > Compare With… loads a second snapshot on
the loader's worker (progress and Cancel as for an open), compares it with the file shown
as `vramscope compare` does, and fills the Compare panel (viewer/compare_panel.py); Swap
makes B the file the timeline shows. Files the command line refuses to compare (no device
in common, not a snapshot, empty) get its one line in a message box. Mixed into MainWindow
(viewer/window.py)."""
from __future__ import annotations

import os

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from ...classifiers.compare import naming_stacks
from ...present.words import site_rows_text
from ..model.compare import CompareResult
from ..model.load import load_compare, swap_compare
from .loading import FILE_FILTER


class CompareMixin:
    """Mixed into MainWindow (viewer/window.py)."""

    compare: CompareResult | None = None

    def _build_compare_actions(self, fm):
        """File > Compare With…, Swap A and B, Close Comparison."""
        self.act_compare = self._act(
            fm, "Compare &With…", self.compare_dialog, (),
            "Open a second snapshot of the same run (B) and compare it with this one (A): both totals on one "
            "axis, the categories at both peaks, the code sites with their change")
        self.act_swap = self._act(fm, "S&wap A and B", self.swap_compared, (),
                                  "Show the compared file (B) in the timeline and compare the other way round")
        self.act_close_compare = self._act(fm, "C&lose Comparison", self.close_compare, ())
        self.act_swap.setEnabled(False)
        self.act_close_compare.setEnabled(False)

    def compare_dialog(self):
        start = os.path.dirname(self.path) if self.path else ""
        path, _ = QFileDialog.getOpenFileName(self, "Compare with another snapshot (B)", start, FILE_FILTER)
        if path:
            self.compare_with(path)

    def compare_with(self, path: str):
        """Load `path` as B in the background and compare the file shown (A) with it."""
        if self.result is None or self.data is None:
            return
        a, path, use_cache = self.result, os.path.abspath(path), self.use_cache
        self._close_error()
        self._pending_what = "compare"
        self.loader.submit(lambda progress: load_compare(a, path, use_cache, progress))
        self._show_progress(f"Comparing with {os.path.basename(path)}…")
        self.statusBar().showMessage(f"Opening {path} to compare…")

    def swap_compared(self):
        """B becomes the file shown (and A the one compared with it)."""
        cr = self.compare
        if cr is None:
            return
        dev = self.data.device if self.data is not None else None
        self._close_error()
        self._pending_what = "compare"
        self.loader.submit(lambda progress: swap_compare(cr, dev, progress))
        self._show_progress(f"Showing {os.path.basename(cr.b.path)}…")

    def apply_compare(self, cr: CompareResult):
        """Show a comparison (GUI thread); after a swap the timeline shows the new A."""
        self.compare = cr
        if self.result is not cr.a:
            self.apply_result(cr.a)
        dev = self.data.device if self.data is not None else None
        self.compare_panel.set_result(cr, dev)
        self.act_swap.setEnabled(True)
        self.act_close_compare.setEnabled(True)
        dock = self.docks["compare"]
        shown = dock.isVisible()
        dock.show()
        dock.raise_()
        if not shown:
            # room for the totals, the categories and the sites: about half the window
            self.resizeDocks([dock], [max(300, int(self.height() * 0.5))], Qt.Orientation.Vertical)
        self.statusBar().showMessage(
            f"A: {os.path.basename(cr.a.path)} (the timeline) · B: {os.path.basename(cr.b.path)}", 10000)
        self.compared.emit()

    def close_compare(self):
        self.compare = None
        self.compare_panel.set_result(None, None)
        self.act_swap.setEnabled(False)
        self.act_close_compare.setEnabled(False)
        self.docks["compare"].hide()

    def _compare_follows(self, result):
        """A new result in the window: the comparison follows a device switch of A and goes
        with another file."""
        cr = self.compare
        if cr is None:
            return
        if result.analysis is not cr.a.analysis:
            self.close_compare()
            return
        cr.a = result
        if self.compare_panel.result is cr:
            self.compare_panel.show_device(result.device)

    def _on_compare_site(self, k: int):
        """A site of the comparison: its allocations live at A's peak, in the table."""
        cr, d = self.compare, self.data
        if cr is None or d is None:
            return
        dc, doc = cr.device(d.device)
        if dc is None or not (0 <= k < len(dc.sites)):
            return
        site, where = dc.sites[k], doc["sites"][k]["where"]
        peak = dc.a.peak.index
        rows = np.flatnonzero(d.da.live_mask(peak))
        rows = rows[np.isin(naming_stacks(d.da, rows), np.asarray(site.a_stacks, dtype=np.int64))]
        if not len(rows):
            self.statusBar().showMessage(f"{where}: nothing of it was live at A's peak", 6000)
            return
        self.table_panel.show_only(rows, site_rows_text(len(rows), where, "A's peak"))
        self.timeline.set_row_marks(rows)
        self.docks["allocations"].show()
        self.docks["allocations"].raise_()
        self.statusBar().showMessage("The Compare tab (beside Allocations) goes back to the comparison", 8000)
        self.timeline.set_cursor_index(peak)
        self.pinned_index = peak
        self.moment_panel.show_index(peak)
