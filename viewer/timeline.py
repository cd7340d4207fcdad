"""The timeline: live memory stacked by category, over a whole run, at any zoom.

Every view change recomputes a per-pixel envelope (`DeviceData.envelope`) and
draws a few thousand vertices: pyqtgraph never sees the millions of events.
Range changes are coalesced: several in one event-loop turn (a wheel burst, a
drag) cost one recompute.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QPen
from PySide6.QtWidgets import QGraphicsItem, QVBoxLayout, QWidget

from ..classifiers import annotation_regions
from ..common.units import fmt_bytes, fmt_duration_us, fmt_seconds
from ..present.markup import html as _esc
from ..present.words import peak_words
from .model import DeviceData, Envelope
from .notes import first_line, note_span
from .plot_items import (
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
    blend_over,
    column_strokes,
    cosmetic_pen,
)
from .alloc_stack import SHADES
from .theme import (
    ANNOTATION_COLOR,
    GPU_COLOR,
    WHATIF_COLOR,
    SEGMENT_COLORS,
    LEAK_COLOR,
    NOTE_COLOR,
    OOM_COLOR,
    PEAK_COLOR,
    PHASE_COLORS,
    Theme,
    category_color,
)


MODES = ("categories", "allocations", "segments")


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
    segmentClicked = Signal(int, int)          # segment (DeviceData.seg_*), entry

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.theme = Theme.from_palette()
        self.visible_categories: list[int] = []
        self.mode = "categories"
        self._notes = []
        self._iter_peak_x = np.zeros(0)
        self._iter_peak_y = np.zeros(0)
        self._cols = None                          # the stacks drawn (allocation / segment modes)
        self._col_u = np.zeros(0, dtype=np.int64)  # view column -> position in _cols.moments
        self._auto_y = True
        self._refresh_pending = False
        self._last_env: Envelope | None = None
        self._hover_pos = None
        self._note_tip = ""
        self._selected_row = -1
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
        self.gpu_line = pg.InfiniteLine(angle=0, movable=False,
                                        label="GPU", labelOpts={"position": 0.02, "anchors": [(0, 1), (0, 1)]})
        self.gpu_line.setZValue(9)
        self.gpu_line.hide()
        self.vb.addItem(self.gpu_line, ignoreBounds=True)
        self.scales = None
        self._whatif_peak = None
        self.iter_peaks = pg.ScatterPlotItem(size=7, symbol="t1")
        self.iter_peaks.setZValue(9)
        self.vb.addItem(self.iter_peaks, ignoreBounds=True)
        self.marker_lines: list[pg.InfiniteLine] = []
        self.leak_marks = pg.ScatterPlotItem(size=8, symbol="d")
        self.leak_marks.setZValue(9)
        self.leak_marks.setToolTip("Leaked allocations: made every iteration, never freed")
        self.vb.addItem(self.leak_marks, ignoreBounds=True)

        # the user's notes, and the range a Ctrl+drag marked (what "Annotate Range" takes)
        self.notes = NotesItem()
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
        self.overview.setFixedHeight(52)
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
        self.vb.sigClicked.connect(self._on_click)
        self.vb.sigBoxZoom.connect(self._on_box_zoom)
        self.vb.sigMark.connect(self._on_mark)
        self.plot.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self._hover_timer = QTimer(self)
        self._hover_timer.setSingleShot(True)
        self._hover_timer.setInterval(25)
        self._hover_timer.timeout.connect(self._do_hover)
        self.apply_theme(self.theme)
        self._syncing_region = False

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
        sel.setAlpha(45)
        self.selection.setBrush(QBrush(sel))
        for ln in self.selection.lines:
            ln.setPen(pg.mkPen(theme.accent, width=1))
        self.sel_bar.setPen(pg.mkPen(theme.accent, width=2))
        self.peak_marker.setBrush(QBrush(QColor(PEAK_COLOR)))
        self.peak_marker.setPen(pg.mkPen(theme.background, width=1))
        self.peak_label.setColor(QColor(PEAK_COLOR))
        # over a line (reserved memory sits right above a state-only snapshot's peak) the
        # label stays readable on its own patch of background
        label_bg = QColor(theme.background)
        label_bg.setAlpha(215)
        self.peak_label.fill = pg.mkBrush(label_bg)
        self.whatif_marker.setBrush(QBrush(QColor(WHATIF_COLOR)))
        self.whatif_marker.setPen(pg.mkPen(theme.background, width=1))
        self.whatif_label.setColor(QColor(WHATIF_COLOR))
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
            self._refresh()

    # -- data -------------------------------------------------------------------------------
    def set_data(self, data: DeviceData | None, visible_categories: list[int]):
        self.data = data
        self.visible_categories = list(visible_categories)
        self._selected_row = -1
        self.selection.hide()
        self.sel_bar.setData([], [])
        self.cursor_line.hide()
        self.hover_label.hide()
        self.hover_line.hide()
        self.clear_mark()
        self.notes.set_marks([])
        self.scales = None
        self._whatif_peak = None
        self.whatif_marker.setData([], [])
        self.whatif_label.hide()
        self.gpu_line.hide()
        if data is None:
            for it in (self.bands, self.stack_bands, self.live_curve, self.reserved_curve, self.ov_curve):
                it.clear()
            self._cols = None
            self.peak_marker.setData([], [])
            self.iter_peaks.setData([], [])
            self.leak_marks.setData([], [])
            self.peak_label.hide()
            self.spans.set_spans([], [], [], [], QPen())
            self._clear_markers()
            return
        if self.mode == "segments" and not data.segments_known:
            self.mode = "categories"
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

    def set_visible_categories(self, cats: list[int]):
        self.visible_categories = list(cats)
        self._refresh()

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
        if whole or last <= first:
            self.reset_view()
        else:
            self.zoom_to_indices(first, last)
        self.select_row(self._selected_row)

    def set_mode(self, mode: str) -> bool:
        """Stack by 'categories', 'allocations' or 'segments' (False: not for this file)."""
        if mode not in MODES:
            raise ValueError(mode)
        if mode == "segments" and (self.data is None or not self.data.segments_known):
            return False
        if mode != self.mode:
            self.mode = mode
            self._refresh()
            self.select_row(self._selected_row)
            self.modeChanged.emit(mode)
        return True

    def stack_palette(self) -> np.ndarray:
        """uint32 [keys, SHADES]: neighbouring bands of one colour alternate shades."""
        d = self.data
        if self.mode == "segments":
            names = SEGMENT_COLORS
            base = [QColor(names[k % len(names)]) for k in range(max(1, int(d.seg_key.max()) + 1 if len(d.seg_key)
                                                                       else 1))]
        else:
            base = [self.theme.band_color(name) for name in d.categories]
        shades = []
        for c in base:
            row = [c, c.lighter(112), c.darker(108), c.lighter(124)][:SHADES]
            shades.append([q.rgba() for q in row])
        return np.array(shades, dtype=np.uint32)

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
            self.peak_label.setText(f"peak {fmt_bytes(peak.bytes)} · {peak_words(peak.type)}")
            self.peak_label.setPos(px, peak.bytes)
            self.peak_label.show()
        else:
            self.peak_marker.setData([], [])
            self.peak_label.hide()
        ips = d.iterations
        self._iter_peak_x = d.x_of_index(np.maximum([it.peak_index for it in ips], 0)) if ips else np.zeros(0)
        self._iter_peak_y = np.array([it.peak_bytes for it in ips], dtype=float)
        self.iter_peaks.setData([], [])
        leak_x, leak_y = [], []
        for f in d.findings:
            if f.kind == "oom":
                self._marker(f.index, OOM_COLOR, "OOM", Qt.PenStyle.SolidLine)
            elif f.kind == "leak":
                rows = f.rows
                if rows is not None and len(rows):
                    idx = d.alloc_index[rows[-500:]]
                    leak_x.extend(d.x_of_index(idx).tolist())
                    leak_y.extend(d.live[idx].astype(float).tolist())
                elif f.index >= 0:
                    self._marker(f.index, LEAK_COLOR, "leak", Qt.PenStyle.DashLine)
        self.leak_marks.setData(leak_x, leak_y)
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
        if d.iterations:
            lines = d.x_of_index([it.start_index for it in d.iterations])
            phases = [(name, a, b) for it in d.iterations for name, (a, b) in it.phases.items()]
            if phases:
                starts = d.x_of_index([ps for _, ps, _ in phases])
                ends = d.x_of_index([pe for _, _, pe in phases])
                brushes = [shade.get(name, other) for name, _, _ in phases]
                labels = [name for name, _, _ in phases]
        if not d.iterations and d.has_time:
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
        x = float(self.data.x_of_index(max(index, 0)))
        ln = pg.InfiniteLine(pos=x, angle=90, movable=False, pen=pg.mkPen(color, width=1.5, style=style),
                             label=text, labelOpts={"position": 0.96, "color": color, "movable": False})
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
        self._refresh()

    def x_span(self) -> tuple[float, float]:
        (x0, x1), _ = self.vb.viewRange()
        return x0, x1

    def set_x_range(self, x0: float, x1: float):
        self.vb.setXRange(*self.clamp(x0, x1), padding=0)

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
        self._refresh()

    def _on_box_zoom(self):
        self._auto_y = False

    def _schedule_refresh(self, *args):
        if not self._refresh_pending:
            self._refresh_pending = True
            QTimer.singleShot(0, self._refresh)

    def buckets(self) -> int:
        """One bucket per device pixel of the plot area (the bands tile it exactly)."""
        return max(16, int(round(self.vb.width() * self.devicePixelRatioF())))

    def refresh_now(self):
        self._refresh()

    def _refresh(self):
        """Recompute the envelope for the current view and hand it to the items."""
        self._refresh_pending = False
        d = self.data
        if d is None or self._released:
            return
        x0, x1 = self.x_span()
        env = d.envelope(x0, x1, self.buckets())
        self._last_env = env
        self.refresh_count += 1
        self._draw(env)

    def _draw(self, env: Envelope):
        """Hand one envelope to the items (a what-if slider redraws from the last one)."""
        d = self.data
        x0, x1 = env.x0, env.x1
        vis = self.visible_categories
        order = [c for c in vis]
        scaled_top = None
        if self.mode == "categories":
            comp = self._scaled_columns(env) if self.scales is not None else env.col_comp
            cum = np.cumsum(np.maximum(comp[:, order], 0.0), axis=1) if order else \
                np.zeros((len(env.col_x), 0))
            self.bands.set_columns(env.col_x, cum, [self.theme.band_color(d.categories[c]) for c in order])
            self.stack_bands.clear()
            self._cols = None
            if self.scales is not None:
                scaled_top = np.maximum(comp, 0.0).sum(axis=1)
        else:
            self.bands.clear()
            self._draw_stack(env)
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
        for label, marker in ((self.peak_label, self.peak_marker), (self.whatif_label, self.whatif_marker)):
            if label.isVisible() and len(marker.data):
                px = float(marker.data["x"][0])
                label.setAnchor((1, 1) if px > x0 + 0.6 * (x1 - x0) else (0, 1))
        self._update_selection_bar()
        self._thin_iteration_peaks(x0, x1)
        self.viewChanged.emit(x0, x1)

    # -- what if ------------------------------------------------------------------------------
    def set_whatif(self, factors: np.ndarray | None, peak_index: int = -1, peak_bytes: int = 0,
                   peak_text: str = "", gpu_bytes: int | None = None):
        """Draw the bands with each category's live bytes times its factor (None: as
        measured), the exact scaled peak with its words, and a card's size as a line. Redraws
        from the last envelope: no envelope is recomputed while a slider moves."""
        d = self.data
        self.scales = None if factors is None else np.asarray(factors, dtype=np.float64)
        self._whatif_peak = (int(peak_index), int(peak_bytes)) if factors is not None else None
        if factors is not None and d is not None:
            px = float(d.x_of_index(max(peak_index, 0)))
            self.whatif_marker.setData([px], [float(peak_bytes)])
            self.whatif_label.setText(peak_text)
            self.whatif_label.setPos(px, float(peak_bytes))
            self.whatif_label.show()
            self.peak_label.hide()           # the measured peak keeps its marker; the words are the new peak's
        else:
            self.whatif_marker.setData([], [])
            self.whatif_label.hide()
            if d is not None and d.da.peak is not None:
                self.peak_label.show()
        if gpu_bytes:
            self.gpu_line.setValue(float(gpu_bytes))
            self.gpu_line.label.setFormat(f"{fmt_bytes(gpu_bytes)} GPU")
            self.gpu_line.label.valueChanged()
            self.gpu_line.show()
        else:
            self.gpu_line.hide()
        if d is not None and self.mode != "categories" and factors is not None:
            self.set_mode("categories")
        elif self._last_env is not None and d is not None:
            self._draw(self._last_env)

    def _scaled_columns(self, env: Envelope) -> np.ndarray:
        """Each column's composition times the factors: of the two moments each column keeps
        (its highest measured total, its last entry) the one whose scaled total is higher,
        and in the what-if peak's own column the peak itself (so the top meets the marker)."""
        f = self.scales
        a = env.col_comp * f
        b = env.col_comp_last * f if env.col_comp_last is not None else a
        pick = b.sum(axis=1) > a.sum(axis=1)
        comp = np.where(pick[:, None], b, a)
        pk = self._whatif_peak
        if pk is not None and pk[0] >= -1:
            x = float(self.data.x_of_index(max(pk[0], 0)))
            if env.x0 <= x <= env.x1 and len(env.col_x):
                k = min(len(env.col_x) - 1, max(0, int((x - env.x0) / (env.x1 - env.x0) * len(env.col_x))))
                comp[k] = self.data.composition([pk[0]])[0] * f
        return comp

    ITER_PEAK_PX = 16             # at most one iteration-peak marker per this many pixels

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

    def _draw_stack(self, env: Envelope):
        """Allocation or segment bands at the moments the columns show (each distinct
        moment's stack computed once)."""
        d = self.data
        if self.mode == "segments":
            stack, keep = d.segment_stack(), None
        else:
            stack = d.alloc_stack()
            keep = np.zeros(256, dtype=bool)
            keep[self.visible_categories] = True
        moments, col_u = np.unique(env.col_index, return_inverse=True)
        cols = stack.columns(moments, keep)
        self._cols, self._col_u = cols, col_u.astype(np.int64)
        top = float(cols.top.max()) if len(cols.top) else 0.0
        self.stack_bands.set_stack(env.col_x, stack, cols, self._col_u, self.stack_palette(), top)

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

    # -- hover, click, selection ------------------------------------------------------------------
    def _on_mouse_moved(self, pos):
        if self.data is None or not self.vb.sceneBoundingRect().contains(pos):
            self.hide_hover()
            return
        # over a note's label the hover box tells the note (one box: a Qt tooltip on top
        # of it made two at once)
        self._note_tip = ""
        if self.notes.marks:
            vp = self.plot.mapFromScene(pos)
            self._note_tip = self.notes.tooltip_at(vp.x(), vp.y())
        self._hover_pos = self.vb.mapSceneToView(pos)
        self._hover_timer.start()

    def _do_hover(self):
        if self._hover_pos is None or self.data is None:
            return
        x, y = self._hover_pos.x(), self._hover_pos.y()
        if self._note_tip:
            self.note_hover_at(x, y, self._note_tip)
        else:
            self.hover_at(x, y)

    def note_hover_at(self, x: float, y: float, tip: str):
        head, _, body = tip.partition("\n")
        html = (f"<div style='font-size:9pt'><b>{_esc(head)}</b>"
                + (f"<br>{_esc(body).replace(chr(10), '<br>')}" if body else "") + "</div>")
        self._show_hover(x, y, html, width=min(420, max(200, int(self.vb.width() * 0.45))))

    def index_under(self, x: float) -> int:
        """The entry drawn at x: the highest moment of the pixel column's bucket
        (what the bands show there), or the state at x outside the last envelope."""
        env = self._last_env
        if env is not None and env.x1 > env.x0 and env.x0 <= x <= env.x1:
            k = int((x - env.x0) / (env.x1 - env.x0) * len(env.col_index))
            return int(env.col_index[min(max(k, 0), len(env.col_index) - 1)])
        return self.data.index_before_x(x)

    def column_under(self, x: float) -> int:
        env = self._last_env
        if env is None or not env.x1 > env.x0 or not env.x0 <= x <= env.x1:
            return -1
        k = int((x - env.x0) / (env.x1 - env.x0) * len(env.col_index))
        return min(max(k, 0), len(env.col_index) - 1)

    def thing_under(self, x: float, y: float) -> tuple[int, int, int]:
        """(allocation row, category, segment) drawn at (x, y) in the current mode (-1: none)
        and the entry the column shows, as (row, cat, seg, i)."""
        d = self.data
        i = self.index_under(x)
        if self.mode == "categories" or self._cols is None:
            row, cat = d.allocation_at_index(i, y, self.visible_categories)
            return row, cat, -1, i
        k = self.column_under(x)
        if k < 0:
            return -1, -1, -1, i
        u = int(self._col_u[k])
        rank = self._cols.rank_at(u, y)
        if self.mode == "segments":
            return -1, -1, d.segment_stack().row_of(rank), i
        row = d.alloc_stack().row_of(rank)
        return row, (int(d.category[row]) if row >= 0 else -1), -1, i

    def hover_at(self, x: float, y: float) -> int:
        """Show what is under (x, y); returns the allocation row or -1."""
        d = self.data
        row, cat, seg, i = self.thing_under(x, y)
        if seg >= 0:
            self._show_hover(x, y, self._segment_html(seg, i))
            self.hovered.emit(-1, i, x)
            return -1
        self._show_hover(x, y, self._hover_html(row, cat, i))
        self.hovered.emit(row, i, x)
        return row

    def _show_hover(self, x: float, y: float, html: str, width: int = -1):
        """The hover box at (x, y); `width` wraps long text (a note) in that many pixels."""
        self.hover_label.setTextWidth(width)
        self.hover_line.setPos(x)
        self.hover_line.show()
        self.hover_label.setHtml(html)
        (vx0, vx1), (vy0, vy1) = self.vb.viewRange()
        # keep the label inside the view: flip to the left/bottom near the edges
        ax = 1.0 if x > vx0 + (vx1 - vx0) * 0.6 else 0.0
        ay = 0.0 if y > vy0 + (vy1 - vy0) * 0.45 else 1.0
        self.hover_label.setAnchor((ax, ay))
        dx = (vx1 - vx0) * 0.008 * (-1 if ax else 1)
        self.hover_label.setPos(x + dx, y)
        self.hover_label.show()

    def _segment_html(self, seg: int, i: int) -> str:
        d = self.data
        when = self._when(i)
        size = int(d.seg_size[seg])
        inside = d.allocated_in_segment(seg, i)
        stream = f" · stream {int(d.seg_stream[seg])}" if len(d.streams) > 1 else ""
        pool = "small pool" if size == 2 << 20 else "large pool"
        return (f"<div style='font-size:9pt'><span style='opacity:0.75'>{when} · reserved "
                f"{fmt_bytes(d.reserved_at(i))}</span><br>"
                f"<b>segment 0x{int(d.seg_addr[seg]):x}</b> · {fmt_bytes(size)} ({pool}{stream})<br>"
                f"allocated in it {fmt_bytes(inside)} · free {fmt_bytes(size - inside)}<br>"
                f"<i style='opacity:0.7'>click: its blocks at this moment (Allocator panel)</i></div>")

    def _hover_html(self, row: int, cat: int, i: int) -> str:
        d = self.data
        when = self._when(i)
        live = fmt_bytes(d.live_at(i))
        head = f"<span style='opacity:0.75'>{when} · live {live}</span>"
        if row < 0:
            return f"<div style='font-size:9pt'>{head}</div>"
        a = d.allocs
        name = d.category_name(cat)
        col = category_color(name).name()
        size = fmt_bytes(int(a.size[row]))
        life = self.lifetime_text(row)
        view = d.stacks.view_of(d.da, d.da.allocation(row))
        lines = "<br>".join(_esc(fv.label)[:110] for fv in view.frames[:4]) or "(no stack recorded)"
        return (f"<div style='font-size:9pt'>{head}<br>"
                f"<b><span style='color:{col}'>■</span> {name}</b> · {size} · {life}<br>"
                f"<span style='font-family:monospace; font-size:8pt'>{lines}</span><br>"
                f"<i style='opacity:0.7'>click to select</i></div>")

    def _when(self, i: int) -> str:
        d = self.data
        if i < 0:
            return "before the trace"
        if d.has_time:
            return f"{fmt_seconds(float(d.seconds_of(i)), 1e-4)} · entry {i:,}"
        return f"entry {i:,}"

    def lifetime_text(self, row: int) -> str:
        d = self.data
        a, f = int(d.alloc_index[row]), int(d.free_index[row])
        if d.has_time and a >= 0 and f >= 0:
            return f"lived {fmt_duration_us(int(d.tkey[f]) - int(d.tkey[a]))}"
        span = d.time_span

        def at(i):
            return fmt_seconds(float(d.seconds_of(i)), 1e-4, span) if d.has_time else f"entry {i:,}"
        if a < 0 and f < 0:
            return "live for the whole trace"
        if a < 0:
            return f"from before the trace to {at(f)}"
        if f < 0:
            return f"from {at(a)}, never freed"
        return f"entries {a:,}–{f:,}"

    def _on_click(self, x: float, y: float):
        if self.data is None:
            return
        row, _, seg, i = self.thing_under(x, y)
        self.set_cursor_x(x)
        self.clicked.emit(row, i, x)
        if seg >= 0:
            self.segmentClicked.emit(seg, i)

    def set_cursor_x(self, x: float):
        self.cursor_line.setPos(x)
        self.cursor_line.show()

    def set_cursor_index(self, i: int):
        if self.data is not None:
            self.set_cursor_x(float(self.data.x_of_index(max(i, 0))))

    def select_row(self, row: int):
        """Highlight a row's lifetime (or clear with -1)."""
        self._selected_row = row
        d = self.data
        if d is None or row < 0:
            self.selection.hide()
            self.sel_bar.setData([], [])
            return
        first, last = d.row_span(row)
        xa = float(d.x_of_index(first)) if d.alloc_index[row] >= 0 else d.x_range[0]
        xb = float(d.x_of_index(last)) if d.free_index[row] >= 0 else d.x_range[1]
        self.selection.setRegion((xa, xb))
        self.selection.show()
        self._update_selection_bar()

    def _update_selection_bar(self):
        """The selected allocation's outline at its place in the stack, over the columns
        it is live in: its category's band plus the older allocations of its category below
        it (by category), or its own band (by allocation). By segment: none."""
        row, d, env = self._selected_row, self.data, self._last_env
        self.sel_bar.setData([], [])
        if d is None or row < 0 or env is None or self.mode == "segments":
            return
        a, f = int(d.alloc_index[row]), int(d.free_index[row])
        ci = env.col_index
        live = np.flatnonzero((ci >= a) & ((ci < f) | (f < 0)))
        if not len(live):
            return
        if self.mode == "allocations" and self._cols is not None:
            rank = d.alloc_stack().rank_of(row)
            u, bottom, top = self._cols.band_of(rank)
            if not len(u):
                return
            lo = np.full(len(self._cols.moments), np.nan)
            hi = np.full(len(self._cols.moments), np.nan)
            lo[u], hi[u] = bottom, top
            k = live[np.isfinite(lo[self._col_u[live]])]
            if not len(k):
                return
            y0, y1 = lo[self._col_u[k]], hi[self._col_u[k]]
        else:
            c = int(d.category[row])
            if c not in self.visible_categories:
                return
            below = self.visible_categories[:self.visible_categories.index(c)]
            base = np.maximum(env.col_comp[live][:, below], 0.0).sum(axis=1) if below else np.zeros(len(live))
            y0 = base + d.offset_in_category(row, ci[live])
            y1 = y0 + float(d.allocs.size[row])
            k = live
        # runs of neighbouring columns: one closed outline each (top left to right, bottom back)
        half = (env.col_x[1] - env.col_x[0]) / 2 if len(env.col_x) > 1 else 0.5
        breaks = np.flatnonzero(np.diff(k) > 1) + 1
        xs, ys = [], []
        for part in np.split(np.arange(len(k)), breaks):
            cx = env.col_x[k[part]]
            left, right = cx - half, cx + half
            tx = np.column_stack([left, right]).ravel()
            top_y = np.repeat(y1[part], 2)
            bot_y = np.repeat(y0[part], 2)
            xs += [tx, tx[::-1], tx[:1], [np.nan]]
            ys += [top_y, bot_y[::-1], top_y[:1], [np.nan]]
        self.sel_bar.setData(np.concatenate(xs), np.concatenate(ys), connect="finite")

    def release(self):
        """Let pyqtgraph drop its context menus (parentless top-level QMenus that
        would otherwise outlive the window)."""
        self._hover_timer.stop()
        self.data = None
        self._released = True
        for w in (self.plot, self.overview):
            w.close()          # pyqtgraph's close() also unparents the widget...
            w.deleteLater()    # ...so it must go explicitly

    def hide_hover(self):
        self._hover_timer.stop()
        self._hover_pos = None
        if self.hover_label.isVisible():
            self.hover_label.hide()
            self.hover_line.hide()
            self.hoverLeft.emit()

    def leaveEvent(self, ev):
        self.hide_hover()
        super().leaveEvent(ev)
