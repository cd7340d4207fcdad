"""The Allocator panel (the analysis' allocator state, classifiers/allocator.py, drawn):
stepping with the arrow keys, hovering and clicking blocks, a segment clicked on the
timeline (pytest-qt, offscreen). The state itself is tested in test_allocator.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from test_allocator import two_stream_snapshot

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
MiB = 1 << 20


# -- the panel, driven by keys -----------------------------------------------------------------------
pytest.importorskip("PySide6")


def test_allocator_panel_steps_with_the_arrow_keys(qt, tmp_path):
    from PySide6.QtCore import Qt
    from viewer_helpers import new_window, open_and_wait
    w = new_window(qt)
    d = open_and_wait(qt, w, two_stream_snapshot(tmp_path / "streams.pickle"))
    w.docks["allocator"].show()
    w.docks["allocator"].raise_()
    panel = w.allocator_panel
    panel.show_index(4)
    w.activateWindow()
    panel.setFocus()
    qt.waitUntil(lambda: panel.hasFocus(), timeout=2000)
    qt.keyClick(panel, Qt.Key.Key_Right)
    assert panel.index == 5 and w.pinned_index == 5
    assert w.timeline.cursor_line.value() == pytest.approx(float(d.x_of_index(5)))
    qt.keyClick(panel, Qt.Key.Key_Right)
    assert panel.index == 6 and "pending free <b>" not in panel.header.text()
    assert "pending free 5.00 MiB" in panel.header.text() and "streams 0, 7" in panel.header.text()
    # the analysis' figures, under the names that say what they measure
    from vramscope.present.words import reserved_unallocated_words
    st = d.analysis.allocator(d.device).state_at(6)
    assert panel.state.segments == st.segments and (panel.state.block_row == st.block_row).all()
    said = reserved_unallocated_words(d.reserved_at(6), d.da.reserved_unallocated_at(6))
    assert said in panel.header.text() and "fragmentation" not in panel.header.text().lower()
    assert f"{100 * st.cached_outside_largest_free:.1f}% of the" in panel.header.text()
    qt.keyClick(panel, Qt.Key.Key_Left)
    assert panel.index == 5
    # Ctrl+Left: the previous segment event (the second segment_alloc, entry 3)
    qt.keyClick(panel, Qt.Key.Key_Left, Qt.KeyboardModifier.ControlModifier)
    assert panel.index == 3
    # Home stays in the panel (not the window's "whole run")
    x_before = w.timeline.x_span()
    qt.keyClick(panel, Qt.Key.Key_Home)
    assert panel.index == -1 and w.timeline.x_span() == pytest.approx(x_before)
    qt.keyClick(panel, Qt.Key.Key_End)
    assert panel.index == d.n - 1
    # the map: a block under the mouse names its allocation, a click selects it
    st = panel.state
    m = panel.map
    k = 0
    s = st.segments[k]
    x0, ppb = m._geometry()
    from PySide6.QtCore import QPoint
    from vramscope.viewer.panels.allocator import ROW_GAP, ROW_H
    w_bar = max(28, s.size * ppb)
    pt = QPoint(int(x0 + w_bar * 0.5 * (3 * MiB) / s.size), 3 + k * (ROW_H + ROW_GAP) + ROW_H // 2)
    seg, blk = m.hit(pt)
    assert seg == 0 and blk >= 0 and int(st.block_addr[blk]) == s.address
    qt.mouseClick(m, Qt.MouseButton.LeftButton, pos=pt)
    assert w.selected_row == int(st.block_row[blk])


def test_a_segment_click_on_the_timeline_opens_its_blocks(qt):
    from PySide6.QtCore import QPointF, Qt
    from viewer_helpers import new_window, open_and_wait
    w = new_window(qt)
    d = open_and_wait(qt, w, str(DATA / "oom.pickle"))
    w.activateWindow()
    w.timeline.plot.setFocus()
    qt.keyClick(w.timeline.plot, Qt.Key.Key_S)
    assert w.timeline.mode == "segments"
    tl = w.timeline
    i = d.peak_index
    x = float(d.x_of_index(i))
    y = d.reserved_at(i) * 0.3
    pos = tl.plot.mapFromScene(tl.vb.mapViewToScene(QPointF(x, y)))
    qt.mouseClick(tl.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert w.docks["allocator"].isVisible()
    panel = w.allocator_panel
    assert panel.index is not None and abs(panel.index - i) < d.n // 50
    assert panel.map.highlight_segment in [s.address for s in panel.state.segments]
