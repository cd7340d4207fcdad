"""The timeline: live memory stacked by category, over a whole run, at any zoom.

Every view change recomputes a per-pixel envelope (`DeviceData.envelope`) and
draws a few thousand vertices: pyqtgraph never sees the millions of events.
Range changes are coalesced: several in one event-loop turn (a wheel burst, a
drag) cost one recompute.

The widget owns the plot, its items and the view; two parts do the rest:
`stacking` (stacking.py: the three ways to stack, the what-if overlay) and `pointer`
(pointer.py: hover, click, cursor, selection, marked rows).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QPen
from PySide6.QtWidgets import QGraphicsItem, QVBoxLayout, QWidget

from ...classifiers import annotation_regions
from ...classifiers.iterations import PHASES, Iterations
from ...common.units import fmt_bytes
from ...present.words import peak_words
from ..model import DeviceData, Envelope
from ..model.notes import first_line, note_span
from .pointer import Pointer
from .stacking import Stacking
from .items import (
    BytesAxis,
    DeviceStrokes,
    GridItem,
    NoteMark,
    NotesItem,
    RasterBands,
    SpansItem,
    StackImage,
    TimeAxis,
    TimelineViewBox,
    VLinesItem,
    blend_over,
    column_strokes,
    cosmetic_pen,
    free_of,
)
from ..theme import (
    ANNOTATION_COLOR,
    GPU_COLOR,
    LEAK_COLOR,
    NOTE_COLOR,
    OOM_COLOR,
    PEAK_COLOR,
    PHASE_COLORS,
    WHATIF_COLOR,
    Theme,
    readable,
)


class TimelineWidget(QWidget):
    """Main plot plus an overview strip of the whole run.

    Three ways to stack the memory (`set_mode`): by category (live bytes per category),
    by allocation (each live allocation its own band, oldest at the bottom, memory_viz's
    Active Memory Timeline) and by segment (the allocator's reserved memory, each segment
    a band). The lines (allocated, reserved) and the markers are the same in all three.
    """

    hovered = Signal(int, int, float)          # row under the cursor (-1 none), entry index, x
    clicked = Signal(int, int, float)          # row clicked (-1 none), entry index, x
    viewChanged = Signal(float, float)
    hoverLeft = Signal()
    marked = Signal(float, float)              # a Ctrl+drag marked this x range
    modeChanged = Signal(str)
    segmentClicked = Signal(int, int)          # segment (DeviceData.segments), entry

    ITER_PEAK_PX = 16             # at most one iteration-peak marker per this many pixels
    MARKERS_AT_MOST = 20          # labelled OOM lines; the rest drawn as one item, unlabelled
    OVERVIEW_HEIGHT = 52          # the overview strip's height; COMPACT_OVERVIEW in a short window
    COMPACT_OVERVIEW = 26

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.theme = Theme.from_palette()
        self.visible_categories: list[int] = []
        self._notes = []
        self._iter_peak_x = np.zeros(0)
        self._iter_peak_y = np.zeros(0)
        self._auto_y = True
        self._refresh_pending = False
        self.last_env: Envelope | None = None     # the envelope drawn last (a what-if slider redraws from it)
        self.refresh_count = 0
        self._released = False

        self.axis_x = TimeAxis("bottom")
        self.axis_y = BytesAxis("left")
        self.axis_x.enableAutoSIPrefix(False)
        self.axis_y.enableAutoSIPrefix(False)
        self.vb = TimelineViewBox(enableMenu=False)
        self.plot = pg.PlotWidget(viewBox=self.vb, axisItems={"bottom": self.axis_x, "left": self.axis_y})
        self.plot.setToolTip("")
        pi = self.plot.getPlotItem()
        pi.hideButtons()
        pi.setMenuEnabled(False)
        pi.getAxis("left").setWidth(72)
        # each y tick's label is centred on its tick, and the plot starts at the widget's top
        # edge: half a line of room above it, or a tick near the top has its label cut in half
        # (a box zoom, or an auto range whose top lands just above a round number)
        pi.layout.setContentsMargins(1, self.fontMetrics().height() // 2 + 2, 1, 1)

        self.spans = SpansItem()
        self.bands = RasterBands()
        self.bands.setZValue(0)
        self.stack_bands = StackImage()
        self.stack_bands.setZValue(0)
        self.reserved_curve = DeviceStrokes()
        self.reserved_curve.setZValue(5)
        self.live_curve = DeviceStrokes()
        self.live_curve.setZValue(6)
        self.live_pen = self.reserved_pen = QPen()
        self.grid = GridItem(self.axis_x, self.axis_y)
        for it in (self.spans, self.bands, self.stack_bands, self.grid, self.reserved_curve, self.live_curve):
            self.vb.addItem(it, ignoreBounds=True)

        self.selection = pg.LinearRegionItem(movable=False)
        self.selection.setZValue(3)
        self.selection.hide()
        self.vb.addItem(self.selection, ignoreBounds=True)
        # the selected allocation's outline, at its place in the stack (its band's edges)
        self.sel_bar = pg.PlotCurveItem(connect="finite")
        self.sel_bar.setZValue(7)
        self.vb.addItem(self.sel_bar, ignoreBounds=True)

        self.cursor_line = pg.InfiniteLine(angle=90, movable=False)
        self.cursor_line.setZValue(8)
        self.cursor_line.hide()
        self.vb.addItem(self.cursor_line, ignoreBounds=True)
        self.hover_line = pg.InfiniteLine(angle=90, movable=False)
        self.hover_line.setZValue(8)
        self.hover_line.hide()
        self.vb.addItem(self.hover_line, ignoreBounds=True)

        self.peak_marker = pg.ScatterPlotItem(size=11, symbol="t1")
        self.peak_marker.setZValue(10)
        self.vb.addItem(self.peak_marker, ignoreBounds=True)
        self.peak_label = pg.TextItem(anchor=(0, 1))
        self.peak_label.setZValue(11)
        self.vb.addItem(self.peak_label, ignoreBounds=True)
        # what-if: the scaled peak, its words, and a GPU's size
        self.whatif_marker = pg.ScatterPlotItem(size=12, symbol="t1")
        self.whatif_marker.setZValue(10)
        self.vb.addItem(self.whatif_marker, ignoreBounds=True)
        self.whatif_label = pg.TextItem(anchor=(0, 1))
        self.whatif_label.setZValue(11)
        self.whatif_label.hide()
        self.vb.addItem(self.whatif_label, ignoreBounds=True)
        # the phases' names and the notes' chips keep clear of the peaks' words
        self.spans.obstacles = [self.peak_label, self.whatif_label]
        self.gpu_line = pg.InfiniteLine(angle=0, movable=False,
                                        label="GPU", labelOpts={"position": 0.02, "anchors": [(0, 1), (0, 1)]})
        self.gpu_line.setZValue(9)
        self.gpu_line.hide()
        self.vb.addItem(self.gpu_line, ignoreBounds=True)
        self.iter_peaks = pg.ScatterPlotItem(size=7, symbol="t1")
        self.iter_peaks.setZValue(9)
        self.vb.addItem(self.iter_peaks, ignoreBounds=True)
        self.marker_lines: list[pg.InfiniteLine] = []
        self._label_texts: dict[int, str] = {}     # a peak label's whole words (label_text)
        # the OOMs past the first MARKERS_AT_MOST, unlabelled, one item (a run that ran out of memory again and again)
        self.more_ooms = VLinesItem()
        self.vb.addItem(self.more_ooms, ignoreBounds=True)
        self.leak_marks = pg.ScatterPlotItem(size=8, symbol="d")
        self.leak_marks.setZValue(9)
        self.leak_marks.setToolTip("Leaked allocations: made every iteration, never freed")
        self.vb.addItem(self.leak_marks, ignoreBounds=True)

        # the user's notes, and the range a Ctrl+drag marked (what "Annotate Range" takes)
        self.notes = NotesItem()
        self.notes.obstacles = [self.peak_label, self.whatif_label]
        self.vb.addItem(self.notes, ignoreBounds=True)
        self.mark = pg.LinearRegionItem(movable=False)
        self.mark.setZValue(4)
        self.mark.hide()
        self.vb.addItem(self.mark, ignoreBounds=True)
        self._marked: tuple[float, float] | None = None

        self.hover_label = pg.TextItem(anchor=(0, 0))
        self.hover_label.setZValue(20)
        self.hover_label.hide()
        self.vb.addItem(self.hover_label, ignoreBounds=True)

        # the overview strip: the whole run, with the main view as a draggable region
        self.overview = pg.PlotWidget()
        self.overview.setFixedHeight(self.OVERVIEW_HEIGHT)
        opi = self.overview.getPlotItem()
        opi.hideButtons()
        opi.setMenuEnabled(False)
        opi.hideAxis("bottom")
        # an empty left axis as wide as the main plot's keeps the two x scales aligned
        oax = opi.getAxis("left")
        oax.setStyle(showValues=False, tickLength=0)
        oax.setWidth(72)
        oax.setPen(pg.mkPen(None))
        ovb = opi.getViewBox()
        ovb.setMouseEnabled(x=False, y=False)
        ovb.setMenuEnabled(False)
        # the whole run never changes: cached as a pixmap, only the region moves
        self.ov_curve = DeviceStrokes()
        self.ov_curve.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        ovb.addItem(self.ov_curve)
        self.ov_region = pg.LinearRegionItem()
        self.ov_region.setZValue(10)
        ovb.addItem(self.ov_region, ignoreBounds=True)
        self.ov_region.sigRegionChanged.connect(self._on_region)
        self.ov_region.sigRegionChangeFinished.connect(self._on_region)    # a drag's last move
        ovb.sigResized.connect(self._build_overview)
        self.overview.setToolTip("The whole run. Drag the highlighted region to move the view, "
                                 "drag its edges to zoom.")
        self.plot.setToolTip("")

        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.plot, 1)
        lay.addWidget(self.overview)

        self.vb.sigXRangeChanged.connect(self._schedule_refresh)
        self.vb.sigResized.connect(self._schedule_refresh)
        self.vb.sigBoxZoom.connect(self._on_box_zoom)
        self.vb.sigMark.connect(self._on_mark)
        self.stacking = Stacking(self)
        self.pointer = Pointer(self)
        self.vb.sigClicked.connect(self.pointer.on_click)
        self.plot.scene().sigMouseMoved.connect(self.pointer.on_mouse_moved)
        # the pointer leaving the plot (into a panel, a tab): the hover box goes
        self.plot.viewport().installEventFilter(self)
        self.plot.installEventFilter(self)
        self._syncing_region = False
        self.apply_theme(self.theme)

    def eventFilter(self, obj, ev):
        if ev.type() == QEvent.Type.Leave and obj in (self.plot, self.plot.viewport()):
            self.pointer.left()
        return super().eventFilter(obj, ev)

    def hide_hover(self):
        """No hover box (before the window is saved as an image: never in an export)."""
        self.pointer.left()

    def set_compact(self, level: int):
        """A short window gives the plot the pixels: the overview strip thinner (1), or left
        out (2: 800x500 under a title bar, where Home and the wheel do its work); never
        taller than the plot."""
        h = self.COMPACT_OVERVIEW if level >= 1 else self.OVERVIEW_HEIGHT
        if self.overview.minimumHeight() != h:
            self.overview.setFixedHeight(h)
        self.overview.setVisible(level < 2)

    # -- theme ---------------------------------------------------------------------------
    def apply_theme(self, theme: Theme):
        self.theme = theme
        for w in (self.plot, self.overview):
            w.setBackground(theme.background)
        for name in ("left", "bottom"):
            ax = self.plot.getPlotItem().getAxis(name)
            ax.setPen(theme.muted)
            ax.setTextPen(theme.foreground)
        self.grid.set_color(theme.foreground)
        self.live_pen = cosmetic_pen(theme.live_line)
        self.reserved_pen = cosmetic_pen(theme.reserved_line)
        acc = QColor(theme.accent)
        self.cursor_line.setPen(pg.mkPen(acc, width=1.5))
        h = QColor(theme.foreground)
        h.setAlpha(90)
        self.hover_line.setPen(pg.mkPen(h, width=1, style=Qt.PenStyle.DotLine))
        sel = QColor(theme.accent)
        sel.setAlpha(30)                   # (light: the phases' shades still read under it)
        self.selection_brush = QBrush(sel)
        self.selection.setBrush(self.selection_brush)
        for ln in self.selection.lines:
            ln.setPen(pg.mkPen(theme.accent, width=1))
        self.sel_bar.setPen(pg.mkPen(theme.accent, width=2))
        self.peak_marker.setBrush(QBrush(QColor(PEAK_COLOR)))
        self.peak_marker.setPen(pg.mkPen(theme.background, width=1))
        self.peak_label.setColor(readable(PEAK_COLOR, theme.background))      # a finding: 4.5:1
        # over a line (reserved memory sits right above a state-only snapshot's peak) the
        # label stays readable on its own patch of background
        label_bg = QColor(theme.background)
        label_bg.setAlpha(215)
        self.peak_label.fill = pg.mkBrush(label_bg)
        self.whatif_marker.setBrush(QBrush(QColor(WHATIF_COLOR)))
        self.whatif_marker.setPen(pg.mkPen(theme.background, width=1))
        self.whatif_label.setColor(readable(WHATIF_COLOR, theme.background))
        self.whatif_label.fill = pg.mkBrush(label_bg)
        self.gpu_line.setPen(pg.mkPen(GPU_COLOR, width=1.5, style=Qt.PenStyle.DashDotLine))
        self.gpu_line.label.setColor(QColor(GPU_COLOR))
        measured = QColor(theme.foreground)
        measured.setAlpha(110)
        self.measured_pen = cosmetic_pen(blend_over(measured, theme.background))
        self.leak_marks.setBrush(QBrush(QColor(LEAK_COLOR)))
        self.leak_marks.setPen(pg.mkPen(theme.background, width=1))
        ip = QColor(PEAK_COLOR)
        ip.setAlpha(150)
        self.iter_peaks.setBrush(QBrush(ip))
        self.iter_peaks.setPen(pg.mkPen(None))
        self.hover_label.fill = pg.mkBrush(theme.hover_bg)
        self.hover_label.border = pg.mkPen(theme.muted)
        self.hover_label.setColor(theme.foreground)
        reg = QColor(theme.accent)
        reg.setAlpha(60)
        self.ov_region.setBrush(QBrush(reg))
        self.notes.set_colors(QColor(NOTE_COLOR), theme.background, theme.foreground)
        mk = QColor(NOTE_COLOR)
        mk.setAlpha(40)
        self.mark.setBrush(QBrush(mk))
        for ln in self.mark.lines:
            ln.setPen(pg.mkPen(NOTE_COLOR, width=1, style=Qt.PenStyle.DashLine))
        if self.data is not None:
            self._build_static()
            self.pointer.place_row_marks()
            self.refresh_now()

    # -- data -------------------------------------------------------------------------------
    def set_data(self, data: DeviceData | None, visible_categories: list[int]):
        self.data = data
        self.visible_categories = list(visible_categories)
        self.pointer.selected_row = -1
        self.selection.hide()
        self.sel_bar.setData([], [])
        self.cursor_line.hide()
        self.hover_label.hide()
        self.hover_line.hide()
        self.clear_mark()
        self.notes.set_marks([])
        mode_dropped = self.stacking.reset()
        self.whatif_marker.setData([], [])
        self.whatif_label.hide()
        self.gpu_line.hide()
        self.pointer.set_row_marks(None)
        if data is None:
            for it in (self.bands, self.stack_bands, self.live_curve, self.reserved_curve, self.ov_curve):
                it.clear()
            self.peak_marker.setData([], [])
            self.iter_peaks.setData([], [])
            self.leak_marks.setData([], [])
            self.more_ooms.set_lines([], QPen())
            self.peak_label.hide()
            self.spans.set_spans([], [], [], [], QPen())
            self._clear_markers()
            return
        if mode_dropped:
            self.modeChanged.emit(self.mode)
        self._label_axis()
        self._apply_limits()
        self._build_static()
        self.reset_view()

    def _label_axis(self):
        d = self.data
        self.axis_x.has_time = d.time_axis
        self.axis_x.state_only = d.n == 0
        self.axis_x.setLabel("the snapshot's state (no trace recorded)" if d.n == 0 else
                             "time since the first event" if d.time_axis else "trace entry")
        self.axis_x.picture = None
        self.axis_x.update()

    # -- the parts' interface, for the window ------------------------------------------------------
    @property
    def mode(self) -> str:
        return self.stacking.mode

    def set_mode(self, mode: str) -> bool:
        """Stack by 'categories', 'allocations' or 'segments' (False: not for this file)."""
        return self.stacking.set_mode(mode)

    def set_whatif(self, result, text: str = "", gpu_bytes: int | None = None):
        """The what-if overlay (stacking.py); None: as measured."""
        self.stacking.set_whatif(result, text, gpu_bytes)

    def select_row(self, row: int):
        self.pointer.select_row(row)

    def set_cursor_index(self, i: int):
        self.pointer.set_cursor_index(i)

    def set_row_marks(self, rows):
        self.pointer.set_row_marks(rows)

    def set_visible_categories(self, cats: list[int]):
        self.visible_categories = list(cats)
        self.refresh_now()

    def set_time_axis(self, on: bool):
        """Seconds or trace entries on the x axis (the same entries stay in view)."""
        d = self.data
        if d is None:
            return
        x0, x1 = self.x_span()
        first, last = int(d.index_at_x(x0)), d.index_before_x(x1)
        whole = self.x_span() == self.x_limits()
        d.set_time_axis(on)
        self._label_axis()
        self._apply_limits()
        self._build_static()
        self.set_notes(self._notes)
        self.pointer.place_row_marks()
        if whole or last <= first:
            self.reset_view()
        else:
            self.zoom_to_indices(first, last)
        self.pointer.select_row(self.pointer.selected_row)

    # -- notes and the marked range -------------------------------------------------------------
    def set_notes(self, notes):
        """Draw the user's annotations (in the store's order, numbered from 1 as in reports);
        those on another device are left out."""
        d = self.data
        self._notes = list(notes)
        marks = []
        for k, a in enumerate(notes, 1):
            span = note_span(d, a)
            if span is None:
                continue
            x0, x1 = (float(v) for v in d.x_of_index(list(span)))
            if a.kind == "range" and span[0] < 0:
                x0 = d.x_range[0]
            text = first_line(a.note, 80) or a.kind
            label = f"{k} · {text}"
            tip = f"Note {k} ({a.where()})" + (f"\n{a.note}" if a.note else "")
            marks.append(NoteMark(a.id, a.kind, x0, max(x0, x1), label, tip))
        self.notes.set_marks(marks)

    def set_current_note(self, ann_id: str | None):
        self.notes.set_current(ann_id)

    def _on_mark(self, x0: float, x1: float, finished: bool):
        if self.data is None:
            return
        if x1 <= x0:
            if finished:
                self.clear_mark()
            return
        self.mark.setRegion((x0, x1))
        self.mark.show()
        if finished:
            self._marked = (x0, x1)
            self.marked.emit(x0, x1)

    def mark_range(self, x0: float, x1: float):
        """Mark [x0, x1] as a Ctrl+drag would."""
        self._on_mark(min(x0, x1), max(x0, x1), True)

    def clear_mark(self):
        self._marked = None
        self.mark.hide()

    def marked_range(self) -> tuple[float, float] | None:
        return self._marked

    def _clear_markers(self):
        for ln in self.marker_lines:
            self.vb.removeItem(ln)
        self.marker_lines = []

    def _build_static(self):
        """Everything that does not depend on the view: markers, spans, the overview."""
        d = self.data
        self._clear_markers()
        # peak
        peak = d.da.peak
        if peak is not None:
            px = float(d.x_of_index(max(peak.index, 0)))
            self.peak_marker.setData([px], [peak.bytes])
            self.label_text(self.peak_label, f"peak {fmt_bytes(peak.bytes)} · {peak_words(peak.type, d.state_only)}")
            self.peak_label.setPos(px, peak.bytes)
            self.peak_label.show()
        else:
            self.peak_marker.setData([], [])
            self.peak_label.hide()
        ips = Iterations.of(d.iterations)         # (columns: a run of short steps has a million)
        self._iter_peak_x = d.x_of_index(np.maximum(ips.peak_index, 0)) if len(ips) else np.zeros(0)
        self._iter_peak_y = ips.peak_bytes.astype(float)
        self.iter_peaks.setData([], [])
        leak_x, leak_y, more_ooms = [], [], []
        for f in d.findings.head:                  # (the OOMs and leaks: not the iterations' peaks)
            if f.kind == "oom":
                if len(self.marker_lines) < self.MARKERS_AT_MOST:
                    self._marker(f.index, OOM_COLOR, "OOM", Qt.PenStyle.SolidLine)
                else:
                    more_ooms.append(max(f.index, 0))
            elif f.kind == "leak":
                rows = f.rows
                if rows is not None and len(rows):
                    idx = d.alloc_index[rows[-500:]]
                    leak_x.extend(d.x_of_index(idx).tolist())
                    leak_y.extend(d.live[idx].astype(float).tolist())
                elif f.index >= 0:
                    self._marker(f.index, LEAK_COLOR, "leak", Qt.PenStyle.DashLine)
        self.leak_marks.setData(leak_x, leak_y)
        self.more_ooms.set_lines(d.x_of_index(np.asarray(more_ooms, dtype=np.int64)) if more_ooms else [],
                                 pg.mkPen(OOM_COLOR, width=1.5))
        self.spans.avoid = np.array([ln.value() for ln in self.marker_lines], dtype=float)
        # iterations and phases
        starts, ends, brushes, lines, labels = [], [], [], [], []
        alpha = 34 if not self.theme.dark else 30
        bg = self.theme.background
        shade = {}                        # opaque: translucent full-height fills cost ms each
        for name in PHASE_COLORS:
            col = QColor(PHASE_COLORS[name])
            col.setAlpha(alpha)
            shade[name] = blend_over(col, bg)
        other = QColor("#888888")
        other.setAlpha(alpha)
        other = blend_over(other, bg)
        if len(ips):
            lines = d.x_of_index(ips.start)
            # every iteration's phases, in the order of its own (iteration by iteration)
            j, k = np.nonzero(ips.hi.T >= 0)         # (iteration, phase) pairs, by iteration
            if len(j):
                starts = d.x_of_index(ips.lo[k, j])
                ends = d.x_of_index(ips.hi[k, j])
                names = np.array(PHASES, dtype=object)[k]
                brushes = [shade.get(name, other) for name in names.tolist()]
                labels = names.tolist()
        if not len(ips) and d.has_time:
            # no iterations found: show the snapshot's record_function regions instead,
            # coloured by the phase the rules give their names
            rules = d.analysis.rules
            for r in annotation_regions(d.snap.annotations, d.device, rules):
                if r.end_us is None:
                    continue
                col = QColor(PHASE_COLORS.get(r.phase, ANNOTATION_COLOR))
                col.setAlpha(alpha)
                col = blend_over(col, bg)
                starts, ends = list(starts), list(ends)
                starts.append(float(d.x_of_us(r.start_us)))
                ends.append(float(d.x_of_us(r.end_us)))
                brushes.append(col)
                labels.append(r.name.split("#")[-1])
        lc = QColor(self.theme.foreground)
        lc.setAlpha(80)
        self.spans.set_spans(starts, ends, brushes, lines, QPen(blend_over(lc, bg), 1, Qt.PenStyle.DashLine), labels,
                             self.theme.muted)
        self._build_overview()

    def _build_overview(self):
        """The whole run at the strip's width (again when the strip is resized)."""
        d = self.data
        if d is None or self._released:
            return
        ovb = self.overview.getPlotItem().getViewBox()
        ovb.setXRange(*self.x_limits(), padding=0)
        # one column per pixel of the strip's plot area, over its whole x range
        (vx0, vx1), _ = ovb.viewRange()
        w = max(50, int(round(ovb.width() * self.overview.devicePixelRatioF())))
        env = d.envelope(vx0, vx1, w)
        fill = QColor(self.theme.foreground)
        fill.setAlpha(60)
        fill = blend_over(fill, self.theme.background)
        top = env.col_comp.sum(axis=1)[:, None]
        strokes = column_strokes(env.col_x, top, [fill])
        if env.reserved_y is not None:
            strokes.append((env.line_x, env.reserved_y, "all", cosmetic_pen(self.theme.reserved_line)))
        strokes.append((env.line_x, env.live_y, "all", cosmetic_pen(self.theme.live_line)))
        self.ov_curve.set_strokes(strokes)
        ovb.setYRange(0, max(1.0, env.visible_max) * 1.05, padding=0)

    def _marker(self, index: int, color: str, text: str, style):
        d = self.data
        assert d is not None
        x = float(d.x_of_index(max(index, 0)))
        ln = pg.InfiniteLine(pos=x, angle=90, movable=False, pen=pg.mkPen(color, width=1.5, style=style),
                             label=text, labelOpts={"position": 0.96, "color": readable(color, self.theme.background),
                                                    "movable": False})
        ln.setZValue(9)
        self.vb.addItem(ln, ignoreBounds=True)
        self.marker_lines.append(ln)

    # -- view -------------------------------------------------------------------------------
    def x_limits(self) -> tuple[float, float]:
        """The widest view: the run plus 1% each side (what Home shows). Views, pans,
        zooms and the overview's region stay inside it: beyond the data there is nothing
        to draw but the last value carried on."""
        if self.data is None:
            return 0.0, 1.0
        x0, x1 = self.data.x_range
        pad = (x1 - x0) * 0.01
        return x0 - pad, x1 + pad

    def _apply_limits(self):
        lo, hi = self.x_limits()
        d = self.data
        # the narrowest view: a few entries (an index axis), or a microsecond
        min_w = 4.0 if not d.time_axis else 1e-6
        self.vb.setLimits(xMin=lo, xMax=hi, minXRange=min(min_w, (hi - lo) / 2), maxXRange=hi - lo)

    def clamp(self, x0: float, x1: float) -> tuple[float, float]:
        """[x0, x1] moved (not shrunk) inside the limits; the whole when it is wider."""
        lo, hi = self.x_limits()
        w = x1 - x0
        if w >= hi - lo or w <= 0:
            return lo, hi
        if x0 < lo:
            x0, x1 = lo, lo + w
        elif x1 > hi:
            x0, x1 = hi - w, hi
        return x0, x1

    def reset_view(self):
        if self.data is None:
            return
        self._auto_y = True
        self.vb.setXRange(*self.x_limits(), padding=0)
        self.refresh_now()

    def x_span(self) -> tuple[float, float]:
        (x0, x1), _ = self.vb.viewRange()
        return x0, x1

    def set_x_range(self, x0: float, x1: float):
        self.vb.setXRange(*self.clamp(x0, x1), padding=0)

    def show_x_range(self, x0: float, x1: float):
        """Show [x0, x1] with the y axis fitted to it again (after a box zoom fixed it)."""
        self._auto_y = True
        self.set_x_range(x0, x1)

    def zoom(self, factor: float, center: float | None = None):
        """factor < 1 zooms in."""
        x0, x1 = self.x_span()
        c = (x0 + x1) / 2 if center is None else center
        self.set_x_range(c - (c - x0) * factor, c + (x1 - c) * factor)

    def pan(self, frac: float):
        x0, x1 = self.x_span()
        d = (x1 - x0) * frac
        self.set_x_range(x0 + d, x1 + d)

    def zoom_to_indices(self, first: int, last: int):
        d = self.data
        if d is None:
            return
        xa = float(d.x_of_index(first))
        xb = float(d.x_of_index(last))
        if xb <= xa:
            w = (d.x_range[1] - d.x_range[0]) / 200 or 1.0
            xa, xb = xa - w, xb + w
        pad = (xb - xa) * 0.05
        self._auto_y = True
        self.set_x_range(xa - pad, xb + pad)
        self.refresh_now()

    def _on_box_zoom(self):
        self._auto_y = False

    def _schedule_refresh(self, *args):
        if not self._refresh_pending:
            self._refresh_pending = True
            QTimer.singleShot(0, self, self.refresh_now)

    def buckets(self) -> int:
        """One bucket per device pixel of the plot area (the bands tile it exactly)."""
        return max(16, int(round(self.vb.width() * self.devicePixelRatioF())))

    def refresh_now(self):
        """Recompute the envelope for the current view and hand it to the items."""
        self._refresh_pending = False
        d = self.data
        if d is None or self._released:
            return
        x0, x1 = self.x_span()
        env = d.envelope(x0, x1, self.buckets())
        self.last_env = env
        self.refresh_count += 1
        self.draw(env)

    def _category_parts(self, env: Envelope, comp: np.ndarray, order: list[int]) -> tuple[np.ndarray, list]:
        """The bands of the visible categories, bottom up, and their colours: each category's
        bytes with evidence in its colour, then those that are a guess (no frames, live before
        recording: classifiers/evidence.py) in a paler shade of it, so a guess never looks like
        a finding. A simulated what-if draws whole categories (its run has no such split)."""
        d = self.data
        assert d is not None        # bands are drawn only for an open run
        st = self.stacking
        colors = [self.theme.band_color(d.categories[c]) for c in order]
        guessed = None
        if order and not (st.whatif is not None and st.whatif.simulation is not None):
            guessed = d.guessed_composition(env.col_index)
        if guessed is None or not guessed[:, order].any():
            return comp[:, order], colors
        if st.scales is not None:
            guessed = guessed * st.scales[None, :]
        g = np.minimum(np.maximum(guessed[:, order], 0.0), np.maximum(comp[:, order], 0.0))
        parts = np.empty((len(comp), 2 * len(order)))
        parts[:, 0::2] = comp[:, order] - g
        parts[:, 1::2] = g
        return parts, [c for col in colors for c in (col, self.theme.guess_color(col))]

    def draw(self, env: Envelope):
        """Hand one envelope to the items (a what-if slider redraws from the last one)."""
        d = self.data
        assert d is not None
        x0, x1 = env.x0, env.x1
        vis = self.visible_categories
        order = [c for c in vis]
        scaled_top = None
        st = self.stacking
        if st.mode == "categories":
            comp = st.scaled_columns(env) if st.scales is not None else env.col_comp
            parts, colors = self._category_parts(env, comp, order)
            cum = np.cumsum(np.maximum(parts, 0.0), axis=1) if len(colors) else np.zeros((len(env.col_x), 0))
            self.bands.set_columns(env.col_x, cum, colors)
            self.stack_bands.clear()
            st.cols = None
            if st.scales is not None:
                scaled_top = np.maximum(comp, 0.0).sum(axis=1)
        else:
            self.bands.clear()
            st.draw_stack(env)
        cx = np.repeat(env.col_x, 2)
        if scaled_top is None:
            self.live_curve.set_strokes([(cx, env.col_live.ravel(), "columns", self.live_pen)])
            if env.col_reserved is not None:
                self.reserved_curve.set_strokes([(cx, env.col_reserved.ravel(), "dashed-columns",
                                                  self.reserved_pen)])
            else:
                self.reserved_curve.clear()
        else:
            # what-if: the scaled total on top, the run as measured in grey beneath
            self.live_curve.set_strokes([(cx, np.repeat(scaled_top, 2), "columns", self.live_pen)])
            self.reserved_curve.set_strokes([(cx, env.col_live.ravel(), "columns", self.measured_pen)])
        if self._auto_y:
            top = env.visible_max if scaled_top is None else max(float(scaled_top.max()), float(env.col_live.max()))
            if self.peak_label.isVisible():
                px = self.peak_marker.data["x"][0] if len(self.peak_marker.data) else None
                if px is not None and x0 <= px <= x1:
                    top = max(top, float(self.peak_marker.data["y"][0]))
            if self.gpu_line.isVisible():
                top = max(top, float(self.gpu_line.value()))
            self.vb.setYRange(0, max(top, 1.0) * 1.12, padding=0)
        self._syncing_region = True
        try:
            self.ov_region.setRegion((x0, x1))
        finally:
            self._syncing_region = False
        self._place_peak_labels(x0, x1)
        for it in (self.spans, self.notes):
            it.update()                  # their labels keep clear of the peaks' words, wherever they went
        self.pointer.update_selection_bar()
        self._thin_iteration_peaks(x0, x1)
        self.pointer.rehit()                # the box tells what is under the pointer in this view
        self.viewChanged.emit(x0, x1)

    def label_text(self, label, text: str):
        """A peak's words (the measured peak's, the what-if's); `_place_peak_labels` may show
        only their first part ('peak 3.91 GiB') where the whole does not fit."""
        self._label_texts[id(label)] = text
        label.setText(text)

    def _place_peak_labels(self, x0: float, x1: float):
        """Each peak's words inside the view and clear of the markers' labels (OOM, leak):
        beside the marker on the side with room, the whole words or only the size, moved
        under a marker's label they would cover; a peak outside the view is pointed at from
        the view's edge ('◂ peak 3.91 GiB'). In pixels, so again on every zoom and resize."""
        vb_rect = self.vb.sceneBoundingRect()
        if vb_rect.width() <= 0 or x1 <= x0:
            return
        (_, _), (y0, y1) = self.vb.viewRange()
        taken = [ln.label.mapRectToScene(ln.label.boundingRect()) for ln in self.marker_lines
                 if ln.isVisible() and ln.label is not None and ln.label.isVisible()
                 and x0 <= ln.value() <= x1]
        for label, marker in ((self.peak_label, self.peak_marker), (self.whatif_label, self.whatif_marker)):
            if not label.isVisible() or not len(marker.data):
                continue
            full = self._label_texts.get(id(label), label.toPlainText())
            short = full.split(" · ")[0]
            px, py = float(marker.data["x"][0]), float(marker.data["y"][0])
            at = self.vb.mapViewToScene(pg.Point(px, min(max(py, y0), y1)))
            if not x0 <= px <= x1:
                left = px < x0
                text = f"◂ {short}" if left else f"{short} ▸"
                label.setText(text)
                label.setAnchor((0, 1) if left else (1, 1))
                label.setPos(x0 if left else x1, min(max(py, y0), y1))
                continue
            right_first = px <= x0 + 0.6 * (x1 - x0)
            placed = False
            for text in dict.fromkeys((full, short)):
                label.setText(text)
                box = label.textItem.boundingRect()
                for right in (right_first, not right_first):
                    r = QRectF(at.x() if right else at.x() - box.width(), at.y() - box.height(), box.width(),
                               box.height())
                    if r.left() >= vb_rect.left() and r.right() <= vb_rect.right() and free_of(r, taken):
                        label.setAnchor((0 if right else 1, 1))
                        label.setPos(px, py)
                        placed = True
                        break
                if placed:
                    break
            if not placed:
                # under the markers' labels it would cover, on the side with more room
                label.setText(short)
                box = label.textItem.boundingRect()
                right = vb_rect.right() - at.x() >= at.x() - vb_rect.left()
                r = QRectF(at.x() if right else at.x() - box.width(), at.y() - box.height(), box.width(), box.height())
                below = max((t.bottom() for t in taken if t.intersects(r)), default=r.top())
                label.setAnchor((0 if right else 1, 0))
                label.setPos(px, self.vb.mapSceneToView(pg.Point(at.x(), below + 2)).y())
            taken.append(label.mapRectToScene(label.boundingRect()))

    def _on_region(self):
        if self._syncing_region or self.data is None:
            return
        a, b = self.ov_region.getRegion()
        if b > a:
            # moved, not squeezed, at the ends: the region keeps its width and stops there
            # (pyqtgraph's own bounds clamp each edge alone and collapse the region)
            ca, cb = self.clamp(a, b)
            self.set_x_range(ca, cb)
            if (ca, cb) != (a, b):
                self._syncing_region = True
                try:
                    self.ov_region.setRegion((ca, cb))
                finally:
                    self._syncing_region = False

    def release(self):
        """Let pyqtgraph drop its context menus (parentless top-level QMenus that
        would otherwise outlive the window)."""
        self.pointer.stop()
        self.data = None
        self._released = True
        for w in (self.plot, self.overview):
            w.close()          # pyqtgraph's close() also unparents the widget...
            w.deleteLater()    # ...so it must go explicitly

    def _thin_iteration_peaks(self, x0: float, x1: float):
        """The iteration peaks in view, the highest of each ITER_PEAK_PX-wide bin (hundreds
        of triangles side by side are a red smear, not markers); the run's peak has its own."""
        xs, ys = self._iter_peak_x, self._iter_peak_y
        if not len(xs):
            self.iter_peaks.setData([], [])
            return
        inside = np.flatnonzero((xs >= x0) & (xs <= x1))
        width = max(1.0, self.vb.width())
        bins = ((xs[inside] - x0) / max(x1 - x0, 1e-12) * width // self.ITER_PEAK_PX).astype(np.int64)
        if len(inside):
            order = np.lexsort((-ys[inside], bins))
            first = np.ones(len(order), dtype=bool)
            first[1:] = bins[order][1:] != bins[order][:-1]
            inside = inside[order][first]
        px = self.peak_marker.data["x"][0] if len(self.peak_marker.data) else None
        keep = inside if px is None else inside[np.abs(xs[inside] - px) > (x1 - x0) / width * 4]
        self.iter_peaks.setData(xs[keep], ys[keep])
