"""Shared by the viewer tests: a main window as the user sees it, opening a file in it, and real
input events (a header click, a drag with the button held, a key to a focused widget)."""
from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtWidgets import QApplication

LOAD_TIMEOUT = 60_000


def new_window(qt):
    """A shown 1400x900 main window that remembers nothing and caches nothing."""
    from vramscope.viewer.app import make_app
    from vramscope.viewer.window import MainWindow
    make_app()
    w = MainWindow(persist=False, use_cache=False)
    qt.addWidget(w)
    w.resize(1400, 900)
    w.show()
    qt.waitExposed(w)
    # the window takes the keyboard (offscreen activation is asynchronous: shortcuts need it)
    w.activateWindow()
    qt.waitUntil(w.isActiveWindow, timeout=5000)
    return w


def open_and_wait(qt, w, path, device=None):
    with qt.waitSignal(w.loaded, timeout=LOAD_TIMEOUT):
        w.open_path(path, device)
    qt.wait(1)
    if w.isVisible() and not w.isActiveWindow():       # the progress dialog had the keyboard
        w.activateWindow()
        qt.waitUntil(w.isActiveWindow, timeout=5000)
    return w.data


def header_click(qt, table, column: int):
    """A real click on a column's header section."""
    hh = table.horizontalHeader()
    pos = QPoint(hh.sectionViewportPosition(column) + hh.sectionSize(column) // 2, hh.height() // 2)
    qt.mouseClick(hh.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def drag(widget, start: QPoint, end: QPoint, steps: int = 10, modifiers=Qt.KeyboardModifier.NoModifier,
         button=Qt.MouseButton.LeftButton):
    """A real press, moves (with the button held: QTest's mouseMove carries no buttons)
    and release on `widget`."""
    from PySide6.QtCore import QEvent
    from PySide6.QtGui import QMouseEvent

    def send(kind, pos, btn, buttons):
        p = QPointF(pos)
        QApplication.sendEvent(widget, QMouseEvent(kind, p, QPointF(widget.mapToGlobal(pos)), btn, buttons,
                                                   modifiers))
    send(QEvent.Type.MouseButtonPress, start, button, button)
    for k in range(1, steps + 1):
        send(QEvent.Type.MouseMove, start + (end - start) * (k / steps), Qt.MouseButton.NoButton, button)
    send(QEvent.Type.MouseButtonRelease, end, button, Qt.MouseButton.NoButton)


def focus_key(qt, w, widget, key, modifier=Qt.KeyboardModifier.NoModifier):
    w.activateWindow()
    widget.setFocus()
    qt.keyClick(widget, key, modifier)


def click_finding(qt, w, kind: str):
    """A real click on the first finding of `kind` in the Findings panel."""
    d = w.data
    k = next(i for i, f in enumerate(d.findings) if f.kind == kind)
    panel = w.findings_panel
    item = next(it for it in panel.items if it.data(0, Qt.ItemDataRole.UserRole) == k)
    panel.tree.scrollToItem(item)
    rect = panel.tree.visualItemRect(item)
    assert rect.isValid() and not rect.isEmpty()
    qt.mouseClick(panel.tree.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    return d.findings[k]


def layout_settled(qt, w, timeout: int = 5000):
    """Wait until the window's panels have followed its size: the relayout and the plot's-room
    checks are debounced and look again once their sizes are laid out (a fixed wait of 120 ms
    was too short on a loaded machine: plot 38 or 137 pixels, the layout half done)."""
    dl = w.dock_layout
    qt.wait(1)
    qt.waitUntil(lambda: not (dl._relayout.isActive() or dl._guard.isActive() or w.screen_fit._check.isActive()),
                 timeout=timeout)
    qt.wait(10)
