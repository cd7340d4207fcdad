"""The timeline in a real window: the view stays on the data, the x axis (time or entries,
whole ticks), iteration-peak and OOM markers, the per-allocation view and the outline of the
selection (pytest-qt, offscreen)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from helpers import DATA, REPO  # noqa: E402
from viewer_helpers import drag, open_and_wait  # noqa: E402

EXAMPLE = str(REPO / "assets" / "example.pickle")


def live_in_stack_order(d, i):
    rows = np.flatnonzero((d.alloc_index <= i) & ((d.free_index < 0) | (d.free_index > i)))
    return rows[np.lexsort((rows, d.alloc_index[rows]))]


def outline_at(tl, x):
    """(bottom, top) of the selection outline over the column at x."""
    xs, ys = tl.sel_bar.getData()
    half = (tl.last_env.col_x[1] - tl.last_env.col_x[0]) / 2
    near = np.isfinite(ys) & (np.abs(xs - x) <= half + 1e-12)
    return float(np.nanmin(ys[near])), float(np.nanmax(ys[near]))


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


def test_entry_axis_ticks_are_whole(qt, window):
    from vramscope.viewer.timeline.items import TimeAxis
    ax = TimeAxis("bottom")
    ax.has_time = False
    assert all(sp >= 1 for sp, _ in ax.tickSpacing(0, 3, 800))


def test_an_idle_stretch_puts_entries_on_the_axis(qt, window):
    d = open_and_wait(qt, window, str(DATA / "oom.pickle"))
    assert d.has_time and not d.time_axis                     # 2.5 s idle before the first step, of 3.4 s
    assert "one pause of" in window.statusBar().currentMessage()       # timeaxis.py's reason, in words
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
