"""The report's comparison PNG: two recordings of one device on one axis, drawn offscreen
with pyqtgraph (`vramscope report A --compare B` passes `render_compare` to
`services.report.write_report`, as it passes `report_png.render_timeline`).

Left: both sides' total live memory, aligned at each side's first iteration's start
(`CompareSide.origin_index` / `origin_us`), in seconds when both sides' own axis is (model/axis.py)
and in trace entries otherwise, each drawn from a per-pixel envelope (DESIGN.md §7: each
pixel column shows its highest moment, so no peak falls between pixels), each peak
marked. Right: live bytes by category at both peaks, side by side.
"""
from __future__ import annotations

import os

import numpy as np

from ..classifiers import CATEGORIES, STACK_ORDER, category_color
from ..common.atomic import atomic_write
from ..common.units import byte_unit, fmt_bytes
from ..present.markup import html
from ..present.words import COMPARE_X_TITLES, signed_bytes
from .model.axis import trace_times
from .model.compare import usable_times
from .model.lod import envelope
from .qt import QtCore, QtGui, QtWidgets, pg
from .pngfile import png_bytes
from .report_png import PNG_LIMIT, _grab

A_COLOR, B_COLOR = "#4E79A7", "#E15759"


def _times(an, dev: int) -> np.ndarray | None:
    """The trace's time stamps when they carry the device's axis (the one rule: model/axis.py)."""
    da = an.devices[dev]
    return trace_times(da) if usable_times(da) else None


def _curve(an, side, x_all: np.ndarray, px: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, live bytes) of one side's per-pixel envelope, the start state first."""
    lm = an.devices[side.device].live
    live = np.asarray(lm.live_after)
    if not len(live):
        return np.array([0.0]), np.array([float(lm.start_bytes)])
    idx, _ = envelope(x_all, live, px)
    return np.concatenate([[x_all[0]], x_all[idx]]), np.concatenate([[lm.start_bytes], live[idx]]).astype(float)


def render_compare(an_a, an_b, dc, path: str, width: int = 1200, height: int = 560) -> str:
    """Draw both sides of one device's comparison (classifiers.compare.DeviceComparison)
    into a PNG, offscreen."""
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])  # noqa: F841 (keeps Qt alive)
    sides = ((an_a, dc.a, A_COLOR, "A"), (an_b, dc.b, B_COLOR, "B"))
    times = [_times(an, s.device) for an, s, _, _ in sides]
    use_time = all(t is not None for t in times) and all(s.origin_us is not None for _, s, _, _ in sides)

    xs_all = []
    for (an, s, _, _), tus in zip(sides, times):
        n = an.devices[s.device].n_entries
        origin = max(s.origin_index, 0)
        if use_time and tus is not None and s.origin_us is not None:
            xs_all.append((tus - s.origin_us) / 1e6)
        else:
            xs_all.append(np.arange(n, dtype=np.float64) - origin)
    x_label = COMPARE_X_TITLES["seconds" if use_time else "entries"][0]

    top_bytes = max(dc.a.peak.bytes, dc.b.peak.bytes, 1)
    unit, scale = byte_unit(top_bytes)

    pw = pg.GraphicsLayoutWidget()
    pw.setBackground("w")
    pw.resize(width, height)
    title = pw.addLabel("", row=0, col=0, colspan=2)
    legend = pw.addLabel("", row=1, col=0, colspan=2)
    pi = pw.addPlot(row=2, col=0)
    bars = pw.addPlot(row=2, col=1)
    pw.ci.layout.setColumnStretchFactor(0, 3)
    pw.ci.layout.setColumnStretchFactor(1, 2)
    for p in (pi, bars):
        for side in ("left", "bottom"):
            ax = p.getAxis(side)
            ax.setPen(pg.mkPen("#444"))
            ax.setTextPen(pg.mkPen("#222"))
        p.showGrid(x=False, y=True, alpha=0.25)
        p.setMenuEnabled(False)
        p.hideButtons()
    pi.setLabel("left", f"live memory ({unit})", color="#222")
    pi.setLabel("bottom", x_label, color="#222")

    px = int(width * 0.55)
    x_lo, x_hi = np.inf, -np.inf
    for (an, s, col, name), x_all in zip(sides, xs_all):
        xs, ys = _curve(an, s, x_all, px)
        pi.plot(xs, ys / scale, pen=pg.mkPen(col, width=1.6))
        x_lo, x_hi = min(x_lo, float(xs[0])), max(x_hi, float(xs[-1]))
    if not np.isfinite(x_lo) or x_hi <= x_lo:
        x_lo, x_hi = 0.0, 1.0
    y_top = top_bytes / scale
    pi.setYRange(0, y_top * 1.2, padding=0)
    pi.setXRange(x_lo, x_hi, padding=0.01)
    for k, ((an, s, col, name), x_all) in enumerate(zip(sides, xs_all)):
        i = s.peak.index
        xv = float(x_all[i]) if 0 <= i < len(x_all) else (float(x_all[0]) if len(x_all) else 0.0)
        pi.addItem(pg.InfiniteLine(xv, angle=90, pen=pg.mkPen(col, width=1.2, style=QtCore.Qt.PenStyle.DashLine)))
        anchor = (1, 0.5) if xv > x_lo + 0.66 * (x_hi - x_lo) else (0, 0.5)
        t = pg.TextItem(f"{name} peak {fmt_bytes(s.peak.bytes)}", color=col, anchor=anchor,
                        fill=pg.mkBrush(255, 255, 255, 210))
        t.setPos(xv, y_top * (1.14 - 0.07 * k))
        pi.addItem(t)

    # the categories live at either peak, in the timeline's stacking order
    cats = [c for c in STACK_ORDER if c in dc.by_category_delta] + \
        [c for c in CATEGORIES if c in dc.by_category_delta and c not in STACK_ORDER]
    ca, cb = dc.a.peak.by_category, dc.b.peak.by_category
    if cats:
        pos = np.arange(len(cats), dtype=float)
        a_h = np.array([ca.get(c, 0) for c in cats], dtype=float) / scale
        b_h = np.array([cb.get(c, 0) for c in cats], dtype=float) / scale
        fill_a = [QtGui.QColor(category_color(c)) for c in cats]
        for q in fill_a:
            q.setAlpha(110)
        bars.addItem(pg.BarGraphItem(x=pos - 0.2, height=a_h, width=0.38, brushes=[pg.mkBrush(q) for q in fill_a],
                                     pen=pg.mkPen(A_COLOR, width=1.5)))
        bars.addItem(pg.BarGraphItem(x=pos + 0.2, height=b_h, width=0.38,
                                     brushes=[pg.mkBrush(QtGui.QColor(category_color(c))) for c in cats],
                                     pen=pg.mkPen(B_COLOR, width=1.5)))
        bars.getAxis("bottom").setTicks([[(float(k), c) for k, c in enumerate(cats)]])
        bars.setXRange(-0.6, len(cats) - 0.4, padding=0)
        bars.setYRange(0, max(float(a_h.max()), float(b_h.max()), 1e-9) * 1.2, padding=0)
        for k, c in enumerate(cats):
            d = dc.by_category_delta[c]
            if d:
                t = pg.TextItem(signed_bytes(d), color="#222", anchor=(0.5, 1.0))
                t.setPos(float(k), max(a_h[k], b_h[k]) * 1.02)
                bars.addItem(t)
    bars.setLabel("left", f"live at each peak ({unit})", color="#222")

    a_name, b_name = os.path.basename(an_a.snapshot.path), os.path.basename(an_b.snapshot.path)
    pct = f" ({dc.peak_delta / dc.a.peak.bytes:+.1%})" if dc.a.peak.bytes else ""
    title.setText(f"device {dc.device}: peak {fmt_bytes(dc.a.peak.bytes)} &rarr; {fmt_bytes(dc.b.peak.bytes)}, "
                  f"{html(signed_bytes(dc.peak_delta))}{pct}", color="#222", size="11pt")
    legend.setText(f"<span style='color:{A_COLOR}'>&#9632;</span>&nbsp;A&nbsp;{html(a_name)} &nbsp; "
                   f"<span style='color:{B_COLOR}'>&#9632;</span>&nbsp;B&nbsp;{html(b_name)} &nbsp; "
                   f"<span style='color:#777'>(bars: left A, right B)</span>", color="#222", size="9pt")

    img = _grab(pw, app)
    pw.close()
    pw.deleteLater()
    data = png_bytes(img)
    if len(data) > PNG_LIMIT:
        data = png_bytes(img.convertToFormat(QtGui.QImage.Format.Format_Indexed8,
                                             QtCore.Qt.ImageConversionFlag.ThresholdDither), 9)
    atomic_write(path, data)
    return path


__all__ = ["render_compare"]
