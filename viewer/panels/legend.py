"""The legend bar above the timeline: one toggle per category present, in stacking order,
wrapping onto more rows (a flow layout) so the docks keep their width."""
from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import QLabel, QLayout, QToolButton, QWidget

from ...classifiers import STACK_ORDER
from ...classifiers.iterations import Iterations
from ...common.units import fmt_bytes
from ...present.words import SEGMENT_BANDS_WORDS, autocast_copies_text
from ..model import DeviceData
from ..theme import PHASE_COLORS, SEGMENT_COLORS, Theme, category_color

PALE_WORDS = "pale: a guess (no frames)"


def swatch(color: QColor, w: int = 12, h: int = 12) -> QIcon:
    pm = QPixmap(w, h)
    pm.fill(color)
    return QIcon(pm)


class FlowLayout(QLayout):
    """Left to right, wrapping to a new row when the width runs out (Qt's flow layout
    example): the legend must never force the window wider than the screen."""

    def __init__(self, parent=None, spacing: int = 4):
        super().__init__(parent)
        self._items: list = []
        self._spacing = spacing

    def addItem(self, item):
        self._items.append(item)

    def count(self):
        return len(self._items)

    def itemAt(self, i):
        return self._items[i] if 0 <= i < len(self._items) else None

    def takeAt(self, i):
        return self._items.pop(i) if 0 <= i < len(self._items) else None

    def expandingDirections(self):
        return Qt.Orientation(0)

    def hasHeightForWidth(self):
        return True

    def heightForWidth(self, width):
        return self._do_layout(QRect(0, 0, width, 0), True)

    def setGeometry(self, rect):
        super().setGeometry(rect)
        self._do_layout(rect, False)

    def sizeHint(self):
        return self.minimumSize()

    def minimumSize(self):
        size = QSize()
        for it in self._items:
            if not it.isEmpty():
                size = size.expandedTo(it.minimumSize())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _do_layout(self, rect, test_only):
        m = self.contentsMargins()
        r = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        x, y, line_h = r.x(), r.y(), 0
        for it in self._items:
            if it.isEmpty():
                continue                       # a hidden widget takes no place
            hint = it.sizeHint()
            nx = x + hint.width() + self._spacing
            if nx - self._spacing > r.right() and line_h > 0:
                x, y = r.x(), y + line_h + self._spacing
                nx = x + hint.width() + self._spacing
                line_h = 0
            if not test_only:
                it.setGeometry(QRect(QPoint(x, y), hint))
            x = nx
            line_h = max(line_h, hint.height())
        return y + line_h - rect.y() + m.bottom()


class LegendBar(QWidget):
    """What the timeline's colours mean: one toggle button per category present (the bands
    when stacked by category or by allocation) or, stacked by segment, the segments' colour
    key (pool or stream); then the line styles and the phases."""

    SEGMENT_KEYS_SHOWN = 8

    toggled = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.lay = FlowLayout(self)
        self.lay.setContentsMargins(6, 2, 6, 2)
        self.buttons: dict[int, QToolButton] = {}
        self.segment_key: QLabel | None = None
        self.pale_key: QLabel | None = None
        self.mode = "categories"

    def set_data(self, data: DeviceData | None):
        while self.lay.count():
            it = self.lay.takeAt(0)
            w = it.widget()
            if w is not None:
                w.deleteLater()
        self.buttons = {}
        self.segment_key = None
        self.pale_key = None
        if data is None:
            return
        at_peak = data.da.peak.by_category            # the analysis' peak, as `summary` reports it
        for name in STACK_ORDER + tuple(c for c in data.categories if c not in STACK_ORDER):
            if name not in data.categories:
                continue
            c = data.categories.index(name)
            if not data.cat_present[c]:
                continue
            b = QToolButton(self)
            b.setText(name)
            b.setIcon(swatch(category_color(name)))
            b.setCheckable(True)
            b.setChecked(True)
            b.setAutoRaise(True)
            b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            guessed = data.da.peak.by_category_evidence.get(name, {})
            guessed_bytes = guessed.get("guess", 0) + guessed.get("none", 0)
            b.setToolTip(f"Show or hide {name} in the stacked timeline "
                         f"({fmt_bytes(at_peak.get(name, 0))} of it live at the peak)"
                         + (f"; {fmt_bytes(guessed_bytes)} of it there is a guess (no frames, live before "
                            f"recording began), drawn in a paler shade" if guessed_bytes else "")
                         + (f"; {autocast_copies_text(data.da.run.autocast_copy_bytes)}"
                            if name == "weights" and data.da.run.autocast_copy_bytes else ""))
            b.toggled.connect(lambda _=False: self.toggled.emit())
            self.lay.addWidget(b)
            self.buttons[c] = b
        if data.segments.known:
            self.segment_key = self._segment_key(data)
            self.lay.addWidget(self.segment_key)
        fg = self.palette().color(self.foregroundRole()).name()
        lines = QLabel(f"<span style='color:{fg}'>━ allocated</span>"
                       + ("&nbsp;&nbsp;<span style='color:#777'>┅ reserved</span>" if data.reserved is not None else "")
                       + "&nbsp;&nbsp;<span style='color:#D62728'>▲ peak</span>", self)
        lines.setToolTip("Lines: live allocated bytes (exact at every zoom) and the allocator's reserved bytes")
        self.lay.addWidget(lines)
        self.pale_key = None
        if data.da.guessed_composition() is not None:
            # what the paler shade means, in words on screen (not only in a tooltip)
            theme = Theme.from_palette(self.palette())
            sample = theme.guess_color(theme.band_color("weights"))
            self.pale_key = QLabel(f"<span style='color:{sample.name()}'>■</span>&nbsp;{PALE_WORDS}", self)
            self.pale_key.setToolTip("A band's paler shade is the part of its bytes whose category is a guess: "
                                     "allocated before recording began, no frames, never freed (the Selection "
                                     "panel says how sure each allocation is)")
            self.lay.addWidget(self.pale_key)
        present = Iterations.of(data.iterations).phases_present()
        if present:
            order: list[str] = [p for p in ("inputs", "forward", "backward", "optimizer", "eval") if p in present]
            order += sorted(present - set(order))
            phases = "phases: " + "&nbsp;".join(
                f"<span style='color:{PHASE_COLORS.get(p, '#888888')}'>▒</span>{p}" for p in order)
            pl = QLabel(phases, self)
            pl.setToolTip("Shaded phases of each iteration; dashed lines are iteration starts")
            self.lay.addWidget(pl)
        self.set_mode(self.mode)

    def _segment_key(self, data: DeviceData) -> QLabel:
        """The segment bands' colours and what each stands for (viewer/timeline_modes.py
        stack_palette), shown instead of the category toggles when stacked by segment."""
        keys = data.segments.keys()
        shown = keys[:self.SEGMENT_KEYS_SHOWN]
        parts = [f"<span style='color:{SEGMENT_COLORS[k % len(SEGMENT_COLORS)]}'>■</span>&nbsp;{words}"
                 for k, words in shown]
        if len(keys) > len(shown):
            parts.append(f"+{len(keys) - len(shown)} more")
        key = QLabel("segments: " + "&nbsp;&nbsp;".join(parts)
                     + f"&nbsp;&nbsp;<span style='color:#777'>({SEGMENT_BANDS_WORDS})</span>", self)
        key.setTextFormat(Qt.TextFormat.RichText)
        key.setToolTip("Stacked by segment: the allocator's reserved memory, each segment a band coloured by "
                       + ("its stream" if len(data.segments.streams) > 1 else
                          "its pool (small pool: 2 MiB segments for requests up to 1 MiB; large pool: the rest)")
                       + ". Categories do not apply here: Stack by Category (C) or Allocation (L) brings "
                         "their toggles back.")
        key.setVisible(self.mode == "segments")
        return key

    def set_mode(self, mode: str):
        """Show the key to the timeline's colours in this stacking mode: the category toggles,
        or the segments' pools or streams."""
        self.mode = mode
        segments = mode == "segments" and self.segment_key is not None
        for b in self.buttons.values():
            b.setVisible(not segments)
        if self.pale_key is not None:
            self.pale_key.setVisible(not segments)
        if self.segment_key is not None:
            self.segment_key.setVisible(segments)

    def visible(self) -> list[int]:
        """Checked categories, bottom to top."""
        return [c for c, b in self.buttons.items() if b.isChecked()]
