"""How the timeline stacks live memory: by category, by allocation or by segment, and the
what-if overlay (the bands scaled as a What-if slider moves, with the exact scaled peak
`classifiers.whatif.what_if` found). One object the timeline owns (`TimelineWidget.stacking`).

The what-if numbers are never worked out here: the factors per category and the peak (its
moment, its bytes, what each category holds there) are the `WhatIf` result's. What this
adds is drawing: each column's measured composition times the factors, rounded as the
analysis rounds (`category_live.scale_live`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtGui import QColor

from ...classifiers.category_live import scale_live
from ...classifiers.categories import CATEGORIES
from ...classifiers.whatif import WhatIf
from ...common.units import fmt_bytes
from ..model import Envelope
from ..model.alloc_stack import SHADES, Columns
from ..theme import SEGMENT_COLORS

if TYPE_CHECKING:
    from .widget import TimelineWidget

MODES = ("categories", "allocations", "segments")


class Stacking:
    """The stacking mode, the stacks drawn in it (`cols`, `col_u`), and the what-if overlay."""

    def __init__(self, timeline: TimelineWidget):
        self.tl = timeline
        self.mode = "categories"
        self.cols: Columns | None = None                # the stacks drawn (allocation / segment modes)
        self.col_u = np.zeros(0, dtype=np.int64)        # view column -> position in cols.moments
        self.whatif: WhatIf | None = None
        self.scales: np.ndarray | None = None           # per DeviceData category: the what-if's factors

    @property
    def data(self):
        return self.tl.data

    def reset(self) -> bool:
        """A new device: as measured, no stacks drawn; True when its mode had to change
        (no segment view for a file without allocator segments)."""
        self.cols = None
        self.whatif = None
        self.scales = None
        if self.mode == "segments" and self.data is not None and not self.data.segments.known:
            self.mode = "categories"
            return True
        return False

    def set_mode(self, mode: str) -> bool:
        """Stack by 'categories', 'allocations' or 'segments' (False: not for this file)."""
        if mode not in MODES:
            raise ValueError(mode)
        if mode == "segments" and (self.data is None or not self.data.segments.known):
            return False
        if mode != self.mode:
            self.mode = mode
            self.tl.refresh_now()
            self.tl.pointer.select_row(self.tl.pointer.selected_row)
            self.tl.pointer.refresh_hover()
            self.tl.modeChanged.emit(mode)
        return True

    # -- by allocation, by segment -----------------------------------------------------------------
    def palette(self) -> np.ndarray:
        """uint32 [keys, SHADES]: neighbouring bands of one colour alternate shades."""
        d = self.data
        if self.mode == "segments":
            names = SEGMENT_COLORS
            base = [QColor(names[k % len(names)]) for k in range(max(1, int(d.segments.key.max()) + 1 if len(d.segments.key)
                                                                       else 1))]
        else:
            # the categories, then the same paler: the rows whose category is a guess
            # (DeviceData.stack_keys), as the category view draws their bytes
            theme = self.tl.theme
            base = [theme.band_color(name) for name in d.categories]
            base += [theme.guess_color(c) for c in base]
        shades = []
        for c in base:
            row = [c, c.lighter(112), c.darker(108), c.lighter(124)][:SHADES]
            shades.append([q.rgba() for q in row])
        return np.array(shades, dtype=np.uint32)

    def draw_stack(self, env: Envelope):
        """Allocation or segment bands at the moments the columns show (each distinct
        moment's stack computed once)."""
        d, tl = self.data, self.tl
        if self.mode == "segments":
            stack, keep = d.segments.stack(), None
        else:
            stack = d.alloc_stack()
            keep = d.stack_keep(tl.visible_categories)          # (their guessed rows too)
        moments, col_u = np.unique(env.col_index, return_inverse=True)
        cols = stack.columns(moments, keep)
        self.cols, self.col_u = cols, col_u.astype(np.int64)
        top = float(cols.top.max()) if len(cols.top) else 0.0
        tl.stack_bands.set_stack(env.col_x, stack, cols, self.col_u, self.palette(), top)

    # -- what if -------------------------------------------------------------------------------------
    def set_whatif(self, result: WhatIf | None, text: str = "", gpu_bytes: int | None = None):
        """Draw the bands with each category's live bytes times the result's factor (None: as
        measured), its exact peak with `text`, and a card's size as a line. Redraws from the
        last envelope: no envelope is recomputed while a slider moves."""
        d, tl = self.data, self.tl
        self.whatif = result
        self.scales = None
        if result is not None and d is not None:
            self.scales = np.array([float(result.scales.get(c, 1.0)) for c in d.categories])
            pk = result.scaled
            px = float(d.x_of_index(max(pk.index, 0)))
            tl.whatif_marker.setData([px], [float(pk.bytes)])
            tl.label_text(tl.whatif_label, text)
            tl.whatif_label.setPos(px, float(pk.bytes))
            tl.whatif_label.show()
            tl.peak_label.hide()           # the measured peak keeps its marker; the words are the new peak's
        else:
            tl.whatif_marker.setData([], [])
            tl.whatif_label.hide()
            if d is not None and d.da.peak is not None:
                tl.peak_label.show()
        if gpu_bytes:
            tl.gpu_line.setValue(float(gpu_bytes))
            tl.gpu_line.label.setFormat(f"{fmt_bytes(gpu_bytes)} GPU")
            tl.gpu_line.label.valueChanged()
            tl.gpu_line.show()
        else:
            tl.gpu_line.hide()
        if d is not None and self.mode != "categories" and result is not None:
            self.set_mode("categories")
        elif tl.last_env is not None and d is not None:
            tl.draw(tl.last_env)

    def scaled_columns(self, env: Envelope) -> np.ndarray:
        """Each column's composition times the factors: of the two moments each column keeps
        (its highest measured total, its last entry) the one whose scaled total is higher,
        and in the what-if peak's own column the peak itself, as the result gives it (so the
        top meets the marker)."""
        f, d = self.scales, self.data
        if self.whatif is not None and self.whatif.simulation is not None:
            # a simulated lever changes the run itself: each column's two moments as simulated
            a, b = (self._simulated(idx) for idx in (env.col_index, env.col_index_last
                                                      if env.col_index_last is not None else env.col_index))
        else:
            a = scale_live(env.col_comp, f)
            b = scale_live(env.col_comp_last, f) if env.col_comp_last is not None else a
        pick = b.sum(axis=1) > a.sum(axis=1)
        comp = np.where(pick[:, None], b, a).astype(np.float64)
        pk = self.whatif.scaled if self.whatif is not None else None
        if pk is not None and pk.index >= -1:
            x = float(d.x_of_index(max(pk.index, 0)))
            if env.x0 <= x <= env.x1 and len(env.col_x):
                k = min(len(env.col_x) - 1, max(0, int((x - env.x0) / (env.x1 - env.x0) * len(env.col_x))))
                comp[k] = [pk.by_category.get(c, 0) for c in d.categories]
        return comp

    def _simulated(self, entries: np.ndarray) -> np.ndarray:
        """(columns, the model's categories) live bytes at `entries` in the simulated run
        (WhatIf.live_at_many: CATEGORIES order, put in this device's category order)."""
        d, r = self.data, self.whatif
        assert d is not None and r is not None
        live = r.live_at_many(np.asarray(entries, dtype=np.int64))
        return live[:, [CATEGORIES.index(c) for c in d.categories]].astype(np.float64)


__all__ = ["Stacking", "MODES"]
