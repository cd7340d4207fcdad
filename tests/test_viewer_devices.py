"""Several devices in the viewer (issue 11): it opens on the one to look at first, and the
device overview switches with one click."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402

from viewer_helpers import LOAD_TIMEOUT, new_window, open_and_wait  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MULTI_OOM = REPO / "tests" / "data" / "multi_device_oom.pickle"
EXAMPLE = REPO / "assets" / "example.pickle"


@pytest.fixture
def window(qt):
    return new_window(qt)


def test_opens_on_the_oom_device_and_the_overview_says_why(qt, window):
    d = open_and_wait(qt, window, str(MULTI_OOM))
    an = window.result.analysis
    assert sorted(an.devices) == [0, 1, 2]
    # device 0 has the highest peak, device 1 ran out of memory: the OOM wins
    assert an.devices[0].peak.bytes > an.devices[1].peak.bytes and an.devices[1].ooms and not an.devices[0].ooms
    assert d.device == 1 and window.status_device.text() == "cuda:1"
    strip = window.device_strip
    assert strip.isVisible() and list(strip.buttons) == [1, 0, 2]      # the one to look at first leads
    assert strip.buttons[1].isChecked() and not strip.buttons[0].isChecked()
    first = strip.buttons[1].text()
    assert first.startswith("★") and "1 OOM" in first and "1.61 GiB" in first and "reserved 1.80 GiB" in first
    assert not strip.buttons[0].text().startswith("★") and "peak 4.77 GiB" in strip.buttons[0].text()
    assert "OOM" not in strip.buttons[0].text()
    assert "ran out of memory" in strip.note.text()


def test_a_click_on_a_device_in_the_overview_shows_it(qt, window):
    open_and_wait(qt, window, str(MULTI_OOM))
    button = window.device_strip.buttons[0]
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        qt.mouseClick(button, Qt.MouseButton.LeftButton, pos=button.rect().center())
    assert window.data.device == 0 and window.status_device.text() == "cuda:0"
    assert window.device_combo.currentData() == 0
    assert button.isChecked() and not window.device_strip.buttons[1].isChecked()
    assert window.data.peak_bytes == window.result.analysis.devices[0].peak.bytes
    # the overview stays: the star still on device 1
    assert window.device_strip.buttons[1].text().startswith("★")
    # the combo box leads back, and the overview follows it
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        window.device_combo.activated.emit(window.device_combo.findData(2))
    assert window.data.device == 2 and window.device_strip.buttons[2].isChecked()


def test_a_cancelled_switch_keeps_the_overview_on_the_device_shown(qt, window):
    open_and_wait(qt, window, str(MULTI_OOM))
    window.device_strip.buttons[0].click()           # checks its button at once...
    window.loading.worker.cancel()                   # ...and is cancelled (or has just finished)
    qt.waitUntil(lambda: not window.loading.worker.busy, timeout=LOAD_TIMEOUT)
    qt.wait(1)
    shown = window.data.device
    assert window.device_strip.group.checkedId() == shown
    assert window.device_combo.currentData() == shown


def test_one_device_has_no_overview(qt, window):
    open_and_wait(qt, window, str(EXAMPLE))
    assert not window.device_strip.isVisible() and not window.device_strip.buttons
