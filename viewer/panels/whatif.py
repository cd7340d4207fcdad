"""The What-if panel: scale each category, pull levers, pick a GPU, and see the new peak
over the whole recorded run, the budget beside it, and the timeline redrawn scaled as a
slider moves.

A thin client of `classifiers.whatif.what_if` (model/whatif.py): the controls become its
arguments, its typed `WhatIf` answer becomes the words and the timeline's overlay. The
per-category model and the budget it keeps between questions are built once per device,
on the panel's own worker, when the panel is first shown (progress and Cancel in the
panel: the rest of the window stays usable).
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
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
from ...classifiers.whatif import COMMON_CARDS, WhatIf, WhatIfError
from ...common.units import fmt_bytes
from ...present.markup import html as _esc
from ...present.words import moment_text, peak_words, scaled_peak_words, trainable_params_words
from ...services.whatif import fit_factor_words
from ..model import DeviceData
from ..model.whatif import WhatIfSession
from ..theme import FITS_COLOR, SHORT_COLOR, category_color, muted_text, readable
from ..worker import Worker

@dataclass
class AskAnswer:
    """A what-if answer computed on the worker, for the session it was asked of (with the
    batch fit on the GPU asked about, when one is)."""
    result: WhatIf
    session: WhatIfSession
    fit: WhatIf | None = None


class _ClickLabel(QLabel):
    clicked = Signal()

    def mousePressEvent(self, event):
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit()
        super().mousePressEvent(event)


class _Slider(QSlider):
    """A factor's slider that a wheel turning over it changes only once it has the keyboard
    (a click, Tab): scrolling the panel with the wheel moved every slider it passed over."""

    def wheelEvent(self, event):
        if self.hasFocus():
            super().wheelEvent(event)
        else:
            event.ignore()                    # the panel scrolls instead


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
    """Emits `changed(WhatIf or None: as measured, the peak in words, GPU bytes or None)` as
    the user moves a slider, ticks a lever or types a size."""

    changed = Signal(object, str, object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.session: WhatIfSession | None = None
        self.sliders: dict[str, QSlider] = {}
        self.values: dict[str, QLabel] = {}
        self.levers: dict[str, QCheckBox] = {}
        self.last: WhatIf | None = None       # the answer shown
        self._gpu_choice: dict = {}          # (file, device) -> the GPU size typed or picked there
        self.worker = Worker(self)
        self._request: tuple[int, int] | None = None     # (analysis, device) the worker builds for
        self._asking = False                 # a simulated lever is being asked on the worker
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(lambda msg: self._on_not_built(f"The model could not be built: {msg}"))
        self.worker.cancelled.connect(lambda: self._on_not_built("Cancelled: the model is not built."))
        self.worker.progressed.connect(self._on_progress)

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
        self.fit_line = QLabel(self)          # how far the micro-batch could grow on the GPU asked about
        self.fit_line.setWordWrap(True)
        self.fit_line.setTextFormat(Qt.TextFormat.RichText)
        self.fit_line.hide()
        self.mode_note = QLabel(self)         # the view mode the what-if drawing needs, said (set_mode_note)
        self.mode_note.setWordWrap(True)
        self.mode_note.hide()
        # the answer first, across the panel: the new peak and whether it fits
        head = QHBoxLayout()
        answer = QVBoxLayout()
        answer.setSpacing(1)
        answer.addWidget(self.peak_line)
        answer.addWidget(self.fits_line)
        answer.addWidget(self.fit_line)
        answer.addWidget(self.mode_note)
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
        scroll.setMinimumHeight(40)           # a short window: the controls scroll, the answer stays
        scroll.setWidget(left)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)

        self.table = _BudgetTable(0, len(BUDGET_COLUMNS), self)
        self.table.setMinimumHeight(40)
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
        # while the model is built (on the worker): what is happening, and a way out
        self.building = QWidget(self)
        bl_row = QHBoxLayout(self.building)
        bl_row.setContentsMargins(0, 0, 0, 0)
        self.building_label = QLabel(self.building)
        self.building_label.setWordWrap(True)      # never holds the panel wider than the window
        self.building_bar = QProgressBar(self.building)
        self.building_bar.setRange(0, 0)
        self.building_bar.setMaximumWidth(200)
        self.building_btn = QPushButton("Cancel", self.building)
        self.building_btn.clicked.connect(self._on_building_button)
        bl_row.addWidget(self.building_label, 1)
        bl_row.addWidget(self.building_bar)
        bl_row.addWidget(self.building_btn)
        self.building.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.building)
        lay.addLayout(head)
        lay.addWidget(split, 1)
        self._timer = QTimer(self)          # a burst of slider moves: one update per event-loop turn
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self.update_now)
        self._fit_timer = QTimer(self)      # the batch fit: once the controls have settled
        self._fit_timer.setSingleShot(True)
        self._fit_timer.setInterval(150)
        self._fit_timer.timeout.connect(self.update_fit)

    # -- data ----------------------------------------------------------------------------------
    @staticmethod
    def _gpu_key(data: DeviceData | None):
        return None if data is None else (getattr(data.snap, "path", None) or id(data.analysis), data.device)

    def set_data(self, data: DeviceData | None):
        self._asking = False
        # the GPU line belongs to the file and device it was set on (a 48 GiB line carried
        # over squeezed a 7.88 GiB device into the bottom 15% of the plot)
        old = self._gpu_key(self.data)
        if old is not None:
            self._gpu_choice[old] = self.gpu.currentText()
        text = self._gpu_choice.get(self._gpu_key(data), NO_GPU)
        with QSignalBlocker(self.gpu):
            k = self.gpu.findText(text)
            if k >= 0:
                self.gpu.setCurrentIndex(k)
            else:
                self.gpu.setEditText(text)
        self.data = data
        self.worker.cancel()                  # a model of the device shown before: not wanted now
        self._request = None
        self.session = None
        self.last = None
        self.building.hide()
        self._clear_controls()
        self.table.setRowCount(0)
        self.peak_line.setText("")
        self.fits_line.setText("")
        self.fit_line.setText("")
        self.fit_line.hide()
        self.facts_line.setText("")

    def ensure_model(self) -> bool:
        """Build the per-category model and the budget of the device shown, once, on the
        worker (when the panel is first shown); True when they are there."""
        d = self.data
        if d is None:
            return False
        if self.session is not None:
            return True
        an, dev = d.analysis, d.device
        if self._request != (id(an), dev):
            self._request = (id(an), dev)
            self.worker.submit(lambda progress: WhatIfSession.build(an, dev, progress))
            self._show_building("Building the per-category model and the budget…", True)
        return False

    def _on_finished(self, result):
        if isinstance(result, AskAnswer):
            self._on_answer(result)
        elif isinstance(result, WhatIfSession):
            self._on_built(result)

    def _on_built(self, session: WhatIfSession):
        d = self.data
        if d is None or session.analysis is not d.analysis or session.device != d.device:
            return                            # a device no longer shown
        self._request = None
        self.building.hide()
        self.session = session
        self._build_controls()
        self._fill_budget()
        self.update_now()

    def _simulated(self, name: str) -> bool:
        """Whether the lever `name` replays the recorded run (asked on the worker), as the
        session's lever object says."""
        lv = self.session.levers.get(name) if self.session is not None else None
        return lv is not None and lv.simulated

    def _on_not_built(self, text: str):
        if self._asking:                      # a simulation cancelled (or failed): the levers unticked
            self._asking = False
            self.building.hide()
            for name, cb in self.levers.items():
                if self._simulated(name) and cb.isChecked():
                    with QSignalBlocker(cb):
                        cb.setChecked(False)
            self.update_now()
            return
        if self._request is not None:         # (not a request the device shown before made)
            self._request = None
            self._show_building(text, False)

    def _on_progress(self, label: str, done: float, total: float):
        if self.building.isVisible() and total > 0 and done > 0:     # a busy bar until a step is done
            self.building_bar.setRange(0, 100)
            self.building_bar.setValue(int(100 * min(1.0, done / total)))

    def _show_building(self, text: str, busy: bool):
        self.building_label.setText(text)
        self.building_bar.setRange(0, 0)
        self.building_bar.setVisible(busy)
        self.building_btn.setText("Cancel" if busy else "Build")
        self.building_btn.setToolTip("Stop building the model" if busy else "Build the model again")
        self.building.show()

    def _on_building_button(self):
        if self._request is not None or self._asking:
            self.worker.cancel()
        else:
            self.ensure_model()

    def shutdown(self):
        """Cancel and wait for the worker (before the window goes away)."""
        self.worker.shutdown()

    def _clear_controls(self):
        for lay in (self.grid, self.lever_box):
            while lay.count():
                it = lay.takeAt(0)
                if it.widget() is not None:
                    it.widget().deleteLater()
        self.sliders, self.values, self.levers = {}, {}, {}

    def _build_controls(self):
        self._clear_controls()
        session = self.session
        assert session is not None
        for r, name in enumerate(session.categories):
            swatch = QLabel(f"<span style='color:{category_color(name).name()}'>■</span> {name}", self)
            sl = _Slider(Qt.Orientation.Horizontal, self)
            sl.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
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
        for r, (name, lv) in enumerate(session.levers.items()):
            band = lv.error_band
            if lv.simulated:          # simulated on the recorded timeline, not a category's factor
                what = "simulated" + (f" · error {100 * band.worst_under:+.1f}% to {100 * band.worst_over:+.1f}%"
                                      if band is not None else " · not validated for this kind of run")
                tip = lv.assumption + (f" ({lv.band_note}: mean error {100 * band.mean:+.2f}%, worst "
                                       f"{100 * band.worst_under:+.2f}% / {100 * band.worst_over:+.2f}% over "
                                       f"{band.cases} recorded runs)" if band is not None else f" ({lv.band_note})")
            else:
                what = ", ".join(f"{c} ×{f:.3g}" for c, f in lv.scales.items()) or "no allocator overhead"
                tip = lv.assumption
            cb = QCheckBox(lv.title, self)
            cb.setToolTip(tip)
            why_not = session.left_out.get(name)
            if why_not is not None:
                cb.setEnabled(False)
                cb.setToolTip(f"Does not apply to this run: {why_not}")
            cb.toggled.connect(lambda _on: self._schedule())
            # the factors beside the lever's name, wrapped in a narrow panel (a check box
            # never wraps: its whole text was cut off at 1024 pixels); a click on them ticks it
            factors = _ClickLabel(f"<span style='color:{muted_text(self.palette(), QPalette.ColorRole.Window).name()}'>"
                                  f"{_esc(what)}</span>", self)
            factors.setWordWrap(True)
            factors.setToolTip(tip)
            factors.clicked.connect(cb.toggle)
            factors.setEnabled(cb.isEnabled())
            if not cb.isEnabled():
                factors.setToolTip(cb.toolTip())
            self.lever_box.addWidget(cb, r, 0, Qt.AlignmentFlag.AlignTop)
            self.lever_box.addWidget(factors, r, 1, Qt.AlignmentFlag.AlignTop)
            self.levers[name] = cb
        self.lever_box.setColumnStretch(1, 1)

    def _fill_budget(self):
        budget = self.session.budget if self.session is not None else None
        rows = budget.rows if budget is not None else ()
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
        f = budget.facts if budget is not None else None
        if f is not None:
            counted = bool(getattr(f, "counts_allowed", True))
            self.facts_line.setText(
                f"<b>Budget</b> · optimizer: {_esc(f.optimizer)} · "
                f"{_esc(trainable_params_words(int(f.trainable_params), counted))}"
                + (f" ({f.trainable_fraction:.2%} of all)" if f.trainable_fraction and f.trainable_params else "")
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

    def set_mode_note(self, text: str):
        """A line under the answer (the timeline switched to Categories for the drawing); '' hides it."""
        self.mode_note.setText(text)
        self.mode_note.setVisible(bool(text))

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
        """{category: the slider's factor} for the run's categories (the levers' come on top,
        in `what_if`)."""
        return {name: sl.value() / 100.0 for name, sl in self.sliders.items()}

    def gpu_request(self):
        """The GPU size as `what_if` takes it: a common card's GiB, the text typed, or None."""
        text = self.gpu.currentText().strip()
        if not text or text == NO_GPU:
            return None
        idx = self.gpu.findText(text)
        if idx > 0 and self.gpu.itemData(idx) is not None:
            return self.gpu.itemData(idx)
        return text.split(" (")[0]

    def _ask(self, session: WhatIfSession, sliders: dict, levers: list, gpu) -> WhatIf:
        try:
            return session.ask(sliders, levers, gpu)
        except WhatIfError:                   # a size it cannot read (yet): no GPU line
            return session.ask(sliders, levers, None)

    def update_now(self):
        """Ask `what_if` and show its answer: the peak, its type in words, whether it fits,
        and the timeline's overlay. Factors alone take about a millisecond at 10^6 events:
        asked here. A simulated lever (checkpointing, half the batch, LoRA) replays the run
        (seconds at 10^6 events): asked on the panel's worker, with a busy bar and Cancel,
        the window usable meanwhile (the checkpointing lever froze it for over 3 s)."""
        d, session = self.data, self.session
        if d is None or session is None:
            return
        sliders = self.factors()
        levers = self.checked_levers()
        gpu = self.gpu_request()
        if not any(self._simulated(name) for name in levers):
            if self._asking:
                self._asking = False
                self.worker.cancel()
                self.building.hide()
            self._show_answer(self._ask(session, sliders, levers, gpu))
            return
        self._asking = True
        ask = self._ask

        def job(progress):
            r = ask(session, sliders, levers, gpu)
            progress.check()
            fit = None
            if r.fits.gpu_bytes is not None:          # how far the batch grows, with them: on the worker too
                try:
                    fit = session.ask(sliders, levers, gpu, fit="batch")
                except WhatIfError:
                    fit = None
            return AskAnswer(r, session, fit)
        self.worker.submit(job)
        names = ", ".join(session.levers[n].title if n in session.levers else n for n in levers if self._simulated(n))
        self._show_building(f"Simulating {names} on the recorded run…", True)

    def _on_answer(self, answer: "AskAnswer"):
        self._asking = False
        if answer.session is not self.session:
            return                            # a device no longer shown
        self.building.hide()
        self._show_answer(answer.result)
        if answer.fit is not None:
            self._show_fit(answer.fit)

    def _show_answer(self, r: WhatIf):
        sliders = self.factors()
        self.last = r
        for name, val in self.values.items():
            slider, f = sliders[name], r.scales.get(name, 1.0)
            val.setText(f"×{slider:.2f}" + (f" → ×{f:.2f}" if abs(f - slider) > 1e-9 else ""))
        base, pk, fits = r.baseline, r.scaled, r.fits
        change = pk.bytes - base.bytes
        # a scaled peak describes itself: at the moment the recorded run ran out of memory,
        # not "right before an out-of-memory error" (a peak scaled under the card did not)
        state_only = self.data is not None and self.data.state_only
        words = scaled_peak_words(pk.type, state_only) if (r.scales or r.levers) else peak_words(pk.type, state_only)
        where = moment_text(pk.index, state_only)
        self.peak_line.setText(
            f"<b>Peak {fmt_bytes(pk.bytes)}</b> {_esc(words)} ({where})"
            + ("" if not r.scales and not r.simulation else f" · measured {fmt_bytes(base.bytes)} · "
               f"<b>{'+' if change >= 0 else '−'}{fmt_bytes(abs(change))}</b>"))
        self.assumptions.setText(
            "<br>".join(f"<i>{_esc(lv.title)}</i>: "
                        + (_esc(lv.assumption) if lv.applied else f"<b>not applied</b>: {_esc(lv.why)}")
                        + (f" <i>(error against recorded runs like this one: mean {100 * lv.error_band.mean:+.2f}%, "
                           f"worst {100 * lv.error_band.worst_under:+.2f}% / {100 * lv.error_band.worst_over:+.2f}%)</i>"
                           if lv.applied and lv.error_band is not None else
                           (f" <i>({_esc(lv.band_note)})</i>" if lv.applied and lv.band_note else ""))
                        for lv in r.levers))
        self.assumptions.setVisible(bool(r.levers))
        gpu = fits.gpu_bytes
        if gpu is not None:
            bg = self.palette().color(QPalette.ColorRole.Window)
            verdict = (f"<b style='color:{readable(FITS_COLOR, bg).name()}'>fits</b> with "
                       f"{fmt_bytes(fits.headroom_bytes)} to spare" if fits.fits
                       else f"<b style='color:{readable(SHORT_COLOR, bg).name()}'>short by "
                            f"{fmt_bytes(-(fits.headroom_bytes or 0))}</b>"
                       if fits.fits is False else "<b>cannot tell</b> (the trace ends in the out-of-memory error)")
            head = (f"On {fmt_bytes(gpu)}: {verdict} (needs {'at least ' if fits.fits is None else ''}"
                    f"{fmt_bytes(fits.needed_bytes)})")
        else:
            head = f"Needs {fmt_bytes(fits.needed_bytes)}"
        cards = " ".join(f"{'✓' if c.fits else '?' if c.fits is None else '✗'}{c.name.split(' (')[0]}"
                         for c in fits.cards)
        self.fits_line.setText(f"{head} · {cards}")
        self.fits_line.setToolTip(fits.note)
        simulated = any(lv.simulated for lv in r.levers)
        if not r.scales and not r.levers:
            self.changed.emit(None, "", gpu)
        else:
            self.changed.emit(r, f"what if: {fmt_bytes(pk.bytes)} · {words}" + (" · simulated" if simulated else ""),
                              gpu)
        self.fit_line.setVisible(gpu is not None)
        if gpu is not None:
            self._fit_timer.start()

    def update_fit(self):
        """How far the micro-batch could grow on the GPU asked about, with the ticked levers and
        factors (what_if's fit), once the controls have settled (not while a simulation runs:
        the fit simulates the levers again, several times)."""
        session = self.session
        if self.data is None or session is None or self._asking:
            return
        if any(self._simulated(name) for name in self.checked_levers()):
            return                            # (asked on the worker with the answer: _on_answer)
        try:
            r = session.ask(self.factors(), self.checked_levers(), self.gpu_request(), fit="batch")
        except WhatIfError:
            return
        self._show_fit(r)

    def _show_fit(self, r: WhatIf):
        if not r.fit:
            return
        row = r.fit[0]
        if not row.applied:                  # declined: why, never a number
            self.fit_line.setText(f"Micro-batch on this GPU: <b>cannot tell</b>: {_esc(row.why)}")
            self.fit_line.setToolTip(r.fit_note)
            return
        # one "needs" in the panel (the line above's): this line says what is left at that size
        self.fit_line.setText(f"Micro-batch on this GPU: <b>{_esc(fit_factor_words(row.max_factor))}</b> the "
                              f"recorded one" + (" with the levers ticked" if row.levers else "")
                              + (f" ({fmt_bytes(row.headroom_bytes)} to spare at that size)"
                                 if row.max_factor and row.max_factor > 0 else ""))
        self.fit_line.setToolTip(r.fit_note)
