"""The main window's status bar: a temporary message is read whole.

Qt draws a temporary message in the room left of the permanent labels and cuts it off at
the first of them, without an ellipsis: at 1024 pixels "Note added on device 0: …, saved
to /home/…/run.pickle.vramscope.json" lost the place it was saved to, and "Marked entries
…: press A to annotate, File > Export Trimmed Snapshot…" its second half. While a message
does not fit, the labels that repeat what the window shows elsewhere (the file name is in
the title, the device in the toolbar) step aside; the whole text is also the tooltip.
"""
from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QStatusBar, QStyle, QStyleOption, QWidget

# Qt's margins around the message and between the permanent widgets, measured with Fusion
SLACK = 24


class StatusBar(QStatusBar):

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._permanent: list[QLabel] = []
        self._yielding: list[QLabel] = []       # least needed first
        self._stepped_aside: list[QLabel] = []
        self.messageChanged.connect(self._fit)

    def add_label(self, label: QLabel, yields: bool = False):
        """A permanent label; `yields`: it steps aside while a message needs its room."""
        self.addPermanentWidget(label)
        # its text does not hold the window wide (the bar steps labels aside instead: _fit)
        label.setMinimumWidth(1)
        self._permanent.append(label)
        if yields:
            self._yielding.append(label)

    def room(self, with_all_labels: bool = False) -> int:
        """The width a temporary message has beside the permanent labels shown (or beside
        all of them, those stepped aside for the message shown now included)."""
        labels = sum(w.sizeHint().width() for w in self._permanent
                     if w.isVisibleTo(self) or (with_all_labels and w in self._stepped_aside))
        return self.width() - labels - SLACK

    def _fit(self, message: str = ""):
        for w in self._stepped_aside:
            w.show()
        self._stepped_aside = []
        self.setToolTip(message)
        # a narrow window (800 pixels, a long file name, the notes' label): the labels that
        # repeat the title and the toolbar step aside until the rest are read whole
        need = self.fontMetrics().horizontalAdvance(message) if message else 0
        for w in self._yielding:
            if need <= self.room():
                break
            if w.isVisibleTo(self):
                w.hide()
                self._stepped_aside.append(w)

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        self._fit(self.currentMessage())

    def message_rect(self) -> QRect:
        """Where Qt draws a temporary message: from the left edge to the first permanent
        label shown (QStatusBarPrivate::messageRect)."""
        left, right = 6, self.width() - 12
        shown = [w.x() for w in self._permanent if w.isVisible()]
        if shown:
            right = min(right, min(shown) - 2)
        return QRect(left, 0, max(0, right - left), self.height())

    def shown_text(self) -> str:
        """The message as drawn: whole, or cut with an ellipsis where even with the labels
        stepped aside it does not fit (its tooltip has it whole)."""
        msg = self.currentMessage()
        return self.fontMetrics().elidedText(msg, Qt.TextElideMode.ElideRight, self.message_rect().width()) \
            if msg else ""

    def paintEvent(self, ev):
        """Qt's own painting, but the message ends with an ellipsis when it is cut (Qt cut
        "gradient checkpo" and "PYTORCH_CUDA_ALLOC_CONF=expand" mid-word, with no sign)."""
        msg = self.currentMessage()
        if not msg:
            super().paintEvent(ev)
            return
        p = QPainter(self)
        opt = QStyleOption()
        opt.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_PanelStatusBar, opt, p, self)
        p.setPen(self.palette().windowText().color())
        p.drawText(self.message_rect(), int(Qt.AlignmentFlag.AlignLeading | Qt.AlignmentFlag.AlignVCenter
                                            | Qt.TextFlag.TextSingleLine), self.shown_text())
        p.end()
