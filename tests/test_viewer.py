"""The desktop viewer, driven like a user would (pytest-qt, offscreen)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QMimeData, QPoint, QPointF, QSettings, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QColor, QDropEvent, QImage, QPalette  # noqa: E402
from PySide6.QtWidgets import QPushButton  # noqa: E402

from test_viewer_model import write_snapshot  # noqa: E402
from helpers import require  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, new_window, open_and_wait  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "assets" / "example.pickle")
DATA = REPO / "tests" / "data"
SHARED = REPO.parent / "shared" / "snapshots"


@pytest.fixture
def window(qt):
    return new_window(qt)


def view_point(w, x, y) -> QPoint:
    """Viewport pixel of a data point on the main plot."""
    sp = w.timeline.vb.mapViewToScene(QPointF(x, y))
    return w.timeline.plot.mapFromScene(sp)


def test_open_file_shows_everything(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    assert d is not None and d.n == 3240
    assert window.stack.currentIndex() == 1
    assert "example.pickle" in window.windowTitle()
    assert window.table_panel.model.rowCount() == d.n_rows
    assert window.findings_panel.items, "the peak at least"
    assert "peak" in window.status_peak.text()
    env = window.timeline.last_env
    assert env is not None and env.live_y.max() == d.peak_bytes
    assert window.legend.buttons, "one toggle per category present"
    assert window.loading.progress.dialog is None


def test_jump_to_peak(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    window.timeline.set_x_range(0, 10)             # somewhere else
    assert window.act_peak.shortcut().toString() == "P"
    window.act_peak.trigger()
    peak = d.findings[0]
    x0, x1 = window.timeline.x_span()
    px = float(d.x_of_index(peak.index))
    assert x0 <= px <= x1 and (x1 - x0) < d.x_range[1] * 0.9   # zoomed onto it
    assert window.timeline.cursor_line.isVisible() and window.timeline.cursor_line.value() == px
    # what makes the peak: its largest live allocation (not the few bytes the entry allocated)
    live = np.flatnonzero((d.alloc_index <= peak.index) & ((d.free_index < 0) | (d.free_index > peak.index)))
    assert window.selected_row in live
    assert d.allocs.size[window.selected_row] == d.allocs.size[live].max()
    assert window.moment_panel.index == peak.index
    assert window.moment_panel.cats.topLevelItemCount() > 0


def test_select_allocation_shows_its_stack(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    window.act_peak.trigger()
    window.act_clear.trigger()
    assert window.selected_row == -1
    i = d.findings[0].index
    comp = d.composition([i])[0]
    vis = window.timeline.visible_categories
    top = vis[-1] if comp[vis[-1]] > 0 else max(vis, key=lambda c: comp[c])
    y = comp[vis].sum() - comp[top] * 0.5 if top == vis[-1] else comp[vis[:vis.index(top) + 1]].sum() - comp[top] / 2
    x = float(d.x_of_index(i)) + 1e-9               # the top band at the peak: what reached it
    qt.mouseClick(window.timeline.plot.viewport(), Qt.MouseButton.LeftButton, pos=view_point(window, x, y))
    qt.waitUntil(lambda: window.selected_row >= 0, timeout=3000)
    row = window.selected_row
    assert d.category[row] == top
    assert window.timeline.selection.isVisible()
    text = window.stack_panel.stack_text()
    frames = d.snap.stack_frames_list(int(d.allocs.stack[row]))
    assert frames and any(f[2].split(": ")[-1] in text for f in frames)
    assert d.rule_name(row) in window.stack_panel.header.text()
    assert window.table_panel.current_row() == row


def test_hover_shows_the_allocation(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    i = d.findings[0].index
    comp = d.composition([i])[0]
    vis = window.timeline.visible_categories
    pos = view_point(window, float(d.x_of_index(i)), comp[vis[0]] * 0.5)
    qt.mouseMove(window.timeline.plot.viewport(), pos)
    qt.waitUntil(lambda: window.timeline.hover_label.isVisible(), timeout=3000)
    html = window.timeline.hover_label.textItem.toHtml()
    assert d.categories[vis[0]] in html and "click to select" in html


def test_switching_mode_under_a_still_pointer_updates_the_hover_box(qt, window):
    d = open_and_wait(qt, window, str(REPO / "tests" / "data" / "oom.pickle"))
    assert d.segments.known
    i = d.peak_index
    comp = d.composition([i])[0]
    vis = window.timeline.visible_categories
    pos = view_point(window, float(d.x_of_index(i)), comp[vis[0]] * 0.5)
    qt.mouseMove(window.timeline.plot.viewport(), pos)
    qt.waitUntil(lambda: window.timeline.hover_label.isVisible(), timeout=3000)
    assert "click to select" in window.timeline.hover_label.textItem.toHtml()
    qt.keyClick(window.timeline.plot.viewport(), Qt.Key.Key_S)
    assert window.timeline.mode == "segments"
    html = window.timeline.hover_label.textItem.toHtml()
    assert "segment 0x" in html and "click to select" not in html


def test_filter_table(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    panel = window.table_panel
    window.act_filter.trigger()
    qt.keyClicks(panel.text, "ADAM.PY")               # case-insensitive, file names too
    panel.apply_filter()
    rows = panel.model.view.rows
    assert 0 < len(rows) < d.n_rows
    for r in rows[:30]:
        names = " ".join(f"{f[0]} {f[2]}".lower() for f in d.snap.stack_frames_list(int(d.allocs.stack[r])))
        assert "adam.py" in names
    assert panel.count.text().startswith(f"<b>filtered:</b> {len(rows):,} of")
    panel.text.clear()
    panel.min_size.setText("1 MiB")
    panel.apply_filter()
    assert np.all(d.allocs.size[panel.model.view.rows] >= 1 << 20)
    panel.min_size.clear()
    first = next(a for a in panel.cat_actions if a.isEnabled())
    first.setChecked(False)
    assert int(first.data()) not in set(d.category[panel.model.view.rows].tolist())
    assert panel.cat_button.text() != "Categories: all"
    panel.set_categories(None)
    assert panel.model.rowCount() == d.n_rows


def test_table_row_moves_the_timeline(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    panel = window.table_panel
    window.timeline.set_x_range(0, 5)
    idx = panel.model.index(3, 0)
    panel.table.setCurrentIndex(idx)
    row = panel.model.row_id(3)
    assert window.selected_row == row
    x = float(d.x_of_index(max(int(d.alloc_index[row]), 0)))
    x0, x1 = window.timeline.x_span()
    assert x0 <= x <= x1
    assert window.timeline.selection.isVisible()


def test_sort_table(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    from vramscope.viewer.model.rows import COL_ALLOC
    panel = window.table_panel
    panel.table.sortByColumn(COL_ALLOC, Qt.SortOrder.AscendingOrder)
    ai = d.alloc_index[panel.model.view.rows]
    assert np.all(np.diff(ai) >= 0)
    assert panel.model.data(panel.model.index(0, COL_ALLOC)) in ("before trace", "#0")


def test_toggle_category(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    tl = window.timeline
    before = tl.last_env.col_comp[:, tl.visible_categories].sum(axis=1).max()
    c, button = next(iter(window.legend.buttons.items()))
    qt.mouseClick(button, Qt.MouseButton.LeftButton)
    assert c not in tl.visible_categories
    qt.wait(5)
    after = tl.last_env.col_comp[:, tl.visible_categories].sum(axis=1).max()
    assert after < before
    qt.mouseClick(button, Qt.MouseButton.LeftButton)
    assert c in tl.visible_categories


def test_zoom_keys_and_findings(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    tl = window.timeline
    x0, x1 = tl.x_span()
    window.act_zoom_in.trigger()
    a, b = tl.x_span()
    assert b - a == pytest.approx((x1 - x0) / 2)
    window.act_zoom_out.trigger()
    window.act_zoom_out.trigger()
    window.act_reset.trigger()
    assert tl.x_span() == pytest.approx((x0, x1))
    # Home in the timeline only (a table takes it), Ctrl+0 anywhere (tests/test_viewer_keyboard.py)
    assert [s.toString() for s in window.act_reset.shortcuts()] == ["Home"]
    assert window.act_reset.property("anywhere_keys") == ["Ctrl+0"]
    n = len(d.findings)
    seen = []
    for _ in range(n + 1):
        window.act_next.trigger()
        seen.append(window.finding_pos)
    assert seen[:n] == list(range(n)) and seen[n] == 0
    window.act_prev.trigger()
    assert window.finding_pos == n - 1


def test_cancel_a_load(qt, window, tmp_path):
    big = write_snapshot(tmp_path / "big.pickle", 30_000, seed=3)
    cancelled = []

    def on_progress(*_):     # press Cancel in the progress dialog as soon as it reports
        if window.loading.progress.dialog is not None and not cancelled:
            cancelled.append(True)
            window.loading.progress.dialog.findChild(QPushButton).click()

    window.loading.worker.progressed.connect(on_progress)
    with qt.waitSignal(window.loading.worker.cancelled, timeout=LOAD_TIMEOUT):
        window.open_path(big)
    assert cancelled
    assert window.data is None and window.stack.currentIndex() == 0
    assert window.error_box is None and window.loading.progress.dialog is None
    assert not window.loading.worker.busy
    # the window still works afterwards
    assert open_and_wait(qt, window, EXAMPLE) is not None


def test_newer_request_wins(qt, window, tmp_path):
    big = write_snapshot(tmp_path / "big.pickle", 20_000, seed=4)
    loaded = []
    window.loaded.connect(lambda: loaded.append(window.path))
    window.open_path(big)
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        window.open_path(EXAMPLE)
    qt.wait(50)
    assert loaded == [os.path.abspath(EXAMPLE)]


def test_bad_file_shows_one_line(qt, window, tmp_path):
    bad = tmp_path / "garbage.pickle"
    bad.write_bytes(b"\x80\x04\x95 this is not a snapshot")
    window.open_path(str(bad))
    qt.waitUntil(lambda: window.error_box is not None, timeout=LOAD_TIMEOUT)
    text = window.error_box.text()
    assert str(bad) in text and "\n" not in text and "Traceback" not in text
    assert window.data is None and window.loading.progress.dialog is None


def test_screenshot(qt, tmp_path, capsys):
    from vramscope.viewer.app import run_viewer
    out = tmp_path / "shot.png"
    assert run_viewer(EXAMPLE, screenshot=str(out), use_cache=False) == 0
    img = QImage(str(out))
    assert (img.width(), img.height()) == (1400, 900)
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle at all")
    assert run_viewer(str(bad), screenshot=str(tmp_path / "no.png"), use_cache=False) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vramscope: ") and str(bad) in err[0]
    assert not (tmp_path / "no.png").exists()


def test_a_screenshot_is_written_whole_or_not_at_all(qt, tmp_path, capsys, monkeypatch):
    """The picture is encoded first, then written atomically: a write that fails says so (exit
    2) and leaves the file that was there as it was, no half-written PNG, no temporary file."""
    from vramscope.common import atomic
    from vramscope.viewer.app import run_viewer
    out = tmp_path / "shot.png"
    out.write_bytes(b"the user's own picture")

    def failing(fh):
        fh.write(b"half a PNG")
        raise OSError(28, "No space left on device")
    real = atomic.atomic_write
    monkeypatch.setattr(atomic, "atomic_write", lambda path, data, durable=True: real(path, failing, durable))
    import vramscope.viewer.pngfile as pngfile
    monkeypatch.setattr(pngfile, "atomic_write", atomic.atomic_write)
    assert run_viewer(EXAMPLE, screenshot=str(out), use_cache=False) == 2
    assert "cannot write" in capsys.readouterr().err
    assert out.read_bytes() == b"the user's own picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shot.png"]


def test_devices(qt, window):
    path = require(REPO / "tests" / "data" / "multi_device.pickle")
    d = open_and_wait(qt, window, str(path))
    combo = window.device_combo
    assert combo.count() >= 2 and combo.isEnabled()
    other = next(combo.itemData(k) for k in range(combo.count()) if combo.itemData(k) != d.device)
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        combo.activated.emit(combo.findData(other))
    assert window.data.device == other
    assert window.status_device.text() == f"cuda:{other}"


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/snapshots is not here")
def test_state_only_and_empty_snapshots(qt, window):
    d = open_and_wait(qt, window, str(SHARED / "volcengine+verl__mem.pickle"))
    assert d.n == 0 and window.stack.currentIndex() == 1
    assert window.moment_panel.strip.segs is not None and len(window.moment_panel.strip.segs.size) > 0
    window.act_peak.trigger()
    open_and_wait(qt, window, str(SHARED / "SunnySood80+unsupervised_finetune_resnet50__dump_snapshot.pickle"))
    assert window.data is None and window.stack.currentIndex() == 2          # the "records nothing" page


def test_recent_files_window_state_and_drop(qt, tmp_path):
    from vramscope.viewer.app import make_app
    from vramscope.viewer.window import MainWindow
    make_app()
    settings = QSettings(str(tmp_path / "vramscope.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings, use_cache=False)
    qt.addWidget(w)
    w.show()
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(EXAMPLE)])
    ev = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                    Qt.KeyboardModifier.NoModifier)
    with qt.waitSignal(w.loaded, timeout=LOAD_TIMEOUT):
        w.dropEvent(ev)
    assert w.loading.recent_files() == [os.path.abspath(EXAMPLE)]
    w.docks["findings"].hide()
    w.close()
    settings.sync()
    w2 = MainWindow(settings=QSettings(str(tmp_path / "vramscope.ini"), QSettings.Format.IniFormat))
    qt.addWidget(w2)
    assert w2.loading.recent_files() == [os.path.abspath(EXAMPLE)]
    assert w2.docks["findings"].isHidden()


def test_theme_follows_the_palette(qt, window):
    open_and_wait(qt, window, EXAMPLE)
    pal = QPalette(window.palette())
    pal.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    pal.setColor(QPalette.ColorRole.Text, QColor("#e0e0e0"))
    window.setPalette(pal)
    qt.waitUntil(lambda: window.theme.dark, timeout=2000)
    assert window.timeline.plot.backgroundBrush().color() == QColor("#1e1e1e")


def test_wheel_box_zoom_and_overview(qt, window):
    from PySide6.QtCore import QPoint, QRectF
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication
    d = open_and_wait(qt, window, EXAMPLE)
    tl = window.timeline
    x0, x1 = tl.x_span()
    vp = tl.plot.viewport()
    pos = view_point(window, (x0 + x1) / 2, d.peak_bytes / 2)
    ev = QWheelEvent(QPointF(pos), QPointF(vp.mapToGlobal(pos)), QPoint(0, 0), QPoint(0, 120),
                     Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(vp, ev)
    a, b = tl.x_span()
    assert b - a < (x1 - x0) * 0.9                  # the wheel zooms time...
    assert tl.vb.viewRange()[1][0] == 0             # ...and the bytes axis still starts at 0
    qt.wait(5)
    assert tl.last_env.x0 == pytest.approx(a)      # the envelope followed the view
    tl.vb.showAxRect(QRectF(10, 0, 100, d.peak_bytes / 4))   # what a box drag ends with
    assert tl.x_span() == pytest.approx((10, 110)) and not tl._auto_y
    window.act_reset.trigger()
    assert tl._auto_y and tl.x_span() == pytest.approx((x0, x1))
    tl.ov_region.setRegion((500, 1500))             # dragging the overview's region moves the view
    assert tl.x_span() == pytest.approx((500, 1500))


def test_keyboard_shortcuts_reach_the_window(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    window.activateWindow()
    window.timeline.plot.setFocus()
    qt.waitUntil(lambda: window.isActiveWindow(), timeout=2000)
    qt.keyClick(window.timeline.plot, Qt.Key.Key_P)
    assert window.finding_pos == 0 and window.selected_row >= 0
    qt.keyClick(window.timeline.plot, Qt.Key.Key_Escape)
    assert window.selected_row == -1
    a, b = window.timeline.x_span()
    qt.keyClick(window.timeline.plot, Qt.Key.Key_Right)
    a2, b2 = window.timeline.x_span()
    assert a2 > a and b2 - a2 == pytest.approx(b - a)
    qt.keyClick(window.timeline.plot, Qt.Key.Key_Home)
    assert window.timeline.x_span() == pytest.approx(d.x_range, abs=d.x_range[1] * 0.02)


def test_stack_of_a_block_from_before_the_trace_says_it_is_the_free_site(qt, window):
    """torch's traces record the stack of the free on free entries: a block allocated
    before recording and freed during it has only that one, and the panel says so."""
    d = open_and_wait(qt, window, str(DATA / "qlora_4bit.pickle"))
    a = d.allocs
    rows = np.flatnonzero((np.asarray(a.alloc_index) < 0) & (np.asarray(a.free_index) >= 0))
    assert len(rows) == 1
    window.select_row(int(rows[0]))
    assert window.stack_panel.stack_text().startswith("where it was freed (allocated before the trace began)")
    # an ordinary allocation has no such line
    window.select_row(int(np.flatnonzero(np.asarray(a.alloc_index) >= 0)[0]))
    assert "where it was freed" not in window.stack_panel.stack_text()


def test_a_snapshot_without_a_trace_says_its_blocks_predate_the_snapshot_not_a_trace(qt, window):
    """A state-only snapshot has no trace to begin: its blocks were made 'before the snapshot
    was taken' (the Selection, the table), and its peak falls where 'no allocation traced'
    (the status bar, the plot's label), not 'outside any pass the trace shows'."""
    from vramscope.viewer.panels.table import COL_ALLOC, COL_LIFETIME
    d = open_and_wait(qt, window, str(DATA / "state_only_noframes.pickle"))
    window.select_row(0)
    assert "allocated before the snapshot was taken" in window.stack_panel.header.text()
    model = window.table_panel.model
    assert model.data(model.index(0, COL_ALLOC), Qt.ItemDataRole.DisplayRole) == "before snapshot"
    assert model.data(model.index(0, COL_LIFETIME), Qt.ItemDataRole.DisplayRole) == "at the snapshot"
    assert window.status_peak.text().endswith(", no allocation traced")
    assert window.timeline.peak_label.toPlainText().endswith("· no allocation traced")
    assert d.state_only


def test_a_trace_without_an_allocation_is_a_snapshot_without_a_trace_too(qt, window, tmp_path):
    """A trace of one segment_free and no allocation (as CognitoBlocks' real snapshot) is
    state-only by the run's facts: its rows' lifetimes are 'at the snapshot', not '≥ 0 µs'."""
    import pickle
    from vramscope.viewer.panels.table import COL_ALLOC, COL_LIFETIME
    with open(DATA / "state_only_noframes.pickle", "rb") as f:
        snap = pickle.load(f)                       # (our own fixture)
    snap["device_traces"][0] = [{"action": "segment_free", "addr": 1 << 40, "size": 2 << 20, "stream": 0,
                                 "time_us": 1000, "frames": []}]
    path = tmp_path / "one_segment_free.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    d = open_and_wait(qt, window, str(path))
    assert d.n == 1 and d.state_only
    model = window.table_panel.model
    assert model.data(model.index(0, COL_ALLOC), Qt.ItemDataRole.DisplayRole) == "before snapshot"
    assert model.data(model.index(0, COL_LIFETIME), Qt.ItemDataRole.DisplayRole) == "at the snapshot"
