"""The Findings panel: the peak, OOMs (diagnosis and next steps), leaks and each
iteration's peak, wrapped to the panel's width; activating one navigates there."""
from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...classifiers.iterations import Iterations
from ...common.units import fmt_bytes
from ...present.markup import html as html_text
from ...present.words import (iterations_note, leaks_none_text, oom_diagnosis, oom_suggestions, process_limit,
                              run_words)
from ..model import DeviceData
from ..theme import muted_text


# -- findings ------------------------------------------------------------------------------
_FULL_TEXT = Qt.ItemDataRole.UserRole + 1
_PENDING = Qt.ItemDataRole.UserRole + 2       # a group whose rows are made when first opened: its key
BREAK_AFTER = "=:,/"          # where a word wider than a line may break


def _item(text: str) -> QTreeWidgetItem:
    it = QTreeWidgetItem([text])
    it.setData(0, _FULL_TEXT, text)
    it.setToolTip(0, text)
    return it


def wrap_text(text: str, fm: QFontMetrics, width: int, widths: dict[str, int] | None = None) -> str:
    """`text` broken into lines no wider than `width` pixels, at spaces (a word longer
    than a line is cut). A line's width is its words' plus the spaces between them, each
    word measured once (`widths`: a cache to share between calls with the same font: the
    findings of a long run repeat their words hundreds of times)."""
    if widths is None:
        widths = {}

    def w(word: str) -> int:
        v = widths.get(word)
        if v is None:
            v = widths[word] = fm.horizontalAdvance(word)
        return v

    space = w(" ")
    out: list[str] = []
    line, line_w = "", 0
    for word in text.split(" "):
        while w(word) > width and len(word) > 1:
            # a word wider than a line (an environment variable, a path): broken after its
            # last '=', ':', ',' or '/' that fits ("PYTORCH_CUDA_ALLOC_CONF=" then
            # "expandable_segments:True"), never inside one of its parts when a break point fits
            k = len(word)
            while k > 1 and fm.horizontalAdvance(word[:k]) > width:
                k = max(1, k * 3 // 4) if fm.horizontalAdvance(word[:k * 3 // 4]) > width else k - 1
            at = max(word.rfind(c, 0, k) for c in BREAK_AFTER)
            if at > 0:
                k = at + 1
            if line:
                out.append(line)
                line, line_w = "", 0
            out.append(word[:k])
            word = word[k:]
        ww = w(word)
        if line and line_w + space + ww > width:
            out.append(line)
            line, line_w = word, ww
        elif line:
            line, line_w = f"{line} {word}", line_w + space + ww
        else:
            line, line_w = word, ww
    out.append(line)
    return "\n".join(out)


class FindingsPanel(QWidget):
    """Peaks, leaks and OOMs from the analysis; activating one navigates there.

    Every line wraps at the panel's width (nothing is cut with '…'), and an OOM lists its
    diagnosis and each next step as lines of their own, not in a tooltip."""

    activated = Signal(int)        # index into DeviceData.findings

    SHOWN_OPEN = 20            # a group of more iteration peaks opens closed (its rows made when opened);
                               # of more OOMs or leaks, only the first shows its lines (the others' on selection)
    ROWS_AT_MOST = 1000        # rows a group shows at once (a run of short steps has a million peaks)
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
        # a finding wrapped over many lines is one tall row: the wheel moves pixels, not rows
        self.tree.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
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
        self._chosen: QTreeWidgetItem | None = None
        self._wrap_timer = QTimer(self)
        self._wrap_timer.setSingleShot(True)
        self._wrap_timer.setInterval(30)
        self._wrap_timer.timeout.connect(self._wrap_all)
        self._pending: dict[int, tuple] = {}      # key -> a group whose rows are made when first opened
        self._windows: dict[int, tuple] = {}      # a group showing ROWS_AT_MOST of its rows: what it shows
        self.tree.itemExpanded.connect(self._on_expanded)
        # the viewport's width is what the lines must fit (a scroll bar coming or going
        # changes it without resizing the panel)
        self.tree.viewport().installEventFilter(self)
        self._wrapped_width = -1

    def _on_expanded(self, item: QTreeWidgetItem) -> None:
        key = item.data(0, _PENDING)
        if key is not None and key in self._pending:
            self._fill_pending(key=key)
        self._wrap_timer.start()

    def eventFilter(self, obj, ev):
        if obj is self.tree.viewport() and ev.type() == QEvent.Type.Resize:
            if self.tree.viewport().width() != self._wrapped_width:
                self._wrap_timer.start()
        return super().eventFilter(obj, ev)

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        self._wrap_timer.start()

    def settle(self) -> None:
        """Wrap now what a resize left to be wrapped in a moment (`_wrap_timer`): a picture
        taken at once (`--screenshot`) shows the lines at the panel's width, not at the width
        it had before the window took its size."""
        if self._wrap_timer.isActive() or self.tree.viewport().width() != self._wrapped_width:
            self._wrap_timer.stop()
            self._wrap_all()

    def _wrap_all(self):
        """Break every line at the tree's width (Qt's own word wrap in a tree keeps one row
        height and cuts the text): the rows grow to the lines they hold."""
        t = self.tree
        self._wrapped_width = t.viewport().width()
        width = t.viewport().width() - 8
        if width <= 40:
            return
        fm = t.fontMetrics()
        measured: dict[str, dict[str, int]] = {}          # per font: each word's width
        stack = [(t.topLevelItem(k), 0) for k in range(t.topLevelItemCount())]
        while stack:
            it, depth = stack.pop()
            full = it.data(0, _FULL_TEXT)
            if full is not None:
                avail = width - t.indentation() * (depth + 1)
                font = it.font(0)
                own = font != t.font()
                it.setText(0, wrap_text(full, QFontMetrics(font) if own else fm, avail,
                                        measured.setdefault(font.key() if own else "", {})))
            # a collapsed item's rows are wrapped when it is expanded (itemExpanded wraps again):
            # a long run's thousands of iteration peaks cost nothing until they are shown
            if it.isExpanded():
                stack.extend((it.child(k), depth + 1) for k in range(it.childCount()))
        # the rows' heights changed: the finding chosen last stays in view
        if self._chosen is not None:
            self.tree.scrollToItem(self._chosen)

    @staticmethod
    def detail_lines(f, data: DeviceData | None = None) -> list[str]:
        """What a finding says under its title, one line each (an OOM's largest category
        marked where its bytes are a guess: the analysis' guessed bytes at that moment)."""
        s = f.subject
        if f.kind == "oom":
            guessed = None
            if data is not None:
                g = data.da.guessed_by_category([f.index])
                if g is not None:
                    guessed = {c: int(v) for c, v in zip(data.categories, g[0]) if v}
            lines = [oom_diagnosis(s, guessed)]
            if not process_limit(s.requested, s.device_free):      # (else the diagnosis says it)
                lines += [f"device free {fmt_bytes(s.device_free)}"]     # (the title says what was requested)
            lines += [f"Try: {t}" for t in oom_suggestions(s)]
            return lines
        return [f.detail] if f.detail else []

    def set_data(self, data: DeviceData | None):
        self.data = data
        self._chosen = None
        self._pending.clear()
        self._windows.clear()
        self.tree.clear()
        self.items = []
        if data is None:
            self.summary.setText("")
            return
        # positions in data.findings per kind; the iterations' peaks (a million on a run of
        # short steps) as a range, their findings made only for the rows shown
        found: dict[str, Sequence[int]] = {k: [] for k, _ in self.GROUPS}
        for k, f in enumerate(data.findings.head):
            found.setdefault(f.kind, []).append(k)          # type: ignore[attr-defined]
        found["iteration_peak"] = data.findings.iteration_peaks()
        muted = muted_text(self.tree.palette())      # a diagnosis and next steps: 4.5:1 at least
        for kind, label in self.GROUPS:
            fs = found.get(kind, [])
            if kind in ("leak", "oom") and not fs:
                # a finding too: readable, not disabled grey
                none = _item(f"{label}: {leaks_none_text(data.da.run) if kind == 'leak' else 'none found'}")
                none.setFlags(Qt.ItemFlag.ItemIsEnabled)
                none.setForeground(0, muted)
                self.tree.addTopLevelItem(none)
                continue
            if not fs:
                continue
            group = _item(f"{label} ({len(fs):,})" if len(fs) > 1 else label)
            f0 = group.font(0)
            f0.setBold(True)
            group.setFont(0, f0)
            self.tree.addTopLevelItem(group)
            if kind == "iteration_peak" and len(fs) > self.SHOWN_OPEN:
                # a long run's iteration peaks (thousands): their rows made when the group is
                # first opened, or one of them is navigated to (0.25 s at 5,000 of them)
                group.setChildIndicatorPolicy(QTreeWidgetItem.ChildIndicatorPolicy.ShowIndicator)
                key = len(self._pending) + 1
                group.setData(0, _PENDING, key)
                self._pending[key] = (group, kind, fs, muted)
                continue
            self._fill(group, kind, fs, muted)
            group.setExpanded(True)
        n_it = len(data.iterations)
        run = run_words(data.da.run.to_json())        # what kind of run it was: summary's 'run' line
        # how they were found, where that makes the count a guess: said briefly, whole in the tooltip
        note = iterations_note(Iterations.of(data.iterations).source)
        self.summary.setText((f"<b>Run:</b> {html_text(run)}<br>" if run else "")
                             + (f"{n_it:,} iteration{'s' if n_it != 1 else ''} found" + (" (a guess)" if note else "")
                                if n_it else "<i>No iterations found.</i>"))
        self.summary.setToolTip("What the trace shows about the run, each fact with its evidence: "
                                "vramscope summary FILE --json, devices[].run"
                                + (f". Iterations: {note}" if note and n_it else ""))
        self._wrap_all()

    def _fill(self, group: QTreeWidgetItem, kind: str, fs: Sequence[int], muted, around: int | None = None) -> None:
        """The rows of one group's findings `fs` (positions in data.findings): each one's title,
        then its lines. Of more than ROWS_AT_MOST, that many from the one `around` (or from the
        first), and a row saying how to reach the rest; another one asked for refills the group."""
        data = self.data
        assert data is not None
        if len(fs) > self.ROWS_AT_MOST:
            self.items = [it for it in self.items if it.parent() is not group]
            self._chosen = None
            group.takeChildren()
            j = 0 if around is None else max(0, fs.index(around) - self.ROWS_AT_MOST // 2)
            j = min(j, len(fs) - self.ROWS_AT_MOST)
            self._windows[id(group)] = (group, kind, fs, muted, j)
            shown = fs[j:j + self.ROWS_AT_MOST]
        else:
            j, shown = 0, fs
        for k in shown:
            f = data.findings[k]
            it = _item(f.title)
            it.setData(0, Qt.ItemDataRole.UserRole, k)
            for line in self.detail_lines(f, data):
                sub = _item(line)
                sub.setData(0, Qt.ItemDataRole.UserRole, k)
                sub.setForeground(0, muted)
                it.addChild(sub)
            group.addChild(it)
            self.items.append(it)
            # hundreds of OOMs (a run that ran out of memory again and again): their lines
            # wrapped for each one opened took 0.7 s of the open at 726 of them
            it.setExpanded(kind in ("peak", "oom", "leak") and (len(fs) <= self.SHOWN_OPEN or k == fs[0]))
        if len(shown) < len(fs):
            more = _item(f"Showing {j + 1:,}–{j + len(shown):,} of {len(fs):,}: N / Shift+N step through "
                         "them all, a click on the timeline goes to any moment")
            more.setFlags(Qt.ItemFlag.ItemIsEnabled)
            more.setForeground(0, muted)
            group.addChild(more)
            self._wrap_timer.start()

    def _fill_pending(self, key: int | None = None, k: int | None = None) -> None:
        """Make the rows of a group left to fill: the one of `key` (being opened), or the one
        holding finding `k` (navigated to)."""
        for pk, (g, kind, fs, muted) in list(self._pending.items()):
            if pk == key or (k is not None and k in fs):
                del self._pending[pk]
                self._fill(g, kind, fs, muted, around=k)
        if k is not None:            # a group showing part of its rows, asked for one not shown
            for g, kind, fs, muted, j in list(self._windows.values()):
                if k in fs and not j <= fs.index(k) < j + self.ROWS_AT_MOST:
                    self._fill(g, kind, fs, muted, around=k)

    def select(self, k: int):
        """Make finding k the current one and scroll it into view, whole where it fits (its
        title and its lines: a selected leak stayed scrolled out of view at 1024x700)."""
        if self._pending or self._windows:
            self._fill_pending(k=k)
        for it in self.items:
            if it.data(0, Qt.ItemDataRole.UserRole) == k:
                parent = it.parent()
                if parent is not None:
                    parent.setExpanded(True)
                if it.childCount():
                    it.setExpanded(True)          # (its lines: one of many OOMs opens when chosen)
                self._chosen = it
                self.tree.setCurrentItem(it)
                self._scroll_to(it)
                # again once the rows have their wrapped heights (after the layout settles)
                QTimer.singleShot(0, self, lambda: self._scroll_to(self._chosen) if self._chosen is not None else None)
                return

    def clear_current(self):
        """No finding highlighted (the selection moved elsewhere: the highlight stayed on Peak)."""
        self._chosen = None
        self.tree.setCurrentItem(None)
        self.tree.clearSelection()

    def _scroll_to(self, it: QTreeWidgetItem):
        t = self.tree
        last = it.child(it.childCount() - 1) if it.isExpanded() and it.childCount() else None
        if last is not None:
            t.scrollToItem(last)                # its lines in view...
        t.scrollToItem(it)                      # ...and its title, first

    def _on_item(self, item, _col=0):
        k = item.data(0, Qt.ItemDataRole.UserRole)
        if k is not None:
            self.activated.emit(int(k))
