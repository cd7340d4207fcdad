"""The allocations table in a real window: sorting keeps the selected allocation highlighted, the
frame search finds what the Where column shows (pytest-qt, offscreen)."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402

from helpers import GROUNDTRUTH, REPO  # noqa: E402
from viewer_helpers import focus_key, header_click, open_and_wait  # noqa: E402

EXAMPLE = str(REPO / "assets" / "example.pickle")


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


def test_opening_a_file_clears_the_search_and_a_filter_says_so_with_a_clear_button(qt, window):
    """Issue 33, item 4: a search typed on one file stayed when another opened ("0 of 1,211",
    no sign of a filter). Real typing and clicks."""
    from helpers import DATA
    panel = window.table_panel
    open_and_wait(qt, window, str(DATA / "cuda_lora.pickle"))
    window.timeline.plot.setFocus()
    qt.keyClick(window.timeline.plot, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert panel.text.hasFocus()
    qt.keyClicks(panel.text, "no_such_frame_anywhere.py")
    qt.waitUntil(lambda: len(panel.model.view.rows) == 0, timeout=3000)
    assert panel.count.text().startswith("<b>filtered:</b> 0 of") and panel.clear_filters.isVisible()
    d = open_and_wait(qt, window, str(DATA / "cuda_oom.pickle"))
    assert panel.text.text() == "" and panel.min_size.text() == ""
    assert len(panel.model.view.rows) == d.n_rows and not panel.clear_filters.isVisible()
    assert panel.count.text() == f"{d.n_rows:,} of {d.n_rows:,}"
    # a filter on: said, and one click clears it
    qt.mouseClick(panel.min_size, Qt.MouseButton.LeftButton)
    qt.keyClicks(panel.min_size, "1 GiB")
    qt.waitUntil(lambda: panel.clear_filters.isVisible(), timeout=3000)
    assert len(panel.model.view.rows) < d.n_rows
    qt.mouseClick(panel.clear_filters, Qt.MouseButton.LeftButton)
    assert panel.min_size.text() == "" and len(panel.model.view.rows) == d.n_rows
    assert not panel.clear_filters.isVisible()
