"""The window's room at real sizes: the status bar, the findings and moment panels, the table's
rows at 1024x700, tabbed panels and separators (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402

from helpers import DATA, REPO, SHARED  # noqa: E402
from viewer_helpers import drag, layout_settled, new_window, open_and_wait  # noqa: E402

EXAMPLE = str(REPO / "assets" / "example.pickle")


def _dock_tab(w, title):
    """The tab bar of a group of tabbed panels and the index of the tab called `title`."""
    from PySide6.QtWidgets import QTabBar
    for bar in w.findChildren(QTabBar):
        for i in range(bar.count()):
            if bar.tabText(i).startswith(title) and bar.isVisible():
                return bar, i
    raise AssertionError(f"no tab {title!r}")


def test_status_bar_gap_and_esc_clears_the_mark_message(qt, window):
    d = open_and_wait(qt, window, EXAMPLE)
    sb = window.statusBar()
    # mark a range with a real Ctrl+drag: its instructions appear...
    tl = window.timeline
    vb = tl.vb

    def at(x):
        return tl.plot.mapFromScene(vb.mapViewToScene(QPointF(x, d.peak_bytes / 3)))
    drag(tl.plot.viewport(), at(float(d.x_of_index(500))), at(float(d.x_of_index(900))),
         modifiers=Qt.KeyboardModifier.ControlModifier)
    assert tl.marked_range() is not None
    assert sb.currentMessage().startswith("Marked entries") and "Esc to clear" in sb.currentMessage()
    # ...and go with the mark on Esc
    window.activateWindow()
    tl.plot.setFocus()
    qt.keyClick(tl.plot, Qt.Key.Key_Escape)
    assert tl.marked_range() is None and sb.currentMessage() == ""
    # a long message stops short of the file name: background pixels between them
    sb.showMessage("W" * 400)
    qt.wait(5)
    img = sb.grab().toImage()
    # (the labels that repeat the title and the toolbar have stepped aside for it)
    label = next(lb for lb in (window.status_file, window.status_device, window.status_entries, window.status_peak)
                 if lb.isVisible())
    left = label.geometry().x() + label.contentsMargins().left()       # where the label's text starts
    bg = img.pixelColor(img.width() - 1, 1)
    gap = [img.pixelColor(x, y) for x in range(left - 10, left - 1) for y in range(4, img.height() - 4)]
    assert gap and all(c == bg for c in gap)


def test_a_long_message_at_1024_pixels_is_read_whole(qt, window):
    """Ctrl+drag at 1024 pixels: "Marked entries …: press A to annotate, File > Export Trimmed
    Snapshot to save them, Esc to clear" used to end at "File > Expo", cut off by the labels.
    The file name, device and entry count step aside while it shows, and come back after."""
    window.resize(1024, 700)
    d = open_and_wait(qt, window, EXAMPLE)
    qt.wait(50)
    sb = window.statusBar()
    labels = (window.status_file, window.status_device, window.status_entries, window.status_peak)
    tl = window.timeline

    def at(x):
        return tl.plot.mapFromScene(tl.vb.mapViewToScene(QPointF(x, d.peak_bytes / 3)))
    drag(tl.plot.viewport(), at(float(d.x_of_index(500))), at(float(d.x_of_index(900))),
         modifiers=Qt.KeyboardModifier.ControlModifier)
    message = sb.currentMessage()
    assert message.endswith("Esc to clear")
    qt.wait(20)
    shown = [lb for lb in labels if lb.isVisible()]
    assert window.status_peak in shown
    # the message ends left of the first label still shown
    first_label_x = min(lb.geometry().x() for lb in shown)
    assert sb.fontMetrics().horizontalAdvance(message) <= first_label_x - 8
    assert sb.toolTip() == message
    window.activateWindow()
    tl.plot.setFocus()
    qt.keyClick(tl.plot, Qt.Key.Key_Escape)
    assert sb.currentMessage() == ""
    assert all(lb.isVisible() for lb in labels)


def test_findings_wrap_and_show_the_oom_advice(qt, window):
    d = open_and_wait(qt, window, str(DATA / "oom.pickle"))
    panel = window.findings_panel
    tree = panel.tree
    fm = tree.fontMetrics()

    def too_wide():
        """(the items' texts, the first line wider than its row: '' when none)"""
        texts = []
        stack = [(tree.topLevelItem(k), 0) for k in range(tree.topLevelItemCount())]
        while stack:
            it, depth = stack.pop()
            texts.append(it.text(0))
            avail = tree.viewport().width() - tree.indentation() * (depth + 1)
            for line in it.text(0).split("\n"):
                if fm.horizontalAdvance(line) > avail + 2:
                    return texts, line
            stack.extend((it.child(k), depth + 1) for k in range(it.childCount()))
        return texts, ""
    # the re-wrap follows the layout settling: on a loaded machine, later than any fixed wait
    try:
        qt.waitUntil(lambda: not too_wide()[1], timeout=3000)
    except AssertionError:
        pass
    texts, wide = too_wide()
    assert not wide, wide                                       # nothing cut with '…'
    import re
    # (a word too wide for a line breaks after '=', ':', ',' or '/': joined back without a space)
    flat = " ".join(re.sub(r"(?<=[=:,/])\n", "", t).replace("\n", " ") for t in texts)
    oom = next(f for f in d.findings if f.kind == "oom").subject
    from vramscope.present.words import oom_suggestions
    for advice in oom_suggestions(oom):
        assert advice.split(" (")[0][:40] in flat                     # the advice is on screen, not a tooltip
    # the finding's title and detail (the status bar joins them) name the request once
    fv = next(f for f in d.findings if f.kind == "oom")
    from vramscope.common.units import fmt_bytes
    assert fmt_bytes(oom.requested) in fv.title and f"requested {fmt_bytes(oom.requested)}" not in fv.detail
    assert not any(f"requested {fmt_bytes(oom.requested)}" in line for line in panel.detail_lines(fv))
    # narrower: the lines wrap again
    before = sum(t.count("\n") for t in texts)
    window.resizeDocks([window.docks["findings"]], [240], Qt.Orientation.Horizontal)
    qt.wait(80)
    after = []
    stack = [tree.topLevelItem(k) for k in range(tree.topLevelItemCount())]
    while stack:
        it = stack.pop()
        after.append(it.text(0))
        stack.extend(it.child(k) for k in range(it.childCount()))
    assert sum(t.count("\n") for t in after) > before


def test_moment_categories_fit_above_the_next_heading(qt, window):
    d = open_and_wait(qt, window, str(SHARED / "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle")
                      if SHARED.is_dir() else EXAMPLE)
    window.docks["moment"].raise_()
    window.moment_panel.show_index(d.peak_index)
    qt.wait(10)
    cats = window.moment_panel.cats
    n = cats.topLevelItemCount()
    assert n >= 3
    last = cats.visualItemRect(cats.topLevelItem(n - 1))
    assert last.bottom() < cats.viewport().height()                       # the last row is whole
    assert cats.verticalScrollBar().maximum() == 0


def test_layout_at_1024x700_gives_the_table_rows(qt, window):
    open_and_wait(qt, window, EXAMPLE)
    window.resize(1024, 700)
    layout_settled(qt, window)                                # the window follows (debounced)
    t = window.table_panel.table
    rows_visible = t.viewport().height() // t.verticalHeader().defaultSectionSize()
    assert rows_visible >= 7
    assert window.timeline.plot.height() >= 200
    # the right column runs the full height next to the table
    right = window.docks["selection"].geometry()
    table = window.docks["allocations"].geometry()
    assert right.left() >= table.right() and right.bottom() >= table.top()
    # every panel of the bottom area fits a 1024-pixel window, and leaves the plot its room
    for key in ("annotations", "allocator", "whatif", "allocations"):
        window.docks[key].raise_()
        qt.wait(30)
        layout_settled(qt, window)
        assert window.minimumSizeHint().width() <= 1024, key
        assert window.width() == 1024 and window.timeline.plot.height() >= 200, key
    # and at 1600x1000 the table is not squeezed either
    window.resize(1600, 1000)
    layout_settled(qt, window)
    assert t.viewport().height() // t.verticalHeader().defaultSectionSize() >= 12


def test_a_panel_raised_by_its_tab_takes_the_keys_from_the_table_it_covers(qt):
    """Clicking a row, then the Allocator's tab, then →: the allocator steps, and the table
    (behind its tab, yet still 'visible' to Qt) keeps its selection. The focus used to stay
    in the covered table, so the arrows moved an unseen selection."""
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtWidgets import QApplication
    w = new_window(qt)
    w.resize(1024, 700)
    open_and_wait(qt, w, DATA / "oom_step3.pickle")
    w.activateWindow()
    qt.waitUntil(lambda: QApplication.activeWindow() is w, timeout=2000)
    view = w.table_panel.table
    qt.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(40, view.rowHeight(0) // 2))
    row = w.selected_row
    assert row is not None and QApplication.focusWidget() is view
    bar, i = _dock_tab(w, "Allocator")
    qt.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(i).center())
    qt.waitUntil(lambda: w.on_screen("allocator") and w.allocator_panel.index is not None, timeout=2000)
    qt.wait(20)
    start = w.allocator_panel.index
    qt.keyClick(QApplication.focusWidget(), Qt.Key.Key_Right)
    assert w.allocator_panel.index == start + 1
    assert w.selected_row == row
    # and back: the table's tab gives the keys to the table
    bar, i = _dock_tab(w, "Allocations")
    qt.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(i).center())
    qt.waitUntil(lambda: w.on_screen("allocations"), timeout=2000)
    qt.wait(20)
    qt.keyClick(QApplication.focusWidget(), Qt.Key.Key_Down)
    assert w.selected_row != row and w.allocator_panel.index == start + 1


def test_panels_follow_the_window_until_a_separator_is_dragged(qt, window):
    """A stray click on the window's background does not freeze the panels' sizes; dragging
    the separator beside the right column does (the sizes the user chose then stay)."""
    open_and_wait(qt, window, EXAMPLE)
    layout_settled(qt, window)
    right = window.docks["findings"]

    def separator() -> QPoint:
        g = right.geometry()
        return QPoint(g.left() - 3, g.top() + g.height() // 2)

    qt.mouseClick(window, Qt.MouseButton.LeftButton, pos=separator())     # a click: nothing moves
    window.resize(1600, 1000)
    layout_settled(qt, window)
    wide = right.width()
    window.resize(1024, 700)
    layout_settled(qt, window)
    assert right.width() < wide                                           # the column still follows
    p = separator()
    qt.mousePress(window, Qt.MouseButton.LeftButton, pos=p)
    for dx in (-10, -30, -60):
        qt.mouseMove(window, QPoint(p.x() + dx, p.y()))
        qt.wait(10)
    qt.mouseRelease(window, Qt.MouseButton.LeftButton, pos=QPoint(p.x() - 60, p.y()))
    qt.wait(50)
    chosen = right.width()
    assert chosen > right.minimumSizeHint().width() and chosen != wide
    window.resize(1400, 900)
    layout_settled(qt, window)
    assert abs(right.width() - chosen) <= 2                               # the user's width stays


def test_a_collapsed_group_is_wrapped_when_it_is_opened(qt, window):
    """The findings of a long run (thousands of iteration peaks, collapsed beyond 20) are
    made and wrapped when their group is opened, not at every open and resize (at 10^7 events
    wrapping them all took 1.9 s of the viewer's open, making them 0.25 s); opened, every line
    fits."""
    open_and_wait(qt, window, str(DATA / "protocol2.pickle"))
    panel = window.findings_panel
    window.resizeDocks([window.docks["findings"]], [240], Qt.Orientation.Horizontal)
    qt.wait(80)
    tree = panel.tree
    group = next(tree.topLevelItem(k) for k in range(tree.topLevelItemCount())
                 if tree.topLevelItem(k).text(0).startswith("Iteration peaks"))
    assert not group.isExpanded() and group.childCount() == 0     # nothing made while closed
    group.setExpanded(True)
    qt.wait(80)
    assert group.childCount() > 20
    child = group.child(0)
    full = child.data(0, Qt.ItemDataRole.UserRole + 1)
    fm = tree.fontMetrics()
    avail = tree.viewport().width() - tree.indentation() * 2
    assert fm.horizontalAdvance(full) > avail                 # too wide for one line here
    for k in range(group.childCount()):
        it = group.child(k)
        for line in it.text(0).split("\n"):
            assert fm.horizontalAdvance(line) <= avail + 2, line
    assert "\n" in child.text(0)


def test_a_picture_taken_at_once_shows_the_findings_wrapped_at_the_panels_width(qt, window, tmp_path, monkeypatch):
    """The findings re-wrap a moment (a timer) after a resize; `--screenshot` gives the window
    its size and grabs it at once, and showed a state-only dump's findings wrapped at the width
    the panel had before (a word or two a line). `settle` wraps what is pending now, and the
    picture is taken after it."""
    from PySide6.QtGui import QFontMetrics
    from vramscope.viewer import app as app_module
    from vramscope.viewer.panels.findings import _FULL_TEXT, wrap_text
    open_and_wait(qt, window, str(DATA / "state_only_noframes.pickle"))
    panel = window.findings_panel
    tree = panel.tree
    qt.waitUntil(lambda: not panel._wrap_timer.isActive(), timeout=3000)
    items = []
    stack = [(tree.topLevelItem(k), 0) for k in range(tree.topLevelItemCount())]
    while stack:
        it, depth = stack.pop()
        if it.data(0, _FULL_TEXT) is not None:
            items.append((it, depth))
            it.setText(0, "stale")                  # as wrapped at a width the panel no longer has
        if it.isExpanded():
            stack.extend((it.child(k), depth + 1) for k in range(it.childCount()))
    assert len(items) >= 2
    panel._wrapped_width = -1
    panel._wrap_timer.start()                       # a re-wrap pending, as right after a resize
    window.settle()
    assert not panel._wrap_timer.isActive() and panel._wrapped_width == tree.viewport().width()
    width = tree.viewport().width() - 8
    for it, depth in items:
        full = it.data(0, _FULL_TEXT)
        assert it.text(0) == wrap_text(full, QFontMetrics(it.font(0)), width - tree.indentation() * (depth + 1))
    order: list = []
    monkeypatch.setattr(window, "settle", lambda: order.append("settle"))
    monkeypatch.setattr(window, "grab", lambda: order.append("grab") or tree.grab())
    app_module.render_screenshot(window, str(tmp_path / "shot.png"))
    assert order == ["settle", "grab"]


def test_rows_stepped_in_a_narrow_window_keep_the_table_and_the_selection_header(qt):
    """800x500: the table, the Findings and the Selection are tabs of one group. ↓ in the table
    used to raise the Selection over it: the table went from under the keys, the focus fell
    into the Selection, and that scrolled its header (category, size, rule) out of sight."""
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtWidgets import QApplication
    w = new_window(qt)
    w.resize(800, 500)
    open_and_wait(qt, w, DATA / "oom_step3.pickle")
    layout_settled(qt, w)
    assert w.dock_layout.narrow and w.docks["selection"] in w.tabifiedDockWidgets(w.docks["allocations"])
    w.activateWindow()
    qt.waitUntil(lambda: QApplication.activeWindow() is w, timeout=2000)
    view = w.table_panel.table
    qt.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(40, view.rowHeight(0) // 2))
    rows = [w.selected_row]
    for _ in range(3):
        qt.keyClick(QApplication.focusWidget(), Qt.Key.Key_Down)
        qt.wait(20)
        rows.append(w.selected_row)
    assert len(set(rows)) == 4                                   # every ↓ stepped to the next row...
    assert w.on_screen("allocations") and QApplication.focusWidget() is view     # ...in the table, still shown
    # the Selection, brought forward by its tab, shows the last row's header at its top
    bar, i = _dock_tab(w, "Selection")
    qt.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(i).center())
    qt.waitUntil(lambda: w.on_screen("selection"), timeout=2000)
    qt.wait(20)
    pane = w.docks["selection"].widget()
    assert pane.verticalScrollBar().value() == 0
    header = w.stack_panel.header
    assert header.isVisible() and pane.viewport().rect().contains(header.mapTo(pane.viewport(), QPoint(0, 0)))
    # chosen elsewhere (the keys on the plot, no tab beside the Selection): brought forward, at its top
    pane.verticalScrollBar().setValue(pane.verticalScrollBar().maximum())
    w.timeline.setFocus()
    w.select_row(rows[0], source="api")
    qt.waitUntil(lambda: w.on_screen("selection"), timeout=2000)
    qt.wait(20)
    assert pane.verticalScrollBar().value() == 0
