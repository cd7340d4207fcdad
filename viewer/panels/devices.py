"""The device overview above the timeline (issue 11): one button per device with data, its
peak, reserved peak and OOMs, the one to look at first marked; a click shows that device.
Pinned host memory (torch 2.14 `record_pinned_host_memory`) is a card of its own after them:
its own memory space, never part of a device's peak.

Shown only when the snapshot has more than one device with data, or host memory (one
device alone needs no overview: the status bar names it). The window's own device switch does the work
(`MainWindow.show_device`), so the strip, the toolbar's combo box and a reload agree.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QButtonGroup, QLabel, QSizePolicy, QToolButton, QWidget

from ...present.words import device_card_text, device_first_reason, host_card_text, host_space_words
from .legend import FlowLayout
from ..theme import OOM_COLOR, muted_text, readable

FIRST_MARK = "★"


class DeviceStrip(QWidget):
    """One checkable button per device, in `Analysis.device_order()` (the one to look at
    first leads, marked with a star); `chosen(device)` when the user clicks another."""

    chosen = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.buttons: dict[int, QToolButton] = {}
        self._analysis = None                  # the analysis the buttons were made for
        self.host: QLabel | None = None
        self.primary: int | None = None
        self.group = QButtonGroup(self)
        self.group.setExclusive(True)
        self.group.idClicked.connect(self._on_clicked)
        # wrapping onto more rows (eight GPUs never make the window wider than the screen)
        self.lay = FlowLayout(self, spacing=4)
        self.lay.setContentsMargins(6, 3, 6, 3)
        self.title = QLabel("Devices", self)
        self.title.setToolTip("Every GPU with data in this snapshot: its peak of live memory, the allocator's "
                              "reserved peak and its out-of-memory errors. Click one to show it. Pinned host "
                              "memory, when recorded, is its own card (never part of a GPU's peak).")
        self.lay.addWidget(self.title)
        self.note = QLabel(self)             # (muted, yet 4.5:1: it says which device to look at first)
        self.note.setStyleSheet(f"color: {muted_text(self.palette(), QPalette.ColorRole.Window).name()};")
        self.lay.addWidget(self.note)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        # the device shown must stand out from the others at a glance (a style's own "checked"
        # look can be one shade darker)
        self.setStyleSheet(
            "QToolButton { border: 1px solid palette(mid); border-radius: 3px; padding: 2px 7px;"
            " background: palette(button); }"
            "QToolButton:hover { border-color: palette(highlight); }"
            "QToolButton:checked { border: 2px solid palette(highlight); background: palette(base); }"
            "QLabel#hostCard { border: 1px dashed palette(mid); border-radius: 3px; padding: 2px 7px; }")
        self._wanted = False                 # devices to show...
        self._compact = False                # ...but a short window (800x500) gives the plot the room
        self.hide()

    def set_analysis(self, analysis, current: int | None):
        """Buttons for `analysis`' devices (none, and the strip hidden, with fewer than two).
        Another device of the same analysis only moves the check (the buttons stay: one was
        just clicked)."""
        if analysis is not None and analysis is self._analysis:
            self.set_current(current)
            return
        self._analysis = analysis
        for b in self.buttons.values():
            self.group.removeButton(b)
            self.lay.removeWidget(b)
            b.deleteLater()
        self.lay.removeWidget(self.note)
        if self.host is not None:
            self.lay.removeWidget(self.host)
            self.host.deleteLater()
            self.host = None
        self.buttons = {}
        devices = analysis.devices if analysis is not None else {}
        host = analysis.host if analysis is not None else None
        if len(devices) < 2 and (host is None or not devices):
            self.primary = None
            self._wanted = False
            self.hide()
            return
        self.primary = analysis.primary_device()
        for k, dev in enumerate(analysis.device_order()):
            da = devices[dev]
            reserved = None if da.live.reserved_peak is None else int(da.live.reserved_peak)
            text = device_card_text(dev, int(da.peak.bytes), reserved, len(da.ooms))
            first = dev == self.primary
            b = QToolButton(self)
            b.setCheckable(True)
            b.setAutoRaise(False)
            b.setText(f"{FIRST_MARK} {text}" if first else text)
            tip = f"cuda:{dev}: peak {text.split('peak ', 1)[1]}"
            if first:
                tip += f"\n{FIRST_MARK} {device_first_reason(bool(da.ooms))}"
            b.setToolTip(tip + "\nClick to show this device")
            if da.ooms:
                # the OOM device in the OOM marker's colour, readable on either palette
                b.setStyleSheet(f"color: {readable(OOM_COLOR, b.palette().color(QPalette.ColorRole.Button)).name()};")
            if first:
                f = b.font()
                f.setBold(True)
                b.setFont(f)
            b.setCursor(Qt.CursorShape.PointingHandCursor)
            self.group.addButton(b, dev)
            self.lay.addWidget(b)
            self.buttons[dev] = b
        if host is not None:
            self.host = QLabel(host_card_text(host.peak_bytes, host.reserved_peak_bytes), self)
            self.host.setObjectName("hostCard")
            self.host.setToolTip(f"{host_space_words()}: peak of live pinned blocks, the host allocator's "
                                 f"reserved peak; {host.allocations:,} allocations in {host.entries:,} trace entries")
            self.lay.addWidget(self.host)
        self.note.setText(f"{FIRST_MARK} {device_first_reason(bool(devices[self.primary].ooms))}"
                          if len(devices) > 1 else "")
        self.lay.addWidget(self.note)
        self.set_current(current)
        self._wanted = True
        self.setVisible(not self._compact)

    def set_compact(self, compact: bool):
        """In a short window the strip steps aside (the toolbar's device box names the devices,
        the one to look at first starred, an OOM said): at 800x500 its two rows took the
        plot's last 50 pixels."""
        self._compact = compact
        self.setVisible(self._wanted and not compact)

    def set_current(self, device: int | None):
        b = self.buttons.get(device) if device is not None else None
        if b is not None:
            b.setChecked(True)
        else:
            # no device shown: none checked (an exclusive group keeps one unless told)
            self.group.setExclusive(False)
            for other in self.buttons.values():
                other.setChecked(False)
            self.group.setExclusive(True)

    def _on_clicked(self, device: int):
        self.chosen.emit(int(device))
