"""The timeline's graphics items: axes in bytes and seconds, the rasterised category
bands, per-column strokes, phase and iteration spans, the user's notes, the grid, and a
view box with box zoom and Ctrl+drag marking. Each draws only what one view needs, in
device space: pyqtgraph never sees the millions of events.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPainterPath, QPen, QTransform

from ...common.units import byte_unit, fmt_seconds
from ..qt import survives
from ..theme import NOTE_COLOR


# -- axes ----------------------------------------------------------------------------
class BytesAxis(pg.AxisItem):
    """Bytes in GiB/MiB/KiB with round steps in that unit."""

    @survives(list)
    def tickSpacing(self, minVal, maxVal, size):
        if not size > 0:
            return []                # an axis squeezed to nothing: no ticks
        _, scale = byte_unit(max(abs(minVal), abs(maxVal)))
        levels = super().tickSpacing(minVal / scale, maxVal / scale, size)
        return [(sp * scale, off * scale) for sp, off in levels]

    def tickStrings(self, values, scale, spacing):
        if not values:
            return []
        unit, s = byte_unit(max(abs(v) for v in values) or 1)
        step = spacing / s
        digits = 0 if step >= 1 else min(3, int(math.ceil(-math.log10(step))))
        return [f"{v / s:.{digits}f} {unit}" if v else "0" for v in values]


class TimeAxis(pg.AxisItem):
    """Seconds since the first event (ms/µs when zoomed in), or trace entries."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.has_time = True
        self.state_only = False      # a snapshot without a trace: one moment, no ticks

    @survives(list)
    def tickSpacing(self, minVal, maxVal, size):
        if self.state_only or not size > 0:
            return []
        levels = super().tickSpacing(minVal, maxVal, size)
        if not self.has_time:
            # entries are whole numbers: no ticks between them (0 0 0 1 1 1)
            levels = [(sp, off) for sp, off in levels if sp >= 1] or [(1.0, 0.0)]
        return levels

    def tickStrings(self, values, scale, spacing):
        if not self.has_time:
            return [f"{int(round(v)):,}" for v in values]
        span = max((abs(v) for v in values), default=0.0)
        return [fmt_seconds(v, spacing, span) for v in values]


# -- items -----------------------------------------------------------------------------
class DeviceStrokes(pg.GraphicsObject):
    """Lines given in data coordinates, stroked in device pixels.

    Each stroke is (x, y, connect, pen); connect 'all' draws a polyline, 'pairs'
    separate segments. The data are mapped to pixels with numpy when the view's
    transform changes and drawn with an identity transform: handing Qt a path in
    data coordinates plus a scaling transform cost 2.5 times as much per frame.

    Bands use it too, as one vertical 'pairs' segment per pixel column and band:
    the envelope has one column per device pixel, so aliased one-pixel lines tile
    each band exactly, for about 2 ms; filling the same bands as polygons with
    thousands of vertical spikes took Qt's rasteriser up to a second a frame.
    """

    def __init__(self):
        super().__init__()
        self._strokes: list[tuple[np.ndarray, np.ndarray, str, QPen]] = []
        self._rect = QRectF()
        self._key = None
        self._paths: list[tuple[QPainterPath, QPen]] = []

    def set_strokes(self, strokes):
        self.prepareGeometryChange()
        self._strokes = [(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64), c, pen)
                         for x, y, c, pen in strokes if len(x)]
        self._key = None
        if self._strokes:
            x0 = min(float(s[0].min()) for s in self._strokes)
            x1 = max(float(s[0].max()) for s in self._strokes)
            y0 = min(float(s[1].min()) for s in self._strokes)
            y1 = max(float(s[1].max()) for s in self._strokes)
            self._rect = QRectF(x0, y0, (x1 - x0) or 1e-9, (y1 - y0) or 1.0)
        else:
            self._rect = QRectF()
        self.update()

    def clear(self):
        self.set_strokes([])

    @survives(QRectF)
    def boundingRect(self):
        return self._rect

    @survives()
    def paint(self, p: QPainter, *args):
        if not self._strokes:
            return
        tr = p.transform()
        key = (tr.m11(), tr.m12(), tr.m21(), tr.m22(), tr.m31(), tr.m32())
        if key != self._key:
            self._paths = []
            for x, y, connect, pen in self._strokes:
                dx = x * key[0] + y * key[2] + key[4]
                dy = x * key[1] + y * key[3] + key[5]
                if connect in ("columns", "dashed-columns"):
                    # vertical pairs at least a pixel long: a flat stretch still shows
                    lo, hi = dy[0::2], dy[1::2]
                    short = np.abs(hi - lo) < 1.0
                    dy = dy.copy()
                    dy[1::2][short] = np.where(hi[short] >= lo[short], lo[short] + 1.0, lo[short] - 1.0)
                    if connect == "dashed-columns":
                        # a dash pattern restarts at every segment: dash the columns instead
                        col = np.round(dx[0::2]).astype(np.int64)
                        keep = ~short | ((col // 4) % 2 == 0)
                        keep = np.repeat(keep, 2)
                        dx, dy = dx[keep], dy[keep]
                    connect = "pairs"
                self._paths.append((pg.arrayToQPath(dx, dy, connect=connect), pen))
            self._key = key
        p.save()
        p.resetTransform()
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        for path, pen in self._paths:
            p.setPen(pen)
            p.drawPath(path)
        p.restore()


def columns_rect(x: np.ndarray, top: float) -> QRectF:
    """The data rectangle of pixel columns centred on `x`, from 0 up to `top`."""
    half = (x[1] - x[0]) / 2 if len(x) > 1 else 0.5
    return QRectF(float(x[0] - half), 0.0, float(x[-1] - x[0] + 2 * half), top or 1.0)


def device_view(item, p: QPainter):
    """(transform, device pixel ratio, the view in device coordinates, a key that changes
    when any of them does): what a rasterised item's cached image depends on."""
    tr = p.transform()
    dev = p.device()
    dpr = float(dev.devicePixelRatioF()) if dev is not None else 1.0
    vr = item.viewRect()
    clip = tr.mapRect(vr) if vr is not None else QRectF(0, -1e6, 1, 2e6)
    return tr, dpr, clip, (tr.m11(), tr.m22(), tr.m31(), tr.m32(), dpr, clip.top(), clip.bottom())


class RasterBands(pg.GraphicsObject):
    """Stacked category bands rasterised with numpy, one pixel column per bucket.

    Each column is a run of background, then the bands top to bottom: the whole
    image is one `np.repeat` of per-column colours by per-column heights, drawn
    with one `drawImage`. A frame costs the same at any number of events (2 to 4
    ms for a 1100x500 plot). Qt's own ways were slower: polygons with thousands
    of vertical spikes took its rasteriser up to a second, and one-pixel vertical
    lines per column and band about 7 ms (one span per pixel row).
    """

    def __init__(self):
        super().__init__()
        self.x = np.zeros(0)
        self.cum = np.zeros((0, 0))
        self.colors = np.zeros(0, dtype=np.uint32)
        self._rect = QRectF()
        self._key = None
        self._image = None
        self._pos = QPointF()

    def set_columns(self, x: np.ndarray, cum: np.ndarray, colors: list[QColor]):
        self.prepareGeometryChange()
        self.x = np.asarray(x, dtype=np.float64)
        self.cum = np.asarray(cum, dtype=np.float64)
        self.colors = np.array([QColor(c).rgba() for c in colors], dtype=np.uint32)
        self._key = None
        self._rect = columns_rect(self.x, float(self.cum[:, -1].max())) if len(self.x) and self.cum.shape[1] \
            else QRectF()
        self.update()

    def clear(self):
        self.set_columns(np.zeros(0), np.zeros((0, 0)), [])

    @survives(QRectF)
    def boundingRect(self):
        return self._rect

    def _render(self, tr, dpr: float, clip_top: float, clip_bottom: float):
        w, nb = len(self.x), self.cum.shape[1]
        # device rows of each band's top (values grow upwards, rows downwards)
        rows = (self.cum * tr.m22() + tr.m32()) * dpr
        zero = (tr.m32()) * dpr
        top = int(np.floor(max(clip_top * dpr, min(float(rows.min()), zero))))
        bottom = int(np.ceil(min(clip_bottom * dpr, max(float(rows.max()), zero))))
        h = bottom - top
        if h <= 0 or w == 0:
            return None, None
        edges = np.empty((w, nb + 2))
        edges[:, 0] = top
        edges[:, 1:nb + 1] = rows[:, ::-1]           # top band first
        edges[:, nb + 1] = zero
        edges = np.clip(np.rint(edges), top, bottom).astype(np.int64)
        edges = np.maximum.accumulate(edges, axis=1)  # rounding must not reverse the order
        lengths = np.empty((w, nb + 2), dtype=np.int64)
        lengths[:, :-1] = np.diff(edges, axis=1)
        lengths[:, -1] = bottom - edges[:, -1]
        palette = np.concatenate([[0], self.colors[::-1], [0]]).astype(np.uint32)
        pixels = np.repeat(np.tile(palette, w), lengths.ravel())
        image_data = np.ascontiguousarray(pixels.reshape(w, h).T)
        img = QImage(image_data.data, w, h, 4 * w, QImage.Format.Format_ARGB32).copy()
        img.setDevicePixelRatio(dpr)
        x_left = (float(self.x[0]) * tr.m11() + tr.m31()) - 0.5 / dpr
        return img, QPointF(x_left, top / dpr)

    @survives()
    def paint(self, p: QPainter, *args):
        if not len(self.x) or not self.cum.shape[1]:
            return
        tr, dpr, clip, key = device_view(self, p)
        if key != self._key:
            self._image, self._pos = self._render(tr, dpr, clip.top(), clip.bottom())
            self._key = key
        if self._image is not None:
            p.save()
            p.resetTransform()
            p.drawImage(self._pos, self._image)
            p.restore()


class StackImage(pg.GraphicsObject):
    """Every allocation (or segment) as its own band, one pixel column per view column:
    viewer/model/alloc_stack.py makes the pixels of each distinct moment (bottom-up rows), this
    item repeats them across the columns that show the same moment and draws them rotated
    a quarter turn (the pixels come out column by column; Qt's rotation path is cheaper
    than transposing them with numpy)."""

    def __init__(self):
        super().__init__()
        self.stack = None
        self.cols = None
        self.x = np.zeros(0)
        self.column_of = np.zeros(0, dtype=np.int64)
        self.palette = np.zeros((0, 0), dtype=np.uint32)
        self._rect = QRectF()
        self._key = None
        self._image = None
        self._at = None

    def set_stack(self, x: np.ndarray, stack, cols, column_of: np.ndarray, palette: np.ndarray, top: float):
        self.prepareGeometryChange()
        self.x = np.asarray(x, dtype=np.float64)
        self.stack, self.cols = stack, cols
        self.column_of = np.asarray(column_of, dtype=np.int64)
        self.palette = palette
        self._key = None
        self._rect = columns_rect(self.x, top) if len(self.x) and cols is not None else QRectF()
        self.update()

    def clear(self):
        self.set_stack(np.zeros(0), None, None, np.zeros(0, dtype=np.int64), self.palette, 0.0)

    @survives(QRectF)
    def boundingRect(self):
        return self._rect

    @survives()
    def paint(self, p: QPainter, *args):
        if self.cols is None or not len(self.x):
            return
        tr, dpr, clip, key = device_view(self, p)
        if key != self._key:
            self._key = key
            self._image = None
            top = int(np.floor(clip.top() * dpr))
            bottom = int(np.ceil(clip.bottom() * dpr))
            rows = bottom - top
            if rows > 0 and tr.m22() != 0:
                # data y at the bottom device row's lower edge, and bytes per device row
                y_bottom = (bottom / dpr - tr.m32()) / tr.m22()
                per_row = -1.0 / (tr.m22() * dpr)
                pixels = self.stack.raster(self.cols, self.palette, y_bottom, per_row, rows)
                if len(self.column_of) != len(pixels) or not np.array_equal(self.column_of,
                                                                            np.arange(len(pixels))):
                    pixels = pixels[self.column_of]
                pixels = np.ascontiguousarray(pixels)
                w, h = pixels.shape[1], pixels.shape[0]        # image: a row per view column
                img = QImage(pixels.data, w, h, 4 * w, QImage.Format.Format_ARGB32).copy()
                img.setDevicePixelRatio(dpr)
                x_left = (float(self.x[0]) * tr.m11() + tr.m31()) - 0.5 / dpr
                self._image = img
                self._at = (x_left, bottom / dpr)
        if self._image is not None:
            x_left, y_bottom = self._at
            p.save()
            # image x (rows up from the bottom) -> screen up; image y (view column) -> screen right
            p.setTransform(QTransform(0.0, -1.0, 1.0, 0.0, x_left, y_bottom))
            p.drawImage(QPointF(0, 0), self._image)
            p.restore()


def column_strokes(x: np.ndarray, cum: np.ndarray, colors: list[QColor]):
    """Strokes for stacked bands: per band, one vertical segment per column from the
    band below's top to its own top (empty segments dropped: they would paint a dot)."""
    out = []
    lower = np.zeros(len(x))
    for j in range(cum.shape[1]):
        upper = cum[:, j]
        keep = upper > lower
        if keep.any():
            out.append((np.repeat(x[keep], 2), np.column_stack([lower[keep], upper[keep]]).ravel(), "pairs",
                        cosmetic_pen(colors[j])))
        lower = upper
    return out


def cosmetic_pen(color, style=Qt.PenStyle.SolidLine) -> QPen:
    pen = QPen(QColor(color))
    pen.setWidth(1)
    pen.setCosmetic(True)
    pen.setStyle(style)
    pen.setCapStyle(Qt.PenCapStyle.FlatCap)
    return pen


def label_rect(label: pg.TextItem, tr: QTransform) -> QRectF:
    """Where a text label (a pyqtgraph TextItem beside the item being painted, in the same
    view) lies in device pixels, for an item painting with transform `tr`: its text box is
    in pixels already (it ignores the view's scaling), placed at its anchor."""
    return label.boundingRect().translated(tr.map(label.pos()))


def free_of(rect: QRectF, blocked: list[QRectF]) -> bool:
    return not any(rect.intersects(b) for b in blocked)


class _ViewSpanning(pg.GraphicsObject):
    """An item that covers whatever the view shows and repaints when the view moves."""

    def viewRangeChanged(self):
        self.prepareGeometryChange()
        self.update()

    @survives(QRectF)
    def boundingRect(self):
        vr = self.viewRect()
        return QRectF() if vr is None else vr


class VLinesItem(_ViewSpanning):
    """Vertical lines over the full height at many x (hundreds of OOMs: one InfiniteLine and
    label each took 0.8 s to make and more to draw), at most one a device pixel column."""

    def __init__(self):
        super().__init__()
        self.xs = np.zeros(0)
        self.pen = QPen()
        self.setZValue(9)

    def set_lines(self, xs, pen: QPen) -> None:
        self.prepareGeometryChange()
        self.xs = np.sort(np.asarray(xs, dtype=float))
        self.pen = QPen(pen)
        self.pen.setCosmetic(True)
        self.update()

    @survives()
    def paint(self, p: QPainter, *args):
        vr = self.viewRect()
        if vr is None or vr.width() <= 0 or not len(self.xs):
            return
        lo, hi = np.searchsorted(self.xs, [vr.left(), vr.right()])
        if hi <= lo:
            return
        tr = p.transform()
        dev = tr.mapRect(vr)
        px = np.unique(np.round(self.xs[lo:hi] * tr.m11() + tr.m31()))
        p.save()
        p.resetTransform()
        p.setPen(self.pen)
        top, bottom = dev.top(), dev.bottom()
        for x in px.tolist():
            p.drawLine(QPointF(x, top), QPointF(x, bottom))
        p.restore()


class SpansItem(_ViewSpanning):
    """Shaded x spans over the full height (phases, annotations) and boundary lines.

    Only what is inside the view is painted (binary search on the starts). With
    more visible spans than a few hundred (thousands of iterations, zoomed out),
    each pixel column takes the colour of the span under its centre and is drawn
    as one line per colour, so the cost stays that of the plot's width.
    """

    MANY = 200
    MIN_SPAN_PX = 4           # spans narrower than this (median) are not shaded
    MIN_LINE_GAP_PX = 6       # nor lines closer than this
    MIN_LABEL_SPAN_PX = 10    # a span narrower than this gets no name
    LABEL_ROWS = 2

    def __init__(self):
        super().__init__()
        self.starts = np.zeros(0)
        self.ends = np.zeros(0)
        self.colors: list[QColor] = []
        self.color_of = np.zeros(0, dtype=np.int64)
        self.labels: list[str] = []
        self.lines = np.zeros(0)
        self.line_pen = QPen()
        self.text_color = QColor("#666666")
        self.avoid = np.zeros(0)                 # x of marker lines whose labels sit at the top
        self.obstacles: list[pg.TextItem] = []   # labels (the peak's) the span labels keep clear of
        self.placed: list[tuple[QRectF, str]] = []   # the labels drawn in the last paint (device)
        self.placed_in: list[tuple[float, float]] = []
        self.setZValue(-100)

    def set_spans(self, starts, ends, colors, lines, line_pen: QPen, labels=None, text_color=None):
        self.prepareGeometryChange()
        order = np.argsort(starts, kind="stable") if len(starts) else np.zeros(0, dtype=int)
        self.starts = np.asarray(starts, dtype=float)[order]
        self.ends = np.asarray(ends, dtype=float)[order]
        palette: dict[int, int] = {}
        seen: dict[int, int] = {}        # by the colour object: thousands of spans, a few shades
        idx = []
        for c in colors:
            k = seen.get(id(c))
            if k is None:
                k = seen[id(c)] = palette.setdefault(QColor(c).rgba(), len(palette))
            idx.append(k)
        self.colors = [QColor.fromRgba(rgba) for rgba in palette]
        self.color_of = np.asarray(idx, dtype=np.int64)[order] if len(idx) else np.zeros(0, dtype=np.int64)
        labels = labels or [""] * len(order)
        self.labels = [labels[i] for i in order]
        self.lines = np.sort(np.asarray(lines, dtype=float))
        self.line_pen = QPen(line_pen)
        self.line_pen.setCosmetic(True)
        if text_color is not None:
            self.text_color = QColor(text_color)
        self.update()

    @survives()
    def paint(self, p: QPainter, *args):
        vr = self.viewRect()
        if vr is None or vr.width() <= 0:
            return
        x0, x1 = vr.left(), vr.right()
        tr = p.transform()
        sx, ox = tr.m11(), tr.m31()
        dev = tr.mapRect(vr)
        top, bottom = dev.top(), dev.bottom()
        p.save()
        p.resetTransform()
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        p.setPen(Qt.PenStyle.NoPen)
        shown = np.zeros(0, dtype=np.int64)
        if len(self.starts):
            hi = int(np.searchsorted(self.starts, x1, side="right"))
            shown = np.flatnonzero(self.ends[:hi] >= x0)
        # spans a few pixels wide, side by side, only hatch the plot: leave them out
        dense = len(shown) > 1 and float(np.median(self.ends[shown] - self.starts[shown])) * sx < self.MIN_SPAN_PX
        if dense:
            shown = shown[:0]
        if 0 < len(shown) <= self.MANY:
            for k in shown:
                a, b = self.starts[k] * sx + ox, self.ends[k] * sx + ox
                p.fillRect(QRectF(a, top, max(b - a, 1.0), bottom - top), self.colors[self.color_of[k]])
        elif len(shown):
            cols = np.arange(int(dev.left()), int(np.ceil(dev.right()))) + 0.5
            xd = (cols - ox) / sx
            span = np.searchsorted(self.starts, xd, side="right") - 1
            ok = span >= 0
            ok[ok] = self.ends[span[ok]] >= xd[ok]
            for c, color in enumerate(self.colors):
                sel = cols[ok][self.color_of[span[ok]] == c]
                if len(sel):
                    pen = QPen(color, 1)
                    pen.setCosmetic(True)
                    p.setPen(pen)
                    ys = np.empty(2 * len(sel))
                    ys[0::2], ys[1::2] = top, bottom
                    p.drawPath(pg.arrayToQPath(np.repeat(sel, 2), ys, connect="pairs"))
        if len(self.lines):
            lo = int(np.searchsorted(self.lines, x0))
            hi = int(np.searchsorted(self.lines, x1, side="right"))
            # boundary lines closer than a few pixels are a texture, not information
            if hi > lo and (hi - lo) * self.MIN_LINE_GAP_PX <= (dev.right() - dev.left()):
                xs = np.round(self.lines[lo:hi] * sx + ox) + 0.5
                ys = np.empty(2 * len(xs))
                ys[0::2], ys[1::2] = top, bottom
                p.setPen(self.line_pen)
                p.drawPath(pg.arrayToQPath(np.repeat(xs, 2), ys, connect="pairs"))
        self.placed = []
        self.placed_in = []                 # each placed label's span, in device x (a, b)
        if 0 < len(shown) <= self.MANY and any(self.labels):
            p.setPen(self.text_color)
            fm = p.fontMetrics()
            # the peak's words are worth more than a phase's name (the shade and the legend tell
            # that): a span label moves right past them, or is left out
            blocked = [label_rect(o, tr).adjusted(-3, -1, 3, 1) for o in self.obstacles if o.isVisible()]
            # a name stays inside its own span (it sat over the neighbouring phase and across
            # the iteration line): cut with an ellipsis where the span is narrower ('optim…'),
            # left out where even that does not fit (the shade and the legend tell the phase);
            # two rows, so overlapping spans (micro-batches) never print over each other
            taken = [-1e300] * self.LABEL_ROWS     # right end of the last label in each row
            right_edge = dev.right() - 2
            for k in shown:
                text = self.labels[k]
                if not text:
                    continue
                a = max(self.starts[k], x0) * sx + ox
                b = min(self.ends[k], x1) * sx + ox
                if b - a < self.MIN_LABEL_SPAN_PX:
                    continue
                tw = fm.horizontalAdvance(text)
                if a + 4 + tw + 4 >= b:
                    text = fm.elidedText(text, Qt.TextElideMode.ElideRight, int(b - a - 9))
                    if len(text) < 3:               # ('f…' says nothing)
                        continue
                    tw = fm.horizontalAdvance(text)
                near = self.avoid * sx + ox
                if len(near) and bool(np.any((near > a - 40) & (near < a + tw + 44))):
                    continue                # a marker's label (OOM, leak) sits there
                for row in range(self.LABEL_ROWS):
                    if a + 4 <= taken[row]:
                        continue
                    y = top + 3 + row * (fm.height() + 1)
                    box = QRectF(a + 4, y, tw, fm.height())
                    for _ in range(len(blocked)):
                        hit = [r for r in blocked if box.intersects(r)]
                        if not hit:
                            break
                        box.moveLeft(max(r.right() for r in hit) + 4)
                    # within its span (moved right past an obstacle, still inside it)
                    own = box.right() + 4 < b
                    if own and box.right() <= right_edge and free_of(box, blocked):
                        p.drawText(QPointF(box.left(), y + fm.ascent()), text)
                        self.placed.append((box, text))
                        self.placed_in.append((a, b))
                        taken[row] = box.right() + 6
                        break
        p.restore()


@dataclass
class NoteMark:
    """One annotation placed on the timeline (data x)."""
    id: str
    kind: str                  # range | peak | allocation
    x0: float
    x1: float
    label: str
    tip: str


class NotesItem(_ViewSpanning):
    """The user's notes: ranges as translucent shaded regions with their edges, peaks and
    allocations as dashed vertical markers, each with a numbered label near the x axis.

    One item painted in device pixels, not a pyqtgraph item per note: a handful of
    rectangles and lines per frame. Labels are laid out at paint time, left to right in
    up to `ROWS` rows, so they never overlap at any zoom; a label that finds no room is
    left out (its marker stays, and so does its tooltip). The rectangles painted last
    (`hits`, in the view's pixels) answer `tooltip_at`.
    """

    ROWS = 3
    LABEL_WIDTH = 220

    def __init__(self):
        super().__init__()
        self.marks: list[NoteMark] = []
        self.current: str | None = None
        self.hits: list[tuple[QRectF, str]] = []
        self.placed: list[str] = []            # ids whose label was drawn in the last paint
        self.obstacles: list[pg.TextItem] = []  # labels (the peaks') the chips keep clear of
        self.chips: dict[str, QRectF] = {}      # where each drawn label went (device pixels)
        self.set_colors(QColor(NOTE_COLOR), QColor("#FFFFFF"), QColor("#202020"))
        self.setZValue(12)

    def set_colors(self, color: QColor, background: QColor, foreground: QColor):
        self.color = QColor(color)
        self.fill = QColor(color)
        self.fill.setAlpha(26 if background.lightness() >= 128 else 20)
        self.chip_bg = QColor(background)
        self.chip_bg.setAlpha(235)
        self.text_color = QColor(color).darker(135) if background.lightness() >= 128 else QColor(color).lighter(160)
        self.update()

    def set_marks(self, marks: list[NoteMark]):
        self.marks = list(marks)
        self.hits = []
        self.update()

    def set_current(self, ann_id: str | None):
        self.current = ann_id
        self.update()

    def tooltip_at(self, x: float, y: float) -> str:
        """The note under a viewport pixel (labels first, then markers and range edges)."""
        tips = {m.id: m.tip for m in self.marks}
        for rect, ann_id in reversed(self.hits):
            if rect.contains(QPointF(x, y)):
                return tips.get(ann_id, "")
        return ""

    @survives()
    def paint(self, p: QPainter, *args):
        self.hits = []
        self.placed = []
        self.chips = {}
        vr = self.viewRect()
        if vr is None or vr.width() <= 0 or not self.marks:
            return
        x0, x1 = vr.left(), vr.right()
        tr = p.transform()
        sx, ox = tr.m11(), tr.m31()
        dev = tr.mapRect(vr)
        top, bottom, left, right = dev.top(), dev.bottom(), dev.left(), dev.right()
        shown = [m for m in self.marks if m.x1 >= x0 and m.x0 <= x1]
        if not shown:
            return
        p.save()
        p.resetTransform()
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        for m in shown:
            cur = m.id == self.current
            a = round(m.x0 * sx + ox) + 0.5
            if m.kind == "range":
                b = round(m.x1 * sx + ox) + 0.5
                ca, cb = max(a, left - 2), min(max(b, a + 1), right + 2)
                p.fillRect(QRectF(ca, top, cb - ca, bottom - top), self.fill)
                pen = QPen(self.color, 2 if cur else 1)
                p.setPen(pen)
                for e in (a, b):
                    if left - 2 <= e <= right + 2:
                        p.drawLine(QPointF(e, top), QPointF(e, bottom))
                        self.hits.append((QRectF(e - 3, top, 6, bottom - top), m.id))
            else:
                pen = QPen(self.color, 2.5 if cur else 1.5, Qt.PenStyle.DashLine)
                p.setPen(pen)
                p.drawLine(QPointF(a, top), QPointF(a, bottom))
                self.hits.append((QRectF(a - 3, top, 6, bottom - top), m.id))
        # labels: numbered chips along the bottom, packed into rows without overlaps
        font = p.font()
        if font.pointSizeF() > 0:
            font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        p.setFont(font)
        fm = p.fontMetrics()
        h = fm.height() + 2
        rows: list[list[tuple[float, float]]] = [[] for _ in range(self.ROWS)]
        blocked = [label_rect(o, tr).adjusted(-2, -1, 2, 1) for o in self.obstacles if o.isVisible()]
        # left to right, but the note the user picked gets its place first
        order = sorted(shown, key=lambda m: (m.id != self.current, m.x0))
        chips = []
        for m in order:
            text = fm.elidedText(m.label, Qt.TextElideMode.ElideRight, self.LABEL_WIDTH)
            w = fm.horizontalAdvance(text) + 8
            a = m.x0 * sx + ox
            lx = max(a, left) + 3 if m.kind == "range" else a + 4
            if lx + w > right:                       # near the right edge: left of the mark
                lx = (right if m.kind == "range" else min(a, right)) - w - 4
            lx = max(lx, left + 1)
            r = next((r for r in range(self.ROWS)
                      if all(lx >= e + 3 or lx + w + 3 <= b for b, e in rows[r])
                      and free_of(QRectF(lx, bottom - 3 - (r + 1) * (h + 2), w, h), blocked)), None)
            if r is None:
                continue
            rows[r].append((lx, lx + w))
            chips.append((QRectF(lx, bottom - 3 - (r + 1) * (h + 2), w, h), text, m))
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        for rect, text, m in chips:
            cur = m.id == self.current
            p.setPen(QPen(self.color, 1.5 if cur else 1))
            p.setBrush(self.chip_bg)
            p.drawRoundedRect(rect, 3, 3)
            p.setPen(self.text_color)
            p.drawText(rect.adjusted(4, 0, -4, 0), Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, text)
            self.hits.append((rect, m.id))
            self.placed.append(m.id)
            self.chips[m.id] = rect
        p.restore()


class GridItem(_ViewSpanning):
    """Grid lines at the axes' tick values, drawn in device pixels.

    (pyqtgraph's own grid replays every tick level's translucent lines through a
    QPicture on each paint: 10 to 25 ms a frame here, most of a frame's budget.)
    """

    def __init__(self, axis_x: pg.AxisItem, axis_y: pg.AxisItem):
        super().__init__()
        self.axes = (axis_x, axis_y)
        self.pens = (QPen(), QPen())
        self.setZValue(1)

    def set_color(self, color: QColor):
        major, minor = QColor(color), QColor(color)
        major.setAlpha(45)
        minor.setAlpha(20)
        self.pens = (QPen(major, 1), QPen(minor, 1))
        for pen in self.pens:
            pen.setCosmetic(True)
        self.update()

    @survives()
    def paint(self, p: QPainter, *args):
        vr = self.viewRect()
        if vr is None or vr.width() <= 0 or vr.height() <= 0:
            return
        tr = p.transform()
        dev = tr.mapRect(vr)
        if dev.width() < 1 or dev.height() < 1:
            return                   # a plot squeezed to nothing
        p.save()
        p.resetTransform()
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        ax, ay = self.axes
        for level, (spacing, values) in enumerate(ax.tickValues(vr.left(), vr.right(), dev.width())[:2]):
            p.setPen(self.pens[min(level, 1)])
            for v in values:
                x = round(tr.map(QPointF(v, 0)).x())
                p.drawLine(QPointF(x, dev.top()), QPointF(x, dev.bottom()))
        y0, y1 = sorted((vr.top(), vr.bottom()))
        for level, (spacing, values) in enumerate(ay.tickValues(y0, y1, dev.height())[:2]):
            p.setPen(self.pens[min(level, 1)])
            for v in values:
                y = round(tr.map(QPointF(0, v)).y())
                p.drawLine(QPointF(dev.left(), y), QPointF(dev.right(), y))
        p.restore()


class TimelineViewBox(pg.ViewBox):
    """Wheel zooms time, left-drag draws a zoom box, middle- or shift-drag pans,
    Ctrl+drag marks a time range (to annotate or export), click selects."""

    sigClicked = Signal(float, float)
    sigBoxZoom = Signal()
    sigMark = Signal(float, float, bool)       # x0, x1, finished

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.setMouseMode(pg.ViewBox.RectMode)
        self.setMouseEnabled(x=True, y=False)
        self.setMenuEnabled(False)
        self._marking = False

    def mouseDragEvent(self, ev, axis=None):
        if ev.button() == Qt.MouseButton.LeftButton and axis is None:
            if ev.isStart():
                self._marking = bool(ev.modifiers() & Qt.KeyboardModifier.ControlModifier)
            if self._marking:
                ev.accept()
                a = self.mapToView(ev.buttonDownPos()).x()
                b = self.mapToView(ev.pos()).x()
                if ev.isFinish():
                    self._marking = False
                self.sigMark.emit(min(a, b), max(a, b), ev.isFinish())
                return
        pan = ev.button() == Qt.MouseButton.MiddleButton or (
            ev.button() == Qt.MouseButton.LeftButton and ev.modifiers() & Qt.KeyboardModifier.ShiftModifier)
        if pan:
            self.state["mouseMode"] = pg.ViewBox.PanMode
            try:
                super().mouseDragEvent(ev, axis)
            finally:
                self.state["mouseMode"] = pg.ViewBox.RectMode
        elif ev.button() == Qt.MouseButton.LeftButton:
            super().mouseDragEvent(ev, axis)
        else:
            ev.ignore()

    def showAxRect(self, ax, **kw):
        ax = ax.normalized()
        self.setRange(xRange=(ax.left(), ax.right()), yRange=(max(0.0, ax.top()), ax.bottom()), padding=0)
        self.sigBoxZoom.emit()

    def mouseClickEvent(self, ev):
        if ev.button() == Qt.MouseButton.LeftButton:
            ev.accept()
            pt = self.mapSceneToView(ev.scenePos())
            self.sigClicked.emit(pt.x(), pt.y())
        else:
            ev.ignore()



def blend_over(color: QColor, background: QColor) -> QColor:
    """A translucent colour flattened onto the background (opaque fills are fast)."""
    a = color.alphaF()
    return QColor.fromRgbF(color.redF() * a + background.redF() * (1 - a),
                           color.greenF() * a + background.greenF() * (1 - a),
                           color.blueF() * a + background.blueF() * (1 - a), 1.0)
