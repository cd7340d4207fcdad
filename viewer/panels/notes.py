"""The Annotations panel: the user's notes on the device shown, with buttons for the Edit
menu's note actions (the notes live in `services.annotations.AnnotationStore`)."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ..model import DeviceData
from ..model.notes import first_line, note_span

NOTE_LINE = 2000            # characters of a note's first line handed to the list (it elides to its width)


class ActionButton(QToolButton):
    """A short-labelled button for a window action (its tooltip and enabled state follow
    the action's; `setDefaultAction` would take the action's long menu text too)."""

    def __init__(self, action, text: str, parent=None):
        super().__init__(parent)
        self.action_ = action
        self.setText(text)
        self.setAutoRaise(False)
        self.clicked.connect(self._trigger)
        action.changed.connect(self._sync)
        self._sync()

    def _trigger(self):
        if self.action_.isEnabled():
            self.action_.trigger()

    def _sync(self):
        self.setEnabled(self.action_.isEnabled())
        self.setToolTip(self.action_.toolTip())


class NotesPanel(QWidget):
    """The annotations of the open snapshot: what each is attached to and its note.

    Click a note to go there on the timeline; double-click (or F2) to edit it; Delete removes it."""

    activated = Signal(str)          # annotation id: go there
    editRequested = Signal(str)      # annotation id: edit its note

    COLUMNS = ("#", "On", "Note")

    def __init__(self, parent=None):
        super().__init__(parent)
        self.notice = QLabel(self)
        self.notice.setWordWrap(True)
        self.notice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.notice.setObjectName("notes_notice")
        self.notice.hide()
        self.hint = QLabel(self)
        self.hint.setWordWrap(True)
        self.tree = QTreeWidget(self)
        self.tree.setColumnCount(len(self.COLUMNS))
        self.tree.setHeaderLabels(list(self.COLUMNS))
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setAllColumnsShowFocus(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        hdr = self.tree.header()
        hdr.setStretchLastSection(True)
        hdr.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        hdr.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.setToolTip("Click a note to show it on the timeline; double-click or F2 to edit it, "
                             "Delete to remove it (Ctrl+Z undoes)")
        self.tree.itemClicked.connect(self._on_clicked)
        self.tree.itemDoubleClicked.connect(self._on_double)
        self.tree.itemActivated.connect(self._on_clicked)
        self.buttons = QHBoxLayout()
        self.buttons.setContentsMargins(0, 0, 0, 0)
        self.buttons.setSpacing(2)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.notice)
        lay.addLayout(self.buttons)
        lay.addWidget(self.tree, 1)
        lay.addWidget(self.hint)
        self._ids: list[str] = []
        self.set_notes([], None)

    def add_button(self, action, text: str) -> "ActionButton":
        b = ActionButton(action, text, self)
        self.buttons.addWidget(b)
        return b

    def finish_buttons(self):
        self.buttons.addStretch(1)

    def set_notice(self, text: str | None):
        self.notice.setText(text or "")
        self.notice.setVisible(bool(text))

    def set_notes(self, notes, data: DeviceData | None):
        """Fill the list from the store's annotations (numbered as in reports)."""
        cur = self.current_id()
        self.tree.clear()
        self._ids = []
        for k, a in enumerate(notes, 1):
            # the note's whole first line: the column cuts it at its width, with an ellipsis
            # (it was cut at 60 characters with 400 pixels free); the tooltip has it all
            it = QTreeWidgetItem([str(k), a.where(), first_line(a.note, NOTE_LINE) or f"({a.kind})"])
            it.setData(0, Qt.ItemDataRole.UserRole, a.id)
            tip = f"{a.where()}\n\n{a.note}" if a.note else a.where()
            for c in range(3):
                it.setToolTip(c, tip)
            it.setTextAlignment(0, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if data is not None and note_span(data, a) is None:
                # on another device: listed (it can be edited, deleted), greyed, not drawn
                muted = self.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
                for c in range(3):
                    it.setForeground(c, muted)
                    it.setToolTip(c, tip + "\n\n(not on the device shown)")
            self.tree.addTopLevelItem(it)
            self._ids.append(a.id)
        if cur in self._ids:
            self.select(cur)
        n = len(self._ids)
        self.hint.setText("" if n else "<i>No notes yet. Mark a range with Ctrl+drag on the timeline and press "
                                       "<b>A</b>, or annotate the peak (<b>Shift+P</b>) or the selected "
                                       "allocation (<b>Shift+A</b>).</i>")
        self.hint.setVisible(not n)

    def count(self) -> int:
        return len(self._ids)

    def item(self, k: int) -> QTreeWidgetItem:
        return self.tree.topLevelItem(k)

    def current_id(self) -> str | None:
        it = self.tree.currentItem()
        return it.data(0, Qt.ItemDataRole.UserRole) if it is not None else None

    def select(self, ann_id: str | None):
        if ann_id in self._ids:
            it = self.tree.topLevelItem(self._ids.index(ann_id))
            self.tree.setCurrentItem(it)
            self.tree.scrollToItem(it)
        else:
            self.tree.setCurrentItem(None)

    def _on_clicked(self, item, _col=0):
        ann_id = item.data(0, Qt.ItemDataRole.UserRole)
        if ann_id:
            self.activated.emit(ann_id)

    def _on_double(self, item, _col=0):
        ann_id = item.data(0, Qt.ItemDataRole.UserRole)
        if ann_id:
            self.editRequested.emit(ann_id)
