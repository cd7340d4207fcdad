"""The small ones (issue 33, item 13), pytest-qt offscreen with real clicks and keys: no empty
Ranks tab with a single file; a segment clicked before Allocator is in front is outlined and
in view; a phase's name stays inside its phase; a lifetime over the whole run is not tinted;
the Findings' highlight goes when the selection moves; "1 entry"; no "pre phase"; a simulated
lever is asked off the GUI thread with a busy bar and Cancel. (Compare calling two ranks
"rank 5" and "rank 1": tests/test_viewer_ranks.py.)"""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPointF, QSettings, Qt, QTimer  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, layout_settled, open_and_wait  # noqa: E402

OOM = str(DATA / "cuda_oom.pickle")


def test_no_empty_ranks_tab_comes_back_with_a_single_file(qt, tmp_path):
    from vramscope.viewer.app import make_app
    from vramscope.viewer.window import MainWindow
    make_app()
    ini = str(tmp_path / "vramscope.ini")
    w = MainWindow(persist=True, use_cache=False, settings=QSettings(ini, QSettings.Format.IniFormat))
    qt.addWidget(w)
    w.show()
    qt.waitExposed(w)
    open_and_wait(qt, w, OOM)
    w.ranks.dock.show()                        # a session that had the Ranks panel open
    qt.wait(30)
    w.close()
    w2 = MainWindow(persist=True, use_cache=False, settings=QSettings(ini, QSettings.Format.IniFormat))
    qt.addWidget(w2)
    w2.show()
    qt.waitExposed(w2)
    open_and_wait(qt, w2, OOM)
    qt.wait(30)
    assert w2.ranks.result is None and w2.ranks.dock.isHidden()
    w2.close()


def test_a_segment_clicked_before_allocator_is_in_front_is_outlined_in_view(qt, window):
    w = window
    d = open_and_wait(qt, w, OOM)
    assert not w.on_screen("allocator")
    w.timeline.plot.setFocus()
    qt.keyClick(w.timeline.plot, Qt.Key.Key_S)                   # stack by segment
    assert w.timeline.mode == "segments"
    tl = w.timeline
    tl.refresh_now()
    clicked = []
    tl.segmentClicked.connect(lambda seg, i: clicked.append(seg))
    r = tl.vb.sceneBoundingRect()
    for fx, fy in ((0.3, 0.8), (0.5, 0.75), (0.6, 0.85), (0.2, 0.9)):
        vp = tl.plot.mapFromScene(QPointF(r.left() + r.width() * fx, r.top() + r.height() * fy))
        qt.mouseClick(tl.plot.viewport(), Qt.MouseButton.LeftButton, pos=vp)
        if clicked:
            break
    assert clicked, "no segment under the clicks"
    qt.waitUntil(lambda: w.on_screen("allocator"), timeout=3000)
    qt.wait(150)
    addr = int(d.segments.addr[clicked[0]])
    panel = w.allocator_panel
    assert panel.map.highlight_segment == addr
    rect = panel.map.segment_rect(addr)
    view = panel.scroll.viewport().rect().translated(0, panel.scroll.verticalScrollBar().value())
    assert rect is not None and view.contains(rect.toRect().center()), (rect, view)


def test_a_phase_name_stays_inside_its_phase(qt, window):
    w = window
    open_and_wait(qt, w, OOM)
    tl = w.timeline
    for size in ((1400, 900), (1024, 700)):
        w.resize(*size)
        qt.wait(50)
        layout_settled(qt, w)
        tl.plot.viewport().grab()                                # paint: the labels are placed then
        spans = tl.spans
        assert spans.placed, "no phase named"
        for (box, text), (a, b) in zip(spans.placed, spans.placed_in):
            assert a <= box.left() and box.right() <= b, (text, box, a, b)


def test_a_lifetime_over_the_whole_run_is_not_tinted(qt, window):
    w = window
    d = open_and_wait(qt, w, str(DATA / "adamw_after_step1.pickle"))
    whole = np.flatnonzero((d.alloc_index < 0) & (d.free_index < 0))
    assert len(whole)
    panel = w.table_panel
    idx = panel.model.index(panel.model.view.position_of(int(whole[0])), 0)
    panel.table.scrollTo(idx)
    qt.mouseClick(panel.table.viewport(), Qt.MouseButton.LeftButton, pos=panel.table.visualRect(idx).center())
    assert w.selected_row == int(whole[0])
    sel = w.timeline.selection
    assert sel.isVisible() and sel.brush.style() == Qt.BrushStyle.NoBrush
    # a short one still is
    short = int(np.flatnonzero((d.alloc_index >= 0) & (d.free_index >= 0))[0])
    w.select_row(short, source="api")
    assert sel.brush.style() != Qt.BrushStyle.NoBrush


def test_the_findings_highlight_goes_when_the_selection_moves(qt, window):
    w = window
    d = open_and_wait(qt, w, OOM)
    tl = w.timeline
    tl.plot.setFocus()
    qt.keyClick(tl.plot, Qt.Key.Key_P)                           # the peak, highlighted in Findings
    tree = w.findings_panel.tree
    assert tree.currentItem() is not None
    chosen = w.selected_row
    # a click on the timeline somewhere else: another allocation (or none) selected
    r = tl.vb.sceneBoundingRect()
    qt.mouseClick(tl.plot.viewport(), Qt.MouseButton.LeftButton,
                  pos=tl.plot.mapFromScene(QPointF(r.left() + r.width() * 0.2, r.bottom() - 5)))
    assert w.selected_row != chosen
    assert tree.currentItem() is None and not tree.selectedItems()
    assert d is w.data


def test_counts_and_phases_in_words(qt, window):
    from vramscope.present.words import count_words, finding_detail
    w = window
    d = open_and_wait(qt, w, OOM)
    assert w.device_combo.itemText(0) == f"cuda:{d.device} · OOM"          # (one device: no star)
    assert count_words(1, "entry", "entries") == "1 entry" and count_words(3480, "entry", "entries") == "3,480 entries"
    assert w.status_entries.text() == f"{d.n:,} entries · {d.n_rows:,} allocations"
    # a snapshot with no trace: its peak is the state's, with no "pre phase"
    from helpers import analysis_of
    an = analysis_of(DATA / "bare_list.pickle")
    for da in an.devices.values():
        f = next(f for f in da.findings() if f.kind == "peak")
        assert f.subject.phase == "pre" and "pre phase" not in finding_detail(f)


def test_a_simulated_lever_is_asked_off_the_gui_thread_with_a_busy_bar(qt, window, monkeypatch):
    """Checkpointing on 10^6 events took over 3 s with nothing shown (the GUI thread asked)."""
    import threading
    from vramscope.viewer.model.whatif import WhatIfSession
    real = WhatIfSession.ask
    threads = []

    def slow(self, sliders, levers, gpu=None, fit=None):
        threads.append(threading.current_thread())
        if "checkpointing" in levers:
            time.sleep(0.6)
        return real(self, sliders, levers, gpu, fit)
    monkeypatch.setattr(WhatIfSession, "ask", slow)
    w = window
    open_and_wait(qt, w, str(DATA / "oom_step3.pickle"))
    w.dock_layout.show("whatif")
    panel = w.whatif_panel
    qt.waitUntil(lambda: panel.session is not None and panel.last is not None, timeout=30000)
    qt.waitUntil(lambda: panel.levers["checkpointing"].isVisible(), timeout=5000)
    ticks = []
    timer = QTimer(w)
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(20)
    cb = panel.levers["checkpointing"]
    threads.clear()
    qt.mouseClick(cb, Qt.MouseButton.LeftButton, pos=cb.rect().center())
    qt.waitUntil(lambda: panel.building.isVisible(), timeout=3000)
    assert "Simulating" in panel.building_label.text() and panel.building_btn.text() == "Cancel"
    qt.waitUntil(lambda: not panel._asking, timeout=30000)
    timer.stop()
    assert ticks and len(ticks) >= 10, "the GUI thread was held while it simulated"
    assert threads and all(t is not threading.main_thread() for t in threads)
    assert [lv.name for lv in panel.last.levers] == ["checkpointing"] and not panel.building.isVisible()
    # Cancel in the middle: the lever is unticked, the panel shows the run as measured
    qt.mouseClick(cb, Qt.MouseButton.LeftButton, pos=cb.rect().center())          # off (fast)
    qt.mouseClick(cb, Qt.MouseButton.LeftButton, pos=cb.rect().center())          # on again
    qt.waitUntil(lambda: panel.building.isVisible(), timeout=3000)
    qt.mouseClick(panel.building_btn, Qt.MouseButton.LeftButton)
    qt.waitUntil(lambda: not panel._asking, timeout=30000)
    assert not cb.isChecked() and not panel.last.levers


def test_the_wheel_scrolls_the_what_if_panel_over_a_slider_without_moving_it(qt, window):
    """Scrolling the What-if panel with the wheel moved every slider the pointer passed over."""
    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication
    w = window
    open_and_wait(qt, w, OOM)
    w.dock_layout.show("whatif")
    panel = w.whatif_panel
    qt.waitUntil(lambda: panel.session is not None and panel.last is not None, timeout=30000)
    sl = next(iter(panel.sliders.values()))
    qt.waitUntil(sl.isVisible, timeout=5000)                     # (laid out a moment after the model)
    before = sl.value()
    pos = sl.rect().center()
    ev = QWheelEvent(QPointF(pos), QPointF(sl.mapToGlobal(pos)), QPoint(0, 0), QPoint(0, -120),
                     Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(sl, ev)
    assert sl.value() == before
    w.activateWindow()                                            # (a click focuses in the active window)
    qt.waitUntil(w.isActiveWindow, timeout=5000)
    qt.mouseClick(sl, Qt.MouseButton.LeftButton, pos=QPoint(sl.width() // 2, sl.height() // 2))
    assert sl.hasFocus(), (sl.isVisible(), sl.visibleRegion().boundingRect(), w.on_screen("whatif"))
    before = sl.value()
    QApplication.sendEvent(sl, QWheelEvent(QPointF(pos), QPointF(sl.mapToGlobal(pos)), QPoint(0, 0), QPoint(0, -120),
                                           Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                                           Qt.ScrollPhase.NoScrollPhase, False))
    assert sl.value() != before                                  # with the keyboard, it turns
