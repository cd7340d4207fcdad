"""The window and its dialogs on small screens (issue 33, items 1 and 5), on virtual screens of
1024x700 and 800x500: the offscreen platform's JSON screen configuration
(`QT_QPA_PLATFORM=offscreen:configfile=tests/screens/WxH.json`; a screen is fixed when the
application starts, so `test_on_a_virtual_screen` runs this file again in a process of its
own for each size, and the tests below run only there).

On each screen: a first start fits the available area, so does a start whose saved geometry
(1600x1000) does not; showing every panel and a comparison never grows the window past the
screen; at 800x500 the plot keeps 200 pixels; every dialog (F1's list, About, a note, an
error, the progress dialog, a file dialog, the trimmed export's choice) fits, and F1's list
scrolls with its OK button on screen."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QSettings, Qt, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from helpers import DATA, REPO  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, layout_settled, open_and_wait  # noqa: E402

SCREEN = os.environ.get("VRAMSCOPE_TEST_SCREEN", "")          # "1024x700" in the child process
SIZES = ("1024x700", "800x500")
OOM = str(DATA / "cuda_oom.pickle")
BASE = str(REPO / "tests" / "groundtruth" / "ft_base.pickle")
CKPT = str(REPO / "tests" / "groundtruth" / "ft_checkpointing.pickle")

on_screen = pytest.mark.skipif(not SCREEN, reason="run by test_on_a_virtual_screen on a virtual screen of its own")


@pytest.mark.skipif(bool(SCREEN), reason="(the child process itself)")
@pytest.mark.parametrize("size", SIZES)
def test_on_a_virtual_screen(size, tmp_path):
    env = dict(os.environ, VRAMSCOPE_TEST_SCREEN=size,
               QT_QPA_PLATFORM=f"offscreen:configfile={REPO / 'tests' / 'screens' / f'{size}.json'}")
    env.pop("VRAMSCOPE_TEST_SHUFFLE", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                        str(tmp_path / "t"), "tests/test_viewer_screen_fit.py"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    assert "6 passed" in p.stdout.splitlines()[-1], p.stdout[-2000:]       # every test below ran


# -- in the child process, on the virtual screen ---------------------------------------------
def area():
    return QApplication.primaryScreen().availableGeometry()


def assert_fits(widget, what: str):
    g = widget.frameGeometry()
    assert area().contains(g), f"{what}: {g} is not inside the screen's {area()}"


def window(qt, settings=None, persist=True):
    from vramscope.viewer.app import make_app
    from vramscope.viewer.window import MainWindow
    make_app()
    w = MainWindow(persist=persist, use_cache=False, settings=settings)
    qt.addWidget(w)
    w.show()
    qt.waitExposed(w)
    w.activateWindow()
    qt.waitUntil(w.isActiveWindow, timeout=5000)
    qt.wait(50)                        # the first show's size, with the frame measured
    layout_settled(qt, w)
    return w


@on_screen
def test_the_screen_is_the_one_asked_for(qapp):
    w, h = (int(v) for v in SCREEN.split("x"))
    assert (area().width(), area().height()) == (w, h)


@on_screen
def test_a_first_start_fits_the_screen_and_so_does_the_file_it_opens(qt):
    w = window(qt)
    assert_fits(w, "first start")
    assert w.width() >= area().width() - 10 and w.height() >= area().height() - 40, "it uses the screen"
    open_and_wait(qt, w, OOM)
    qt.wait(50)
    layout_settled(qt, w)
    assert_fits(w, "with cuda_oom.pickle open")
    # what the issue found off screen: Findings, the status bar, the OOM marker
    sb = w.statusBar()
    assert area().contains(sb.mapToGlobal(sb.rect().bottomRight()))
    assert w.on_screen("findings") or w.dock_layout.narrow
    assert w.timeline.plot.height() >= 200
    tl = w.timeline
    oom = next(ln for ln in tl.marker_lines if ln.label is not None and "OOM" in ln.label.toPlainText())
    x0, x1 = tl.x_span()
    assert x0 <= oom.value() <= x1
    assert tl.overview.height() <= tl.plot.height()
    # under a window manager's title bar (openbox: 25 pixels) the plot still keeps 200
    w.resize(w.width(), area().height() - 30)
    qt.wait(50)
    layout_settled(qt, w)
    assert w.timeline.plot.height() >= 200, w.timeline.plot.height()
    w.close()


@on_screen
def test_a_geometry_saved_on_a_larger_screen_is_fitted(qt, tmp_path):
    ini = str(tmp_path / "vramscope.ini")
    big = window(qt, QSettings(ini, QSettings.Format.IniFormat))
    big.screen_fit.enabled = False                   # as a window on a 1600x1000 screen was
    big.resize(1600, 1000)
    qt.wait(50)
    assert big.width() == 1600
    big.close()
    assert QSettings(ini, QSettings.Format.IniFormat).value("window/geometry") is not None
    w = window(qt, QSettings(ini, QSettings.Format.IniFormat))
    assert_fits(w, "restored from 1600x1000")
    open_and_wait(qt, w, OOM)
    qt.wait(50)
    layout_settled(qt, w)
    assert_fits(w, "restored, a file open")
    assert w.timeline.plot.height() >= 200
    w.close()


@on_screen
def test_every_panel_and_a_comparison_never_grow_the_window_past_the_screen(qt, monkeypatch):
    from PySide6.QtWidgets import QFileDialog
    w = window(qt, persist=False)
    open_and_wait(qt, w, BASE)
    for n in range(1, 9):                            # every panel to the front with its shortcut
        w.timeline.plot.setFocus()
        qt.keyClick(w.timeline.plot, getattr(Qt.Key, f"Key_{n}"), Qt.KeyboardModifier.ControlModifier)
        qt.wait(60)
        assert_fits(w, f"after Ctrl+{n}")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (CKPT, "")))
    with qt.waitSignal(w.compared, timeout=LOAD_TIMEOUT):
        w.act_compare.trigger()
    qt.wait(50)
    layout_settled(qt, w)
    assert_fits(w, "comparing")
    assert w.timeline.plot.height() >= 200 or w.height() < 460
    w.close()


def shown_dialog(qt, opener, what: str, close=None):
    """Open a dialog (it may be modal: looked at from a timer), check it fits, close it."""
    seen = {}

    def look():
        m = QApplication.activeModalWidget() or next(
            (d for d in QApplication.topLevelWidgets() if d.isVisible() and d.isWindow()
             and d is not QApplication.activeWindow() and d.inherits("QDialog")), None)
        if m is None:
            QTimer.singleShot(30, look)
            return
        qt.wait(30)
        seen["geometry"] = m.frameGeometry()
        seen["type"] = type(m).__name__
        seen["dialog"] = m
        (close or (lambda d: d.reject()))(m)
    QTimer.singleShot(50, look)
    opener()
    qt.waitUntil(lambda: "geometry" in seen, timeout=10000)
    assert area().contains(seen["geometry"]), f"{what} ({seen['type']}): {seen['geometry']} outside {area()}"
    return seen


@on_screen
def test_every_dialog_fits_and_f1_scrolls(qt, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog, QPushButton
    w = window(qt, persist=False)
    open_and_wait(qt, w, OOM)
    # F1, pressed
    w.timeline.plot.setFocus()
    qt.keyClick(w.timeline.plot, Qt.Key.Key_F1)
    qt.waitUntil(lambda: getattr(w, "help_box", None) is not None and w.help_box.isVisible(), timeout=3000)
    box = w.help_box
    assert_fits(box, "F1")
    ok = box.buttons.findChildren(QPushButton)[0]
    assert area().contains(ok.mapToGlobal(ok.rect().bottomRight())), "F1's OK button is off screen"
    bar = box.text.verticalScrollBar()
    if SCREEN == "800x500":
        assert bar.maximum() > 0, "the list is longer than the screen: it scrolls"
    ok.click()
    # About
    shown_dialog(qt, w.show_about, "About", close=lambda d: d.accept())
    # a note on the peak (Shift+P in the timeline): a modal dialog
    w.activateWindow()
    qt.waitUntil(w.isActiveWindow, timeout=5000)
    w.timeline.plot.setFocus()
    shown_dialog(qt, lambda: qt.keyClick(w.timeline.plot, Qt.Key.Key_P, Qt.KeyboardModifier.ShiftModifier),
                 "a note")
    # an error: a file that is not a snapshot
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04 not a snapshot " + b"x" * 2000)
    w.open_path(str(bad))
    qt.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible(), timeout=LOAD_TIMEOUT)
    qt.wait(30)
    assert_fits(w.error_box, "the error")
    w.close_error()
    # the progress dialog (shown at once), Cancel pressed
    from vramscope.viewer.window import progress as progress_mod
    monkeypatch.setattr(progress_mod, "SHOW_AFTER_MS", 0)
    import threading
    gate = threading.Event()
    w.loading.worker.submit(lambda p: (gate.wait(30), p.cancel(), p.check()))
    w.loading.progress.show("Opening a_snapshot_with_a_rather_long_name_from_a_long_training_run.pickle…")
    dlg = w.loading.progress.dialog
    qt.waitUntil(dlg.isVisible, timeout=3000)
    assert_fits(dlg, "progress")
    with qt.waitSignal(w.loading.worker.cancelled, timeout=LOAD_TIMEOUT):
        dlg.cancel_button.click()
        gate.set()
    # Qt's own file dialog (no native one offscreen)
    fd = QFileDialog(w, "Open memory snapshot", str(tmp_path))
    fd.setOption(QFileDialog.Option.DontUseNativeDialog)
    shown_dialog(qt, fd.open, "the file dialog")
    fd.deleteLater()
    # the trimmed export's choice (a QInputDialog)
    shown_dialog(qt, w.act_export_trimmed.trigger, "Export Trimmed Snapshot")
    w.close()


@on_screen
def test_a_multi_device_file_keeps_the_plot_and_says_which_device_to_look_at(qt):
    """Three devices: the device overview's two rows took the plot's last 50 pixels at
    800x500; a short window leaves it out and the toolbar's device box stars the device to
    look at first and marks its OOM."""
    w = window(qt, persist=False)
    d = open_and_wait(qt, w, str(DATA / "multi_device_oom.pickle"))
    w.resize(w.width(), area().height() - 30)                 # under a title bar
    qt.wait(50)
    layout_settled(qt, w)
    assert_fits(w, "three devices")
    assert w.timeline.plot.height() >= 200, w.timeline.plot.height()
    first = w.result.analysis.primary_device()
    k = w.device_combo.findData(first)
    assert w.device_combo.itemText(k).startswith(f"★ cuda:{first}") and "OOM" in w.device_combo.itemText(k)
    assert w.device_strip.isVisible() == (w.height() >= 560)
    assert d.device == first
    w.close()
