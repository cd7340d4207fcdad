"""Columns mapped from the cache are let go once the stages that read them whole are done
(DeviceTrace.release, parsers/tables.py `release_mapped`): their pages leave the process's
resident set and come back, unchanged, when read again. At 10^7 events this took a cold
`summary`'s highest memory from 1,104 MB to 875 MB."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers import DATA
from vramscope.classifiers import analyze
from vramscope.parsers import open_snapshot
from vramscope.parsers.snapshot import DeviceTrace
from vramscope.parsers.tables import release_mapped

PATH = str(DATA / "cuda_full.pickle")


def _resident_pages(arr: np.ndarray) -> int | None:
    """Pages of `arr`'s mapping resident in this process (Linux: /proc/self/smaps' Rss of it)."""
    if not sys.platform.startswith("linux"):
        return None
    start = arr.__array_interface__["data"][0]
    with open("/proc/self/smaps") as fh:
        inside = False
        for line in fh:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= start < hi
            elif inside and head == "Rss:":
                return int(line.split()[1])
    return None


def test_a_mapped_column_is_let_go_and_reads_back_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path))
    open_snapshot(PATH)                        # the columns written to the cache
    snap = open_snapshot(PATH)                 # ... and mapped from it
    assert snap.from_cache
    t = snap.trace(snap.devices[0])
    col = np.asarray(t.columns["time_us"])
    before = col.copy()
    assert int(col.sum()) == int(before.sum())             # read whole: resident
    held = _resident_pages(col)
    assert t.release(("time_us", "no such column")) == 1
    after = _resident_pages(col)
    if held is not None and after is not None:
        assert held > 0 and after < held
    assert np.array_equal(col, before)                     # read again: the same values


def test_columns_in_memory_are_left_as_they_are(monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    snap = open_snapshot(PATH)
    assert not snap.from_cache
    t = snap.trace(snap.devices[0])
    assert t.release(("addr", "size")) == 0
    assert release_mapped(np.arange(10)) is False


def test_the_analysis_lets_go_of_the_columns_it_is_done_with(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path))
    open_snapshot(PATH)
    snap = open_snapshot(PATH)
    calls: list = []
    real = DeviceTrace.release
    monkeypatch.setattr(DeviceTrace, "release", lambda self, names: calls.append(tuple(names)) or real(self, names))
    an = analyze(snap, use_cache=False)
    released = [n for names in calls for n in names]
    assert {"addr", "size", "time_us", "stream"} <= set(released)
    # the sizes with the addresses as soon as the rows are paired (the live bytes read the
    # rows' own), before the columns classify reads are let go after it
    first_size = min(k for k, names in enumerate(calls) if "size" in names)
    assert "addr" in calls[first_size]
    assert first_size < min(k for k, names in enumerate(calls) if "stream" in names)
    fresh = analyze(open_snapshot(PATH, use_cache=False), use_cache=False)
    da, db = an.devices[0], fresh.devices[0]
    assert np.array_equal(da.category, db.category) and da.peak == db.peak


def test_columns_checked_on_loading_are_let_go(tmp_path, monkeypatch):
    """The cache's checks read every column whole (parsers/cache.py `_validate`): their pages are
    handed back, so a column no stage reads whole (compile_context: 40 MB at 10^7 entries) is
    not held to the end. Its values read back the same."""
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path))
    open_snapshot(PATH)
    snap = open_snapshot(PATH)
    assert snap.from_cache
    t = snap.trace(snap.devices[0])
    # (a column of one value is no mapping and holds no memory: parsers/tables.py ColumnFile)
    constant = {k for k, c in t.columns.items() if c.strides == (0,)}
    assert constant and constant < set(t.columns)
    resident = {k: _resident_pages(np.asarray(c)) for k, c in t.columns.items() if k not in constant}
    if None in resident.values():
        pytest.skip("no /proc/self/smaps here")
    assert resident and all(v == 0 for v in resident.values()), resident
    fresh = open_snapshot(PATH, use_cache=False).trace(snap.devices[0])
    assert all(np.array_equal(np.asarray(t.columns[k]), np.asarray(fresh.columns[k])) for k in t.columns)


def test_entries_taken_from_a_mapped_column_part_by_part(tmp_path):
    """take_released gives `col[idx]` for any indices (unsorted, repeated, of a view, in order,
    int32 or int64: those in order are read without a sort), and holds
    a part of the column at a time: entries spread over all of it (a trace's segment events)
    leave few of its pages resident, where indexing it pages in nearly all."""
    from vramscope.parsers.tables import map_column, take_released
    n = 1 << 21                                   # 16 MB of int64
    path = tmp_path / "col.bin"
    (np.arange(n, dtype=np.int64) * 7).tofile(path)
    rng = np.random.default_rng(3)
    spread = np.arange(0, n, 509, dtype=np.int64)        # one entry every few pages
    in_order = np.sort(rng.integers(0, n, 5000))
    for idx in (rng.integers(0, n, 5000), np.r_[spread[::-1], spread[:10]], np.array([0, n - 1, 0]),
                in_order, in_order.astype(np.int32), spread.astype(np.int32), np.repeat(in_order[:50], 3)):
        col = map_column(str(path), np.int64, n)
        assert np.array_equal(take_released(col, idx), idx * 7)
        assert np.array_equal(take_released(col[100:], idx[idx < n - 100]), (idx[idx < n - 100] + 100) * 7)
        assert np.array_equal(take_released(col, idx, part=1000), idx * 7)
    assert np.array_equal(take_released(np.arange(10), [3, 1]), [3, 1])      # in memory: plain indexing
    col = map_column(str(path), np.int64, n)
    assert np.array_equal(take_released(col, [-1, 0, 5]), [(n - 1) * 7, 0, 35])   # numpy's negative indices
    with pytest.raises(IndexError):
        take_released(col, [0, n])
    col = map_column(str(path), np.int64, n)
    take_released(col, spread, part=1 << 16)
    held = _resident_pages(col)
    if held is None:
        pytest.skip("no /proc/self/smaps here")
    pages = n * 8 // 1024                          # KB, as smaps counts
    assert held < pages // 4, (held, pages)
    col2 = map_column(str(path), np.int64, n)
    _ = col2[spread]                               # what it replaces: nearly every page
    assert _resident_pages(col2) > pages * 3 // 4


def test_the_viewer_hands_back_the_columns_it_read(tmp_path, monkeypatch):
    """The viewer's model, once made, holds no page of the trace's columns: the stages read some
    whole, and at 10^7 entries up to 80 MB a column stayed to the end. What it shows of them
    reads back the same."""
    from vramscope.viewer.model.load import load
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path))
    res = load(PATH)
    t = res.snapshot.trace(res.device)
    d = res.data
    assert d is not None
    # (a column of one value is no mapping and holds no memory: parsers/tables.py ColumnFile)
    constant = {k for k, c in t.columns.items() if c.strides == (0,)}
    assert constant and constant < set(t.columns)
    resident = {k: _resident_pages(np.asarray(c)) for k, c in t.columns.items() if k not in constant}
    if None in resident.values():
        pytest.skip("no /proc/self/smaps here")
    assert all(v == 0 for v in resident.values()), resident
    x0, x1 = d.x_range
    env = d.envelope(x0, x1, 2000)
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    plain = load(PATH, use_cache=False).data
    again = plain.envelope(x0, x1, 2000)
    assert np.array_equal(env.line_x, again.line_x) and np.array_equal(env.live_y, again.live_y)


def test_the_live_bytes_read_the_rows_sizes_not_the_trace_column(monkeypatch):
    """The live bytes after each entry come from the rows' sizes (and of the trace's sizes,
    only the segment events'), so the column's pages, let go once the rows are paired, are
    not read whole again: the same live bytes with every other entry's size in the column
    made nonsense."""
    from vramscope.parsers import allocations, live_model
    from vramscope.parsers.tables import A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    snap = open_snapshot(PATH)
    dev = snap.devices[0]
    t = snap.trace(dev)
    rows = allocations(snap, dev)
    want = live_model(snap, dev, rows=rows)
    action = np.asarray(t.columns["action"])
    seg = np.isin(action, [A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP])
    assert seg.any() and (~seg).sum() > 100
    size = np.asarray(t.columns["size"]).copy()
    size[~seg] = 7_777_777_777
    monkeypatch.setitem(t.columns, "size", size)
    got = live_model(snap, dev, rows=rows)
    assert np.array_equal(got.live_after, want.live_after)
    assert (got.peak_bytes, got.peak_index, got.reserved_peak) == (want.peak_bytes, want.peak_index, want.reserved_peak)
