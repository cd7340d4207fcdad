"""Side panels: the selected allocation's stack, the moment under the cursor, the findings."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QCheckBox,
    QHeaderView,
    QLabel,
    QSizePolicy,
    QTextBrowser,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ..classifiers.allocator import Segments
from ..common.units import fmt_bytes, fmt_duration_us, fmt_seconds
from ..present.markup import html as _esc
from ..present.stacks import short_path
from ..present.words import (
    RESERVED_UNALLOCATED_WHY,
    freed_note,
    oom_diagnosis,
    oom_suggestions,
    process_limit,
    reserved_unallocated_words,
    torch_tag_words,
)
from .model import DeviceData
from .theme import category_color


def when_text(d: DeviceData, i: int) -> str:
    if i < 0:
        return "before the trace"
    if d.has_time:
        return f"{fmt_seconds(float(d.seconds_of(i)), 1e-4)} (entry {i:,})"
    return f"entry {i:,}"


# -- the selected allocation ----------------------------------------------------------------
class StackPanel(QWidget):
    """The selected allocation: category, rule, size, lifetime and its full stack."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.row = -1
        self.header = QLabel("Click the timeline or a table row to select an allocation.", self)
        self.header.setWordWrap(True)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.python_only = QCheckBox("Hide C++ internals", self)
        self.python_only.setChecked(True)
        self.python_only.setToolTip("Show only the Python frames (or, for stacks without any, such as autograd's "
                                    "worker threads, drop the allocator's own frames and argument lists)")
        self.python_only.toggled.connect(lambda _: self._render())
        self.frames = QTextBrowser(self)
        self.frames.setOpenLinks(False)
        # sentences (no stack, which stack this is) wrap to the panel's width; the frames are
        # preformatted and scroll sideways when a path is longer than the panel is wide
        self.frames.setLineWrapMode(QTextBrowser.LineWrapMode.WidgetWidth)
        self.frames.setToolTip("The allocation's stack, innermost frame first")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.header)
        lay.addWidget(self.python_only)
        lay.addWidget(self.frames, 1)

    def set_data(self, data: DeviceData | None):
        self.data = data
        self.set_row(-1)

    def set_row(self, row: int):
        self.row = row
        self._render()

    def _render(self):
        d, row = self.data, self.row
        if d is None or row < 0:
            self.header.setText("<i>Click the timeline or a table row to select an allocation.</i>")
            self.frames.clear()
            return
        a = d.allocs
        c = int(d.category[row])
        name = d.category_name(c)
        col = category_color(name).name()
        ai, fi = int(d.alloc_index[row]), int(d.free_index[row])
        life = ""
        muted = self.palette().color(QPalette.ColorRole.PlaceholderText).name()
        if d.has_time and ai >= 0 and fi >= 0:
            life = f" · lived {fmt_duration_us(int(d.tkey[fi]) - int(d.tkey[ai]))}"
        self.header.setText(
            f"<span style='color:{col}; font-size:14pt'>■</span> <b>{name}</b> · <b>{fmt_bytes(int(a.size[row]))}</b>"
            f" ({int(a.size[row]):,} B)<br>rule: <code>{_esc(d.rule_name(row))}</code>"
            + (f" <span style='color:{muted}'>— {_esc(d.rule_why(row))}</span>" if d.rule_why(row) else "")
            + "<br>"
            f"allocated {when_text(d, ai) if ai >= 0 else 'before the trace began'}<br>"
            f"freed {when_text(d, fi) if fi >= 0 else 'never (live at the end)'}{life}<br>"
            f"address <code>0x{int(a.addr[row]):x}</code>")
        alloc = d.da.allocation(row)
        tag = torch_tag_words(alloc.torch_tag, alloc.rules_category)
        extra = (f"<br>{_esc(tag)}" if tag else "") \
            + (f"<br>module <code>{_esc(alloc.module)}</code>" if alloc.module else "") \
            + "".join(f"<br>{_esc(kind)}: <code>{_esc(text[:300])}</code>" for kind, text in alloc.metadata
                      if not (kind == "metadata" and text == alloc.module))
        if extra:
            self.header.setText(self.header.text() + extra)
        view = d.stacks.view_of(d.da, alloc, hide_internals=self.python_only.isChecked())
        lines, notes = [], []
        for fv in view.frames:
            if fv.role in ("user", "library"):
                name = f"<b>{_esc(fv.function)}</b>" if fv.role == "user" else _esc(fv.function)
                fx = f"  <i style='color:{muted}'>[{_esc(fv.note)}]</i>" if fv.note else ""
                lines.append(f"{name}{fx}<br>&nbsp;&nbsp;<span style='color:{muted}'>"
                             f"{_esc(short_path(fv.file))}:{fv.line}</span>")
            else:
                text = _esc(fv.where if self.python_only.isChecked() else fv.function)
                if fv.role in ("autograd", "op", "module"):
                    text = f"<b>{text}</b>"
                where = f"  <span style='color:{muted}'>{_esc(fv.file)}</span>" if fv.file else ""
                lines.append(f"{text}{where}")
        if not lines:
            notes.append("<i>no stack recorded for this allocation</i>")
        elif view.freed_here:
            notes.append(f"<i style='color:{muted}'>{_esc(freed_note())}</i>")
        elif view.forward_site is not None:
            fs = view.forward_site
            lines.insert(0, f"<i style='color:{muted}'>backward of the forward op at</i> <b>{_esc(fs.function)}</b>"
                            f"<br>&nbsp;&nbsp;<span style='color:{muted}'>{_esc(short_path(fs.file))}:{fs.line}</span>")
        elif view.from_forward:
            notes.append(f"<i style='color:{muted}'>forward stack of this backward allocation "
                         f"(autograd's thread recorded no Python frames)</i>")
        tail = f"<div><i style='color:{muted}'>{view.hidden} {view.hidden_what} frames hidden</i></div>" \
            if view.hidden else ""
        self.frames.setHtml("".join(f"<div>{n}</div>" for n in notes)
                            + ("<div style='font-family:monospace; white-space:pre'>" + "<br>".join(lines) + "</div>"
                               if lines else "") + tail)

    def stack_text(self) -> str:
        return self.frames.toPlainText()


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
        for c in order:
            v = comp[c]
            if v <= 0:
                continue
            name = d.category_name(int(c))
            it = QTreeWidgetItem([name, fmt_bytes(v), f"{100.0 * v / live:.1f}%" if live > 0 else "-"])
            it.setData(0, Qt.ItemDataRole.DecorationRole, category_color(name))
            it.setTextAlignment(1, Qt.AlignmentFlag.AlignRight)
            it.setTextAlignment(2, Qt.AlignmentFlag.AlignRight)
            self.cats.addTopLevelItem(it)
        self._fit_cats()
        self.largest.clear()
        for row in d.largest_live(i, 12):
            row = int(row)
            name = d.category_name(int(d.category[row]))
            it = QTreeWidgetItem([fmt_bytes(int(d.allocs.size[row])), name, d.stack_label(int(d.allocs.stack[row]))])
            it.setData(0, Qt.ItemDataRole.UserRole, row)
            it.setData(1, Qt.ItemDataRole.DecorationRole, category_color(name))
            it.setTextAlignment(0, Qt.AlignmentFlag.AlignRight)
            self.largest.addTopLevelItem(it)
        self.largest.resizeColumnToContents(0)
        self.largest.resizeColumnToContents(1)
        segs = d.segments_at(i)
        self.strip.set_segments(segs)
        if not segs.known:
            self.seg_label.setText("<i>This snapshot has no allocator segments (profiler-converted).</i>")
        else:
            big = int(segs.size.max()) if len(segs.size) else 0
            self.seg_label.setText(
                f"{len(segs.size):,} segments · "
                f"<b>{reserved_unallocated_words(res, d.da.reserved_unallocated_at(i))}</b> · "
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


# -- findings ------------------------------------------------------------------------------
_FULL_TEXT = Qt.ItemDataRole.UserRole + 1


def _item(text: str) -> QTreeWidgetItem:
    it = QTreeWidgetItem([text])
    it.setData(0, _FULL_TEXT, text)
    it.setToolTip(0, text)
    return it


def wrap_text(text: str, fm: QFontMetrics, width: int) -> str:
    """`text` broken into lines no wider than `width` pixels, at spaces (a word longer
    than a line stays whole)."""
    out, line = [], ""
    for word in text.split(" "):
        while fm.horizontalAdvance(word) > width and len(word) > 1:
            # a word wider than a line (an environment variable, a path): cut it
            k = len(word)
            while k > 1 and fm.horizontalAdvance(word[:k]) > width:
                k = max(1, k * 3 // 4) if fm.horizontalAdvance(word[:k * 3 // 4]) > width else k - 1
            if line:
                out.append(line)
                line = ""
            out.append(word[:k])
            word = word[k:]
        cand = f"{line} {word}" if line else word
        if line and fm.horizontalAdvance(cand) > width:
            out.append(line)
            line = word
        else:
            line = cand
    out.append(line)
    return "\n".join(out)


class FindingsPanel(QWidget):
    """Peaks, leaks and OOMs from the analysis; activating one navigates there.

    Every line wraps at the panel's width (nothing is cut with '…'), and an OOM lists its
    diagnosis and each next step as lines of their own, not in a tooltip."""

    activated = Signal(int)        # index into DeviceData.findings

    GROUPS = (("peak", "Peak"), ("oom", "Out of memory"), ("stale_gradients", "Stale gradients"), ("leak", "Leaks"),
              ("iteration_peak", "Iteration peaks"))

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.tree = QTreeWidget(self)
        self.tree.setHeaderHidden(True)
        self.tree.setWordWrap(True)
        self.tree.setUniformRowHeights(False)
        self.tree.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.tree.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.tree.header().setStretchLastSection(True)
        self.tree.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.tree.setToolTip("Click a finding to go there (N / Shift+N: next / previous)")
        self.tree.itemClicked.connect(self._on_item)
        self.tree.itemActivated.connect(self._on_item)
        self.summary = QLabel(self)
        self.summary.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.summary)
        lay.addWidget(self.tree, 1)
        self.items: list[QTreeWidgetItem] = []
        self._wrap_timer = QTimer(self)
        self._wrap_timer.setSingleShot(True)
        self._wrap_timer.setInterval(30)
        self._wrap_timer.timeout.connect(self._wrap_all)
        self.tree.itemExpanded.connect(lambda *_: self._wrap_timer.start())
        # the viewport's width is what the lines must fit (a scroll bar coming or going
        # changes it without resizing the panel)
        self.tree.viewport().installEventFilter(self)
        self._wrapped_width = -1

    def eventFilter(self, obj, ev):
        if obj is self.tree.viewport() and ev.type() == QEvent.Type.Resize:
            if self.tree.viewport().width() != self._wrapped_width:
                self._wrap_timer.start()
        return super().eventFilter(obj, ev)

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        self._wrap_timer.start()

    def _wrap_all(self):
        """Break every line at the tree's width (Qt's own word wrap in a tree keeps one row
        height and cuts the text): the rows grow to the lines they hold."""
        t = self.tree
        self._wrapped_width = t.viewport().width()
        width = t.viewport().width() - 8
        if width <= 40:
            return
        fm = t.fontMetrics()
        stack = [(t.topLevelItem(k), 0) for k in range(t.topLevelItemCount())]
        while stack:
            it, depth = stack.pop()
            full = it.data(0, _FULL_TEXT)
            if full is not None:
                avail = width - t.indentation() * (depth + 1)
                font = it.font(0)
                it.setText(0, wrap_text(full, QFontMetrics(font) if font != t.font() else fm, avail))
            stack.extend((it.child(k), depth + 1) for k in range(it.childCount()))

    @staticmethod
    def detail_lines(f) -> list[str]:
        """What a finding says under its title, one line each."""
        s = f.subject
        if f.kind == "oom":
            lines = [oom_diagnosis(s)]
            if not process_limit(s.requested, s.device_free):      # (else the diagnosis says it)
                lines += [f"device free {fmt_bytes(s.device_free)}"]     # (the title says what was requested)
            lines += [f"Try: {t}" for t in oom_suggestions(s)]
            return lines
        return [f.detail] if f.detail else []

    def set_data(self, data: DeviceData | None):
        self.data = data
        self.tree.clear()
        self.items = []
        if data is None:
            self.summary.setText("")
            return
        found = {k: [] for k, _ in self.GROUPS}
        for k, f in enumerate(data.findings):
            found.setdefault(f.kind, []).append((k, f))
        muted = self.palette().color(QPalette.ColorRole.PlaceholderText)
        for kind, label in self.GROUPS:
            fs = found.get(kind, [])
            if kind in ("leak", "oom") and not fs:
                none = _item(f"{label}: none found")
                none.setDisabled(True)
                self.tree.addTopLevelItem(none)
                continue
            if not fs:
                continue
            group = _item(f"{label} ({len(fs)})" if len(fs) > 1 else label)
            f0 = group.font(0)
            f0.setBold(True)
            group.setFont(0, f0)
            self.tree.addTopLevelItem(group)
            for k, f in fs:
                it = _item(f.title)
                it.setData(0, Qt.ItemDataRole.UserRole, k)
                for line in self.detail_lines(f):
                    sub = _item(line)
                    sub.setData(0, Qt.ItemDataRole.UserRole, k)
                    sub.setForeground(0, muted)
                    it.addChild(sub)
                group.addChild(it)
                self.items.append(it)
                it.setExpanded(kind in ("peak", "oom", "leak"))
            group.setExpanded(len(fs) <= 20 or kind != "iteration_peak")
        n_it = len(data.iterations)
        self.summary.setText(f"{n_it} iteration{'s' if n_it != 1 else ''} found" if n_it else
                             "<i>No iterations found.</i>")
        self._wrap_all()

    def select(self, k: int):
        for it in self.items:
            if it.data(0, Qt.ItemDataRole.UserRole) == k:
                if it.parent() is not None:
                    it.parent().setExpanded(True)
                self.tree.setCurrentItem(it)
                self.tree.scrollToItem(it)
                return

    def _on_item(self, item, _col=0):
        k = item.data(0, Qt.ItemDataRole.UserRole)
        if k is not None:
            self.activated.emit(int(k))
