"""The What-if panel, driven by keys and clicks: sliders, levers, a GPU size, the exact
scaled peak on the timeline, the budget table (pytest-qt, offscreen)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import Qt  # noqa: E402

from vramscope.classifiers.category_live import CategoryLive  # noqa: E402
from vramscope.classifiers.whatif import what_if  # noqa: E402
from viewer_helpers import new_window, open_and_wait  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "snapshots"
CRANBERRII = SHARED / "cranberrii+ftcourse__memory_snapshot.pickle"
QLORA = REPO / "tests" / "data" / "qlora_4bit.pickle"


@pytest.fixture
def window(qt):
    return new_window(qt)


def open_whatif(qt, w, path):
    d = open_and_wait(qt, w, str(path))
    w.docks["whatif"].show()
    w.docks["whatif"].raise_()
    qt.waitUntil(lambda: w.whatif_panel.session is not None, timeout=5000)
    return d, w.whatif_panel


def test_sliders_redraw_with_the_exact_scaled_peak(qt, window):
    path = CRANBERRII if CRANBERRII.exists() else QLORA
    d, panel = open_whatif(qt, window, path)
    tl = window.timeline
    assert set(panel.sliders) == set(panel.session.categories)
    assert panel.table.rowCount() >= len(panel.session.categories)        # the budget beside it
    assert tl.stacking.scales is None and not tl.whatif_label.isVisible()
    sl = panel.sliders["activations"]
    sl.setFocus()
    for _ in range(5):
        qt.keyClick(sl, Qt.Key.Key_PageUp)                               # +0.10 each: 1.50
    qt.waitUntil(lambda: tl.stacking.scales is not None, timeout=2000)
    qt.wait(5)
    assert sl.value() == 150
    cl = CategoryLive.build(d.da)
    want = cl.peak({"activations": 1.5})
    assert tl.whatif_marker.data["y"][0] == want.bytes
    assert tl.whatif_marker.data["x"][0] == pytest.approx(float(d.x_of_index(max(want.index, 0))))
    assert panel.peak_line.text().startswith("<b>Peak ")
    ref = what_if(d.analysis, d.device, {"activations": 1.5})
    assert ref.scaled.bytes == want.bytes
    from vramscope.present.words import peak_words
    assert peak_words(ref.scaled.type) in tl.whatif_label.textItem.toPlainText()
    # the bands are drawn scaled: the peak's column tops out at the exact scaled peak
    env = tl.last_env
    k = tl.pointer.column_under(float(d.x_of_index(want.index)))
    top = float(tl.bands.cum[k, -1])
    assert top == pytest.approx(want.bytes, rel=1e-9)
    # and the column tops are scaled totals: never below the measured composition times the factors
    f = tl.stacking.scales
    assert np.all(tl.bands.cum[:, -1] >= np.maximum(env.col_comp * f, 0)[:, tl.visible_categories].sum(axis=1) - 1)


def test_levers_gpu_and_reset(qt, window):
    path = CRANBERRII if CRANBERRII.exists() else QLORA
    d, panel = open_whatif(qt, window, path)
    tl = window.timeline
    cb = panel.levers["half_batch"]
    qt.mouseClick(cb, Qt.MouseButton.LeftButton, pos=cb.rect().center())
    qt.waitUntil(lambda: tl.stacking.scales is not None, timeout=2000)
    # simulated on the recorded timeline (what_if's): what it assumed and its measured error
    ref = what_if(d.analysis, d.device, levers=["half_batch"])
    lv = ref.levers[0]
    assert cb.isChecked() and lv.applied and lv.assumption[:60] in panel.assumptions.text()
    assert ("error against recorded runs" if lv.error_band is not None else lv.band_note[:40]) \
        in panel.assumptions.text()
    assert "grows with the batch" in cb.toolTip()
    assert tl.whatif_marker.data["y"][0] == ref.scaled.bytes
    # a GPU size typed in: the line and the verdict
    panel.gpu.setFocus()
    panel.gpu.lineEdit().selectAll()
    qt.keyClicks(panel.gpu.lineEdit(), "2")
    qt.keyClick(panel.gpu.lineEdit(), Qt.Key.Key_Return)
    qt.waitUntil(lambda: tl.gpu_line.isVisible(), timeout=2000)
    assert tl.gpu_line.value() == 2 * 1024 ** 3
    ref = what_if(d.analysis, d.device, levers=["half_batch"], gpu="2", fit="batch", fit_each=False)
    verdict = "fits" if ref.fits.fits else "short by"
    assert verdict in panel.fits_line.text()
    # how far the micro-batch could grow on it, with the lever ticked (what_if's fit)
    qt.waitUntil(lambda: "Micro-batch on this GPU" in panel.fit_line.text(), timeout=3000)
    from vramscope.services.whatif import fit_factor_words
    assert fit_factor_words(ref.fit[0].max_factor) in panel.fit_line.text()
    # Reset: as measured, no line
    qt.mouseClick(panel.reset_btn, Qt.MouseButton.LeftButton)
    assert tl.stacking.scales is None and not tl.gpu_line.isVisible() and not tl.whatif_label.isVisible()
    assert not cb.isChecked() and all(s.value() == 100 for s in panel.sliders.values())
    assert tl.peak_label.isVisible()


def test_the_model_is_built_only_when_the_panel_is_shown(qt, window):
    d = open_and_wait(qt, window, str(QLORA))
    qt.wait(20)
    assert window.whatif_panel.session is None and d.__dict__.get("_alloc_stack") is None
    window.docks["whatif"].raise_()
    qt.waitUntil(lambda: window.whatif_panel.session is not None, timeout=5000)


def test_the_model_is_built_on_the_worker_and_can_be_cancelled(qt, window, monkeypatch):
    """The panel's first build runs on its worker (the GUI thread is free meanwhile), shows
    its progress in the panel, and Cancel stops it; Build starts it again."""
    import threading
    from vramscope.viewer.model import whatif as model_whatif
    d = open_and_wait(qt, window, str(QLORA))
    panel = window.whatif_panel
    started, gate, threads = threading.Event(), threading.Event(), []
    real = model_whatif.CategoryLive.build

    def slow_build(da):
        threads.append(threading.current_thread())
        started.set()
        gate.wait(30)
        return real(da)
    monkeypatch.setattr(model_whatif.CategoryLive, "build", staticmethod(slow_build))
    window.docks["whatif"].show()
    window.docks["whatif"].raise_()
    qt.waitUntil(started.is_set, timeout=5000)
    assert threads[0] is not threading.main_thread() and panel.session is None
    assert panel.building.isVisible() and panel.building_btn.text() == "Cancel"
    qt.mouseClick(panel.building_btn, Qt.MouseButton.LeftButton)
    gate.set()
    qt.waitUntil(lambda: panel.building_btn.text() == "Build", timeout=5000)
    assert panel.session is None and "Cancelled" in panel.building_label.text()
    qt.mouseClick(panel.building_btn, Qt.MouseButton.LeftButton)      # again, to the end this time
    qt.waitUntil(lambda: panel.session is not None, timeout=10000)
    assert not panel.building.isVisible() and set(panel.sliders) == set(panel.session.categories)
    assert panel.session.device == d.device


def test_budget_text_columns_share_the_width_and_wrap(qt, window):
    """The formulas fill the room the numbers leave (no sideways scrolling on a wide window);
    on a narrow one they keep a readable width and the table scrolls."""
    window.resize(1600, 1000)
    _d, panel = open_whatif(qt, window, QLORA)
    t = panel.table
    qt.waitUntil(lambda: t.horizontalScrollBar().maximum() == 0, timeout=2000)
    hh = t.horizontalHeader()
    assert sum(hh.sectionSize(c) for c in range(5)) == pytest.approx(t.viewport().width(), abs=2)
    assert hh.sectionSize(4) >= 220
    # the note follows its formula in the same cell
    notes = [t.item(r, 4).text() for r in range(t.rowCount())]
    assert any("zero_grad" in n or "after the peak" in n for n in notes)
    window.docks["whatif"].resize(600, 300)


def test_status_hint_fits_the_window(qt, window):
    from vramscope.viewer.window import MOUSE_HINTS
    for width in (1600, 1024):
        window.resize(width, 700)
        qt.wait(10)
        open_and_wait(qt, window, str(QLORA))
        sb = window.statusBar()
        msg = sb.currentMessage()
        assert msg in MOUSE_HINTS or msg.startswith("x axis in entries")
        labels = sum(w.sizeHint().width() for w in (window.status_file, window.status_device,
                                                    window.status_entries, window.status_peak))
        assert sb.fontMetrics().horizontalAdvance(msg) <= sb.width() - labels
    # narrowed after the hint was shown: it takes its shorter wording
    window.resize(1600, 700)
    open_and_wait(qt, window, str(QLORA))
    long = sb.currentMessage()
    window.resize(800, 700)
    qt.waitUntil(lambda: sb.currentMessage() != long, timeout=2000)
    labels = sum(w.sizeHint().width() for w in (window.status_file, window.status_device,
                                                window.status_entries, window.status_peak))
    assert sb.fontMetrics().horizontalAdvance(sb.currentMessage()) <= sb.width() - labels


def test_a_window_squeezed_small_keeps_drawing(qt, window):
    """Narrowing the window squeezes the timeline to nothing: with PySide6 6.12 an exception in
    an item's paint there killed the process (segfault); now nothing fails."""
    import io
    import sys
    err = io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        window.resize(1600, 1000)
        open_and_wait(qt, window, str(QLORA))
        for w, h in ((900, 600), (700, 600), (400, 300), (1400, 900)):
            window.resize(w, h)
            qt.wait(300)
            window.grab()
    finally:
        sys.stderr = old
    assert "failed" not in err.getvalue()


def test_survives_reports_once_and_returns_the_default(capsys):
    from vramscope.viewer.qt import survives

    @survives(list)
    def ticks(size):
        return 1 / size

    assert ticks(2) == 0.5
    assert ticks(0) == [] and ticks(0) == []
    err = capsys.readouterr().err
    assert err.count("ticks failed") == 1 and "ZeroDivisionError" in err


def test_levers_read_whole_in_a_1024_pixel_window(qt, window):
    window.resize(1024, 700)
    _d, panel = open_whatif(qt, window, QLORA)
    qt.wait(100)
    for name, cb in panel.levers.items():
        assert cb.width() >= cb.sizeHint().width(), name                  # the lever's name is not cut
    # its factors sit beside it, wrapped; a click on them ticks the lever
    cb = panel.levers["checkpointing"] if "checkpointing" in panel.levers else next(iter(panel.levers.values()))
    r = panel.lever_box.indexOf(cb)
    row, _col, _rs, _cs = panel.lever_box.getItemPosition(r)
    factors = panel.lever_box.itemAtPosition(row, 1).widget()
    assert factors.wordWrap() and ("×" in factors.text() or "simulated" in factors.text())
    qt.mouseClick(factors, Qt.MouseButton.LeftButton)
    assert cb.isChecked()
    qt.waitUntil(lambda: panel.checked_levers() != [], timeout=1000)


def test_a_lever_that_cannot_apply_is_disabled_and_says_why(qt, window):
    _d, panel = open_whatif(qt, window, REPO / "tests" / "data" / "cuda_lora.pickle")
    cb = panel.levers["lora"]
    assert not cb.isEnabled() and "Does not apply" in cb.toolTip()
    assert not panel.levers["expandable_segments"].isEnabled()
    assert panel.levers["checkpointing"].isEnabled()
    qt.mouseClick(cb, Qt.MouseButton.LeftButton)
    assert not cb.isChecked() and panel.checked_levers() == []


def test_a_long_file_name_does_not_hold_the_window_wide(qt, window, tmp_path):
    import shutil
    long = tmp_path / ("kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep_" + "x" * 30 + ".pickle")
    shutil.copyfile(QLORA, long)
    open_and_wait(qt, window, str(long))
    label = window.status_file
    assert len(label.text()) <= 40 and "…" in label.text() and str(long) in label.toolTip()
    window.resize(1024, 700)
    qt.wait(100)
    assert window.width() == 1024
