"""The viewer as a daily tool (issue 16): each problem a user hit in a real window, driven
through real input events where it is about input (pytest-qt, offscreen)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from viewer_helpers import new_window, open_and_wait  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "assets" / "example.pickle")
DATA = REPO / "tests" / "data"
GROUNDTRUTH = REPO / "tests" / "groundtruth"
SHARED = REPO.parent / "shared" / "snapshots"


@pytest.fixture
def window(qt):
    return new_window(qt)


def header_click(qt, table, column: int):
    """A real click on a column's header section."""
    hh = table.horizontalHeader()
    pos = QPoint(hh.sectionViewportPosition(column) + hh.sectionSize(column) // 2, hh.height() // 2)
    qt.mouseClick(hh.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def drag(widget, start: QPoint, end: QPoint, steps: int = 10, modifiers=Qt.KeyboardModifier.NoModifier,
         button=Qt.MouseButton.LeftButton):
    """A real press, moves (with the button held: QTest's mouseMove carries no buttons)
    and release on `widget`."""
    from PySide6.QtCore import QEvent
    from PySide6.QtGui import QMouseEvent

    def send(kind, pos, btn, buttons):
        p = QPointF(pos)
        QApplication.sendEvent(widget, QMouseEvent(kind, p, QPointF(widget.mapToGlobal(pos)), btn, buttons,
                                                   modifiers))
    send(QEvent.Type.MouseButtonPress, start, button, button)
    for k in range(1, steps + 1):
        send(QEvent.Type.MouseMove, start + (end - start) * (k / steps), Qt.MouseButton.NoButton, button)
    send(QEvent.Type.MouseButtonRelease, end, button, Qt.MouseButton.NoButton)


def focus_key(qt, w, widget, key, modifier=Qt.KeyboardModifier.NoModifier):
    w.activateWindow()
    widget.setFocus()
    qt.keyClick(widget, key, modifier)


# -- the allocations table ------------------------------------------------------------------------------
def test_sorting_keeps_the_highlight_on_the_selected_allocation(qt, window):
    from vramscope.viewer.model.rows import COL_ALLOC, COL_SIZE
    d = open_and_wait(qt, window, EXAMPLE)
    panel = window.table_panel
    focus_key(qt, window, window.timeline.plot, Qt.Key.Key_P)          # the peak's allocation
    row = window.selected_row
    assert row >= 0 and panel.current_row() == row
    for col in (COL_SIZE, COL_SIZE, COL_ALLOC):                        # flip the order, then another column
        header_click(qt, panel.table, col)
        assert panel.current_row() == row, "the highlight moved to another allocation"
        sel = panel.table.selectionModel().selectedRows()
        assert [panel.model.row_id(ix.row()) for ix in sel] == [row]
        assert window.stack_panel.row == row
    # and the highlighted row is on screen
    rect = panel.table.visualRect(panel.table.currentIndex())
    assert panel.table.viewport().rect().intersects(rect)
    assert d is not None


def test_frame_search_finds_file_and_line_as_the_where_column_shows_it(qt, window):
    d = open_and_wait(qt, window, str(GROUNDTRUTH / "mlp_adamw.pickle"))
    panel = window.table_panel
    labels = {d.row_label(r) for r in range(d.n_rows)}
    where = sorted(lab for lab in labels if re.search(r"\(record_runs\.py:\d+\)", lab))[0]
    file_line = re.search(r"\((record_runs\.py:\d+)\)", where).group(1)
    window.activateWindow()
    qt.keyClick(window.timeline.plot, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert panel.text.hasFocus()
    qt.keyClicks(panel.text, file_line)
    qt.waitUntil(lambda: len(panel.model.view.rows) < d.n_rows, timeout=2000)
    rows = panel.model.view.rows
    assert len(rows) > 0
    fname, line = file_line.split(":")
    for r in rows:
        frames = [d.stacks.frame(int(f)) for f in d.snap.stack(int(d.allocs.stack[r]))]   # profiler frames split
        assert any(fv.file.endswith(fname) and fv.line == int(line) for fv in frames)
    # every row whose Where reads that file:line is found
    expect = {r for r in range(d.n_rows) if file_line in d.row_label(r)}
    assert expect <= set(rows.tolist())
    # the Where column's own form, with the parentheses, finds the same rows
    panel.text.clear()
    qt.keyClicks(panel.text, f"({file_line})")
    qt.waitUntil(lambda: panel.text.text() == f"({file_line})" and not panel._timer.isActive(), timeout=2000)
    assert sorted(panel.model.view.rows.tolist()) == sorted(rows.tolist())


# -- the view stays on the data ----------------------------------------------------------------------
def test_views_stay_on_the_data(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    tl = window.timeline
    lo, hi = tl.x_limits()
    assert lo < 0 < d.x_range[1] < hi and hi - lo < d.x_range[1] * 1.03
    # an allocation live before the trace: its lifetime starts at the run's start, no earlier
    panel = window.table_panel
    pre = np.flatnonzero(d.alloc_index < 0)
    assert len(pre)
    panel.set_categories(None)
    pos = panel.model.view.position_of(int(pre[0]))
    panel.table.scrollTo(panel.model.index(pos, 0))
    qt.mouseClick(panel.table.viewport(), Qt.MouseButton.LeftButton,
                  pos=panel.table.visualRect(panel.model.index(pos, 1)).center())
    assert window.selected_row == int(pre[0])
    a, b = tl.x_span()
    assert lo - 1e-9 <= a < b <= hi + 1e-9
    # panning with the arrow keys stops at the end
    tl.set_x_range(d.x_range[1] * 0.5, d.x_range[1] * 0.7)
    window.activateWindow()
    tl.plot.setFocus()
    for _ in range(12):
        qt.keyClick(tl.plot, Qt.Key.Key_Right)
    a, b = tl.x_span()
    assert b == pytest.approx(hi) and b - a == pytest.approx(d.x_range[1] * 0.2)
    # dragging the overview's region far past the end stops there too
    ov = tl.overview
    ovb = ov.getPlotItem().getViewBox()
    vp = ov.viewport()

    def at(x):
        return ov.mapFromScene(ovb.mapViewToScene(QPointF(x, 0.5 * ovb.viewRange()[1][1])))
    tl.set_x_range(d.x_range[1] * 0.2, d.x_range[1] * 0.4)
    qt.wait(5)
    start = at(d.x_range[1] * 0.3)
    drag(vp, start, start + QPoint(1200, 0))
    ra, rb = tl.ov_region.getRegion()
    a, b = tl.x_span()
    assert rb <= hi + 1e-9 and b <= hi + 1e-9 and a > d.x_range[1] * 0.4
    # the mouse wheel cannot zoom out past the whole run
    from PySide6.QtGui import QWheelEvent
    vp = tl.plot.viewport()
    p = vp.rect().center()
    for _ in range(8):
        ev = QWheelEvent(QPointF(p), QPointF(vp.mapToGlobal(p)), QPoint(0, 0), QPoint(0, -240),
                         Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase,
                         False)
        QApplication.sendEvent(vp, ev)
    a, b = tl.x_span()
    assert lo - 1e-6 <= a and b <= hi + 1e-6


# -- the note dialog ---------------------------------------------------------------------------------------
@pytest.fixture
def copy_of_example(tmp_path, monkeypatch):
    import shutil
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "userdata"))
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    p = tmp_path / "example.pickle"
    shutil.copyfile(EXAMPLE, p)
    return str(p)


def on_dialog(qt, then):
    """Run `then(dialog)` on the next modal dialog once it is shown (exec() blocks the test)."""
    from PySide6.QtCore import QTimer
    seen = []

    def poll():
        dlg = QApplication.activeModalWidget()
        if dlg is None or not dlg.isVisible():
            QTimer.singleShot(10, poll)
            return
        seen.append(dlg)
        try:
            then(dlg)
        except BaseException as e:       # never leave a modal dialog up: the test would hang
            seen.append(e)
        finally:
            if dlg.isVisible() and seen[-1] is not dlg:
                dlg.reject()
    QTimer.singleShot(0, poll)
    return seen


def annotate_peak(qt, window):
    """Shift+P on the timeline, as a user presses it (the window active again after a dialog)."""
    window.activateWindow()
    window.timeline.plot.setFocus()
    qt.waitUntil(lambda: window.isActiveWindow(), timeout=2000)
    qt.keyClick(window.timeline.plot, Qt.Key.Key_P, Qt.KeyboardModifier.ShiftModifier)


def test_note_dialog_keys_wrap_and_title(qt, window, copy_of_example):
    from vramscope.viewer.window.dialogs import NoteDialog
    open_and_wait(qt, window, copy_of_example)

    def type_and_save(dlg):
        assert isinstance(dlg, NoteDialog)
        assert dlg.edit.lineWrapMode() == dlg.edit.LineWrapMode.WidgetWidth
        # the whole title fits: the dialog is wider than the title's text
        assert dlg.width() > dlg.fontMetrics().horizontalAdvance(dlg.windowTitle()) + 100
        dlg.edit.setFocus()
        qt.keyClick(dlg.edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
        qt.keyClicks(dlg.edit, "first line")
        qt.keyClick(dlg.edit, Qt.Key.Key_Return)                  # plain Return: a new line
        qt.keyClicks(dlg.edit, "second")
        qt.keyClick(dlg.edit, Qt.Key.Key_Tab)                     # Tab: focus moves on, no tab typed
        assert "\t" not in dlg.text() and not dlg.edit.hasFocus()
        dlg.edit.setFocus()
        qt.keyClick(dlg.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)   # saves
    seen = on_dialog(qt, type_and_save)
    annotate_peak(qt, window)
    assert len(seen) == 1, seen
    notes = list(window.notes.store)
    assert [n.note for n in notes] == ["first line\nsecond"]

    # Ctrl+Enter (the main keyboard's Enter reads Return; the keypad's is Enter) saves too
    def keypad(dlg):
        qt.keyClicks(dlg.edit, "keypad")
        qt.keyClick(dlg.edit, Qt.Key.Key_Enter, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.KeypadModifier)
    seen = on_dialog(qt, keypad)
    annotate_peak(qt, window)
    assert len(seen) == 1, seen
    assert [n.note for n in window.notes.store][-1] == "keypad"

    # Esc cancels: nothing added
    def cancel(dlg):
        qt.keyClicks(dlg.edit, "never saved")
        qt.keyClick(dlg.edit, Qt.Key.Key_Escape)
    seen = on_dialog(qt, cancel)
    annotate_peak(qt, window)
    assert len(seen) == 1, seen
    assert len(list(window.notes.store)) == 2


# -- the status bar ------------------------------------------------------------------------------------
def test_status_bar_gap_and_esc_clears_the_mark_message(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    sb = window.statusBar()
    # mark a range with a real Ctrl+drag: its instructions appear...
    tl = window.timeline
    vb = tl.vb

    def at(x):
        return tl.plot.mapFromScene(vb.mapViewToScene(QPointF(x, d.peak_bytes / 3)))
    drag(tl.plot.viewport(), at(float(d.x_of_index(500))), at(float(d.x_of_index(900))),
         modifiers=Qt.KeyboardModifier.ControlModifier)
    assert tl.marked_range() is not None
    assert sb.currentMessage().startswith("Marked entries") and "Esc to clear" in sb.currentMessage()
    # ...and go with the mark on Esc
    window.activateWindow()
    tl.plot.setFocus()
    qt.keyClick(tl.plot, Qt.Key.Key_Escape)
    assert tl.marked_range() is None and sb.currentMessage() == ""
    # a long message stops short of the file name: background pixels between them
    sb.showMessage("W" * 400)
    qt.wait(5)
    img = sb.grab().toImage()
    # (the labels that repeat the title and the toolbar have stepped aside for it)
    label = next(lb for lb in (window.status_file, window.status_device, window.status_entries, window.status_peak)
                 if lb.isVisible())
    left = label.geometry().x() + label.contentsMargins().left()       # where the label's text starts
    bg = img.pixelColor(img.width() - 1, 1)
    gap = [img.pixelColor(x, y) for x in range(left - 10, left - 1) for y in range(4, img.height() - 4)]
    assert gap and all(c == bg for c in gap)


def test_a_long_message_at_1024_pixels_is_read_whole(qt, window):
    """Ctrl+drag at 1024 pixels: "Marked entries …: press A to annotate, File > Export Trimmed
    Snapshot to save them, Esc to clear" used to end at "File > Expo", cut off by the labels.
    The file name, device and entry count step aside while it shows, and come back after."""
    window.resize(1024, 700)
    d = open_and_wait(qt, window, EXAMPLE)
    qt.wait(50)
    sb = window.statusBar()
    labels = (window.status_file, window.status_device, window.status_entries, window.status_peak)
    tl = window.timeline

    def at(x):
        return tl.plot.mapFromScene(tl.vb.mapViewToScene(QPointF(x, d.peak_bytes / 3)))
    drag(tl.plot.viewport(), at(float(d.x_of_index(500))), at(float(d.x_of_index(900))),
         modifiers=Qt.KeyboardModifier.ControlModifier)
    message = sb.currentMessage()
    assert message.endswith("Esc to clear")
    qt.wait(20)
    shown = [lb for lb in labels if lb.isVisible()]
    assert window.status_peak in shown
    # the message ends left of the first label still shown
    first_label_x = min(lb.geometry().x() for lb in shown)
    assert sb.fontMetrics().horizontalAdvance(message) <= first_label_x - 8
    assert sb.toolTip() == message
    window.activateWindow()
    tl.plot.setFocus()
    qt.keyClick(tl.plot, Qt.Key.Key_Escape)
    assert sb.currentMessage() == ""
    assert all(lb.isVisible() for lb in labels)


# -- small things around the window ------------------------------------------------------------------------
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


def test_one_hover_box_over_a_note(qt, window, copy_of_example):
    from vramscope.services.annotations import Annotation
    d = open_and_wait(qt, window, copy_of_example)
    window.notes.store.add(Annotation(kind="range", device=d.device, start_index=200, end_index=900,
                                note="warm-up\nthe first steps allocate the optimizer state"))
    tl = window.timeline
    tl.refresh_now()
    tl.plot.viewport().repaint()
    chip = next(r for r, _ in tl.notes.hits if r.height() < 40)
    qt.mouseMove(tl.plot.viewport(), chip.center().toPoint())
    qt.waitUntil(lambda: tl.hover_label.isVisible(), timeout=2000)
    assert "optimizer state" in tl.hover_label.textItem.toPlainText()
    assert tl.notes.toolTip() == "" and tl.plot.toolTip() == ""


# -- the panels' room -------------------------------------------------------------------------------------
def test_findings_wrap_and_show_the_oom_advice(qt, window):
    d = open_and_wait(qt, window, str(DATA / "oom.pickle"))
    panel = window.findings_panel
    qt.wait(60)                                               # the re-wrap after the layout settles
    tree = panel.tree
    fm = tree.fontMetrics()
    texts = []
    stack = [(tree.topLevelItem(k), 0) for k in range(tree.topLevelItemCount())]
    while stack:
        it, depth = stack.pop()
        texts.append(it.text(0))
        avail = tree.viewport().width() - tree.indentation() * (depth + 1)
        for line in it.text(0).split("\n"):
            assert fm.horizontalAdvance(line) <= avail + 2, line           # nothing cut with '…'
        stack.extend((it.child(k), depth + 1) for k in range(it.childCount()))
    flat = " ".join(t.replace("\n", " ") for t in texts)
    oom = next(f for f in d.findings if f.kind == "oom").subject
    from vramscope.present.words import oom_suggestions
    for advice in oom_suggestions(oom):
        assert advice.split(" (")[0][:40] in flat                     # the advice is on screen, not a tooltip
    # the finding's title and detail (the status bar joins them) name the request once
    fv = next(f for f in d.findings if f.kind == "oom")
    from vramscope.common.units import fmt_bytes
    assert fmt_bytes(oom.requested) in fv.title and f"requested {fmt_bytes(oom.requested)}" not in fv.detail
    assert not any(f"requested {fmt_bytes(oom.requested)}" in line for line in panel.detail_lines(fv))
    # narrower: the lines wrap again
    before = sum(t.count("\n") for t in texts)
    window.resizeDocks([window.docks["findings"]], [240], Qt.Orientation.Horizontal)
    qt.wait(80)
    after = []
    stack = [tree.topLevelItem(k) for k in range(tree.topLevelItemCount())]
    while stack:
        it = stack.pop()
        after.append(it.text(0))
        stack.extend(it.child(k) for k in range(it.childCount()))
    assert sum(t.count("\n") for t in after) > before


def test_moment_categories_fit_above_the_next_heading(qt, window):
    d = open_and_wait(qt, window, str(SHARED / "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle")
                      if SHARED.is_dir() else EXAMPLE)
    window.docks["moment"].raise_()
    window.moment_panel.show_index(d.peak_index)
    qt.wait(10)
    cats = window.moment_panel.cats
    n = cats.topLevelItemCount()
    assert n >= 3
    last = cats.visualItemRect(cats.topLevelItem(n - 1))
    assert last.bottom() < cats.viewport().height()                       # the last row is whole
    assert cats.verticalScrollBar().maximum() == 0


def test_layout_at_1024x700_gives_the_table_rows(qt, window):
    open_and_wait(qt, window, EXAMPLE)
    window.resize(1024, 700)
    qt.wait(120)                                              # the window follows (debounced)
    t = window.table_panel.table
    rows_visible = t.viewport().height() // t.verticalHeader().defaultSectionSize()
    assert rows_visible >= 7
    assert window.timeline.plot.height() >= 200
    # the right column runs the full height next to the table
    right = window.docks["selection"].geometry()
    table = window.docks["allocations"].geometry()
    assert right.left() >= table.right() and right.bottom() >= table.top()
    # every panel of the bottom area fits a 1024-pixel window, and leaves the plot its room
    for key in ("annotations", "allocator", "whatif", "allocations"):
        window.docks[key].raise_()
        qt.wait(30)
        assert window.minimumSizeHint().width() <= 1024, key
        assert window.width() == 1024 and window.timeline.plot.height() >= 200, key
    # and at 1600x1000 the table is not squeezed either
    window.resize(1600, 1000)
    qt.wait(120)
    assert t.viewport().height() // t.verticalHeader().defaultSectionSize() >= 12


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


def test_entry_axis_ticks_are_whole(qt, window):
    from vramscope.viewer.timeline.items import TimeAxis
    ax = TimeAxis("bottom")
    ax.has_time = False
    assert all(sp >= 1 for sp, _ in ax.tickSpacing(0, 3, 800))


# -- the timeline's axis and markers -----------------------------------------------------------------------
def test_an_idle_stretch_puts_entries_on_the_axis(qt, window):
    d = open_and_wait(qt, window, str(DATA / "oom.pickle"))
    assert d.has_time and not d.time_axis                     # 2.5 s idle before the first step, of 3.4 s
    assert "idle" in window.statusBar().currentMessage()
    assert window.timeline.axis_x.labelText == "trace entry"
    assert d.x_range == (0.0, float(d.n))
    # the first step's events take most of the axis, not its last quarter
    first_step = d.iterations[0].start_index
    assert float(d.x_of_index(first_step)) < 0.3 * d.x_range[1]
    # T: seconds (the same entries stay in view), T again: entries
    window.activateWindow()
    window.timeline.plot.setFocus()
    qt.keyClick(window.timeline.plot, Qt.Key.Key_T)
    assert d.time_axis and window.act_time_axis.isChecked()
    assert window.timeline.axis_x.labelText == "time since the first event"
    assert window.timeline.x_limits()[1] == pytest.approx(d.time_span * 1.01)
    qt.keyClick(window.timeline.plot, Qt.Key.Key_T)
    assert not d.time_axis
    # a run without such a gap keeps seconds
    d2 = open_and_wait(qt, window, EXAMPLE)
    assert d2.time_axis == d2.has_time


def test_iteration_peaks_are_thinned_to_markers(qt, window, tmp_path):
    import sys
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gen_snapshot import generate
    path = tmp_path / "many_steps.pickle"
    generate(str(path), 100_000, seed=1)
    d = open_and_wait(qt, window, str(path))
    assert len(d.iterations) >= 30
    window.resize(800, 700)
    qt.wait(80)
    tl = window.timeline
    window.act_reset.trigger()
    tl.refresh_now()
    xs = np.sort(tl.iter_peaks.data["x"])
    px_per_x = tl.vb.width() / (tl.x_span()[1] - tl.x_span()[0])
    assert 0 < len(xs) < len(d.iterations)
    assert np.all(np.diff(xs) * px_per_x >= tl.ITER_PEAK_PX / 2)
    # zoomed onto a few iterations, every one of them is marked
    its = d.iterations[10:13]
    tl.zoom_to_indices(its[0].start_index, its[-1].end_index)
    tl.refresh_now()
    shown = set(np.round(tl.iter_peaks.data["x"], 9).tolist())
    for it in its:
        if it.peak_index != d.peak_index:
            assert round(float(d.x_of_index(it.peak_index)), 9) in shown


def test_phase_legend_and_labels_around_the_oom_marker(qt, window):
    d = open_and_wait(qt, window, str(DATA / "oom.pickle"))
    text = " ".join(w.text() for w in window.legend.findChildren(type(window.empty_msg)))
    assert "inputs" in text and "forward" in text
    tl = window.timeline
    oom = next(f for f in d.findings if f.kind == "oom")
    assert float(d.x_of_index(oom.index)) in tl.spans.avoid.tolist()
    # painted: no phase label is drawn over the OOM label's corner (top of the plot, near its line)
    tl.refresh_now()
    img = tl.plot.grab().toImage()
    assert not img.isNull()


# -- per-allocation view and the outline of the selection --------------------------------------------------
def live_in_stack_order(d, i):
    rows = np.flatnonzero((d.alloc_index <= i) & ((d.free_index < 0) | (d.free_index > i)))
    return rows[np.lexsort((rows, d.alloc_index[rows]))]


def outline_at(tl, x):
    """(bottom, top) of the selection outline over the column at x."""
    xs, ys = tl.sel_bar.getData()
    half = (tl.last_env.col_x[1] - tl.last_env.col_x[0]) / 2
    near = np.isfinite(ys) & (np.abs(xs - x) <= half + 1e-12)
    return float(np.nanmin(ys[near])), float(np.nanmax(ys[near]))


def test_per_allocation_view_hover_click_and_outline(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    tl = window.timeline
    window.activateWindow()
    tl.plot.setFocus()
    qt.keyClick(tl.plot, Qt.Key.Key_L)
    assert tl.mode == "allocations" and window.mode_actions["allocations"].isChecked()
    x = float(d.x_of_index(d.peak_index))
    i = tl.pointer.index_under(x)
    rows = live_in_stack_order(d, i)
    sizes = np.asarray(d.allocs.size)[rows]
    tops = np.cumsum(sizes)
    k = int(np.argmax(sizes))                      # the biggest band: easy to hit
    y = float(tops[k] - sizes[k] / 2)
    pos = tl.plot.mapFromScene(tl.vb.mapViewToScene(QPointF(x, y)))
    qt.mouseMove(tl.plot.viewport(), pos)
    qt.waitUntil(lambda: tl.hover_label.isVisible(), timeout=2000)
    from vramscope.common.units import fmt_bytes
    text = tl.hover_label.textItem.toPlainText()
    assert d.category_name(int(d.category[rows[k]])) in text and fmt_bytes(int(sizes[k])) in text
    qt.mouseClick(tl.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert window.selected_row == int(rows[k])
    lo, hi = outline_at(tl, tl.last_env.col_x[tl.pointer.column_under(x)])
    assert lo == pytest.approx(tops[k] - sizes[k]) and hi == pytest.approx(tops[k])
    # hidden categories drop out of the stack, and the rest moves down
    c = int(d.category[rows[0]])
    window.legend.buttons[c].click()
    qt.wait(5)
    below = rows[:k][d.category[rows[:k]] != c]
    if int(d.category[rows[k]]) != c:
        lo2, hi2 = outline_at(tl, tl.last_env.col_x[tl.pointer.column_under(x)])
        assert lo2 == pytest.approx(float(np.asarray(d.allocs.size)[below].sum()))


def test_category_outline_sits_at_its_place_in_the_band(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    tl = window.timeline
    i = d.peak_index
    rows = live_in_stack_order(d, i)
    vis = tl.visible_categories
    # an allocation in the middle of its band: older ones of its category are below it
    cats = d.category[rows]
    c = max(vis, key=lambda c: int((cats == c).sum()))
    mine = rows[cats == c]
    row = int(mine[len(mine) // 2])
    window.select_row(row)
    tl.zoom_to_indices(max(0, i - 40), min(d.n - 1, i + 40))
    tl.refresh_now()
    x = float(d.x_of_index(i))
    col = tl.pointer.column_under(x)
    j = int(tl.last_env.col_index[col])
    live = live_in_stack_order(d, j)
    base = sum(float(np.asarray(d.allocs.size)[live][d.category[live] == cc].sum()) for cc in vis[:vis.index(c)])
    older = live[:np.flatnonzero(live == row)[0]]
    offset = float(np.asarray(d.allocs.size)[older][d.category[older] == c].sum())
    lo, hi = outline_at(tl, tl.last_env.col_x[col])
    assert lo == pytest.approx(base + offset) and hi == pytest.approx(base + offset + float(d.allocs.size[row]))
    assert lo > 0                                   # not drawn from 0 at the bottom of the chart


def _dock_tab(w, title):
    """The tab bar of a group of tabbed panels and the index of the tab called `title`."""
    from PySide6.QtWidgets import QTabBar
    for bar in w.findChildren(QTabBar):
        for i in range(bar.count()):
            if bar.tabText(i).startswith(title) and bar.isVisible():
                return bar, i
    raise AssertionError(f"no tab {title!r}")


def test_a_panel_raised_by_its_tab_takes_the_keys_from_the_table_it_covers(qt):
    """Clicking a row, then the Allocator's tab, then →: the allocator steps, and the table
    (behind its tab, yet still 'visible' to Qt) keeps its selection. The focus used to stay
    in the covered table, so the arrows moved an unseen selection."""
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtWidgets import QApplication
    w = new_window(qt)
    w.resize(1024, 700)
    open_and_wait(qt, w, DATA / "oom_step3.pickle")
    w.activateWindow()
    qt.waitUntil(lambda: QApplication.activeWindow() is w, timeout=2000)
    view = w.table_panel.table
    qt.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(40, view.rowHeight(0) // 2))
    row = w.selected_row
    assert row is not None and QApplication.focusWidget() is view
    bar, i = _dock_tab(w, "Allocator")
    qt.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(i).center())
    qt.waitUntil(lambda: w.on_screen("allocator") and w.allocator_panel.index is not None, timeout=2000)
    qt.wait(20)
    start = w.allocator_panel.index
    qt.keyClick(QApplication.focusWidget(), Qt.Key.Key_Right)
    assert w.allocator_panel.index == start + 1
    assert w.selected_row == row
    # and back: the table's tab gives the keys to the table
    bar, i = _dock_tab(w, "Allocations")
    qt.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(i).center())
    qt.waitUntil(lambda: w.on_screen("allocations"), timeout=2000)
    qt.wait(20)
    qt.keyClick(QApplication.focusWidget(), Qt.Key.Key_Down)
    assert w.selected_row != row and w.allocator_panel.index == start + 1


def test_panels_follow_the_window_until_a_separator_is_dragged(qt, window):
    """A stray click on the window's background does not freeze the panels' sizes; dragging
    the separator beside the right column does (the sizes the user chose then stay)."""
    open_and_wait(qt, window, EXAMPLE)
    qt.wait(120)
    right = window.docks["findings"]

    def separator() -> QPoint:
        g = right.geometry()
        return QPoint(g.left() - 3, g.top() + g.height() // 2)

    qt.mouseClick(window, Qt.MouseButton.LeftButton, pos=separator())     # a click: nothing moves
    window.resize(1600, 1000)
    qt.wait(150)
    wide = right.width()
    window.resize(1024, 700)
    qt.wait(150)
    assert right.width() < wide                                           # the column still follows
    p = separator()
    qt.mousePress(window, Qt.MouseButton.LeftButton, pos=p)
    for dx in (-10, -30, -60):
        qt.mouseMove(window, QPoint(p.x() + dx, p.y()))
        qt.wait(10)
    qt.mouseRelease(window, Qt.MouseButton.LeftButton, pos=QPoint(p.x() - 60, p.y()))
    qt.wait(50)
    chosen = right.width()
    assert chosen > right.minimumSizeHint().width() and chosen != wide
    window.resize(1400, 900)
    qt.wait(150)
    assert abs(right.width() - chosen) <= 2                               # the user's width stays
