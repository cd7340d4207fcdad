"""Text cut where it is too long: with an ellipsis, keeping what says most (issue 33, item 12).

A code path reads "function  (file.py:125)": a deep one in a narrow column read "for…25)"
(Qt's middle elision cuts the file and the line). `KeepWhereDelegate` cuts the function's
words first and keeps "(file.py:125)" whole while it fits; the whole text stays in the
cell's tooltip (the models give one)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QStyle, QStyledItemDelegate

SEPARATOR = "  ("           # between a frame's function and its "(file:line)"
PADDING = 10                # the cell's text margins (the style's, both sides, with room)


def elide_keeping_where(text: str, fm: QFontMetrics, width: int) -> str:
    """`text` within `width` pixels: whole; else its head cut with an ellipsis and the
    "(file:line)" tail whole; else cut in the middle."""
    if width <= 0 or fm.horizontalAdvance(text) <= width:
        return text
    head, sep, tail = text.rpartition(SEPARATOR)
    if sep:
        tail = sep.lstrip() + tail
        room = width - fm.horizontalAdvance(" " + tail)
        if room >= fm.horizontalAdvance("…") * 3:
            return fm.elidedText(head, Qt.TextElideMode.ElideRight, room) + " " + tail
    return fm.elidedText(text, Qt.TextElideMode.ElideMiddle, width)


class KeepWhereDelegate(QStyledItemDelegate):
    """Draws a cell's text cut by `elide_keeping_where` (its tooltip holds it whole)."""

    def initStyleOption(self, option, index):
        super().initStyleOption(option, index)
        if not option.text:
            return
        style = option.widget.style() if option.widget is not None else None
        text_rect = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, option, option.widget) \
            if style is not None else option.rect
        option.text = elide_keeping_where(option.text, option.fontMetrics, text_rect.width() - PADDING)


__all__ = ["KeepWhereDelegate", "elide_keeping_where"]
