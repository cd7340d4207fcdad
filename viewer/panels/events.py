"""The allocator's history of events: one row per trace entry (entry, action, size, address,
stream, category, the user's frame), beside the Allocator panel's block map.

The model never holds a Python object per event: it asks the analysis for the window of
entries the view is drawing (present/events.py `event_rows` over classifiers/events.py
`event_window`) and keeps only that window, so a 10^6-event trace scrolls like a short one."""
from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QFont, QPalette
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView

from ...common.units import fmt_bytes
from ...present.events import EventRow, addr_text, event_rows, event_text
from ...present.words import EVIDENCE_WORDS
from ..model import DeviceData
from ..theme import category_color, muted_text

# the user's frame right after what happened, so a narrow window still shows it
COLUMNS = ("Entry", "Action", "Size", "Where", "Category", "Address", "Stream")
COL_ENTRY, COL_ACTION, COL_SIZE, COL_WHERE, COL_CATEGORY, COL_ADDR, COL_STREAM = range(len(COLUMNS))
TIPS = ("The trace entry (the x axis in entries)", "torch's name for what the allocator did",
        "Bytes requested (segment events: the segment's size)",
        "The user's code that made it (hover for the event in full)",
        "The category of the allocation the event belongs to", "The block's (or segment's) address",
        "The CUDA stream")
WINDOW = 512                    # entries fetched at a time, around the one asked for
NUMERIC = (COL_ENTRY, COL_SIZE, COL_STREAM)


def column_header(columns, tips, section, orientation, role):
    """A model's horizontal header: each column's name, and its tooltip."""
    if orientation != Qt.Orientation.Horizontal:
        return None
    if role == Qt.ItemDataRole.DisplayRole:
        return columns[section]
    if role == Qt.ItemDataRole.ToolTipRole:
        return tips[section]
    return None


class EventModel(QAbstractTableModel):
    """Every trace entry of one device as a row, fetched a window at a time."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data_: DeviceData | None = None
        self._lo = 0
        self._rows: list[EventRow] = []
        self._italic = QFont()
        self._italic.setItalic(True)

    def set_data(self, d: DeviceData | None):
        self.beginResetModel()
        self.data_ = d
        self._lo, self._rows = 0, []
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() or self.data_ is None else self.data_.n

    def columnCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(COLUMNS)

    def row_at(self, r: int) -> EventRow:
        """Entry `r` (fetching the window around it when it is not the one held)."""
        if not self._lo <= r < self._lo + len(self._rows):
            d = self.data_
            assert d is not None
            self._lo = max(0, r - WINDOW // 2)
            self._rows = event_rows(d.da, d.stacks, self._lo, self._lo + WINDOW)
        return self._rows[r - self._lo]

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or self.data_ is None:
            return None
        c = index.column()
        if role == Qt.ItemDataRole.TextAlignmentRole:
            right = c in NUMERIC
            return int((Qt.AlignmentFlag.AlignRight if right else Qt.AlignmentFlag.AlignLeft)
                       | Qt.AlignmentFlag.AlignVCenter)
        if role not in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole, Qt.ItemDataRole.DecorationRole,
                        Qt.ItemDataRole.FontRole, Qt.ItemDataRole.ForegroundRole):
            return None
        ev = self.row_at(index.row())
        guess = ev.evidence == "guess"
        if role == Qt.ItemDataRole.DisplayRole:
            if c == COL_ENTRY:
                return f"{ev.index:,}"
            if c == COL_ACTION:
                return ev.action
            if c == COL_SIZE:
                return fmt_bytes(ev.size) if ev.size else ""
            if c == COL_ADDR:
                return addr_text(ev.addr) if ev.addr else ""
            if c == COL_STREAM:
                return str(ev.stream)
            if c == COL_CATEGORY:
                return f"{ev.category} ({EVIDENCE_WORDS['guess']})" if guess else ev.category
            return ev.where
        if role == Qt.ItemDataRole.ToolTipRole:
            tip = f"entry {ev.index:,}: {event_text(ev)}"
            if guess:
                tip += "\nThe category is a guess: nothing in the stack or torch's tags says what this is."
            return tip
        if role == Qt.ItemDataRole.DecorationRole:
            return category_color(ev.category) if c == COL_CATEGORY and ev.category else None
        if role == Qt.ItemDataRole.FontRole:
            return self._italic if guess and c == COL_CATEGORY else None
        if role == Qt.ItemDataRole.ForegroundRole and c == COL_CATEGORY and guess:
            return muted_text(self.parent().palette()) if self.parent() is not None else None
        return None

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        return column_header(COLUMNS, TIPS, section, orientation, role)


class EventList(QTableView):
    """The event list: one row per entry, the current entry selected."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model_ = EventModel(self)
        self.setModel(self.model_)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setWordWrap(False)
        self.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.setAlternatingRowColors(True)
        vh = self.verticalHeader()
        vh.hide()
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)        # 10^6 rows: no per-row sizes
        vh.setDefaultSectionSize(self.fontMetrics().height() + 4)
        hh = self.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hh.setStretchLastSection(True)
        hh.setHighlightSections(False)
        fm = self.fontMetrics()
        for col, sample, pad in ((COL_ENTRY, "999,999", 14), (COL_ACTION, "free_completed", 14),
                                 (COL_SIZE, "1023.99 MiB", 14), (COL_ADDR, "0x7f3a2c000000", 14),
                                 (COL_STREAM, "Stream", 14), (COL_CATEGORY, "quantization", 36),
                                 (COL_WHERE, "LogSoftmaxBackward0 (autograd)", 14)):
            self.setColumnWidth(col, fm.horizontalAdvance(sample) + pad)

    def set_data(self, d: DeviceData | None):
        self.model_.set_data(d)
        # one stream: its column says nothing
        self.setColumnHidden(COL_STREAM, d is None or len(d.segments.streams) <= 1)
