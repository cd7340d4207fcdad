"""The allocations table: a virtual Qt model over numpy columns (rows are computed when painted)."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from PySide6.QtCore import (
    QAbstractTableModel,
    QEvent,
    QModelIndex,
    QSignalBlocker,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QAction, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QStyle,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ...common.units import fmt_bytes, fmt_duration_us, fmt_seconds, parse_size
from ...present.markup import html as _html
from ..model import DeviceData
from .elide import KeepWhereDelegate
from ..model.rows import (
    COL_ADDR,
    COL_ALLOC,
    COL_CATEGORY,
    COL_FREE,
    COL_LIFETIME,
    COL_RULE,
    COL_SIZE,
    COL_WHERE,
    COLUMNS,
    RowView,
)
from ...present.words import EVIDENCE_WORDS, before_trace_text
from ..theme import Theme, category_color

FILTER_DELAY_MS = 40
WHERE_AT = 2            # the Where column's place on screen (after Category and Size)
WHERE_WIDTH = 300       # its widest; a longer code line is cut in the middle (its tooltip has it whole)
_RIGHT = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
_TIPS = {
    COL_CATEGORY: "What the allocation is, as classified (see the Selection panel for the rule)",
    COL_SIZE: "Requested size",
    COL_ALLOC: "When it was allocated ('before trace': already live when recording began; 'before snapshot': "
               "a snapshot without a trace, its blocks live when it was taken)",
    COL_FREE: "When it was freed ('never': still live when the snapshot was taken)",
    COL_LIFETIME: "How long it lived (to the trace's end when never freed)",
    COL_ADDR: "Device address",
    COL_RULE: "The classifier rule that chose the category",
    COL_WHERE: "The innermost Python frame outside torch that allocated it",
}


class AllocationsModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.view: RowView | None = None
        self.data_: DeviceData | None = None
        self.theme = Theme.from_palette()

    def set_data(self, data: DeviceData | None):
        self.beginResetModel()
        self.theme = Theme.from_palette()          # (the guessed rows' paler swatch)
        self.data_ = data
        self.view = RowView(data) if data is not None else None
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() or self.view is None else len(self.view.rows)

    def columnCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal:
            if role == Qt.ItemDataRole.DisplayRole:
                return COLUMNS[section]
            if role == Qt.ItemDataRole.ToolTipRole:
                return _TIPS.get(section)
        return None

    def row_id(self, r: int) -> int:
        assert self.view is not None
        return int(self.view.rows[r])

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or self.view is None:
            return None
        row = int(self.view.rows[index.row()])
        col = index.column()
        d = self.data_
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(d, row, col)
        if role == Qt.ItemDataRole.DecorationRole and col == COL_CATEGORY:
            color = category_color(d.category_name(int(d.category[row])))
            return self.theme.guess_color(color) if d.guessed(row) else color
        if role == Qt.ItemDataRole.ToolTipRole and col == COL_CATEGORY and d.guessed(row):
            return ("A guess: no frames and no recorded lifetime say what this is (live before recording began, "
                    "never freed); it is drawn in the paler shade")
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (COL_SIZE, COL_ALLOC, COL_FREE, COL_LIFETIME):
            return _RIGHT
        if role == Qt.ItemDataRole.ToolTipRole and col == COL_RULE:
            return d.rule_why(row) or None
        if role == Qt.ItemDataRole.ToolTipRole and col == COL_WHERE:
            view = d.stacks.view_of(d.da, d.da.allocation(row))
            return "\n".join(fv.label[:160] for fv in view.frames[:10]) or "no stack recorded"
        if role == Qt.ItemDataRole.UserRole:
            return row
        return None

    def _when(self, d: DeviceData, i: int, missing: str) -> str:
        if i < 0:
            return missing
        if d.has_time:
            return fmt_seconds(float(d.seconds_of(i)), 1e-6, d.time_span)
        return f"#{i:,}"

    def _text(self, d: DeviceData, row: int, col: int):
        a = d.allocs
        if col == COL_CATEGORY:
            name = d.category_name(int(d.category[row]))
            return f"{name} ({EVIDENCE_WORDS['guess']})" if d.guessed(row) else name
        if col == COL_SIZE:
            return fmt_bytes(int(a.size[row]))
        if col == COL_ALLOC:
            return self._when(d, int(d.alloc_index[row]), before_trace_text(d.state_only, short=True))
        if col == COL_FREE:
            return self._when(d, int(d.free_index[row]), "never")
        if col == COL_LIFETIME:
            ai, fi = int(d.alloc_index[row]), int(d.free_index[row])
            if d.n == 0 or d.state_only:
                return "at the snapshot"      # a state-only snapshot: no allocation traced, no lifetimes
            if d.has_time and d.n:
                ta = int(d.times[ai]) if ai >= 0 else int(d.times[0])
                tf = int(d.times[fi]) if fi >= 0 else int(d.times[-1])
                s = fmt_duration_us(tf - ta)
            else:
                s = f"{(fi if fi >= 0 else d.n) - max(ai, 0):,} entries"
            return ("≥ " + s) if (ai < 0 or fi < 0) else s
        if col == COL_ADDR:
            return f"0x{int(a.addr[row]):x}"
        if col == COL_RULE:
            return d.rule_name(row)
        if col == COL_WHERE:
            return d.row_label(row)
        return None

    def sort(self, column, order=Qt.SortOrder.AscendingOrder):
        """Sort, keeping the view's current and selected rows on the same allocations
        (Qt's persistent indexes): without it the highlight stays at the same position
        and lands on another allocation."""
        if self.view is None:
            return
        self.layoutAboutToBeChanged.emit()
        old = self.persistentIndexList()
        ids = [int(self.view.rows[ix.row()]) if ix.isValid() and ix.row() < len(self.view.rows) else -1
               for ix in old]
        with busy(self.view.n):
            self.view.sort(column, order == Qt.SortOrder.DescendingOrder)
        if old:
            pos = self.view.positions_of(ids).tolist()
            self.changePersistentIndexList(old, [self.index(p, ix.column()) if p >= 0 else QModelIndex()
                                                 for p, ix in zip(pos, old)])
        self.layoutChanged.emit()

    def set_only(self, rows):
        if self.view is None:
            return
        self.beginResetModel()
        self.view.set_only(rows)
        self.endResetModel()

    def set_filter(self, categories, min_size, text):
        if self.view is None:
            return
        self.beginResetModel()
        with busy(self.view.n):
            self.view.set_filter(categories, min_size, text)
        self.endResetModel()


@contextmanager
def busy(rows: int):
    """A wait cursor while sorting or filtering millions of rows (a fraction of a second)."""
    if rows < 500_000:
        yield
        return
    QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
    try:
        yield
    finally:
        QApplication.restoreOverrideCursor()


class MenuButton(QToolButton):
    """A tool button that pops up its menu, with room for the menu's arrow: the style draws
    the arrow inside the button's right edge without widening it for the arrow, so the text
    ran into it ("Categories: all⌄")."""

    def _arrow(self) -> int:
        return self.style().pixelMetric(QStyle.PixelMetric.PM_MenuButtonIndicator, None, self)

    def sizeHint(self):
        s = super().sizeHint()
        return QSize(s.width() + self._arrow(), s.height())

    def minimumSizeHint(self):
        return self.sizeHint()


class AllocationsPanel(QWidget):
    """Filter bar + table. Emits `rowSelected(row)` when the user picks a row.

    `show_only(rows, text)` narrows the table to a chosen set of allocations (a leak's), with
    a chip above the table that says which and clears it (`onlyCleared` then)."""

    rowSelected = Signal(int)
    onlyCleared = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.model = AllocationsModel(self)

        self.cat_button = MenuButton(self)
        self.cat_button.setText("Categories: all")
        self.cat_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.cat_button.setToolTip("Show only some categories")
        self.cat_menu = QMenu(self.cat_button)
        self.cat_button.setMenu(self.cat_menu)
        self.cat_actions: list[QAction] = []

        self.min_size = QLineEdit(self)
        self.min_size.setPlaceholderText("min size, e.g. 1 MiB")
        self.min_size.setToolTip("Hide allocations smaller than this (B, KiB, MiB, GiB; K/M/G work too)")
        self.min_size.setClearButtonEnabled(True)
        self.min_size.setMaximumWidth(170)
        self.text = QLineEdit(self)
        self.text.setPlaceholderText("Search frames: file, function or file.py:line (Ctrl+F)")
        self.text.setToolTip("Keep allocations with a frame whose file, function or file:line contains this text "
                             "(as the Where column and the stack show it: 'train.py:42', 'forward', 'site-packages/'), "
                             "or whose metadata does (user_metadata such as 'step=12', notes from annotate, the "
                             "module torch's component tracking names)")
        self.text.setClearButtonEnabled(True)
        # never cut to "S…": the words that say what it searches stay readable in a narrow window
        self.text.setMinimumWidth(self.text.fontMetrics().horizontalAdvance("Search frames: file, fun") + 40)
        self.count = QLabel(self)
        self.count.setToolTip("Allocations shown / all allocations on this device")
        # a filter on says so, with one click to clear it (a search left from another file
        # read "0 of 1,211" and nothing else)
        self.clear_filters = QToolButton(self)
        self.clear_filters.setText("✕ Clear filter")
        self.clear_filters.setToolTip("Show every allocation again: the search, the minimum size and the "
                                      "categories cleared")
        self.clear_filters.setAutoRaise(True)
        self.clear_filters.clicked.connect(self.clear_filter)
        self.clear_filters.hide()

        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(self.cat_button)
        bar.addWidget(self.min_size)
        bar.addWidget(self.text, 1)
        bar.addWidget(self.count)
        bar.addWidget(self.clear_filters)

        # the chosen set (a leak's allocations): what the table shows, and a way back to all
        self.only_text = ""
        self.chip = QWidget(self)
        chip = QHBoxLayout(self.chip)
        chip.setContentsMargins(6, 2, 2, 2)
        chip.setSpacing(6)
        self.chip_label = QLabel(self.chip)
        self.chip_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.chip_clear = QToolButton(self.chip)
        self.chip_clear.setText("✕ Clear")
        self.chip_clear.setToolTip("Show all allocations again")
        self.chip_clear.setAutoRaise(True)
        self.chip_clear.clicked.connect(self.clear_only)
        chip.addWidget(self.chip_label)
        chip.addWidget(self.chip_clear)
        chip.addStretch(1)
        self.chip.setAutoFillBackground(True)
        self.chip.hide()

        self.table = QTableView(self)
        # a short window keeps the plot's room: the table gives way down to a few rows
        self.table.setMinimumHeight(3 * (self.fontMetrics().height() + 6))
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self._where = KeepWhereDelegate(self.table)                   # a long code line keeps its file and line
        self.table.setItemDelegateForColumn(COL_WHERE, self._where)
        self.table.verticalHeader().hide()
        vh = self.table.verticalHeader()
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        vh.setDefaultSectionSize(self.fontMetrics().height() + 6)
        hh = self.table.horizontalHeader()
        hh.setStretchLastSection(True)
        hh.setSortIndicator(COL_SIZE, Qt.SortOrder.DescendingOrder)
        # the code line right after the size: in view at 1024 pixels without scrolling sideways
        hh.moveSection(hh.visualIndex(COL_WHERE), WHERE_AT)
        self._fit_columns(None)
        self.table.setSortingEnabled(True)
        self.table.selectionModel().currentRowChanged.connect(self._on_current)
        self.model.layoutChanged.connect(self._keep_current_visible)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(bar)
        lay.addWidget(self.chip)
        lay.addWidget(self.table, 1)

        # Filtering 10^6 rows costs a few ms (frames are matched, not rows): a short pause
        # only merges the keystrokes of a burst, so the table settles right after the last
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(FILTER_DELAY_MS)
        self._timer.timeout.connect(self.apply_filter)
        self.text.textChanged.connect(lambda _: self._timer.start())
        self.min_size.textChanged.connect(lambda _: self._timer.start())
        self.text.returnPressed.connect(self.apply_filter)
        self.min_size.returnPressed.connect(self.apply_filter)
        # ↓ (or Page Down) from a filter field goes on to the rows it kept, as in a search box
        for field in (self.text, self.min_size):
            field.installEventFilter(self)
            field.setToolTip(field.toolTip() + " · ↓ goes to the table")

    def eventFilter(self, obj, ev):
        if obj in (self.text, self.min_size) and ev.type() == QEvent.Type.KeyPress \
                and ev.key() in (Qt.Key.Key_Down, Qt.Key.Key_PageDown) \
                and ev.modifiers() == Qt.KeyboardModifier.NoModifier:
            self.to_rows()
            return True
        return super().eventFilter(obj, ev)

    def to_rows(self):
        """The keyboard on the table, the filter typed so far applied, on its current row (the
        first where none is: selected, as a click on it would)."""
        if self._timer.isActive():
            self._timer.stop()
            self.apply_filter()
        self.table.setFocus(Qt.FocusReason.ShortcutFocusReason)
        if not self.table.currentIndex().isValid() and self.model.rowCount() > 0:
            self.table.setCurrentIndex(self.model.index(0, 0))
            self.table.selectRow(0)

    def _fit_columns(self, data: DeviceData | None):
        """Column widths from what they will show (the font's metrics on the widest texts of
        this file): fixed pixel widths cut '≥ 10,307 entries' and long addresses."""
        fm = self.table.fontMetrics()
        hh = self.table.horizontalHeader()
        pad = 18
        samples = {COL_CATEGORY: ["autograd", "quantization", "optimizer (a guess)"], COL_SIZE: ["1023.99 MiB"],
                   COL_ALLOC: ["before snapshot", "999.999999 s"], COL_FREE: ["999.999999 s"],
                   COL_LIFETIME: ["≥ 999 ms", "at the snapshot" if data is not None and (data.n == 0 or data.state_only) else "1.23 ms"],
                   COL_ADDR: ["0x7f0000000000"], COL_RULE: ["activations.forward"], COL_WHERE: ["train.py:88 forward"]}
        if data is not None and data.n_rows:
            m = self.model
            rows = data.rows_by_size
            pick = np.unique(np.concatenate([rows[:200], rows[-50:], np.arange(min(50, data.n_rows))]))
            for col in samples:
                samples[col] += [m._text(data, int(r), col) or "" for r in pick]
            samples[COL_LIFETIME].append(f"≥ {data.n:,} entries" if not data.has_time else "≥ 99.9 min 59 s")
            samples[COL_ALLOC].append(f"#{data.n:,}")
        for col, texts in samples.items():
            head = fm.horizontalAdvance(COLUMNS[col]) + 28        # the sort arrow
            w = max([head] + [fm.horizontalAdvance(t) for t in texts]) + pad
            if col == COL_CATEGORY:
                w += 22                                             # the colour swatch
            self.table.setColumnWidth(col, min(w, WHERE_WIDTH if col == COL_WHERE else 320))
        hh.setStretchLastSection(True)

    def set_data(self, data: DeviceData | None):
        self.data = data
        self.only_text = ""
        self.chip.hide()
        # another file (or device) starts unfiltered: a search typed for the last one would
        # hide rows of this one without a word
        self._timer.stop()
        for box in (self.text, self.min_size):
            with QSignalBlocker(box):
                box.clear()
        self.min_size.setStyleSheet("")
        self.model.set_data(data)
        self._fit_columns(data)
        self.cat_menu.clear()
        self.cat_actions = []
        if data is not None:
            hh = self.table.horizontalHeader()
            self.model.sort(hh.sortIndicatorSection(), hh.sortIndicatorOrder())
            for c, name in enumerate(data.categories):
                act = QAction(name, self.cat_menu)
                act.setCheckable(True)
                act.setChecked(True)
                act.setEnabled(bool(data.cat_present[c]))
                act.setData(c)
                act.toggled.connect(lambda _=False: self.apply_filter())
                self.cat_menu.addAction(act)
                self.cat_actions.append(act)
            self.cat_menu.addSeparator()
            self.cat_menu.addAction("All", lambda: self._set_all(True))
            self.cat_menu.addAction("None", lambda: self._set_all(False))
            self.apply_filter()
        self._update_count()

    def show_only(self, rows, text: str):
        """Show exactly these allocations (the other filters cleared: the table then holds
        what `text` says), with a chip that names them and clears them."""
        if self.model.view is None:
            return
        for w in (self.text, self.min_size):
            with QSignalBlocker(w):
                w.clear()
        self.min_size.setStyleSheet("")
        for a in self.cat_actions:
            with QSignalBlocker(a):
                a.setChecked(True)
        self.cat_button.setText("Categories: all")
        self._timer.stop()
        self.only_text = text
        current = self.current_row()
        self.model.set_only(rows)
        self.model.set_filter(None, 0, "")
        self.chip_label.setText(f"<b>{_html(text)}</b>")
        pal = self.chip.palette()
        hl = pal.color(QPalette.ColorRole.Highlight)
        hl.setAlpha(50)
        pal.setColor(QPalette.ColorRole.Window, hl)
        self.chip.setPalette(pal)
        self.chip.show()
        self._update_count()
        if current >= 0:
            self.select_row(current, emit=False)

    def has_only(self) -> bool:
        return self.model.view is not None and self.model.view.only is not None

    def clear_only(self):
        """All allocations again (the other filters as they are)."""
        if not self.has_only():
            self.chip.hide()
            return
        current = self.current_row()
        self.only_text = ""
        self.chip.hide()
        self.model.set_only(None)
        self._update_count()
        if current >= 0:
            self.select_row(current, emit=False)
        self.onlyCleared.emit()

    def _set_all(self, on: bool):
        for a in self.cat_actions:
            with QSignalBlocker(a):
                a.setChecked(on)
        self.apply_filter()

    def set_categories(self, cats: set[int] | None):
        """Filter to these categories (None: all)."""
        for a in self.cat_actions:
            with QSignalBlocker(a):
                a.setChecked(cats is None or int(a.data()) in cats)
        self.apply_filter()

    def checked_categories(self) -> set[int] | None:
        checked = {int(a.data()) for a in self.cat_actions if a.isChecked()}
        if all(a.isChecked() for a in self.cat_actions):
            return None
        return checked

    def apply_filter(self):
        self._timer.stop()
        if self.data is None:
            return
        size = parse_size(self.min_size.text())
        self.min_size.setStyleSheet("" if size is not None else "color: #D62728")
        cats = self.checked_categories()
        self.cat_button.setText("Categories: all" if cats is None else f"Categories: {len(cats)}")
        current = self.current_row()
        self.model.set_filter(cats, size or 0, self.text.text())
        self._update_count()
        if current >= 0:
            self.select_row(current, emit=False)

    def filtered(self) -> bool:
        """Whether a filter of the bar is on (the search, a minimum size, some categories)."""
        return bool(self.text.text().strip() or self.min_size.text().strip()) or \
            self.checked_categories() is not None

    def clear_filter(self):
        """Every filter of the bar off (the chosen set of a leak stays: its chip clears it)."""
        self._timer.stop()
        for box in (self.text, self.min_size):
            with QSignalBlocker(box):
                box.clear()
        for a in self.cat_actions:
            with QSignalBlocker(a):
                a.setChecked(True)
        self.apply_filter()

    def _update_count(self):
        if self.model.view is None:
            self.count.setText("")
            self.clear_filters.hide()
            return
        on = self.filtered()
        shown = f"{len(self.model.view.rows):,} of {self.model.view.n:,}"
        self.count.setText(f"<b>filtered:</b> {shown}" if on else shown)
        self.clear_filters.setVisible(on)

    def current_row(self) -> int:
        idx = self.table.currentIndex()
        if not idx.isValid() or self.model.view is None:
            return -1
        return self.model.row_id(idx.row())

    def select_row(self, row: int, emit: bool = False):
        """Show a row (if it passes the filter) without re-emitting the selection."""
        if self.model.view is None:
            return
        pos = self.model.view.position_of(row) if row >= 0 else -1
        with QSignalBlocker(self.table.selectionModel()):
            if pos < 0:
                self.table.clearSelection()
                self.table.setCurrentIndex(QModelIndex())
            else:
                idx = self.model.index(pos, 0)
                self.table.setCurrentIndex(idx)
                self.table.selectRow(pos)
                self.table.scrollTo(idx, QAbstractItemView.ScrollHint.PositionAtCenter)
        # the selection model's signals were blocked: the view repaints the rows itself
        self.table.viewport().update()
        if emit and pos >= 0:
            self.rowSelected.emit(row)

    def _keep_current_visible(self, *_):
        idx = self.table.currentIndex()
        if idx.isValid():
            self.table.scrollTo(idx, QAbstractItemView.ScrollHint.PositionAtCenter)

    def _on_current(self, current, _previous):
        if current.isValid() and self.model.view is not None:
            self.rowSelected.emit(self.model.row_id(current.row()))
