"""Qt fixtures for the viewer tests: offscreen, Qt warnings fail, no window may outlive its test."""
from __future__ import annotations

import gc
import os

import pytest

import vramscope.viewer  # noqa: F401  (first: works around PySide6's None/True/False refcounts on 3.11)

# before any QApplication exists (pytest-qt creates it lazily, in the `qapp` fixture)
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# Said by the offscreen platform plugin whenever a window is shown: not a defect of ours.
QT_NOISE = ("This plugin does not support propagateSizeHints()",)


class _QtMessages:
    """Records Qt warnings, criticals and fatals (debug and info pass)."""

    def __init__(self):
        self.records: list[str] = []

    def __call__(self, mode, context, message):
        from PySide6.QtCore import QtMsgType
        if mode in (QtMsgType.QtDebugMsg, QtMsgType.QtInfoMsg) or message in QT_NOISE:
            return
        self.records.append(f"{mode.name}: {message}")


def _top_levels():
    from PySide6.QtWidgets import QApplication
    import shiboken6
    return {shiboken6.getCppPointer(w)[0]: w for w in QApplication.topLevelWidgets()}


def _flush(app):
    from PySide6.QtCore import QCoreApplication, QEvent
    for _ in range(3):
        app.processEvents()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        gc.collect()


@pytest.fixture
def qt(qapp, qtbot):
    """qtbot, with Qt warnings turned into failures and a check that every top-level
    widget the test created is gone once it is closed."""
    from PySide6.QtCore import qInstallMessageHandler
    messages = _QtMessages()
    qInstallMessageHandler(messages)
    before = set(_top_levels())
    try:
        yield qtbot
        # pytest-qt closes the widgets given to qtbot.addWidget before this runs
        qInstallMessageHandler(messages)     # pytest-qt's log capture may have replaced ours
        _flush(qapp)
        leaked = {k: w for k, w in _top_levels().items() if k not in before}
        names = sorted(f"{type(w).__name__}({w.objectName() or w.windowTitle()!r})" for w in leaked.values())
        for w in leaked.values():
            w.close()
            w.deleteLater()
        _flush(qapp)
        assert not messages.records, "Qt warnings:\n  " + "\n  ".join(messages.records)
        assert not names, f"top-level widgets left alive: {', '.join(names)}"
    finally:
        qInstallMessageHandler(None)


@pytest.fixture
def window(qt):
    """A shown 1400x900 main window that remembers nothing and caches nothing
    (viewer_helpers.new_window); a test file may define its own."""
    from viewer_helpers import new_window
    return new_window(qt)
