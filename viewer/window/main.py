"""The main window: timeline in the middle, panels around it, loading in the background."""
from __future__ import annotations

import os

from PySide6.QtCore import QEvent, QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QDockWidget,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressDialog,
    QPushButton,
    QStackedWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from ...common.units import fmt_bytes
from ...present.markup import html as _esc
from ...present.markup import middle
from ...present.words import peak_words
from ...services.annotations import AnnotationStore
from ..panels.allocator import AllocatorPanel
from ..panels.compare import ComparePanel
from ..panels.devices import DeviceStrip
from ..panels.whatif import WhatIfPanel
from ..panels.legend import LegendBar
from ..model.load import LoadResult
from ..model import DeviceData
from ..panels.findings import FindingsPanel
from ..panels.moment import MomentPanel
from ..panels.notes import NotesPanel
from ..panels.selection import StackPanel
from .status_bar import StatusBar
from ..panels.table import AllocationsPanel
from ..theme import Theme
from ..timeline import TimelineWidget
from .compare import CompareMixin
from .exports import ExportsMixin
from .loading import LoadingMixin
from .notes import NotesMixin
from .docks import ViewsMixin
from ..worker import Loader

PAGE_WELCOME, PAGE_TIMELINE, PAGE_EMPTY = range(3)
# what the store's undo/redo commands do, for the Edit menu's "Undo Add Note"
STATUS_NAME_LIMIT = 40         # characters of the file name in the status bar
# the mouse's keys, longest first: the status bar shows the longest that fits the window
MOUSE_HINTS = (
    "Wheel: zoom · drag: box zoom · Shift+drag: pan · Ctrl+drag: mark a range · click: select · F1: keys",
    "Wheel: zoom · drag: box zoom · Shift+drag: pan · Ctrl+drag: mark · F1: keys",
    "Wheel: zoom · Shift+drag: pan · F1: keys",
    "F1: keys",
)
_COMMAND_NAMES = {"_Add": "Add Note", "_Remove": "Delete Note", "_Edit": "Edit Note"}


class MainWindow(LoadingMixin, ViewsMixin, NotesMixin, ExportsMixin, CompareMixin, QMainWindow):
    """Pass persist=False to leave the user's settings alone (screenshots, tests)."""

    loaded = Signal()
    compared = Signal()          # a comparison is shown (File > Compare With…, Swap)

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
        self._pending_what = "open"
        self.compare = None
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
        self.device_strip = DeviceStrip(self)
        self.device_strip.chosen.connect(self.show_device)
        page = QWidget(self)
        pl = QVBoxLayout(page)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.setSpacing(0)
        pl.addWidget(self.device_strip)
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
        # a file that records nothing: say so, with its name (not the welcome page)
        self.empty_page = QWidget(self)
        ep = QVBoxLayout(self.empty_page)
        self.empty_msg = QLabel(self.empty_page)
        self.empty_msg.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_msg.setWordWrap(True)
        self.empty_msg.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        other_btn = QPushButton("Open another snapshot…", self.empty_page)
        other_btn.clicked.connect(self.open_dialog)
        ep.addStretch(1)
        ep.addWidget(self.empty_msg)
        ep.addWidget(other_btn, 0, Qt.AlignmentFlag.AlignHCenter)
        ep.addStretch(2)
        self.stack = QStackedWidget(self)
        self.stack.addWidget(self.placeholder)
        self.stack.addWidget(page)
        self.stack.addWidget(self.empty_page)
        self.setCentralWidget(self.stack)
        self._docks_shown: set[str] | None = None

        # panels
        self.stack_panel = StackPanel(self)
        self.moment_panel = MomentPanel(self)
        self.findings_panel = FindingsPanel(self)
        self.table_panel = AllocationsPanel(self)
        self.notes_panel = NotesPanel(self)
        self.allocator_panel = AllocatorPanel(self)
        self.whatif_panel = WhatIfPanel(self)
        self.compare_panel = ComparePanel(self)
        self.docks = {}
        for key, title, widget, area in (
                ("selection", "Selection", self.stack_panel, Qt.DockWidgetArea.RightDockWidgetArea),
                ("moment", "At this moment", self.moment_panel, Qt.DockWidgetArea.RightDockWidgetArea),
                ("findings", "Findings", self.findings_panel, Qt.DockWidgetArea.RightDockWidgetArea),
                ("allocations", "Allocations", self.table_panel, Qt.DockWidgetArea.BottomDockWidgetArea),
                ("annotations", "Annotations", self.notes_panel, Qt.DockWidgetArea.BottomDockWidgetArea),
                ("allocator", "Allocator", self.allocator_panel, Qt.DockWidgetArea.BottomDockWidgetArea),
                ("whatif", "What if", self.whatif_panel, Qt.DockWidgetArea.BottomDockWidgetArea),
                ("compare", "Compare", self.compare_panel, Qt.DockWidgetArea.BottomDockWidgetArea)):
            dock = QDockWidget(title, self)
            dock.setObjectName(f"dock_{key}")
            dock.setWidget(widget)
            self.addDockWidget(area, dock)
            self.docks[key] = dock
            dock.visibilityChanged.connect(lambda on, k=key: self._on_dock_visible(k, on))
        # right column: findings above the selection / moment tabs; the table below everything
        self.splitDockWidget(self.docks["findings"], self.docks["selection"], Qt.Orientation.Vertical)
        self.tabifyDockWidget(self.docks["selection"], self.docks["moment"])
        # the notes share the bottom with the table: a wide list, and the right column keeps its height
        self.tabifyDockWidget(self.docks["allocations"], self.docks["annotations"])
        self.tabifyDockWidget(self.docks["annotations"], self.docks["allocator"])
        self.tabifyDockWidget(self.docks["allocator"], self.docks["whatif"])
        self.tabifyDockWidget(self.docks["whatif"], self.docks["compare"])
        self.docks["compare"].hide()               # until File > Compare With…
        # the right column runs the full height; the table sits under the timeline only
        self.setCorner(Qt.Corner.BottomRightCorner, Qt.DockWidgetArea.RightDockWidgetArea)
        self.setCorner(Qt.Corner.TopRightCorner, Qt.DockWidgetArea.RightDockWidgetArea)
        self._relayout = QTimer(self)
        self._relayout.setSingleShot(True)
        self._relayout.setInterval(30)
        self._relayout.timeout.connect(self.default_layout)
        self.docks["selection"].raise_()
        self.docks["allocations"].raise_()

        self.timeline.hovered.connect(self._on_hover)
        self.timeline.clicked.connect(self._on_timeline_click)
        self.timeline.hoverLeft.connect(self._on_hover_left)
        self.table_panel.rowSelected.connect(lambda r: self.select_row(r, source="table"))
        self.moment_panel.rowClicked.connect(lambda r: self.select_row(r, source="moment"))
        self.findings_panel.activated.connect(self.navigate)
        self.table_panel.onlyCleared.connect(self._on_only_cleared)
        self.notes_panel.activated.connect(self.go_to_note)
        self.notes_panel.editRequested.connect(self.edit_note)
        self.notes_panel.tree.currentItemChanged.connect(lambda *_: self._update_note_actions())
        self.timeline.marked.connect(self._on_marked)
        self.timeline.segmentClicked.connect(self._on_segment_clicked)
        self.allocator_panel.indexChanged.connect(self._on_allocator_step)
        self.allocator_panel.rowClicked.connect(lambda r: self.select_row(r, source="allocator"))
        self.docks["allocator"].visibilityChanged.connect(self._on_allocator_visible)
        self.docks["whatif"].visibilityChanged.connect(self._on_whatif_visible)
        self.whatif_panel.changed.connect(self._on_whatif)
        self.compare_panel.swapRequested.connect(self.swap_compared)
        self.compare_panel.closeRequested.connect(self.close_compare)
        self.compare_panel.siteChosen.connect(self._on_compare_site)

        self._build_actions()
        self._build_status()
        self.apply_theme()
        self.resize(1400, 900)
        self._auto_layout = True
        self.default_layout()
        if self.settings is not None:
            geo = self.settings.value("window/geometry")
            state = self.settings.value("window/state")
            if geo is not None:
                self.restoreGeometry(geo)
            if state is not None:
                self.restoreState(state)
                self._auto_layout = False          # the user's own layout
                self.docks["compare"].hide()       # nothing to compare yet
        self._show_docks(False)                    # the welcome page alone

    def default_layout(self):
        """Dock sizes in proportion to the window: the right column (findings above the
        selection) runs the full height, the table gets about a third of it below the
        timeline, so at 1024x700 it still shows eight rows and the timeline most of the rest."""
        w, h = self.width(), self.height()
        right = max(280, min(440, int(w * 0.27)))
        column = max(300, h - self.menuBar().height() - self.toolbar.height() - self.statusBar().height() - 8)
        self.resizeDocks([self.docks["findings"]], [right], Qt.Orientation.Horizontal)
        self.resizeDocks([self.docks["findings"], self.docks["selection"]],
                         [int(column * 0.40), int(column * 0.60)], Qt.Orientation.Vertical)
        self.resizeDocks([self.docks["allocations"]], [max(180, int(h * 0.40))], Qt.Orientation.Vertical)
        self._auto_layout = getattr(self, "_auto_layout", True)

    def _follow_window(self):
        if getattr(self, "_auto_layout", False) and not getattr(self, "_user_layout", False):
            self._relayout.start()

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        # the docks follow the window until the user drags a separator (their sizes then stay)
        self._follow_window()
        # a hint on show stays whole: its shorter wording when the window narrows
        shown = self.statusBar().currentMessage()
        for variants in getattr(self, "_hint_sets", ()):
            if shown in variants and self._fitting(variants) != shown:
                self.statusBar().showMessage(self._fitting(variants), 12000)

    def showEvent(self, ev):
        super().showEvent(ev)
        self._follow_window()

    def event(self, ev):
        # a press that reaches the main window itself may be on a dock separator: when the
        # panels' sizes differ at the release, the user sized them by hand (they then stay);
        # a stray click on the window's background changes nothing
        if ev.type() == QEvent.Type.MouseButtonPress:
            self._sizes_at_press = self._dock_sizes()
        elif ev.type() == QEvent.Type.MouseButtonRelease and getattr(self, "_sizes_at_press", None) is not None:
            if self._dock_sizes() != self._sizes_at_press:
                self._user_layout = True
            self._sizes_at_press = None
        return super().event(ev)

    def _dock_sizes(self) -> tuple:
        return tuple((k, d.width(), d.height()) for k, d in self.docks.items() if d.isVisible())

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
        self._build_compare_actions(fm)
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
        self.mode_group = QActionGroup(self)
        self.mode_group.setExclusive(True)
        self.mode_actions = {}
        for mode, text, key, tip in (
                ("categories", "Stack by &Category", "C", "Live memory stacked by category"),
                ("allocations", "Stack by A&llocation", "L",
                 "Every live allocation as its own band, oldest at the bottom, coloured by category "
                 "(as PyTorch's memory_viz Active Memory Timeline); hover or click a band for its allocation"),
                ("segments", "Stack by &Segment", "S",
                 "The allocator's reserved memory, each segment a band (by stream, or small / large pool); "
                 "click one for its blocks in the Allocator panel")):
            a = self._act(vm, text, lambda _=False, m=mode: self.set_mode(m), [key], tip, checkable=True)
            a.setIconText(text.replace("&", "").replace("Stack by ", "") + "s" if mode != "categories"
                          else "Categories")
            self.mode_group.addAction(a)
            self.mode_actions[mode] = a
        self.mode_actions["categories"].setChecked(True)
        self.timeline.modeChanged.connect(self._on_mode_changed)
        vm.addSeparator()
        self.act_time_axis = self._act(
            vm, "&Time Axis", self._on_time_axis, ["T"],
            "Seconds on the x axis (checked) or trace entries; entries are chosen when one idle stretch "
            "takes most of the run's time", checkable=True)
        vm.addSeparator()
        for n, key in enumerate(("selection", "moment", "findings", "allocations", "annotations", "allocator",
                                 "whatif", "compare"), 1):
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
        # short labels: the toolbar fits a 1024-pixel window (menus and tooltips say it all)
        for a, text in ((self.act_zoom_in, "Zoom +"), (self.act_zoom_out, "Zoom −"), (self.act_reset, "Whole Run"),
                        (self.act_peak, "Peak"), (self.act_prev, "◂ Finding"), (self.act_next, "Finding ▸")):
            a.setIconText(text)
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
        for mode in ("categories", "allocations", "segments"):
            tb.addAction(self.mode_actions[mode])
        tb.addSeparator()
        tb.addAction(self.act_peak)
        tb.addAction(self.act_prev)
        tb.addAction(self.act_next)
        self.addToolBar(tb)
        self.toolbar = tb
        self._set_loaded_actions(False)

    def _set_loaded_actions(self, on: bool):
        for a in self.mode_actions.values():
            a.setEnabled(on)
        if on and self.data is not None and not self.data.segments_known:
            self.mode_actions["segments"].setEnabled(False)
        for a in (self.act_reload, self.act_zoom_in, self.act_zoom_out, self.act_reset, self.act_peak,
                  self.act_next, self.act_prev, self.act_export, self.act_export_report, self.act_export_trimmed,
                  self.act_export_perfetto, self.act_compare):
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
        sb = StatusBar(self)
        self.setStatusBar(sb)
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
            # a gap between a temporary message and the labels (Qt draws the message right up
            # to the first permanent widget), and between the labels themselves
            w.setContentsMargins(14, 0, 2, 0)
            sb.add_label(w, yields=w in (self.status_file, self.status_device, self.status_entries))
        self.status_notes.hide()
        self._mark_message = None
        self._hint_sets: list[tuple[str, ...]] = []       # status hints that have shorter wordings

    def _fitting(self, variants: tuple[str, ...]) -> str:
        """The longest of `variants` (longest first) that fits beside the status bar's labels."""
        sb = self.statusBar()
        room = sb.room(with_all_labels=True)
        fm = sb.fontMetrics()
        return next((v for v in variants if fm.horizontalAdvance(v) <= room), variants[-1])

    def _update_status(self):
        d = self.data
        if self.path is None:
            for w in (self.status_file, self.status_device, self.status_entries, self.status_peak):
                w.setText("")
            return
        # a long name would hold the window wider than a small screen: cut in the middle
        self.status_file.setText(middle(os.path.basename(self.path), STATUS_NAME_LIMIT))
        self.status_file.setToolTip(f"The open file: {self.path}")
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
        self.compare_panel.apply_theme(self.theme)

    def changeEvent(self, ev):
        if ev.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            QTimer.singleShot(0, self.apply_theme)
        super().changeEvent(ev)

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
        self.device_strip.set_analysis(result.analysis, result.device)
        self._compare_follows(result)
        self.legend.set_data(d)
        self.timeline.set_data(d, self.legend.visible() if d is not None else [])
        self.legend.set_mode(self.timeline.mode)
        self.stack_panel.set_data(d)
        self.moment_panel.set_data(d)
        self.findings_panel.set_data(d)
        self.table_panel.set_data(d)
        self.allocator_panel.set_data(d)
        self.whatif_panel.set_data(d)
        if d is not None:
            QTimer.singleShot(0, self._whatif_if_shown)
        if d is not None:
            self.stack.setCurrentIndex(PAGE_TIMELINE)
        else:
            self.empty_msg.setText(
                f"<h3>{_esc(os.path.basename(result.path))}</h3><p>This snapshot records no memory on any device: "
                "no trace entries and no allocator segments. It was probably dumped before anything was allocated "
                "on the GPU, or from a process that never used it, or without "
                "<code>torch.cuda.memory._record_memory_history()</code> turned on.</p>")
            self.stack.setCurrentIndex(PAGE_EMPTY)
        self._show_docks(d is not None)
        self._use_store(result.path)
        self._set_loaded_actions(d is not None)
        self.act_reload.setEnabled(True)
        self.setWindowTitle(f"{os.path.basename(result.path)} — vramscope")
        self._update_status()
        if d is not None:
            self.act_time_axis.setChecked(d.time_axis)
            self.act_time_axis.setEnabled(d.has_time)
            self.moment_panel.show_index(max(d.peak_index, -1))
            notice = self._axis_notice()
            self._hint_sets = [(notice, "x axis in entries (T: seconds)") if notice else MOUSE_HINTS]
            self.statusBar().showMessage(self._fitting(self._hint_sets[0]), 12000)
        else:
            self.statusBar().showMessage("This snapshot records no memory on any device.", 8000)
        if self.notes_notice:
            self.statusBar().showMessage(self._short_notice(), 20000)
        self._add_recent(result.path)
        self.loaded.emit()

    # -- interaction ------------------------------------------------------------------------------------
    def _on_legend(self):
        if self.data is not None:
            self.timeline.set_visible_categories(self.legend.visible())

    def _on_hover(self, row: int, i: int, x: float):
        if self.on_screen("moment"):
            self.moment_panel.request_index(i)

    def _on_hover_left(self):
        if self.pinned_index is not None:
            self.moment_panel.request_index(self.pinned_index)

    def _on_timeline_click(self, row: int, i: int, x: float):
        self.pinned_index = i
        self.moment_panel.show_index(i)
        if self.on_screen("allocator"):
            self.allocator_panel.show_index(i)
        if row < 0 and self.timeline.mode == "segments":
            return          # a segment picked: the selected allocation stays
        self.select_row(row, source="timeline")

    def clear_selection(self):
        self.select_row(-1)
        self.timeline.clear_mark()
        # the marked range's instructions go with it
        if self._mark_message is not None and self.statusBar().currentMessage() == self._mark_message:
            self.statusBar().clearMessage()
        self._mark_message = None

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
        if self.on_screen("allocator"):
            self.allocator_panel.show_index(f.index)
        self.findings_panel.select(k)
        self._show_finding_rows(f)
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

    # -- misc ----------------------------------------------------------------------------------------------
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
                ("Ctrl+F", "search the stacks (file, function, file.py:line)"),
                ("C / L / S", "stack by category / allocation / segment"),
                ("T", "seconds or trace entries on the x axis"),
                ("← / → in Allocator", "step one entry (Ctrl: to the previous / next segment event)"),
                ("Ctrl+Return", "save a note"), ("Ctrl+1…8", "show / hide panels")]
        html = "<table>" + "".join(f"<tr><td><b>{k}</b>&nbsp;&nbsp;</td><td>{v}</td></tr>" for k, v in rows) + "</table>"
        box = QMessageBox(QMessageBox.Icon.NoIcon, "Keyboard shortcuts", html, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def show_about(self):
        from ... import __version__
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About vramscope",
                          f"<b>vramscope {__version__}</b><br>PyTorch CUDA memory snapshots: categories, "
                          "peaks, leaks and OOMs, on little RAM.", QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def closeEvent(self, ev):
        self._show_docks(True)          # the layout saved is the user's, not the welcome page's
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
            self.compare_panel.release()
