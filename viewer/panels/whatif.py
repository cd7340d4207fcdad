"""The What-if panel: scale each category, pull levers, pick a GPU, and see the new peak
over the whole recorded run (classifiers/whatif.py, classifiers/category_live.py), the
budget beside it, and the timeline redrawn scaled as a slider moves."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QCheckBox,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QSlider,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...classifiers import CATEGORIES
from ...classifiers.budget import budget as make_budget
from ...classifiers.category_live import CategoryLive
from ...classifiers.levers import left_out
from ...classifiers.ooms import expandable_segments_on, trains
from ...classifiers.whatif import COMMON_CARDS, LEVERS, WhatIfError, fits_on, lever, parse_gpu_size
from ...common.units import GiB, fmt_bytes
from ...present.markup import html as _esc
from ...present.words import peak_words
from ..model import DeviceData
from ..theme import category_color

class _ClickLabel(QLabel):
    clicked = Signal()

    def mousePressEvent(self, event):
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit()
        super().mousePressEvent(event)


class _BudgetTable(QTableWidget):
    resized = Signal()

    def resizeEvent(self, event):
        super().resizeEvent(event)
        self.resized.emit()


SLIDER_MAX = 200             # 0 .. 2x in steps of 0.01
NO_GPU = "no GPU line"
TEXT_COLUMN_MIN = 220        # px: the formulas wrap, but not a few words per line
BUDGET_COLUMNS = (
    ("Category", "The category (DESIGN.md §3)"),
    ("At peak", "Live bytes of the category at the device's peak"),
    ("Max", "The category's own highest live bytes over the run (often at another moment)"),
    ("Expected", "What napkin math expects from the model's size; — where the snapshot cannot tell"),
    ("How it is estimated", "The formula with this run's numbers, then what the measurement says about it"),
)


class WhatIfPanel(QWidget):
    """Emits `changed(factors per DeviceData category or None, peak index, peak bytes,
    peak words, GPU bytes or None)` as the user moves a slider, ticks a lever or types a size."""

    changed = Signal(object, int, object, str, object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.model: CategoryLive | None = None
        self.budget = None
        self.facts = None
        self.sliders: dict[str, QSlider] = {}
        self.values: dict[str, QLabel] = {}
        self.levers: dict[str, QCheckBox] = {}
        self.last = None                      # (factors, ScaledPeak, type, fits) of the last update

        left = QWidget(self)
        self.grid = QGridLayout()
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setHorizontalSpacing(8)
        self.grid.setVerticalSpacing(2)
        self.lever_box = QGridLayout()
        self.lever_box.setContentsMargins(0, 0, 0, 0)
        self.lever_box.setHorizontalSpacing(6)
        self.lever_box.setVerticalSpacing(1)
        self.assumptions = QLabel(self)
        self.assumptions.setWordWrap(True)
        self.assumptions.setTextFormat(Qt.TextFormat.RichText)
        self.gpu = QComboBox(self)
        self.gpu.setEditable(True)
        self.gpu.setCompleter(None)               # '2' means 2 GiB, not the first card starting with 2
        self.gpu.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.gpu.addItem(NO_GPU)
        for name, gib in COMMON_CARDS:
            self.gpu.addItem(name, gib)
        self.gpu.setToolTip("A GPU's memory: pick a common card or type a size (24, 24GiB, 80GB, 24576MiB); drawn "
                            "on the timeline")
        self.gpu.currentTextChanged.connect(lambda _: self._schedule())
        self.reset_btn = QPushButton("Reset", self)
        self.reset_btn.setToolTip("Every factor back to 1, no lever, no GPU line")
        self.reset_btn.clicked.connect(self.reset)
        self.peak_line = QLabel(self)
        self.peak_line.setWordWrap(True)
        self.peak_line.setTextFormat(Qt.TextFormat.RichText)
        self.fits_line = QLabel(self)
        self.fits_line.setWordWrap(True)
        self.fits_line.setTextFormat(Qt.TextFormat.RichText)
        # the answer first, across the panel: the new peak and whether it fits
        head = QHBoxLayout()
        answer = QVBoxLayout()
        answer.setSpacing(1)
        answer.addWidget(self.peak_line)
        answer.addWidget(self.fits_line)
        head.addLayout(answer, 1)
        head.addWidget(QLabel("GPU:", self), 0, Qt.AlignmentFlag.AlignTop)
        head.addWidget(self.gpu, 0, Qt.AlignmentFlag.AlignTop)
        head.addWidget(self.reset_btn, 0, Qt.AlignmentFlag.AlignTop)
        self.gpu.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.gpu.setMinimumContentsLength(16)
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        for text, layout in (("<b>Scale each category</b> (its live bytes at every moment)", self.grid),
                             ("<b>Levers</b> (estimates; hover one for why)", self.lever_box)):
            head_label = QLabel(text, self)
            head_label.setWordWrap(True)
            lv.addWidget(head_label)
            lv.addLayout(layout)
        lv.addWidget(self.assumptions)
        lv.addStretch(1)
        left.setMinimumWidth(self.fontMetrics().horizontalAdvance("x" * 40))
        scroll = QScrollArea(self)
        scroll.setWidget(left)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)

        self.table = _BudgetTable(0, len(BUDGET_COLUMNS), self)
        for c, (title, tip) in enumerate(BUDGET_COLUMNS):
            head_item = QTableWidgetItem(title)
            head_item.setToolTip(tip)
            self.table.setHorizontalHeaderItem(c, head_item)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(True)
        self.table.horizontalHeader().sectionResized.connect(lambda *_: self._rows_timer.start())
        # wrapped formulas and notes: rows as tall as their text once the columns have a width
        self._rows_timer = QTimer(self)
        self._rows_timer.setSingleShot(True)
        self._rows_timer.setInterval(20)
        self._rows_timer.timeout.connect(self.table.resizeRowsToContents)
        self.table.resized.connect(self.fit_text_columns)
        self.table.setToolTip("The budget: what each category measured at the peak and at its own maximum, "
                              "and what napkin math expects from the model's size (DESIGN.md §8)")
        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.addWidget(scroll)
        budget_box = QWidget(self)
        bl = QVBoxLayout(budget_box)
        bl.setContentsMargins(0, 0, 0, 0)
        self.facts_line = QLabel(self)
        self.facts_line.setWordWrap(True)
        bl.addWidget(self.facts_line)
        bl.addWidget(self.table, 1)
        split.addWidget(budget_box)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 5)
        split.setSizes([500, 600])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(head)
        lay.addWidget(split, 1)
        self._timer = QTimer(self)          # a burst of slider moves: one update per event-loop turn
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self.update_now)

    # -- data ----------------------------------------------------------------------------------
    def set_data(self, data: DeviceData | None):
        self.data = data
        self.model = self.budget = self.facts = None
        self.last = None
        self._clear_controls()
        self.table.setRowCount(0)
        self.peak_line.setText("")
        self.fits_line.setText("")
        self.facts_line.setText("")

    def ensure_model(self) -> bool:
        """Build the per-category live model and the budget (once per device, on first use)."""
        d = self.data
        if d is None:
            return False
        if self.model is not None:
            return True
        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            self.model = CategoryLive.build(d.da)
            self.budget = make_budget(d.analysis, d.device, model=self.model)
            self.facts = self.budget.facts
        finally:
            QApplication.restoreOverrideCursor()
        self._build_controls()
        self._fill_budget()
        self.update_now()
        return True

    def _clear_controls(self):
        for lay in (self.grid, self.lever_box):
            while lay.count():
                it = lay.takeAt(0)
                if it.widget() is not None:
                    it.widget().deleteLater()
        self.sliders, self.values, self.levers = {}, {}, {}

    def _build_controls(self):
        self._clear_controls()
        for r, name in enumerate(self.model.categories):
            swatch = QLabel(f"<span style='color:{category_color(name).name()}'>■</span> {name}", self)
            sl = QSlider(Qt.Orientation.Horizontal, self)
            sl.setRange(0, SLIDER_MAX)
            sl.setValue(100)
            sl.setPageStep(10)
            sl.setToolTip(f"{name} x 0 … 2 (its live bytes at every moment); double-click the value to reset")
            sl.valueChanged.connect(lambda _v, n=name: self._on_slider(n))
            val = QLabel("×1.00", self)
            val.setMinimumWidth(self.fontMetrics().horizontalAdvance("×1.00 → ×0.26 ") + 4)
            self.grid.addWidget(swatch, r, 0)
            self.grid.addWidget(sl, r, 1)
            self.grid.addWidget(val, r, 2)
            self.sliders[name], self.values[name] = sl, val
        self.grid.setColumnStretch(1, 1)
        training = trains(self.data.da)
        expandable = expandable_segments_on(self.data.snap.allocator_settings)
        for r, (name, (title, _fn)) in enumerate(LEVERS.items()):
            lv = lever(name, self.facts)
            what = ", ".join(f"{c} ×{f:.3g}" for c, f in lv.scales.items()) or "no allocator overhead"
            cb = QCheckBox(title, self)
            cb.setToolTip(lv.assumption)
            why_not = left_out(name, self.facts, training=training, expandable=expandable)
            if why_not is not None:
                cb.setEnabled(False)
                cb.setToolTip(f"Does not apply to this run: {why_not}")
            cb.toggled.connect(lambda _on: self._schedule())
            # the factors beside the lever's name, wrapped in a narrow panel (a check box
            # never wraps: its whole text was cut off at 1024 pixels); a click on them ticks it
            factors = _ClickLabel(f"<span style='color:{self.palette().color(QPalette.ColorRole.PlaceholderText).name()}'>"
                                  f"{_esc(what)}</span>", self)
            factors.setWordWrap(True)
            factors.setToolTip(lv.assumption)
            factors.clicked.connect(cb.toggle)
            factors.setEnabled(cb.isEnabled())
            if not cb.isEnabled():
                factors.setToolTip(cb.toolTip())
            self.lever_box.addWidget(cb, r, 0, Qt.AlignmentFlag.AlignTop)
            self.lever_box.addWidget(factors, r, 1, Qt.AlignmentFlag.AlignTop)
            self.levers[name] = cb
        self.lever_box.setColumnStretch(1, 1)

    def _fill_budget(self):
        rows = self.budget.rows if self.budget is not None else ()
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            how = row.formula + (f"\n{row.note}" if row.note else "")
            cells = [row.category, fmt_bytes(row.measured), fmt_bytes(row.measured_max),
                     fmt_bytes(row.expected) if row.expected is not None else "—", how]
            for c, text in enumerate(cells):
                it = QTableWidgetItem(text)
                it.setToolTip(text)
                if c in (1, 2, 3):
                    it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if c == 0 and row.category in CATEGORIES:
                    it.setData(Qt.ItemDataRole.DecorationRole, category_color(row.category))
                if row.category == "total":
                    f = it.font()
                    f.setBold(True)
                    it.setFont(f)
                self.table.setItem(r, c, it)
        hh = self.table.horizontalHeader()
        for c in (0, 1, 2, 3):
            hh.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(4, QHeaderView.ResizeMode.Interactive)
        hh.setMinimumSectionSize(60)
        self.fit_text_columns()
        f = self.facts
        if f is not None:
            self.facts_line.setText(
                f"<b>Budget</b> · optimizer: {_esc(f.optimizer)} · trainable parameters {f.trainable_params:,}"
                + (f" ({f.trainable_fraction:.2%} of all)" if f.trainable_fraction else "")
                + (f" · 4-bit weights: {_esc(f.quant_scheme)}" if f.quant_scheme else "")
                + f" · dtypes: {_esc(f.dtype_evidence)}")

    # -- what the controls say ------------------------------------------------------------------
    def fit_text_columns(self):
        """The formulas fill the width the numbers leave, wrapped; below TEXT_COLUMN_MIN the
        table scrolls sideways rather than make a column a few words wide."""
        hh = self.table.horizontalHeader()
        used = sum(hh.sectionSize(c) for c in range(4))
        self.table.setColumnWidth(4, max(TEXT_COLUMN_MIN, self.table.viewport().width() - used))
        self._rows_timer.start()

    def reset(self):
        for sl in self.sliders.values():
            sl.blockSignals(True)
            sl.setValue(100)
            sl.blockSignals(False)
        for cb in self.levers.values():
            cb.blockSignals(True)
            cb.setChecked(False)
            cb.blockSignals(False)
        self.gpu.setCurrentIndex(0)
        self.update_now()

    def _on_slider(self, name: str):
        self._schedule()

    def _schedule(self):
        if not self._timer.isActive():
            self._timer.start()

    def checked_levers(self) -> list[str]:
        return [n for n, cb in self.levers.items() if cb.isChecked()]

    def factors(self) -> dict[str, float]:
        """{category: slider factor x the checked levers' factors} for the model's categories."""
        out = {name: sl.value() / 100.0 for name, sl in self.sliders.items()}
        for name in self.checked_levers():
            for c, f in lever(name, self.facts).scales.items():
                if c in out:
                    out[c] *= f
        return out

    def gpu_bytes(self) -> int | None:
        text = self.gpu.currentText().strip()
        if not text or text == NO_GPU:
            return None
        idx = self.gpu.findText(text)
        if idx > 0 and self.gpu.itemData(idx) is not None:
            return int(self.gpu.itemData(idx) * GiB)
        try:
            return parse_gpu_size(text.split(" (")[0])
        except WhatIfError:
            return None

    def update_now(self):
        """The exact scaled peak (CategoryLive.peak: about a millisecond at 10^6 events),
        its type in words, whether it fits, and the redraw."""
        d, cl = self.data, self.model
        if d is None or cl is None:
            return
        f = self.factors()
        levers = self.checked_levers()
        for name, val in self.values.items():
            slider = self.sliders[name].value() / 100.0
            val.setText(f"×{slider:.2f}" + (f" → ×{f[name]:.2f}" if abs(f[name] - slider) > 1e-9 else ""))
        fv = cl.factors(f)
        unit = bool(np.all(fv == 1.0))
        pk = cl.peak(fv)
        base = cl.peak()
        ptype = d.da.peak_type(pk.index)
        removes = any(lever(n, self.facts).removes_overhead for n in levers)
        gpu = self.gpu_bytes()
        fits = fits_on(d.da, base.bytes, base.index, pk.bytes, gpu, removes)
        self.last = (f, pk, ptype, fits)
        change = pk.bytes - base.bytes
        words = peak_words(ptype)
        where = f"entry {pk.index:,}" if pk.index >= 0 else "the start of the trace"
        self.peak_line.setText(
            f"<b>Peak {fmt_bytes(pk.bytes)}</b> {_esc(words)} ({where})"
            + ("" if unit else f" · measured {fmt_bytes(base.bytes)} · "
               f"<b>{'+' if change >= 0 else '−'}{fmt_bytes(abs(change))}</b>"))
        self.assumptions.setText(
            "<br>".join(f"<i>{_esc(lever(n, self.facts).title)}</i>: {_esc(lever(n, self.facts).assumption)}"
                        for n in levers))
        self.assumptions.setVisible(bool(levers))
        muted = self.palette().color(QPalette.ColorRole.PlaceholderText).name()
        if gpu is not None:
            verdict = (f"<b style='color:#2CA02C'>fits</b> with {fmt_bytes(fits.headroom_bytes)} to spare" if fits.fits
                       else f"<b style='color:#D62728'>short by {fmt_bytes(-fits.headroom_bytes)}</b>")
            head = f"On {fmt_bytes(gpu)}: {verdict} (needs {fmt_bytes(fits.needed_bytes)})"
        else:
            head = f"Needs {fmt_bytes(fits.needed_bytes)}"
        cards = " ".join(f"{'✓' if c.fits else '✗'}{c.name.split(' (')[0]}" for c in fits.cards)
        self.fits_line.setText(f"{head} · {cards}")
        self.fits_line.setToolTip(fits.note)
        self.fits_note = fits.note
        del muted
        # per DeviceData category (all of CATEGORIES), 1 for those the run lacks
        factors = np.ones(d.n_categories)
        for name, v in f.items():
            factors[d.categories.index(name)] = v
        text = f"what if: {fmt_bytes(pk.bytes)} · {words}"
        if unit and not levers:
            self.changed.emit(None, -1, 0, "", gpu)
        else:
            self.changed.emit(factors, int(pk.index), int(pk.bytes), text, gpu)
