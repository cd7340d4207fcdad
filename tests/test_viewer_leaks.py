"""A leak in the viewer selects its allocations (issue 13): the table shows exactly them,
with a chip that says which and clears them, and the timeline rings where each was made."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402

from viewer_helpers import click_finding, new_window, open_and_wait  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KEEP_LOSS = REPO / "tests" / "data" / "keep_loss.pickle"


@pytest.fixture
def window(qt):
    return new_window(qt)


def table_rows(w) -> np.ndarray:
    m = w.table_panel.model
    return np.array([m.row_id(r) for r in range(m.rowCount())], dtype=np.int64)


def test_a_click_on_a_leak_shows_exactly_its_allocations_and_clear_restores_all(qt, window):
    d = open_and_wait(qt, window, str(KEEP_LOSS))
    all_rows = d.n_rows
    assert window.table_panel.model.rowCount() == all_rows
    (leak,) = d.da.leaks
    assert leak.count == 114 and len(leak.stacks) == 10
    expected = np.sort(d.da.leak_rows(leak))
    assert len(expected) == 114

    f = click_finding(qt, window, "leak")
    qt.waitUntil(lambda: window.table_panel.model.rowCount() == 114, timeout=3000)
    assert np.array_equal(np.sort(table_rows(window)), expected)
    panel = window.table_panel
    assert panel.chip.isVisible()
    assert panel.chip_label.text() == "<b>Showing the 114 allocations of the leak at train.py:180</b>"
    assert panel.count.text() == f"114 of {all_rows}"
    # the leak's newest allocation is selected, and it is in the table
    assert window.selected_row == f.row and f.row in set(expected.tolist())
    assert panel.current_row() == f.row
    # the timeline rings each of them where it was made
    marks = window.timeline.pointer.row_marks
    assert marks.isVisible() and len(marks.data) == int((d.alloc_index[expected] >= 0).sum()) > 0
    assert np.allclose(np.sort(marks.data["x"]), np.sort(d.x_of_index(d.alloc_index[expected])))

    qt.mouseClick(panel.chip_clear, Qt.MouseButton.LeftButton)
    assert not panel.chip.isVisible()
    assert window.table_panel.model.rowCount() == all_rows
    assert panel.count.text() == f"{all_rows} of {all_rows}"
    assert len(window.timeline.pointer.row_marks.data) == 0
    assert window.selected_row == f.row and panel.current_row() == f.row     # the selection stays


def test_the_leak_filter_replaces_the_others_and_goes_with_another_finding(qt, window):
    d = open_and_wait(qt, window, str(KEEP_LOSS))
    panel = window.table_panel
    panel.text.setText("no such frame anywhere")
    panel.apply_filter()
    assert panel.model.rowCount() == 0
    k = next(i for i, f in enumerate(d.findings) if f.kind == "leak")
    window.navigate(k)                        # what N does
    assert panel.model.rowCount() == 114 and panel.text.text() == ""
    # the peak is another finding: the leak's set goes, all rows come back
    window.jump_to_peak()
    assert not panel.has_only() and not panel.chip.isVisible()
    assert panel.model.rowCount() == d.n_rows
    assert len(window.timeline.pointer.row_marks.data) == 0
