"""The rank overview in the main window (issue 23): File > Open Folder…, `vramscope view DIR`
or a folder dropped on the window reads every rank under it (services/ranks.py, in worker
processes, on the window's loader: progress and Cancel as for a file) and shows the
overview (viewer/ranks_view.py) as a panel under the timeline; the window then opens the
rank to look at first (the first OOM, else the highest peak). A click on a rank opens it;
Compare shows two ranks in the window's Compare panel (A in the timeline, B beside it).

A part the window owns (composition: `window.ranks = RanksPart(window)`), touching the
window only through `open_path`, `compare_with`, its loading part (worker and progress), the
`loaded` signal and `path`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QDockWidget, QFileDialog

from ..parsers import Progress, SnapshotError
from ..services.ranks import LiveGrid, RanksResult, live_grid, read_ranks
from .ranks_view import RanksView

GRID_COLUMNS = 1024


class NoRanks(SnapshotError):
    """A folder with no snapshot in it."""

    kind = "no snapshot"


@dataclass
class RanksLoad:
    """A folder read on the loader's worker, ready for the GUI thread."""
    result: RanksResult
    grid: LiveGrid


def load_folder(path: str, use_cache: bool = True, progress: Progress | None = None) -> RanksLoad:
    """Read the ranks under `path` (any thread). Raises NoRanks (a SnapshotError) when there
    is none, RanksError when the folder is not one, Cancelled."""
    res = read_ranks(path, use_cache=use_cache, progress=progress)
    if not res.ranks:
        unread = res.internal_errors + res.not_snapshots
        why = f"; {unread[0].file}: {unread[0].error}" if unread else ""
        raise NoRanks(f"no snapshot found in this folder ({len(unread)} files could not be read{why})"
                      if unread else "no snapshot found in this folder (it has no files)", path)
    return RanksLoad(res, live_grid(res, GRID_COLUMNS))


class RanksPart(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.result: RanksResult | None = None
        self.view: RanksView | None = None   # made with the first folder (the window starts faster)
        self.dock = QDockWidget("Ranks", window)
        self.dock.setObjectName("dock_ranks")
        window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.dock)
        window.tabifyDockWidget(window.docks["compare"], self.dock)
        self.dock.hide()                     # until a folder is opened
        window.loaded.connect(self._on_window_loaded)
        self._compare_after_open: str | None = None
        self._raise_after_open = False

    # -- opening -------------------------------------------------------------------------------
    def open_dialog(self):
        w = self.window
        start = w.settings.value("last_dir", "") if w.settings is not None else ""
        path = QFileDialog.getExistingDirectory(w, "Open a folder of per-rank snapshots", start or "")
        if path:
            self.open_folder(path)

    def open_folder(self, path: str):
        """Read the ranks under `path` on the window's loader (a newer request replaces it)."""
        w = self.window
        path, use_cache = os.path.abspath(path), w.use_cache
        w.loading.submit("open", lambda progress: load_folder(path, use_cache, progress),
                         f"Reading the ranks in {os.path.basename(path) or path}…")
        w.statusBar().showMessage(f"Reading the ranks in {path}…")

    def apply(self, load: RanksLoad, open_first: bool = True):
        """Show a folder's overview (GUI thread) and open the rank to look at first."""
        self.result = load.result
        if self.view is None:
            self.view = RanksView(self.window)
            self.view.rankOpened.connect(self.open_rank)
            self.view.compareRequested.connect(self.compare)
            self.dock.setWidget(self.view)
        self.view.set_result(load.result, load.grid)
        self._on_window_loaded()
        w = self.window
        shown = self.dock.isVisible()
        self.dock.show()
        self.dock.raise_()
        if not shown:
            w.resizeDocks([self.dock], [max(260, int(w.height() * 0.45))], Qt.Orientation.Vertical)
        first = load.result.primary()
        if open_first and first is not None:
            self._raise_after_open = True      # the window brings its own panels forward when a file opens
            w.open_path(first.file)

    # -- a rank, two ranks ---------------------------------------------------------------------
    def file_of(self, rank: int) -> str | None:
        r = self.result.rank(rank) if self.result is not None else None
        return r.file if r is not None else None

    def rank_name(self, path: str) -> str | None:
        """'rank 3' when `path` is a rank of the folder read (Compare calls two ranks so),
        None for any other file."""
        if self.result is None or not path:
            return None
        p = os.path.abspath(path)
        return next((f"rank {r.rank}" for r in self.result.ranks if os.path.abspath(r.file) == p), None)

    def open_rank(self, rank: int):
        path = self.file_of(rank)
        if path is not None and os.path.abspath(path) != os.path.abspath(self.window.path or ""):
            self._compare_after_open = None
            self.window.open_path(path)

    def compare(self, a: int, b: int):
        """Rank a in the timeline (opened first when another file is shown), rank b compared with it."""
        fa, fb = self.file_of(a), self.file_of(b)
        if fa is None or fb is None:
            return
        if os.path.abspath(fa) == os.path.abspath(self.window.path or "") and self.window.result is not None:
            self.window.compare_with(fb, across_devices=True)
        else:
            self.window.open_path(fa)
            self._compare_after_open = fb

    def _on_window_loaded(self):
        """The window shows another file: outline its rank; a comparison waiting for it goes on."""
        path = os.path.abspath(self.window.path) if self.window.path else None
        rank = next((r.rank for r in self.result.ranks if os.path.abspath(r.file) == path), None) \
            if self.result is not None and path else None
        if self.view is not None:
            self.view.set_current(rank)
        if self.result is None and not self.dock.isHidden():
            self.dock.hide()                 # no folder read: no empty Ranks tab
        if self._raise_after_open:
            self._raise_after_open = False
            self.dock.raise_()
        pending, self._compare_after_open = self._compare_after_open, None
        if pending is not None and rank is not None:
            self.window.compare_with(pending, across_devices=True)

    def release(self):
        if self.view is not None:
            self.view.release()
