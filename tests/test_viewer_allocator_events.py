"""The Allocator panel with the allocator's history of events (issue 22), driven by real
clicks and keys (pytest-qt, offscreen): a segment clicked (on the timeline or in the map)
scrolls into view and leaves the keys stepping the allocator; the map's header names the
event at the current entry; the event list is in step with the map and the timeline."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from viewer_helpers import new_window, open_and_wait  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
OOM = DATA / "oom.pickle"                   # 99 segments at its peak: the map scrolls


def show_allocator(qt, w):
    w.dock_layout.show("allocator")
    qt.waitUntil(lambda: w.on_screen("allocator") and w.allocator_panel.index is not None, timeout=3000)
    return w.allocator_panel


def segment_visible(panel, address: int) -> bool:
    """The segment's row lies inside the scroll area's viewport."""
    r = panel.map.segment_rect(address)
    assert r is not None
    top = panel.scroll.verticalScrollBar().value()
    return top <= r.top() and r.bottom() <= top + panel.scroll.viewport().height()


def click_timeline(qt, w, i: int, y: float):
    tl = w.timeline
    pos = tl.plot.mapFromScene(tl.vb.mapViewToScene(QPointF(float(w.data.x_of_index(i)), y)))
    qt.mouseClick(tl.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def key(qt, k, mod=Qt.KeyboardModifier.NoModifier):
    """A key where the keyboard is (as a user types it)."""
    target = QApplication.focusWidget()
    assert target is not None
    qt.keyClick(target, k, mod)


def test_a_segment_clicked_on_the_timeline_scrolls_into_view_and_the_keys_step_at_once(qt, window):
    w = window
    d = open_and_wait(qt, w, str(OOM))
    panel = show_allocator(qt, w)
    w.timeline.plot.setFocus()
    key(qt, Qt.Key.Key_S)
    assert w.timeline.mode == "segments"
    i = d.peak_index - 5
    scrolled = []
    for frac in (0.05, 0.25, 0.5, 0.75, 0.95):
        click_timeline(qt, w, i, d.reserved_at(i) * frac)
        addr = panel.map.highlight_segment
        assert addr in [s.address for s in panel.state.segments]
        qt.waitUntil(lambda a=addr: segment_visible(panel, a), timeout=2000)
        scrolled.append(panel.scroll.verticalScrollBar().value())
    assert max(scrolled) > 0, "no click needed the map scrolled: the test shows nothing"
    # the keys step the allocator straight after the click (the panel has the keyboard)
    assert panel.hasFocus()
    start = panel.index
    key(qt, Qt.Key.Key_Right)
    assert panel.index == start + 1 and w.pinned_index == start + 1
    from vramscope.classifiers.events import next_segment_event
    key(qt, Qt.Key.Key_Right, Qt.KeyboardModifier.ControlModifier)
    nxt = next_segment_event(d.da, start + 1, 1)
    assert nxt > start + 1 and panel.index == nxt
    key(qt, Qt.Key.Key_PageDown)
    assert panel.index == min(nxt + 100, d.n - 1)
    assert w.timeline.cursor_line.value() == pytest.approx(float(d.x_of_index(panel.index)))
    # past the last segment event, Ctrl+→ stays and says why
    last = int(np.max(np.flatnonzero(np.isin(np.asarray(d.da.snapshot.trace(d.device).columns["action"]),
                                             [d.da.snapshot.action_names.index(a) for a in
                                              ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
                                              if a in d.da.snapshot.action_names]))))
    panel.go(last)
    key(qt, Qt.Key.Key_Right, Qt.KeyboardModifier.ControlModifier)
    assert panel.index == last and "No segment event after this entry" in w.statusBar().currentMessage()


def test_selecting_an_allocation_scrolls_the_map_to_its_segment(qt, window):
    w = window
    d = open_and_wait(qt, w, str(OOM))
    panel = show_allocator(qt, w)
    i = d.peak_index
    st = d.analysis.allocator(d.device).state_at(i)
    viewport_rows = panel.scroll.viewport().height() // 19
    # a point on the timeline (stacked by category) whose allocation lives in a segment below the fold
    visible = list(range(d.n_categories))
    target = None
    for frac in np.linspace(0.02, 0.98, 60):
        y = d.live_at(i) * float(frac)
        row, _ = d.allocation_at_index(i, y, visible)
        if row < 0:
            continue
        blocks = np.flatnonzero(st.block_row == row)
        if not len(blocks):
            continue
        k = next(k for k, s in enumerate(st.segments) if s.first_block <= blocks[0] < s.first_block + s.n_blocks)
        if k > viewport_rows + 2:
            target = (y, row, st.segments[k].address)
            break
    assert target is not None
    y, row, addr = target
    assert panel.scroll.verticalScrollBar().value() == 0 and not segment_visible(panel, addr)
    click_timeline(qt, w, i, y)
    assert w.selected_row == row and abs(panel.index - i) <= 2          # the pixel's entry
    addr = panel.map.segment_of_row(row)
    assert addr >= 0 and panel.map.highlight_segment == addr
    qt.waitUntil(lambda: segment_visible(panel, addr), timeout=2000)
    assert panel.scroll.verticalScrollBar().value() > 0


def test_a_segment_clicked_in_the_map_is_outlined_and_keeps_the_keys(qt, window):
    w = window
    d = open_and_wait(qt, w, str(OOM))
    panel = show_allocator(qt, w)
    m = panel.map
    st = panel.state
    k = 3
    s = st.segments[k]
    x0, ppb = m._geometry()
    from vramscope.viewer.panels.allocator import ROW_GAP, ROW_H
    # the segment's label (no block there): outlined, nothing selected
    pos = QPoint(20, 3 + k * (ROW_H + ROW_GAP) + ROW_H // 2)
    w.table_panel.setFocus()
    qt.mouseClick(m, Qt.MouseButton.LeftButton, pos=pos)
    assert m.highlight_segment == s.address
    assert panel.hasFocus()
    start = panel.index
    key(qt, Qt.Key.Key_Left)
    assert panel.index == start - 1
    key(qt, Qt.Key.Key_PageUp)
    assert panel.index == max(start - 101, -1)


def test_the_header_names_the_event_at_the_current_entry(qt, window):
    from vramscope.common.units import fmt_bytes
    from vramscope.present.events import addr_text, event_header, event_rows
    w = window
    d = open_and_wait(qt, w, str(DATA / "cuda_lora.pickle"))
    panel = show_allocator(qt, w)
    i = d.peak_index
    assert panel.index == i
    (ev,) = event_rows(d.da, d.stacks, i, i + 1)
    text = panel.event_label.text()
    assert text == event_header(d.da, d.stacks, i)
    assert text.startswith(f"entry {i:,}: {ev.action} ") and addr_text(ev.addr) in text
    assert ev.where and text.endswith(f", {ev.where}") and fmt_bytes(ev.size) in text
    panel.setFocus()
    key(qt, Qt.Key.Key_Right)
    (ev2,) = event_rows(d.da, d.stacks, i + 1, i + 2)
    assert panel.event_label.text().startswith(f"entry {i + 1:,}: {ev2.action}")


def row_center(view, r: int) -> QPoint:
    idx = view.model().index(r, 1)
    view.scrollTo(idx)
    rect = view.visualRect(idx)
    assert rect.isValid() and not rect.isEmpty()
    return rect.center()


def test_the_event_list_moves_the_entry_and_follows_it(qt, window):
    w = window
    d = open_and_wait(qt, w, str(OOM))
    panel = show_allocator(qt, w)
    ev = panel.events
    assert ev.model().rowCount() == d.n
    # the list opens on the current entry (the peak)
    assert ev.currentIndex().row() == d.peak_index
    # a click on an event: the map, the timeline's cursor and the moment follow
    target = 200
    qt.mouseClick(ev.viewport(), Qt.MouseButton.LeftButton, pos=row_center(ev, target))
    assert panel.index == target and panel.state.index == target
    assert w.pinned_index == target
    assert w.timeline.cursor_line.value() == pytest.approx(float(d.x_of_index(target)))
    assert panel.event_label.text().startswith(f"entry {target:,}:")
    # ↓ in the list: the next event; → there steps too
    key(qt, Qt.Key.Key_Down)
    assert panel.index == target + 1
    key(qt, Qt.Key.Key_Right)
    assert panel.index == target + 2 and ev.currentIndex().row() == target + 2
    # the entry moved elsewhere (a click on the timeline): the list selects it and shows it
    j = d.n - 40
    click_timeline(qt, w, j, 1.0)
    assert abs(panel.index - j) <= 2                  # the pixel's entry
    j = panel.index
    assert ev.currentIndex().row() == j and ev.selectionModel().isRowSelected(j)
    rect = ev.visualRect(ev.model().index(j, 0))
    assert ev.viewport().rect().contains(rect.center())
    # the rows say what the analysis says
    from vramscope.present.events import addr_text, event_rows
    (row,) = event_rows(d.da, d.stacks, j, j + 1)
    m = ev.model()
    from vramscope.common.units import fmt_bytes
    from vramscope.viewer.panels.events import COLUMNS
    said = {COLUMNS[c]: m.index(j, c).data() for c in range(len(COLUMNS))}
    assert said["Entry"] == f"{j:,}" and said["Action"] == row.action and said["Where"] == row.where
    assert said["Size"] == (fmt_bytes(row.size) if row.size else "")
    assert said["Address"] == (addr_text(row.addr) if row.addr else "")
    assert said["Category"].startswith(row.category) and said["Stream"] == str(row.stream)
