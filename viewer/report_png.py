"""The report's timeline PNG: live memory of one device stacked by category, drawn with
pyqtgraph offscreen (Qt lives only in the viewer package; `vramscope report` and the
viewer's Export Report both pass `render_timeline` to `services.report.write_report`).

It is drawn from a per-pixel envelope (DESIGN.md §7: each pixel column shows the moment
of highest live memory inside it, so a peak can never fall between two pixels), with the
peak, the OOMs and the user's annotations marked, in the viewer's colours and stacking
order (classifiers/categories.py).
"""
from __future__ import annotations

import os

import numpy as np

from ..classifiers import CATEGORIES, STACK_ORDER, category_color
from ..classifiers.category_live import CategoryLive
from ..common.atomic import atomic_write
from ..common.units import fmt_bytes
from ..present.markup import cut_words, html, one_line
from ..present.timeaxis import axis_reason_short
from ..present.words import peak_words
from .model.axis import trace_times, x_values
from .model.lod import envelope
from .pngfile import png_bytes
from .qt import QtCore, QtGui, QtWidgets, pg
from .timeline.items import TimeAxis

PEAK_COLOR, OOM_COLOR, ANNOTATION_COLOR = "#D62728", "#D62728", "#4E79A7"
PNG_LIMIT = 300_000
NOTE_CHARS = 48          # a note's label on the picture: cut at a word, with an ellipsis


def timeline_axis(da) -> tuple[np.ndarray, bool, str]:
    """Every entry's x, whether it is seconds, and the axis' title: the viewer's axis, by
    the one rule (classifiers/timeaxis.py through model/axis.py): seconds, or entries when
    seconds would squeeze the run (a slow first step crushed the OOM against the edge)."""
    x_all, ax = x_values(da)
    has_time = ax.seconds and len(x_all) > 1
    label = "time since the first entry" if has_time else \
        "trace entry" + (f" ({axis_reason_short(ax)})" if ax.has_times else "")
    return x_all, has_time, label


def render_timeline(an, dev: int, path: str, annotations=(), width: int = 1200, height: int = 520) -> str:
    """Draw the live memory of one device stacked by category into a PNG, offscreen (no
    window is ever mapped: Export Report from the viewer must not flash one)."""
    app = QtWidgets.QApplication.instance()
    if app is None:
        # our own process (`vramscope report` on a box without a display): draw offscreen;
        # the viewer's Export Report reuses its application
        # (an offscreen platform asked for already, with its options, e.g. a screen, stays)
        if not os.environ.get("QT_QPA_PLATFORM", "").startswith("offscreen"):
            os.environ["QT_QPA_PLATFORM"] = "offscreen"
        app = QtWidgets.QApplication([])
    cats = CATEGORIES
    snap = an.snapshot
    da = an.devices[dev]
    lm = da.live
    n = lm.n_events
    x_all, has_time, x_label = timeline_axis(da)
    tus = trace_times(da)

    peak = max(lm.peak_bytes, 1)
    unit, scale = next(((u, s) for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
                        if peak >= s), ("B", 1))

    plot_px = width - 110
    idx, bmin = envelope(x_all, np.asarray(lm.live_after), plot_px)
    # the start state, then each pixel's highest moment
    xs = np.concatenate([[x_all[0] if n else 0.0], x_all[idx]]) if n else np.array([0.0, 1.0])
    idx_all = np.concatenate([[-1], idx]) if n else np.array([-1, -1])
    per_cat = da.live_by_category(idx_all).astype(np.float64) / scale      # (P, K)
    total = per_cat.sum(axis=1)

    pw = pg.GraphicsLayoutWidget()
    pw.setBackground("w")
    pw.resize(width, height)
    title = pw.addLabel("", row=0, col=0)
    legend_label = pw.addLabel("", row=1, col=0)
    bottom = TimeAxis("bottom")         # the viewer's ticks: 1.5 s, 250 ms, 12,000 (never "(x0.001)")
    bottom.has_time = has_time
    bottom.enableAutoSIPrefix(False)
    pi = pw.addPlot(row=2, col=0, axisItems={"bottom": bottom})
    title_peak = f"peak {fmt_bytes(lm.peak_bytes)}"
    if da.peak is not None and da.peak.type != "other":
        title_peak += f" {peak_words(da.peak.type)}"
    for side in ("left", "bottom"):
        ax = pi.getAxis(side)
        ax.setPen(pg.mkPen("#444"))
        ax.setTextPen(pg.mkPen("#222"))
    pi.setLabel("left", f"live memory ({unit})", color="#222")
    pi.setLabel("bottom", x_label, color="#222")
    pi.showGrid(x=False, y=True, alpha=0.25)
    pi.setMenuEnabled(False)
    pi.hideButtons()

    # The legend rides in the title (coloured squares): a legend box inside the plot would
    # cover the curve or the annotation labels.
    order = [cats.index(c) for c in STACK_ORDER if c in cats] + [k for k, c in enumerate(cats) if c not in STACK_ORDER]
    present = [k for k in order if per_cat[:, k].max() > 0]
    keys = []
    most = CategoryLive.build(da).max_bytes          # each category's highest, the analysis' (not the pixels')
    base = np.zeros(len(xs))
    # the baseline needs a (transparent) pen too: with pen=None pyqtgraph builds no curve
    # path and FillBetweenItem draws nothing for the lowest category
    prev = pg.PlotDataItem(xs, base, pen=pg.mkPen(QtGui.QColor(0, 0, 0, 0)))
    pi.addItem(prev)
    for k in present:
        top = base + per_cat[:, k]
        col = QtGui.QColor(category_color(cats[k]))
        # an invisible edge (FillBetweenItem needs a curve path; a visible 1 px edge makes
        # tiny categories look like noise on top of big ones)
        cur = pg.PlotDataItem(xs, top, pen=pg.mkPen(QtGui.QColor(0, 0, 0, 0)))
        pi.addItem(cur)
        fill = pg.FillBetweenItem(prev, cur, brush=pg.mkBrush(col))
        pi.addItem(fill)
        keys.append(f"<span style='color:{col.name()}'>&#9632;</span>&nbsp;{cats[k]}&nbsp;"
                    f"{fmt_bytes(most.get(cats[k], 0)).replace(' ', '&nbsp;')}")
        prev, base = cur, top
    legend_rows = [" &nbsp; ".join(keys[i:i + 5]) for i in range(0, len(keys), 5)]
    title.setText(f"{html(os.path.basename(snap.path))}, device {dev}: live memory by category, {title_peak}",
                  color="#222", size="11pt")
    legend_label.setText(f"{'<br>'.join(legend_rows)} &nbsp;<span style='color:#777'>(max of each)</span>",
                         color="#222", size="9pt")
    pi.plot(xs, total, pen=pg.mkPen("#222", width=1.2))
    if n and len(bmin):
        # the low side of each pixel's envelope: bursts shorter than a pixel show as the gap
        low = np.concatenate([[lm.start_bytes], bmin]) / scale
        pi.plot(xs, low, pen=pg.mkPen("#555", width=1, style=QtCore.Qt.PenStyle.DotLine))

    y_top = float(total.max()) if len(total) else 1.0
    # room above the curve for the legend and labels
    pi.setYRange(0, max(y_top, 1e-9) * 1.25, padding=0)
    x_lo, x_hi = (float(xs[0]), float(xs[-1])) if len(xs) else (0.0, 1.0)
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    pi.setXRange(x_lo, x_hi, padding=0.01)

    def x_of(i):
        if i is None or i < 0 or not n:
            return x_lo
        return float(x_all[min(int(i), n - 1)])

    label_y = [y_top * 1.21, y_top * 1.145, y_top * 1.08]
    slot = [0]

    def label(x, text, color):
        # right of the mark, or left of it in the right third so it is not cut at the edge
        anchor = (1, 0.5) if x > x_lo + 0.66 * (x_hi - x_lo) else (0, 0.5)
        t = pg.TextItem(text, color=color, anchor=anchor, fill=pg.mkBrush(255, 255, 255, 200))
        t.setPos(x, label_y[slot[0] % len(label_y)])
        slot[0] += 1
        pi.addItem(t)

    # annotations: shaded ranges / dashed lines, numbered like the Markdown table
    for k, d in enumerate(list(annotations)[:12], 1):
        if d.device not in (None, dev):
            continue
        text = f"[{k}] {cut_words(one_line(d.note or d.kind), NOTE_CHARS)}"
        col = QtGui.QColor(ANNOTATION_COLOR)
        if d.kind == "range":
            if d.start_index is not None and d.end_index is not None:
                r0, r1 = x_of(d.start_index), x_of(d.end_index)
            elif d.start_us is not None and d.end_us is not None and has_time and tus is not None:
                r0, r1 = (d.start_us - tus[0]) / 1e6, (d.end_us - tus[0]) / 1e6
            else:
                continue
            fillc = QtGui.QColor(col)
            fillc.setAlpha(45)
            reg = pg.LinearRegionItem((r0, r1), movable=False, brush=pg.mkBrush(fillc),
                                      pen=pg.mkPen(col, width=1))
            reg.setZValue(-10)
            pi.addItem(reg)
            label(r0, text, col)
        else:
            i = d.index if d.kind == "peak" else d.alloc_index
            xv = x_of(i if i is not None else lm.peak_index)
            pi.addItem(pg.InfiniteLine(xv, angle=90, pen=pg.mkPen(col, width=1.5,
                                                                  style=QtCore.Qt.PenStyle.DashLine)))
            label(xv, text, col)

    # the peak and the OOMs
    px = x_of(lm.peak_index)
    pi.addItem(pg.InfiniteLine(px, angle=90, pen=pg.mkPen(PEAK_COLOR, width=1.5)))
    pk_label = pg.TextItem(f"peak {fmt_bytes(lm.peak_bytes)}", color=PEAK_COLOR, anchor=(1.0, 1.0),
                           fill=pg.mkBrush(255, 255, 255, 200))
    pk_label.setPos(px, y_top * 1.03)
    pi.addItem(pk_label)
    for oom in da.ooms[:10]:
        ox = x_of(oom.index)
        pi.addItem(pg.InfiniteLine(ox, angle=90, pen=pg.mkPen(OOM_COLOR, width=2,
                                                              style=QtCore.Qt.PenStyle.DashLine)))
        t = pg.TextItem(f"OOM: {fmt_bytes(oom.requested)} requested", color=OOM_COLOR,
                        anchor=(1.0, 0.0), fill=pg.mkBrush(255, 255, 255, 220))
        t.setPos(ox, y_top * 0.96)
        pi.addItem(t)

    img = _grab(pw, app)
    pw.close()
    pw.deleteLater()
    data = png_bytes(img)
    if len(data) > PNG_LIMIT:      # never expected at this size; keep the promise anyway
        data = png_bytes(img.convertToFormat(QtGui.QImage.Format.Format_Indexed8,
                                             QtCore.Qt.ImageConversionFlag.ThresholdDither), 9)
    atomic_write(path, data)
    return path


def _grab(pw, app):
    """Render the widget into an image of its own size at 1 device pixel per pixel: never
    mapped on a real screen (Export Report from the viewer must not flash a window) and
    the same PNG on a HiDPI display as offscreen."""
    pw.setAttribute(QtCore.Qt.WidgetAttribute.WA_DontShowOnScreen, True)
    pw.show()
    # lay the plot out (its pending layout requests, nothing else): never the whole event
    # loop, which Export Report runs this from (a slot on the GUI thread) and where a
    # progress report or a deferred delete must not run in the middle of it (issue 33)
    for _ in range(4):
        QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.LayoutRequest)
        pw.ci.layout.activate()
    img = QtGui.QImage(pw.size(), QtGui.QImage.Format.Format_RGB32)
    img.setDevicePixelRatio(1.0)
    img.fill(QtGui.QColor("white"))
    painter = QtGui.QPainter(img)
    try:
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing, True)
        pw.render(painter)
    finally:
        painter.end()
    pw.hide()
    return img
