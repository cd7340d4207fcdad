"""Trimmed snapshots and Perfetto counter tracks."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from vramscope.classifiers import CATEGORIES, analyze
from vramscope.cli import main
from vramscope.classifiers.liveset import category_series, series_at
from vramscope.services.export import export_perfetto, export_trimmed, perfetto_trace, window_around
from vramscope.parsers import live_model, open_snapshot

from helpers import DATA, REPO, reference_peaks

EXAMPLE = str(REPO / "assets" / "example.pickle")
OOM = DATA / "oom.pickle"
EXPANDABLE = DATA / "expandable.pickle"


def _files():
    out = [EXAMPLE]
    out += [str(p) for p in (OOM, EXPANDABLE, DATA / "leak.pickle", DATA / "multi_device.pickle",
                             DATA / "torch20_history.pickle", DATA / "backward_thread.pickle",
                             DATA / "annotated_210.pickle", DATA / "protocol2.pickle")]
    return out


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")


def _windows(n):
    return [(0, n - 1), (n // 4, n // 2), (n // 3, n // 3), (max(0, n - 5), n - 1), (0, min(n - 1, 7))]


@pytest.mark.parametrize("path", _files(), ids=os.path.basename)
def test_trimmed_export_replays_the_window_exactly(path, tmp_path):
    snap = open_snapshot(path, use_cache=False)
    for dev in snap.devices:
        n = len(snap.trace(dev))
        if not n:
            continue
        lm = live_model(snap, dev)
        for a, b in _windows(n):
            out = str(tmp_path / f"w{dev}_{a}_{b}.pickle")
            info = export_trimmed(snap, out, device=dev, start=a, end=b)
            assert info["entries"] == b - a + 1
            trimmed = open_snapshot(out, use_cache=False)
            assert trimmed.layout == snap.layout
            assert len(trimmed.trace(dev)) == b - a + 1
            lm2 = live_model(trimmed, dev)
            before = lm.start_bytes if a <= 0 else int(lm.live_after[a - 1])       # live before entry a
            assert lm2.start_bytes == before
            np.testing.assert_array_equal(lm2.live_after, lm.live_after[a:b + 1])
            if lm.reserved_after is not None:
                np.testing.assert_array_equal(lm2.reserved_after, lm.reserved_after[a:b + 1])
            # an independent reader (pickle.load + the reference replay) agrees on the window's peak
            with open(out, "rb") as fh:
                ref = reference_peaks(pickle.load(fh))
            assert ref[dev] == max(before, int(lm.live_after[a:b + 1].max()))


@pytest.mark.parametrize("path", _files(), ids=os.path.basename)
def test_trimmed_export_keeps_categories_and_is_smaller(path, tmp_path):
    snap = open_snapshot(path, use_cache=False)
    an = analyze(snap)
    dev = next(d for d in snap.devices if len(snap.trace(d)))
    n = len(snap.trace(dev))
    a, b = n // 4, (3 * n) // 4
    out = str(tmp_path / "w.pickle")
    export_trimmed(snap, out, device=dev, start=a, end=b)
    assert os.path.getsize(out) < os.path.getsize(path)
    an2 = analyze(open_snapshot(out, use_cache=False))
    idx = np.arange(a, b + 1)
    orig = an.devices[dev].live_by_category(idx)
    trim = an2.devices[dev].live_by_category(idx - a)
    np.testing.assert_array_equal(orig.sum(axis=1), trim.sum(axis=1))
    # categories: the same for allocations whose whole life is inside the window (same stack,
    # same lifetime, same phases); a block live before the window lost its history and one freed
    # after it its future, so a lifetime rule may rightly see those apart
    def born_inside(da, lo, hi):
        al, fr = da.allocs.alloc_index, da.allocs.free_index
        keep = (al >= lo) & (fr >= 0) & (fr <= hi)
        sub = type("D", (), {})()
        sub.allocs = type(da.allocs)(da.device, *(np.asarray(getattr(da.allocs, f))[keep] for f in
                                                  ("alloc_index", "free_index", "addr", "size", "stack")),
                                     da.allocs.time_us)
        sub.category = np.asarray(da.category)[keep]
        return sub
    def live(sub, at):
        return series_at(category_series(sub.category, sub.allocs), at)
    orig_in = live(born_inside(an.devices[dev], a, b), idx)
    trim_in = live(born_inside(an2.devices[dev], 0, b - a), idx - a)
    agree = (orig_in == trim_in).all(axis=1).mean()
    assert agree >= 0.9, f"per-category live bytes agree at only {agree:.0%} of the window's events"


def test_profiler_categories_survive(tmp_path):
    # the example is profiler-converted: torch's own category rides on each alloc entry
    snap = open_snapshot(EXAMPLE, use_cache=False)
    out = str(tmp_path / "w.pickle")
    export_trimmed(snap, out, device=0, start=100, end=900)
    t2 = open_snapshot(out, use_cache=False).trace(0)
    t1 = snap.trace(0)
    names1 = np.asarray(snap.category_names, dtype=object)[t1.columns["category"][100:901]]
    trimmed = open_snapshot(out, use_cache=False)
    names2 = np.asarray(trimmed.category_names, dtype=object)[t2.columns["category"]]
    assert list(names1) == list(names2)


def test_trimmed_export_opens_in_torch_tools(tmp_path):
    mv = pytest.importorskip("torch.cuda._memory_viz")
    for path in _files()[:2]:
        snap = open_snapshot(path, use_cache=False)
        out = str(tmp_path / "w.pickle")
        export_trimmed(snap, out, device=0, around_peak=200)
        with open(out, "rb") as fh:
            doc = pickle.load(fh)
        assert mv.segsum(doc) and mv.trace_plot(doc)
        if snap.layout != "profiler":     # torch's text trace needs allocator segments (fails on the original too)
            assert mv.trace(doc)


def test_around_peak_window():
    assert window_around(100, 50, 10) == (45, 54)
    assert window_around(100, 2, 10) == (0, 9)
    assert window_around(100, 99, 10) == (90, 99)
    assert window_around(5, 2, 10) == (0, 4)
    snap = open_snapshot(EXAMPLE, use_cache=False)
    lm = live_model(snap, 0)
    s, e = window_around(len(snap.trace(0)), lm.peak_index, 300)
    assert s <= lm.peak_index <= e and e - s + 1 == 300


def test_bad_window_refused(tmp_path):
    snap = open_snapshot(EXAMPLE, use_cache=False)
    with pytest.raises(ValueError):
        export_trimmed(snap, str(tmp_path / "x.pickle"), device=0, start=10, end=5)
    with pytest.raises(ValueError):
        export_trimmed(snap, str(tmp_path / "x.pickle"), device=0, start=0, end=10 ** 9)


@pytest.mark.parametrize("max_points", [20000, 50])
def test_perfetto_counter_tracks(tmp_path, max_points):
    snap = open_snapshot(EXAMPLE, use_cache=False)
    an = analyze(snap)
    out = str(tmp_path / "trace.json")
    export_perfetto(an, out, max_points=max_points)
    with open(out) as fh:
        doc = json.load(fh)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    tracks = {(e["pid"], e["name"]) for e in counters}
    assert tracks == {(0, c) for c in CATEGORIES}
    for e in counters:
        assert isinstance(e["ts"], int) and e["args"]["bytes"] >= 0
    da = an.devices[0]
    # the sum of every track's maximum is at least the peak (and each track's max is exact)
    series = da.category_series()
    for c, name in enumerate(CATEGORIES):
        vals = [e["args"]["bytes"] for e in counters if e["name"] == name]
        assert max(vals) == max([series[c].start] + series[c].value.tolist())
    if max_points == 50:
        assert len(counters) <= len(CATEGORIES) * (2 * 50 + 1)


@pytest.mark.parametrize("path, clock", [(OOM, True), (DATA / "torch20_history.pickle", False)],
                         ids=["time_us", "no-clock"])
def test_perfetto_tracks_are_the_category_series_at_their_times(path, clock):
    """Each category's track is its live bytes at every entry where they change, stamped with
    that entry's time in microseconds from the first entry (whose time_us since the epoch is
    otherData's origin; entries that share a microsecond a nanosecond apart), or, in a trace
    without a clock, the entry number, with a process name that says so; the state before
    the trace a microsecond before the first entry."""
    from vramscope.services.export import _distinct_times, _ts
    snap = open_snapshot(str(path), use_cache=False)
    an = analyze(snap)
    tus = np.asarray(snap.trace(0).columns["time_us"])
    assert bool((tus >= 0).all()) == clock
    ts_of = _distinct_times((tus - tus[0]) if clock else np.arange(len(tus)))
    doc = perfetto_trace(an, device=0)
    series = an.devices[0].category_series()
    for c, name in enumerate(CATEGORIES):
        got = [(e["ts"], e["args"]["bytes"]) for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == name]
        want = [(-1, series[c].start)] + [(_ts(t), v) for t, v in zip(ts_of[series[c].index].tolist(),
                                                                       series[c].value.tolist())]
        assert got == want, name
    origin = doc["otherData"]["time_origin_us"]["cuda:0"]
    assert origin == (int(tus[0]) if clock else None)
    if clock:
        assert origin > 10 ** 15                   # µs since the epoch, not entry numbers
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert names == ["cuda:0 memory" + ("" if clock else " (x = entry index)")]


def test_cli_export(tmp_path, capsys):
    out = str(tmp_path / "t.pickle")
    assert main(["export", EXAMPLE, "--trim", "10:500", "-o", out]) == 0
    assert len(open_snapshot(out, use_cache=False).trace(0)) == 491
    assert main(["export", EXAMPLE, "--around-peak", "--window", "100", "-o", out]) == 0
    assert len(open_snapshot(out, use_cache=False).trace(0)) == 100
    pj = str(tmp_path / "t.json")
    assert main(["export", EXAMPLE, "--perfetto", "-o", pj]) == 0
    assert json.load(open(pj))["traceEvents"]
    assert main(["export", EXAMPLE, "-o", out]) == 2              # nothing asked for
    assert main(["export", EXAMPLE, "--trim", "x:y", "-o", out]) == 2
    assert main(["export", EXAMPLE, "--trim", "10:5", "-o", out]) == 2
    assert main(["export", EXAMPLE, "--trim", "1:5", "--device", "7", "-o", out]) == 2


def test_trimmed_expandable_segments_never_have_negative_sizes(tmp_path):
    """Undoing a segment_map that reaches past its host segment must not leave a negative
    tail (it did for one window of the expandable fixture)."""
    snap = open_snapshot(str(EXPANDABLE), use_cache=False)
    n = len(snap.trace(0))
    out = str(tmp_path / "t.pickle")
    for a in range(0, n, 97):
        for b in (a + 50, a + 400, n - 1):
            export_trimmed(snap, out, device=0, start=a, end=min(b, n - 1))
            with open(out, "rb") as fh:
                doc = pickle.load(fh)
            assert all(s["total_size"] >= 0 for s in doc["segments"]), (a, b)


# -- Perfetto counters reach the exact peak, even when entries share a microsecond -------------
@pytest.mark.parametrize("name", ["oom.pickle", "cuda_lora.pickle", "leak.pickle", "forward_only_loop.pickle"])
def test_perfetto_counters_sum_to_the_exact_peak(name):
    import os as _os
    _os.environ.setdefault("VRAMSCOPE_CACHE_DIR", "")
    from vramscope.classifiers import analyze
    from vramscope.parsers import open_snapshot
    from vramscope.services.export import perfetto_trace
    an = analyze(open_snapshot(str(DATA / name), use_cache=False))
    for dev, da in an.devices.items():
        doc = perfetto_trace(an, dev)
        points: dict[str, list] = {}
        for e in doc["traceEvents"]:
            if e["ph"] == "C":
                points.setdefault(e["name"], []).append((e["ts"], e["args"]["bytes"]))
        tus = an.snapshot.trace(dev).columns["time_us"]
        stamps = sorted({ts for pts in points.values() for ts, _ in pts})
        # the highest sum of the tracks over every timestamp any of them has is the peak
        best = 0
        for ts in stamps:
            best = max(best, sum(max((p for p in pts if p[0] <= ts), default=(0, 0))[1] for pts in points.values()))
        assert best == da.peak.bytes, (name, dev)
        # and entries sharing a microsecond are apart
        if len(tus) > 1 and (tus[1:] == tus[:-1]).any():
            assert any(isinstance(ts, float) for ts in stamps)
