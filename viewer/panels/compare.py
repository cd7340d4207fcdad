"""The Compare panel (issue 15): the file shown in the timeline (A) beside another recording
of the same run (B), for the device the timeline shows.

  * both live totals on one x axis, aligned at each side's first iteration's start (seconds
    when both sides have usable time stamps, else entries) or by iteration (each iteration
    one unit wide), each peak marked; exact per pixel column at every zoom;
  * live bytes by category at both peaks side by side: the table's A and B columns draw
    their bars on one scale, in the category's colour;
  * the code sites live at the two peaks with A, B and B - A, largest change first, their
    lines beneath (sortable); a click shows the site's allocations live at A's peak in the
    allocations table (double-click or Enter).
The numbers are the typed comparison `vramscope compare` prints (CompareResult.comparison,
classifiers/compare.py), worded by the presentation layer as the command line words them.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QRectF, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QSplitter,
    QStyledItemDelegate,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...classifiers import STACK_ORDER
from ...classifiers.compare import DeviceComparison
from ...common.units import fmt_bytes, fmt_seconds
from ...present.markup import html as _esc
from ...present.stacks import site_where
from ...present.words import COMPARE_X_TITLES, comparison_headline, moment_text, peak_words, signed_bytes
from ..model.compare import (
    ALIGN_ITERATION,
    ALIGN_START,
    AlignedSide,
    CompareResult,
    aligned_sides,
    can_align_iterations,
    shared_seconds,
)
from ..theme import Theme, category_color, muted_text
from ..timeline.items import BytesAxis, TimeAxis, cosmetic_pen
from .compare_header import CompareHeader

A_COLOR, B_COLOR = "#4E79A7", "#E15759"      # as the report's compare.png
_SORT = Qt.ItemDataRole.UserRole + 10         # per column: the number a column sorts by
_BAR = Qt.ItemDataRole.UserRole + 11          # (fraction of the widest bar, colour, side)
SITE_ROLE = Qt.ItemDataRole.UserRole + 12     # a site row: its index in the comparison's sites


# -- the totals ------------------------------------------------------------------------------
class CompareAxis(TimeAxis):
    """Seconds, entries, or iterations (tick k at the start of iteration k + 1)."""

    iterations = False

    def tickSpacing(self, minVal, maxVal, size):
        levels = super().tickSpacing(minVal, maxVal, size)
        if self.iterations:
            levels = [(sp, off) for sp, off in levels if sp >= 1] or [(1.0, 0.0)]
        return levels

    def tickStrings(self, values, scale, spacing):
        if self.iterations:
            return [f"{int(round(v)) + 1}" for v in values]
        return super().tickStrings(values, scale, spacing)


class CompareTotals(QWidget):
    """Both sides' live memory on one axis, with their peaks."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.sides: tuple[AlignedSide, AlignedSide] | None = None
        self.mode = ALIGN_START
        self.seconds = False
        self.top = 1                   # the higher of the two peaks, bytes
        self.x_titles = COMPARE_X_TITLES["entries"]
        self._x_title_fit: tuple | None = None
        self.axis_x = CompareAxis("bottom")
        self.axis_y = BytesAxis("left")
        for ax in (self.axis_x, self.axis_y):
            ax.enableAutoSIPrefix(False)
        self.plot = pg.PlotWidget(axisItems={"bottom": self.axis_x, "left": self.axis_y})
        pi = self.plot.getPlotItem()
        pi.hideButtons()
        pi.setMenuEnabled(False)
        pi.getAxis("left").setWidth(64)
        self.vb = pi.getViewBox()
        self.vb.setMouseEnabled(x=True, y=False)
        self.vb.setMenuEnabled(False)
        self.curves, self.peak_lines, self.peak_labels = [], [], []
        for color in (A_COLOR, B_COLOR):
            c = pg.PlotCurveItem(connect="all", skipFiniteCheck=True)
            pen = cosmetic_pen(color)
            pen.setWidthF(1.5)
            c.setPen(pen)
            self.vb.addItem(c, ignoreBounds=True)
            self.curves.append(c)
            ln = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(color, width=1, style=Qt.PenStyle.DashLine))
            self.vb.addItem(ln, ignoreBounds=True)
            self.peak_lines.append(ln)
            t = pg.TextItem(color=color, anchor=(0, 0))
            t.setZValue(5)
            self.vb.addItem(t, ignoreBounds=True)
            self.peak_labels.append(t)
        self.hover_line = pg.InfiniteLine(angle=90, movable=False)
        self.hover_line.hide()
        self.vb.addItem(self.hover_line, ignoreBounds=True)
        self.hover_label = pg.TextItem(anchor=(0, 0))
        self.hover_label.setZValue(20)
        self.hover_label.hide()
        self.vb.addItem(self.hover_label, ignoreBounds=True)
        self.plot.scene().sigMouseMoved.connect(self._on_mouse)
        self.plot.scene().sigMouseClicked.connect(self._on_click)
        self.vb.sigXRangeChanged.connect(self._schedule)
        self.vb.sigResized.connect(self._schedule)
        self._pending = False
        self.refresh_count = 0
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)
        # no tooltip over the plot: the hover box tells the values (a tooltip would cover it)
        self.apply_theme(Theme.from_palette(self.palette()))

    def apply_theme(self, theme: Theme):
        self.plot.setBackground(theme.background)
        for name in ("left", "bottom"):
            ax = self.plot.getPlotItem().getAxis(name)
            ax.setPen(theme.muted)
            ax.setTextPen(theme.foreground)
        self.hover_line.setPen(pg.mkPen(theme.muted, width=1, style=Qt.PenStyle.DotLine))
        self.hover_label.fill = pg.mkBrush(theme.hover_bg)
        self.hover_label.border = pg.mkPen(theme.muted)
        self.hover_label.setColor(theme.foreground)
        bg = QColor(theme.background)
        bg.setAlpha(215)
        for t in self.peak_labels:
            t.fill = pg.mkBrush(bg)

    def set_sides(self, sides: tuple[AlignedSide, AlignedSide] | None, mode: str):
        self.sides = sides
        if sides is None:
            for c in self.curves:
                c.setData([], [])
            for it in self.peak_lines + self.peak_labels:
                it.hide()
            return
        self.set_mode(mode)

    def set_mode(self, mode: str):
        sides = self.sides
        assert sides is not None
        self.mode = mode if mode != ALIGN_ITERATION or can_align_iterations(*sides) else ALIGN_START
        a, b = sides
        self.seconds = shared_seconds(a, b)
        it = self.mode == ALIGN_ITERATION
        self.axis_x.iterations = it
        self.axis_x.has_time = self.seconds and not it
        self.x_titles = COMPARE_X_TITLES["iteration" if it else "seconds" if self.seconds else "entries"]
        self.axis_x.setToolTip(self.x_titles[0])
        self._x_title_fit = None
        spans = [s.x_span(self.mode, self.seconds) for s in sides if s.n]
        lo = min((x for x, _ in spans), default=0.0)
        hi = max((x for _, x in spans), default=1.0)
        if not hi > lo:
            lo, hi = lo - 0.5, hi + 0.5
        pad = (hi - lo) * 0.01
        self.vb.setLimits(xMin=lo - pad, xMax=hi + pad)
        self.vb.setXRange(lo - pad, hi + pad, padding=0)
        self.top = max(max(s.side.peak.bytes for s in sides), 1)
        self.vb.setYRange(0, self.top * 1.22, padding=0)
        for k, s in enumerate(sides):
            pk = s.side.peak
            x = float(s.x_of_index(max(pk.index, 0), self.mode, self.seconds)) if s.n else lo
            self.peak_lines[k].setPos(x)
            self.peak_lines[k].show()
            self.peak_labels[k].setText(f"{'AB'[k]} peak {fmt_bytes(pk.bytes)}")
            self.peak_labels[k].show()
        self.refresh()

    def _place_peak_labels(self):
        """Each peak's words beside its line, inside the plot and clear of the other's: side
        by side when there is room (A left of its line, B right of its, when A comes first),
        else in two rows, with the y range giving them room above both curves. In pixels, so
        again on every zoom and resize."""
        w, h = self.vb.width(), self.vb.height()
        (x0, x1), _ = self.vb.viewRange()
        if not (w > 0 and h > 0 and x1 > x0):
            return
        xs = [(ln.value() - x0) / (x1 - x0) * w for ln in self.peak_lines]
        sizes = [lab.boundingRect() for lab in self.peak_labels]
        shown = [0 <= x <= w for x in xs]           # a line zoomed out of view takes no room

        def span(k, right):
            return (xs[k], xs[k] + sizes[k].width()) if right else (xs[k] - sizes[k].width(), xs[k])

        def inside(k, right):
            lo, hi = span(k, right)
            return lo >= 0 and hi <= w

        placed = None
        for ra, rb in ((True, True), (False, True), (True, False), (False, False)):
            if all(inside(k, r) for k, r in ((0, ra), (1, rb)) if shown[k]):
                (a0, a1), (b0, b1) = span(0, ra), span(1, rb)
                if not all(shown) or a1 + 4 <= b0 or b1 + 4 <= a0:
                    placed = ((ra, 0), (rb, 0))
                    break
        if placed is None:
            placed = tuple((inside(k, True) or not inside(k, False), k) for k in range(2))
        rows = max(row for _, row in placed) + 1
        row_h = max(r.height() for r in sizes) + 3          # rows apart, not touching
        # the labels' rows above the higher peak (and at least the old 22% of headroom)
        room = min(0.6, (rows * row_h + 6) / h)
        y1 = max(self.top * 1.22, self.top / (1 - room))
        self.vb.setYRange(0, y1, padding=0)
        for lab, (right, row), x in zip(self.peak_labels, placed, (ln.value() for ln in self.peak_lines)):
            lab.setAnchor((0, 0) if right else (1, 0))
            lab.setPos(x, y1 - (1 + row * row_h) * y1 / h)

    def _schedule(self, *args):
        if not self._pending:
            self._pending = True
            QTimer.singleShot(0, self, self.refresh)

    def refresh(self):
        """Both envelopes for the view, one column per device pixel."""
        self._pending = False
        if self.sides is None:
            return
        (x0, x1), _ = self.vb.viewRange()
        buckets = max(16, int(round(self.vb.width() * self.devicePixelRatioF())))
        for c, s in zip(self.curves, self.sides):
            xs, ys = s.envelope(x0, x1, buckets, self.mode, self.seconds)
            c.setData(xs, ys)
        self._place_peak_labels()
        self._fit_x_title()
        self.refresh_count += 1

    def _fit_x_title(self):
        """The longest axis title that fits the axis whole (the tooltip has the longest); again
        when the plot's width or the alignment changed."""
        width = self.axis_x.width()
        if self._x_title_fit == (self.x_titles, width) or not width > 0:
            return
        self._x_title_fit = (self.x_titles, width)
        for title in self.x_titles:
            self.axis_x.setLabel(title)
            if self.axis_x.label.boundingRect().width() <= width:
                break
        self.axis_x.resizeEvent()          # pyqtgraph centres its label only on a resize

    def values_at(self, x: float) -> tuple[int | None, int | None]:
        assert self.sides is not None
        a, b = self.sides
        return a.live_before_x(x, self.mode, self.seconds), b.live_before_x(x, self.mode, self.seconds)

    def x_text(self, x: float) -> str:
        """Where x is, as the axis counts: 'iteration 2, 40% in', '+1.234 s' or 'entry +1,234'
        (seconds and entries from each side's first iteration's start)."""
        if self.mode == ALIGN_ITERATION:
            k = int(np.floor(x))
            return f"iteration {k + 1}, {x - k:.0%} in"
        if self.seconds:
            (x0, x1), _ = self.vb.viewRange()
            return ("+" if x >= 0 else "") + fmt_seconds(x, (x1 - x0) / 1000, max(abs(x0), abs(x1)))
        return f"entry {int(round(x)):+,}"

    def _on_mouse(self, pos):
        if self.sides is None or not self.vb.sceneBoundingRect().contains(pos):
            self.hover_line.hide()
            self.hover_label.hide()
            return
        p = self.vb.mapSceneToView(pos)
        va, vb = self.values_at(p.x())
        parts = [_esc(self.x_text(p.x())),
                 f"<span style='color:{A_COLOR}'>A</span> {fmt_bytes(va) if va is not None else '—'}",
                 f"<span style='color:{B_COLOR}'>B</span> {fmt_bytes(vb) if vb is not None else '—'}"]
        if va is not None and vb is not None:
            parts.append(f"B − A {_esc(signed_bytes(vb - va))}")
        self.hover_label.setHtml("<div style='font-size:9pt'>" + " · ".join(parts) + "</div>")
        (x0, x1), (y0, y1) = self.vb.viewRange()
        # beside the pointer, kept whole inside the plot (moved along when it would not fit)
        left = self.vb.sceneBoundingRect().left()
        px = self.vb.mapViewToScene(p).x() - left
        vb_w = self.vb.width()
        box_w = self.hover_label.boundingRect().width()
        bx = px + 8 if px + 8 + box_w <= vb_w else px - 8 - box_w
        bx = min(max(bx, 2.0), max(2.0, vb_w - box_w - 2))
        self.hover_label.setAnchor((0, 0))
        self.hover_label.setPos(self.vb.mapSceneToView(pg.Point(left + bx, 0)).x(), y0 + (y1 - y0) * 0.995)
        self.hover_line.setPos(p.x())
        self.hover_line.show()
        self.hover_label.show()

    def _on_click(self, ev):
        if ev.double() and self.sides is not None:
            self.set_mode(self.mode)          # the whole of both runs again

    def leaveEvent(self, ev):
        self.hover_line.hide()
        self.hover_label.hide()
        super().leaveEvent(ev)

    def release(self):
        self.sides = None
        self.plot.close()
        self.plot.deleteLater()


# -- tables ------------------------------------------------------------------------------------
class SortItem(QTreeWidgetItem):
    """Sorts by the number a column holds (`_SORT`), else by its text."""

    def __lt__(self, other):
        tree = self.treeWidget()
        col = tree.sortColumn() if tree is not None else 0
        a, b = self.data(col, _SORT), other.data(col, _SORT)
        if a is not None and b is not None:
            return a < b
        return self.text(col).lower() < other.text(col).lower()


class BarDelegate(QStyledItemDelegate):
    """A bar behind the number: its share of the widest value in the table, in the
    category's colour (A lighter, outlined in A's colour; B solid): both peaks side by side."""

    def paint(self, painter, option, index):
        bar = index.data(_BAR)
        if bar is not None:
            frac, color, side = bar
            # left of the number, which stays readable on the cell's own background
            text_w = option.fontMetrics.horizontalAdvance(str(index.data(Qt.ItemDataRole.DisplayRole) or ""))
            r = QRectF(option.rect).adjusted(3, 3, -(text_w + 12), -3)
            r.setWidth(max(0.0, r.width() * min(1.0, frac)))
            if r.width() > 0:
                c = QColor(color)
                if side == "a":
                    c.setAlpha(120)
                painter.save()
                painter.fillRect(r, c)
                painter.setPen(QColor(A_COLOR if side == "a" else B_COLOR))
                painter.drawRect(r.adjusted(0, 0, -1, -1))
                painter.restore()
        super().paint(painter, option, index)


def _num_item(texts: list[str], numbers: list) -> SortItem:
    it = SortItem(texts)
    for col, v in enumerate(numbers):
        if v is not None:
            it.setData(col, _SORT, v)
            it.setTextAlignment(col, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return it


class ComparePanel(QWidget):
    """The comparison of one device: header (files, swap, alignment), totals, categories, sites."""

    swapRequested = Signal()
    closeRequested = Signal()
    siteChosen = Signal(int)           # index into the shown device's sites

    def __init__(self, parent=None):
        super().__init__(parent)
        self.result: CompareResult | None = None
        self.name_of: Callable[[str], str | None] = lambda path: None
        self.device: int | None = None
        self.dc: DeviceComparison | None = None
        self.header = CompareHeader(A_COLOR, B_COLOR, self)
        self.files, self.align = self.header.files, self.header.align
        self.swap_button, self.close_button = self.header.swap_button, self.header.close_button
        self.header.swapRequested.connect(self.swapRequested)
        self.header.closeRequested.connect(self.closeRequested)
        self.align.currentIndexChanged.connect(self._on_align)
        self.headline = QLabel(self)
        self.headline.setWordWrap(True)
        self.headline.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.totals = CompareTotals(self)
        self.cats = QTreeWidget(self)
        self.cats.setHeaderLabels(["At the peaks", "A", "B", "B − A"])
        self.cats.setRootIsDecorated(False)
        self.cats.setItemDelegate(BarDelegate(self.cats))
        self.cats.setToolTip("Live bytes by category at each side's own peak: the bars share one scale")
        self.sites = QTreeWidget(self)
        self.sites.setHeaderLabels(["Code site", "A", "B", "B − A"])
        self.sites.setSortingEnabled(True)
        self.sites.setToolTip("The code that made what was live at each peak, matched across the files by path "
                              "tail and function; largest change first (sort by any column). Double-click a site (or "
                              "Enter) for its allocations live at A's peak, in the Allocations tab.")
        self.sites.headerItem().setToolTip(3, "B − A; sorted by the size of the change, either way")
        self.sites.itemActivated.connect(self._on_site)
        # a site too long for its column keeps its two ends (the package and the function);
        # its tooltip has it whole
        self.sites.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.cats.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.cats.viewport().installEventFilter(self)
        for t in (self.cats, self.sites):
            t.setUniformRowHeights(True)
            t.setAlternatingRowColors(True)
            t.header().setStretchLastSection(False)
            t.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        # the totals on the left; the categories (a few rows) over the sites on the right
        self.tables = QSplitter(Qt.Orientation.Vertical, self)
        self.tables.addWidget(self.cats)
        self.tables.addWidget(self.sites)
        self.tables.setStretchFactor(0, 0)
        self.tables.setStretchFactor(1, 1)
        self.split = QSplitter(Qt.Orientation.Horizontal, self)
        self.split.addWidget(self.totals)
        self.split.addWidget(self.tables)
        self.split.setStretchFactor(0, 1)
        self.split.setStretchFactor(1, 1)
        # halves, and the categories as tall as their rows, until the user drags a handle
        self._user_sized = False
        for sp in (self.split, self.tables):
            sp.splitterMoved.connect(self._on_user_sized)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.setSpacing(3)
        lay.addWidget(self.header)
        lay.addWidget(self.headline)
        lay.addWidget(self.split, 1)

    # -- content -----------------------------------------------------------------------------
    def set_result(self, result: CompareResult | None, device: int | None,
                   name_of: Callable[[str], str | None] | None = None):
        """`name_of(path)`: what to call a side instead of its file name ('rank 3'), None: its file."""
        self.result = result
        self.name_of = name_of or (lambda path: None)
        self.show_device(device)

    def show_device(self, device: int | None):
        """The comparison of `device` (the timeline's), or why there is none."""
        self.device = device
        r = self.result
        self.dc = r.device(device) if r is not None else None
        self.cats.clear()
        self.sites.clear()
        if r is None:
            self.header.set_paths(None)
            self.headline.setText("<i>File > Compare With… sets another recording of the same run (B) beside the "
                                  "file shown (A).</i>")
            self.totals.set_sides(None, ALIGN_START)
            return
        # long names (a project's prefix, a config in the name) cut in the middle: the header
        # must never make the window wider than the screen (the tooltip has both paths)
        self.header.set_paths((r.a.path, r.b.path), (self.name_of(r.a.path), self.name_of(r.b.path)))
        notes = r.notes()
        if self.dc is None:
            compared = ", ".join(f"cuda:{d}" for d in r.devices)
            self.headline.setText(f"<b>cuda:{device}</b> is not compared: it has data in one file only. "
                                  f"Compared: {compared} (choose it in the device list).")
            self.totals.set_sides(None, ALIGN_START)
            return
        text = f"<b>cuda:{self.dc.device}</b>: {_esc(comparison_headline(self.dc))}"
        for name, side in (("A", self.dc.a), ("B", self.dc.b)):
            pk = side.peak
            it = f", iteration {pk.iteration}" if pk.iteration is not None else ""
            text += f"<br>{name} peak {moment_text(pk.index, side.state_only)}{it}, " \
                    f"{_esc(peak_words(pk.type, side.state_only))}"
        text += "".join(f"<br><i>note: {_esc(n)}</i>" for n in notes)
        self.headline.setText(text)
        sides = aligned_sides(r, self.dc)
        can_it = can_align_iterations(*sides)
        model = self.align.model()
        model.item(1).setEnabled(can_it)
        model.item(1).setToolTip("" if can_it else "Needs iterations found in both files")
        if not can_it and self.align.currentData() == ALIGN_ITERATION:
            self.align.setCurrentIndex(0)
        self.totals.set_sides(sides, self.align.currentData())
        self._fill_categories()
        self._fill_sites()

    def _fill_categories(self):
        dc = self.dc
        assert dc is not None
        ca, cb = dc.a.peak.by_category, dc.b.peak.by_category
        deltas = dc.by_category_delta
        order = sorted(deltas, key=lambda c: (-max(ca.get(c, 0), cb.get(c, 0)), STACK_ORDER.index(c)
                                              if c in STACK_ORDER else len(STACK_ORDER), c))
        widest = max([ca.get(c, 0) for c in order] + [cb.get(c, 0) for c in order] + [1])
        pa, pb = dc.a.peak.bytes, dc.b.peak.bytes
        total = _num_item(["peak live", fmt_bytes(pa), fmt_bytes(pb), signed_bytes(dc.peak_delta)],
                          [None, pa, pb, dc.peak_delta])
        f = total.font(0)
        f.setBold(True)
        for col in range(4):
            total.setFont(col, f)
        self.cats.addTopLevelItem(total)
        for c in order:
            a, b = ca.get(c, 0), cb.get(c, 0)
            it = _num_item([c, fmt_bytes(a), fmt_bytes(b), signed_bytes(deltas[c])], [None, a, b, deltas[c]])
            col = category_color(c)
            it.setData(0, Qt.ItemDataRole.DecorationRole, col)
            it.setData(1, _BAR, (a / widest, col, "a"))
            it.setData(2, _BAR, (b / widest, col, "b"))
            if deltas[c]:
                it.setForeground(3, QColor("#2E7D32") if deltas[c] < 0 else QColor("#C62828"))
            self.cats.addTopLevelItem(it)
        self._fit(self.cats)

    def _fill_sites(self):
        self.sites.setSortingEnabled(False)
        muted = muted_text(self.sites.palette())
        dc = self.dc
        assert dc is not None
        for k, s in enumerate(dc.sites):
            where = site_where(s.file, s.function)
            # the Delta column sorts by the size of the change: largest change first, either way
            it = _num_item([where, fmt_bytes(s.a_bytes), fmt_bytes(s.b_bytes), signed_bytes(s.delta)],
                           [None, s.a_bytes, s.b_bytes, (abs(s.delta), max(s.a_bytes, s.b_bytes))])
            it.setData(0, _SORT, None)
            it.setData(0, SITE_ROLE, k)
            it.setToolTip(0, f"{where}\nA: {s.a_count:,} allocations · B: {s.b_count:,}")
            moved = [ln for ln in s.lines if ln.delta and ln.line]
            if len(s.lines) > 1:
                for ln in moved:
                    sub = _num_item([f"line {ln.line}", fmt_bytes(ln.a_bytes), fmt_bytes(ln.b_bytes),
                                     signed_bytes(ln.delta)],
                                    [None, ln.a_bytes, ln.b_bytes, (abs(ln.delta), max(ln.a_bytes, ln.b_bytes))])
                    sub.setData(0, _SORT, float(ln.line))
                    for col in range(4):
                        sub.setForeground(col, muted)
                    sub.setData(0, SITE_ROLE, k)
                    it.addChild(sub)
            self.sites.addTopLevelItem(it)
        self.sites.setSortingEnabled(True)
        self.sites.sortByColumn(3, Qt.SortOrder.DescendingOrder)
        self._fit(self.sites)

    def _fit(self, tree: QTreeWidget):
        """Number columns as wide as their numbers; in the categories, the bars take what the
        names and the change leave (again on every resize)."""
        fm = tree.fontMetrics()
        for col in (1, 2, 3):
            tree.resizeColumnToContents(col)
            tree.setColumnWidth(col, tree.columnWidth(col) + 6)
        if tree is self.cats:
            # as tall as its rows, up to half the panel: the sites take the rest
            n = tree.topLevelItemCount()
            rows = sum(tree.sizeHintForRow(k) for k in range(n)) if n else fm.height() + 6
            self._cats_height = tree.header().sizeHint().height() + rows + 2 * tree.frameWidth() + 4
            tree.setMaximumHeight(self._cats_height)
            self._widen_bars()
        self._size_parts()

    def _widen_bars(self):
        t = self.cats
        n = t.topLevelItemCount()
        if not n:
            return
        fm = t.fontMetrics()
        name = max(fm.horizontalAdvance(t.topLevelItem(k).text(0)) for k in range(n)) + 44   # swatch, padding
        number = max(fm.horizontalAdvance(t.topLevelItem(k).text(c)) for k in range(n) for c in (1, 2)) + 16
        bar = max(number, (t.viewport().width() - name - t.columnWidth(3)) // 2)
        t.setColumnWidth(1, bar)
        t.setColumnWidth(2, bar)

    def eventFilter(self, obj, ev):
        if obj is self.cats.viewport() and ev.type() == QEvent.Type.Resize:
            self._widen_bars()
        return super().eventFilter(obj, ev)

    _cats_height = 0

    def _on_user_sized(self, *_):
        self._user_sized = True

    def _sites_width(self) -> int:
        """The width the site table needs to show every site's name whole."""
        t = self.sites
        n = t.topLevelItemCount()
        if not n:
            return 0
        fm = t.fontMetrics()
        names = max(fm.horizontalAdvance(t.topLevelItem(k).text(0)) for k in range(n))
        numbers = sum(t.columnWidth(c) for c in (1, 2, 3))
        return (names + t.indentation() + 16 + numbers + t.verticalScrollBar().sizeHint().width()
                + 2 * t.frameWidth())

    MAX_TABLES_SHARE = 0.62            # the plot keeps the rest

    def _size_parts(self):
        if self._user_sized:
            return
        w = self.split.width()
        if w > 0:
            # the tables as wide as the site names need (half at least), the plot the rest
            right = min(max(w // 2, self._sites_width()), int(w * self.MAX_TABLES_SHARE))
            self.split.setSizes([w - right, right])
        h = self.tables.height()
        if h > 0 and self._cats_height:
            top = min(self._cats_height, h // 2)
            self.tables.setSizes([top, h - top])

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        self._size_parts()

    def site_rows(self) -> list[tuple[str, str, str, str]]:
        """The site table as shown, top to bottom (sites only)."""
        t = self.sites
        return [tuple(t.topLevelItem(k).text(c) for c in range(4)) for k in range(t.topLevelItemCount())]

    def category_rows(self) -> dict[str, tuple[str, str, str]]:
        t = self.cats
        return {t.topLevelItem(k).text(0): tuple(t.topLevelItem(k).text(c) for c in (1, 2, 3))
                for k in range(t.topLevelItemCount())}

    # -- interaction ----------------------------------------------------------------------------
    def _on_align(self, _idx: int):
        if self.totals.sides is None:
            return
        self.totals.set_mode(self.align.currentData())
        if self.totals.mode != self.align.currentData():
            # by iteration needs iterations on both sides: the combo says what is drawn
            with QSignalBlocker(self.align):
                self.align.setCurrentIndex(self.align.findData(self.totals.mode))

    def _on_site(self, item, _col=0):
        k = item.data(0, SITE_ROLE)
        if k is not None:
            self.siteChosen.emit(int(k))

    def apply_theme(self, theme: Theme):
        self.totals.apply_theme(theme)

    def release(self):
        self.totals.release()


__all__ = ["ComparePanel", "CompareTotals", "A_COLOR", "B_COLOR"]
