"""The viewer's friction list (issue 22), each through real input: the Compare hover tells
where it is, a What-if slider does not change the view mode behind the user's back, the
timeline's labels after real zooms, the export dialog says what a trimmed snapshot holds."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, new_window, open_and_wait  # noqa: E402

LORA = str(DATA / "cuda_lora.pickle")
CKPT = str(DATA / "cuda_ckpt.pickle")


def hover_text(qt, totals, frac: float) -> str:
    """A real mouse move over the Compare plot at `frac` of its width; the hover box's words."""
    vb = totals.vb.sceneBoundingRect()
    scene = QPointF(vb.left() + vb.width() * frac, vb.top() + vb.height() * 0.5)
    pos = totals.plot.mapFromScene(scene)
    qt.mouseMove(totals.plot.viewport(), pos)
    qt.wait(10)
    assert totals.hover_label.isVisible()
    return totals.hover_label.textItem.toPlainText()


def test_compare_hover_says_where_it_is_on_the_axis(qt, monkeypatch):
    from PySide6.QtWidgets import QFileDialog
    w = new_window(qt)
    open_and_wait(qt, w, LORA)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (CKPT, "")))
    with qt.waitSignal(w.compared, timeout=LOAD_TIMEOUT):
        w.act_compare.trigger()
    qt.wait(50)
    panel = w.compare_panel
    totals = panel.totals
    for mode, frac in (("start", 0.5), ("iteration", 0.45)):
        panel.align.setCurrentIndex(panel.align.findData(mode))
        qt.wait(20)
        text = hover_text(qt, totals, frac)
        (x0, x1), _ = totals.vb.viewRange()
        mid = x0 + (x1 - x0) * frac
        first = text.split(" · ")[0]
        if mode == "iteration":
            assert first.startswith(f"iteration {int(mid) + 1}, ") and first.endswith("% in"), text
        elif totals.seconds:
            assert first.endswith(" s") or first.endswith("ms"), text
        else:
            assert first.startswith("entry ") and abs(int(first[6:].replace(",", "")) - mid) <= (x1 - x0) / 100, text
        assert " · A " in text and " · B " in text and "B − A" in text, text


@pytest.mark.parametrize("mode", ["segments", "allocations"])
def test_a_whatif_slider_says_it_shows_categories_and_reset_brings_the_mode_back(qt, mode):
    w = new_window(qt)
    open_and_wait(qt, w, str(DATA / "qlora_4bit.pickle"))
    w.activateWindow()
    w.timeline.plot.setFocus()
    qt.keyClick(w.timeline.plot, {"segments": Qt.Key.Key_S, "allocations": Qt.Key.Key_L}[mode])
    assert w.timeline.mode == mode
    w.docks["whatif"].show()
    w.docks["whatif"].raise_()
    panel = w.whatif_panel
    qt.waitUntil(lambda: panel.session is not None, timeout=5000)
    sl = panel.sliders["activations"]
    # a real drag of the slider's handle, to the right
    from PySide6.QtWidgets import QStyle, QStyleOptionSlider
    opt = QStyleOptionSlider()
    sl.initStyleOption(opt)
    handle = sl.style().subControlRect(QStyle.ComplexControl.CC_Slider, opt, QStyle.SubControl.SC_SliderHandle, sl)
    qt.mousePress(sl, Qt.MouseButton.LeftButton, pos=handle.center())
    for dx in (5, 15, 30):
        qt.mouseMove(sl, handle.center() + QPoint(dx, 0))
    qt.mouseRelease(sl, Qt.MouseButton.LeftButton, pos=handle.center() + QPoint(30, 0))
    assert sl.value() > 100
    qt.waitUntil(lambda: w.timeline.stacking.scales is not None, timeout=2000)
    # the drawing needs categories: the view says so, in the panel and the status bar
    assert w.timeline.mode == "categories" and w.mode_actions["categories"].isChecked()
    title = w.mode_actions[mode].text().replace("&", "")
    assert panel.mode_note.isVisible() and f"Reset brings {title} back" in panel.mode_note.text()
    assert "Categories" in w.statusBar().currentMessage()
    # another move keeps the mode it replaced
    sl.setFocus()
    qt.keyClick(sl, Qt.Key.Key_PageUp)
    qt.wait(60)
    assert f"Reset brings {title} back" in panel.mode_note.text()
    qt.mouseClick(panel.reset_btn, Qt.MouseButton.LeftButton)
    assert w.timeline.mode == mode and w.mode_actions[mode].isChecked()
    assert not panel.mode_note.isVisible() and w.timeline.stacking.scales is None


def test_the_trimmed_export_says_which_entries_seconds_and_iterations_it_holds(qt, monkeypatch, tmp_path):
    from PySide6.QtWidgets import QFileDialog, QInputDialog
    from vramscope.viewer.window.exports import range_words
    w = new_window(qt)
    d = open_and_wait(qt, w, LORA)
    it2, it3 = d.iterations[1], d.iterations[2]
    # zoomed onto iterations 2-3 with the wheel-free keys: the visible range is offered
    w.timeline.set_x_range(float(d.x_of_index(it2.start_index)), float(d.x_of_index(it3.end_index)))
    offered, titles = [], []

    def pick(parent, title, label, items, *a, **k):
        offered.extend(items)
        return items[0], True
    monkeypatch.setattr(QInputDialog, "getItem", pick)
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        lambda parent, title, *a, **k: (titles.append(title) or str(tmp_path / "t"), ""))
    w.act_export_trimmed.trigger()
    qt.waitUntil(lambda: "Wrote entries" in w.statusBar().currentMessage(), timeout=LOAD_TIMEOUT)
    visible = offered[0]
    assert visible.startswith("The visible range: entries ")
    a, b = w.entries_in(*w.timeline.x_span())
    assert f"entries {a:,}–{b:,}" in visible and " s to " in visible and "iterations 2-3" in visible, visible
    assert "around the peak" in offered[-1] and "iteration" in offered[-1]
    assert range_words(d, a, b) in titles[0]               # the save dialog's title says it too
    # a range inside one iteration
    inner = range_words(d, it2.start_index + 10, it2.start_index + 20)
    assert inner.endswith("part of iteration 2)") and inner.startswith(f"entries {it2.start_index + 10:,}–")


def test_file_dialogs_open_wide_with_sizes_and_dates_whole(qt, tmp_path):
    """Qt's own file dialog (no native one offscreen or under a bare window manager), in a
    1024x700 window: wide enough, and its Size and Date columns as wide as what they show."""
    from PySide6.QtWidgets import QFileDialog, QTreeView
    for k in range(5):
        (tmp_path / f"run_{k}_with_a_fairly_long_snapshot_name.pickle").write_bytes(b"x" * 10 ** k)
    w = new_window(qt)
    w.resize(1024, 700)
    dlg = QFileDialog(w, "Open memory snapshot", str(tmp_path))
    dlg.setOption(QFileDialog.Option.DontUseNativeDialog)
    dlg.setViewMode(QFileDialog.ViewMode.Detail)
    dlg.show()
    qt.waitExposed(dlg)
    view = next(v for v in dlg.findChildren(QTreeView) if v.isVisible())
    qt.waitUntil(lambda: view.model().rowCount(view.rootIndex()) >= 5, timeout=5000)
    qt.wait(50)
    screen = dlg.screen().availableGeometry()
    assert dlg.width() >= min(900, int(screen.width() * 0.9)) and dlg.width() <= screen.width()
    hh = view.header()
    for col in range(1, hh.count()):
        if not hh.isSectionHidden(col):
            assert hh.sectionSize(col) >= view.sizeHintForColumn(col), (col, hh.sectionSize(col))
    dlg.close()
    dlg.deleteLater()


def wheel(qt, widget, pos: QPoint, steps: int):
    """Real wheel events (one notch each, up: zoom in) at `pos` of the plot's viewport."""
    from PySide6.QtCore import QPointF as P
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication
    for _ in range(abs(steps)):
        ev = QWheelEvent(P(pos), P(widget.mapToGlobal(pos)), QPoint(0, 0), QPoint(0, 120 if steps > 0 else -120),
                         Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
        QApplication.sendEvent(widget, ev)
        qt.wait(5)


def label_box(tl, label):
    return label.mapRectToScene(label.boundingRect())


def test_the_peak_label_stays_whole_in_view_after_real_zooms(qt):
    w = new_window(qt)
    d = open_and_wait(qt, w, LORA)
    tl = w.timeline
    px = float(tl.peak_marker.data["x"][0])
    view = tl.plot.viewport()
    vb_rect = tl.vb.sceneBoundingRect()
    # zoom in with the wheel just left of the peak, then just right of it: the peak near each edge
    for dx in (-40, 40, -200, 200):
        tl.reset_view()
        qt.wait(20)
        scene = tl.vb.mapViewToScene(QPointF(px, d.peak_bytes / 2))
        at = tl.plot.mapFromScene(scene) + QPoint(dx, 0)
        wheel(qt, view, at, 8)
        qt.wait(30)
        x0, x1 = tl.x_span()
        assert x1 - x0 < 0.5 * (d.x_range[1] - d.x_range[0])
        r = label_box(tl, tl.peak_label)
        assert tl.peak_label.isVisible()
        assert r.left() >= vb_rect.left() - 1 and r.right() <= vb_rect.right() + 1, (dx, r, vb_rect)
        text = tl.peak_label.toPlainText()
        assert "…" not in text and "peak 277.0 MiB" in text, text
        if not x0 <= px <= x1:
            assert text.startswith("◂") or text.endswith("▸")        # points to the peak off the view
    # the whole run: the whole words
    tl.reset_view()
    qt.wait(30)
    assert tl.peak_label.toPlainText() == "peak 277.0 MiB · at the start of backward"


def test_the_peak_label_keeps_clear_of_the_oom_label(qt):
    w = new_window(qt)
    path = str(DATA / "multi_device_oom.pickle")
    d = open_and_wait(qt, w, path)
    devices = sorted(w.result.analysis.devices)
    d = open_and_wait(qt, w, path, devices[1])
    assert d.device == devices[1] and any(f.kind == "oom" for f in d.findings)
    tl = w.timeline
    qt.wait(50)
    for size in ((1400, 900), (1024, 700)):
        w.resize(*size)
        qt.wait(150)
        tl.reset_view()
        qt.wait(30)
        oom = [ln for ln in tl.marker_lines if ln.label is not None and ln.label.toPlainText() == "OOM"]
        assert oom
        peak = label_box(tl, tl.peak_label)
        for ln in oom:
            assert not peak.intersects(ln.label.mapRectToScene(ln.label.boundingRect())), size


def test_a_run_that_sleeps_between_steps_opens_in_entries_with_its_phases_shaded_and_named(qt):
    """leak.pickle's loop sleeps 250 ms between 6 ms steps: in seconds its phases were too
    narrow to shade or name; it opens in entries (classifiers/timeaxis.py: idle) and says why,
    and T still gives seconds."""
    w = new_window(qt)
    w.resize(1600, 1000)
    d = open_and_wait(qt, w, str(DATA / "leak.pickle"))
    assert not d.time_axis and d.has_time
    assert "6 pauses between the steps take" in w._axis_notice()
    # the status bar says why in the words that fit (whole at 1600 px, a few words narrower)
    assert "pauses between the steps take" in w.statusBar().currentMessage()
    tl = w.timeline
    qt.waitUntil(lambda: len(tl.spans.placed) > 0, timeout=3000)
    placed = tl.spans.placed
    # the phases are named inside their own spans (issue 33: a name wider than its span ran
    # on over the next phase and across the iteration line): a narrow one is cut with an
    # ellipsis, or left out where even that does not fit (a 23-pixel forward; zoomed in, below,
    # it is named)

    def whole(text):
        return text[:-1] if text.endswith("…") else text
    assert sum(1 for _, t in placed if "forward".startswith(whole(t))) >= 1
    assert {"inputs", "backward", "optimizer"} <= {t for _, t in placed}
    for k, (r, _) in enumerate(placed):
        assert all(not r.intersects(o) for o, _ in placed[k + 1:])          # never over each other
    tr = tl.spans.deviceTransform(tl.plot.viewportTransform())
    starts = [tr.map(float(x), 0.0)[0] for x in tl.spans.starts]
    ends = [tr.map(float(x), 0.0)[0] for x in tl.spans.ends]
    for r, text in placed:                                                  # each inside a span of its name
        assert any(a <= r.left() and r.right() <= b and tl.spans.labels[k].startswith(whole(text))
                   for k, (a, b) in enumerate(zip(starts, ends))), text
    # zoomed on one step, forward is named too
    it = d.da.iterations[1]
    tl.set_x_range(it.start_index, it.end_index)
    tl.plot.viewport().repaint()
    qt.waitUntil(lambda: "forward" in {text for _, text in tl.spans.placed}, timeout=3000)
    qt.keyClick(w, Qt.Key.Key_T)
    qt.waitUntil(lambda: w.data.time_axis, timeout=3000)
    assert w._axis_notice() is None
