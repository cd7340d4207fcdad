"""The timeline's stacking modes (by category, allocation, segment) and what-if scaling:
the per-allocation and per-segment bands, the scaled category bands with the exact
scaled peak, the GPU line, and the thinning of iteration-peak markers. Mixed into
TimelineWidget (viewer/timeline.py)."""
from __future__ import annotations

import numpy as np
from PySide6.QtGui import QColor

from ...common.units import fmt_bytes
from ..model.alloc_stack import SHADES
from ..model import Envelope
from ..theme import SEGMENT_COLORS

MODES = ("categories", "allocations", "segments")


class ModesMixin:
    ITER_PEAK_PX = 16             # at most one iteration-peak marker per this many pixels

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
            if self.hover_label.isVisible():
                self._do_hover()         # the box under a still pointer tells what the new mode draws
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
