"""`vramscope FILE` / `vramscope view FILE` begin reading the file on a thread before Qt and the
window are set up (viewer/model/load.py `Begun`); the window then follows that reading as if it
had opened the file itself: the same result, its progress in the window's dialog, its Cancel,
its error (pytest-qt, offscreen)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from helpers import DATA  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, open_and_wait  # noqa: E402
import vramscope.viewer.model.load as load_module  # noqa: E402
from vramscope.parsers import Cancelled  # noqa: E402

FILE = str(DATA / "cuda_full.pickle")


def test_the_window_shows_what_it_would_have_opened_itself(qt, window):
    reports: list = []
    window.loading.worker.progressed.connect(lambda label, done, total: reports.append(label))
    begun = load_module.Begun(FILE, None, use_cache=False)
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        window.open_begun(begun)
    early = window.data
    assert early is not None and window.path == begun.path
    assert reports                                            # the reading's progress, in the window
    assert begun.job.wait(0) and begun.job.take() is None     # the result is the window's alone
    open_and_wait(qt, window, FILE)
    again = window.data
    assert (early.device, early.n, early.peak_bytes, early.peak_index) == \
        (again.device, again.n, again.peak_bytes, again.peak_index)
    assert np.array_equal(early.category, again.category)
    assert [f.title for f in early.findings] == [f.title for f in again.findings]


def test_cancel_in_the_window_stops_the_reading(qt, window, monkeypatch):
    seen: dict = {}

    def slow_load(path, device, use_cache, progress, on_read=None):
        seen["thread"] = threading.current_thread().name
        progress.start("parsing", 1.0)
        while not progress.cancelled:
            time.sleep(0.005)
        seen["stopped"] = True
        raise Cancelled()

    monkeypatch.setattr(load_module, "load", slow_load)
    begun = load_module.Begun(FILE)
    with qt.waitSignal(window.loading.worker.cancelled, timeout=LOAD_TIMEOUT):
        window.open_begun(begun)
        qt.waitUntil(lambda: "thread" in seen, timeout=5000)
        window.loading.worker.cancel()                        # what the dialog's Cancel does
    assert begun.job.wait(5)
    assert seen == {"thread": "vramscope-load", "stopped": True}
    assert "cancelled" in window.statusBar().currentMessage().lower()


def test_cancel_before_the_worker_follows_stops_the_reading_too(qt, window, monkeypatch):
    """Cancelled before its job ran (the worker checks first, and never calls it): the reading
    begun before the window is stopped all the same."""
    stopped = threading.Event()

    def slow_load(path, device, use_cache, progress, on_read=None):
        while not progress.cancelled:
            time.sleep(0.005)
        stopped.set()
        raise Cancelled()

    monkeypatch.setattr(load_module, "load", slow_load)
    begun = load_module.Begun(FILE)
    gate = threading.Event()
    window.loading.worker.pool.start(gate.wait)               # the worker's one thread kept busy
    with qt.waitSignal(window.loading.worker.cancelled, timeout=LOAD_TIMEOUT):
        window.open_begun(begun)
        window.loading.worker.cancel()
        gate.set()
    assert stopped.wait(5) and begun.job.wait(5)


def test_a_file_that_does_not_read_is_said_in_the_window(qt, window, tmp_path):
    bad = tmp_path / "not_a_snapshot.pickle"
    bad.write_bytes(b"\x80\x04this is not a pickle")
    begun = load_module.Begun(str(bad), None, use_cache=False)
    with qt.waitSignal(window.loading.worker.failed, timeout=LOAD_TIMEOUT) as failed:
        window.open_begun(begun)
    msg = failed.args[0]
    assert "\n" not in msg and "Traceback" not in msg and msg
    assert window.error_box is not None and window.data is None


def test_the_command_begins_reading_a_file_before_the_window(monkeypatch, tmp_path):
    from vramscope.viewer import app as app_module
    got: list = []

    def fake_run(path, screenshot, device, use_cache, begun):
        got.append((begun is not None and begun.job.wait(LOAD_TIMEOUT / 1000), threading.current_thread().name))
        return 0

    monkeypatch.setattr(app_module, "_run_viewer", fake_run)
    assert app_module.run_viewer(FILE, use_cache=False) == 0           # `vramscope view FILE`
    assert got == [(True, "MainThread")]
    folder = tmp_path / "ranks"
    folder.mkdir()
    got.clear()
    assert app_module.run_viewer(str(folder), use_cache=False) == 0    # a folder: the Ranks panel's own
    assert got == [(False, "MainThread")]


def test_a_screenshot_of_a_missing_file_is_said_at_once_without_a_window(monkeypatch, tmp_path, capsys):
    import vramscope.viewer.window as window_module
    from vramscope.viewer import app as app_module
    built: list = []
    monkeypatch.setattr(window_module, "MainWindow", lambda *a, **k: built.append(1))
    real = app_module._run_viewer

    def after_the_reading(path, screenshot, device, use_cache, begun):
        assert begun is not None                       # begun for a path that is not a folder
        begun.job.wait(30)
        return real(path, screenshot, device, use_cache, begun)

    monkeypatch.setattr(app_module, "_run_viewer", after_the_reading)
    out = tmp_path / "shot.png"
    assert app_module.run_viewer(str(tmp_path / "missing.pickle"), str(out)) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.pickle" in err[0] and "Traceback" not in err[0]
    assert built == [] and not out.exists()
