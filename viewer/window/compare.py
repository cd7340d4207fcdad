"""The window's comparison (issue 15): File > Compare With… loads a second snapshot on the
loading worker (progress and Cancel as for an open), compares it with the file shown as
`vramscope compare` does, and fills the Compare panel (panels/compare.py); Swap makes B the
file the timeline shows. Files the command line refuses to compare (no device in common,
not a snapshot, empty) get its one line in a message box."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from ...classifiers.compare import naming_stacks
from ...present.stacks import site_where
from ...present.words import site_rows_text
from ..model.compare import CompareResult
from ..model.load import LoadResult, load_compare, swap_compare
from .loading import FILE_FILTER

if TYPE_CHECKING:
    from .main import MainWindow


class Compare:
    """The comparison shown, if any (`result`), and what the window does with it."""

    def __init__(self, window: MainWindow):
        self.win = window
        self.result: CompareResult | None = None

    def dialog(self):
        w = self.win
        start = os.path.dirname(w.path) if w.path else ""
        path, _ = QFileDialog.getOpenFileName(w, "Compare with another snapshot (B)", start, FILE_FILTER)
        if path:
            self.with_file(path)

    def with_file(self, path: str, across_devices: bool = False):
        """Load `path` as B in the background and compare the file shown (A) with it (with
        `across_devices`: A's device against B's, whatever their numbers: two ranks)."""
        w = self.win
        if w.result is None or w.data is None:
            return
        a, path, use_cache = w.result, os.path.abspath(path), w.use_cache
        w.loading.submit("compare", lambda progress: load_compare(a, path, use_cache, progress, across_devices),
                         f"Comparing with {self.name(path)}…")
        w.statusBar().showMessage(f"Opening {path} to compare…")

    def name(self, path: str) -> str:
        """A side in words: 'rank 3' for a rank of the folder read, else the file's name."""
        return self.win.ranks.rank_name(path) or os.path.basename(path)

    def swap(self):
        """B becomes the file shown (and A the one compared with it)."""
        w, cr = self.win, self.result
        if cr is None:
            return
        dev = w.data.device if w.data is not None else None
        w.loading.submit("compare", lambda progress: swap_compare(cr, dev, progress),
                         f"Showing {self.name(cr.b.path)}…")

    def apply(self, cr: CompareResult):
        """Show a comparison (GUI thread); after a swap the timeline shows the new A."""
        w = self.win
        self.result = cr
        if w.result is not cr.a:
            w.apply_result(cr.a)
        dev = w.data.device if w.data is not None else None
        w.compare_panel.set_result(cr, dev, w.ranks.rank_name)
        w.act_swap.setEnabled(True)
        w.act_close_compare.setEnabled(True)
        dock = w.docks["compare"]
        shown = dock.isVisible()
        dock.show()
        dock.raise_()
        if not shown:
            # room for the totals, the categories and the sites: about half the window
            w.resizeDocks([dock], [max(300, int(w.height() * 0.5))], Qt.Orientation.Vertical)
        w.statusBar().showMessage(f"A: {self.name(cr.a.path)} (the timeline) · B: {self.name(cr.b.path)}", 10000)
        w.compared.emit()

    def close(self):
        w = self.win
        self.result = None
        w.compare_panel.set_result(None, None)
        w.act_swap.setEnabled(False)
        w.act_close_compare.setEnabled(False)
        w.docks["compare"].hide()

    def follow(self, result: LoadResult):
        """A new result in the window: the comparison follows a device switch of A and goes
        with another file."""
        cr = self.result
        if cr is None:
            return
        if result.analysis is not cr.a.analysis:
            self.close()
            return
        cr.a = result
        if self.win.compare_panel.result is cr:
            self.win.compare_panel.show_device(result.device)

    def on_site(self, k: int):
        """A site of the comparison: its allocations live at A's peak, in the table."""
        w, cr, d = self.win, self.result, self.win.data
        if cr is None or d is None:
            return
        dc = cr.device(d.device)
        if dc is None or not (0 <= k < len(dc.sites)):
            return
        site = dc.sites[k]
        where = site_where(site.file, site.function)
        peak = dc.a.peak.index
        rows = np.flatnonzero(d.da.live_mask(peak))
        rows = rows[np.isin(naming_stacks(d.da, rows), np.asarray(site.a_stacks, dtype=np.int64))]
        if not len(rows):
            w.statusBar().showMessage(f"{where}: nothing of it was live at A's peak", 6000)
            return
        w.table_panel.show_only(rows, site_rows_text(len(rows), where, "A's peak"))
        w.timeline.set_row_marks(rows)
        w.docks["allocations"].show()
        w.docks["allocations"].raise_()
        w.statusBar().showMessage("The Compare tab (beside Allocations) goes back to the comparison", 8000)
        w.timeline.set_cursor_index(peak)
        w.pin(peak)


__all__ = ["Compare"]
