"""Read whole, at every size (issue 33, items 6, 11 and 12), pytest-qt offscreen with real
input events: a layout is marked hand-sized only by a drag; the selected finding scrolls into
view; the Selection pane shows the whole "how sure" line and five frames at 1024x700; a deep
memory-tree path keeps its file and line; text that carries a finding or advice has a
contrast of 4.5:1 at least; cut text ends with an ellipsis and reads whole in its tooltip."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QEvent, QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QMouseEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import open_and_wait  # noqa: E402

LORA = str(DATA / "cuda_lora.pickle")
LEAK = str(DATA / "cuda_leak.pickle")


def separator(w) -> QPoint:
    """A point on the separator between the timeline and the panels under it."""
    c, d = w.centralWidget().geometry(), w.docks["allocations"].geometry()
    p = QPoint(c.center().x(), (c.bottom() + d.top()) // 2)
    assert w.childAt(p) is None, "not on the separator"
    return p


def send(widget, kind, pos: QPoint, button, buttons):
    QApplication.sendEvent(widget, QMouseEvent(kind, QPointF(pos), QPointF(widget.mapToGlobal(pos)), button, buttons,
                                               Qt.KeyboardModifier.NoModifier))


def test_a_layout_is_hand_sized_only_by_a_drag_of_a_separator(qt, window):
    w = window
    open_and_wait(qt, w, LORA)
    qt.wait(100)
    layout = w.dock_layout
    assert not layout.user_layout
    # a press and a release with no drag between, the panels resized meanwhile (a file
    # loaded by the click, a panel brought forward): not the user's sizes
    left = Qt.MouseButton.LeftButton
    # a press on a label (it ignores it: the press reaches the window), the panels resized
    # before the release (the window made smaller, as a file loaded or a panel brought
    # forward does): not the user's sizes
    label = w.findings_panel.summary
    qt.mousePress(label, left, pos=QPoint(5, 5))
    sizes = layout._sizes()
    w.resize(w.width() - 200, w.height() - 100)
    qt.wait(150)
    assert layout._sizes() != sizes
    qt.mouseRelease(label, left, pos=QPoint(5, 5))
    assert not layout.user_layout
    w.resize(w.width() + 200, w.height() + 100)
    qt.wait(150)
    # a real drag of the separator: the user's sizes, kept
    p = separator(w)
    send(w, QEvent.Type.MouseButtonPress, p, left, left)
    qt.wait(50)
    heights = []
    for k in range(1, 9):                    # (QMainWindow moves a separator on a timer: waits between)
        send(w, QEvent.Type.MouseMove, p + QPoint(0, -10 * k), Qt.MouseButton.NoButton, left)
        qt.wait(10)
        heights.append(w.docks["allocations"].height())
    send(w, QEvent.Type.MouseButtonRelease, p + QPoint(0, -80), left, Qt.MouseButton.NoButton)
    qt.wait(50)
    assert w.docks["allocations"].height() >= heights[0] + 60, heights
    assert layout.user_layout
