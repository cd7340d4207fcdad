"""The "At this moment" panel: bytes by category at one entry, the largest live allocations,
the allocator's segments."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter, QPalette, QPen
from PySide6.QtWidgets import QHeaderView, QLabel, QSizePolicy, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from ...common.units import fmt_bytes
from ..model import DeviceData, when_text
from ...classifiers.allocator import Segments
from ...present.words import RESERVED_UNALLOCATED_WHY, reserved_unallocated_words
from ...present.memtree import guess_words
from ..theme import Theme, category_color


# -- segments strip --------------------------------------------------------------------------
class SegmentsStrip(QWidget):
    """Each allocator segment as a box as wide as its size; the filled part is allocated."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.segs: Segments | None = None
        self.setMinimumHeight(36)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setToolTip("Allocator segments at this moment, by address: box width ~ reserved size, "
                        "filled part ~ allocated; the rest of a box is reserved but unallocated.")

    def sizeHint(self):
        return QSize(300, 40)

    def set_segments(self, segs: Segments | None):
        self.segs = segs
        self.update()

    def paintEvent(self, ev):
        p = QPainter(self)
        pal = self.palette()
        r = self.rect().adjusted(1, 1, -1, -1)
        p.fillRect(r, pal.color(QPalette.ColorRole.Base))
        s = self.segs
        if s is None or not len(s.size):
            p.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            p.drawText(r, Qt.AlignmentFlag.AlignCenter, "no segments" if s is None or s.known else
                       "no allocator segments in this snapshot")
            p.end()
            return
        total = float(s.size.sum())
        gap = 1.0 if len(s.size) < r.width() / 3 else 0.0
        usable = r.width() - gap * (len(s.size) - 1)
        x = float(r.left())
        fill = category_color("weights")
        empty = QColor(pal.color(QPalette.ColorRole.Text))
        empty.setAlpha(40)
        edge = QPen(pal.color(QPalette.ColorRole.Mid))
        edge.setWidthF(0.5)
        for size, alloc in zip(s.size.tolist(), s.allocated.tolist()):
            w = usable * size / total
            box = QRectF(x, r.top(), max(w, 0.5), r.height())
            p.fillRect(box, empty)
            frac = min(1.0, alloc / size) if size else 0.0
            p.fillRect(QRectF(x, r.top() + r.height() * (1 - frac), max(w, 0.5), r.height() * frac), fill)
            if w > 3:
                p.setPen(edge)
                p.setBrush(Qt.BrushStyle.NoBrush)
                p.drawRect(box)
            x += w + gap
        p.end()


# -- the moment under the cursor -----------------------------------------------------------------
class MomentPanel(QWidget):
    """Bytes by category at one entry, the largest live allocations, the segments."""

    rowClicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.index = None
        self._wanted = None
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(80)
        self._timer.timeout.connect(self._show_wanted)
        self.title = QLabel("<i>Move over the timeline.</i>", self)
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)
        self.cats = QTreeWidget(self)
        self.cats.setHeaderLabels(["Category", "Live", "Share"])
        self.cats.setRootIsDecorated(False)
        self.cats.setToolTip("Live bytes by category at this moment")
        self.cats.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.largest = QTreeWidget(self)
        self.largest.setHeaderLabels(["Size", "Category", "Where"])
        self.largest.setRootIsDecorated(False)
        self.largest.setToolTip("The largest allocations live at this moment; click one to select it")
        self.largest.header().setStretchLastSection(True)
        self.largest.itemClicked.connect(self._on_item)
        self.seg_label = QLabel(self)
        self.seg_label.setWordWrap(True)
        self.seg_label.setToolTip("Reserved: memory the caching allocator holds from the driver. "
                                  + RESERVED_UNALLOCATED_WHY)
        self.strip = SegmentsStrip(self)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.title)
        lay.addWidget(self.cats)
        lay.addWidget(QLabel("<b>Largest live allocations</b>", self))
        lay.addWidget(self.largest, 1)
        lay.addWidget(QLabel("<b>Allocator segments</b>", self))
        lay.addWidget(self.seg_label)
        lay.addWidget(self.strip)

    def set_data(self, data: DeviceData | None):
        self.data = data
        self.index = None
        self.cats.clear()
        self.largest.clear()
        self.strip.set_segments(None)
        self.seg_label.setText("")
        self.title.setText("<i>Move over the timeline.</i>")

    def request_index(self, i: int):
        """Show entry i soon: hovering asks often, each answer scans live rows, so
        requests are coalesced to one every 80 ms."""
        self._wanted = i
        if not self._timer.isActive():
            self._timer.start()

    def _show_wanted(self):
        if self._wanted is not None:
            self.show_index(self._wanted)

    def show_index(self, i: int):
        d = self.data
        self._wanted = None
        if d is None or i == self.index:
            return
        self.index = i
        comp = d.composition([i])[0]
        live = d.live_at(i)
        res = d.reserved_at(i)
        self.title.setText(f"<b>{when_text(d, i)}</b><br>live <b>{fmt_bytes(live)}</b>"
                           + (f" · reserved {fmt_bytes(res)}" if res is not None else ""))
        self.cats.clear()
        order = np.argsort(-comp)
        g = d.guessed_composition([i])
        guessed = g[0] if g is not None else np.zeros(len(comp))
        theme = Theme.from_palette(self.palette())
        for c in order:
            v = comp[c]
            if v <= 0:
                continue
            name = d.category_name(int(c))
            sure = guess_words(int(v), int(guessed[c]))
            it = QTreeWidgetItem([f"{name} ({sure})" if sure else name, fmt_bytes(v),
                                  f"{100.0 * v / live:.1f}%" if live > 0 else "-"])
            color = category_color(name)
            it.setData(0, Qt.ItemDataRole.DecorationRole, theme.guess_color(color) if guessed[c] >= v else color)
            if sure:
                it.setToolTip(0, f"{fmt_bytes(int(guessed[c]))} of the {name} live here is a guess (no frames, live "
                                 f"before recording began): drawn in the paler shade")
            it.setTextAlignment(1, Qt.AlignmentFlag.AlignRight)
            it.setTextAlignment(2, Qt.AlignmentFlag.AlignRight)
            self.cats.addTopLevelItem(it)
        self._fit_cats()
        self.largest.clear()
        for row in d.largest_live(i, 12):
            row = int(row)
            name = d.category_name(int(d.category[row]))
            guess = d.guessed(row)
            it = QTreeWidgetItem([fmt_bytes(int(d.allocs.size[row])), f"{name} (a guess)" if guess else name,
                                  d.stack_label(int(d.allocs.stack[row]))])
            it.setData(0, Qt.ItemDataRole.UserRole, row)
            color = category_color(name)
            it.setData(1, Qt.ItemDataRole.DecorationRole, theme.guess_color(color) if guess else color)
            it.setTextAlignment(0, Qt.AlignmentFlag.AlignRight)
            self.largest.addTopLevelItem(it)
        self.largest.resizeColumnToContents(0)
        self.largest.resizeColumnToContents(1)
        segs = d.segments.at(i)
        self.strip.set_segments(segs)
        if not segs.known:
            self.seg_label.setText("<i>This snapshot has no allocator segments (profiler-converted).</i>")
        else:
            big = int(segs.size.max()) if len(segs.size) else 0
            self.seg_label.setText(
                f"{len(segs.size):,} segments · "
                f"<b>{reserved_unallocated_words(d.reserved_at(i), d.da.reserved_unallocated_at(i))}</b> · "
                f"largest segment {fmt_bytes(big)}")

    def _fit_cats(self):
        """As tall as its rows really are (their height comes from the style and the colour
        swatch, not the font alone), so the last one never hides under the next heading."""
        t = self.cats
        n = t.topLevelItemCount()
        rows = sum(t.sizeHintForRow(k) for k in range(n)) if n else self.fontMetrics().height() + 6
        t.setFixedHeight(t.header().sizeHint().height() + rows + 2 * t.frameWidth() + 2)

    def _on_item(self, item, _col):
        row = item.data(0, Qt.ItemDataRole.UserRole)
        if row is not None:
            self.rowClicked.emit(int(row))
