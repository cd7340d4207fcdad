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


def color_in(sheet: str):
    import re
    from PySide6.QtGui import QColor
    return QColor(re.search(r"color:\s*(#[0-9a-fA-F]{6})", sheet).group(1))


def test_text_that_carries_a_finding_or_advice_reads_at_4_5_to_1(qt, window):
    """WCAG AA, computed from the palette: "★ look here first: it ran out of memory" was
    #C3C3C3 on #EFEFEF (1.5:1), the Findings' OOM diagnosis and next steps 3.4:1, the Ranks
    hint the same grey."""
    from PySide6.QtGui import QPalette
    from vramscope.viewer.theme import (FITS_COLOR, LEAK_COLOR, OOM_COLOR, PEAK_COLOR, SHORT_COLOR, TEXT_CONTRAST,
                                        WHATIF_COLOR, contrast, muted_text, over, readable)
    from vramscope.viewer.ranks_view import RanksView
    w = window
    open_and_wait(qt, w, str(DATA / "multi_device_oom.pickle"))
    pal = w.palette()
    window_bg, base_bg = pal.color(QPalette.ColorRole.Window), pal.color(QPalette.ColorRole.Base)
    # the device overview's note and its OOM device
    strip = w.device_strip
    assert strip.isVisible() and "look here first" in strip.note.text()
    assert contrast(color_in(strip.note.styleSheet()), window_bg) >= TEXT_CONTRAST
    for b in strip.buttons.values():
        if b.styleSheet():
            assert contrast(color_in(b.styleSheet()), b.palette().color(QPalette.ColorRole.Button)) >= TEXT_CONTRAST
    # every line of the Findings (the OOM's diagnosis and next steps included)
    tree = w.findings_panel.tree
    stack = [tree.topLevelItem(k) for k in range(tree.topLevelItemCount())]
    seen = 0
    while stack:
        it = stack.pop()
        fg = it.foreground(0).color() if it.foreground(0).style() != Qt.BrushStyle.NoBrush else \
            pal.color(QPalette.ColorRole.Text)
        assert contrast(over(fg, base_bg), base_bg) >= TEXT_CONTRAST, it.text(0)
        assert it.flags() & Qt.ItemFlag.ItemIsEnabled, it.text(0)       # (disabled grey is 1.9:1)
        seen += 1
        stack.extend(it.child(k) for k in range(it.childCount()))
    assert seen > 5
    # the Ranks hint
    view = RanksView(w)
    assert contrast(color_in(view.hint.styleSheet()), view.palette().color(QPalette.ColorRole.Window)) >= TEXT_CONTRAST
    view.deleteLater()
    # the timeline's words: the peak, the OOM marker
    tl = w.timeline
    assert contrast(tl.peak_label.color, tl.theme.background) >= TEXT_CONTRAST
    for ln in tl.marker_lines:
        assert contrast(ln.label.color, tl.theme.background) >= TEXT_CONTRAST
    # and on a dark palette as on a light one: every colour a finding or advice is written in
    dark = QPalette(pal)
    for role, c in ((QPalette.ColorRole.Window, "#2b2b2b"), (QPalette.ColorRole.Base, "#1e1e1e"),
                    (QPalette.ColorRole.Text, "#e6e6e6"), (QPalette.ColorRole.WindowText, "#e6e6e6"),
                    (QPalette.ColorRole.Button, "#353535")):
        from PySide6.QtGui import QColor
        dark.setColor(role, QColor(c))
    for p in (pal, dark):
        for role in (QPalette.ColorRole.Base, QPalette.ColorRole.Window):
            bg = p.color(role)
            assert contrast(muted_text(p, role), bg) >= TEXT_CONTRAST
            for c in (PEAK_COLOR, OOM_COLOR, LEAK_COLOR, WHATIF_COLOR, FITS_COLOR, SHORT_COLOR):
                assert contrast(readable(c, bg), bg) >= TEXT_CONTRAST, (c, bg.name())
