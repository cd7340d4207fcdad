"""The window from the keyboard (issue 33, item 2), with real key events (pytest-qt,
offscreen): a panel's shortcut brings it forward from behind another tab and closes it only
when it is in front; Tab and Shift+Tab step between the panels (never cell by cell through a
table); a single key acts only while the timeline has the keyboard; F1 lists every key the
window binds, and only those."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtGui import QKeySequence, QShortcut  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import open_and_wait  # noqa: E402

LORA = str(DATA / "cuda_lora.pickle")
CTRL = Qt.KeyboardModifier.ControlModifier


def focused_panel(w) -> str | None:
    f = QApplication.focusWidget()
    if f is None:
        return None
    if w.timeline.isAncestorOf(f) or f is w.timeline:
        return "timeline"
    return next((k for k, d in w.docks.items() if d.isAncestorOf(f)), None)


def press(qt, key, modifier=Qt.KeyboardModifier.NoModifier):
    """A real key press to whatever has the keyboard."""
    target = QApplication.focusWidget()
    assert target is not None, "nothing has the keyboard"
    qt.keyClick(target, key, modifier)
    qt.wait(30)


def test_a_panel_shortcut_brings_a_tabbed_panel_forward_and_closes_it_only_in_front(qt, window):
    w = window
    open_and_wait(qt, w, LORA)
    w.timeline.plot.setFocus()
    press(qt, Qt.Key.Key_6, CTRL)                           # Allocator, tabbed behind the table
    qt.waitUntil(lambda: w.on_screen("allocator"), timeout=3000)
    qt.waitUntil(lambda: focused_panel(w) == "allocator", timeout=3000)
    assert not w.on_screen("memtree") and not w.docks["memtree"].isHidden()     # open, behind Allocator
    press(qt, Qt.Key.Key_7, CTRL)                           # Memory tree: brought forward, not hidden
    qt.waitUntil(lambda: w.on_screen("memtree"), timeout=3000)
    qt.waitUntil(lambda: focused_panel(w) == "memtree", timeout=3000)
    assert not w.docks["memtree"].isHidden() and w.panel_actions["memtree"].isChecked()
    press(qt, Qt.Key.Key_7, CTRL)                           # in front: now it closes
    qt.waitUntil(lambda: w.docks["memtree"].isHidden(), timeout=3000)
    assert not w.panel_actions["memtree"].isChecked()
    w.timeline.plot.setFocus()
    press(qt, Qt.Key.Key_7, CTRL)                           # closed: it opens, in front, with the keyboard
    qt.waitUntil(lambda: w.on_screen("memtree") and focused_panel(w) == "memtree", timeout=3000)
    # a panel in the right column, covered by its neighbour's tab (At this moment over Selection)
    w.docks["moment"].raise_()
    qt.waitUntil(lambda: not w.on_screen("selection"), timeout=3000)
    press(qt, Qt.Key.Key_1, CTRL)
    qt.waitUntil(lambda: w.on_screen("selection") and focused_panel(w) == "selection", timeout=3000)


def test_tab_steps_between_the_panels_and_out_of_a_table(qt, window):
    w = window
    open_and_wait(qt, w, LORA)
    w.dock_layout.show("whatif")
    qt.waitUntil(lambda: w.on_screen("whatif") and w.whatif_panel.session is not None, timeout=30000)
    table = w.whatif_panel.table
    qt.waitUntil(lambda: table.isVisible() and table.rowCount() > 1, timeout=5000)
    qt.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(20, table.rowViewportPosition(0) + 5))
    assert QApplication.focusWidget() is table
    press(qt, Qt.Key.Key_Tab)                               # out of the budget table, to the next panel
    assert focused_panel(w) not in (None, "whatif")
    # the ring: the timeline, then each panel on screen, in the View menu's order, and round again
    ring = [k for k, _ in w._panel_ring()]
    assert ring[0] == "timeline" and {"findings", "whatif"} <= set(ring)
    w.timeline.plot.setFocus()
    seen = []
    for _ in ring:
        press(qt, Qt.Key.Key_Tab)
        seen.append(focused_panel(w))
    assert seen == ring[1:] + ["timeline"]
    back = []
    for _ in ring:
        press(qt, Qt.Key.Key_Backtab, Qt.KeyboardModifier.ShiftModifier)
        back.append(focused_panel(w))
    assert back == list(reversed(ring[1:])) + ["timeline"]


def test_typed_keys_act_only_in_the_timeline(qt, window):
    """Typing `linear.py:125` into the Findings tree switched the view (L), jumped to a
    finding (N) and opened the Annotate dialog (A)."""
    w = window
    d = open_and_wait(qt, w, LORA)
    opened = []
    w.act_note_range.triggered.connect(lambda *_: opened.append("annotate"))
    # a dialog a stray key opens is closed (and counted) rather than left to block the test
    from PySide6.QtCore import QTimer
    closer = QTimer(w)
    closer.setInterval(50)

    def close_modal():
        m = QApplication.activeModalWidget()
        if m is not None and m is not w:
            opened.append(type(m).__name__)
            m.reject()
    closer.timeout.connect(close_modal)
    closer.start()
    tree = w.findings_panel.tree
    item = w.findings_panel.items[0]
    rect = tree.visualItemRect(item)
    qt.mouseClick(tree.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert QApplication.focusWidget() is tree
    pos, mode, span = w.finding_pos, w.timeline.mode, w.timeline.x_span()
    qt.keyClicks(tree, "linear.py:125 ANSCLTP+-")
    qt.wait(30)
    assert w.timeline.mode == mode and w.finding_pos == pos and not opened
    closer.stop()
    assert w.timeline.x_span() == pytest.approx(span) and w.data.time_axis == d.time_axis
    # Ctrl combinations act anywhere: Ctrl+0 shows the whole run from the tree
    w.timeline.zoom(0.25)
    qt.keyClick(tree, Qt.Key.Key_0, CTRL)
    assert w.timeline.x_span() == pytest.approx(w.timeline.x_limits())
    # in the timeline the same keys act
    w.timeline.plot.setFocus()
    press(qt, Qt.Key.Key_L)
    assert w.timeline.mode == "allocations"
    press(qt, Qt.Key.Key_C)
    assert w.timeline.mode == "categories"
    press(qt, Qt.Key.Key_N)
    assert w.finding_pos != pos
    before = w.timeline.x_span()
    press(qt, Qt.Key.Key_Home)
    assert w.timeline.x_span() == pytest.approx(w.timeline.x_limits()) or before == pytest.approx(w.timeline.x_limits())


def bound_keys(w) -> dict[str, object]:
    """Every key the window binds: its actions' (where they act) and its QShortcuts'."""
    out: dict[str, object] = {}
    for a in w.menu_actions():
        for k in a.shortcuts():
            out[k.toString(QKeySequence.SequenceFormat.NativeText)] = a
    for sc in w.findChildren(QShortcut):
        out[sc.key().toString(QKeySequence.SequenceFormat.NativeText)] = sc
    return out


def test_f1_lists_every_key_the_window_binds_and_no_other(qt, window):
    from vramscope.viewer.window.main import EXTRA_KEYS
    w = window
    open_and_wait(qt, w, LORA)
    w.timeline.plot.setFocus()
    press(qt, Qt.Key.Key_F1)
    qt.waitUntil(lambda: getattr(w, "help_box", None) is not None and w.help_box.isVisible(), timeout=3000)
    text = w.help_box.text.toPlainText()
    rows = w.shortcut_rows()
    listed = {k.strip() for keys, _ in rows for k in keys.split(" / ")}
    bound = bound_keys(w)
    # every key bound is listed...
    missing = sorted(k for k in bound if k not in listed)
    assert not missing, f"bound but not in F1: {missing}"
    # ...and every key listed that is a key combination (not a mouse gesture or a panel's own
    # key, listed in EXTRA_KEYS) is bound
    extra = {k for keys, _ in EXTRA_KEYS for k in keys.split(" / ")}
    unbound = sorted(k for k in listed - extra if k not in bound)
    assert not unbound, f"in F1 but bound to nothing: {unbound}"
    for keys, what in rows:
        assert keys in text and what in text
    # the typed keys say where they act
    assert next(what for keys, what in rows if keys.startswith("P")).endswith("(timeline focused)")
    w.help_box.accept()


def test_the_left_and_right_arrows_pan_the_timeline(qt, window):
    """F1's extra rows are real bindings too: ← / → pan the timeline when it has the keyboard."""
    w = window
    open_and_wait(qt, w, LORA)
    w.timeline.zoom(0.25)
    w.timeline.refresh_now()
    w.timeline.plot.setFocus()
    x0, _ = w.timeline.x_span()
    press(qt, Qt.Key.Key_Left)
    assert w.timeline.x_span()[0] < x0


def test_ctrl_tab_steps_through_a_panels_controls(qt, window):
    """Tab goes from panel to panel; Ctrl+Tab reaches the controls inside one (the What-if
    panel's levers)."""
    w = window
    open_and_wait(qt, w, LORA)
    w.dock_layout.show("whatif")
    panel = w.whatif_panel
    qt.waitUntil(lambda: panel.session is not None, timeout=30000)
    qt.waitUntil(lambda: w.on_screen("whatif"), timeout=5000)
    first = next(iter(panel.sliders.values()))
    first.setFocus()
    qt.waitUntil(first.hasFocus, timeout=3000)
    seen = set()
    for _ in range(30):
        press(qt, Qt.Key.Key_Tab, CTRL)
        f = QApplication.focusWidget()
        seen.add(f)
        if f in panel.levers.values():
            break
    assert any(cb in seen for cb in panel.levers.values()), "Ctrl+Tab never reached a lever"
    assert focused_panel(w) == "whatif"


def test_down_from_the_search_goes_on_to_the_rows_it_kept(qt, window):
    """Ctrl+F, a few letters, ↓: the table has the keyboard on the first row kept (selected,
    as a click selects it), the filter applied at once; ↓ again steps to the next row. Before,
    ↓ did nothing in the field and only Tab, Tab reached the table."""
    w = window
    d = open_and_wait(qt, w, LORA)
    w.activateWindow()
    qt.waitUntil(w.isActiveWindow, timeout=5000)
    panel = w.table_panel
    press(qt, Qt.Key.Key_F, CTRL)
    assert QApplication.focusWidget() is panel.text
    for ch in "lora":
        qt.keyClick(panel.text, ch)
    press(qt, Qt.Key.Key_Down)
    assert QApplication.focusWidget() is panel.table
    assert not panel._timer.isActive() and panel.model.rowCount() < d.n_rows      # filtered, now
    first = panel.model.row_id(0)
    assert w.selected_row == first and panel.current_row() == first
    press(qt, Qt.Key.Key_Down)
    assert w.selected_row == panel.model.row_id(1) != first
