"""The progress dialog (issue 33, item 0): a fresh clone's test run died with a segmentation
fault in `ProgressDialog.on_progress` (a modal QProgressDialog's `setValue` runs the event
loop; the request's result, delivered inside it, deleted the dialog under its own
`setValue`). Progress never re-enters the event loop, reaches only the dialog of its own
request, and never one that is gone (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QCoreApplication, QEvent, QTimer  # noqa: E402
from PySide6.QtWidgets import QPushButton  # noqa: E402

import threading  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, open_and_wait  # noqa: E402

BASE = str(DATA.parent / "groundtruth" / "ft_base.pickle")
CKPT = str(DATA.parent / "groundtruth" / "ft_checkpointing.pickle")


def blocked(worker):
    """Occupy the worker until the returned gate opens; then the request is cancelled
    (nothing is applied to the window)."""
    gate = threading.Event()

    def job(progress):
        gate.wait(30)
        progress.cancel()
        progress.check()
    worker.submit(job)
    return gate


def test_a_progress_report_never_runs_the_event_loop(qt, window, monkeypatch):
    """A modal QProgressDialog processes events in setValue once it is on screen: whatever
    was posted (here a timer; in the crash, the request's own result) ran in the middle of
    the report."""
    from vramscope.viewer.window import progress as progress_mod
    monkeypatch.setattr(progress_mod, "SHOW_AFTER_MS", 0)
    progress = window.loading.progress
    gate = blocked(window.loading.worker)
    progress.show("Opening x.pickle…")
    dlg = progress.dialog
    qt.waitUntil(dlg.isVisible, timeout=5000)           # shown on its own, as after its 400 ms
    progress.on_progress("reading", 0.5, 20)             # (a dialog shows its first report at once)
    ran = []
    QTimer.singleShot(0, window, lambda: ran.append("posted"))
    for k in range(1, 20):
        progress.on_progress("reading", k, 20)
        assert not ran, "a progress report ran the event loop"
    assert dlg.value() == int(19 / 20 * 999)
    qt.waitUntil(lambda: ran == ["posted"], timeout=2000)
    with qt.waitSignal(window.loading.worker.cancelled, timeout=LOAD_TIMEOUT):
        gate.set()
    assert progress.dialog is None


def test_a_report_reaches_only_its_own_request_and_never_a_dialog_that_is_gone(qt, window):
    progress, worker = window.loading.progress, window.loading.worker
    first = blocked(worker)
    progress.show("Opening a.pickle…")
    dlg = progress.dialog
    progress.on_progress("reading", 1, 4)
    assert "Reading" in dlg.labelText() and dlg.value() == int(999 / 4)
    # another request took the worker without a dialog of its own (the What-if model's
    # kind of work): its reports are not this dialog's
    second = blocked(worker)
    progress.on_progress("analyzing", 3, 4)
    assert "Analyzing" not in dlg.labelText() and dlg.value() == int(999 / 4)
    with qt.waitSignal(worker.cancelled, timeout=LOAD_TIMEOUT):
        first.set()
        second.set()
    # the dialog deleted under the controller (its window going away deletes it so)
    progress.show("Opening b.pickle…")
    dlg = progress.dialog
    dlg.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert progress.dialog is None
    progress.on_progress("reading", 1, 2)         # nothing to report to, no crash
    progress.hide()


def test_a_result_delivered_while_reports_pour_in_and_the_dialog_shows(qt, window, monkeypatch):
    """What crashed: Compare with the dialog on screen, reports and the result arriving
    together. Twenty rounds, the dialog shown at once and Cancel pressed in some."""
    from vramscope.viewer.window import progress as progress_mod
    monkeypatch.setattr(progress_mod, "SHOW_AFTER_MS", 0)
    open_and_wait(qt, window, BASE)
    worker = window.loading.worker
    shown = []
    worker.progressed.connect(lambda *_: shown.append(window.loading.progress.dialog is not None
                                                       and window.loading.progress.dialog.isVisible()))
    for k in range(6):
        with qt.waitSignal(window.compared, timeout=LOAD_TIMEOUT):
            window.compare_with(CKPT if k % 2 == 0 else BASE)
        assert window.loading.progress.dialog is None
    assert any(shown), "the dialog was never on screen while reports came"
    # Cancel in the middle of the reports: the window goes on
    window.compare_with(CKPT)
    dlg = window.loading.progress.dialog
    dlg.findChild(QPushButton).click()
    qt.waitUntil(lambda: not worker.busy, timeout=LOAD_TIMEOUT)
    assert window.loading.progress.dialog is None


def test_closing_the_window_while_it_loads_leaves_no_report_behind(qt, tmp_path, monkeypatch):
    """The window closed (and deleted) with a load in flight and its reports queued: the
    reports die with it, nothing reaches a deleted dialog."""
    from vramscope.viewer.window import progress as progress_mod
    from test_viewer_model import write_snapshot
    monkeypatch.setattr(progress_mod, "SHOW_AFTER_MS", 0)
    # (big enough to be still loading when the window closes: 30,000 allocations once read
    # faster than the test looked)
    big = write_snapshot(tmp_path / "big.pickle", 150_000, seed=3)
    from vramscope.viewer.app import make_app
    from vramscope.viewer.window import MainWindow
    make_app()
    for _ in range(3):
        w = MainWindow(persist=False, use_cache=False)      # (not qtbot's: it is deleted here)
        w.resize(1000, 700)
        w.show()
        qt.waitExposed(w)
        reports = []
        w.loading.worker.progressed.connect(lambda *a: reports.append(a))
        w.open_path(big)
        qt.waitUntil(lambda: len(reports) >= 2, timeout=LOAD_TIMEOUT)
        dlg = w.loading.progress.dialog
        assert dlg is not None
        w.close()
        w.deleteLater()
        for _ in range(3):
            QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
            qt.wait(20)
