"""Writing a note in a real window: the note dialog's keys, wrapping and title, and one hover box
over a note on the timeline (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from helpers import REPO  # noqa: E402
from viewer_helpers import open_and_wait  # noqa: E402

EXAMPLE = str(REPO / "assets" / "example.pickle")


@pytest.fixture
def copy_of_example(tmp_path, monkeypatch):
    import shutil
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "userdata"))
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    p = tmp_path / "example.pickle"
    shutil.copyfile(EXAMPLE, p)
    return str(p)


def on_dialog(qt, then):
    """Run `then(dialog)` on the next modal dialog once it is shown (exec() blocks the test)."""
    from PySide6.QtCore import QTimer
    seen = []

    def poll():
        dlg = QApplication.activeModalWidget()
        if dlg is None or not dlg.isVisible():
            QTimer.singleShot(10, poll)
            return
        seen.append(dlg)
        try:
            then(dlg)
        except BaseException as e:       # never leave a modal dialog up: the test would hang
            seen.append(e)
        finally:
            if dlg.isVisible() and seen[-1] is not dlg:
                dlg.reject()
    QTimer.singleShot(0, poll)
    return seen


def annotate_peak(qt, window):
    """Shift+P on the timeline, as a user presses it (the window active again after a dialog)."""
    window.activateWindow()
    window.timeline.plot.setFocus()
    qt.waitUntil(lambda: window.isActiveWindow(), timeout=2000)
    qt.keyClick(window.timeline.plot, Qt.Key.Key_P, Qt.KeyboardModifier.ShiftModifier)


def test_note_dialog_keys_wrap_and_title(qt, window, copy_of_example):
    from vramscope.viewer.window.dialogs import NoteDialog
    open_and_wait(qt, window, copy_of_example)

    def type_and_save(dlg):
        assert isinstance(dlg, NoteDialog)
        assert dlg.edit.lineWrapMode() == dlg.edit.LineWrapMode.WidgetWidth
        # the whole title fits: the dialog is wider than the title's text
        assert dlg.width() > dlg.fontMetrics().horizontalAdvance(dlg.windowTitle()) + 100
        dlg.edit.setFocus()
        qt.keyClick(dlg.edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
        qt.keyClicks(dlg.edit, "first line")
        qt.keyClick(dlg.edit, Qt.Key.Key_Return)                  # plain Return: a new line
        qt.keyClicks(dlg.edit, "second")
        qt.keyClick(dlg.edit, Qt.Key.Key_Tab)                     # Tab: focus moves on, no tab typed
        assert "\t" not in dlg.text() and not dlg.edit.hasFocus()
        dlg.edit.setFocus()
        qt.keyClick(dlg.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)   # saves
    seen = on_dialog(qt, type_and_save)
    annotate_peak(qt, window)
    assert len(seen) == 1, seen
    notes = list(window.notes.store)
    assert [n.note for n in notes] == ["first line\nsecond"]

    # Ctrl+Enter (the main keyboard's Enter reads Return; the keypad's is Enter) saves too
    def keypad(dlg):
        qt.keyClicks(dlg.edit, "keypad")
        qt.keyClick(dlg.edit, Qt.Key.Key_Enter, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.KeypadModifier)
    seen = on_dialog(qt, keypad)
    annotate_peak(qt, window)
    assert len(seen) == 1, seen
    assert [n.note for n in window.notes.store][-1] == "keypad"

    # Esc cancels: nothing added
    def cancel(dlg):
        qt.keyClicks(dlg.edit, "never saved")
        qt.keyClick(dlg.edit, Qt.Key.Key_Escape)
    seen = on_dialog(qt, cancel)
    annotate_peak(qt, window)
    assert len(seen) == 1, seen
    assert len(list(window.notes.store)) == 2


def test_one_hover_box_over_a_note(qt, window, copy_of_example):
    from vramscope.services.annotations import Annotation
    d = open_and_wait(qt, window, copy_of_example)
    window.notes.store.add(Annotation(kind="range", device=d.device, start_index=200, end_index=900,
                                note="warm-up\nthe first steps allocate the optimizer state"))
    tl = window.timeline
    tl.refresh_now()
    tl.plot.viewport().repaint()
    chip = next(r for r, _ in tl.notes.hits if r.height() < 40)
    qt.mouseMove(tl.plot.viewport(), chip.center().toPoint())
    qt.waitUntil(lambda: tl.hover_label.isVisible(), timeout=2000)
    assert "optimizer state" in tl.hover_label.textItem.toPlainText()
    assert tl.notes.toolTip() == "" and tl.plot.toolTip() == ""
