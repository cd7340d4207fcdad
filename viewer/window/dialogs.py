"""Small dialogs of the main window: writing a note, choosing a report folder."""
from __future__ import annotations

import os

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QHeaderView,
    QTreeView,
    QDialogButtonBox,
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


class FileDialogSizer(QObject):
    """Qt's own file dialog (the one used where there is no native dialog) opened at about
    600x400 with fixed columns: "93.…MiB", "25 11 2…6". Every file dialog of the application
    shown while this filter is installed opens wide enough (within the screen) with its Size,
    Type and Date columns sized to what they show, the name taking the rest."""

    WIDTH, HEIGHT = 960, 560

    def eventFilter(self, obj, ev):
        if ev.type() == QEvent.Type.Show and isinstance(obj, QFileDialog):
            fit_file_dialog(obj)
        return False

    def install(self):
        QApplication.instance().installEventFilter(self)


def fit_file_dialog(dlg: QFileDialog):
    screen = (dlg.screen() or QApplication.primaryScreen()).availableGeometry()
    dlg.resize(min(FileDialogSizer.WIDTH, int(screen.width() * 0.9)),
               min(FileDialogSizer.HEIGHT, int(screen.height() * 0.85)))
    for view in dlg.findChildren(QTreeView):
        hh = view.header()
        if hh.count() < 2:
            continue
        hh.setStretchLastSection(False)
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in range(1, hh.count()):
            hh.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
