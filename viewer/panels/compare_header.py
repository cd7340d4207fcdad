"""The Compare panel's header: the two files (A, B) and the controls (alignment, swap, close).

The names sit beside the controls when the row holds both whole; in a narrower panel (a
1024-pixel window) they take a row of their own above the controls, and only when even
that row is too narrow are they cut further in the middle (the tooltip has both paths).
"""
from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QGridLayout, QLabel, QSizePolicy, QToolButton, QWidget

from ...present.markup import html as _esc
from ...present.markup import middle
from ..model.compare import ALIGN_ITERATION, ALIGN_START

NAME_LIMIT, SHORTEST_NAME = 34, 12     # characters of a file name, cut in the middle beyond


class CompareHeader(QWidget):
    swapRequested = Signal()
    closeRequested = Signal()

    def __init__(self, a_color: str, b_color: str, parent=None):
        super().__init__(parent)
        self.colors = (a_color, b_color)
        self.paths: tuple[str, str] | None = None
        self.names: tuple[str | None, str | None] = (None, None)     # 'rank 3' where a side is a rank
        self.own_row = False
        self.files = QLabel(self)
        self.files.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.files.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.files.setMinimumWidth(120)
        self.align = QComboBox(self)
        self.align.addItem("Aligned at the first iteration's start", ALIGN_START)
        self.align.addItem("Aligned by iteration", ALIGN_ITERATION)
        self.align.setToolTip("How the two runs share the x axis: both start at their first iteration, or every "
                              "iteration drawn one unit wide (iteration 3 of A over iteration 3 of B)")
        self.swap_button = QToolButton(self)
        self.swap_button.setText("⇄ Swap A and B")
        self.swap_button.setToolTip("Show B in the timeline above and compare the other way round (B becomes A)")
        self.swap_button.clicked.connect(self.swapRequested)
        self.close_button = QToolButton(self)
        self.close_button.setText("✕ Close")
        self.close_button.setToolTip("Close the comparison")
        self.close_button.clicked.connect(self.closeRequested)
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setVerticalSpacing(2)
        self.grid.setColumnStretch(0, 1)
        for col, w in enumerate((self.align, self.swap_button, self.close_button), start=1):
            self.grid.addWidget(w, 1, col)
        self.grid.addWidget(self.files, 1, 0)

    def set_paths(self, paths: tuple[str, str] | None, names: tuple[str | None, str | None] = (None, None)):
        """The two files; `names`: what to call a side instead of its file name (two ranks of
        a folder read as 'rank 1' and 'rank 5', their files in the tooltip)."""
        self.paths = paths
        self.names = names
        if paths is None:
            self.files.setText("")
            self.files.setToolTip("")
            return
        a, b = paths
        na, nb = (f"{n}: " if n else "" for n in names)
        self.files.setToolTip(f"A: {na}{a}\nB: {nb}{b}\nOn the plot: wheel zooms, drag pans, double-click shows "
                              f"all, hover tells both values")
        self._fit()

    def _text(self, limit: int) -> str:
        assert self.paths is not None
        a_name, b_name = (name or middle(os.path.basename(p), limit) for p, name in zip(self.paths, self.names))
        ca, cb = self.colors
        return (f"<span style='color:{ca}; font-size:13pt'>■</span> <b>A</b> {_esc(a_name)} "
                f"<i>(the timeline)</i> &nbsp; <span style='color:{cb}; font-size:13pt'>■</span> "
                f"<b>B</b> {_esc(b_name)}")

    def _controls_width(self) -> int:
        gap = self.grid.horizontalSpacing()
        return sum(w.sizeHint().width() + gap for w in (self.align, self.swap_button, self.close_button))

    def _fit(self):
        """Beside the controls when both fit whole, else on their own row (names cut further
        only when that row is too narrow too)."""
        if self.paths is None:
            return
        width = self.width()
        limit = NAME_LIMIT
        self.files.setText(self._text(limit))
        own_row = self.files.sizeHint().width() > width - self._controls_width()
        if own_row:
            while self.files.sizeHint().width() > width and limit > SHORTEST_NAME:
                limit -= 2
                self.files.setText(self._text(limit))
        if own_row != self.own_row:
            self.own_row = own_row
            self.grid.removeWidget(self.files)
            if own_row:
                self.grid.addWidget(self.files, 0, 0, 1, 4)
            else:
                self.grid.addWidget(self.files, 1, 0)

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        self._fit()


__all__ = ["CompareHeader", "middle"]
