"""Small dialogs of the main window: writing a note, choosing a report folder, a text that
scrolls (the keyboard shortcuts, About). Every dialog fits the screen (screen_fit.py)."""
from __future__ import annotations

import os

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QTextBrowser,
    QFileDialog,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
)


class NoteDialog(QDialog):
    """A note's text: wraps at the window's width, Tab moves on (it never types a tab),
    Ctrl+Return (either Enter key) saves, Esc cancels. Wide enough for its title."""

    def __init__(self, parent, title: str, label: str, text: str = ""):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.label = QLabel(label, self)
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.edit = QPlainTextEdit(self)
        self.edit.setPlainText(text)
        self.edit.setTabChangesFocus(True)
        self.edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.edit.selectAll()
        self.edit.setToolTip("Ctrl+Return saves the note, Esc cancels")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel,
                                        self)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        hint = QLabel("<small>Ctrl+Return saves · Esc cancels</small>", self)
        hint.setEnabled(False)
        lay = QVBoxLayout(self)
        lay.addWidget(self.label)
        lay.addWidget(self.edit, 1)
        lay.addWidget(hint)
        lay.addWidget(self.buttons)
        # Ctrl+Return must be caught before the editor takes it as a line break (a text
        # editor claims Return with any modifier, so a window shortcut never fires)
        self.edit.installEventFilter(self)
        # the title bar shows the whole title (window managers cut a narrow dialog's)
        fm = self.fontMetrics()
        self.setMinimumWidth(max(420, fm.horizontalAdvance(title) + 160))
        self.resize(max(480, fm.horizontalAdvance(title) + 200), 260)

    def eventFilter(self, obj, ev):
        if obj is self.edit and ev.type() in (QEvent.Type.KeyPress, QEvent.Type.ShortcutOverride):
            if ev.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and \
                    ev.modifiers() & Qt.KeyboardModifier.ControlModifier:
                ev.accept()
                if ev.type() == QEvent.Type.KeyPress:
                    self.accept()
                return True
        return super().eventFilter(obj, ev)

    def text(self) -> str:
        return self.edit.toPlainText()


def ask_note(parent, title: str, label: str, text: str = "") -> str | None:
    """The note typed (stripped), or None when cancelled."""
    dlg = NoteDialog(parent, title, label, text)
    try:
        ok = dlg.exec() == QDialog.DialogCode.Accepted
        return dlg.text().strip() if ok else None
    finally:
        dlg.deleteLater()


def ask_report_folder(parent, start_dir: str, suggested: str) -> str | None:
    """A folder for a report: a save dialog that proposes a new folder `suggested` in
    `start_dir` (created on export); picking an existing folder writes into it."""
    path, _ = QFileDialog.getSaveFileName(parent, "Export report into a new folder",
                                          os.path.join(start_dir or "", suggested),
                                          "Report folder (report.md, timeline.png, analysis.json)")
    return path or None


class TextDialog(QDialog):
    """Rich text that scrolls, with OK always on screen (F1's list was a 400x834 message
    box whose OK button a 500-pixel screen never showed). Sized to its text, within the
    screen's available area."""

    def __init__(self, parent, title: str, html: str, width: int = 560):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.text = QTextBrowser(self)
        self.text.setOpenExternalLinks(False)
        self.text.setHtml(html)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok, self)
        self.buttons.accepted.connect(self.accept)
        lay = QVBoxLayout(self)
        lay.addWidget(self.text, 1)
        lay.addWidget(self.buttons)
        from .screen_fit import room
        r = room(parent if parent is not None else self)
        doc = self.text.document()
        doc.setTextWidth(width - 40)
        want_h = int(doc.size().height()) + self.buttons.sizeHint().height() + 60
        self.resize(min(width, r.width()), min(want_h, int(r.height() * 0.9)))
