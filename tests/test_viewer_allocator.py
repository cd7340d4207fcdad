"""The Allocator panel and its state: segments, blocks, pending frees, rounding, fragmentation,
several streams; stepping with the arrow keys (pytest-qt, offscreen)."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from vramscope.classifiers import analyze
from vramscope.parsers import open_snapshot
from vramscope.viewer.allocator_state import ROUND, AllocatorState, rounded
from vramscope.viewer.model import DeviceData

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
MiB = 1 << 20


def two_stream_snapshot(path) -> str:
    """Two segments on two streams; a block freed by the program (free_requested) whose
    stream finishes 3 entries later (free_completed); sizes that are not multiples of 512."""
    fr = [{"filename": "/home/u/train.py", "line": 10 + k, "name": f"step_{k}"} for k in range(4)]
    t = 1_700_000_000_000_000
    a, b = 0x7F0000000000, 0x7F1000000000
    trace = [
        {"action": "segment_alloc", "addr": a, "size": 20 * MiB, "stream": 0, "time_us": t, "frames": fr[:1]},
        {"action": "alloc", "addr": a, "size": 3 * MiB + 100, "stream": 0, "time_us": t + 1, "frames": fr[:1]},
        {"action": "alloc", "addr": a + 4 * MiB, "size": 5 * MiB, "stream": 0, "time_us": t + 2, "frames": fr[1:2]},
        {"action": "segment_alloc", "addr": b, "size": 2 * MiB, "stream": 7, "time_us": t + 3, "frames": fr[2:3]},
        {"action": "alloc", "addr": b, "size": 700, "stream": 7, "time_us": t + 4, "frames": fr[2:3]},
        {"action": "free_requested", "addr": a + 4 * MiB, "size": 5 * MiB, "stream": 0, "time_us": t + 5,
         "frames": fr[1:2]},                                                   # entry 5
        {"action": "alloc", "addr": b + 1024, "size": 512, "stream": 7, "time_us": t + 6, "frames": fr[3:4]},
        {"action": "alloc", "addr": a + 12 * MiB, "size": 1 * MiB, "stream": 0, "time_us": t + 7, "frames": fr[3:4]},
        {"action": "free_completed", "addr": a + 4 * MiB, "size": 5 * MiB, "stream": 0, "time_us": t + 8,
         "frames": fr[1:2]},                                                   # entry 8
    ]
    blocks_a = [{"address": a, "size": 3 * MiB + 512, "requested_size": 3 * MiB + 100, "state": "active_allocated",
                 "frames": fr[:1]},
                {"address": a + 12 * MiB, "size": MiB, "requested_size": MiB, "state": "active_allocated",
                 "frames": fr[3:4]}]
    blocks_b = [{"address": b, "size": 1024, "requested_size": 700, "state": "active_allocated", "frames": fr[2:3]},
                {"address": b + 1024, "size": 512, "requested_size": 512, "state": "active_allocated",
                 "frames": fr[3:4]}]

    def seg(addr, size, stream, blocks, kind):
        used = sum(x["size"] for x in blocks)
        return {"device": 0, "address": addr, "total_size": size, "allocated_size": used, "active_size": used,
                "requested_size": used, "stream": stream, "segment_type": kind, "segment_pool_id": (0, 0),
                "is_expandable": False, "frames": [], "blocks": blocks}
    snap = {"segments": [seg(a, 20 * MiB, 0, blocks_a, "large"), seg(b, 2 * MiB, 7, blocks_b, "small")],
            "device_traces": [trace], "allocator_settings": {}}
    with open(path, "wb") as fh:
        pickle.dump(snap, fh, protocol=4)
    return str(path)


def model(path) -> DeviceData:
    snap = open_snapshot(str(path), use_cache=False)
    an = analyze(snap, use_cache=False)
    return DeviceData(snap, an, an.primary_device())


def test_state_of_two_streams_with_a_pending_free(tmp_path):
    d = model(two_stream_snapshot(tmp_path / "streams.pickle"))
    st = AllocatorState.at(d, 6)                     # after free_requested (5), before free_completed (8)
    assert st.streams == [0, 7] and len(st.segments) == 2
    assert [s.stream for s in st.segments] == [0, 7]
    big = st.segments[0]
    assert big.pending == 5 * MiB and big.allocated == 3 * MiB + 100
    assert big.rounding == (3 * MiB + 512) - (3 * MiB + 100)
    assert big.cached == 20 * MiB - (3 * MiB + 512) - 5 * MiB
    small = st.segments[1]
    assert small.small and small.allocated == 700 + 512 and small.rounding == 1024 - 700
    assert st.reserved == d.reserved_at(6) == 22 * MiB
    # the pending block is free once its stream is done
    later = AllocatorState.at(d, 8)
    assert later.pending_free == 0 and later.segments[0].cached == 20 * MiB - (3 * MiB + 512) - MiB
    # fragmentation: the largest free stretch over all that is cached
    gaps = [12 * MiB - (3 * MiB + 512), 20 * MiB - 13 * MiB]          # the freed block joined its neighbours
    assert later.segments[0].largest_free == max(gaps)
    assert later.fragmentation == pytest.approx(1 - later.largest_free / later.cached)
    assert 0 <= later.fragmentation < 1


@pytest.mark.parametrize("name", ["oom.pickle", "expandable.pickle", "multi_device_oom.pickle", "qlora_4bit.pickle"])
def test_state_adds_up_on_fixtures(name):
    d = model(DATA / name)
    rng = np.random.default_rng(0)
    for i in [-1, d.n - 1, d.peak_index] + rng.integers(0, d.n, 15).tolist():
        st = AllocatorState.at(d, int(i))
        assert st.reserved == d.reserved_at(int(i))
        live = d.live_rows(int(i))
        assert int(st.block_size.sum()) <= d.live_at(int(i))
        # every live allocation is drawn in a segment, rounded to whole 512-byte units
        assert len(st.block_row) == len(live) or name == "expandable.pickle"
        assert np.all(st.block_rounded % ROUND == 0) and np.all(st.block_rounded >= st.block_size)
        assert st.cached == st.reserved - int(st.block_rounded.sum())
        assert 0.0 <= st.fragmentation <= 1.0


def test_rounded():
    assert rounded(np.array([1, 512, 513, 3 * MiB + 100])).tolist() == [512, 512, 1024, 3 * MiB + 512]


# -- the panel, driven by keys -----------------------------------------------------------------------
pytest.importorskip("PySide6")


def test_allocator_panel_steps_with_the_arrow_keys(qt, tmp_path):
    from PySide6.QtCore import Qt
    from viewer_helpers import new_window, open_and_wait
    w = new_window(qt)
    d = open_and_wait(qt, w, two_stream_snapshot(tmp_path / "streams.pickle"))
    w.docks["allocator"].show()
    w.docks["allocator"].raise_()
    panel = w.allocator_panel
    panel.show_index(4)
    w.activateWindow()
    panel.setFocus()
    qt.waitUntil(lambda: panel.hasFocus(), timeout=2000)
    qt.keyClick(panel, Qt.Key.Key_Right)
    assert panel.index == 5 and w.pinned_index == 5
    assert w.timeline.cursor_line.value() == pytest.approx(float(d.x_of_index(5)))
    qt.keyClick(panel, Qt.Key.Key_Right)
    assert panel.index == 6 and "pending free <b>" not in panel.header.text()
    assert "pending free 5.00 MiB" in panel.header.text() and "streams 0, 7" in panel.header.text()
    qt.keyClick(panel, Qt.Key.Key_Left)
    assert panel.index == 5
    # Ctrl+Left: the previous segment event (the second segment_alloc, entry 3)
    qt.keyClick(panel, Qt.Key.Key_Left, Qt.KeyboardModifier.ControlModifier)
    assert panel.index == 3
    # Home stays in the panel (not the window's "whole run")
    x_before = w.timeline.x_span()
    qt.keyClick(panel, Qt.Key.Key_Home)
    assert panel.index == -1 and w.timeline.x_span() == pytest.approx(x_before)
    qt.keyClick(panel, Qt.Key.Key_End)
    assert panel.index == d.n - 1
    # the map: a block under the mouse names its allocation, a click selects it
    st = panel.state
    m = panel.map
    k = 0
    s = st.segments[k]
    x0, ppb = m._geometry()
    from PySide6.QtCore import QPoint
    from vramscope.viewer.panels.allocator import ROW_GAP, ROW_H
    w_bar = max(28, s.size * ppb)
    pt = QPoint(int(x0 + w_bar * 0.5 * (3 * MiB) / s.size), 3 + k * (ROW_H + ROW_GAP) + ROW_H // 2)
    seg, blk = m.hit(pt)
    assert seg == 0 and blk >= 0 and int(st.block_addr[blk]) == s.address
    qt.mouseClick(m, Qt.MouseButton.LeftButton, pos=pt)
    assert w.selected_row == int(st.block_row[blk])


def test_a_segment_click_on_the_timeline_opens_its_blocks(qt):
    from PySide6.QtCore import QPointF, Qt
    from viewer_helpers import new_window, open_and_wait
    w = new_window(qt)
    d = open_and_wait(qt, w, str(DATA / "oom.pickle"))
    w.activateWindow()
    w.timeline.plot.setFocus()
    qt.keyClick(w.timeline.plot, Qt.Key.Key_S)
    assert w.timeline.mode == "segments"
    tl = w.timeline
    i = d.peak_index
    x = float(d.x_of_index(i))
    y = d.reserved_at(i) * 0.3
    pos = tl.plot.mapFromScene(tl.vb.mapViewToScene(QPointF(x, y)))
    qt.mouseClick(tl.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert w.docks["allocator"].isVisible()
    panel = w.allocator_panel
    assert panel.index is not None and abs(panel.index - i) < d.n // 50
    assert panel.map.highlight_segment in [s.address for s in panel.state.segments]


@pytest.mark.parametrize("name", ["oom.pickle", "keep_loss.pickle", "streams"])
def test_free_requested_pairs_with_the_block_it_frees(name, tmp_path):
    from vramscope.parsers.tables import A_FREE_REQUESTED
    from vramscope.viewer.allocator_state import free_requested_index
    path = two_stream_snapshot(tmp_path / "s.pickle") if name == "streams" else DATA / name
    d = model(path)
    got = free_requested_index(d)
    addr = np.asarray(d.snap.trace(d.device).columns["addr"])
    ra = np.asarray(d.allocs.addr)
    want = np.full(d.n_rows, -1)
    for e in np.flatnonzero(d.action == A_FREE_REQUESTED).tolist():     # a plain scan: the block live there
        live = np.flatnonzero((ra == addr[e]) & (d.alloc_index < e) & ((d.free_index < 0) | (d.free_index >= e)))
        if len(live):
            want[live[-1]] = e
    assert np.array_equal(got, want)
