"""The main window: the timeline in the middle, the panels around it, the menus.

It is built from parts, each an object with a small job that the window owns:
  loading  (loading.py)  open, reload, another device, drop, Open Recent; the worker and its progress
  exports  (exports.py)  File > Export…, on their own worker
  notes    (notes.py)    the notes' store and the Edit menu's note actions
  compare  (compare.py)  File > Compare With…, Swap, the Compare panel's sites
  layout   (docks.py)    the docks: arranged, sized with the window, shown with a file
What stays here is the window itself: its pages, menus and status bar, and what ties the
panels together (a selected allocation, the moment pinned, the finding navigated to).
"""
from __future__ import annotations

import os

from PySide6.QtCore import QEvent, QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QStackedWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from ...common import memory
from ...common.units import fmt_bytes
from ...present.markup import html as _esc
from ...present.markup import middle
from ...present.timeaxis import axis_reason, axis_reason_short
from ...present.words import count_words, guessed_text, leak_rows_text, peak_words
from ..model import DeviceData, FindingView
from ..model.load import LoadResult
from ..panels.allocator import AllocatorPanel
from ..panels.compare import ComparePanel
from ..panels.devices import DeviceStrip
from ..panels.findings import FindingsPanel
from ..panels.legend import LegendBar
from ..panels.memtree import MemoryTreePanel
from ..panels.moment import MomentPanel
from ..panels.notes import NotesPanel
from ..panels.selection import StackPanel
from ..panels.table import AllocationsPanel
from ..panels.whatif import WhatIfPanel
from ..theme import Theme
from ..timeline import TimelineWidget
from ..ranks_part import RanksPart
from .compare import Compare
from .dialogs import TextDialog
from .docks import COMPACT_BELOW, DOCKS, NO_OVERVIEW_BELOW, Docks, first_focusable
from .keys import PanelRing, help_rows, scope_keys
from .exports import Exports
from .loading import Loading, error_box
from .notes import Notes
from .screen_fit import DialogFitter, ScreenFit, fit, fits
from .status_bar import StatusBar

PAGE_WELCOME, PAGE_TIMELINE, PAGE_EMPTY = range(3)
STATUS_NAME_LIMIT = 40         # characters of the file name in the status bar
# the mouse's keys, longest first: the status bar shows the longest that fits the window
MOUSE_HINTS = (
    "Wheel: zoom · drag: box zoom · Shift+drag: pan · Ctrl+drag: mark a range · click: select · F1: keys",
    "Wheel: zoom · drag: box zoom · Shift+drag: pan · Ctrl+drag: mark · F1: keys",
    "Wheel: zoom · Shift+drag: pan · F1: keys",
    "F1: keys",
)
# F1 lists every action's keys (keys.help_rows), then these: the mouse, and the keys that
# belong to one panel (each a real binding: tests/test_viewer_keyboard.py presses them)
EXTRA_KEYS = (("Left / Right", "pan (timeline focused)"), ("Tab / Shift+Tab", "the next / previous panel"),
              ("Ctrl+Tab / Ctrl+Shift+Tab", "the next / previous control (inside a panel)"),
              ("wheel", "zoom time around the cursor"), ("drag", "zoom into a box"),
              ("Shift+drag, middle-drag", "pan"), ("Ctrl+drag", "mark a time range"),
              ("click", "select the allocation under the cursor"),
              ("← / → in Allocator", "step one entry (Ctrl: to the previous / next segment event)"),
              ("Page Up / Down in Allocator", "100 entries back / on"),
              ("↑ / ↓ in the event list", "the previous / next event (the map and the cursor follow)"),
              ("Memory tree", "click the timeline: what holds the memory there; Return in its search: "
                              "the next match; double-click: the allocations"),
              ("Ctrl+Return in a note", "save the note"))


def _hand_back_memory() -> None:
    """Once a file is shown: the cycles of the one it replaced collected, then the heap's free
    pages handed back (common/memory.py)."""
    memory.collect_garbage()
    memory.give_back_freed_pages()


class MainWindow(QMainWindow):
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
        self.mark_message: str | None = None               # the marked range's instructions, while shown
        self._hint_sets: list[tuple[str, ...]] = []        # status hints that have shorter wordings
        self.setWindowTitle("vramscope")
        self.setAcceptDrops(True)
        self.setDockNestingEnabled(True)

        # central: a page until something is loaded, then the device strip, legend and timeline
        self.timeline = TimelineWidget(self)
        self.legend = LegendBar(self)
        self.legend.toggled.connect(self._on_legend)
        self.device_strip = DeviceStrip(self)
        self.stack = QStackedWidget(self)
        self.stack.addWidget(self._welcome_page())
        self.stack.addWidget(self._timeline_page())
        self.stack.addWidget(self._empty_page())
        self.setCentralWidget(self.stack)

        # the panels, each in a dock
        self.stack_panel = StackPanel(self)
        self.moment_panel = MomentPanel(self)
        self.findings_panel = FindingsPanel(self)
        self.table_panel = AllocationsPanel(self)
        self.notes_panel = NotesPanel(self)
        self.allocator_panel = AllocatorPanel(self)
        self.memtree_panel = MemoryTreePanel(self)
        self.whatif_panel = WhatIfPanel(self)
        self.compare_panel = ComparePanel(self)
        self.dock_layout = Docks(self, {
            "selection": self.stack_panel, "moment": self.moment_panel, "findings": self.findings_panel,
            "allocations": self.table_panel, "annotations": self.notes_panel, "allocator": self.allocator_panel,
            "memtree": self.memtree_panel, "whatif": self.whatif_panel, "compare": self.compare_panel})
        self.docks = self.dock_layout.docks

        # the window and every dialog inside the screen; file dialogs wide enough, their sizes
        # and dates whole (screen_fit.py)
        self.screen_fit = ScreenFit(self)
        self.dialog_fit = DialogFitter(self)
        self.dialog_fit.install()

        # the parts
        self.loading = Loading(self)
        self.exports = Exports(self)
        self.notes = Notes(self)
        self.compare = Compare(self)
        self.ranks = RanksPart(self)                   # File > Open Folder…: the rank overview, a panel of its own

        self.device_strip.chosen.connect(self.loading.show_device)
        self.timeline.hovered.connect(self._on_hover)
        self.timeline.clicked.connect(self._on_timeline_click)
        self.timeline.hoverLeft.connect(self._on_hover_left)
        self.timeline.marked.connect(self.notes.on_marked)
        self.timeline.segmentClicked.connect(self._on_segment_clicked)
        self.table_panel.rowSelected.connect(lambda r: self.select_row(r, source="table"))
        self.table_panel.onlyCleared.connect(lambda: self.timeline.set_row_marks(None))
        self.moment_panel.rowClicked.connect(lambda r: self.select_row(r, source="moment"))
        self.findings_panel.activated.connect(self.navigate)
        self.notes_panel.activated.connect(self.notes.go_to)
        self.notes_panel.editRequested.connect(self.notes.edit)
        self.notes_panel.tree.currentItemChanged.connect(lambda *_: self.notes.update_actions())
        self.allocator_panel.indexChanged.connect(self._on_allocator_step)
        self.allocator_panel.said.connect(lambda text: self.statusBar().showMessage(text, 6000))
        self.allocator_panel.rowClicked.connect(lambda r: self.select_row(r, source="allocator"))
        self.docks["allocator"].visibilityChanged.connect(
            lambda on: on and QTimer.singleShot(0, self, self._allocator_if_shown))
        self.memtree_panel.allocationsChosen.connect(self._show_tree_rows)
        self.memtree_panel.peakRequested.connect(self.jump_to_peak)
        self.docks["memtree"].visibilityChanged.connect(
            lambda on: on and QTimer.singleShot(0, self, self._memtree_if_shown))
        # after the event loop turn: the panels shown again after a load pass through
        # "visible" on their way behind the table's tab, and must not build the model then
        self.docks["whatif"].visibilityChanged.connect(lambda on: on and QTimer.singleShot(0, self, self._whatif_if_shown))
        self.whatif_panel.changed.connect(self._on_whatif)
        self.mode_before_whatif: str | None = None        # the view mode the what-if drawing replaced
        self.compare_panel.swapRequested.connect(self.compare.swap)
        self.compare_panel.closeRequested.connect(self.compare.close)
        self.compare_panel.siteChosen.connect(self.compare.on_site)

        self._build_actions()
        self._build_status()
        self.apply_theme()
        lay = self.layout()
        if lay is not None:
            lay.activate()            # the minimum size now (the docks' first arrangement left 1531 pixels)
        self.resize(self.screen_fit.first_size())      # 1400x900, or the screen's available area
        self.default_layout()
        self._restore_panels()
        self.dock_layout.show_with_data(False)          # the welcome page alone
        if lay is not None:
            lay.activate()                              # the minimum size without the panels...
        self.resize(self.screen_fit.first_size())
        self._restore_geometry()                        # ...does not hold a restored window wide (1187 pixels)

    def _restore_panels(self):
        """The last session's panels; their sizes only when the user had sized them by hand
        (else they follow the window). Either way the plot keeps its room (Docks.keep_plot_room)."""
        state = self.settings.value("window/state") if self.settings is not None else None
        if state is not None and self.restoreState(state):
            user = str(self.settings.value("window/user_layout", "false")).lower() == "true"
            self.dock_layout.restored(user)
            self.docks["compare"].hide()        # nothing to compare yet
            self.ranks.dock.hide()              # no folder read yet (an empty Ranks tab came back)

    def _restore_geometry(self):
        """The last session's window where it fits the screen (one saved on a larger screen
        is not restored)."""
        geo = self.settings.value("window/geometry") if self.settings is not None else None
        if geo is None or not self.restoreGeometry(geo):
            return
        self.screen_fit.restored()
        if not fits(self):
            fit(self, self.screen_fit.first_size())

    # -- pages ------------------------------------------------------------------------------
    def _timeline_page(self) -> QWidget:
        page = QWidget(self)
        pl = QVBoxLayout(page)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.setSpacing(0)
        pl.addWidget(self.device_strip)
        pl.addWidget(self.legend)
        pl.addWidget(self.timeline, 1)
        return page

    def _welcome_page(self) -> QWidget:
        self.placeholder = QWidget(self)
        ph = QVBoxLayout(self.placeholder)
        msg = QLabel("<h2>vramscope</h2><p>Open a PyTorch CUDA memory snapshot "
                     "(<code>torch.cuda.memory._dump_snapshot</code>) with <b>Ctrl+O</b>, "
                     "or drop the file here.</p>", self.placeholder)
        msg.setAlignment(Qt.AlignmentFlag.AlignCenter)
        msg.setWordWrap(True)
        open_btn = QPushButton("Open snapshot…", self.placeholder)
        open_btn.clicked.connect(lambda: self.loading.open_dialog())
        ph.addStretch(1)
        ph.addWidget(msg)
        ph.addWidget(open_btn, 0, Qt.AlignmentFlag.AlignHCenter)
        ph.addStretch(2)
        return self.placeholder

    def _empty_page(self) -> QWidget:
        """A file that records nothing: it says so, with its name (not the welcome page)."""
        self.empty_page = QWidget(self)
        ep = QVBoxLayout(self.empty_page)
        self.empty_msg = QLabel(self.empty_page)
        self.empty_msg.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_msg.setWordWrap(True)
        self.empty_msg.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        other_btn = QPushButton("Open another snapshot…", self.empty_page)
        other_btn.clicked.connect(lambda: self.loading.open_dialog())
        ep.addStretch(1)
        ep.addWidget(self.empty_msg)
        ep.addWidget(other_btn, 0, Qt.AlignmentFlag.AlignHCenter)
        ep.addStretch(2)
        return self.empty_page

    def default_layout(self):
        """Dock sizes in proportion to the window (docks.py)."""
        self.dock_layout.default_layout()

    def on_screen(self, key: str) -> bool:
        """Whether a panel is really shown (a dock behind another's tab says it is visible)."""
        return self.dock_layout.shown(key)

    # -- the window's small interface (the command line, tests, the parts) --------------------
    def open_path(self, path: str, device: int | None = None):
        """Open a file in the background (a newer request replaces an older one)."""
        self.loading.open_path(path, device)

    def open_begun(self, begun):
        """`open_path` for a file whose reading began before the window (model/load.py Begun)."""
        self.loading.open_begun(begun)

    def show_device(self, dev: int):
        self.loading.show_device(dev)

    def compare_with(self, path: str, across_devices: bool = False):
        """Load `path` as B in the background and compare the file shown (A) with it (with
        `across_devices`: A's device against B's, whatever their numbers: two ranks)."""
        self.compare.with_file(path, across_devices)

    def show_error(self, title: str, msg: str):
        self.close_error()
        self.error_box = error_box(self, title, msg)

    def close_error(self):
        if self.error_box is not None:
            self.error_box.close()
            self.error_box.deleteLater()
            self.error_box = None

    def entries_in(self, x0: float, x1: float) -> tuple[int, int] | None:
        """The first and last entries between two x positions of the timeline (None: none)."""
        d = self.data
        if d is None or d.n == 0:
            return None
        first = max(0, int(d.index_at_x(x0)))
        last = min(d.n - 1, d.index_before_x(x1))
        return (first, last) if last >= first else None

    def pin(self, i: int):
        """The moment the panels show when the pointer is not over the timeline."""
        self.pinned_index = i
        self.moment_panel.show_index(i)
        if self.on_screen("memtree"):
            self.memtree_panel.show_index(i)

    # -- window events -------------------------------------------------------------------------
    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        h = self.height()
        self.timeline.set_compact(2 if h < NO_OVERVIEW_BELOW else 1 if h < COMPACT_BELOW else 0)
        self.device_strip.set_compact(h < NO_OVERVIEW_BELOW)
        # a hint on show stays whole: its shorter wording when the window narrows
        shown = self.statusBar().currentMessage()
        for variants in self._hint_sets:
            if shown in variants and self._fitting(variants) != shown:
                self.statusBar().showMessage(self._fitting(variants), 12000)

    def changeEvent(self, ev):
        if ev.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            QTimer.singleShot(0, self, self.apply_theme)
        super().changeEvent(ev)

    def dragEnterEvent(self, ev):
        if self.loading.accepts(ev.mimeData()):
            ev.acceptProposedAction()

    def dropEvent(self, ev):
        if self.loading.drop(ev.mimeData()):
            ev.acceptProposedAction()

    def closeEvent(self, ev):
        self.dock_layout.show_with_data(True)          # the layout saved is the user's, not the welcome page's
        self.notes.close()
        self.loading.shutdown()
        self.exports.shutdown()
        self.whatif_panel.shutdown()
        self.close_error()
        if self.settings is not None:
            self.settings.setValue("window/geometry", self.saveGeometry())
            self.settings.setValue("window/state", self.saveState())
            self.settings.setValue("window/user_layout", not self.dock_layout.auto_layout or self.dock_layout.user_layout)
        super().closeEvent(ev)
        if ev.isAccepted():
            self.timeline.release()
            self.compare_panel.release()
            self.ranks.release()

    # -- actions ----------------------------------------------------------------------------
    def _act(self, menu, text, slot, keys=(), tip="", checkable=False):
        a = QAction(text, self)
        if keys:
            a.setShortcuts([QKeySequence(k) for k in keys])
        tip = tip or text.replace("&", "").rstrip("…")
        a.setProperty("help_text", tip)          # what F1 says it does (keys.help_rows)
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
        ld, ex, nt, cmp = self.loading, self.exports, self.notes, self.compare
        fm = mb.addMenu("&File")
        self.act_open = self._act(fm, "&Open…", lambda: ld.open_dialog(), [QKeySequence.StandardKey.Open],
                                  "Open a memory snapshot")
        self.act_open_folder = self._act(fm, "Open &Folder…", self.ranks.open_dialog, ["Ctrl+Shift+O"],
                                         "Open a folder of per-rank snapshots: every rank at a glance")
        self.recent_menu = fm.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(ld.fill_recent)
        self.act_reload = self._act(fm, "&Reload", lambda: ld.reload(), ["F5"], "Reload the file from disk")
        fm.addSeparator()
        self.act_compare = self._act(
            fm, "Compare &With…", lambda: cmp.dialog(), (),
            "Open a second snapshot of the same run (B) and compare it with this one (A): both totals on one "
            "axis, the categories at both peaks, the code sites with their change")
        self.act_swap = self._act(fm, "S&wap A and B", lambda: cmp.swap(), (),
                                  "Show the compared file (B) in the timeline and compare the other way round")
        self.act_close_compare = self._act(fm, "C&lose Comparison", lambda: cmp.close(), ())
        self.act_swap.setEnabled(False)
        self.act_close_compare.setEnabled(False)
        fm.addSeparator()
        self.act_export = self._act(fm, "Save &Image…", lambda: ex.image(), ["Ctrl+E"], "Save the window as a PNG")
        fm.addSeparator()
        self.act_export_report = self._act(
            fm, "Export &Report…", lambda: ex.report(), ["Ctrl+Shift+E"],
            "Write report.md, timeline.png (with your notes drawn) and analysis.json into a folder")
        self.act_export_trimmed = self._act(
            fm, "Export &Trimmed Snapshot…", lambda: ex.trimmed(), (),
            "Save a window of the trace (around the peak, the marked range or the visible range) "
            "as a snapshot pickle that vramscope and PyTorch's viewer open")
        self.act_export_perfetto = self._act(
            fm, "Export &Perfetto Trace…", lambda: ex.perfetto(), (),
            "Save live memory per category as counter tracks (Chrome trace JSON for ui.perfetto.dev)")
        fm.addSeparator()
        self._act(fm, "&Quit", self.close, [QKeySequence.StandardKey.Quit])

        em = mb.addMenu("&Edit")
        self.act_undo = self._act(em, "&Undo", lambda: nt.undo(), ["Ctrl+Z"], "Undo the last change to the notes")
        self.act_redo = self._act(em, "&Redo", lambda: nt.redo(), ["Ctrl+Shift+Z", "Ctrl+Y"],
                                  "Redo the change to the notes just undone")
        em.addSeparator()
        self.act_note_range = self._act(
            em, "Annotate &Range…", lambda: nt.annotate_range(), ["A"],
            "Write a note on a time range: the range marked with Ctrl+drag on the timeline, "
            "or else the visible range")
        self.act_note_peak = self._act(
            em, "Annotate &Peak…", lambda: nt.annotate_peak(), ["Shift+P"],
            "Write a note on the peak (the peak found last with P / N, else the highest peak)")
        self.act_note_alloc = self._act(
            em, "Annotate &Allocation…", lambda: nt.annotate_allocation(), ["Shift+A"],
            "Write a note on the selected allocation (click the timeline or a table row first)")
        em.addSeparator()
        # F2 and Delete act in the notes list only (Delete elsewhere must not delete a note)
        self.act_note_edit = self._act(em, "&Edit Note…", lambda: nt.edit(), ["F2"],
                                       "Edit the note chosen in the Annotations panel")
        self.act_note_delete = self._act(em, "&Delete Note", lambda: nt.delete(), [QKeySequence.StandardKey.Delete],
                                         "Delete the note chosen in the Annotations panel (Ctrl+Z undoes)")
        for a in (self.act_note_edit, self.act_note_delete):
            self.removeAction(a)
            a.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            a.setProperty("scope_words", "in the Annotations list")
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
        self.panel_actions: dict[str, QAction] = {}
        for n, (key, title, _area) in enumerate(DOCKS, 1):
            a = self._act(vm, title, lambda _=False, k=key: self.dock_layout.toggle(k), [f"Ctrl+{n}"],
                          f"Bring the {title} panel to the front with the keyboard; close it when it is in front",
                          checkable=True)
            dock = self.docks[key]
            a.setChecked(not dock.isHidden())
            dock.visibilityChanged.connect(lambda _on, a=a, dock=dock: a.setChecked(not dock.isHidden()))
            self.panel_actions[key] = a
        # panning with the arrow keys belongs to the timeline (the table keeps its own)
        for key, frac in (("Left", -0.25), ("Right", 0.25)):
            sc = QShortcut(QKeySequence(key), self.timeline, lambda f=frac: self.timeline.pan(f))
            sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)

        hm = mb.addMenu("&Help")
        self.act_help = self._act(hm, "&Keyboard Shortcuts", self.show_shortcuts, ["F1"])
        self._act(hm, "&About vramscope", self.show_about)
        # single keys act in the timeline only; their Ctrl combinations anywhere (keys.py)
        self.key_shortcuts = [sc for a in self.menu_actions() for sc in scope_keys(a, self, self.timeline)]
        self.panel_ring = PanelRing(self, self._panel_ring, self._focus_panel)
        self._build_toolbar()
        self._set_loaded_actions(False)

    def menu_actions(self) -> list[QAction]:
        """Every action of the menus, in their order (F1 lists their keys)."""
        out: list[QAction] = []

        def walk(menu):
            for a in menu.actions():
                if a.menu() is not None:
                    walk(a.menu())
                elif not a.isSeparator() and a not in out:
                    out.append(a)
        for top in self.menuBar().actions():
            if top.menu() is not None:
                walk(top.menu())
        return out

    def _panel_ring(self) -> list[tuple[str, QWidget]]:
        """The panels Tab steps through: the timeline, then each panel on screen."""
        ring: list[tuple[str, QWidget]] = [("timeline", self.timeline)] if self.data is not None else []
        ring += [(k, self.docks[k]) for k in self.dock_layout.in_front()]
        if self.ranks.dock.isVisible() and not self.ranks.dock.visibleRegion().isEmpty():
            ring.append(("ranks", self.ranks.dock))
        return ring

    def _focus_panel(self, key: str):
        if key == "timeline":
            self.timeline.plot.setFocus(Qt.FocusReason.TabFocusReason)
        elif key == "ranks":
            target = first_focusable(self.ranks.dock)
            if target is not None:
                target.setFocus(Qt.FocusReason.TabFocusReason)
        else:
            self.dock_layout._give_focus(key)

    def _build_toolbar(self):
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
        tb.addWidget(QLabel(" Device ", tb))
        self.device_combo = QComboBox(tb)
        self.device_combo.setToolTip("Which GPU's trace to show")
        self.device_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.device_combo.activated.connect(self.loading.on_device_chosen)
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

    def _set_loaded_actions(self, on: bool):
        for a in self.mode_actions.values():
            a.setEnabled(on)
        if on and self.data is not None and not self.data.segments.known:
            self.mode_actions["segments"].setEnabled(False)
        for a in (self.act_reload, self.act_zoom_in, self.act_zoom_out, self.act_reset, self.act_peak,
                  self.act_next, self.act_prev, self.act_export, self.act_export_report, self.act_export_trimmed,
                  self.act_export_perfetto, self.act_compare):
            a.setEnabled(on)
        self.act_export_trimmed.setEnabled(on and self.data is not None and self.data.n > 0)
        self.device_combo.setEnabled(on and self.device_combo.count() > 1)
        self.notes.update_actions()

    # -- status bar ----------------------------------------------------------------------------
    def _build_status(self):
        sb = StatusBar(self)
        self.setStatusBar(sb)
        self.status_file = QLabel(self)
        self.status_device = QLabel(self)
        self.status_entries = QLabel(self)
        self.status_peak = QLabel(self)
        self.status_guess = QLabel(self)
        self.status_notes = QLabel(self)
        for w, tip in ((self.status_notes, ""), (self.status_file, "The open file"),
                       (self.status_device, "The device shown"),
                       (self.status_entries, "Trace entries and allocations on this device"),
                       (self.status_peak, "Highest live allocated memory and its type"),
                       (self.status_guess, "The part of the peak whose category is a guess (no frames, live before "
                                           "recording began): drawn in the paler shade")):
            w.setToolTip(tip)
            # a gap between a temporary message and the labels (Qt draws the message right up
            # to the first permanent widget), and between the labels themselves
            w.setContentsMargins(14 if w is not self.status_guess else 2, 0, 2, 0)
            sb.add_label(w, yields=w in (self.status_file, self.status_device, self.status_entries,
                                         self.status_guess))
        self.status_notes.hide()
        self.status_guess.hide()

    def _fitting(self, variants: tuple[str, ...]) -> str:
        """The longest of `variants` (longest first) that fits beside the status bar's labels."""
        sb = self.statusBar()
        assert isinstance(sb, StatusBar)
        room = sb.room(with_all_labels=True)
        fm = sb.fontMetrics()
        return next((v for v in variants if fm.horizontalAdvance(v) <= room), variants[-1])

    def _update_status(self):
        d = self.data
        if self.path is None:
            for w in (self.status_file, self.status_device, self.status_entries, self.status_peak, self.status_guess):
                w.setText("")
            self.status_guess.hide()
            return
        # a long name would hold the window wider than a small screen: cut in the middle
        self.status_file.setText(middle(os.path.basename(self.path), STATUS_NAME_LIMIT))
        self.status_file.setToolTip(f"The open file: {self.path}")
        if d is None:
            self.status_device.setText("no device with data")
            self.status_entries.setText("")
            self.status_peak.setText("")
            self.status_guess.setText("")
            self.status_guess.hide()
            return
        self.status_device.setText(f"cuda:{d.device}")
        self.status_entries.setText(f"{count_words(d.n, 'entry', 'entries')} · "
                                    f"{count_words(d.n_rows, 'allocation', 'allocations')}")
        pk = d.da.peak
        self.status_peak.setText(f"peak {fmt_bytes(pk.bytes)}, {peak_words(pk.type, d.state_only)}"
                                 if pk is not None else "")
        # the peak's bytes that are a guess, said beside it (steps aside for a long message)
        guess = guessed_text(pk.by_evidence) if pk is not None else ""
        self.status_guess.setText(f"({guess})" if guess else "")
        self.status_guess.setVisible(bool(guess))

    def _axis_notice(self) -> str | None:
        """Why the x axis is entries although the trace has times (None: it is time)."""
        d = self.data
        if d is None or not d.has_time or d.time_axis:
            return None
        return f"x axis in {axis_reason(d.x_axis)} (T: seconds)"

    # -- theme -------------------------------------------------------------------------------
    def apply_theme(self):
        self.theme = Theme.from_palette(self.palette())
        self.timeline.apply_theme(self.theme)
        self.compare_panel.apply_theme(self.theme)

    # -- a file shown ------------------------------------------------------------------------------
    def apply_result(self, result: LoadResult):
        """Show a loaded snapshot (GUI thread)."""
        replaced = self.result is not None
        self.result = result
        self.path = result.path
        self.data = result.data
        self.selected_row = -1
        self.pinned_index = None
        self.finding_pos = -1
        d = self.data
        self.device_combo.clear()
        an = result.analysis
        first = an.primary_device() if len(an.devices) > 1 else None
        for dev in an.devices:
            # the device's name (its entries are in the status bar and the tooltip: the box is
            # narrow at 800 pixels, "cuda:0 (3", "cuda:0 (1 entries)"), starred where to look
            # first and marked with its OOM, as the device strip does (which a short window hides)
            n = len(result.snapshot.trace(dev))
            self.device_combo.addItem(("★ " if dev == first else "") + f"cuda:{dev}"
                                      + (" · OOM" if an.devices[dev].ooms else ""), dev)
            self.device_combo.setItemData(self.device_combo.count() - 1, f"cuda:{dev}: "
                                          f"{count_words(n, 'trace entry', 'trace entries')}",
                                          Qt.ItemDataRole.ToolTipRole)
        if result.device is not None:
            self.device_combo.setCurrentIndex(self.device_combo.findData(result.device))
        # as wide as its longest name, whatever the toolbar's room ("★ cuda:1 · OOM" was cut to
        # "★ cuda:1 ·" at 800 pixels: the toolbar moves its last buttons into its » menu instead)
        self.device_combo.setMinimumWidth(0)
        self.device_combo.setMinimumWidth(self.device_combo.sizeHint().width())
        self.device_strip.set_analysis(result.analysis, result.device)
        self.compare.follow(result)
        self.legend.set_data(d)
        if d is not None:
            d.set_time_axis(d.x_axis.seconds)       # each run opens on its own rule (after a Swap too)
        self.timeline.set_data(d, self.legend.visible() if d is not None else [])
        if d is not None and self.mode_before_whatif is not None:       # a what-if does not outlive its file
            before, self.mode_before_whatif = self.mode_before_whatif, None
            self.set_mode(before)
        self.whatif_panel.set_mode_note("")
        self.legend.set_mode(self.timeline.mode)
        self.stack_panel.set_data(d)
        self.moment_panel.set_data(d)
        self.findings_panel.set_data(d)
        self.table_panel.set_data(d)
        self.allocator_panel.set_data(d)
        self.memtree_panel.set_data(d)
        self.whatif_panel.set_data(d)
        if d is not None:
            QTimer.singleShot(0, self, self._whatif_if_shown)
            QTimer.singleShot(0, self, self._allocator_if_shown)      # a panel on screen shows the new file
            QTimer.singleShot(0, self, self._memtree_if_shown)
            self.stack.setCurrentIndex(PAGE_TIMELINE)
        else:
            self.empty_msg.setText(
                f"<h3>{_esc(os.path.basename(result.path))}</h3><p>This snapshot records no memory on any device: "
                "no trace entries and no allocator segments. It was probably dumped before anything was allocated "
                "on the GPU, or from a process that never used it, or without "
                "<code>torch.cuda.memory._record_memory_history()</code> turned on.</p>")
            self.stack.setCurrentIndex(PAGE_EMPTY)
        self.dock_layout.show_with_data(d is not None)
        self.notes.use_store(result.path)
        self._set_loaded_actions(d is not None)
        self.act_reload.setEnabled(True)
        self.setWindowTitle(f"{os.path.basename(result.path)} — vramscope")
        self._update_status()
        if d is not None:
            self.act_time_axis.setChecked(d.time_axis)
            self.act_time_axis.setEnabled(d.has_time)
            self.moment_panel.show_index(max(d.peak_index, -1))
            notice = self._axis_notice()
            self._hint_sets = [(notice, f"x axis in {axis_reason_short(d.x_axis)} (T: seconds)",
                                "x axis in entries (T: seconds)") if notice else MOUSE_HINTS]
            self.statusBar().showMessage(self._fitting(self._hint_sets[0]), 12000)
        else:
            self.statusBar().showMessage("This snapshot records no memory on any device.", 8000)
        if self.notes.notice:
            said: tuple[str, ...] = (self.notes.short_notice(),)
            if self.notes.elsewhere():
                said += ("Notes go to your user data folder (this folder is read-only)",
                         "Notes: user data folder (read-only here)")
            self._hint_sets.append(said)
            self.statusBar().showMessage(self._fitting(said), 20000)
        self.loading.add_recent(result.path)
        # P, N, + and - work at once: the plot takes the keyboard (this window's focus widget,
        # given back when the progress dialog closes), unless the user is typing in a box
        if d is not None and not isinstance(self.focusWidget(), QLineEdit):
            self.timeline.plot.setFocus(Qt.FocusReason.OtherFocusReason)
        # the reading and the analysis kept the pages they freed for their next arrays (the
        # command line's common/memory.py keep_freed_pages) and put off the cyclic collector's
        # passes (fewer_collections): the window, open for hours, collects the file it replaced
        # and hands the pages back once this one is shown (the first file replaced none: its
        # own cycles are left to the collector's rarer passes; a full pass cost the open 0.1 s
        # at 10^7 entries)
        QTimer.singleShot(0, self, _hand_back_memory if replaced else memory.give_back_freed_pages)
        self.loaded.emit()

    # -- views -----------------------------------------------------------------------------------
    def set_mode(self, mode: str):
        """Stack the timeline by category, allocation or segment."""
        if self.data is None:
            return
        if not self.timeline.set_mode(mode):
            self.statusBar().showMessage("This snapshot has no allocator segments (profiler-converted): "
                                         "no segment view", 6000)
            self.mode_actions[self.timeline.mode].setChecked(True)

    def _on_whatif(self, result, text: str, gpu):
        """The what-if overlay: it draws by category, so a Segments or Allocations view turns
        to Categories while a factor or lever is set, says so (the What-if panel, the status
        bar), and comes back when the what-if is reset."""
        tl = self.timeline
        switched = result is not None and tl.mode != "categories" and self.mode_before_whatif is None
        if switched:
            self.mode_before_whatif = tl.mode
        tl.set_whatif(result, text, gpu)
        before = self.mode_before_whatif
        if result is None and before is not None:
            self.mode_before_whatif = None
            self.set_mode(before)
            before = None
        note = (f"The timeline shows Categories while a what-if is set (it draws by category); Reset brings "
                f"{self.mode_actions[before].text().replace('&', '')} back." if before is not None else "")
        self.whatif_panel.set_mode_note(note)
        if switched:
            self.statusBar().showMessage(note, 10000)

    def _on_mode_changed(self, mode: str):
        self.mode_actions[mode].setChecked(True)
        self.legend.set_mode(mode)

    def _on_time_axis(self, on: bool):
        d = self.data
        if d is None:
            return
        if on and not d.has_time:
            self.act_time_axis.setChecked(False)
            self.statusBar().showMessage("This trace has no time stamps: the x axis is the entry index", 6000)
            return
        self.timeline.set_time_axis(on)
        # (the hint shown on opening says why the axis began in entries: not left saying so)
        self.statusBar().showMessage("x axis in seconds (T: entries)" if on else "x axis in entries (T: seconds)", 4000)

    def _on_legend(self):
        if self.data is not None:
            self.timeline.set_visible_categories(self.legend.visible())

    def _whatif_if_shown(self):
        if self.data is not None and self.on_screen("whatif"):
            self.whatif_panel.ensure_model()

    def _allocator_if_shown(self):
        d = self.data
        if d is not None and self.on_screen("allocator") and self.allocator_panel.index is None:
            self.allocator_panel.show_index(self.pinned_index if self.pinned_index is not None else d.peak_index)

    def _memtree_if_shown(self):
        d = self.data
        if d is not None and self.on_screen("memtree"):
            self.memtree_panel.show_index(self.pinned_index if self.pinned_index is not None else d.peak_index)

    def _show_tree_rows(self, rows, text: str):
        """A memory tree node double-clicked: the table shows exactly its live allocations,
        the largest selected."""
        self.table_panel.show_only(rows, text)
        self.timeline.set_row_marks(rows)
        self.dock_layout.show("allocations")
        self.select_row(int(rows[0]), source="memtree")

    def _on_segment_clicked(self, seg: int, i: int):
        d = self.data
        if d is None:
            return
        self.dock_layout.show("allocator")
        self.allocator_panel.show_index(i, int(d.segments.addr[seg]))
        # the keys step the allocator at once (→, Ctrl+→, Page Down), not the timeline
        self.allocator_panel.setFocus(Qt.FocusReason.MouseFocusReason)

    def _on_allocator_step(self, i: int):
        """The allocator panel stepped to entry i: the cursor, the moment and the view follow."""
        d = self.data
        if d is None:
            return
        self.pinned_index = i
        self.timeline.set_cursor_index(i)
        self.moment_panel.request_index(i)
        if self.on_screen("memtree"):           # (a layout that shows both)
            self.memtree_panel.show_index(i)
        x = float(d.x_of_index(max(i, 0)))
        x0, x1 = self.timeline.x_span()
        if not x0 <= x <= x1:
            w = x1 - x0
            self.timeline.set_x_range(x - w / 2, x + w / 2)

    # -- the pointer and the selection ------------------------------------------------------------
    def _on_hover(self, row: int, i: int, x: float):
        if self.on_screen("moment"):
            self.moment_panel.request_index(i)

    def _on_hover_left(self):
        if self.pinned_index is not None:
            self.moment_panel.request_index(self.pinned_index)

    def _on_timeline_click(self, row: int, i: int, x: float):
        self.pin(i)
        if self.on_screen("allocator"):
            self.allocator_panel.show_index(i)
        if row < 0 and self.timeline.mode == "segments":
            return          # a segment picked: the selected allocation stays
        self.select_row(row, source="timeline")

    def clear_selection(self):
        self.select_row(-1)
        self.timeline.clear_mark()
        # the marked range's instructions go with it
        if self.mark_message is not None and self.statusBar().currentMessage() == self.mark_message:
            self.statusBar().clearMessage()
        self.mark_message = None

    def select_row(self, row: int, source: str = "api"):
        """Select an allocation everywhere: stack panel, timeline highlight, table."""
        if self.data is None:
            return
        self.selected_row = row
        if source != "finding":
            # another allocation chosen (or none): the finding navigated to is no longer
            # what the window shows; its highlight goes (N still steps on from it)
            f = self.data.findings[self.finding_pos] if 0 <= self.finding_pos < len(self.data.findings) else None
            if f is None or row != f.row:
                self.findings_panel.clear_current()
        self.act_note_alloc.setEnabled(self.notes.store is not None and row >= 0)
        self.stack_panel.set_row(row)
        self.timeline.select_row(row)
        if source != "table":
            self.table_panel.select_row(row)
        if source != "allocator" and self.on_screen("allocator"):
            self.allocator_panel.show_row(row)
        if row >= 0:
            if source in ("table", "moment"):
                self.show_row(row)
            # its header, five frames where there is room, and forward unless chosen on the plot
            self.dock_layout.show_selection(forward=source != "timeline")

    def show_row(self, row: int):
        """Move the timeline to an allocation's lifetime, with context around it."""
        d = self.data
        if d is None:
            return
        first, last = d.row_span(row)
        xa = float(d.x_of_index(first)) if d.alloc_index[row] >= 0 else d.x_range[0]
        xb = float(d.x_of_index(last)) if d.free_index[row] >= 0 else d.x_range[1]
        full = d.x_range[1] - d.x_range[0]
        width = max(3 * (xb - xa), full / 400 if full > 0 else 1.0)
        c = (xa + xb) / 2
        self.timeline.show_x_range(c - width / 2, c + width / 2)
        self.timeline.set_cursor_index(max(int(d.alloc_index[row]), 0))
        self.pin(int(d.alloc_index[row]))

    # -- findings ------------------------------------------------------------------------------------
    def navigate(self, k: int):
        """Go to finding k: zoom there, put the cursor on it, select its allocation."""
        d = self.data
        if d is None or not (0 <= k < len(d.findings)):
            return
        f = d.findings[k]
        self.finding_pos = k
        self.timeline.zoom_to_indices(*f.zoom)
        self.timeline.set_cursor_index(f.index)
        self.pin(f.index)
        if self.on_screen("allocator"):
            self.allocator_panel.show_index(f.index)
        self.findings_panel.select(k)
        self._show_finding_rows(f)
        if f.row >= 0:
            self.select_row(f.row, source="finding")
        self.statusBar().showMessage(f"{f.title} — {f.detail}", 10000)

    def _show_finding_rows(self, f: FindingView):
        """A leak selects its allocations: the table shows exactly them (with a chip that
        clears it) and the timeline rings where each was made. Any other finding lets a
        leak's set go."""
        if f.kind == "leak" and f.rows is not None and len(f.rows):
            self.table_panel.show_only(f.rows, leak_rows_text(len(f.rows), f.place))
            self.timeline.set_row_marks(f.rows)
            self.dock_layout.show("allocations")
        elif self.table_panel.has_only():
            self.table_panel.clear_only()

    def settle(self) -> None:
        """Do now what the panels leave for a moment after a resize (the findings' wrapping):
        before a picture of the window is taken."""
        self.findings_panel.settle()

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
            self.pin(peak.index)
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
        self.dock_layout.show("allocations")
        self.table_panel.text.setFocus()
        self.table_panel.text.selectAll()

    # -- help ------------------------------------------------------------------------------------------
    def shortcut_rows(self) -> list[tuple[str, str]]:
        """F1's list: each menu action's keys, then the mouse and the panels' own keys."""
        return help_rows(self.menu_actions(), EXTRA_KEYS)

    def show_shortcuts(self):
        html = "<table>" + "".join(f"<tr><td><b>{_esc(k)}</b>&nbsp;&nbsp;</td><td>{_esc(v)}</td></tr>"
                                   for k, v in self.shortcut_rows()) + "</table>"
        box = TextDialog(self, "Keyboard shortcuts", html)
        box.setObjectName("shortcuts")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.help_box = box

    def show_about(self):
        from ... import __version__
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About vramscope",
                          f"<b>vramscope {__version__}</b><br>PyTorch CUDA memory snapshots: categories, "
                          "peaks, leaks and OOMs, on little RAM.", QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()


__all__ = ["MainWindow", "MOUSE_HINTS"]
