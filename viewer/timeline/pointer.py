"""The timeline under the pointer: what is drawn at a point (per stacking mode), the hover
box, clicks, the cursor, the selected allocation's lifetime and outline at its place in the
stack, and the allocations a finding or a site marks. One object the timeline owns
(`TimelineWidget.pointer`); it draws with the timeline's items and answers from its last
envelope."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QColor

from ...classifiers.evidence import E_GUESS
from ...common.units import fmt_bytes, fmt_duration_us, fmt_seconds
from ...present.markup import html as _esc
from ...present.words import segment_pool_words, segment_stream_words
from ..theme import category_color

if TYPE_CHECKING:
    from .widget import TimelineWidget


LIFETIME_TINT_SHARE = 0.8      # a selected lifetime at least this share of the run: edges only, no tint


class Pointer:
    """Hover, click, cursor, selection and marked rows of one timeline."""

    ROW_MARKS_MAX = 4000            # more marks than this say nothing more: evenly thinned

    def __init__(self, timeline: TimelineWidget):
        self.tl = timeline
        self.selected_row = -1
        self._marked_rows: np.ndarray | None = None
        self._hover_pos = None
        self._scene_pos = None          # where the pointer is over the plot (scene), None: not over it
        self._note_tip = ""
        self._hover_timer = QTimer(timeline)
        self._hover_timer.setSingleShot(True)
        self._hover_timer.setInterval(25)
        self._hover_timer.timeout.connect(self._do_hover)
        self.row_marks = pg.ScatterPlotItem(size=9, symbol="o")
        self.row_marks.setZValue(10)
        self.row_marks.setToolTip("The allocations shown in the table (where each was made)")
        timeline.vb.addItem(self.row_marks, ignoreBounds=True)

    @property
    def data(self):
        return self.tl.data

    def on_mouse_moved(self, pos):
        tl = self.tl
        self._scene_pos = pos
        if self.data is None or not tl.vb.sceneBoundingRect().contains(pos):
            self.hide_hover()
            return
        # over a note's label the hover box tells the note (one box: a Qt tooltip on top
        # of it made two at once)
        self._note_tip = ""
        if tl.notes.marks:
            vp = tl.plot.mapFromScene(pos)
            self._note_tip = tl.notes.tooltip_at(vp.x(), vp.y())
        self._hover_pos = tl.vb.mapSceneToView(pos)
        self._hover_timer.start()

    def _do_hover(self):
        if self._hover_pos is None or self.data is None:
            return
        x, y = self._hover_pos.x(), self._hover_pos.y()
        if self._note_tip:
            self.note_hover_at(x, y, self._note_tip)
        else:
            self.hover_at(x, y)

    def refresh_hover(self):
        """The box under a still pointer tells what the timeline draws now (another mode)."""
        if self.tl.hover_label.isVisible():
            self._do_hover()

    def rehit(self):
        """After the view changed under a still pointer (a wheel zoom, a pan, Home, a box
        zoom): the box tells what is under the pointer now, placed again inside the view
        (it stayed on the old point, clipped, or described a point no longer there)."""
        tl = self.tl
        if not tl.hover_label.isVisible() and not self._hover_timer.isActive():
            return
        pos = self._scene_pos
        if pos is None or self.data is None or not tl.vb.sceneBoundingRect().contains(pos):
            self.hide_hover()
            return
        self._hover_pos = tl.vb.mapSceneToView(pos)
        self._hover_timer.stop()
        self._do_hover()

    def left(self):
        """The pointer left the plot (into a panel, a tab, the event list): no box."""
        self._scene_pos = None
        self.hide_hover()

    def note_hover_at(self, x: float, y: float, tip: str):
        head, _, body = tip.partition("\n")
        html = (f"<div style='font-size:9pt'><b>{_esc(head)}</b>"
                + (f"<br>{_esc(body).replace(chr(10), '<br>')}" if body else "") + "</div>")
        self._show_hover(x, y, html, width=min(420, max(200, int(self.tl.vb.width() * 0.45))))

    def index_under(self, x: float) -> int:
        """The entry drawn at x: the highest moment of the pixel column's bucket
        (what the bands show there), or the state at x outside the last envelope."""
        env = self.tl.last_env
        if env is not None and env.x1 > env.x0 and env.x0 <= x <= env.x1:
            k = int((x - env.x0) / (env.x1 - env.x0) * len(env.col_index))
            return int(env.col_index[min(max(k, 0), len(env.col_index) - 1)])
        return self.data.index_before_x(x)

    def column_under(self, x: float) -> int:
        env = self.tl.last_env
        if env is None or not env.x1 > env.x0 or not env.x0 <= x <= env.x1:
            return -1
        k = int((x - env.x0) / (env.x1 - env.x0) * len(env.col_index))
        return min(max(k, 0), len(env.col_index) - 1)

    def thing_under(self, x: float, y: float) -> tuple[int, int, int, int]:
        """(allocation row, category, segment, entry) drawn at (x, y) in the current mode
        (-1: none), the entry being the moment the pixel column shows."""
        d, st = self.data, self.tl.stacking
        i = self.index_under(x)
        if st.mode == "categories" or st.cols is None:
            row, cat = d.allocation_at_index(i, y, self.tl.visible_categories)
            return row, cat, -1, i
        k = self.column_under(x)
        if k < 0:
            return -1, -1, -1, i
        u = int(st.col_u[k])
        rank = st.cols.rank_at(u, y)
        if st.mode == "segments":
            return -1, -1, d.segments.stack().row_of(rank), i
        row = d.alloc_stack().row_of(rank)
        return row, (int(d.category[row]) if row >= 0 else -1), -1, i

    def hover_at(self, x: float, y: float) -> int:
        """Show what is under (x, y); returns the allocation row or -1."""
        row, cat, seg, i = self.thing_under(x, y)
        if seg >= 0:
            self._show_hover(x, y, self._segment_html(seg, i))
            self.tl.hovered.emit(-1, i, x)
            return -1
        self._show_hover(x, y, self._hover_html(row, cat, i))
        self.tl.hovered.emit(row, i, x)
        return row

    def _show_hover(self, x: float, y: float, html: str, width: int = -1):
        """The hover box at (x, y); `width` wraps long text (a note) in that many pixels."""
        tl = self.tl
        tl.hover_label.setTextWidth(width)
        tl.hover_line.setPos(x)
        tl.hover_line.show()
        tl.hover_label.setHtml(html)
        (vx0, vx1), (vy0, vy1) = tl.vb.viewRange()
        # keep the label inside the view: flip to the left/bottom near the edges
        ax = 1.0 if x > vx0 + (vx1 - vx0) * 0.6 else 0.0
        ay = 0.0 if y > vy0 + (vy1 - vy0) * 0.45 else 1.0
        tl.hover_label.setAnchor((ax, ay))
        dx = (vx1 - vx0) * 0.008 * (-1 if ax else 1)
        tl.hover_label.setPos(x + dx, y)
        tl.hover_label.show()

    def _segment_html(self, seg: int, i: int) -> str:
        d = self.data
        when = self._when(i)
        size = int(d.segments.size[seg])
        inside = d.segments.allocated_in(seg, i)
        stream = f" · {segment_stream_words(int(d.segments.stream[seg]))}" if len(d.segments.streams) > 1 else ""
        pool = segment_pool_words(small=bool(d.segments.small[seg]))
        return (f"<div style='font-size:9pt'><span style='opacity:0.75'>{when} · reserved "
                f"{fmt_bytes(d.reserved_at(i))}</span><br>"
                f"<b>segment 0x{int(d.segments.addr[seg]):x}</b> · {fmt_bytes(size)} ({pool}{stream})<br>"
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
        guess = " <i>(a guess)</i>" if int(d.da.evidence[row]) >= E_GUESS else ""
        return (f"<div style='font-size:9pt'>{head}<br>"
                f"<b><span style='color:{col}'>■</span> {name}</b>{guess} · {size} · {life}<br>"
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

    def on_click(self, x: float, y: float):
        if self.data is None:
            return
        row, _, seg, i = self.thing_under(x, y)
        self.set_cursor_x(x)
        self.tl.clicked.emit(row, i, x)
        if seg >= 0:
            self.tl.segmentClicked.emit(seg, i)

    def set_cursor_x(self, x: float):
        self.tl.cursor_line.setPos(x)
        self.tl.cursor_line.show()

    def set_cursor_index(self, i: int):
        if self.data is not None:
            self.set_cursor_x(float(self.data.x_of_index(max(i, 0))))

    def select_row(self, row: int):
        """Highlight a row's lifetime (or clear with -1)."""
        self.selected_row = row
        d, tl = self.data, self.tl
        if d is None or row < 0:
            tl.selection.hide()
            tl.sel_bar.setData([], [])
            return
        first, last = d.row_span(row)
        xa = float(d.x_of_index(first)) if d.alloc_index[row] >= 0 else d.x_range[0]
        xb = float(d.x_of_index(last)) if d.free_index[row] >= 0 else d.x_range[1]
        tl.selection.setRegion((xa, xb))
        # a lifetime over most of the run is not tinted (it hid the phases under one colour):
        # its edges and its outline in the stack say it
        lo, hi = d.x_range
        most = hi > lo and (xb - xa) >= LIFETIME_TINT_SHARE * (hi - lo)
        tl.selection.setBrush(tl.selection_brush if not most else QBrush(Qt.BrushStyle.NoBrush))
        tl.selection.show()
        self.update_selection_bar()

    # -- a chosen set of allocations (a leak's, a site's) ----------------------------------------
    def set_row_marks(self, rows: np.ndarray | None):
        """Ring each of these allocations where it was made (on the live line right after its
        alloc), over the bands and the leak diamonds; None clears them."""
        self._marked_rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self.place_row_marks()

    def place_row_marks(self):
        """Draw the chosen rows' marks (again after the x axis or the theme changed)."""
        item, rows, d = self.row_marks, self._marked_rows, self.data
        if rows is None or d is None or d.n == 0:
            item.setData([], [])
            return
        idx = d.alloc_index[rows]
        idx = np.sort(idx[idx >= 0])
        if len(idx) > self.ROW_MARKS_MAX:
            idx = idx[np.linspace(0, len(idx) - 1, self.ROW_MARKS_MAX).astype(np.int64)]
        ring = QColor(self.tl.theme.accent)
        item.setPen(pg.mkPen(ring, width=1.5))
        item.setBrush(pg.mkBrush(None))
        item.setData(d.x_of_index(idx), d.live[idx].astype(np.float64))

    def update_selection_bar(self):
        """The selected allocation's outline at its place in the stack, over the columns
        it is live in: its category's band plus the older allocations of its category below
        it (by category), or its own band (by allocation). By segment: none."""
        tl = self.tl
        row, d, env, st = self.selected_row, self.data, tl.last_env, tl.stacking
        tl.sel_bar.setData([], [])
        if d is None or row < 0 or env is None or st.mode == "segments":
            return
        a, f = int(d.alloc_index[row]), int(d.free_index[row])
        ci = env.col_index
        live = np.flatnonzero((ci >= a) & ((ci < f) | (f < 0)))
        if not len(live):
            return
        if st.mode == "allocations" and st.cols is not None:
            rank = d.alloc_stack().rank_of(row)
            u, bottom, top = st.cols.band_of(rank)
            if not len(u):
                return
            lo = np.full(len(st.cols.moments), np.nan)
            hi = np.full(len(st.cols.moments), np.nan)
            lo[u], hi[u] = bottom, top
            k = live[np.isfinite(lo[st.col_u[live]])]
            if not len(k):
                return
            y0, y1 = lo[st.col_u[k]], hi[st.col_u[k]]
        else:
            c = int(d.category[row])
            vis = tl.visible_categories
            if c not in vis:
                return
            below = vis[:vis.index(c)]
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
        tl.sel_bar.setData(np.concatenate(xs), np.concatenate(ys), connect="finite")

    def hide_hover(self):
        tl = self.tl
        self._hover_timer.stop()
        self._hover_pos = None
        if tl.hover_label.isVisible() or tl.hover_line.isVisible():
            tl.hover_label.hide()
            tl.hover_line.hide()
            tl.hoverLeft.emit()

    def stop(self):
        self._hover_timer.stop()


__all__ = ["Pointer"]
