"""Opening files in a real window: Open Recent tells same names apart, a step without progress
shows a busy bar, an empty snapshot says so, a state-only one gets its axis (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from helpers import REPO, SHARED  # noqa: E402
from viewer_helpers import open_and_wait  # noqa: E402

EXAMPLE = str(REPO / "assets" / "example.pickle")


def test_open_recent_tells_same_names_apart(qt, tmp_path):
    import shutil
    from PySide6.QtCore import QSettings
    from vramscope.viewer.app import make_app
    from vramscope.viewer.window import MainWindow
    make_app()
    paths = []
    for run in ("run_a", "run_b"):
        (tmp_path / run).mkdir()
        p = tmp_path / run / "memory.pickle"
        shutil.copyfile(EXAMPLE, p)
        paths.append(str(p))
    settings = QSettings(str(tmp_path / "vramscope.ini"), QSettings.Format.IniFormat)
    settings.setValue("recent", paths)
    w = MainWindow(settings=settings, use_cache=False)
    qt.addWidget(w)
    w.show()
    w.recent_menu.aboutToShow.emit()
    texts = [a.text() for a in w.recent_menu.actions() if a.isEnabled() and a.toolTip() in paths]
    assert len(texts) == 2 and texts[0] != texts[1]
    assert "run_a" in texts[0] and "run_b" in texts[1] and all(t.startswith("memory.pickle") for t in texts)


def test_a_step_without_progress_shows_a_busy_bar(qt, window):
    window.loading.progress.show("Opening x.pickle…")
    dlg = window.loading.progress.dialog
    window.loading.progress.on_progress("analyzing", 0.0, 1.0)
    assert dlg.maximum() == 0 and "Analyzing" in dlg.labelText()          # busy, not "0%"
    window.loading.progress.on_progress("timeline", 0.5, 1.0)
    assert dlg.maximum() == 1000 and dlg.value() == 499
    window.loading.progress.hide()


def test_empty_snapshot_says_so_without_stray_panels(qt, window):
    path = SHARED / "SunnySood80+unsupervised_finetune_resnet50__dump_snapshot.pickle"
    if not path.exists():
        pytest.skip("no empty snapshot here")
    from PySide6.QtWidgets import QTabBar
    open_and_wait(qt, window, EXAMPLE)
    assert window.docks["allocations"].isVisible()
    open_and_wait(qt, window, str(path))
    assert window.data is None and window.stack.currentWidget() is window.empty_page
    assert path.name in window.empty_msg.text() and "no memory" in window.empty_msg.text()
    assert not any(dock.isVisible() for dock in window.docks.values())
    qt.wait(20)
    assert not any(b.isVisible() and b.count() and window.rect().intersects(b.geometry())
                   for b in window.findChildren(QTabBar) if b.parent() is window)
    # a file with data brings the panels back
    open_and_wait(qt, window, EXAMPLE)
    assert window.docks["allocations"].isVisible() and window.docks["findings"].isVisible()


def test_state_only_snapshot_axis_and_lifetimes(qt, window):
    path = SHARED / "volcengine+verl__mem.pickle"
    if not path.exists():
        pytest.skip("no state-only snapshot here")
    from vramscope.viewer.model.rows import COL_LIFETIME
    d = open_and_wait(qt, window, str(path))
    assert d.n == 0
    ax = window.timeline.axis_x
    assert ax.tickSpacing(0, 1, 800) == [] and "no trace" in ax.labelText
    m = window.table_panel.model
    assert m.data(m.index(0, COL_LIFETIME)) == "at the snapshot"
    assert window.timeline.peak_label.fill.color().alpha() > 150        # readable over the reserved line


def test_a_file_shown_collects_the_one_it_replaced(qt, window, monkeypatch):
    """The command line and the viewer run the cyclic collector rarely (common/memory.py
    fewer_collections): once a file is shown the window collects (the cycles of the file it
    replaced), then hands the heap's free pages back, in that order. The first file replaced
    none: its pages alone are handed back."""
    from vramscope.common import memory
    calls = []
    monkeypatch.setattr(memory, "collect_garbage", lambda: calls.append("collect") or 0)
    monkeypatch.setattr(memory, "give_back_freed_pages", lambda: calls.append("pages") or True)
    open_and_wait(qt, window, EXAMPLE)
    qt.waitUntil(lambda: len(calls) >= 1, timeout=5000)
    open_and_wait(qt, window, EXAMPLE)
    qt.waitUntil(lambda: len(calls) >= 3, timeout=5000)
    qt.wait(50)
    assert calls == ["pages", "collect", "pages"]
