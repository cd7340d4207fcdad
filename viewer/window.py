"""The main window: timeline in the middle, panels around it, loading in the background."""
from __future__ import annotations

import os
import sys
import traceback

from PySide6.QtCore import QEvent, QPoint, QRect, QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QColor, QIcon, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (QApplication, QComboBox, QDockWidget, QFileDialog, QInputDialog, QLabel, QLayout,
                               QMainWindow, QMessageBox, QProgressDialog, QPushButton, QStackedWidget, QToolBar,
                               QToolButton, QVBoxLayout, QWidget)

from ..classifiers import STACK_ORDER
from ..present.words import error_text, peak_words
from ..services.annotations import Annotation, AnnotationStore

from ..common.units import fmt_bytes
from .loader import LoadResult, Loader, load, switch_device
from .model import DeviceData
from .notes import NotesPanel, first_line, location_notice, note_row, note_span
from .panels import FindingsPanel, MomentPanel, StackPanel
from .table import AllocationsPanel
from .theme import PHASE_COLORS, Theme, category_color
from .timeline import TimelineWidget

MAX_RECENT = 10
FILE_FILTER = "Memory snapshots (*.pickle *.pkl *.pck *.p);;All files (*)"
TRIM_WINDOW = 2000        # entries around the peak in a trimmed export (as `vramscope export --around-peak`)
# what the store's undo/redo commands do, for the Edit menu's "Undo Add Note"
_COMMAND_NAMES = {"_Add": "Add Note", "_Remove": "Delete Note", "_Edit": "Edit Note"}


def swatch(color: QColor, w: int = 12, h: int = 12) -> QIcon:
    pm = QPixmap(w, h)
    pm.fill(color)
    return QIcon(pm)


class FlowLayout(QLayout):
    """Left to right, wrapping to a new row when the width runs out (Qt's flow layout
    example): the legend must never force the window wider than the screen."""

    def __init__(self, parent=None, spacing: int = 4):
        super().__init__(parent)
        self._items = []
        self._spacing = spacing

    def addItem(self, item):
        self._items.append(item)

    def count(self):
        return len(self._items)

    def itemAt(self, i):
        return self._items[i] if 0 <= i < len(self._items) else None

    def takeAt(self, i):
        return self._items.pop(i) if 0 <= i < len(self._items) else None

    def expandingDirections(self):
        return Qt.Orientation(0)

    def hasHeightForWidth(self):
        return True

    def heightForWidth(self, width):
        return self._do_layout(QRect(0, 0, width, 0), True)

    def setGeometry(self, rect):
        super().setGeometry(rect)
        self._do_layout(rect, False)

    def sizeHint(self):
        return self.minimumSize()

    def minimumSize(self):
        size = QSize()
        for it in self._items:
            size = size.expandedTo(it.minimumSize())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _do_layout(self, rect, test_only):
        m = self.contentsMargins()
        r = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        x, y, line_h = r.x(), r.y(), 0
        for it in self._items:
            hint = it.sizeHint()
            nx = x + hint.width() + self._spacing
            if nx - self._spacing > r.right() and line_h > 0:
                x, y = r.x(), y + line_h + self._spacing
                nx = x + hint.width() + self._spacing
                line_h = 0
            if not test_only:
                it.setGeometry(QRect(QPoint(x, y), hint))
            x = nx
            line_h = max(line_h, hint.height())
        return y + line_h - rect.y() + m.bottom()


class LegendBar(QWidget):
    """One toggle button per category present (the stacked bands), then the line styles."""

    toggled = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.lay = FlowLayout(self)
        self.lay.setContentsMargins(6, 2, 6, 2)
        self.buttons: dict[int, QToolButton] = {}

    def set_data(self, data: DeviceData | None):
        while self.lay.count():
            it = self.lay.takeAt(0)
            w = it.widget()
            if w is not None:
                w.deleteLater()
        self.buttons = {}
        if data is None:
            return
        peak_comp = data.composition([data.peak_index])[0]
        for name in STACK_ORDER + tuple(c for c in data.categories if c not in STACK_ORDER):
            if name not in data.categories:
                continue
            c = data.categories.index(name)
            if not data.cat_present[c]:
                continue
            b = QToolButton(self)
            b.setText(name)
            b.setIcon(swatch(category_color(name)))
            b.setCheckable(True)
            b.setChecked(True)
            b.setAutoRaise(True)
            b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            b.setToolTip(f"Show or hide {name} in the stacked timeline "
                         f"({fmt_bytes(peak_comp[c])} of it live at the peak)")
            b.toggled.connect(lambda _=False: self.toggled.emit())
            self.lay.addWidget(b)
            self.buttons[c] = b
        fg = self.palette().color(self.foregroundRole()).name()
        lines = QLabel(f"<span style='color:{fg}'>━ allocated</span>"
                       + ("&nbsp;&nbsp;<span style='color:#777'>┅ reserved</span>" if data.reserved is not None else "")
                       + "&nbsp;&nbsp;<span style='color:#D62728'>▲ peak</span>", self)
        lines.setToolTip("Lines: live allocated bytes (exact at every zoom) and the allocator's reserved bytes")
        self.lay.addWidget(lines)
        if data.iterations:
            phases = "phases: " + "&nbsp;".join(f"<span style='color:{PHASE_COLORS[p]}'>▒</span>{p}"
                                                for p in ("forward", "backward", "optimizer"))
            pl = QLabel(phases, self)
            pl.setToolTip("Shaded phases of each iteration; dashed lines are iteration starts")
            self.lay.addWidget(pl)

    def visible(self) -> list[int]:
        """Checked categories, bottom to top."""
        return [c for c, b in self.buttons.items() if b.isChecked()]

    def set_checked(self, c: int, on: bool):
        b = self.buttons.get(c)
        if b is not None:
            b.setChecked(on)


class MainWindow(QMainWindow):
    """Pass persist=False to leave the user's settings alone (screenshots, tests)."""

    loaded = Signal()

    def __init__(self, persist: bool = True, use_cache: bool = True, settings: QSettings | None = None):
        super().__init__()
        self.persist = persist
        self.use_cache = use_cache
        self.settings = settings if settings is not None else (QSettings("vramscope", "vramscope") if persist else None)
        self.result: LoadResult | None = None
        self.data: DeviceData | None = None
        self.path: str | None = None
        self.selected_row = -1
        self.pinned_index: int | None = None
        self.finding_pos = -1
        self.error_box: QMessageBox | None = None
        self.progress_dialog: QProgressDialog | None = None
        self._pending_device: int | None = None
        self.store: AnnotationStore | None = None
        self._unsubscribe = None
        self.notes_notice: str | None = None
        self._notes_problems: list[str] = []
        self.setWindowTitle("vramscope")
        self.setAcceptDrops(True)
        self.setDockNestingEnabled(True)

        self.loader = Loader(self)
        self.loader.progressed.connect(self._on_progress)
        self.loader.finished.connect(self._on_loaded)
        self.loader.failed.connect(self._on_failed)
        self.loader.cancelled.connect(self._on_cancelled)

        # central: a placeholder until something is loaded, then legend + timeline
        self.timeline = TimelineWidget(self)
        self.legend = LegendBar(self)
        self.legend.toggled.connect(self._on_legend)
        page = QWidget(self)
        pl = QVBoxLayout(page)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.setSpacing(0)
        pl.addWidget(self.legend)
        pl.addWidget(self.timeline, 1)
        self.placeholder = QWidget(self)
        ph = QVBoxLayout(self.placeholder)
        msg = QLabel("<h2>vramscope</h2><p>Open a PyTorch CUDA memory snapshot "
                     "(<code>torch.cuda.memory._dump_snapshot</code>) with <b>Ctrl+O</b>, "
                     "or drop the file here.</p>", self.placeholder)
        msg.setAlignment(Qt.AlignmentFlag.AlignCenter)
        msg.setWordWrap(True)
        open_btn = QPushButton("Open snapshot…", self.placeholder)
        open_btn.clicked.connect(self.open_dialog)
        ph.addStretch(1)
        ph.addWidget(msg)
        ph.addWidget(open_btn, 0, Qt.AlignmentFlag.AlignHCenter)
        ph.addStretch(2)
        self.stack = QStackedWidget(self)
        self.stack.addWidget(self.placeholder)
        self.stack.addWidget(page)
        self.setCentralWidget(self.stack)

        # panels
        self.stack_panel = StackPanel(self)
        self.moment_panel = MomentPanel(self)
        self.findings_panel = FindingsPanel(self)
        self.table_panel = AllocationsPanel(self)
        self.notes_panel = NotesPanel(self)
        self.docks = {}
        for key, title, widget, area in (
                ("selection", "Selection", self.stack_panel, Qt.DockWidgetArea.RightDockWidgetArea),
                ("moment", "At this moment", self.moment_panel, Qt.DockWidgetArea.RightDockWidgetArea),
                ("findings", "Findings", self.findings_panel, Qt.DockWidgetArea.RightDockWidgetArea),
                ("allocations", "Allocations", self.table_panel, Qt.DockWidgetArea.BottomDockWidgetArea),
                ("annotations", "Annotations", self.notes_panel, Qt.DockWidgetArea.BottomDockWidgetArea)):
            dock = QDockWidget(title, self)
            dock.setObjectName(f"dock_{key}")
            dock.setWidget(widget)
            self.addDockWidget(area, dock)
            self.docks[key] = dock
        # right column: findings above the selection / moment tabs; the table below everything
        self.splitDockWidget(self.docks["findings"], self.docks["selection"], Qt.Orientation.Vertical)
        self.tabifyDockWidget(self.docks["selection"], self.docks["moment"])
        # the notes share the bottom with the table: a wide list, and the right column keeps its height
        self.tabifyDockWidget(self.docks["allocations"], self.docks["annotations"])
        self.docks["selection"].raise_()
        self.docks["allocations"].raise_()

        self.timeline.hovered.connect(self._on_hover)
        self.timeline.clicked.connect(self._on_timeline_click)
        self.timeline.hoverLeft.connect(self._on_hover_left)
        self.table_panel.rowSelected.connect(lambda r: self.select_row(r, source="table"))
        self.moment_panel.rowClicked.connect(lambda r: self.select_row(r, source="moment"))
        self.findings_panel.activated.connect(self.navigate)
        self.notes_panel.activated.connect(self.go_to_note)
        self.notes_panel.editRequested.connect(self.edit_note)
        self.notes_panel.tree.currentItemChanged.connect(lambda *_: self._update_note_actions())
        self.timeline.marked.connect(self._on_marked)

        self._build_actions()
        self._build_status()
        self.apply_theme()
        self.resize(1400, 900)
        self.default_layout()
        if self.settings is not None:
            geo = self.settings.value("window/geometry")
            state = self.settings.value("window/state")
            if geo is not None:
                self.restoreGeometry(geo)
            if state is not None:
                self.restoreState(state)

    def default_layout(self):
        """Dock sizes for a 1400x900 window: the timeline gets most of it."""
        self.resizeDocks([self.docks["findings"]], [360], Qt.Orientation.Horizontal)
        self.resizeDocks([self.docks["findings"], self.docks["selection"]], [170, 400], Qt.Orientation.Vertical)
        self.resizeDocks([self.docks["allocations"]], [240], Qt.Orientation.Vertical)

    # -- actions ----------------------------------------------------------------------------
    def _act(self, menu, text, slot, keys=(), tip="", checkable=False):
        a = QAction(text, self)
        if keys:
            a.setShortcuts([QKeySequence(k) for k in keys])
        tip = tip or text.replace("&", "").rstrip("…")
        if keys:
            tip += f" ({', '.join(QKeySequence(k).toString(QKeySequence.SequenceFormat.NativeText) for k in keys)})"
        a.setToolTip(tip)
        a.setStatusTip(tip)
        a.setCheckable(checkable)
        a.triggered.connect(slot)
        if menu is not None:
            menu.addAction(a)
        self.addAction(a)
        return a

    def _build_actions(self):
        mb = self.menuBar()
        fm = mb.addMenu("&File")
        self.act_open = self._act(fm, "&Open…", self.open_dialog, [QKeySequence.StandardKey.Open],
                                  "Open a memory snapshot")
        self.recent_menu = fm.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        self.act_reload = self._act(fm, "&Reload", self.reload, ["F5"], "Reload the file from disk")
        fm.addSeparator()
        self.act_export = self._act(fm, "Save &Image…", self.export_image, ["Ctrl+E"],
                                    "Save the window as a PNG")
        fm.addSeparator()
        self.act_export_report = self._act(
            fm, "Export &Report…", self.export_report, ["Ctrl+Shift+E"],
            "Write report.md, timeline.png (with your notes drawn) and analysis.json into a folder")
        self.act_export_trimmed = self._act(
            fm, "Export &Trimmed Snapshot…", self.export_trimmed, (),
            "Save a window of the trace (around the peak, the marked range or the visible range) "
            "as a snapshot pickle that vramscope and PyTorch's viewer open")
        self.act_export_perfetto = self._act(
            fm, "Export &Perfetto Trace…", self.export_perfetto, (),
            "Save live memory per category as counter tracks (Chrome trace JSON for ui.perfetto.dev)")
        fm.addSeparator()
        self._act(fm, "&Quit", self.close, [QKeySequence.StandardKey.Quit])

        em = mb.addMenu("&Edit")
        self.act_undo = self._act(em, "&Undo", self.undo_note, ["Ctrl+Z"], "Undo the last change to the notes")
        self.act_redo = self._act(em, "&Redo", self.redo_note, ["Ctrl+Shift+Z", "Ctrl+Y"],
                                  "Redo the change to the notes just undone")
        em.addSeparator()
        self.act_note_range = self._act(
            em, "Annotate &Range…", self.annotate_range, ["A"],
            "Write a note on a time range: the range marked with Ctrl+drag on the timeline, "
            "or else the visible range")
        self.act_note_peak = self._act(
            em, "Annotate &Peak…", self.annotate_peak, ["Shift+P"],
            "Write a note on the peak (the peak found last with P / N, else the highest peak)")
        self.act_note_alloc = self._act(
            em, "Annotate &Allocation…", self.annotate_allocation, ["Shift+A"],
            "Write a note on the selected allocation (click the timeline or a table row first)")
        em.addSeparator()
        # F2 and Delete act in the notes list only (Delete elsewhere must not delete a note)
        self.act_note_edit = self._act(em, "&Edit Note…", self.edit_note, ["F2"],
                                       "Edit the note chosen in the Annotations panel")
        self.act_note_delete = self._act(em, "&Delete Note", self.delete_note, [QKeySequence.StandardKey.Delete],
                                         "Delete the note chosen in the Annotations panel (Ctrl+Z undoes)")
        for a in (self.act_note_edit, self.act_note_delete):
            self.removeAction(a)
            a.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            self.notes_panel.tree.addAction(a)
        for a, text in ((self.act_note_range, "Range…"), (self.act_note_peak, "Peak…"),
                        (self.act_note_alloc, "Allocation…"), (self.act_note_edit, "Edit…"),
                        (self.act_note_delete, "Delete")):
            self.notes_panel.add_button(a, text)
        self.notes_panel.finish_buttons()

        vm = mb.addMenu("&View")
        self.act_zoom_in = self._act(vm, "Zoom &In", lambda: self.timeline.zoom(0.5), ["+", "=", "Ctrl++"])
        self.act_zoom_out = self._act(vm, "Zoom &Out", lambda: self.timeline.zoom(2.0), ["-", "Ctrl+-"])
        self.act_reset = self._act(vm, "&Reset Zoom", self.timeline.reset_view, ["Home", "Ctrl+0"],
                                   "Show the whole run")
        vm.addSeparator()
        self.act_peak = self._act(vm, "Jump to &Peak", self.jump_to_peak, ["P"], "Go to the highest live memory")
        self.act_next = self._act(vm, "&Next Finding", lambda: self.step_finding(1), ["N"])
        self.act_prev = self._act(vm, "&Previous Finding", lambda: self.step_finding(-1), ["Shift+N"])
        self.act_clear = self._act(vm, "&Clear Selection", self.clear_selection, ["Esc"],
                                   "Clear the selected allocation and the marked range")
        self.act_filter = self._act(vm, "&Find in Stacks", self.focus_filter, ["Ctrl+F"],
                                    "Filter the allocations table by text in the frames")
        vm.addSeparator()
        for n, key in enumerate(("selection", "moment", "findings", "allocations", "annotations"), 1):
            a = self.docks[key].toggleViewAction()
            a.setShortcut(QKeySequence(f"Ctrl+{n}"))
            a.setToolTip(f"Show or hide the {self.docks[key].windowTitle()} panel (Ctrl+{n})")
            vm.addAction(a)
        # panning with the arrow keys belongs to the timeline (the table keeps its own)
        for key, frac in (("Left", -0.25), ("Right", 0.25)):
            sc = QShortcut(QKeySequence(key), self.timeline, lambda f=frac: self.timeline.pan(f))
            sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)

        hm = mb.addMenu("&Help")
        self._act(hm, "&Keyboard Shortcuts", self.show_shortcuts, ["F1"])
        self._act(hm, "&About vramscope", self.show_about)

        tb = QToolBar("Main", self)
        tb.setObjectName("toolbar_main")
        tb.setMovable(False)
        tb.setIconSize(QSize(16, 16))
        tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        tb.addAction(self.act_open)
        tb.addAction(self.act_reload)
        tb.addSeparator()
        dl = QLabel(" Device ", tb)
        tb.addWidget(dl)
        self.device_combo = QComboBox(tb)
        self.device_combo.setToolTip("Which GPU's trace to show")
        self.device_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.device_combo.activated.connect(self._on_device_chosen)
        tb.addWidget(self.device_combo)
        tb.addSeparator()
        for a in (self.act_zoom_in, self.act_zoom_out, self.act_reset):
            tb.addAction(a)
        tb.addSeparator()
        tb.addAction(self.act_peak)
        tb.addAction(self.act_prev)
        tb.addAction(self.act_next)
        self.addToolBar(tb)
        self.toolbar = tb
        self._set_loaded_actions(False)

    def _set_loaded_actions(self, on: bool):
        for a in (self.act_reload, self.act_zoom_in, self.act_zoom_out, self.act_reset, self.act_peak,
                  self.act_next, self.act_prev, self.act_export, self.act_export_report, self.act_export_trimmed,
                  self.act_export_perfetto):
            a.setEnabled(on)
        self.act_export_trimmed.setEnabled(on and self.data is not None and self.data.n > 0)
        self.device_combo.setEnabled(on and self.device_combo.count() > 1)
        self._update_note_actions()

    def _update_note_actions(self):
        store, d = self.store, self.data
        on = store is not None and d is not None
        self.act_note_range.setEnabled(on and d.n > 0)
        self.act_note_peak.setEnabled(on)
        self.act_note_alloc.setEnabled(on and self.selected_row >= 0)
        chosen = store is not None and self.notes_panel.current_id() is not None
        self.act_note_edit.setEnabled(chosen)
        self.act_note_delete.setEnabled(chosen)
        for act, can, stack, word in ((self.act_undo, store is not None and store.can_undo, "_undo", "Undo"),
                                      (self.act_redo, store is not None and store.can_redo, "_redo", "Redo")):
            act.setEnabled(bool(can))
            cmds = getattr(store, stack, None) if can else None
            what = _COMMAND_NAMES.get(type(cmds[-1]).__name__, "") if cmds else ""
            act.setText(f"&{word} {what}".rstrip())

    def _build_status(self):
        sb = self.statusBar()
        self.status_file = QLabel(self)
        self.status_device = QLabel(self)
        self.status_entries = QLabel(self)
        self.status_peak = QLabel(self)
        self.status_notes = QLabel(self)
        for w, tip in ((self.status_notes, ""), (self.status_file, "The open file"),
                       (self.status_device, "The device shown"),
                       (self.status_entries, "Trace entries and allocations on this device"),
                       (self.status_peak, "Highest live allocated memory and its type")):
            w.setToolTip(tip)
            sb.addPermanentWidget(w)
        self.status_notes.hide()

    def _update_status(self):
        d = self.data
        if self.path is None:
            for w in (self.status_file, self.status_device, self.status_entries, self.status_peak):
                w.setText("")
            return
        self.status_file.setText(os.path.basename(self.path))
        if d is None:
            self.status_device.setText("no device with data")
            self.status_entries.setText("")
            self.status_peak.setText("")
            return
        self.status_device.setText(f"cuda:{d.device}")
        self.status_entries.setText(f"{d.n:,} entries · {d.n_rows:,} allocations")
        pk = d.da.peak
        self.status_peak.setText(f"peak {fmt_bytes(pk.bytes)}, {peak_words(pk.type)}" if pk is not None else "")

    # -- theme -------------------------------------------------------------------------------
    def apply_theme(self):
        self.theme = Theme.from_palette(self.palette())
        self.timeline.apply_theme(self.theme)

    def changeEvent(self, ev):
        if ev.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            QTimer.singleShot(0, self.apply_theme)
        super().changeEvent(ev)

    # -- opening ---------------------------------------------------------------------------------
    def open_dialog(self):
        start = self.settings.value("last_dir", "") if self.settings is not None else ""
        path, _ = QFileDialog.getOpenFileName(self, "Open memory snapshot", start or "", FILE_FILTER)
        if path:
            self.open_path(path)

    def open_path(self, path: str, device: int | None = None):
        """Load in the background (a newer request replaces an older one)."""
        path = os.path.abspath(path)
        use_cache = self.use_cache
        self._close_error()
        self.loader.submit(lambda progress: load(path, device, use_cache, progress))
        self._show_progress(f"Opening {os.path.basename(path)}…")
        self.statusBar().showMessage(f"Opening {path}…")

    def reload(self):
        if self.path:
            self.open_path(self.path, self.data.device if self.data is not None else None)

    def apply_result(self, result: LoadResult):
        """Show a loaded snapshot (GUI thread)."""
        self.result = result
        self.path = result.path
        self.data = result.data
        self.selected_row = -1
        self.pinned_index = None
        self.finding_pos = -1
        d = self.data
        self.device_combo.clear()
        for dev in result.analysis.devices:
            self.device_combo.addItem(f"cuda:{dev}  ({len(result.snapshot.trace(dev)):,} entries)", dev)
        if result.device is not None:
            self.device_combo.setCurrentIndex(self.device_combo.findData(result.device))
        self.legend.set_data(d)
        self.timeline.set_data(d, self.legend.visible() if d is not None else [])
        self.stack_panel.set_data(d)
        self.moment_panel.set_data(d)
        self.findings_panel.set_data(d)
        self.table_panel.set_data(d)
        self.stack.setCurrentIndex(1 if d is not None else 0)
        self._use_store(result.path)
        self._set_loaded_actions(d is not None)
        self.act_reload.setEnabled(True)
        self.setWindowTitle(f"{os.path.basename(result.path)} — vramscope")
        self._update_status()
        if d is not None:
            self.moment_panel.show_index(max(d.peak_index, -1))
            self.statusBar().showMessage(
                "Wheel: zoom · drag: box zoom · Shift+drag: pan · Ctrl+drag: mark a range · click: select · "
                "F1: keys", 8000)
        else:
            self.statusBar().showMessage("This snapshot records no memory on any device.", 8000)
        if self.notes_notice:
            self.statusBar().showMessage(self._short_notice(), 20000)
        self._add_recent(result.path)
        self.loaded.emit()

    def _show_progress(self, label: str):
        self._hide_progress()
        self._progress_title = label
        dlg = QProgressDialog(label, "Cancel", 0, 1000, self)
        dlg.setWindowTitle("vramscope")
        dlg.setWindowModality(Qt.WindowModality.WindowModal)
        dlg.setMinimumDuration(400)
        dlg.setAutoClose(False)
        dlg.setAutoReset(False)
        dlg.canceled.connect(self.loader.cancel)
        dlg.setValue(0)
        self.progress_dialog = dlg

    def _hide_progress(self):
        dlg = self.progress_dialog
        if dlg is not None:
            self.progress_dialog = None
            dlg.canceled.disconnect(self.loader.cancel)
            dlg.reset()
            dlg.hide()
            dlg.deleteLater()

    def _on_progress(self, label: str, done: float, total: float):
        dlg = self.progress_dialog
        if dlg is None:
            return
        frac = 0.0 if total <= 0 else min(1.0, done / total)
        dlg.setLabelText(f"{self._progress_title}\n{label.capitalize()}…")
        dlg.setValue(int(frac * 999))

    def _on_loaded(self, result: LoadResult):
        self._hide_progress()
        self.statusBar().clearMessage()
        self.apply_result(result)

    def _on_failed(self, msg: str):
        self._hide_progress()
        self.statusBar().showMessage("Could not open the snapshot", 5000)
        self._close_error()
        box = QMessageBox(QMessageBox.Icon.Warning, "Cannot open snapshot", msg, QMessageBox.StandardButton.Ok, self)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.open()
        self.error_box = box

    def _close_error(self):
        if self.error_box is not None:
            self.error_box.close()
            self.error_box.deleteLater()
            self.error_box = None

    def _on_cancelled(self):
        self._hide_progress()
        self.statusBar().showMessage("Loading cancelled", 5000)

    def _on_device_chosen(self, idx: int):
        dev = self.device_combo.itemData(idx)
        if self.result is None or dev is None or (self.data is not None and dev == self.data.device):
            return
        result = self.result
        self.loader.submit(lambda progress: switch_device(result, dev, progress))
        self._show_progress(f"Preparing cuda:{dev}…")

    # -- recent files ---------------------------------------------------------------------------
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
        for p in rec:
            a = self.recent_menu.addAction(os.path.basename(p), lambda p=p: self.open_path(p))
            a.setToolTip(p)
            a.setEnabled(os.path.exists(p))
        self.recent_menu.addSeparator()
        self.recent_menu.addAction("Clear", lambda: self.settings.setValue("recent", []))

    # -- drag and drop -------------------------------------------------------------------------------
    def dragEnterEvent(self, ev):
        if ev.mimeData().hasUrls() and any(u.isLocalFile() for u in ev.mimeData().urls()):
            ev.acceptProposedAction()

    def dropEvent(self, ev):
        for u in ev.mimeData().urls():
            if u.isLocalFile():
                self.open_path(u.toLocalFile())
                ev.acceptProposedAction()
                return

    # -- interaction ------------------------------------------------------------------------------------
    def _on_legend(self):
        if self.data is not None:
            self.timeline.set_visible_categories(self.legend.visible())

    def _on_hover(self, row: int, i: int, x: float):
        if self.moment_panel.isVisible():
            self.moment_panel.request_index(i)

    def _on_hover_left(self):
        if self.pinned_index is not None:
            self.moment_panel.request_index(self.pinned_index)

    def _on_timeline_click(self, row: int, i: int, x: float):
        self.pinned_index = i
        self.moment_panel.show_index(i)
        self.select_row(row, source="timeline")

    def clear_selection(self):
        self.select_row(-1)
        self.timeline.clear_mark()

    def select_row(self, row: int, source: str = "api"):
        """Select an allocation everywhere: stack panel, timeline highlight, table."""
        if self.data is None:
            return
        self.selected_row = row
        self.act_note_alloc.setEnabled(self.store is not None and row >= 0)
        self.stack_panel.set_row(row)
        self.timeline.select_row(row)
        if source != "table":
            self.table_panel.select_row(row)
        if row >= 0:
            if source in ("table", "moment"):
                self._show_row(row)
            if source != "timeline":
                self.docks["selection"].raise_()

    def _show_row(self, row: int):
        """Move the timeline to an allocation's lifetime, with context around it."""
        d = self.data
        first, last = d.row_span(row)
        xa = float(d.x_of_index(first)) if d.alloc_index[row] >= 0 else d.x_range[0]
        xb = float(d.x_of_index(last)) if d.free_index[row] >= 0 else d.x_range[1]
        full = d.x_range[1] - d.x_range[0]
        width = max(3 * (xb - xa), full / 400 if full > 0 else 1.0)
        c = (xa + xb) / 2
        self.timeline._auto_y = True
        self.timeline.set_x_range(c - width / 2, c + width / 2)
        self.timeline.set_cursor_index(max(int(d.alloc_index[row]), 0))
        self.pinned_index = int(d.alloc_index[row])
        self.moment_panel.show_index(self.pinned_index)

    def navigate(self, k: int):
        """Go to finding k: zoom there, put the cursor on it, select its allocation."""
        d = self.data
        if d is None or not (0 <= k < len(d.findings)):
            return
        f = d.findings[k]
        self.finding_pos = k
        self.timeline.zoom_to_indices(*f.zoom)
        self.timeline.set_cursor_index(f.index)
        self.pinned_index = f.index
        self.moment_panel.show_index(f.index)
        self.findings_panel.select(k)
        if f.row >= 0:
            self.select_row(f.row, source="finding")
        self.statusBar().showMessage(f"{f.title} — {f.detail}", 10000)

    def preview(self):
        """The whole run with the peak under the cursor and its allocation selected
        (what a screenshot shows)."""
        d = self.data
        if d is None:
            return
        self.timeline.reset_view()
        peak = next((f for f in d.findings if f.kind == "peak"), None)
        if peak is not None:
            self.timeline.set_cursor_index(peak.index)
            self.pinned_index = peak.index
            self.moment_panel.show_index(peak.index)
            if peak.row >= 0:
                self.select_row(peak.row, source="timeline")

    def jump_to_peak(self):
        if self.data is not None:
            k = next((i for i, f in enumerate(self.data.findings) if f.kind == "peak"), -1)
            self.navigate(k)

    def step_finding(self, step: int):
        if self.data is None or not self.data.findings:
            return
        n = len(self.data.findings)
        k = (self.finding_pos + step) % n if self.finding_pos >= 0 else (0 if step > 0 else n - 1)
        self.navigate(k)

    def focus_filter(self):
        self.docks["allocations"].show()
        self.docks["allocations"].raise_()
        self.table_panel.text.setFocus()
        self.table_panel.text.selectAll()

    # -- annotations ------------------------------------------------------------------------------------
    def _use_store(self, path: str):
        """The notes of `path` (kept when the same file is reopened or another device shown)."""
        path = os.path.abspath(path)
        if self.store is not None and self.store.snapshot_path == path:
            self._refresh_notes()
            return
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.store = None
        problems = []
        try:
            self.store = AnnotationStore(path)
        except Exception as e:     # notes never stop a snapshot from opening
            problems.append(f"Notes are off for this file: {_one_line(e)}")
        if self.store is not None:
            self._unsubscribe = self.store.subscribe(self._on_store_event)
            problems.extend(self.store.warnings)
        self._notes_problems = problems
        self._update_notice()
        self._refresh_notes()

    def _update_notice(self):
        """Say where the notes go when that is not next to the snapshot (a read-only folder)."""
        text = location_notice(self.store)
        parts = [t for t in [text] + self._notes_problems if t]
        full = " ".join(parts) or None
        changed = full != self.notes_notice
        self.notes_notice = full
        self.notes_panel.set_notice(full)
        if text:
            self.status_notes.setText("✎ notes: user data folder")
            self.status_notes.setToolTip(text)
            self.status_notes.show()
        else:
            self.status_notes.hide()
        if changed and full and self.data is not None:
            self.statusBar().showMessage(self._short_notice(), 20000)

    def _short_notice(self) -> str:
        """The notice for the status bar (its permanent labels leave little room)."""
        return location_notice(self.store, short=True) or (self._notes_problems[0] if self._notes_problems else "")

    def _on_store_event(self, event: str, ann):
        self._refresh_notes()

    def _refresh_notes(self):
        notes = list(self.store) if self.store is not None else []
        self.notes_panel.set_notes(notes, self.data)
        if self.data is not None:
            self.timeline.set_notes(notes)
        dock = self.docks["annotations"]
        dock.setWindowTitle(f"Annotations ({len(notes)})" if notes else "Annotations")
        self._update_note_actions()

    def _ask_note(self, title: str, label: str, text: str = "") -> str | None:
        text, ok = QInputDialog.getMultiLineText(self, title, label, text)
        return text.strip() if ok else None

    def _change_notes(self, fn, *args, **kw):
        """Run one store change; a failed save is a message, never a traceback."""
        if self.store is None:
            return None
        try:
            return fn(*args, **kw)
        except OSError as e:
            self._show_error("Cannot save the notes",
                             f"The notes could not be saved to {self.store.path}: {e.strerror or e}")
            return None
        finally:
            self._update_notice()
            self._update_note_actions()

    def _add_note(self, ann: Annotation, title: str, default: str):
        note = self._ask_note(title, f"Note on {ann.where()}:", default)
        if note is None:
            return None
        ann.note = note
        added = self._change_notes(self.store.add, ann)
        if added is not None:
            self.notes_panel.select(added.id)
            self.timeline.set_current_note(added.id)
            self.docks["annotations"].show()
            self.docks["annotations"].raise_()
            self.statusBar().showMessage(f"Note added on {added.where()}, saved to {self.store.path}", 8000)
        return added

    def _entries_in(self, x0: float, x1: float) -> tuple[int, int] | None:
        d = self.data
        if d is None or d.n == 0:
            return None
        first = max(0, int(d.index_at_x(x0)))
        last = min(d.n - 1, d.index_before_x(x1))
        return (first, last) if last >= first else None

    def annotate_range(self):
        """A note on the range marked with Ctrl+drag, or else on the visible range."""
        d = self.data
        if d is None or self.store is None:
            return
        marked = self.timeline.marked_range()
        span = self._entries_in(*(marked or self.timeline.x_span()))
        if span is None:
            self.statusBar().showMessage("No trace entries in that range", 5000)
            return
        first, last = span
        fields = dict(kind="range", device=d.device, start_index=first, end_index=last)
        if d.has_time:
            fields.update(start_us=int(d.tkey[first]), end_us=int(d.tkey[last]))
        peak_bytes, peak_i = d.range_peak(first, last)
        default = f"up to {fmt_bytes(peak_bytes)} live (entry {peak_i:,})"
        what = "marked range" if marked else "visible range"
        if self._add_note(Annotation(**fields), f"Annotate the {what}", default) is not None and marked:
            self.timeline.clear_mark()

    def annotate_peak(self):
        """A note on the peak last navigated to (P, N), else the highest one."""
        d = self.data
        if d is None or self.store is None:
            return
        cur = d.findings[self.finding_pos] if 0 <= self.finding_pos < len(d.findings) else None
        f = cur if cur is not None and cur.kind in ("peak", "iteration_peak") else \
            next((f for f in d.findings if f.kind == "peak"), None)
        i = f.index if f is not None else d.peak_index
        fields = dict(kind="peak", device=d.device, index=int(i))
        if d.has_time and i >= 0:
            fields["time_us"] = int(d.tkey[i])
        default = f.title if f is not None else f"Peak {fmt_bytes(d.peak_bytes)}"
        self._add_note(Annotation(**fields), "Annotate the peak", default)

    def annotate_allocation(self):
        d, row = self.data, self.selected_row
        if d is None or self.store is None:
            return
        if row < 0:
            self.statusBar().showMessage("Select an allocation first: click the timeline or a table row", 5000)
            return
        ann = Annotation(kind="allocation", device=d.device, alloc_index=int(d.alloc_index[row]),
                         addr=int(d.allocs.addr[row]))
        sid = int(d.allocs.stack[row])
        where = " ".join(d.stack_label(sid).split()) if sid >= 0 else ""
        default = f"{d.category_name(int(d.category[row]))} {fmt_bytes(int(d.allocs.size[row]))}" + \
            (f" from {where}" if where else "")
        self._add_note(ann, "Annotate the allocation", default)

    def edit_note(self, ann_id: str | None = None):
        if self.store is None:
            return
        ann_id = ann_id if isinstance(ann_id, str) else self.notes_panel.current_id()
        if ann_id is None:
            return
        ann = self.store.get(ann_id)
        note = self._ask_note("Edit note", f"Note on {ann.where()}:", ann.note)
        if note is not None and note != ann.note:
            self._change_notes(self.store.set_note, ann_id, note)

    def delete_note(self):
        ann_id = self.notes_panel.current_id()
        if self.store is None or ann_id is None:
            return
        where = self.store.get(ann_id).where()
        self._change_notes(self.store.remove, ann_id)
        self.statusBar().showMessage(f"Note on {where} deleted (Ctrl+Z undoes)", 6000)

    def undo_note(self):
        if self.store is not None and self.store.can_undo:
            self._change_notes(self.store.undo)
            self.statusBar().showMessage("Undone", 3000)

    def redo_note(self):
        if self.store is not None and self.store.can_redo:
            self._change_notes(self.store.redo)
            self.statusBar().showMessage("Redone", 3000)

    def go_to_note(self, ann_id: str):
        """Show a note on the timeline: its range, its peak, its allocation."""
        d = self.data
        if self.store is None or d is None:
            return
        try:
            ann = self.store.get(ann_id)
        except KeyError:
            return
        self.notes_panel.select(ann_id)
        span = note_span(d, ann)
        if span is None:
            self.statusBar().showMessage(
                f"This note is on cuda:{ann.device}: choose it in the Device box to see it"
                if ann.device is not None and ann.device != d.device else "This note cannot be placed on the trace",
                6000)
            return
        self.timeline.set_current_note(ann_id)
        first, last = span
        if ann.kind == "allocation" and note_row(d, ann) >= 0:
            row = note_row(d, ann)
            self.select_row(row, source="annotation")
            self._show_row(row)
        elif ann.kind == "range":
            self.timeline.zoom_to_indices(max(first, 0), max(last, 0))
        else:
            self.timeline.zoom_to_indices(*d._zoom_around(first))
            self.timeline.set_cursor_index(first)
            self.pinned_index = first
            self.moment_panel.show_index(first)
        self.statusBar().showMessage(f"{ann.where()}: {first_line(ann.note, 120)}", 10000)

    def _on_marked(self, x0: float, x1: float):
        span = self._entries_in(x0, x1)
        if span is not None:
            self.statusBar().showMessage(
                f"Marked entries {span[0]:,}–{span[1]:,}: press A to annotate, File > Export Trimmed Snapshot "
                "to save them, Esc to clear", 10000)

    # -- exports ------------------------------------------------------------------------------------------
    def _export_start(self) -> str:
        if self.path:
            return os.path.dirname(self.path)
        return self.settings.value("last_dir", "") if self.settings is not None else ""

    def _base_name(self) -> str:
        return os.path.splitext(os.path.basename(self.path or "vramscope"))[0]

    def _run_export(self, what: str, fn):
        """Run an export on the GUI thread (the PNG needs Qt) under a busy cursor;
        errors become a message box."""
        self.statusBar().showMessage(f"Writing the {what}…")
        self.statusBar().repaint()
        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            return fn()
        except Exception as e:
            if not isinstance(e, (OSError, ValueError)):
                traceback.print_exc(file=sys.stderr)
            self.statusBar().showMessage(f"Could not write the {what}", 5000)
            self._show_error(f"Cannot export the {what}", _one_line(e))
            return None
        finally:
            QApplication.restoreOverrideCursor()

    def _show_error(self, title: str, msg: str):
        self._close_error()
        box = QMessageBox(QMessageBox.Icon.Warning, title, msg, QMessageBox.StandardButton.Ok, self)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.open()
        self.error_box = box

    def export_report(self):
        """report.md + timeline.png (notes drawn) + analysis.json into a folder, like `vramscope report`."""
        if self.result is None:
            return
        out = QFileDialog.getExistingDirectory(self, "Export report into folder", self._export_start())
        if not out:
            return
        from ..services.report import write_report
        from .report_png import render_timeline
        notes = list(self.store) if self.store is not None else None     # None: the report reads the sidecar
        paths = self._run_export("report", lambda: write_report(self.result.analysis, out, annotations=notes,
                                                                render_png=render_timeline))
        if paths:
            self.statusBar().showMessage(
                f"Report written to {out}: " + ", ".join(os.path.basename(p) for p in paths), 15000)

    def _save_path(self, title: str, suggested: str, filt: str, ext: str) -> str | None:
        path, _ = QFileDialog.getSaveFileName(self, title, os.path.join(self._export_start(), suggested), filt)
        if not path:
            return None
        return path if os.path.splitext(path)[1] else path + ext

    def export_trimmed(self):
        """A window of the shown device's trace as a snapshot pickle: the marked range,
        the visible range (when zoomed in) or the entries around the peak."""
        d = self.data
        if self.result is None or d is None or d.n == 0:
            return
        from ..services.export import export_trimmed, window_around
        choices = []
        marked = self.timeline.marked_range()
        if marked is not None and (span := self._entries_in(*marked)) is not None:
            choices.append((f"The marked range: entries {span[0]:,}–{span[1]:,}", span))
        span = self._entries_in(*self.timeline.x_span())
        if span is not None and span[1] - span[0] + 1 < d.n:
            choices.append((f"The visible range: entries {span[0]:,}–{span[1]:,}", span))
        s, e = window_around(d.n, max(d.peak_index, 0), TRIM_WINDOW)
        choices.append((f"{e - s + 1:,} entries around the peak: entries {s:,}–{e:,}", (s, e)))
        if len(choices) > 1:
            item, ok = QInputDialog.getItem(self, "Export trimmed snapshot", f"Which entries of cuda:{d.device}:",
                                            [c[0] for c in choices], 0, False)
            if not ok:
                return
            span = next((c[1] for c in choices if c[0] == item), choices[0][1])
        else:
            span = choices[0][1]
        path = self._save_path("Export trimmed snapshot", f"{self._base_name()}.trimmed.pickle",
                               "Memory snapshots (*.pickle)", ".pickle")
        if not path:
            return
        snap = self.result.snapshot
        info = self._run_export("trimmed snapshot",
                                lambda: export_trimmed(snap, path, device=d.device, start=span[0], end=span[1]))
        if info:
            self.statusBar().showMessage(
                f"Wrote entries {info['start']:,}–{info['end']:,} of cuda:{info['device']} to {path} "
                f"({fmt_bytes(info['bytes'])})", 15000)

    def export_perfetto(self):
        """Live bytes per category as Perfetto counter tracks, every device."""
        if self.result is None:
            return
        from ..services.export import export_perfetto
        path = self._save_path("Export Perfetto trace", f"{self._base_name()}.perfetto.json",
                               "Chrome trace JSON (*.json)", ".json")
        if not path:
            return
        info = self._run_export("Perfetto trace", lambda: export_perfetto(self.result.analysis, path))
        if info:
            self.statusBar().showMessage(
                f"Wrote {info['counter_events']:,} counter events to {path}: open it in ui.perfetto.dev", 15000)

    # -- misc ----------------------------------------------------------------------------------------------
    def export_image(self):
        start = self.settings.value("last_dir", "") if self.settings is not None else ""
        base = os.path.splitext(os.path.basename(self.path or "vramscope"))[0]
        path, _ = QFileDialog.getSaveFileName(self, "Save image", os.path.join(start or "", base + ".png"),
                                              "PNG images (*.png)")
        if path:
            self.grab().save(path, "PNG")

    def show_shortcuts(self):
        rows = [("Ctrl+O", "open a snapshot"), ("F5", "reload"), ("Ctrl+E", "save the window as PNG"),
                ("Ctrl+Shift+E", "export a report (Markdown, PNG, JSON)"),
                ("+ / -", "zoom in / out"), ("Home, Ctrl+0", "show the whole run"),
                ("← / →", "pan (timeline focused)"), ("wheel", "zoom time around the cursor"),
                ("drag", "zoom into a box"), ("Shift+drag, middle-drag", "pan"),
                ("Ctrl+drag", "mark a time range"),
                ("click", "select the allocation under the cursor"), ("P", "jump to the peak"),
                ("N / Shift+N", "next / previous finding"), ("Esc", "clear the selection and the marked range"),
                ("A", "annotate the marked (else the visible) range"), ("Shift+P", "annotate the peak"),
                ("Shift+A", "annotate the selected allocation"),
                ("F2 / Del", "edit / delete the note chosen in Annotations"),
                ("Ctrl+Z / Ctrl+Shift+Z", "undo / redo a change to the notes"),
                ("Ctrl+F", "search the stacks"), ("Ctrl+1…5", "show / hide panels")]
        html = "<table>" + "".join(f"<tr><td><b>{k}</b>&nbsp;&nbsp;</td><td>{v}</td></tr>" for k, v in rows) + "</table>"
        box = QMessageBox(QMessageBox.Icon.NoIcon, "Keyboard shortcuts", html, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def show_about(self):
        from .. import __version__
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About vramscope",
                          f"<b>vramscope {__version__}</b><br>PyTorch CUDA memory snapshots: categories, "
                          "peaks, leaks and OOMs, on little RAM.", QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def closeEvent(self, ev):
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.loader.shutdown()
        self._hide_progress()
        self._close_error()
        if self.settings is not None:
            self.settings.setValue("window/geometry", self.saveGeometry())
            self.settings.setValue("window/state", self.saveState())
        super().closeEvent(ev)
        if ev.isAccepted():
            self.timeline.release()


def _one_line(e: BaseException) -> str:
    """An exception for a message box: expected failures as they are, others marked."""
    text = error_text(e)
    return text if isinstance(e, (OSError, ValueError)) else f"unexpected error ({type(e).__name__}: {text})"
