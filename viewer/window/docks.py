"""The window's docks: one per panel, arranged (the right column runs the full height, the
table and its tabbed neighbours under the timeline; in a narrow window the right column's
panels are tabs beside the table), sized with the window until the user sizes them, the
plot always keeping its room, shown only with a file to show, and the keyboard following
the tab brought forward."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import QApplication, QDockWidget, QFrame, QMainWindow, QScrollArea, QTabBar, QWidget

RIGHT, BOTTOM = Qt.DockWidgetArea.RightDockWidgetArea, Qt.DockWidgetArea.BottomDockWidgetArea
NARROW = 960        # below this width the right column's panels join the tabs under the timeline
PLOT_MIN = 200      # the plot's height the panels leave it, whenever the window is this tall...
PLOT_ROOM_FROM = 460    # ...(from here: an 800x500 screen's window too; a smaller one gives it PLOT_FLOOR)
PLOT_FLOOR = 120
COMPACT_BELOW = 640     # a window shorter than this draws the overview strip thinner (timeline.set_compact)...
NO_OVERVIEW_BELOW = 560  # ...and one shorter than this (800x500 under a title bar) leaves it out
RIGHT_COLUMN = ("findings", "selection", "moment")
# Panels that scroll rather than hold a small window tall: a tab group is as tall as its
# tallest minimum, so one panel's 161 pixels (the Allocator's) left the plot 159 at 800x500.
# The table and the memory tree scroll by themselves.
SCROLLED = ("moment", "selection", "findings", "annotations", "allocator", "compare")
# (What if scrolls inside: its answer stays on top while its controls and budget scroll)
NARROWS = ("moment", "selection", "findings")   # these also wrap to any width (no sideways scrolling)


def scrolled(panel: QWidget, sideways: bool = False) -> QScrollArea:
    """The panel in a frameless scroll area: the dock's height no longer has the panel's
    minimum (the moment panel's 370 pixels kept a window from 500 pixels); `sideways`: it
    scrolls sideways too when the dock is narrower than the panel can be."""
    area = QScrollArea()
    area.setObjectName(f"scroll_{panel.objectName() or type(panel).__name__}")
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded if sideways
                                      else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    area.setWidget(panel)
    area.setFocusPolicy(Qt.FocusPolicy.NoFocus)      # the panel takes the keyboard, not its frame
    area.setMinimumHeight(60)
    return area


# (key, title, area): the order of View > Ctrl+1…9 and of the tabs
DOCKS = (("selection", "Selection", RIGHT), ("moment", "At this moment", RIGHT), ("findings", "Findings", RIGHT),
         ("allocations", "Allocations", BOTTOM), ("annotations", "Annotations", BOTTOM),
         ("allocator", "Allocator", BOTTOM), ("memtree", "Memory tree", BOTTOM), ("whatif", "What if", BOTTOM), ("compare", "Compare", BOTTOM))


def first_focusable(panel: QWidget) -> QWidget | None:
    """The widget of a panel that takes the keyboard: the panel itself when it does (the
    Allocator), else its first shown child that accepts focus by Tab, skipping buttons (the
    table over its filter buttons, the notes' list over their toolbar)."""
    inner = panel.widget() if isinstance(panel, QScrollArea) else None
    if inner is not None:
        panel = inner                          # a panel scrolled in its dock (`scrolled`)

    def takes_tab(w: QWidget) -> bool:
        return bool(w.focusPolicy() & Qt.FocusPolicy.TabFocus) and w.isVisibleTo(panel) and w.isEnabled()
    if takes_tab(panel):
        return panel
    kids = [w for w in panel.findChildren(QWidget) if takes_tab(w)]
    views = [w for w in kids if w.inherits("QAbstractItemView")]
    chosen = views or kids
    return chosen[0] if chosen else None


class Docks(QObject):
    """`docks[key]` for each panel; `shown(key)` says whether one is really on screen."""

    def __init__(self, window: QMainWindow, panels: dict[str, QWidget]):
        super().__init__(window)
        self.win = window
        self._guard = QTimer(self)                # after any change: the plot's room (keep_plot_room)
        self._guard.setSingleShot(True)
        self._guard.setInterval(30)
        self._guard.timeout.connect(self._after_layout)
        self._retries = 0                         # keep_plot_room's looks again after a resize
        self.docks: dict[str, QDockWidget] = {}
        for key, title, area in DOCKS:
            dock = QDockWidget(title, window)
            dock.setObjectName(f"dock_{key}")
            dock.setWidget(scrolled(panels[key], key not in NARROWS) if key in SCROLLED else panels[key])
            window.addDockWidget(area, dock)
            self.docks[key] = dock
            dock.visibilityChanged.connect(lambda on, k=key: self._on_visible(k, on))
            dock.visibilityChanged.connect(lambda on: on and self._guard.start())
        d = self.docks
        self.narrow = False                     # the right column's panels are tabs under the timeline
        self._right_column()
        # the notes share the bottom with the table: a wide list, and the right column keeps its height
        for a, b in (("allocations", "annotations"), ("annotations", "allocator"), ("allocator", "memtree"),
                     ("memtree", "whatif"), ("whatif", "compare")):
            window.tabifyDockWidget(d[a], d[b])
        d["compare"].hide()                         # until File > Compare With…
        # the right column runs the full height; the table sits under the timeline only
        window.setCorner(Qt.Corner.BottomRightCorner, RIGHT)
        window.setCorner(Qt.Corner.TopRightCorner, RIGHT)
        d["selection"].raise_()
        d["allocations"].raise_()
        self._hidden_with_data: set[str] | None = None   # the docks to bring back with a file
        self.auto_layout = True                   # the docks follow the window...
        self.user_layout = False                  # ...until the user drags a separator
        self._sizes_at_press: tuple | None = None
        self._dragged = False
        self._relayout = QTimer(self)
        self._relayout.setSingleShot(True)
        self._relayout.setInterval(30)
        self._relayout.timeout.connect(self.default_layout)
        window.installEventFilter(self)

    def _right_column(self):
        """Findings above the selection / moment tabs, in a column beside the timeline."""
        w, d = self.win, self.docks
        w.addDockWidget(RIGHT, d["findings"])
        w.addDockWidget(RIGHT, d["selection"])
        w.splitDockWidget(d["findings"], d["selection"], Qt.Orientation.Vertical)
        w.tabifyDockWidget(d["selection"], d["moment"])

    def arrange(self, narrow: bool):
        """A narrow window (under NARROW pixels) gives the timeline its whole width: the right
        column's panels (mostly empty until something is selected) become tabs beside the
        table; a wider one puts them back in their column. The tabs shown stay shown."""
        if narrow == self.narrow:
            return
        self.narrow = narrow
        w, d = self.win, self.docks
        front = [k for k in d if self.shown(k)]
        hidden = {k for k in RIGHT_COLUMN if d[k].isHidden()}
        for k in RIGHT_COLUMN:
            w.removeDockWidget(d[k])
        if narrow:
            for k in RIGHT_COLUMN:
                w.addDockWidget(BOTTOM, d[k])
                w.tabifyDockWidget(d["allocations"], d[k])
        else:
            self._right_column()
        for k in RIGHT_COLUMN:
            d[k].setVisible(k not in hidden)
        for k in front:
            d[k].raise_()

    # -- sizes ---------------------------------------------------------------------------------
    def default_layout(self):
        """Dock sizes in proportion to the window: the right column (findings above the
        selection) runs the full height, the table gets about a third of it below the
        timeline, so at 1024x700 it still shows eight rows and the timeline most of the rest;
        under NARROW pixels the right column's panels are tabs beside the table."""
        w = self.win
        width, height = w.width(), w.height()
        self.arrange(width < NARROW)
        right = max(280, min(440, int(width * 0.27)))
        bars = w.menuBar().height() + w.statusBar().height() + sum(
            t.height() for t in w.findChildren(QWidget, "toolbar_main"))
        column = max(300, height - bars - 8)
        d = self.docks
        if not self.narrow:
            w.resizeDocks([d["findings"]], [right], Qt.Orientation.Horizontal)
            w.resizeDocks([d["findings"], d["selection"]], [int(column * 0.40), int(column * 0.60)],
                          Qt.Orientation.Vertical)
        w.resizeDocks([d["allocations"]], [max(140, int(height * (0.40 if height >= PLOT_ROOM_FROM else 0.30)))],
                      Qt.Orientation.Vertical)
        self.keep_plot_room()
        self.keep_selection_room()
        self._guard.start()          # again once the sizes asked for are laid out (they apply later)

    def plot_room(self) -> int:
        """The plot height the panels must leave: PLOT_MIN in a window of PLOT_ROOM_FROM pixels
        or more, else PLOT_FLOOR."""
        return PLOT_MIN if self.win.height() >= PLOT_ROOM_FROM else PLOT_FLOOR

    def _after_layout(self):
        self.keep_plot_room()
        self.keep_selection_room()

    def keep_plot_room(self):
        """Whatever sized the panels (the window following the screen, a layout restored from
        the last session, a panel brought forward), the plot keeps plot_room(): the panels
        under the timeline give up the pixels it lacks."""
        w = self.win
        if not w.isVisible() or not w.timeline.plot.isVisible():
            return
        plot = w.timeline.plot
        lack = self.plot_room() - plot.height()
        if lack <= 0:
            self._retries = 0
            return
        below = [dock for k, dock in self.docks.items()
                 if self.shown(k) and not dock.isFloating() and w.dockWidgetArea(dock) == BOTTOM]
        below = below or [dock for dock in self.docks.values()        # (none painted yet: any open one)
                          if dock.isVisible() and not dock.isFloating() and w.dockWidgetArea(dock) == BOTTOM]
        if below:
            dock = below[0]             # (the tab in front: resizing a tab behind it may do nothing)
            w.resizeDocks([dock], [max(dock.minimumSizeHint().height(), dock.height() - lack)],
                          Qt.Orientation.Vertical)
            # the size asked for applies at the next layout: look again then (a few times at
            # most), so whatever else moved meanwhile (a panel's own content) is caught too
            if self._retries < 3:
                self._retries += 1
                self._guard.start()
            return
        self._retries = 0

    def show_selection(self, forward: bool = True):
        """The Selection pane for a newly selected allocation: its header at the top, and
        (`forward`) the pane brought forward, unless that would hide the panel the keyboard is
        in (in a narrow window the table, the Findings and the Selection are tabs of one group:
        raising it took the table away from under the arrow keys, and the keyboard's focus fell
        into the Selection, which scrolled its header out of sight to show it)."""
        w, sel = self.win, self.docks["selection"]
        focus = QApplication.focusWidget()
        beside = w.tabifiedDockWidgets(sel)
        if forward and not (focus is not None and any(d.isAncestorOf(focus) for d in beside if d.isVisible())):
            sel.raise_()
        QTimer.singleShot(0, self.win, self._selection_settled)

    def _selection_settled(self):
        pane = self.docks["selection"].widget()
        if isinstance(pane, QScrollArea):
            pane.verticalScrollBar().setValue(0)
        self.keep_selection_room()

    def keep_selection_room(self, frames: int = 5):
        """The Selection pane shows its header and `frames` frames when the right column has
        the room (the Findings above it give way, down to a third of the column)."""
        w, d = self.win, self.docks
        sel, fnd = d["selection"], d["findings"]
        if self.narrow or not self.shown("selection") or not self.shown("findings"):
            return
        pane = sel.widget()
        panel = pane.widget() if isinstance(pane, QScrollArea) else pane
        room = getattr(panel, "room_for_frames", None)
        if room is None:
            return
        chrome = sel.height() - pane.height()             # the dock's title bar
        need = room(frames) + chrome
        column = sel.height() + fnd.height()
        if sel.height() >= need:
            return
        need = min(need, column - max(fnd.minimumSizeHint().height(), column // 3))
        if need > sel.height():
            w.resizeDocks([fnd, sel], [column - need, need], Qt.Orientation.Vertical)

    def restored(self, user: bool):
        """A layout restored from the last session (QMainWindow.restoreState): the user's own
        sizes when `user` (they stay, the plot's room apart), else the window's (followed)."""
        self.narrow = self.win.dockWidgetArea(self.docks["findings"]) == BOTTOM
        self.auto_layout = not user
        self.follow_window()

    def follow_window(self):
        if self.auto_layout and not self.user_layout:
            self._relayout.start()
        else:
            self._guard.start()

    def eventFilter(self, obj, ev):
        # a press that reaches the main window itself may be on a dock separator: when the
        # panels' sizes differ at the release, the user sized them by hand (they then stay);
        # a stray click on the window's background changes nothing
        # (a press a child ignored reaches the window too, as does a click that loads a file
        # and so resizes the panels: only a drag that starts on the window itself, on a
        # separator, counts; a saved layout was marked hand-sized without any drag)
        if obj is self.win:
            if ev.type() == QEvent.Type.MouseButtonPress:
                on_window = self.win.childAt(ev.position().toPoint()) is None
                self._sizes_at_press = self._sizes() if on_window else None
                self._dragged = False
            elif ev.type() == QEvent.Type.MouseMove and self._sizes_at_press is not None and ev.buttons():
                self._dragged = True
            elif ev.type() == QEvent.Type.MouseButtonRelease and self._sizes_at_press is not None:
                if self._dragged and self._sizes() != self._sizes_at_press:
                    self.user_layout = True
                self._sizes_at_press = None
            elif ev.type() in (QEvent.Type.Resize, QEvent.Type.Show):
                self.follow_window()
        return False

    def _sizes(self) -> tuple:
        return tuple((k, d.width(), d.height()) for k, d in self.docks.items() if d.isVisible())

    # -- shown ---------------------------------------------------------------------------------
    def shown(self, key: str) -> bool:
        """Whether a panel is really shown (a dock behind another's tab says it is visible)."""
        dock = self.docks[key]
        return dock.isVisible() and not dock.visibleRegion().isEmpty()

    def show(self, key: str):
        """Bring a panel forward (its dock shown, its tab raised)."""
        self.docks[key].show()
        self.docks[key].raise_()

    def toggle(self, key: str) -> bool:
        """A panel's shortcut (Ctrl+1…9): a panel closed or tabbed behind another comes to
        the front with the keyboard; one in front is closed. True: it is shown now. (Qt's
        toggleViewAction hid a panel tabbed behind Allocator, and a second press put it
        back behind.)"""
        dock = self.docks[key]
        if self.shown(key) and not dock.isHidden():
            dock.hide()
            return False
        self.show(key)
        self.focus(key)
        return True

    def focus(self, key: str):
        """Give a panel the keyboard (after its tab is raised: on the next turn of the loop)."""
        QTimer.singleShot(0, self, lambda: self._give_focus(key))

    def _give_focus(self, key: str):
        dock = self.docks.get(key)
        if dock is None or not dock.isVisible():
            return
        target = first_focusable(dock.widget())
        if target is not None:
            target.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def in_front(self) -> list[str]:
        """The panels on screen (a tab in front, or alone), in the View menu's order."""
        return [k for k in self.docks if self.shown(k)]

    def show_with_data(self, on: bool):
        """The panels only with something to show (the welcome and empty pages stand alone);
        the ones the user had open come back."""
        if not on and self._hidden_with_data is None:
            self._hidden_with_data = {k for k, dock in self.docks.items() if not dock.isHidden()}
            for dock in self.docks.values():
                dock.hide()
            # Qt leaves the tab bar of a group of tabbed docks on screen when they all hide
            # (and shows it again when it lays the window out after the hide)
            self._hide_tabs()
            QTimer.singleShot(0, self, self._hide_tabs)
        elif on and self._hidden_with_data is not None:
            for k in self._hidden_with_data:
                self.docks[k].show()
            self._hidden_with_data = None
            self.docks["selection"].raise_()
            self.docks["allocations"].raise_()

    def _hide_tabs(self):
        if self._hidden_with_data is None:
            return
        for bar in self.win.findChildren(QTabBar):
            if bar.parent() is self.win:
                bar.hide()

    def _on_visible(self, key: str, visible: bool):
        if visible:
            QTimer.singleShot(0, self, lambda: self._focus_follows_tab(key))

    def _focus_follows_tab(self, key: str):
        """A panel brought forward by its tab takes the keyboard from the panel it covers. Qt
        keeps the focus in the covered panel (a dock behind another's tab is still "visible"),
        so ← / → after clicking the Allocator tab moved the hidden table's selection instead
        of stepping the allocator."""
        focused = QApplication.focusWidget()
        if focused is None or not self.shown(key):
            return
        if not any(d.isAncestorOf(focused) and not self.shown(k) for k, d in self.docks.items()):
            return
        target = first_focusable(self.docks[key].widget())
        if target is not None:
            target.setFocus(Qt.FocusReason.OtherFocusReason)
        else:
            focused.clearFocus()


__all__ = ["Docks", "DOCKS", "first_focusable"]
