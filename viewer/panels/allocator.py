"""The Allocator panel: every segment of the caching allocator at one trace entry, with the
blocks inside it (allocated, rounding waste, pending free, cached) and the totals, as the
analysis computes them (classifiers/allocator.py); the event at that entry in words over it
(present/events.py) and the history of events beside it (events.py), in step with it; arrow
keys step through the trace an entry at a time."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QItemSelectionModel, QPoint, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from ...classifiers.allocator import AllocatorState
from ...classifiers.events import next_segment_event
from ...common.units import fmt_bytes, fmt_seconds
from ...present.events import event_header
from ...present.markup import html as _esc
from ...present.words import RESERVED_UNALLOCATED_WHY, largest_free_words, reserved_unallocated_words
from ..model import DeviceData
from ..theme import category_color, muted_text
from .events import EventList

PENDING_COLOR = "#F28E2B"
ROW_H = 16
ROW_GAP = 3
LABEL_W = 190
MIN_BAR = 28


class SegmentMap(QWidget):
    """One row per segment (address order), as wide as its size next to the largest one;
    blocks drawn at their place inside it."""

    rowClicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.state: AllocatorState | None = None
        self.highlight_segment = -1        # address of a segment to outline (a timeline click)
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(40)

    def set_state(self, data: DeviceData | None, state: AllocatorState | None):
        self.data, self.state = data, state
        n = len(state.segments) if state is not None else 0
        self.setFixedHeight(max(40, n * (ROW_H + ROW_GAP) + 6))
        self.update()

    def sizeHint(self):
        return QSize(600, self.height())

    def _geometry(self):
        """(x of the bars, pixels per byte)."""
        st = self.state
        biggest = max((s.size for s in st.segments), default=1)
        avail = max(60, self.width() - LABEL_W - 8)
        return LABEL_W, avail / biggest

    def paintEvent(self, ev):
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        st, d = self.state, self.data
        if st is None or d is None or not st.segments:
            p.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter,
                       "no allocator segments in this snapshot" if st is not None and not st.known else
                       "no segments at this moment")
            p.end()
            return
        x0, ppb = self._geometry()
        free_c = QColor(pal.color(QPalette.ColorRole.Text))
        free_c.setAlpha(28)
        text_c = pal.color(QPalette.ColorRole.Text)
        muted = muted_text(pal)
        edge = QPen(pal.color(QPalette.ColorRole.Mid))
        pending = QBrush(QColor(PENDING_COLOR), Qt.BrushStyle.BDiagPattern)
        cats = d.category
        colors = {}
        many_streams = len(st.streams) > 1
        top_visible = ev.rect().top() - ROW_H
        bottom_visible = ev.rect().bottom() + ROW_H
        fm = p.fontMetrics()
        for k, s in enumerate(st.segments):
            y = 3 + k * (ROW_H + ROW_GAP)
            if y < top_visible or y > bottom_visible:
                continue
            label = f"0x{s.address:x} · {fmt_bytes(s.size)}" + (f" · s{s.stream}" if many_streams else "")
            p.setPen(muted if s.small else text_c)
            p.drawText(QRectF(4, y, LABEL_W - 8, ROW_H), Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                       fm.elidedText(label, Qt.TextElideMode.ElideMiddle, LABEL_W - 8))
            w = max(MIN_BAR, s.size * ppb)
            scale = w / s.size
            bar = QRectF(x0, y, w, ROW_H)
            p.fillRect(bar, free_c)
            a, b = s.first_block, s.first_block + s.n_blocks
            for addr, size, rnd, row, pend in zip(st.block_addr[a:b].tolist(), st.block_size[a:b].tolist(),
                                                  st.block_rounded[a:b].tolist(), st.block_row[a:b].tolist(),
                                                  st.block_pending[a:b].tolist()):
                bx = x0 + (addr - s.address) * scale
                bw = max(1.0, rnd * scale)
                if pend:
                    p.fillRect(QRectF(bx, y, bw, ROW_H), pending)
                    continue
                c = colors.get(int(cats[row]))
                if c is None:
                    c = colors[int(cats[row])] = category_color(d.category_name(int(cats[row])))
                uw = max(1.0, size * scale)
                p.fillRect(QRectF(bx, y, uw, ROW_H), c)
                if rnd > size and (rnd - size) * scale >= 1:
                    p.fillRect(QRectF(bx + uw, y, (rnd - size) * scale, ROW_H), c.darker(160))
            p.setPen(edge)
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRect(bar)
            if s.address == self.highlight_segment:
                p.setPen(QPen(pal.color(QPalette.ColorRole.Highlight), 2))
                p.drawRect(bar.adjusted(-1, -1, 1, 1))
        p.end()

    def hit(self, pos: QPoint) -> tuple[int, int]:
        """(segment position, block position) under a point (-1: none)."""
        st = self.state
        if st is None or not st.segments:
            return -1, -1
        k = (pos.y() - 3) // (ROW_H + ROW_GAP)
        if not 0 <= k < len(st.segments):
            return -1, -1
        s = st.segments[k]
        x0, ppb = self._geometry()
        w = max(MIN_BAR, s.size * ppb)
        if not x0 <= pos.x() <= x0 + w:
            return k, -1
        addr = s.address + (pos.x() - x0) / (w / s.size)
        a, b = s.first_block, s.first_block + s.n_blocks
        starts = st.block_addr[a:b]
        j = int(np.searchsorted(starts, addr, side="right")) - 1
        tol = 2 * s.size / w                      # a couple of pixels: thin blocks stay hoverable
        if 0 <= j < b - a and addr < starts[j] + max(int(st.block_rounded[a + j]), tol):
            return k, a + j
        return k, -1

    def describe(self, k: int, j: int) -> str:
        st, d = self.state, self.data
        assert st is not None and d is not None
        s = st.segments[k]
        head = (f"<b>segment 0x{s.address:x}</b> · {fmt_bytes(s.size)} · {'small' if s.small else 'large'} pool"
                + (f" · stream {s.stream}" if len(st.streams) > 1 else "")
                + f"<br>allocated {fmt_bytes(s.allocated)} (pending free {fmt_bytes(s.pending)}) · rounding "
                  f"{fmt_bytes(s.rounding)} · cached {fmt_bytes(s.cached)} (largest free {fmt_bytes(s.largest_free)})")
        if j < 0:
            return head
        row = int(st.block_row[j])
        name = d.category_name(int(d.category[row]))
        state = "pending free (freed, its stream not done yet)" if st.block_pending[j] else "allocated"
        return (f"{head}<hr><b>{name}</b> · {fmt_bytes(int(st.block_size[j]))} requested, "
                f"{fmt_bytes(int(st.block_rounded[j]))} block · {state}<br>"
                f"0x{int(st.block_addr[j]):x} · {_esc(d.row_label(row))}<br><i>click to select</i>")

    def mouseMoveEvent(self, ev):
        k, j = self.hit(ev.position().toPoint())
        if k >= 0:
            QToolTip.showText(ev.globalPosition().toPoint(), self.describe(k, j), self)
        else:
            QToolTip.hideText()

    def mousePressEvent(self, ev):
        if ev.button() == Qt.MouseButton.LeftButton:
            k, j = self.hit(ev.position().toPoint())
            if k >= 0:
                self.highlight_segment = self.state.segments[k].address
                self.update()
            if j >= 0:
                self.rowClicked.emit(int(self.state.block_row[j]))
        super().mousePressEvent(ev)

    def segment_rect(self, address: int) -> QRectF | None:
        """Where the segment at `address` is drawn (None: not at this moment)."""
        st = self.state
        if st is None:
            return None
        k = next((k for k, s in enumerate(st.segments) if s.address == address), -1)
        if k < 0:
            return None
        return QRectF(0, 3 + k * (ROW_H + ROW_GAP), self.width(), ROW_H)

    def segment_of_row(self, row: int) -> int:
        """The address of the segment holding allocation `row`'s block now, -1 none."""
        st = self.state
        if st is None or row < 0:
            return -1
        hits = np.flatnonzero(st.block_row == row)
        if not len(hits):
            return -1
        j = int(hits[0])
        for s in st.segments:
            if s.first_block <= j < s.first_block + s.n_blocks:
                return s.address
        return -1


class AllocatorPanel(QWidget):
    """The allocator at one entry. ← / →: one entry; Ctrl+← / →: the previous / next segment
    event (a segment allocated, freed, mapped or unmapped); Page Up / Down: 100 entries."""

    indexChanged = Signal(int)       # the user stepped to this entry
    said = Signal(str)               # a line for the status bar (a step that goes nowhere)
    rowClicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.index: int | None = None
        self.state: AllocatorState | None = None
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.header = QLabel(self)
        self.header.setWordWrap(True)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.prev_btn = QToolButton(self)
        self.prev_btn.setText("◀")
        self.prev_btn.setToolTip("Previous entry (←; Ctrl+←: previous segment event)")
        self.prev_btn.clicked.connect(lambda: self.step(-1))
        self.next_btn = QToolButton(self)
        self.next_btn.setText("▶")
        self.next_btn.setToolTip("Next entry (→; Ctrl+→: next segment event)")
        self.next_btn.clicked.connect(lambda: self.step(1))
        for b in (self.prev_btn, self.next_btn):
            b.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.where = QLabel(self)
        self.where.setTextFormat(Qt.TextFormat.RichText)
        legend = QLabel(
            f"<span style='color:{category_color('activations').name()}'>■</span> allocated (by category) "
            "&nbsp;<span style='color:#555'>■</span> rounding &nbsp;"
            f"<span style='color:{PENDING_COLOR}'>▨</span> pending free &nbsp;"
            "<span style='color:#bbb'>■</span> cached", self)
        legend.setWordWrap(True)           # the panel must fit a 1024-pixel window's bottom area
        legend.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        legend.setToolTip("← / →: one entry · Ctrl+← / →: the previous / next segment event · "
                          "Page Up / Down: 100 entries")
        # the event at the current entry, in words (present/events.py), beside the step buttons
        self.event_label = QLabel(self)
        self.event_label.setTextFormat(Qt.TextFormat.PlainText)
        self.event_label.setWordWrap(True)
        self.event_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.event_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.prev_btn)
        top.addWidget(self.next_btn)
        top.addWidget(self.where)
        top.addWidget(self.event_label, 1)
        self.map = SegmentMap(self)
        self.map.rowClicked.connect(self.rowClicked)
        self.scroll = QScrollArea(self)
        self.scroll.setWidget(self.map)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        # the map's column: its totals and its key over it
        right = QWidget(self)
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.header)
        rl.addWidget(legend)
        rl.addWidget(self.scroll, 1)
        # the history of events beside the map, in step with it
        self.events = EventList(self)
        self.events.selectionModel().currentRowChanged.connect(self._on_event_chosen)
        self.events.installEventFilter(self)
        self.split = QSplitter(Qt.Orientation.Horizontal, self)
        self.split.addWidget(self.events)
        self.split.addWidget(right)
        self.split.setStretchFactor(0, 3)
        self.split.setStretchFactor(1, 2)
        self.split.setChildrenCollapsible(False)
        self._split_sized = False          # the list gets 55% of the width once, then the user's
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.split, 1)
        self._syncing = False

    def set_data(self, data: DeviceData | None):
        self.data = data
        self.index = None
        self.state = None
        self.map.set_state(data, None)
        self.events.set_data(data)
        self.header.setText("" if data is None else "<i>Click the timeline, or press ← / → here.</i>")
        self.where.setText("")
        self.event_label.setText("")

    def show_index(self, i: int, segment_address: int = -1):
        d = self.data
        if d is None:
            return
        i = int(min(max(i, -1), d.n - 1)) if d.n else -1
        self.map.highlight_segment = segment_address
        if i == self.index and self.state is not None:
            self.map.update()
            self.scroll_to_segment(segment_address)
            return
        self.index = i
        st = self.state = d.allocator.state_at(i)
        self.map.set_state(d, st)
        self.scroll_to_segment(segment_address)
        self._select_event(i)
        self.where.setText(f"<b>{fmt_seconds(float(d.seconds_of(i)), 1e-4)}</b> ·" if d.has_time and i >= 0 else "")
        text = event_header(d.da, d.stacks, i)
        self.event_label.setText(text)
        self.event_label.setToolTip(text)
        if not st.known:
            self.header.setText("<i>This snapshot has no allocator segments (profiler-converted).</i>")
            return
        streams = st.streams
        self.header.setText(
            f"{len(st.segments):,} segments · reserved <b>{fmt_bytes(st.reserved)}</b> · allocated "
            f"{fmt_bytes(st.allocated)} (pending free {fmt_bytes(st.pending_free)}) · rounding "
            f"{fmt_bytes(st.rounding)} · cached {fmt_bytes(st.cached)} · "
            f"<b>{reserved_unallocated_words(st.reserved, st.reserved_unallocated)}</b> · "
            f"{largest_free_words(st.cached, st.largest_free, st.cached_outside_largest_free)}"
            + (f" · streams {', '.join(map(str, streams))}" if len(streams) > 1 else ""))
        self.header.setToolTip(RESERVED_UNALLOCATED_WHY + " The largest free block is the biggest request the "
                               "cache can serve without a new segment.")

    def scroll_to_segment(self, address: int):
        """Bring the segment at `address` into the map's view (after the map's new height is
        laid out)."""
        if address < 0:
            return
        self.map.highlight_segment = address

        def later():
            r = self.map.segment_rect(address)
            if r is not None:
                self.scroll.ensureVisible(int(r.left() + LABEL_W), int(r.center().y()), 10, ROW_H * 2)
        later()
        QTimer.singleShot(0, self, later)
        # a panel brought forward by the click lays its map out later still (the first
        # segment click before Allocator was in front left the segment out of view)
        QTimer.singleShot(60, self, later)

    def show_row(self, row: int):
        """An allocation selected elsewhere: its segment outlined and brought into view, when
        it holds a block at this entry."""
        addr = self.map.segment_of_row(row)
        if addr >= 0:
            self.scroll_to_segment(addr)
            self.map.update()

    def _select_event(self, i: int):
        """The event list follows the current entry (without stepping back here)."""
        ev = self.events
        self._syncing = True
        try:
            if i < 0:
                ev.clearSelection()
                ev.selectionModel().clearCurrentIndex()
                return
            idx = ev.model_.index(i, 0)
            shown = ev.viewport().rect().contains(ev.visualRect(idx).center())
            ev.selectionModel().setCurrentIndex(
                idx, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)
            # a step keeps the rows still; a jump puts the event in the middle, its neighbours around it
            ev.scrollTo(idx, QAbstractItemView.ScrollHint.EnsureVisible if shown
                        else QAbstractItemView.ScrollHint.PositionAtCenter)
        finally:
            self._syncing = False

    def _on_event_chosen(self, cur, _prev):
        if not self._syncing and cur.isValid() and cur.row() != self.index:
            self.go(cur.row())

    def eventFilter(self, obj, ev):
        # in the event list, ← / → (and Ctrl) step as they do on the map; ↑ / ↓ / Page keys move its rows
        if obj is self.events and ev.type() == QEvent.Type.KeyPress and ev.key() in (Qt.Key.Key_Left,
                                                                                     Qt.Key.Key_Right):
            self.keyPressEvent(ev)
            return True
        return super().eventFilter(obj, ev)

    def step(self, delta: int):
        d = self.data
        if d is None or not d.n:
            return
        cur = self.index if self.index is not None else -1
        self.go(min(max(cur + delta, -1), d.n - 1))

    def step_segment_event(self, direction: int):
        """To the previous / next segment event (the analysis': classifiers/events.py)."""
        if self.data is None:
            return
        i = next_segment_event(self.data.da, self.index if self.index is not None else -1, direction)
        if i >= 0:
            self.go(i)
        else:
            self.said.emit(f"No segment event {'after' if direction > 0 else 'before'} this entry "
                           "(segment_alloc, segment_free, segment_map or segment_unmap)")

    def go(self, i: int):
        self.show_index(i)
        self.indexChanged.emit(i)

    STEP_KEYS = (Qt.Key.Key_Left, Qt.Key.Key_Right, Qt.Key.Key_PageUp, Qt.Key.Key_PageDown, Qt.Key.Key_Home,
                 Qt.Key.Key_End)

    def event(self, ev):
        # the window's shortcuts (Home: whole run) must not take the stepping keys from here
        if ev.type() == QEvent.Type.ShortcutOverride and ev.key() in self.STEP_KEYS:
            ev.accept()
            return True
        return super().event(ev)

    def keyPressEvent(self, ev):
        key, mods = ev.key(), ev.modifiers()
        ctrl = bool(mods & Qt.KeyboardModifier.ControlModifier)
        if key in (Qt.Key.Key_Left, Qt.Key.Key_Right):
            direction = -1 if key == Qt.Key.Key_Left else 1
            if ctrl:
                self.step_segment_event(direction)
            else:
                self.step(direction)
        elif key in (Qt.Key.Key_PageUp, Qt.Key.Key_PageDown):
            self.step(-100 if key == Qt.Key.Key_PageUp else 100)
        elif key == Qt.Key.Key_Home:
            self.go(-1)
        elif key == Qt.Key.Key_End and self.data is not None:
            self.go(self.data.n - 1)
        else:
            super().keyPressEvent(ev)
            return
        ev.accept()

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        w = self.split.width()
        if not self._split_sized and w > 200:
            self._split_sized = True
            self.split.setSizes([int(w * 0.55), w - int(w * 0.55)])

    def focusInEvent(self, ev):
        super().focusInEvent(ev)
        self.update()
