"""The rank overview (issue 23): a folder of per-rank snapshots at a glance.

  * a heatmap of ranks x time of live memory (one row per rank, the colour the highest live
    bytes in each column, on one scale for every rank), each OOM marked with a red cross
    where it happened, the rank labels marking the first OOM and the outliers;
  * beside it one row per rank: peak, what sets it apart, OOMs, reserved peak, peak type,
    leaks, what was live at the peak (sortable);
  * a click on a heatmap row, a double-click or Enter in the table, or Open, shows that rank
    in the window (`rankOpened`); Compare sets two ranks side by side (`compareRequested`).

It computes nothing: the figures, the picture's grid and the words all come from the
Qt-free ranks service (vramscope/services/ranks.py), the same as `vramscope ranks`.
Interface: `set_result(result, grid)`, `set_current(rank)`, `release()`; signals
`rankOpened(int)` and `compareRequested(int, int)`.
"""
from __future__ import annotations

import os

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QFont, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGraphicsRectItem,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QPushButton,
    QSplitter,
    QTreeWidget,
    QVBoxLayout,
    QWidget,
)

from ..common.units import byte_unit, fmt_bytes, fmt_seconds
from ..present.markup import html as _esc
from ..services.ranks import (
    OUTLIER_RULE,
    LiveGrid,
    RanksResult,
    oom_text,
    rank_notes,
    short_type,
    top_categories,
    versus_median,
)
from .panels.compare import _SORT, SortItem
from .timeline.items import TimeAxis, cosmetic_pen
from .theme import OOM_COLOR, Theme, muted_text

OOM_MARK, OUTLIER_MARK = "✕", "▲"
COLUMNS = ("Rank", "Peak", "Notes", "OOMs", "Reserved peak", "Peak type", "Leaks", "Top at the peak")
HINT = "Click a rank to open it · select two in the list to compare them"
RANK_ROLE = Qt.ItemDataRole.UserRole + 20
LABELLED_ROWS = 40            # rows labelled one by one up to this many ranks
MAX_LIST_MIN_WIDTH = 420      # pixels the list claims at most when the panel is narrow


class OverviewAxis(TimeAxis):
    """Seconds on the ranks' common clock, or the share of each rank's own trace when they
    have none."""

    share = False

    def tickStrings(self, values, scale, spacing):
        if self.share:
            return [f"{v:.0%}" for v in values]
        return super().tickStrings(values, scale, spacing)


class RankAxis(pg.AxisItem):
    """Rank numbers at their rows, the first OOM and the outliers marked."""

    def set_rows(self, labels: list[str], marked: set[int]):
        n = len(labels)
        step = 1 if n <= LABELLED_ROWS else int(np.ceil(n / 20))
        major = [(float(i), labels[i]) for i in range(n) if i % step == 0 or i in marked]
        self.setTicks([major, []])


class RanksHeatmap(QWidget):
    """The picture: ranks x time of live memory."""

    rowClicked = Signal(int)              # a row (index into grid.ranks), left button
    rowMenu = Signal(int, object)         # a row and the global position, right button
    hovered = Signal(str)                 # what is under the mouse, in words ("" when nothing)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.grid: LiveGrid | None = None
        self.scale = 1
        self.time_axis = OverviewAxis("bottom")
        self.rank_axis = RankAxis("left")
        for ax in (self.time_axis, self.rank_axis):
            ax.enableAutoSIPrefix(False)
        self.plot = pg.PlotWidget(axisItems={"bottom": self.time_axis, "left": self.rank_axis})
        pi = self.plot.getPlotItem()
        pi.hideButtons()
        pi.setMenuEnabled(False)
        self.rank_axis.setWidth(58)
        self.rank_axis.setLabel("rank")
        self.vb = pi.getViewBox()
        self.vb.setMenuEnabled(False)
        self.vb.setMouseEnabled(x=True, y=False)
        self.vb.invertY(True)                       # rank 0 on top, as in the list
        self.image = pg.ImageItem(axisOrder="row-major")
        self.vb.addItem(self.image)
        self.bar = pg.ColorBarItem(colorMap=pg.colormap.get("viridis"), interactive=False, width=14)
        self.bar.setImageItem(self.image, insert_in=pi)
        self.bar.setMenuEnabled(False)
        self.bar.vb.setMenuEnabled(False)
        self.ooms = pg.ScatterPlotItem(symbol="x", size=13, pen=pg.mkPen("w", width=1), brush=pg.mkBrush(OOM_COLOR))
        self.ooms.setZValue(10)
        self.vb.addItem(self.ooms)
        self.current = QGraphicsRectItem()
        self.current.setZValue(12)
        self.current.hide()
        self.vb.addItem(self.current)
        self.chosen: list[QGraphicsRectItem] = []
        self.plot.scene().sigMouseMoved.connect(self._on_mouse)
        self.plot.scene().sigMouseClicked.connect(self._on_click)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)
        self.theme = Theme.from_palette(self.palette())
        self.apply_theme(self.theme)

    def apply_theme(self, theme: Theme):
        self.theme = theme
        self.plot.setBackground(theme.background)
        pi = self.plot.getPlotItem()
        for ax in (pi.getAxis("left"), pi.getAxis("bottom"), self.bar.axis):
            ax.setPen(theme.muted)
            ax.setTextPen(theme.foreground)
        pen = cosmetic_pen(theme.accent)
        pen.setWidth(2)
        self.current.setPen(pen)

    def set_grid(self, grid: LiveGrid | None, labels: list[str], marked: set[int]):
        self.grid = grid
        if grid is None or not grid.ranks:
            self.image.clear()
            self.ooms.setData([], [])
            self.current.hide()
            return
        n, cols = grid.values.shape
        top = float(np.nanmax(grid.values)) if np.isfinite(grid.values).any() else 1.0
        unit, self.scale = byte_unit(top)
        self.image.setImage(grid.values / self.scale, autoLevels=False)
        self.image.setRect(QRectF(grid.x0, -0.5, (grid.x1 - grid.x0) or 1.0, n))
        self.bar.setLevels((0.0, max(top / self.scale, 1e-9)))
        self.bar.axis.setLabel(f"live ({unit})")
        seconds = grid.axis == "seconds"
        self.time_axis.share = not seconds
        self.time_axis.setLabel("seconds since the earliest rank's trace began" if seconds
                        else "share of each rank's trace (not every rank has times)")
        self.rank_axis.set_rows(labels, marked)
        self.ooms.setData([x for _, x in grid.ooms], [float(r) for r, _ in grid.ooms])
        self.vb.setLimits(xMin=grid.x0, xMax=grid.x1, yMin=-0.5, yMax=n - 0.5)
        self.vb.setRange(xRange=(grid.x0, grid.x1), yRange=(-0.5, n - 0.5), padding=0)

    def _row_rect(self, row: int) -> QRectF:
        g = self.grid
        assert g is not None
        return QRectF(g.x0, row - 0.5, (g.x1 - g.x0) or 1.0, 1.0)

    def set_current_row(self, row: int | None):
        if self.grid is None or row is None:
            self.current.hide()
            return
        self.current.setRect(self._row_rect(row))
        self.current.show()

    def set_chosen_rows(self, rows: list[int]):
        """The rows chosen in the list, outlined (dashed)."""
        for it in self.chosen:
            self.vb.removeItem(it)
        self.chosen = []
        if self.grid is None:
            return
        for row in rows:
            it = QGraphicsRectItem(self._row_rect(row))
            it.setPen(cosmetic_pen(self.theme.foreground, Qt.PenStyle.DashLine))
            it.setZValue(11)
            self.vb.addItem(it)
            self.chosen.append(it)

    def row_at(self, scene_pos) -> tuple[int, float] | None:
        g = self.grid
        if g is None or not g.ranks or not self.vb.sceneBoundingRect().contains(scene_pos):
            return None
        p = self.vb.mapSceneToView(scene_pos)
        row = int(np.floor(p.y() + 0.5))
        if not (0 <= row < len(g.ranks)):
            return None
        return row, p.x()

    def pos_of(self, row: int, x: float) -> QPoint:
        """Where a point of the picture is, in the plot widget's pixels (for tests and hints)."""
        return self.plot.mapFromScene(self.vb.mapViewToScene(QPointF(x, row)))

    def _on_mouse(self, scene_pos):
        hit = self.row_at(scene_pos)
        g = self.grid
        if hit is None or g is None:
            self.hovered.emit("")
            return
        row, x = hit
        cols = g.values.shape[1]
        col = int(np.clip((x - g.x0) / ((g.x1 - g.x0) or 1.0) * cols, 0, cols - 1))
        v = g.values[row, col]
        where = fmt_seconds(x, span=g.x1) if g.axis == "seconds" else f"{x:.0%} of its trace"
        live = "nothing recorded here" if not np.isfinite(v) else f"up to {fmt_bytes(v)} live"
        self.hovered.emit(f"rank {g.ranks[row]} · {where} · {live} · click to open it")

    def _on_click(self, ev):
        hit = self.row_at(ev.scenePos())
        if hit is None:
            return
        if ev.button() == Qt.MouseButton.LeftButton and not ev.double():
            self.rowClicked.emit(hit[0])
        elif ev.button() == Qt.MouseButton.RightButton:
            self.rowMenu.emit(hit[0], ev.screenPos().toPoint())

    def leaveEvent(self, ev):
        self.hovered.emit("")
        super().leaveEvent(ev)

    def release(self):
        """Let pyqtgraph drop its context menus (parentless QMenus that would outlive the
        window): the colour bar is a plot of its own."""
        self.grid = None
        self.bar.close()
        self.plot.close()
        self.plot.deleteLater()


class RanksView(QWidget):
    """The whole overview: a header, the heatmap and the list of ranks."""

    rankOpened = Signal(int)
    compareRequested = Signal(int, int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.result: RanksResult | None = None
        self.grid: LiveGrid | None = None
        self.current: int | None = None
        self.header = QLabel(self)
        self.header.setWordWrap(True)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.open_btn = QPushButton("Open", self)
        self.open_btn.setToolTip("Show the rank chosen in the list in the window (Enter, or a double-click)")
        self.open_btn.clicked.connect(self._open_chosen)
        self.compare_btn = QPushButton("Compare", self)
        self.compare_btn.clicked.connect(self._compare_chosen)
        top = QHBoxLayout()
        top.setContentsMargins(6, 4, 6, 0)
        top.addWidget(self.header, 1)
        top.addWidget(self.open_btn, 0, Qt.AlignmentFlag.AlignTop)
        top.addWidget(self.compare_btn, 0, Qt.AlignmentFlag.AlignTop)
        self.heatmap = RanksHeatmap(self)
        self.heatmap.rowClicked.connect(self._on_row_clicked)
        self.heatmap.rowMenu.connect(self._on_row_menu)
        self.heatmap.hovered.connect(self._on_hovered)
        self.hint = QLabel(HINT, self)               # muted, yet 4.5:1
        self.hint.setStyleSheet(f"color: {muted_text(self.palette(), QPalette.ColorRole.Window).name()};")
        self.hint.setContentsMargins(6, 0, 6, 2)
        left = QWidget(self)
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.setSpacing(0)
        ll.addWidget(self.heatmap, 1)
        ll.addWidget(self.hint)
        self.table = QTreeWidget(self)
        self.table.setRootIsDecorated(False)
        self.table.setUniformRowHeights(True)
        self.table.setAlternatingRowColors(True)
        self.table.setHeaderLabels(list(COLUMNS))
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.header().setStretchLastSection(False)
        self.table.itemSelectionChanged.connect(self._on_selection)
        self.table.itemActivated.connect(lambda it, _col: self._open_item(it))      # Enter, double-click
        self.split = QSplitter(Qt.Orientation.Horizontal, self)
        self.split.addWidget(left)
        self.split.addWidget(self.table)
        self.split.setStretchFactor(0, 1)
        self.split.setStretchFactor(1, 1)
        self.split.setChildrenCollapsible(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.split, 1)
        self._update_buttons()

    # -- data --------------------------------------------------------------------------------
    def set_result(self, result: RanksResult | None, grid: LiveGrid | None):
        self.result, self.grid = result, grid
        self.table.setSortingEnabled(False)
        self.table.clear()
        if result is None or grid is None:
            self.header.setText("")
            self.heatmap.set_grid(None, [], set())
            self._update_buttons()
            return
        ov = result.overview
        first = ov.first_oom.rank if ov.first_oom is not None else None
        labels, marked = [], set()
        for i, r in enumerate(result.ranks):
            marks = (f" {OOM_MARK}" if r.rank == first else "") + (f" {OUTLIER_MARK}" if r.rank in ov.outliers else "")
            labels.append(f"{r.rank}{marks}")
            if marks:
                marked.add(i)
        self.heatmap.set_grid(grid, labels, marked)
        self.header.setText(self._header_html())
        bold = QFont(self.table.font())
        bold.setBold(True)
        for i, r in enumerate(result.ranks):
            s = r.summary
            notes = rank_notes(result, r)
            leaks = sum(lk["bytes_per_iteration"] for lk in s["leaks"])
            cells = [(str(r.rank), r.rank), (fmt_bytes(r.peak_bytes), r.peak_bytes), ("; ".join(notes), None),
                     (str(len(s["ooms"])) if s["ooms"] else "", len(s["ooms"])),
                     (fmt_bytes(s["reserved_peak_bytes"]), s["reserved_peak_bytes"] or 0),
                     (short_type(s["peak"]["type"]), None),
                     (f"{len(s['leaks'])} ({fmt_bytes(leaks)}/it)" if s["leaks"] else "", leaks),
                     (top_categories(s["peak"]["by_category"], 3), None)]
            it = SortItem(self.table)
            for col, (text, key) in enumerate(cells):
                it.setText(col, text)
                if key is not None:
                    it.setData(col, _SORT, float(key))
            for col in (0, 1, 3, 4, 6):
                it.setTextAlignment(col, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            it.setData(0, RANK_ROLE, r.rank)
            tip = self._rank_tip(i)
            for col in range(len(COLUMNS)):
                it.setToolTip(col, tip)
            if r.rank == first:
                for col in range(len(COLUMNS)):
                    it.setForeground(col, pg.mkColor(OOM_COLOR))
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.set_current(self.current)
        self._update_buttons()
        # the list keeps room for its rank, peak and notes; the picture takes the rest
        cols = sum(max(self.table.sizeHintForColumn(c), self.table.header().sectionSizeHint(c)) for c in range(3))
        self.table.setMinimumWidth(min(cols + self.table.verticalScrollBar().sizeHint().width()
                                       + 2 * self.table.frameWidth() + 16, MAX_LIST_MIN_WIDTH))

    def _header_html(self) -> str:
        res = self.result
        assert res is not None
        ov = res.overview
        name = os.path.basename(os.path.normpath(res.folder)) or res.folder
        parts = [f"<b>{_esc(name)}</b>: {ov.ranks} rank{'s' if ov.ranks != 1 else ''}"
                 + (f" of {ov.world_size}" if ov.world_size is not None else "")
                 + f", peaks {fmt_bytes(ov.peak_min)} to {fmt_bytes(ov.peak_max)}"
                 + (f" (imbalance {ov.imbalance:.2f}, max / median)" if ov.imbalance is not None else "")]
        oom = oom_text(res)
        parts.append(f"<span style='color:{OOM_COLOR}'>{OOM_MARK} {_esc(oom)}</span>" if ov.oom_ranks else _esc(oom))
        if ov.outliers:
            parts.append(f"{OUTLIER_MARK} outlier{'s' if len(ov.outliers) > 1 else ''}: " + ", ".join(
                f"rank {k} ({_esc(versus_median(res.rank(k).peak_bytes, ov.peak_median))})"  # type: ignore[union-attr]
                for k in ov.outliers))
        extra = []
        unread = res.not_snapshots + res.internal_errors
        if unread:
            extra.append(f"{len(unread)} file{'s' if len(unread) != 1 else ''} not read")
        if res.skipped:
            extra.append(f"{len(res.skipped)} older file{'s' if len(res.skipped) != 1 else ''} skipped")
        if ov.missing:
            extra.append(f"{len(ov.missing)} rank{'s' if len(ov.missing) != 1 else ''} missing")
        if extra:
            parts.append(_esc(", ".join(extra)))
        tip = [res.folder, f"An outlier has {OUTLIER_RULE}."]
        tip += [f"Not read: {n.file}: {n.error}" for n in unread[:20]]
        tip += [f"Skipped: {s.path}: {s.reason}" for s in res.skipped[:20]]
        self.header.setToolTip("\n".join(tip))
        return " · ".join(parts)

    def _rank_tip(self, i: int) -> str:
        res = self.result
        assert res is not None
        r = res.ranks[i]
        s = r.summary
        lines = [f"rank {r.rank} ({'from the file order: a guess' if r.rank_source == 'order' else 'from the ' + r.rank_source}"
                 f") · cuda:{r.device}", r.file,
                 f"peak {fmt_bytes(r.peak_bytes)}, {s['peak']['type_words']}",
                 "  " + top_categories(s["peak"]["by_category"], 4)]
        for o in s["ooms"][:3]:
            lines.append(f"OOM: requested {fmt_bytes(o['requested'])}" + (f"; next step: {o['suggestion']}"
                                                                           if o["suggestion"] else ""))
        for lk in s["leaks"][:3]:
            lines.append(f"leak: {fmt_bytes(lk['bytes_per_iteration'])}/iteration at {lk['where']}")
        lines.append("Double-click or Enter to open it")
        return "\n".join(lines)

    def set_current(self, rank: int | None):
        """The rank the window shows (outlined in the picture, bold in the list)."""
        self.current = rank
        rows = self._rows_of([rank]) if rank is not None else []
        self.heatmap.set_current_row(rows[0] if rows else None)
        for k in range(self.table.topLevelItemCount()):
            it = self.table.topLevelItem(k)
            f = it.font(0)
            f.setBold(it.data(0, RANK_ROLE) == rank)
            for col in range(len(COLUMNS)):
                it.setFont(col, f)
        self._update_buttons()

    def _rows_of(self, ranks) -> list[int]:
        if self.result is None:
            return []
        index = {r.rank: i for i, r in enumerate(self.result.ranks)}
        return [index[k] for k in ranks if k in index]

    def chosen(self) -> list[int]:
        """The ranks chosen in the list, in rank order."""
        return sorted(int(it.data(0, RANK_ROLE)) for it in self.table.selectedItems())

    def select(self, ranks: list[int]):
        """Choose these ranks in the list."""
        self.table.clearSelection()
        items = [self.table.topLevelItem(k) for k in range(self.table.topLevelItemCount())
                 if self.table.topLevelItem(k).data(0, RANK_ROLE) in ranks]
        if items:
            self.table.setCurrentItem(items[0])        # Enter opens the current one
            self.table.scrollToItem(items[0])
        for it in items:
            it.setSelected(True)

    # -- actions -----------------------------------------------------------------------------
    def _compare_pair(self) -> tuple[int, int] | None:
        """Two ranks chosen, or one chosen and the one shown: (shown or first, other)."""
        chosen = self.chosen()
        if len(chosen) == 2:
            a, b = chosen
            return (b, a) if b == self.current else (a, b)
        if len(chosen) == 1 and self.current is not None and chosen[0] != self.current:
            return self.current, chosen[0]
        return None

    def _update_buttons(self):
        chosen = self.chosen()
        self.open_btn.setEnabled(len(chosen) == 1)
        pair = self._compare_pair()
        self.compare_btn.setEnabled(pair is not None)
        if pair is not None:
            self.compare_btn.setText(f"Compare {pair[0]} ↔ {pair[1]}")
            self.compare_btn.setToolTip(f"Rank {pair[0]} in the timeline (A), rank {pair[1]} beside it (B), "
                                        "in the Compare panel")
        else:
            self.compare_btn.setText("Compare")
            self.compare_btn.setToolTip("Choose two ranks in the list (Ctrl+click), or one to compare with the "
                                        "rank shown")

    def _on_selection(self):
        self.heatmap.set_chosen_rows(self._rows_of(self.chosen()))
        self._update_buttons()

    def _on_row_clicked(self, row: int):
        if self.result is None:
            return
        rank = self.result.ranks[row].rank
        self.select([rank])
        self.rankOpened.emit(rank)

    def _on_row_menu(self, row: int, where):
        if self.result is None:
            return
        rank = self.result.ranks[row].rank
        menu = QMenu(self)
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        menu.addAction(f"Open rank {rank}", lambda: self.rankOpened.emit(rank))
        if self.current is not None and self.current != rank:
            cur = self.current
            menu.addAction(f"Compare rank {cur} (shown) with rank {rank}",
                           lambda: self.compareRequested.emit(cur, rank))
        menu.popup(where)

    def _on_hovered(self, text: str):
        self.hint.setText(text or HINT)

    def _open_item(self, it):
        self.rankOpened.emit(int(it.data(0, RANK_ROLE)))

    def _open_chosen(self):
        chosen = self.chosen()
        if len(chosen) == 1:
            self.rankOpened.emit(chosen[0])

    def _compare_chosen(self):
        pair = self._compare_pair()
        if pair is not None:
            self.compareRequested.emit(*pair)

    def apply_theme(self, theme: Theme):
        self.heatmap.apply_theme(theme)

    def release(self):
        self.heatmap.release()
