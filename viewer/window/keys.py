"""The window from the keyboard (issue 33, item 2).

  * Single keys (P, N, A, C, L, S, T, +, -, Home, with or without Shift) act only while the
    timeline has the keyboard: typing `linear.py:125` into the Findings tree after a stray
    click switched the view to allocations (L), jumped to a finding (N) and opened the
    Annotate dialog (A). Their Ctrl combinations (Ctrl++, Ctrl+-, Ctrl+0) and the function
    keys act anywhere in the window (`scope_keys`).
  * Tab and Shift+Tab move between the panels on screen (the timeline, then each panel in
    front, in the View menu's order), never cell by cell through a table (`PanelRing`).
  * F1's list is made from the actions themselves (`help_rows`): it cannot name a key that
    does nothing or miss one that does something.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import QApplication, QWidget

_MODIFIERS = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier | Qt.KeyboardModifier.MetaModifier
_ANYWHERE = {Qt.Key.Key_Escape, Qt.Key.Key_Delete} | {Qt.Key(Qt.Key.Key_F1.value + k) for k in range(35)}


def typed(seq: QKeySequence) -> bool:
    """Whether a key sequence is one a user also types into a text box or a tree's search
    (a letter or sign, with or without Shift; Home): such a key acts only in the timeline."""
    if seq.isEmpty():
        return False
    # (PySide6's stubs lack QKeySequence.__getitem__)
    combo = seq[0]  # type: ignore[index]
    return not (combo.keyboardModifiers() & _MODIFIERS) and combo.key() not in _ANYWHERE


def native(seq: QKeySequence) -> str:
    return seq.toString(QKeySequence.SequenceFormat.NativeText)


def scope_keys(action: QAction, window: QWidget, timeline: QWidget) -> list[QShortcut]:
    """Give `action` its keys: the typed ones only while `timeline` (or a child) has the
    keyboard, the others anywhere in `window` (a QShortcut of the window each, so that one
    key never belongs to two shortcuts: Qt fires neither of an ambiguous pair)."""
    keys = action.shortcuts()
    local = [k for k in keys if typed(k)]
    if not local:
        return []
    rest = [k for k in keys if not typed(k)]
    action.setShortcuts(local)
    action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
    window.removeAction(action)
    timeline.addAction(action)
    action.setProperty("timeline_only", True)
    out = []
    for k in rest:
        sc = QShortcut(k, window)
        sc.setContext(Qt.ShortcutContext.WindowShortcut)
        sc.activated.connect(action.trigger)
        sc.setProperty("action_text", action.text())
        out.append(sc)
    action.setProperty("anywhere_keys", [native(k) for k in rest])
    return out


def help_rows(actions: Sequence[QAction], extra: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """F1's rows: each action with keys (its keys; those that act only in the timeline say
    so), then `extra` (the mouse, the keys that belong to one panel)."""
    rows = []
    for a in actions:
        keys = [native(k) for k in a.shortcuts()] + list(a.property("anywhere_keys") or [])
        if not keys:
            continue
        what = str(a.property("help_text") or a.statusTip() or a.text()).replace("&", "").rstrip("…")
        if a.property("timeline_only"):
            anywhere = a.property("anywhere_keys")
            what += f" ({' / '.join(native(k) for k in a.shortcuts())}: timeline focused)" if anywhere \
                else " (timeline focused)"
        elif a.property("scope_words"):
            what += f" ({a.property('scope_words')})"
        rows.append((" / ".join(keys), what))
    return rows + list(extra)


class PanelRing(QObject):
    """Tab and Shift+Tab move the keyboard between the panels on screen (an application
    event filter for the window's own widgets; dialogs keep Qt's Tab)."""

    def __init__(self, window: QWidget, panels: Callable[[], list[tuple[str, QWidget]]],
                 focus: Callable[[str], None]):
        super().__init__(window)
        self.win = window
        self.panels = panels              # [(key, the widget holding the panel)] on screen, in order
        self.focus = focus                # give a panel the keyboard
        app = QApplication.instance()
        assert app is not None
        app.installEventFilter(self)

    def current(self, ring: list[tuple[str, QWidget]]) -> int:
        w = QApplication.focusWidget()
        if w is None:
            return -1
        return next((k for k, (_, holder) in enumerate(ring) if holder is w or holder.isAncestorOf(w)), -1)

    def step(self, forward: bool) -> str | None:
        ring = self.panels()
        if not ring:
            return None
        k = self.current(ring)
        if k < 0:
            k = -1 if forward else 0
        key = ring[(k + (1 if forward else -1)) % len(ring)][0]
        self.focus(key)
        return key

    def eventFilter(self, obj, ev):
        if ev.type() == QEvent.Type.KeyPress and ev.key() in (Qt.Key.Key_Tab, Qt.Key.Key_Backtab) \
                and isinstance(obj, QWidget) and obj.window() is self.win \
                and QApplication.activePopupWidget() is None and QApplication.activeModalWidget() is None:
            mods = ev.modifiers()
            forward = ev.key() == Qt.Key.Key_Tab and not (mods & Qt.KeyboardModifier.ShiftModifier)
            if not (mods & _MODIFIERS):
                if self.step(forward) is not None:
                    return True
            elif mods & _MODIFIERS == Qt.KeyboardModifier.ControlModifier:
                # Ctrl+Tab: the next control in Qt's order (a panel's boxes and buttons)
                self.win.focusNextPrevChild(forward)
                return True
        return False


__all__ = ["typed", "native", "scope_keys", "help_rows", "PanelRing"]
