"""The timeline's hover box (issue 33, item 3), with real mouse and key events (pytest-qt,
offscreen): it goes when the pointer leaves the plot; after a wheel zoom, a pan or Home it
tells what is under the still pointer in the new view, inside the view; it is never in the
window saved as an image (Ctrl+E)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QImage, QWheelEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import open_and_wait  # noqa: E402

LORA = str(DATA / "cuda_lora.pickle")


def hover(qt, w, frac_x=0.5, frac_y=0.3) -> QPoint:
    """A real mouse move over the plot's viewport; returns where."""
    tl = w.timeline
    r = tl.vb.sceneBoundingRect()
    vp = tl.plot.mapFromScene(QPointF(r.left() + r.width() * frac_x, r.top() + r.height() * frac_y))
    qt.mouseMove(tl.plot.viewport(), vp)
    qt.waitUntil(tl.hover_label.isVisible, timeout=3000)
    return vp


def box_entry(w) -> int:
    """The entry the hover box tells about ('entry 1,234' in its first line)."""
    import re
    html = w.timeline.hover_label.textItem.toPlainText()
    return int(re.search(r"entry ([\d,]+)", html).group(1).replace(",", ""))


def under_pointer(w, vp: QPoint) -> int:
    tl = w.timeline
    x = tl.vb.mapSceneToView(tl.plot.mapToScene(vp)).x()
    return tl.pointer.index_under(x)


def assert_box_tells_what_is_under(w, vp: QPoint):
    tl = w.timeline
    assert tl.hover_label.isVisible()
    assert box_entry(w) == under_pointer(w, vp)
    x = tl.vb.mapSceneToView(tl.plot.mapToScene(vp)).x()
    assert tl.hover_line.value() == pytest.approx(x)
    # inside the view, not clipped
    box = tl.hover_label.mapRectToScene(tl.hover_label.boundingRect())
    assert tl.vb.sceneBoundingRect().adjusted(-2, -2, 2, 2).contains(box)


def test_the_box_goes_when_the_pointer_leaves_the_plot(qt, window):
    w = window
    open_and_wait(qt, w, LORA)
    hover(qt, w)
    tree = w.findings_panel.tree
    qt.mouseMove(tree.viewport(), QPoint(20, 20))             # into Findings
    qt.waitUntil(lambda: not w.timeline.hover_label.isVisible(), timeout=3000)
    assert not w.timeline.hover_line.isVisible()
    hover(qt, w, 0.3)
    table = w.table_panel.table
    qt.mouseMove(table.viewport(), QPoint(30, 10))            # into the table
    qt.waitUntil(lambda: not w.timeline.hover_label.isVisible(), timeout=3000)


def test_after_a_wheel_zoom_a_pan_and_home_the_box_tells_what_is_under_the_pointer(qt, window):
    w = window
    open_and_wait(qt, w, LORA)
    tl = w.timeline
    vp = hover(qt, w, 0.8, 0.2)
    assert_box_tells_what_is_under(w, vp)
    first = box_entry(w)
    vpw = tl.plot.viewport()
    for _ in range(3):                                        # a wheel zoom around the pointer
        ev = QWheelEvent(QPointF(vp), QPointF(vpw.mapToGlobal(vp)), QPoint(0, 0), QPoint(0, 120),
                         Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
        QApplication.sendEvent(vpw, ev)
        qt.wait(20)
    qt.wait(50)
    assert_box_tells_what_is_under(w, vp)
    tl.plot.setFocus()
    qt.keyClick(tl.plot, Qt.Key.Key_Left)                     # a pan: another entry under the pointer
    qt.wait(50)
    assert_box_tells_what_is_under(w, vp)
    panned = box_entry(w)
    qt.keyClick(tl.plot, Qt.Key.Key_Home)                     # the whole run again
    qt.wait(50)
    assert_box_tells_what_is_under(w, vp)
    assert box_entry(w) == first and panned != first


def test_the_box_is_never_in_the_saved_image(qt, window, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog
    w = window
    open_and_wait(qt, w, LORA)
    out = tmp_path / "window.png"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(out), "")))
    hover(qt, w, 0.5, 0.2)
    with_box = w.grab().toImage()
    w.timeline.plot.setFocus()
    w.statusBar().clearMessage()                 # (the save says so there, after the picture)
    qt.keyClick(w.timeline.plot, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert out.exists()
    saved = QImage(str(out)).convertToFormat(with_box.format())
    assert not w.timeline.hover_label.isVisible()
    assert w.statusBar().currentMessage() == "Saved window.png"
    w.statusBar().clearMessage()
    after = w.grab().toImage()
    assert saved == after.convertToFormat(with_box.format())
    assert saved != with_box
    # a folder that is not there: said in the status bar, nothing written
    gone = tmp_path / "gone" / "window.png"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(gone), "")))
    qt.keyClick(w.timeline.plot, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert w.statusBar().currentMessage().startswith("Could not write window.png: ")
    assert not gone.parent.exists()
