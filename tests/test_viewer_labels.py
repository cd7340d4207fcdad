"""Words on screen that must be whole and readable: the legend of each stacking mode, the
y axis' top label, labels on the plot that keep clear of each other, text in narrow panels
(pytest-qt, offscreen, real CUDA recordings)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QRectF, Qt  # noqa: E402
from PySide6.QtGui import QColor, QImage, QPainter  # noqa: E402

from helpers import require  # noqa: E402
from viewer_helpers import new_window, open_and_wait  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SHARED = REPO.parent / "shared" / "snapshots"
CRANBERRII = SHARED / "cranberrii+ftcourse__memory_snapshot.pickle"
MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def window(qt):
    return new_window(qt)


def sized(qt, w, width, height):
    w.resize(width, height)
    qt.wait(30)
    w.timeline.refresh_now()
    return w


def render(qt, w):
    """Paint the plot now (the items lay their labels out while painting)."""
    w.timeline.plot.viewport().repaint()
    qt.wait(5)


def device_rect(item, rect: QRectF) -> QRectF:
    """An item's rectangle in the plot's viewport pixels."""
    plot = item.scene().views()[0]
    return item.deviceTransform(plot.viewportTransform()).mapRect(rect)


def label_box(tl, label) -> QRectF:
    """Where a peak's words are, in viewport pixels."""
    return device_rect(label.parentItem(), label.mapRectToParent(label.boundingRect()))


# -- 1: the legend says what the colours mean in every mode -------------------------------------
def test_stacked_by_segment_the_legend_is_the_segments_key(qt, window):
    from vramscope.viewer.theme import SEGMENT_COLORS
    w = window
    d = open_and_wait(qt, w, str(DATA / "cuda_lora.pickle"))
    legend = w.legend
    assert legend.buttons and all(b.isVisible() for b in legend.buttons.values())
    assert legend.segment_key is not None and not legend.segment_key.isVisible()
    w.timeline.plot.setFocus()
    qt.keyClick(w.timeline.plot, Qt.Key.Key_S)
    assert w.timeline.mode == "segments"
    # the category toggles do not apply to bands coloured by pool: the key replaces them
    assert not any(b.isVisible() for b in legend.buttons.values())
    assert legend.segment_key.isVisible()
    text = legend.segment_key.text()
    palette = w.timeline.stacking.palette()
    keys = d.segments.keys()
    assert [words for _, words in keys] == ["small pool", "large pool"]      # one stream, both pools used
    for k, words in keys:
        color = SEGMENT_COLORS[k]
        assert QColor.fromRgba(int(palette[k, 0])).name() == color.lower()   # the colour the bands are drawn in
        assert f"color:{color}'>■</span>&nbsp;{words}" in text
    assert "one band per allocator segment" in text
    for key, mode in ((Qt.Key.Key_L, "allocations"), (Qt.Key.Key_C, "categories")):
        qt.keyClick(w.timeline.plot, key)
        assert w.timeline.mode == mode
        assert all(b.isVisible() for b in legend.buttons.values())        # bands by category again
        assert not legend.segment_key.isVisible()


def test_several_streams_are_the_segments_key(qt, window, tmp_path):
    from test_viewer_allocator import two_stream_snapshot
    w = window
    d = open_and_wait(qt, w, two_stream_snapshot(tmp_path / "streams.pickle"))
    w.set_mode("segments")
    assert [words for _, words in d.segments.keys()] == ["stream 0", "stream 7"]
    text = w.legend.segment_key.text()
    assert "stream 0" in text and "stream 7" in text and "pool" not in text
    assert w.legend.segment_key.isVisible()


def test_a_file_opened_in_segment_mode_shows_the_key(qt, window):
    w = window
    open_and_wait(qt, w, str(DATA / "cuda_lora.pickle"))
    w.set_mode("segments")
    open_and_wait(qt, w, str(DATA / "cuda_ckpt.pickle"))
    assert w.timeline.mode == "segments"
    assert w.legend.segment_key.isVisible() and not any(b.isVisible() for b in w.legend.buttons.values())


# -- 2: the y axis' top label is whole ---------------------------------------------------------
def y_labels(tl) -> list[tuple[QRectF, str]]:
    """The y axis' tick labels as it draws them, in the plot's viewport pixels."""
    img = QImage(8, 8, QImage.Format.Format_ARGB32)
    p = QPainter(img)
    try:
        _, _, texts = tl.axis_y.generateDrawSpecs(p)
    finally:
        p.end()
    return [(device_rect(tl.axis_y, rect), text) for rect, _, text in texts]


@pytest.mark.parametrize("path", [DATA / "cuda_oom.pickle", CRANBERRII], ids=lambda p: p.name)
def test_the_top_tick_label_is_never_cut(qt, window, path):
    require(path)
    w = sized(qt, window, 1600, 1000)
    open_and_wait(qt, w, str(path))
    tl = w.timeline
    inside = QRectF(tl.plot.viewport().rect())
    # auto; a top just above a round tick (an auto range can land there, a box zoom anywhere)
    ranges = [None, 1.004 * GiB, 250.5 * MiB, 6.02 * GiB]
    for top in ranges:
        if top is not None:
            tl._auto_y = False
            tl.vb.setYRange(0, top, padding=0)
            qt.wait(5)
        labels = y_labels(tl)
        assert labels
        highest = min(labels, key=lambda lt: lt[0].top())
        if top is not None:
            edge = device_rect(tl.vb, tl.vb.rect()).top()
            assert abs(highest[0].center().y() - edge) < 3, (labels, edge)      # a tick at the edge
        for rect, text in labels:
            assert inside.contains(rect), (text, rect, inside)


# -- 3: labels on the plot keep clear of the peaks' words -----------------------------------------
def test_phase_names_keep_clear_of_the_peak_label(qt, window):
    path = CRANBERRII if CRANBERRII.exists() else DATA / "cuda_full.pickle"
    w = sized(qt, window, 1024, 620)          # a short plot: the peak's words reach the phases' row
    d = open_and_wait(qt, w, str(path))
    tl = w.timeline
    if path != CRANBERRII and not d.time_axis:
        qt.keyClick(w, Qt.Key.Key_T)          # cuda_full opens in entries; in seconds the clash is there
        qt.waitUntil(lambda: w.data.time_axis, timeout=3000)
    render(qt, w)
    peak = label_box(tl, tl.peak_label)
    spans = tl.spans
    tr = spans.deviceTransform(tl.plot.viewportTransform())
    top = tr.mapRect(spans.viewRect()).top()
    fm = tl.plot.fontMetrics()
    # where a phase name would go (its span's left edge) if nothing were in the way
    # (in either of the two rows the names take)
    natural = []
    for k in range(len(spans.starts)):
        a = tr.map(spans.starts[k], 0)[0]
        for row in range(spans.LABEL_ROWS):
            natural.append((QRectF(a + 4, top + 3 + row * (fm.height() + 1), fm.horizontalAdvance(spans.labels[k]),
                                   fm.height()), spans.labels[k]))
    assert any(r.intersects(peak) for r, _ in natural), (peak, natural)     # the clash this is about
    assert spans.placed
    for rect, text in spans.placed:
        assert not rect.intersects(peak), (text, rect, peak)
    # the phase whose place the peak took is still named, further right in its span
    hidden = {t for r, t in natural if r.intersects(peak)}
    assert hidden & {t for _, t in spans.placed}


def test_note_labels_keep_clear_of_the_whatif_peak(qt, window):
    from vramscope.classifiers.whatif import what_if
    from vramscope.viewer.timeline.items import NoteMark
    w = sized(qt, window, 1024, 700)
    d = open_and_wait(qt, w, str(DATA / "cuda_full.pickle"))
    tl = w.timeline
    # everything but the weights scaled away: the scaled peak lies low, where the notes' labels go
    scales = {c: (1.0 if c == "weights" else 0.0) for c in d.categories}
    r = what_if(d.analysis, d.device, scales, with_budget=False)
    pk = r.scaled
    tl.set_whatif(r, "what if: the weights alone, a long label to collide with")
    x = float(d.x_of_index(max(pk.index, 0)))
    tl.notes.set_marks([NoteMark(f"n{k}", "peak", x, x, f"{k + 1} · a note at the what-if peak", "")
                        for k in range(3)])
    render(qt, w)
    label = label_box(tl, tl.whatif_label)
    assert tl.whatif_label.isVisible()
    rows = [QRectF(r) for r in tl.notes.chips.values()]
    h = rows[0].height() if rows else tl.plot.fontMetrics().height()
    bottom = device_rect(tl.vb, tl.vb.rect()).bottom()
    xd = tl.notes.deviceTransform(tl.plot.viewportTransform()).map(x, 0)[0]
    # where the chips would go (rows up from the bottom, at the mark) if nothing were in the way
    natural = [QRectF(xd + 4, bottom - 3 - (r + 1) * (h + 2), 100, h) for r in range(tl.notes.ROWS)]
    assert any(r.intersects(label) for r in natural), (label, natural)      # the clash this is about
    assert tl.notes.chips
    for ann_id, rect in tl.notes.chips.items():
        assert not rect.intersects(label), (ann_id, rect, label)


# -- 4: text in narrow places -------------------------------------------------------------------
def test_category_filter_button_has_room_for_its_arrow(qt, window):
    from PySide6.QtWidgets import QStyle
    w = sized(qt, window, 1024, 700)
    open_and_wait(qt, w, str(DATA / "cuda_lora.pickle"))
    b = w.table_panel.cat_button
    assert b.text() == "Categories: all"
    text = b.fontMetrics().horizontalAdvance(b.text())
    arrow = b.style().pixelMetric(QStyle.PixelMetric.PM_MenuButtonIndicator, None, b)
    # the style centres the text and draws the arrow at the right edge (QCommonStyle: from
    # right + 5 - arrow), inside the button: the text must end a few pixels before it
    text_right = (b.width() + text) / 2
    arrow_left = b.width() - 1 + 5 - arrow
    assert arrow_left - text_right >= 4, (b.width(), text, arrow)


@pytest.mark.parametrize("path", [CRANBERRII, DATA / "oom.pickle"], ids=lambda p: p.name)
def test_no_stack_sentence_fits_the_selection_panel(qt, window, path):
    require(path)
    w = sized(qt, window, 1024, 700)
    d = open_and_wait(qt, w, str(path))
    view_of = d.stacks.view_of
    rows = [r for r in range(d.n_rows) if not view_of(d.da, d.da.allocation(r), hide_internals=True).frames]
    assert rows                                         # blocks with no frames recorded
    w.select_row(rows[0])
    qt.wait(5)
    panel = w.stack_panel
    assert panel.stack_text().startswith("no stack recorded for this allocation")
    frames = panel.frames
    assert frames.width() < frames.fontMetrics().horizontalAdvance("no stack recorded for this allocation") * 1.6
    assert frames.document().size().width() <= frames.viewport().width() + 1
    assert not frames.horizontalScrollBar().isVisible()


@pytest.mark.parametrize("pair, size", [
    ((DATA / "cuda_lora.pickle", DATA / "cuda_ckpt.pickle"), (1024, 700)),
    ((SHARED / "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle",
      SHARED / "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_forward_mixed.pickle"), (1600, 1000)),
], ids=["cuda-1024", "cs336-1600"])
def test_compare_sites_are_whole(qt, window, pair, size):
    a, b = require(pair[0]), require(pair[1])
    w = sized(qt, window, *size)
    open_and_wait(qt, w, str(a))
    with qt.waitSignal(w.compared, timeout=60_000):
        w.compare_with(str(b))
    qt.wait(30)
    t = w.compare_panel.sites
    fm = t.fontMetrics()
    n = t.topLevelItemCount()
    assert n
    whole = 0
    for k in range(n):
        it = t.topLevelItem(k)
        room = t.columnWidth(0) - t.indentation()
        assert it.text(0) in it.toolTip(0)                 # what does not fit is in the tooltip
        if fm.horizontalAdvance(it.text(0)) + 12 <= room:
            whole += 1
        else:
            # no room to be had (the plot beside it keeps its share): cut in the middle, so the
            # package and the function both show
            assert t.textElideMode() == Qt.TextElideMode.ElideMiddle
            assert size[0] < 1600, (it.text(0), room)        # at 1600 wide every site is whole
    assert whole >= n // 2
