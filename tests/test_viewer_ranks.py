"""The rank overview in the viewer (issue 23): File > Open Folder… reads every rank off the GUI
thread and shows what `vramscope ranks` says; a click on a rank opens it, Compare sets two
side by side in the Compare panel."""
from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtWidgets import QFileDialog  # noqa: E402

import ranks_data as rd  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, new_window  # noqa: E402
from vramscope.cli import main  # noqa: E402
from vramscope.common.units import fmt_bytes  # noqa: E402
from vramscope.services.ranks import live_grid, read_ranks  # noqa: E402


@pytest.fixture(scope="module")
def titan(tmp_path_factory):
    return rd.torchtitan_folder(tmp_path_factory.mktemp("run"))


@pytest.fixture
def window(qt, monkeypatch, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    return new_window(qt)


def open_folder(qt, w, monkeypatch, folder):
    """File > Open Folder…: the overview, then the rank to look at first in the timeline."""
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(folder)))
    assert w.act_open_folder in w.menuBar().actions()[0].menu().actions()
    with qt.waitSignal(w.loaded, timeout=LOAD_TIMEOUT):
        w.act_open_folder.trigger()
    qt.wait(1)


def row_point(view, row: int) -> QPoint:
    g = view.heatmap.grid
    return view.heatmap.pos_of(row, g.x0 + 0.3 * (g.x1 - g.x0))


def test_open_folder_shows_the_overview_and_opens_the_first_oom(qt, window, monkeypatch, titan):
    open_folder(qt, window, monkeypatch, titan)
    view = window.ranks.view
    res = read_ranks(str(titan), jobs=1)
    exit_file = titan / "step_4_exit" / "000003_step_4_exit.pickle"
    # the first OOM's rank is opened, and outlined as the one shown
    assert window.path == str(exit_file) and view.current == 3
    assert window.ranks.dock.isVisible() and not window.ranks.dock.visibleRegion().isEmpty()
    assert window.loading.progress.dialog is None and not multiprocessing.active_children()
    # the list is the command line's
    rows = [[view.table.topLevelItem(k).text(c) for c in range(3)] for k in range(view.table.topLevelItemCount())]
    assert rows == [[str(r.rank), fmt_bytes(r.peak_bytes), "; ".join(
        {3: ["first OOM", "failure dump"], 5: ["outlier (+24.1%)"]}.get(r.rank, []))] for r in res.ranks]
    head = view.header.text()
    assert "8 ranks" in head and "first OOM: rank 3" in head and "outlier: rank 5 (+24.1% over the median)" in head
    # the picture is the service's grid: every rank's row reaches its peak, the OOM where it was
    grid = view.heatmap.grid
    ref = live_grid(res, grid.values.shape[1])
    assert np.array_equal(grid.values, ref.values, equal_nan=True) and grid.ooms == ref.ooms
    assert [np.nanmax(grid.values[i]) for i in range(8)] == [r.peak_bytes for r in res.ranks]
    img = view.heatmap.image.image
    assert img.shape == grid.values.shape and np.nanmax(img) * view.heatmap.scale == max(r.peak_bytes for r in res.ranks)
    ticks = dict(view.heatmap.rank_axis._tickLevels[0])
    assert ticks[3.0] == "3 ✕" and ticks[5.0] == "5 ▲" and ticks[0.0] == "0"


def test_a_click_opens_a_rank_and_compare_sets_two_side_by_side(qt, window, monkeypatch, titan):
    open_folder(qt, window, monkeypatch, titan)
    view = window.ranks.view
    # hovering a row says which rank, where and how much
    qt.mouseMove(view.heatmap.plot.viewport(), row_point(view, 5))
    qt.wait(20)
    assert view.hint.text().startswith("rank 5 · ") and "live · click to open it" in view.hint.text()
    # a real click on rank 5's row opens its file
    heavy = str(titan / "step_4" / "000005_step_4.pickle")
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        qt.mouseClick(view.heatmap.plot.viewport(), Qt.MouseButton.LeftButton, pos=row_point(view, 5))
    qt.wait(1)
    assert window.path == heavy and view.current == 5 and view.chosen() == [5]
    assert window.data.da.peak.bytes == read_ranks(str(titan), jobs=1).rank(5).peak_bytes
    # Ctrl+click rank 1 in the list: two chosen, Compare sets rank 5 (shown, A) beside rank 1 (B)
    table = view.table
    item = next(table.topLevelItem(k) for k in range(table.topLevelItemCount()) if table.topLevelItem(k).text(0) == "1")
    qt.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.ControlModifier,
                  QPoint(20, table.visualItemRect(item).center().y()))
    assert view.chosen() == [1, 5] and view.compare_btn.isEnabled() and view.compare_btn.text() == "Compare 5 ↔ 1"
    with qt.waitSignal(window.compared, timeout=LOAD_TIMEOUT):
        qt.mouseClick(view.compare_btn, Qt.MouseButton.LeftButton)
    qt.wait(1)
    assert window.compare.result.a.path == heavy
    assert window.compare.result.b.path == str(titan / "step_4" / "000001_step_4.pickle")
    assert window.on_screen("compare")
    # two ranks are called so (issue 33: by their file names), the files in the tooltip
    files = window.compare_panel.files
    assert "<b>A</b> rank 5" in files.text() and "<b>B</b> rank 1" in files.text()
    assert "000001_step_4.pickle" in files.toolTip()
    # each rank on its own GPU: A's cuda:5 against B's cuda:1, said so
    (dc,) = window.compare.result.comparison.devices
    assert (dc.a.device, dc.b.device) == (5, 1) and dc.peak_delta == dc.b.peak.bytes - dc.a.peak.bytes < 0
    assert "A's device 5 against B's device 1 (no device in common)" in window.compare.result.notes()
    assert window.compare_panel.category_rows()["peak live"][:2] == (fmt_bytes(dc.a.peak.bytes),
                                                                    fmt_bytes(dc.b.peak.bytes))
    # Swap: rank 1 in the timeline, still against the other GPU
    with qt.waitSignal(window.compared, timeout=LOAD_TIMEOUT):
        window.act_swap.trigger()
    qt.wait(1)
    (dc,) = window.compare.result.comparison.devices
    assert window.path.endswith("000001_step_4.pickle") and (dc.a.device, dc.b.device) == (1, 5)
    assert view.current == 1
    # comparing two ranks neither of which is shown: A opens first, then B is compared with it
    view.select([2, 7])
    with qt.waitSignal(window.compared, timeout=LOAD_TIMEOUT):
        view.compare_btn.click()
    qt.wait(1)
    assert window.path.endswith("000002_step_4.pickle") and window.compare.result.b.path.endswith("000007_step_4.pickle")
    assert view.current == 2


def test_the_list_opens_with_enter(qt, window, monkeypatch, titan):
    open_folder(qt, window, monkeypatch, titan)
    view = window.ranks.view
    view.select([6])
    view.table.setFocus()
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        qt.keyClick(view.table, Qt.Key.Key_Return)
    qt.wait(1)
    assert view.current == 6 and window.path.endswith("000006_step_4.pickle")


def test_a_folder_without_snapshots_says_so(qt, window, tmp_path):
    d = tmp_path / "nothing"
    d.mkdir()
    (d / "a.txt").write_text("x")
    with qt.waitSignal(window.loading.worker.failed, timeout=LOAD_TIMEOUT):
        window.open_path(str(d))
    qt.wait(1)
    assert "no snapshot found in this folder (1 files could not be read; " in window.error_box.text()
    assert window.ranks.dock.isHidden()


def test_screenshot_of_a_folder(capsys, titan, tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "ranks.png"
    assert main(["view", str(titan), "--screenshot", str(out)]) == 0
    assert out.stat().st_size > 20_000
    empty = tmp_path / "empty"
    empty.mkdir()
    capsys.readouterr()
    assert main(["view", str(empty), "--screenshot", str(tmp_path / "e.png")]) == 3
    err = capsys.readouterr().err.strip()
    assert err.endswith("no snapshot found in this folder (it has no files)") and len(err.splitlines()) == 1
    assert os.path.isdir(empty) and not (tmp_path / "e.png").exists()


def test_cancel_while_reading_the_ranks(qt, window, titan):
    """Cancel in the progress dialog stops the reading (and its worker processes)."""
    with qt.waitSignal(window.loading.worker.cancelled, timeout=LOAD_TIMEOUT):
        window.open_path(str(titan))
        window.loading.worker.cancel()
    qt.wait(1)
    assert window.loading.progress.dialog is None and window.ranks.dock.isHidden() and window.path is None
    assert not multiprocessing.active_children()
