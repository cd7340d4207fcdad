"""Compare in the viewer (issue 15): File > Compare With… loads B off the GUI thread and
shows what `vramscope compare A B` says, on one axis; Swap makes B the file shown."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QFileDialog  # noqa: E402

from helpers import DATA, GROUNDTRUTH, SHARED, load_trusted  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, new_window, open_and_wait  # noqa: E402
from vramscope.cli import main  # noqa: E402
from vramscope.common.units import fmt_bytes  # noqa: E402
from vramscope.present.words import signed_bytes  # noqa: E402

BASE, CKPT = (str(GROUNDTRUTH / f"{n}.pickle") for n in ("ft_base", "ft_checkpointing"))


@pytest.fixture
def window(qt):
    return new_window(qt)


def cli_compare(capsys, a: str, b: str) -> dict:
    """What `vramscope compare A B --json` prints."""
    capsys.readouterr()
    assert main(["compare", a, b, "--json", "--no-cache"]) == 0
    return json.loads(capsys.readouterr().out)


def compare_through_the_menu(qt, w, monkeypatch, path: str):
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (path, "")))
    assert w.act_compare.isEnabled() and w.act_compare in w.menuBar().actions()[0].menu().actions()
    with qt.waitSignal(w.compared, timeout=LOAD_TIMEOUT):
        w.act_compare.trigger()
    qt.wait(1)


def assert_shows(panel, doc: dict):
    """The panel's numbers are the command line's (one device: 0)."""
    (d,) = doc["devices"]
    a, b = d["a"]["peak"], d["b"]["peak"]
    cats = panel.category_rows()
    assert cats["peak live"] == (fmt_bytes(a["bytes"]), fmt_bytes(b["bytes"]), signed_bytes(d["delta"]["peak_bytes"]))
    act = d["delta"]["by_category"]["activations"]
    assert cats["activations"] == (fmt_bytes(a["by_category"]["activations"]), fmt_bytes(b["by_category"]["activations"]),
                                   signed_bytes(act))
    assert set(cats) == {"peak live"} | set(d["delta"]["by_category"])
    s0 = d["sites"][0]
    rows = panel.site_rows()
    assert rows[0] == (s0["where"], fmt_bytes(s0["a_bytes"]), fmt_bytes(s0["b_bytes"]), signed_bytes(s0["delta"]))
    assert [r[0] for r in rows] == [s["where"] for s in d["sites"]]      # largest change first, as printed
    assert d["headline"] in panel.headline.text()
    return d


def test_compare_with_through_the_menu_shows_the_command_lines_numbers_and_swaps(qt, window, monkeypatch, capsys):
    open_and_wait(qt, window, BASE)
    assert window.docks["compare"].isHidden() and not window.act_swap.isEnabled()
    compare_through_the_menu(qt, window, monkeypatch, CKPT)
    panel = window.compare_panel
    assert window.on_screen("compare") and window.loading.progress.dialog is None
    assert window.path == os.path.abspath(BASE) and window.compare.result.b.path == os.path.abspath(CKPT)

    d = assert_shows(panel, cli_compare(capsys, BASE, CKPT))
    # checkpointing: the same run, 4.04 MiB lower, 7.58 MiB fewer activations at the peak
    assert d["delta"]["peak_bytes"] < 0 and d["delta"]["by_category"]["activations"] < 0
    assert panel.category_rows()["activations"][2] == "-7.58 MiB"
    assert panel.site_rows()[0][0] == "record_runs.py:forward" and panel.site_rows()[0][3] == "-3.29 MiB"

    # both totals on one axis, each curve reaching its own peak exactly (per-pixel envelopes)
    totals = panel.totals
    ya, yb = (c.getData()[1] for c in totals.curves)
    assert ya.max() == d["a"]["peak"]["bytes"] and yb.max() == d["b"]["peak"]["bytes"]
    # aligned at each side's first iteration's start: both iteration 1 starts at x = 0
    sa, sb = totals.sides
    for s, side in ((sa, d["a"]), (sb, d["b"])):
        start = side["iterations"][0]["start_index"]
        assert float(s.x_of_index(start, totals.mode, totals.seconds)) == 0.0
    # by iteration: iteration 2 of A over iteration 2 of B
    panel.align.setCurrentIndex(panel.align.findData("iteration"))
    assert totals.mode == "iteration" and totals.axis_x.iterations
    for s, side in ((sa, d["a"]), (sb, d["b"])):
        assert float(s.x_of_index(side["iterations"][1]["start_index"], totals.mode, totals.seconds)) == 1.0
    ya, yb = (c.getData()[1] for c in totals.curves)
    assert ya.max() == d["a"]["peak"]["bytes"] and yb.max() == d["b"]["peak"]["bytes"]

    # swap: B is the file shown, and the comparison reads the other way round
    with qt.waitSignal(window.compared, timeout=LOAD_TIMEOUT):
        qt.mouseClick(panel.swap_button, Qt.MouseButton.LeftButton)
    qt.wait(1)
    assert window.path == os.path.abspath(CKPT) and "ft_checkpointing.pickle" in window.windowTitle()
    assert window.data.peak_bytes == d["b"]["peak"]["bytes"]
    assert window.compare.result.b.path == os.path.abspath(BASE)
    swapped = assert_shows(panel, cli_compare(capsys, CKPT, BASE))
    assert swapped["delta"]["peak_bytes"] == -d["delta"]["peak_bytes"]
    assert panel.category_rows()["activations"][2] == "+7.58 MiB"
    # and back
    with qt.waitSignal(window.compared, timeout=LOAD_TIMEOUT):
        window.act_swap.trigger()
    assert window.path == os.path.abspath(BASE)
    assert panel.category_rows()["peak live"][2] == "-4.04 MiB"


def test_a_site_shows_its_allocations_live_at_as_peak(qt, window, monkeypatch):
    d = open_and_wait(qt, window, BASE)
    compare_through_the_menu(qt, window, monkeypatch, CKPT)
    panel = window.compare_panel
    item = panel.sites.topLevelItem(0)
    panel.sites.scrollToItem(item)
    at = panel.sites.visualItemRect(item).center()
    qt.mouseClick(panel.sites.viewport(), Qt.MouseButton.LeftButton, pos=at)       # a double-click: press,
    qt.mouseDClick(panel.sites.viewport(), Qt.MouseButton.LeftButton, pos=at)      # release, then the second
    dc = window.compare.result.device(0)
    site = dc.sites[0]
    rows = np.array([window.table_panel.model.row_id(r) for r in range(window.table_panel.model.rowCount())])
    assert len(rows) == site.a_count > 0
    assert int(d.allocs.size[rows].sum()) == site.a_bytes              # what the A column says
    assert window.table_panel.chip.isVisible() and window.on_screen("allocations")
    assert "record_runs.py:forward live at A's peak" in window.table_panel.chip_label.text()


def _write(path, obj) -> str:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=4)
    return str(path)


def test_files_the_command_line_refuses_get_its_one_line_in_a_message_box(qt, window, tmp_path, monkeypatch):
    open_and_wait(qt, window, BASE)
    obj = load_trusted(BASE)
    obj["device_traces"] = [[], obj["device_traces"][0]]
    for seg in obj["segments"]:
        seg["device"] = 1
    cases = [
        (_write(tmp_path / "dev1.pickle", obj), "no device in common"),
        (_write(tmp_path / "weights.pickle", {"state_dict": [1, 2, 3]}), "weights.pickle"),
        (_write(tmp_path / "empty.pickle", {"segments": [], "device_traces": [[], []]}), "nothing to compare"),
        (str(tmp_path / "missing.pickle"), "missing.pickle"),
    ]
    for path, words in cases:
        monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, p=path, **k: (p, "")))
        with qt.waitSignal(window.loading.worker.failed, timeout=LOAD_TIMEOUT):
            window.act_compare.trigger()
        box = window.error_box
        assert box is not None and box.isVisible() and box.windowTitle() == "Cannot compare"
        assert words in box.text() and "Traceback" not in box.text() and box.text().count("\n") <= 2
        assert window.compare.result is None and window.path == os.path.abspath(BASE)   # A stays as it was
    window.close_error()


def test_another_file_closes_the_comparison_and_a_device_switch_keeps_it(qt, window, monkeypatch):
    open_and_wait(qt, window, BASE)
    compare_through_the_menu(qt, window, monkeypatch, CKPT)
    open_and_wait(qt, window, str(DATA / "keep_loss.pickle"))
    assert window.compare.result is None and window.docks["compare"].isHidden() and not window.act_swap.isEnabled()
    # several devices: the panel follows the device the timeline shows
    multi = str(DATA / "multi_device_oom.pickle")
    open_and_wait(qt, window, multi)
    compare_through_the_menu(qt, window, monkeypatch, multi)
    assert window.compare.result.devices == [0, 1, 2]
    assert "cuda:1" in window.compare_panel.headline.text()
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        window.show_device(0)
    assert window.compare.result is not None and window.compare_panel.dc.device == 0
    assert window.compare_panel.category_rows()["peak live"][2] == "0 B"     # the file with itself


def test_loading_b_shows_progress_and_cancel_leaves_a_alone(qt, window):
    import threading
    open_and_wait(qt, window, BASE)
    gate = threading.Event()
    window.loading.worker.submit(lambda progress: gate.wait(30))      # the worker busy: B's load waits its turn
    window.compare_with(CKPT)
    dlg = window.loading.progress.dialog
    assert dlg is not None and dlg.labelText().startswith("Comparing with ft_checkpointing.pickle")
    with qt.waitSignal(window.loading.worker.cancelled, timeout=LOAD_TIMEOUT):
        dlg.canceled.emit()                                    # what its Cancel button says
        gate.set()
    assert window.loading.progress.dialog is None and window.compare.result is None
    assert window.path == os.path.abspath(BASE) and window.docks["compare"].isHidden()
    assert window.statusBar().currentMessage() == "Loading cancelled"


def test_a_state_only_b_is_compared_with_its_note(qt, window, tmp_path, monkeypatch):
    obj = load_trusted(BASE)
    obj["device_traces"] = [[]]
    state = _write(tmp_path / "state.pickle", obj)
    open_and_wait(qt, window, BASE)
    compare_through_the_menu(qt, window, monkeypatch, state)
    panel = window.compare_panel
    assert "B has no trace (a state-only snapshot)" in panel.headline.text()
    b = window.compare.result.b.analysis.devices[0]
    assert panel.totals.curves[1].getData()[1].max() == b.peak.bytes > 0
    # no iterations in B: by iteration cannot be chosen, and the axis stays aligned at the start
    panel.align.setCurrentIndex(panel.align.findData("iteration"))
    assert panel.totals.mode == "start" and panel.align.currentData() == "start"


# -- at 1024x700 (a laptop), with real CUDA recordings whose peaks are close in time ------------
KAITLYN = "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_{}.pickle"
PAIRS = [pytest.param((DATA / "cuda_lora.pickle", DATA / "cuda_ckpt.pickle"), id="cuda_lora-cuda_ckpt"),
         pytest.param((SHARED / KAITLYN.format("fullstep"), SHARED / KAITLYN.format("forward_mixed")),
                      id="ctx128_fullstep-forward_mixed")]


@pytest.fixture(params=PAIRS)
def compared_at_1024(request, qt, window, monkeypatch, tmp_path):
    """The window at 1024x700 comparing a real pair (copies: the viewer writes beside its files)."""
    import shutil
    a, b = request.param
    if not (a.is_file() and b.is_file()):
        pytest.skip(f"{a.name} or {b.name} is not here")
    a, b = (shutil.copy(p, tmp_path / p.name) for p in (a, b))
    window.resize(1024, 700)
    open_and_wait(qt, window, str(a))
    compare_through_the_menu(qt, window, monkeypatch, str(b))
    qt.wait(50)
    return window.compare_panel


def test_at_1024_the_headers_file_names_are_whole_beside_the_controls(qt, compared_at_1024):
    panel = compared_at_1024
    files = panel.files
    assert "<b>B</b>" in files.text() and files.isVisible()
    assert files.width() >= files.sizeHint().width(), "the names are cut"
    at = files.geometry()
    for control in (panel.align, panel.swap_button, panel.close_button):
        assert control.isVisible() and not control.geometry().intersects(at), control.text() \
            if hasattr(control, "text") else control.currentText()


def test_at_1024_the_peak_labels_are_apart_and_inside_the_plot(qt, compared_at_1024):
    totals = compared_at_1024.totals
    a, b = (lab.sceneBoundingRect() for lab in totals.peak_labels)
    assert not a.intersects(b), (a, b)
    plot = totals.vb.sceneBoundingRect()
    for lab, r in zip(totals.peak_labels, (a, b)):
        assert lab.isVisible() and plot.contains(r), (lab.toPlainText(), r, plot)
    # each still names its own peak, beside its own line
    for k, (lab, line) in enumerate(zip(totals.peak_labels, totals.peak_lines)):
        assert lab.toPlainText().startswith(f"{'AB'[k]} peak ")
        x = totals.vb.mapViewToScene(pg_point(line.value(), 0)).x()
        r = lab.sceneBoundingRect()
        assert min(abs(r.left() - x), abs(r.right() - x)) <= 1.5
    # zoomed in and out again, they stay apart
    (x0, x1), _ = totals.vb.viewRange()
    for lo, hi in ((x0, x0 + (x1 - x0) * 0.4), (x0, x1)):
        totals.vb.setXRange(lo, hi, padding=0)
        qt.wait(20)
        a, b = (lab.sceneBoundingRect() for lab in totals.peak_labels)
        assert not a.intersects(b)


def pg_point(x, y):
    import pyqtgraph as pg
    return pg.Point(x, y)


def test_at_1024_the_x_axis_title_is_whole_in_every_alignment(qt, compared_at_1024):
    panel = compared_at_1024
    axis, plot = panel.totals.axis_x, panel.totals.plot
    for mode in ("iteration", "start"):
        panel.align.setCurrentIndex(panel.align.findData(mode))
        qt.wait(20)
        title = axis.label.toPlainText()
        m = axis.label.document().documentMargin()        # the text's own rectangle, inside that margin
        r = axis.label.mapRectToScene(axis.label.boundingRect().adjusted(m, m, -m, -m))
        at = axis.mapRectToScene(axis.boundingRect())
        assert r.left() >= at.left() and r.right() <= at.right(), (title, r, at)      # under the axis, whole
        assert plot.sceneRect().contains(r), (title, r, plot.sceneRect())
        assert "iteration" in title
    # what the words would say at a greater width is in the tooltip
    assert "since each side's first iteration's start" in axis.toolTip()
