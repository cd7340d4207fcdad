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
from viewer_helpers import layout_settled, open_and_wait  # noqa: E402

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


def at_1024x700(qt, w):
    w.resize(1024, 700)
    qt.wait(50)
    layout_settled(qt, w)


def test_the_finding_navigated_to_is_scrolled_into_view_at_1024x700(qt, window):
    """A selected leak stayed scrolled out of view (scrollToItem did nothing on tall wrapped
    rows). N in the timeline steps through every finding: each one's title is in view."""
    w = window
    at_1024x700(qt, w)
    d = open_and_wait(qt, w, LEAK)
    tree = w.findings_panel.tree
    assert any(f.kind == "leak" for f in d.findings)
    w.timeline.plot.setFocus()
    for _ in range(len(d.findings)):
        qt.keyClick(w.timeline.plot, Qt.Key.Key_N)
        qt.wait(60)
        cur = tree.currentItem()
        assert cur is not None and cur.data(0, Qt.ItemDataRole.UserRole) == w.finding_pos
        rect = tree.visualItemRect(cur)
        view = tree.viewport().rect()
        assert view.contains(rect.topLeft()) and rect.top() >= 0, (w.finding_pos, rect, view)
        # the rows wrap again (the column narrower, every row taller): it stays in view
        w.resizeDocks([w.docks["findings"]], [w.docks["findings"].width() - 40], Qt.Orientation.Horizontal)
        qt.wait(120)
        rect = tree.visualItemRect(cur)
        assert tree.viewport().rect().contains(rect.topLeft()), ("after the re-wrap", w.finding_pos, rect)
        w.resizeDocks([w.docks["findings"]], [w.docks["findings"].width() + 40], Qt.Orientation.Horizontal)
        qt.wait(120)
    assert tree.verticalScrollMode() == tree.ScrollMode.ScrollPerPixel


def test_the_selection_pane_shows_how_sure_whole_and_five_frames_at_1024x700(qt, window):
    import numpy as np
    w = window
    at_1024x700(qt, w)
    d = open_and_wait(qt, w, str(DATA / "qlora_4bit.pickle"))
    # the Findings above it grown (a finding opened, a long OOM diagnosis): the pane squeezed
    col = w.docks["findings"].height() + w.docks["selection"].height()
    w.resizeDocks([w.docks["findings"], w.docks["selection"]], [col - 120, 120], Qt.Orientation.Vertical)
    qt.wait(100)
    assert w.docks["selection"].height() < 200
    # the largest activation, chosen with a real click on its row in the table
    acts = np.flatnonzero(d.category == d.categories.index("activations"))
    row = int(acts[np.argmax(d.allocs.size[acts])])
    panel = w.table_panel
    idx = panel.model.index(panel.model.view.position_of(row), 0)
    panel.table.scrollTo(idx)
    qt.mouseClick(panel.table.viewport(), Qt.MouseButton.LeftButton, pos=panel.table.visualRect(idx).center())
    qt.wait(150)
    assert w.selected_row == row and w.on_screen("selection")
    pane = w.stack_panel
    header = pane.header
    assert "how sure:" in header.text()
    # the header whole: as tall as its wrapped text needs, nothing cut
    assert header.height() >= header.heightForWidth(header.width()) - 1
    scroll = w.docks["selection"].widget()
    assert scroll.verticalScrollBar().value() == 0 and header.geometry().bottom() <= scroll.viewport().height()
    # five frames (two lines each) in the frames' view, the rest scrolls
    frames = pane.frames
    lines = frames.viewport().height() // frames.fontMetrics().lineSpacing()
    assert lines >= 10, lines
    assert frames.toPlainText().count("\n") >= 10


def test_cut_text_ends_with_an_ellipsis_and_reads_whole_in_its_tooltip(qt, window, monkeypatch):
    from vramscope.viewer.panels.elide import KeepWhereDelegate, elide_keeping_where
    from PySide6.QtWidgets import QStyleOptionViewItem
    w = window
    w.resize(800, 500)
    d = open_and_wait(qt, w, str(DATA / "qlora_4bit.pickle"))
    # the status bar: a message too long for it ends with "…", the tooltip has it whole
    sb = w.statusBar()
    long = "Try: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and gradient checkpointing " * 3
    sb.showMessage(long)
    qt.wait(20)
    shown = sb.shown_text()
    assert shown.endswith("…") and long.startswith(shown[:-1]) and sb.toolTip() == long
    assert sb.fontMetrics().horizontalAdvance(shown) <= sb.message_rect().width()
    sb.grab()                                                     # (drawn through our paintEvent)
    sb.clearMessage()
    # a deep code path keeps its file and line: "for…25)" no more
    fm = w.fontMetrics()
    text = "forward_with_a_rather_long_function_name  (modeling_llama.py:125)"
    cut = elide_keeping_where(text, fm, fm.horizontalAdvance(text) // 2 + 10)
    assert cut.endswith("(modeling_llama.py:125)") and "…" in cut
    w.dock_layout.show("memtree")
    qt.waitUntil(lambda: w.memtree_panel.tree is not None, timeout=10000)
    view = w.memtree_panel.view
    model = view.model()
    view.expandAll()
    qt.wait(50)
    delegate = view.itemDelegateForColumn(0)
    assert isinstance(delegate, KeepWhereDelegate)
    checked = 0
    stack = [model.index(r, 0) for r in range(model.rowCount())]
    while stack and checked < 200:
        ix = stack.pop()
        stack.extend(model.index(r, 0, ix) for r in range(model.rowCount(ix)))
        full = model.data(ix)
        if "  (" not in full:
            continue
        opt = QStyleOptionViewItem()
        opt.initFrom(view)
        opt.rect = view.visualRect(ix)
        opt.widget = view
        delegate.initStyleOption(opt, ix)
        tail = full.rpartition("  (")[2]
        if opt.text != full and opt.rect.width() > fm.horizontalAdvance("(" + tail) * 1.5:
            assert opt.text.endswith("(" + tail) and "…" in opt.text, (full, opt.text)
        checked += 1
    assert checked


def test_a_note_uses_the_width_it_has(qt, window, tmp_path):
    """A note's first line was cut at 60 characters with 400 pixels free."""
    import shutil
    from vramscope.services.annotations import Annotation
    w = window
    path = tmp_path / "run.pickle"                 # (the notes go beside it: not into tests/data)
    shutil.copy(DATA / "cuda_lora.pickle", path)
    d = open_and_wait(qt, w, str(path))
    text = "the loss spikes here after the learning rate warm-up ends, before the optimizer step of step 3"
    w.notes.store.add(Annotation(kind="peak", device=d.device, index=d.peak_index, note=text))
    w.notes.refresh() if hasattr(w.notes, "refresh") else None
    w.dock_layout.show("annotations")
    qt.waitUntil(lambda: w.notes_panel.count() >= 1, timeout=5000)
    it = w.notes_panel.item(w.notes_panel.count() - 1)
    assert it.text(2) == text and text in it.toolTip(2)
