"""What holds the memory now: the live bytes at one moment as a tree by code path (the
user's frames outermost, down to the allocating op), as a tree table.

The tree is the analysis' (classifiers/memtree.py `memory_tree`), its words present/memtree.py's.
The model creates rows only as the view asks for them (a node's children when it is
expanded); node ids are the same at every moment, so what is expanded stays expanded as
the moment moves. A double-click shows the node's allocations in the table."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QAbstractItemModel, QModelIndex, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QSizePolicy,
    QToolButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from ...classifiers.evidence import E_GUESS
from ...classifiers.memtree import MemoryTree, memory_tree
from ...common.units import fmt_bytes
from ...present.markup import html as _esc
from ...present.memtree import guess_words, node_label, node_where, search_tree
from .elide import KeepWhereDelegate
from ..model import DeviceData, when_text
from ..theme import Theme, category_color
from .events import column_header

COLUMNS = ("Code path", "Bytes", "Share", "Allocs", "Category")
COL_LABEL, COL_BYTES, COL_SHARE, COL_COUNT, COL_CATEGORY = range(len(COLUMNS))
TIPS = ("The code that allocated, the user's frames outermost, down to the op that allocated",
        "Live bytes under this frame at this moment", "Of all the live bytes at this moment",
        "Live allocations under this frame", "The category holding most of these bytes")
BYTES_ROLE = Qt.ItemDataRole.UserRole          # int: a node's live bytes
NODE_ROLE = Qt.ItemDataRole.UserRole + 1       # int: the node id
EXPAND_SHARE = 0.10                            # opened at first: the chains holding at least this share
EXPAND_DEPTH = 8
MIN_WIDTH = 120                                # the panel's minimum width (minimumSizeHint)


class TreeModel(QAbstractItemModel):
    """A MemoryTree as an item model: an index's internal id is its node id."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data_: DeviceData | None = None
        self.tree: MemoryTree | None = None
        self.theme: Theme | None = None
        self._kids: dict[int, np.ndarray] = {}
        self._italic = QFont()
        self._italic.setItalic(True)

    def set_tree(self, d: DeviceData | None, tree: MemoryTree | None):
        self.beginResetModel()
        self.data_, self.tree = d, tree
        self._kids = {}
        self.endResetModel()

    def kids(self, node: int) -> np.ndarray:
        k = self._kids.get(node)
        if k is None:
            assert self.tree is not None
            k = self._kids[node] = self.tree.children(node)
        return k

    def node_of(self, index) -> int:
        return int(index.internalId()) if index.isValid() else -1

    def index_of(self, node: int, column: int = 0):
        """The model index of a node in the tree now (invalid: not in it)."""
        t = self.tree
        if t is None or node < 0 or not t.in_tree(node):
            return QModelIndex()
        hit = np.flatnonzero(self.kids(int(t.parent[node])) == node)
        return self.createIndex(int(hit[0]), column, int(node)) if len(hit) else QModelIndex()

    # -- the model's interface ---------------------------------------------------------------------
    def index(self, row, column, parent=QModelIndex()):
        if self.tree is None:
            return QModelIndex()
        kids = self.kids(self.node_of(parent))
        if not 0 <= row < len(kids) or not 0 <= column < len(COLUMNS):
            return QModelIndex()
        return self.createIndex(row, column, int(kids[row]))

    def parent(self, index=QModelIndex()):
        if not index.isValid() or self.tree is None:
            return QModelIndex()
        return self.index_of(int(self.tree.parent[self.node_of(index)]))

    def rowCount(self, parent=QModelIndex()):
        if self.tree is None or (parent.isValid() and parent.column() != 0):
            return 0
        return len(self.kids(self.node_of(parent)))

    def hasChildren(self, parent=QModelIndex()):
        return self.rowCount(parent) > 0

    def columnCount(self, parent=QModelIndex()):
        return len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        return column_header(COLUMNS, TIPS, section, orientation, role)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        t, d = self.tree, self.data_
        if t is None or d is None or not index.isValid():
            return None
        n, c = self.node_of(index), index.column()
        if role == BYTES_ROLE:
            return int(t.bytes[n])
        if role == NODE_ROLE:
            return n
        b = int(t.bytes[n])
        guessed = int(t.by_evidence[n, E_GUESS])
        if role == Qt.ItemDataRole.DisplayRole:
            if c == COL_LABEL:
                return node_label(t, d.stacks, n)
            if c == COL_BYTES:
                return fmt_bytes(b)
            if c == COL_SHARE:
                return f"{t.share(n):.1%}"
            if c == COL_COUNT:
                return f"{int(t.count[n]):,}"
            g = guess_words(b, guessed)
            return f"{t.category_of(n)} ({g})" if g else t.category_of(n)
        if role == Qt.ItemDataRole.TextAlignmentRole:
            right = c in (COL_BYTES, COL_SHARE, COL_COUNT)
            return int((Qt.AlignmentFlag.AlignRight if right else Qt.AlignmentFlag.AlignLeft)
                       | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.DecorationRole and c == COL_CATEGORY:
            col = category_color(t.category_of(n))
            return self.theme.guess_color(col) if t.guessed(n) and self.theme is not None else col
        if role == Qt.ItemDataRole.FontRole and t.guessed(n):
            return self._italic
        if role == Qt.ItemDataRole.ForegroundRole and t.guessed(n) and self.theme is not None:
            return self.theme.muted
        if role == Qt.ItemDataRole.ToolTipRole:
            return self.tooltip(n)
        return None

    def tooltip(self, n: int) -> str:
        t, d = self.tree, self.data_
        assert t is not None and d is not None
        nd = t.node(n)
        cats = " · ".join(f"{k} {fmt_bytes(v)}" for k, v in nd.by_category.items())
        tip = (f"<b>{_esc(node_label(t, d.stacks, n))}</b><br>{_esc(node_where(t, d.stacks, n))}<br>"
               f"{fmt_bytes(nd.bytes)} in {nd.count:,} allocations ({nd.share:.1%} of the live bytes)<br>{cats}")
        g = guess_words(nd.bytes, nd.by_evidence.get("guess", 0))
        if g:
            tip += (f"<br><i>The category is {g}: nothing in the stacks or torch's tags says what "
                    f"{'these bytes are' if nd.guessed else 'part of these bytes is'}.</i>")
        return tip + "<br><i>double-click: its allocations in the table</i>"


class MemoryTreePanel(QWidget):
    """The memory tree at one moment: the peak until the user picks another on the timeline."""

    allocationsChosen = Signal(object, str)     # rows (largest first), what they are
    peakRequested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.index: int | None = None
        self.tree: MemoryTree | None = None
        self._expanded: set[int] = set()
        self._matches = np.zeros(0, dtype=np.int64)
        self._match_pos = -1
        self.header = QLabel(self)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setWordWrap(True)
        self.header.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.peak_btn = QToolButton(self)
        self.peak_btn.setText("Peak")
        self.peak_btn.setToolTip("What holds the memory at the peak (P)")
        self.peak_btn.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.peak_btn.clicked.connect(self.peakRequested)
        self.search = QLineEdit(self)
        self.search.setPlaceholderText("Find: file.py:line, function, op")
        self.search.setClearButtonEnabled(True)
        self.search.setToolTip("Finds the frames that match, opens the tree down to them (Return: the next one)")
        # the whole hint stays readable (a narrow window gives the header's words less room first)
        self.search.setMinimumWidth(self.search.fontMetrics().horizontalAdvance(self.search.placeholderText()) + 40)
        self.search.setMaximumWidth(self.search.minimumWidth() + 120)
        self.search.textChanged.connect(lambda: self._search_timer.start())
        self.search.returnPressed.connect(lambda: self.next_match(1))
        self.found = QLabel(self)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(150)
        self._search_timer.timeout.connect(self.run_search)
        self.model = TreeModel(self)
        self.view = QTreeView(self)
        self.view.setMinimumHeight(3 * (self.fontMetrics().height() + 6))     # gives way in a short window
        self.view.setModel(self.model)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        # a deep path keeps "(file.py:line)" whole, its function's words cut first (elide.py)
        self._where = KeepWhereDelegate(self.view)
        self.view.setItemDelegateForColumn(COL_LABEL, self._where)
        self.view.setExpandsOnDoubleClick(False)          # a double-click shows the allocations
        self.view.expanded.connect(lambda ix: self._expanded.add(self.model.node_of(ix)))
        self.view.collapsed.connect(lambda ix: self._expanded.discard(self.model.node_of(ix)))
        self.view.doubleClicked.connect(self._on_double_click)
        hh = self.view.header()
        hh.setStretchLastSection(False)
        hh.setSectionResizeMode(COL_LABEL, QHeaderView.ResizeMode.Stretch)
        fm = self.fontMetrics()
        # the numbers narrow, so a deep code path keeps its words at 1024 pixels
        self.view.setIndentation(14)
        for col, sample, pad in ((COL_BYTES, "1023.99 MiB", 14), (COL_SHARE, "100.0%", 14),
                                 (COL_COUNT, "Allocs", 18), (COL_CATEGORY, "activations (a guess)", 36)):
            hh.setSectionResizeMode(col, QHeaderView.ResizeMode.Interactive)
            self.view.setColumnWidth(col, fm.horizontalAdvance(sample) + pad)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.header, 1)
        top.addWidget(self.found)
        top.addWidget(self.search)
        top.addWidget(self.peak_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.view, 1)

    def minimumSizeHint(self):
        # the window's layout adds this panel's minimum width to the window's while it builds
        # the docks (a 1400-pixel window opened 1549 wide): the search box's whole hint is its
        # minimum only where the panel has the room
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), MIN_WIDTH), hint.height())

    def set_data(self, d: DeviceData | None):
        self.data = d
        self.index = None
        self.tree = None
        self._expanded = set()
        self._matches = np.zeros(0, dtype=np.int64)
        self.model.theme = Theme.from_palette(self.palette())
        self.model.set_tree(d, None)
        self.header.setText("" if d is None else "<i>Shown at the peak, or where you click the timeline.</i>")
        self.found.setText("")

    def show_index(self, i: int):
        """The tree right after entry `i` (what is expanded, and the row chosen, stay)."""
        d = self.data
        if d is None or i == self.index:
            return
        first = self.index is None
        current = self.model.node_of(self.view.currentIndex())
        self.index = i
        t = self.tree = memory_tree(d.da, i)
        self.model.set_tree(d, t)
        peak = " (the peak)" if i == d.peak_index else ""
        self.header.setText(f"At <b>{when_text(d, i)}</b>{peak}: <b>{fmt_bytes(t.total_bytes)}</b> live in "
                            f"{t.total_count:,} allocations")
        if first:
            self._expand_heaviest()
        else:
            self._restore(current)
        if self.search.text().strip():
            self.run_search(move=False)

    def _expand_heaviest(self):
        """At first: open the chains holding a large share, so the tree says something at once."""
        t = self.tree
        assert t is not None
        todo = [int(n) for n in t.roots]
        while todo:
            n = todo.pop()
            if t.share(n) < EXPAND_SHARE or t.depth[n] >= EXPAND_DEPTH:
                continue
            self._expanded.add(n)
            todo += [int(c) for c in t.children(n)]
        self._restore(-1)

    def _restore(self, current: int):
        t = self.tree
        assert t is not None
        keep = sorted((n for n in self._expanded if t.in_tree(n)), key=lambda n: int(t.depth[n]))
        for n in keep:
            ix = self.model.index_of(n)
            if ix.isValid():
                self.view.expand(ix)
        if current >= 0 and t.in_tree(current):
            self.select_node(current, scroll=False)

    def select_node(self, node: int, scroll: bool = True):
        """Open the tree down to `node` and make it the current row."""
        t = self.tree
        if t is None or not t.in_tree(node):
            return
        for up in t.path(node)[:-1]:
            self.view.expand(self.model.index_of(up))
        ix = self.model.index_of(node)
        self.view.setCurrentIndex(ix)
        if scroll:
            self.view.scrollTo(ix)

    # -- search ------------------------------------------------------------------------------------
    def run_search(self, move: bool = True):
        t, d = self.tree, self.data
        text = self.search.text()
        if t is None or d is None or not text.strip():
            self._matches = np.zeros(0, dtype=np.int64)
            self.found.setText("")
            return
        # the heaviest matches first (search_tree gives them by id)
        m = search_tree(t, d.stacks, text)
        self._matches = m[np.argsort(-t.bytes[m], kind="stable")] if len(m) else m
        self._match_pos = -1
        self.found.setText(f"{len(m):,} found" if len(m) else "none found")
        self.found.setToolTip("Return: the next one" if len(m) > 1 else "")
        if move and len(m):
            self.next_match(1)

    def next_match(self, step: int):
        if not len(self._matches):
            return
        self._match_pos = (self._match_pos + step) % len(self._matches)
        self.select_node(int(self._matches[self._match_pos]))
        if len(self._matches) > 1:
            self.found.setText(f"{self._match_pos + 1:,} of {len(self._matches):,}")

    # -- to the allocations ----------------------------------------------------------------------------
    def _on_double_click(self, ix):
        t, d = self.tree, self.data
        n = self.model.node_of(ix)
        if t is None or d is None or n < 0:
            return
        rows = t.rows(n)
        if len(rows):
            self.allocationsChosen.emit(rows, f"Showing the {len(rows):,} allocations live under "
                                              f"{node_label(t, d.stacks, n)} at {when_text(d, self.index)}")


__all__ = ["MemoryTreePanel", "TreeModel", "BYTES_ROLE", "NODE_ROLE"]
