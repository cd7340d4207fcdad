"""Annotations and exports in the viewer, driven through the window's actions (pytest-qt, offscreen).

Every test works on a copy of a snapshot in tmp_path, and VRAMSCOPE_DATA_DIR /
VRAMSCOPE_CACHE_DIR point into tmp_path, so nothing touches the repository or the home directory.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QEvent, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QMouseEvent  # noqa: E402
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QPushButton  # noqa: E402

from vramscope.services import annotations as am  # noqa: E402
from vramscope.services.annotations import AnnotationStore  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, new_window, open_and_wait  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "assets" / "example.pickle"
DATA = REPO / "tests" / "data"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A private data dir and no column cache: nothing outside tmp_path is written."""
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "userdata"))
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    return tmp_path


@pytest.fixture
def snap(env):
    d = env / "runs"
    d.mkdir()
    p = d / "example.pickle"
    shutil.copyfile(EXAMPLE, p)
    return str(p)


@pytest.fixture
def window(qt, env):
    return new_window(qt)


class Notes:
    """Stands in for the note dialog: answers queued texts (or cancels) and records what it was shown."""

    def __init__(self, monkeypatch):
        from vramscope.viewer.window import dialogs
        self.answers: list[str | None] = []
        self.asked: list[tuple[str, str, str]] = []
        monkeypatch.setattr(dialogs, "ask_note", self)

    def __call__(self, parent, title, label, text="", *args, **kwargs):
        self.asked.append((title, label, text))
        answer = self.answers.pop(0)
        return None if answer is None else answer.strip()


@pytest.fixture
def notes(monkeypatch):
    return Notes(monkeypatch)


def sidecar(path: str) -> list[dict]:
    with open(path + ".vramscope.json", "rb") as fh:
        return orjson.loads(fh.read())["annotations"]


def render(qt, w):
    """Paint the timeline now (the notes lay their labels out when painted)."""
    w.timeline.refresh_now()
    w.timeline.plot.viewport().repaint()
    qt.wait(1)


def ctrl_drag(w, x0: float, x1: float, y: float):
    """A real Ctrl+left-drag on the plot from data x0 to x1 (press, moves, release)."""
    vp = w.timeline.plot.viewport()
    vb = w.timeline.vb
    ctrl, left = Qt.KeyboardModifier.ControlModifier, Qt.MouseButton.LeftButton

    def at(x):
        return QPointF(w.timeline.plot.mapFromScene(vb.mapViewToScene(QPointF(x, y))))

    def send(kind, pos, button, buttons):
        QApplication.sendEvent(vp, QMouseEvent(kind, pos, QPointF(vp.mapToGlobal(pos.toPoint())), button, buttons,
                                               ctrl))
    send(QEvent.Type.MouseButtonPress, at(x0), left, left)
    for k in range(1, 9):
        send(QEvent.Type.MouseMove, at(x0 + (x1 - x0) * k / 8), Qt.MouseButton.NoButton, left)
    send(QEvent.Type.MouseButtonRelease, at(x1), left, Qt.MouseButton.NoButton)


# -- adding, undoing, reopening -----------------------------------------------------------------------

def test_range_peak_and_allocation_notes_are_saved_and_undone(qt, window, snap, notes):
    d = open_and_wait(qt, window, snap)
    w = window
    assert w.notes.store is not None and w.notes.store.path == snap + ".vramscope.json"
    assert not os.path.exists(w.notes.store.path)           # nothing written before the first note
    assert w.notes_panel.count() == 0 and not w.act_undo.isEnabled()

    # a range: marked by a Ctrl+drag on the timeline, then "Annotate Range"
    x0, x1 = float(d.x_of_index(1200)), float(d.x_of_index(1500))
    ctrl_drag(w, x0, x1, d.peak_bytes / 3)
    assert w.timeline.marked_range() == pytest.approx((x0, x1), abs=(x1 - x0) * 0.02)
    assert w.timeline.x_span()[1] - w.timeline.x_span()[0] > (x1 - x0) * 2     # it did not box-zoom
    first, last = w.entries_in(*w.timeline.marked_range())
    notes.answers.append("forward of step 2\nlooks like step 1")
    w.act_note_range.trigger()
    assert "marked range" in notes.asked[-1][0] and f"entries {first:,}-{last:,}" in notes.asked[-1][1]
    assert w.timeline.marked_range() is None                   # used up by the note

    # the peak: "Annotate Peak" takes the global peak; its default note is the finding's title
    notes.answers.append("autograd spike")
    w.act_note_peak.trigger()
    assert notes.asked[-1][2] == d.findings[0].title

    # an allocation: needs a selected row first
    assert not w.act_note_alloc.isEnabled()
    row = d.rows_by_size[0]
    w.select_row(int(row), source="table")
    assert w.act_note_alloc.isEnabled()
    notes.answers.append("the biggest block")
    w.act_note_alloc.trigger()
    assert d.category_name(int(d.category[row])) in notes.asked[-1][2]

    # a cancelled dialog adds nothing
    notes.answers.append(None)
    w.act_note_peak.trigger()

    on_disk = sidecar(snap)
    assert [a["kind"] for a in on_disk] == ["range", "peak", "allocation"]
    rng, pk, al = on_disk
    assert rng["note"] == "forward of step 2\nlooks like step 1"
    assert (rng["start_index"], rng["end_index"]) == (first, last) and rng["device"] == d.device
    assert 1150 <= first <= 1250 and 1450 <= last <= 1550
    assert rng["start_us"] == int(d.tkey[first]) if d.has_time else "start_us" not in rng
    assert pk["index"] == d.findings[0].index and pk["note"] == "autograd spike"
    assert al["alloc_index"] == int(d.alloc_index[row]) and al["addr"] == int(d.allocs.addr[row])

    assert w.notes_panel.count() == 3 and w.docks["annotations"].windowTitle() == "Annotations (3)"
    assert w.notes_panel.item(0).text(2) == "forward of step 2"            # first line in the list
    assert len(w.timeline.notes.marks) == 3

    # undo removes the last note, on screen and on disk; redo brings it back
    assert w.act_undo.text().replace("&", "") == "Undo Add Note"
    w.act_undo.trigger()
    assert [a["kind"] for a in sidecar(snap)] == ["range", "peak"]
    assert w.notes_panel.count() == 2 and len(w.timeline.notes.marks) == 2
    assert w.act_redo.isEnabled()
    w.act_redo.trigger()
    assert [a["kind"] for a in sidecar(snap)] == ["range", "peak", "allocation"]
    w.act_undo.trigger()
    assert [a["kind"] for a in sidecar(snap)] == ["range", "peak"]

    # edit the peak's note from the list, delete the range, undo the delete
    w.notes_panel.select(w.notes.store.annotations[1].id)
    notes.answers.append("autograd spike (edited)")
    w.act_note_edit.trigger()
    assert [a["note"] for a in sidecar(snap)] == ["forward of step 2\nlooks like step 1", "autograd spike (edited)"]
    w.notes_panel.select(w.notes.store.annotations[0].id)
    w.act_note_delete.trigger()
    assert [a["kind"] for a in sidecar(snap)] == ["peak"]
    w.act_undo.trigger()
    assert [a["kind"] for a in sidecar(snap)] == ["range", "peak"]


def test_notes_come_back_drawn_and_navigable(qt, env, snap):
    st = AnnotationStore(snap)
    rng = st.add(kind="range", device=0, start_index=1700, end_index=2100, note="third step\nsecond line")
    pk = st.add(kind="peak", device=0, index=954, note="autograd spike at backward start")
    al = st.add(kind="allocation", device=0, alloc_index=954, note="this block")
    w = new_window(qt)
    d = open_and_wait(qt, w, snap)
    assert [w.notes_panel.item(k).text(2) for k in range(3)] == ["third step", "autograd spike at backward start",
                                                                  "this block"]
    assert w.docks["annotations"].windowTitle() == "Annotations (3)"
    marks = {m.id: m for m in w.timeline.notes.marks}
    assert marks[rng.id].kind == "range"
    assert (marks[rng.id].x0, marks[rng.id].x1) == pytest.approx((d.x_of_index(1700), d.x_of_index(2100)))
    assert marks[pk.id].x0 == pytest.approx(d.x_of_index(954))

    # drawn: every label placed without overlaps, and hovering one tells the whole note
    render(qt, w)
    tl = w.timeline
    assert set(tl.notes.placed) == {rng.id, pk.id, al.id}
    chips = [r for r, _ in tl.notes.hits if r.height() < 40]
    assert len(chips) == 3
    assert not any(a.intersects(b) for i, a in enumerate(chips) for b in chips[i + 1:])
    label = next(r for r, i in tl.notes.hits if i == rng.id and r.height() < 40)
    assert "second line" in tl.notes.tooltip_at(label.center().x(), label.center().y())
    vp_point = label.center().toPoint()
    qt.mouseMove(tl.plot.viewport(), vp_point)
    qt.waitUntil(lambda: tl.hover_label.isVisible(), timeout=2000)
    # one box tells the note: the hover label, and no Qt tooltip on top of it
    assert "third step" in tl.hover_label.textItem.toPlainText() and tl.notes.toolTip() == ""

    # clicking a note in the list goes there
    tl.set_x_range(0, 50)
    w.notes_panel.tree.itemClicked.emit(w.notes_panel.item(0), 0)
    x0, x1 = tl.x_span()
    assert x0 <= d.x_of_index(1700) and d.x_of_index(2100) <= x1 and x1 - x0 < d.x_range[1] * 0.3
    assert tl.notes.current == rng.id
    w.notes_panel.tree.itemClicked.emit(w.notes_panel.item(1), 0)
    assert tl.cursor_line.value() == pytest.approx(d.x_of_index(954)) and w.pinned_index == 954
    w.notes_panel.tree.itemClicked.emit(w.notes_panel.item(2), 0)
    assert w.selected_row == d.row_of_alloc_event(954) >= 0

    # another file: its own (empty) notes; the first file's notes are not drawn on it
    other = env / "runs" / "clean_loop.pickle"
    shutil.copyfile(DATA / "clean_loop.pickle", other)
    open_and_wait(qt, w, str(other))
    assert w.notes.store.snapshot_path == str(other) and w.notes_panel.count() == 0
    assert tl.notes.marks == [] and w.docks["annotations"].windowTitle() == "Annotations"
    # and back: the notes are still there
    open_and_wait(qt, w, snap)
    assert w.notes_panel.count() == 3 and len(tl.notes.marks) == 3


def test_reopening_the_window_brings_notes_back(qt, env, snap, notes):
    w = new_window(qt)
    open_and_wait(qt, w, snap)
    notes.answers += ["whole run", "the peak"]
    w.act_note_range.trigger()          # nothing marked: the visible range
    w.act_note_peak.trigger()
    d = w.data
    assert [(a["start_index"], a["end_index"]) for a in sidecar(snap)[:1]] == [(0, d.n - 1)]
    w.close()
    w2 = new_window(qt)
    open_and_wait(qt, w2, snap)
    assert [a.note for a in w2.notes.store] == ["whole run", "the peak"]
    render(qt, w2)
    assert len(w2.timeline.notes.marks) == 2 and len(w2.timeline.notes.placed) == 2


def test_notes_of_other_devices(qt, window, env):
    path = env / "multi.pickle"
    shutil.copyfile(DATA / "multi_device.pickle", path)
    st = AnnotationStore(str(path))
    a2 = st.add(kind="range", device=2, start_index=2, end_index=9, note="on device 2")
    st.add(kind="range", device=0, start_index=1, end_index=3, note="on device 0")
    d = open_and_wait(qt, window, str(path), device=2)
    assert d.device == 2
    assert [m.id for m in window.timeline.notes.marks] == [a2.id]
    assert window.notes_panel.count() == 2             # listed, greyed: still editable and deletable
    store = window.notes.store
    with qt.waitSignal(window.loaded, timeout=LOAD_TIMEOUT):
        window.device_combo.activated.emit(window.device_combo.findData(0))
    assert window.notes.store is store                       # same file: same store, same undo history
    assert [m.label for m in window.timeline.notes.marks] == ["2 · on device 0"]
    window.notes_panel.tree.itemClicked.emit(window.notes_panel.item(0), 0)
    assert "cuda:2" in window.statusBar().currentMessage()


def test_keyboard_shortcuts(qt, window, snap, notes):
    w = window
    assert w.act_note_range.shortcut().toString() == "A"
    assert w.act_note_peak.shortcut().toString() == "Shift+P"
    assert w.act_note_alloc.shortcut().toString() == "Shift+A"
    assert w.act_undo.shortcut().toString() == "Ctrl+Z"
    assert [s.toString() for s in w.act_redo.shortcuts()] == ["Ctrl+Shift+Z", "Ctrl+Y"]
    assert not w.act_note_range.isEnabled() and not w.act_note_peak.isEnabled()
    open_and_wait(qt, w, snap)
    w.activateWindow()
    w.timeline.plot.setFocus()
    qt.waitUntil(lambda: w.isActiveWindow(), timeout=2000)
    notes.answers.append("typed with A")
    qt.keyClick(w.timeline.plot, Qt.Key.Key_A)
    assert [a["note"] for a in sidecar(snap)] == ["typed with A"]
    notes.answers.append("typed with Shift+P")
    qt.keyClick(w.timeline.plot, Qt.Key.Key_P, Qt.KeyboardModifier.ShiftModifier)
    assert [a["kind"] for a in sidecar(snap)] == ["range", "peak"]
    qt.keyClick(w.timeline.plot, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert [a["kind"] for a in sidecar(snap)] == ["range"]
    qt.keyClick(w.timeline.plot, Qt.Key.Key_Z,
                Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert [a["kind"] for a in sidecar(snap)] == ["range", "peak"]
    # Delete only acts in the notes list: pressed on the timeline it deletes nothing
    w.notes_panel.select(w.notes.store.annotations[0].id)
    qt.keyClick(w.timeline.plot, Qt.Key.Key_Delete)
    assert len(sidecar(snap)) == 2
    w.notes_panel.tree.setFocus()
    qt.keyClick(w.notes_panel.tree, Qt.Key.Key_Delete)
    assert [a["kind"] for a in sidecar(snap)] == ["peak"]


# -- a read-only folder ------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["chmod", "denied_access"])
def test_read_only_folder_sends_notes_to_the_data_dir(qt, window, env, notes, monkeypatch, how):
    folder = env / "readonly"
    folder.mkdir()
    path = folder / "example.pickle"
    shutil.copyfile(EXAMPLE, path)
    if how == "chmod":   # root too: a folder nobody may write to is left alone (services.annotations.dir_writable)
        folder.chmod(0o555)
    else:                # what os.access says about a read-only mount, whoever runs the test
        real = os.access
        monkeypatch.setattr(am.os, "access", lambda p, mode, *a, **k: False if os.path.abspath(p) == str(folder)
                            and mode & os.W_OK else real(p, mode, *a, **k))
    try:
        window.resize(1024, 700)               # the status bar's room is short: the notice still reads whole
        open_and_wait(qt, window, str(path))
        data_dir = str(env / "userdata")
        assert window.notes.store.path.startswith(data_dir)
        # a clear, non-blocking notice: in the panel, in the status bar (message and a permanent label)
        notice = window.notes_panel.notice
        assert not notice.isHidden() and window.notes.store.path in notice.text().replace("~", os.path.expanduser("~"))
        assert "read-only" in notice.text() and str(folder) in notice.text()
        said = window.statusBar().currentMessage()
        assert "read-only" in said
        # whole beside the status bar's labels (a shorter wording where the full one does not fit)
        assert window.statusBar().fontMetrics().horizontalAdvance(said) <= window.statusBar().room()
        assert not window.status_notes.isHidden() and window.notes.store.path in window.status_notes.toolTip()
        assert window.error_box is None
        notes.answers.append("kept elsewhere")
        window.act_note_peak.trigger()
        assert os.path.exists(window.notes.store.path)
        assert not os.path.exists(str(path) + ".vramscope.json")
        assert [a.note for a in AnnotationStore(str(path))] == ["kept elsewhere"]
    finally:
        folder.chmod(0o755)


def test_writable_folder_has_no_notice(qt, window, snap):
    open_and_wait(qt, window, snap)
    assert window.notes_panel.notice.isHidden() and window.status_notes.isHidden()


# -- File > Export ---------------------------------------------------------------------------------------

def finish_export(qt, window):
    """Exports run on the window's export worker: wait for it."""
    qt.waitUntil(lambda: not window.exports.worker.busy, timeout=60000)


def test_exports_are_disabled_until_a_file_is_loaded(qt, window, snap):
    acts = (window.act_export_report, window.act_export_trimmed, window.act_export_perfetto)
    assert not any(a.isEnabled() for a in acts)
    menu_texts = [a.text().replace("&", "") for a in window.menuBar().actions()[0].menu().actions()]
    for text in ("Export Report…", "Export Trimmed Snapshot…", "Export Perfetto Trace…"):
        assert text in menu_texts
    open_and_wait(qt, window, snap)
    assert all(a.isEnabled() for a in acts)


def test_export_report_from_the_menu(qt, window, snap, env, notes, monkeypatch):
    open_and_wait(qt, window, snap)
    notes.answers.append("my peak note for the report")
    window.act_note_peak.trigger()
    out = env / "report"
    asked = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (asked.append(a) or str(out), ""))
    window.act_export_report.trigger()
    finish_export(qt, window)
    assert asked and window.error_box is None
    # a new folder is proposed next to the snapshot, and made
    assert asked[0][2] == os.path.join(os.path.dirname(snap), "example-report")
    assert out.is_dir()
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "my peak note for the report" in md
    analysis = json.loads((out / "analysis.json").read_text())
    assert [a["note"] for a in analysis["annotations"]] == ["my peak note for the report"]
    assert analysis["devices"][0]["peak"]["bytes"] == window.data.peak_bytes
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out) in window.statusBar().currentMessage()
    assert QApplication.overrideCursor() is None          # the busy cursor is gone


def test_export_report_error_is_a_message_box(qt, window, snap, env, monkeypatch):
    open_and_wait(qt, window, snap)
    blocker = env / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(blocker / "report"), ""))
    window.act_export_report.trigger()
    finish_export(qt, window)
    box = window.error_box
    assert box is not None and "report" in box.windowTitle()
    assert "Traceback" not in box.text() and "\n" not in box.text() and str(blocker) in box.text()
    assert QApplication.overrideCursor() is None


@pytest.mark.parametrize("choice", ["peak", "marked", "visible"])
def test_export_trimmed_snapshot_from_the_menu(qt, window, snap, env, monkeypatch, choice):
    from vramscope.parsers import open_snapshot
    d = open_and_wait(qt, window, snap)
    if choice == "marked":
        window.timeline.mark_range(float(d.x_of_index(500)), float(d.x_of_index(899)))
    elif choice == "visible":
        window.timeline.set_x_range(float(d.x_of_index(1000)), float(d.x_of_index(1999)))
    offered = []

    def pick(parent, title, label, items, *a, **k):
        offered.extend(items)
        return next(i for i in items if choice in i), True
    monkeypatch.setattr(QInputDialog, "getItem", pick)
    out = env / "trimmed"                              # no extension typed: .pickle is added
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    window.act_export_trimmed.trigger()
    finish_export(qt, window)
    assert window.error_box is None
    if choice == "peak":        # the whole run shown, nothing marked: no question asked
        assert offered == []
    else:
        assert len(offered) == 2 and "peak" in offered[-1]
    t = open_snapshot(str(out) + ".pickle", use_cache=False)
    n = len(t.trace(d.device))
    if choice == "peak":
        assert n == 2000
    elif choice == "marked":
        a, b = window.entries_in(float(d.x_of_index(500)), float(d.x_of_index(899)))
        assert n == b - a + 1 and 380 <= n <= 420
    else:
        a, b = window.entries_in(*window.timeline.x_span())
        assert n == b - a + 1 and n < d.n
    assert "cuda:" in window.statusBar().currentMessage()


def test_export_perfetto_from_the_menu(qt, window, snap, env, monkeypatch):
    d = open_and_wait(qt, window, snap)
    out = env / "trace.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    window.act_export_perfetto.trigger()
    finish_export(qt, window)
    assert window.error_box is None
    doc = json.loads(out.read_text())
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counters and {e["pid"] for e in counters} == {d.device}
    names = {e["name"] for e in counters}
    assert "activations" in names and "weights" in names
    top = {n: max(e["args"]["bytes"] for e in counters if e["name"] == n) for n in names}
    assert 0 < top["activations"] <= d.peak_bytes and 0 < top["weights"] <= d.peak_bytes
    assert str(out) in window.statusBar().currentMessage()


def test_cancelled_export_dialogs_write_nothing(qt, window, snap, env, monkeypatch):
    open_and_wait(qt, window, snap)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: ("", ""))
    before = sorted(os.listdir(env))
    for a in (window.act_export_report, window.act_export_trimmed, window.act_export_perfetto):
        a.trigger()
    assert sorted(os.listdir(env)) == before and window.error_box is None


def test_an_export_runs_on_its_worker_and_cancel_writes_nothing(qt, window, snap, env, monkeypatch):
    """The export runs off the GUI thread with a progress dialog; Cancel stops it before it
    writes (the window stays usable meanwhile: the GUI thread is free)."""
    import threading
    from vramscope.services import export as export_service
    open_and_wait(qt, window, snap)
    out = env / "trace.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    started, gate, threads = threading.Event(), threading.Event(), []
    real = export_service.perfetto_trace

    def slow_trace(*a, **k):
        threads.append(threading.current_thread())
        started.set()
        gate.wait(30)
        return real(*a, **k)
    monkeypatch.setattr(export_service, "perfetto_trace", slow_trace)
    window.act_export_perfetto.trigger()
    qt.waitUntil(started.is_set, timeout=10000)
    assert threads[0] is not threading.main_thread() and window.exports.worker.busy
    dlg = window.exports.progress.dialog
    assert dlg is not None and "Perfetto" in dlg.labelText()
    dlg.findChild(QPushButton).click()                  # Cancel
    gate.set()
    finish_export(qt, window)
    assert not out.exists() and window.error_box is None
    assert "cancelled" in window.statusBar().currentMessage()
    assert window.exports.progress.dialog is None


def test_the_report_is_written_off_the_gui_thread_and_its_png_drawn_on_it(qt, window, snap, env, monkeypatch):
    import threading
    from vramscope.services import report as report_service
    from vramscope.viewer import report_png
    open_and_wait(qt, window, snap)
    out = env / "report"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    where = {}
    real_report, real_png = report_service.write_report, report_png.render_timeline

    def report(*a, **k):
        where["report"] = threading.current_thread()
        return real_report(*a, **k)

    def png(*a, **k):
        where["png"] = threading.current_thread()
        return real_png(*a, **k)
    monkeypatch.setattr(report_service, "write_report", report)
    monkeypatch.setattr(report_png, "render_timeline", png)
    window.act_export_report.trigger()
    finish_export(qt, window)
    assert where["report"] is not threading.main_thread() and where["png"] is threading.main_thread()
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG" and (out / "analysis.json").exists()
    assert window.error_box is None and str(out) in window.statusBar().currentMessage()


# -- placing notes on a trace (no window) ------------------------------------------------------------------

def test_note_placement(tmp_path):
    from test_viewer_model import write_snapshot
    from vramscope.services.annotations import Annotation
    from vramscope.classifiers import analyze
    from vramscope.parsers import open_snapshot
    from vramscope.viewer.model import DeviceData
    from vramscope.viewer.model.notes import note_row, note_span
    snap = open_snapshot(write_snapshot(tmp_path / "t.pickle", 600, seed=5), use_cache=False)
    d = DeviceData(snap, analyze(snap), 0)
    assert d.has_time
    # a range given only by times (a hand-written sidecar) covers exactly the entries inside them
    t = d.tkey
    span = note_span(d, Annotation(kind="range", start_us=int(t[100]), end_us=int(t[200])))
    assert span is not None and t[span[0]] >= t[100] and t[span[1]] <= t[200]
    assert span[0] <= 100 and span[1] >= 200 and (span[0] == 0 or t[span[0] - 1] < t[100])
    # indices win over times; out-of-range indices are clipped to the trace
    assert note_span(d, Annotation(kind="range", start_index=900_000, end_index=5)) == (5, d.n - 1)
    # a peak without an index: the device's peak
    assert note_span(d, Annotation(kind="peak")) == (d.peak_index, d.peak_index)
    # another device: not placed
    assert note_span(d, Annotation(kind="peak", device=1, index=3)) is None
    # an allocation made in the trace, and one live before it began (found by its address)
    row = int(np.flatnonzero(d.alloc_index >= 0)[7])
    ann = Annotation(kind="allocation", alloc_index=int(d.alloc_index[row]), addr=int(d.allocs.addr[row]))
    assert note_row(d, ann) == row
    assert note_row(d, Annotation(kind="allocation", alloc_index=int(d.alloc_index[row]), addr=1)) == -1
    pre = int(np.flatnonzero(d.alloc_index < 0)[0])
    ann = Annotation(kind="allocation", alloc_index=-1, addr=int(d.allocs.addr[pre]))
    assert note_row(d, ann) == pre and note_span(d, ann) == (-1, -1)


def test_corrupt_sidecar_is_reported_not_fatal(qt, window, snap):
    with open(snap + ".vramscope.json", "wb") as fh:
        fh.write(b'{"annotations": [')
    d = open_and_wait(qt, window, snap)
    assert d is not None and window.error_box is None
    notice = window.notes_panel.notice
    assert not notice.isHidden() and "moved to" in notice.text()
    assert "could not be read" in window.statusBar().currentMessage()
    assert any(name.startswith("example.pickle.vramscope.json.corrupt-") for name in os.listdir(os.path.dirname(snap)))
