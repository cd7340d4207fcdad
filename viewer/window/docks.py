"""The main window's views and panels: the stacking mode and the time axis, the Allocator
and What-if panels' wiring, the panels shown only with data, and Open Recent. Mixed into
MainWindow (viewer/window.py)."""
from __future__ import annotations

import os

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QTabBar, QWidget

from ...common.units import fmt_seconds
from ...present.words import leak_rows_text
from ..model.notes import home_short

MAX_RECENT = 10


def recent_labels(paths: list[str], width: int = 60) -> list[str]:
    """Menu texts for recent files: the name, then its folder (two runs' `memory.pickle`
    are told apart), the folder shortened in the middle."""
    out = []
    for p in paths:
        folder = home_short(os.path.dirname(p))
        if len(folder) > width:
            folder = folder[:width // 3] + "…" + folder[-(width - width // 3 - 1):]
        out.append(f"{os.path.basename(p)}    {folder}")
    return out


def first_focusable(panel: QWidget) -> QWidget | None:
    """The widget of a panel that takes the keyboard: the panel itself when it does (the
    Allocator), else its first shown child that accepts focus by Tab, skipping buttons (the
    table over its filter buttons, the notes' list over their toolbar)."""
    def takes_tab(w: QWidget) -> bool:
        return bool(w.focusPolicy() & Qt.FocusPolicy.TabFocus) and w.isVisibleTo(panel) and w.isEnabled()
    if takes_tab(panel):
        return panel
    kids = [w for w in panel.findChildren(QWidget) if takes_tab(w)]
    views = [w for w in kids if w.inherits("QAbstractItemView")]
    return (views or kids or [None])[0]


class ViewsMixin:
    """Mixed into MainWindow (viewer/window.py)."""

    def _show_docks(self, on: bool):
        """The panels only with something to show (the welcome and empty pages stand alone);
        the ones the user had open come back."""
        if not on and self._docks_shown is None:
            self._docks_shown = {k for k, dock in self.docks.items() if not dock.isHidden()}
            for dock in self.docks.values():
                dock.hide()
            # Qt leaves the tab bar of a group of tabbed docks on screen when they all hide
            # (and shows it again when it lays the window out after the hide)
            self._hide_dock_tabs()
            QTimer.singleShot(0, self._hide_dock_tabs)
        elif on and self._docks_shown is not None:
            for k in self._docks_shown:
                self.docks[k].show()
            self._docks_shown = None
            self.docks["selection"].raise_()
            self.docks["allocations"].raise_()

    def _on_dock_visible(self, key: str, visible: bool):
        if visible:
            QTimer.singleShot(0, self, lambda: self._focus_follows_tab(key))

    def _focus_follows_tab(self, key: str):
        """A panel brought forward by its tab takes the keyboard from the panel it covers. Qt
        keeps the focus in the covered panel (a dock behind another's tab is still "visible"),
        so ← / → after clicking the Allocator tab moved the hidden table's selection instead
        of stepping the allocator."""
        focused = QApplication.focusWidget()
        if focused is None or not self.on_screen(key):
            return
        if not any(d.isAncestorOf(focused) and not self.on_screen(k) for k, d in self.docks.items()):
            return
        target = first_focusable(self.docks[key].widget())
        if target is not None:
            target.setFocus(Qt.FocusReason.OtherFocusReason)
        else:
            focused.clearFocus()

    def _hide_dock_tabs(self):
        if self._docks_shown is None:
            return
        for bar in self.findChildren(QTabBar):
            if bar.parent() is self:
                bar.hide()

    def recent_files(self) -> list[str]:
        if self.settings is None:
            return []
        v = self.settings.value("recent", [])
        if isinstance(v, str):
            v = [v]
        return [p for p in (v or []) if isinstance(p, str)]

    def _add_recent(self, path: str):
        if self.settings is None:
            return
        rec = [path] + [p for p in self.recent_files() if p != path]
        self.settings.setValue("recent", rec[:MAX_RECENT])
        self.settings.setValue("last_dir", os.path.dirname(path))

    def _fill_recent(self):
        self.recent_menu.clear()
        rec = self.recent_files()
        if not rec:
            a = self.recent_menu.addAction("(none)")
            a.setEnabled(False)
            return
        self.recent_menu.setToolTipsVisible(True)
        for p, label in zip(rec, recent_labels(rec)):
            a = self.recent_menu.addAction(label, lambda p=p: self.open_path(p))
            a.setToolTip(p)
            a.setEnabled(os.path.exists(p))
        self.recent_menu.addSeparator()
        self.recent_menu.addAction("Clear", lambda: self.settings.setValue("recent", []))

    def on_screen(self, key: str) -> bool:
        """Whether a panel is really shown (a dock behind another's tab says it is visible)."""
        dock = self.docks[key]
        return dock.isVisible() and not dock.visibleRegion().isEmpty()

    def _on_whatif_visible(self, visible: bool):
        # after the event loop turn: the panels shown again after a load pass through
        # "visible" on their way behind the table's tab, and must not build the model then
        if visible:
            QTimer.singleShot(0, self._whatif_if_shown)

    def _whatif_if_shown(self):
        if self.data is not None and self.on_screen("whatif"):
            self.whatif_panel.ensure_model()

    def _on_whatif(self, factors, peak_index: int, peak_bytes, text: str, gpu_bytes):
        self.timeline.set_whatif(factors, peak_index, int(peak_bytes or 0), text, gpu_bytes)

    def _on_segment_clicked(self, seg: int, i: int):
        d = self.data
        self.docks["allocator"].show()
        self.docks["allocator"].raise_()
        self.allocator_panel.show_index(i, int(d.seg_addr[seg]))

    def _on_allocator_visible(self, visible: bool):
        if visible:
            QTimer.singleShot(0, self._allocator_if_shown)

    def _allocator_if_shown(self):
        d = self.data
        if d is not None and self.on_screen("allocator") and self.allocator_panel.index is None:
            self.allocator_panel.show_index(self.pinned_index if self.pinned_index is not None else d.peak_index)

    def _on_allocator_step(self, i: int):
        """The allocator panel stepped to entry i: the cursor, the moment and the view follow."""
        d = self.data
        if d is None:
            return
        self.pinned_index = i
        self.timeline.set_cursor_index(i)
        self.moment_panel.request_index(i)
        x = float(d.x_of_index(max(i, 0)))
        x0, x1 = self.timeline.x_span()
        if not x0 <= x <= x1:
            w = x1 - x0
            self.timeline.set_x_range(x - w / 2, x + w / 2)

    def set_mode(self, mode: str):
        """Stack the timeline by category, allocation or segment."""
        if self.data is None:
            return
        if not self.timeline.set_mode(mode):
            self.statusBar().showMessage("This snapshot has no allocator segments (profiler-converted): "
                                         "no segment view", 6000)
            self.mode_actions[self.timeline.mode].setChecked(True)

    def _on_time_axis(self, on: bool):
        d = self.data
        if d is None:
            return
        if on and not d.has_time:
            self.act_time_axis.setChecked(False)
            self.statusBar().showMessage("This trace has no time stamps: the x axis is the entry index", 6000)
            return
        self.timeline.set_time_axis(on)

    def _axis_notice(self) -> str | None:
        """Why the x axis is entries although the trace has times (None: it is time)."""
        d = self.data
        if d is None or not d.has_time or d.time_axis:
            return None
        span = max(d.time_span, 1e-9)
        gap = d.idle_gap_us / 1e6
        return (f"x axis in entries: one idle stretch ({fmt_seconds(gap, gap / 100)}) is {gap / span:.0%} of the run "
                f"(T: seconds)")

    def _on_mode_changed(self, mode: str):
        self.mode_actions[mode].setChecked(True)
        self.legend.set_mode(mode)

    def _show_finding_rows(self, f):
        """A leak selects its allocations: the table shows exactly them (with a chip that
        clears it) and the timeline rings where each was made. Any other finding lets a
        leak's set go."""
        if f.kind == "leak" and f.rows is not None and len(f.rows):
            self.table_panel.show_only(f.rows, leak_rows_text(len(f.rows), f.place))
            self.timeline.set_row_marks(f.rows)
            self.docks["allocations"].show()
            self.docks["allocations"].raise_()
        elif self.table_panel.has_only():
            self.table_panel.clear_only()

    def _on_only_cleared(self):
        self.timeline.set_row_marks(None)
