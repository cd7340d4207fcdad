"""Shared by the viewer tests: a main window as the user sees it, and opening a file in it."""
from __future__ import annotations

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
