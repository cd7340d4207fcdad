"""Windows and dialogs that fit the screen they are on (issue 33).

The main window opened at 1400x900 (1531 once its panels showed) whatever the screen: on
a 1024x700 or 800x500 screen the findings, the status bar and the OOM marker were off
screen. Now:

  * a first start, and a start whose saved geometry does not fit, opens at the preferred
    size bounded by the available area of the screen (its frame included), inside it;
  * whatever grows the window later (a panel shown, a layout restored) is undone when the
    window no longer fits: it shrinks back into the available area (`ScreenFit`; a window
    the user moves stays where it is put);
  * every dialog shown in the application fits too (`DialogFitter`): one larger than the
    area is made smaller and moved inside it (the F1 list scrolls; file dialogs open wide
    enough, within the screen, with their columns sized to what they show).

An explicit size asked for by the program (the screenshot's 1400x900, offscreen) is kept
when `ScreenFit.enabled` is False.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QMargins, QObject, QRect, QSize, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QDialog, QFileDialog, QHeaderView, QTreeView, QWidget

PREFERRED = QSize(1400, 900)
# the frame a window manager adds, before the window has one to measure: a title bar and
# thin borders (openbox, KWin and Mutter are within it)
FRAME_GUESS = QMargins(4, 30, 4, 4)


def available(widget: QWidget) -> QRect:
    """The available area (without panels and docks) of the screen the widget is on."""
    screen = widget.screen() if widget.isWindow() else widget.window().screen()
    screen = screen or QGuiApplication.primaryScreen()
    return screen.availableGeometry()


def frame_margins(widget: QWidget) -> QMargins:
    """The window frame around the widget: measured once it has one, else FRAME_GUESS."""
    frame, inner = widget.frameGeometry(), widget.geometry()
    if widget.isVisible() and frame != inner:
        return QMargins(inner.left() - frame.left(), inner.top() - frame.top(),
                        frame.right() - inner.right(), frame.bottom() - inner.bottom())
    return FRAME_GUESS


def room(widget: QWidget) -> QSize:
    """The largest size (without the frame) the widget's window may take on its screen."""
    area, m = available(widget), frame_margins(widget)
    return QSize(max(1, area.width() - m.left() - m.right()), max(1, area.height() - m.top() - m.bottom()))


def fits(widget: QWidget) -> bool:
    """Whether the window, frame included, lies inside its screen's available area."""
    area, m = available(widget), frame_margins(widget)
    g = widget.geometry().marginsAdded(m) if widget.isVisible() else QRect(widget.pos(), widget.size() + QSize(
        m.left() + m.right(), m.top() + m.bottom()))
    return area.contains(g)


def fit(widget: QWidget, wanted: QSize | None = None) -> bool:
    """Size (at most `wanted`, else its own size) and move the window so that it fits its
    screen's available area. True when it had to change."""
    r = room(widget)
    want = wanted if wanted is not None else widget.size()
    size = want.boundedTo(r).expandedTo(widget.minimumSize())
    changed = size != widget.size()
    if changed:
        widget.resize(size)
    area, m = available(widget), frame_margins(widget)
    g = widget.frameGeometry() if widget.isVisible() else QRect(widget.pos(), widget.size().grownBy(m))
    x = min(max(g.left(), area.left()), max(area.left(), area.right() + 1 - g.width()))
    y = min(max(g.top(), area.top()), max(area.top(), area.bottom() + 1 - g.height()))
    if (x, y) != (g.left(), g.top()):
        widget.move(x, y)
        changed = True
    return changed


class ScreenFit(QObject):
    """Keeps one top-level window inside its screen: the first size, a restored geometry,
    and whatever grows it later (a debounced check after each resize, move or show)."""

    def __init__(self, window: QWidget):
        super().__init__(window)
        self.win = window
        self.enabled = True
        self._first = False                  # sized with a guessed frame, not shown yet
        self._first_size = QSize()
        self._check = QTimer(self)
        self._check.setSingleShot(True)
        self._check.setInterval(0)
        self._check.timeout.connect(self.now)
        window.installEventFilter(self)

    def first_size(self) -> QSize:
        """The preferred size within the screen; until the window is shown, its frame is a
        guess: the first show sizes it again with the frame measured (`now`)."""
        self._first = True
        self._first_size = PREFERRED.boundedTo(room(self.win))
        return self._first_size

    def restored(self):
        """The window took the last session's geometry: the user's size, not a first one."""
        self._first = False

    def now(self):
        w = self.win
        if not self.enabled or not w.isVisible() or w.isMaximized() or w.isFullScreen():
            return
        if self._first and frame_margins(w) != FRAME_GUESS:
            # the frame measured (a window manager's, or none offscreen): the room it left,
            # unless something sized the window since
            self._first = False
            if w.size() == self._first_size:
                fit(w, PREFERRED.boundedTo(room(w)))
                return
        if not fits(w):
            fit(w)

    def eventFilter(self, obj, ev):
        # a resize (a panel grew the window), a show, another screen: fitted again; a move is
        # the user's (a window dragged partly off the screen stays where it was put)
        if obj is self.win and ev.type() in (QEvent.Type.Resize, QEvent.Type.Show, QEvent.Type.ScreenChangeInternal):
            self._check.start()
        return False


class DialogFitter(QObject):
    """Every dialog of the application, when it shows, fits the available area of its
    screen; file dialogs (Qt's own, where there is no native one) open wide enough for
    their columns (about 600x400 with fixed columns cut "93.…MiB")."""

    FILE_WIDTH, FILE_HEIGHT = 960, 560

    def eventFilter(self, obj, ev):
        if ev.type() == QEvent.Type.Show and isinstance(obj, QDialog) and obj.isWindow():
            if isinstance(obj, QFileDialog):
                fit_file_dialog(obj)
            QTimer.singleShot(0, obj, lambda d=obj: fit(d) if not fits(d) else None)
            if not fits(obj):
                fit(obj)
        return False

    def install(self):
        QApplication.instance().installEventFilter(self)


def fit_file_dialog(dlg: QFileDialog):
    r = room(dlg)
    dlg.resize(min(DialogFitter.FILE_WIDTH, int(r.width() * 0.95)), min(DialogFitter.FILE_HEIGHT, int(r.height() * 0.9)))
    for view in dlg.findChildren(QTreeView):
        hh = view.header()
        if hh.count() < 2:
            continue
        hh.setStretchLastSection(False)
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in range(1, hh.count()):
            hh.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)


__all__ = ["ScreenFit", "DialogFitter", "available", "room", "fits", "fit", "fit_file_dialog", "PREFERRED"]
