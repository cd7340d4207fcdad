"""The viewer's numeric core, without Qt: envelopes, compositions, rows, segments."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from vramscope.classifiers import analyze
from vramscope.parsers import open_snapshot
from vramscope.common.units import fmt_bytes, fmt_seconds, parse_size
from vramscope.common.arrays import ragged
from vramscope.viewer.model.lod import MinMaxPyramid
from vramscope.viewer.model import DeviceData
from vramscope.viewer.model.rows import COL_ALLOC, COL_CATEGORY, COL_LIFETIME, COL_SIZE, COL_WHERE, RowView


def write_snapshot(path, n_allocs: int = 3000, seed: int = 0, with_time: bool = True) -> str:
    """A small torch-shaped snapshot: one segment, alloc/free churn over a few
    'iterations', shared frame dicts, one block that predates the trace."""
    rng = random.Random(seed)
    frames = [{"filename": f"/home/u/proj/model_{i % 3}.py", "line": 10 + i, "name": f"layer_{i}"}
              for i in range(24)]
    frames += [{"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc()"}]
    stacks = [[frames[-1]] + rng.sample(frames[:-1], 4) for _ in range(40)]
    base, seg_size = 0x7F0000000000, 1 << 38
    trace = [{"action": "segment_alloc", "addr": base, "size": seg_size, "stream": 0,
              "time_us": 1_700_000_000_000_000, "frames": stacks[0]}]
    t = 1_700_000_000_000_000
    live: dict[int, tuple[int, list]] = {}
    cursor = base + (1 << 30)
    for k in range(n_allocs):
        t += rng.choice((1, 1, 2, 5, 40)) if with_time else 0
        size = rng.choice((512, 4096, 1 << 20, 3 << 20, 16 << 20))
        if (k // 500) % 2 == 0 or not live or rng.random() < 0.3:
            st = rng.choice(stacks)
            cursor += 1 << 25
            trace.append({"action": "alloc", "addr": cursor, "size": size, "stream": 0, "time_us": t, "frames": st})
            live[cursor] = (size, st)
        else:
            a = rng.choice(list(live))
            size, st = live.pop(a)
            trace.append({"action": "free_requested", "addr": a, "size": size, "stream": 0, "time_us": t,
                          "frames": st})
            trace.append({"action": "free_completed", "addr": a, "size": size, "stream": 0, "time_us": t,
                          "frames": st})
    if not with_time:
        for e in trace:
            del e["time_us"]
    blocks = [{"address": base, "size": 1 << 29, "requested_size": 1 << 29, "state": "active_allocated",
               "frames": []}]      # live before the trace began (weights loaded earlier)
    for a, (size, st) in sorted(live.items()):
        blocks.append({"address": a, "size": size, "requested_size": size, "state": "active_allocated",
                       "frames": st})
    allocated = sum(b["size"] for b in blocks)
    seg = {"device": 0, "address": base, "total_size": seg_size, "allocated_size": allocated,
           "active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
    with open(path, "wb") as fh:
        pickle.dump({"segments": [seg], "device_traces": [trace], "allocator_settings": {},
                     "external_annotations": []}, fh, protocol=4)
    return str(path)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    p = write_snapshot(tmp_path_factory.mktemp("snap") / "synth.pickle", 4000)
    snap = open_snapshot(p, use_cache=False)
    an = analyze(snap)
    # spread rows over categories so that stacking is exercised whatever the classifier says
    da = an.devices[0]
    da.category = (np.arange(len(da.allocs)) % 5 * 2).astype(np.uint8)
    da._composition = None            # the analysis' composition (the viewer's too), of these categories
    return DeviceData(snap, an, 0)


def brute_composition(d: DeviceData, i: int) -> np.ndarray:
    a = d.allocs
    live = (a.alloc_index <= i) & ((a.free_index < 0) | (a.free_index > i))
    return np.bincount(d.category[live], weights=a.size[live], minlength=d.n_categories)


def test_ragged():
    pos, owner = ragged(np.array([5, 0, 9]), np.array([2, 0, 3]))
    assert pos.tolist() == [5, 6, 9, 10, 11]
    assert owner.tolist() == [0, 0, 2, 2, 2]


@pytest.mark.parametrize("n", [1, 31, 32, 33, 100, 5000])
def test_pyramid_matches_brute_force(n):
    rng = np.random.default_rng(n)
    c0 = np.cumsum(rng.integers(-100, 101, n))
    c1 = np.cumsum(rng.integers(-5, 6, n))
    p = MinMaxPyramid([c0, c1])
    a = rng.integers(0, n, 300)
    b = np.minimum(n, a + 1 + rng.integers(0, n, 300))
    mx, mn, arg = p.query(a, b)
    for k in range(len(a)):
        s = slice(a[k], b[k])
        assert mx[k].tolist() == [c0[s].max(), c1[s].max()]
        assert mn[k].tolist() == [c0[s].min(), c1[s].min()]
        assert a[k] <= arg[k] < b[k] and c0[arg[k]] == c0[s].max()


def test_composition_adds_up_and_matches(synth):
    d = synth
    for i in [-1, 0, 1, 63, 64, 65, d.n // 2, d.n - 2, d.n - 1]:
        comp = d.composition([i])[0]
        assert comp.sum() == pytest.approx(d.live_at(i))
        np.testing.assert_allclose(comp, brute_composition(d, i))


def test_envelope_never_hides_a_peak(synth):
    d = synth
    x0, x1 = d.x_range
    rng = np.random.default_rng(1)
    for _ in range(40):
        a, b = sorted(rng.uniform(x0, x1, 2))
        env = d.envelope(a, b, int(rng.integers(50, 2000)))
        ia, ib = int(d.index_at_x(a)), int(d.index_at_x(b))
        inside = d.live[ia:ib]
        before = d.live_at(ia - 1)
        assert env.live_y.max() == max(inside.max() if len(inside) else before, before)
        assert env.live_y.min() == min(inside.min() if len(inside) else before, before)
        # the stacked bands' top never goes above the line, and reaches it at the max
        top = env.col_comp.sum(axis=1)
        assert len(top) == len(env.col_x)
        assert top.max() <= env.live_y.max() + 0.5
        if len(inside):
            assert top.max() >= inside.max() - 0.5           # the highest event is drawn
        assert env.line_x[0] == a and env.line_x[-1] == b
    env = d.envelope(x0, x1, 800)
    assert env.live_y.max() == d.peak_bytes


def test_envelope_index_axis(tmp_path):
    p = write_snapshot(tmp_path / "notime.pickle", 500, with_time=False)
    snap = open_snapshot(p, use_cache=False)
    d = DeviceData(snap, analyze(snap), 0)
    assert not d.has_time
    assert d.x_range == (0.0, float(d.n))
    env = d.envelope(0, d.n, 100)
    assert env.live_y.max() == d.peak_bytes
    assert d.index_before_x(10.5) == 10


def test_largest_live_and_allocation_at(synth):
    d = synth
    i = d.peak_index
    rows = d.largest_live(i, 5)
    live = d.live_rows(i)
    want = np.sort(d.allocs.size[live])[::-1][:5]
    assert d.allocs.size[rows].tolist() == want.tolist()
    comp = d.composition([i])[0]
    visible = [c for c in range(d.n_categories) if comp[c] > 0]
    y = comp[visible[0]] / 2          # inside the bottom band
    row, cat = d.allocation_at(float(d.x_of_index(i)), y, visible)
    assert cat == visible[0] and row >= 0 and d.category[row] == cat
    assert d.is_live(np.array([row]), d.index_before_x(float(d.x_of_index(i))))[0]


def test_segments_at(synth):
    d = synth
    segs = d.segments.at(d.n - 1)
    assert segs.known and len(segs.size) == 1
    assert int(segs.allocated.sum()) == d.live_at(d.n - 1)
    assert 0 < d.da.reserved_unallocated_at(d.n - 1) == int(segs.size.sum() - segs.allocated.sum())
    assert len(d.segments.at(-1).size) == 0     # the trace's first entry allocates it
    assert int(d.segments.at(0).size.sum()) == 1 << 38


def test_rows_sort_and_filter(synth):
    d = synth
    v = RowView(d)
    assert len(v.rows) == d.n_rows
    sizes = d.allocs.size[v.rows]
    assert np.all(sizes[:-1] >= sizes[1:])          # default: largest first
    v.sort(COL_ALLOC, False)
    assert np.all(np.diff(d.alloc_index[v.rows]) >= 0)
    for col in (COL_CATEGORY, COL_LIFETIME, COL_WHERE):
        v.sort(col, True)
        assert sorted(v.rows.tolist()) == list(range(d.n_rows))
    v.sort(COL_SIZE, True)
    v.set_filter({0}, 1 << 20, "")
    assert len(v.rows) and np.all(d.category[v.rows] == 0) and np.all(d.allocs.size[v.rows] >= 1 << 20)
    v.set_filter(None, 0, "LAYER_3")               # case-insensitive, in function names
    assert len(v.rows)
    for r in v.rows[:50]:
        names = [f[2] for f in d.snap.stack_frames_list(int(d.allocs.stack[r]))]
        assert any("layer_3" in n for n in names)
    v.set_filter(None, 0, "no frame has this text")
    assert len(v.rows) == 0


def test_rows_positions_of_few_and_many(synth, monkeypatch):
    """Where rows are shown: one look per distinct row for a few (a table's current row comes as
    one index per column: 8 of one row), an inverse of the view for many; the same answers."""
    v = RowView(synth)
    v.set_filter(None, 1 << 20, "")                 # some rows filtered out
    shown, hidden = int(v.rows[7]), int(np.flatnonzero(synth.allocs.size < 1 << 20)[0])
    looks: list[int] = []
    one = RowView.position_of
    monkeypatch.setattr(RowView, "position_of", lambda self, r: looks.append(r) or one(self, r))
    assert v.positions_of([shown] * 8).tolist() == [7] * 8
    assert looks == [shown]                          # one look, not an inverse of every row
    few = [shown, hidden, -1, synth.n_rows, shown]
    assert v.positions_of(few).tolist() == [7, -1, -1, -1, 7]
    many = few + [int(r) for r in v.rows[:6]]
    assert v.positions_of(many).tolist() == [7, -1, -1, -1, 7, 0, 1, 2, 3, 4, 5]
    assert v.positions_of([]).tolist() == []


def test_findings_and_state_only(tmp_path):
    p = write_snapshot(tmp_path / "s.pickle", 300)
    snap = open_snapshot(p, use_cache=False)
    d = DeviceData(snap, analyze(snap), 0)
    peak = d.findings[0]
    assert peak.kind == "peak" and peak.subject.bytes == d.peak_bytes
    # a peak finding opens on its largest live allocation
    live = np.flatnonzero((d.alloc_index <= peak.index) & ((d.free_index < 0) | (d.free_index > peak.index)))
    assert peak.row in live and d.allocs.size[peak.row] == d.allocs.size[live].max()


def test_fmt():
    assert fmt_bytes(1536 * 1024 * 1024) == "1.50 GiB"
    assert fmt_bytes(512) == "512 B"
    assert parse_size("1.5 GiB") == 3 << 29
    assert parse_size("512k") == 512 * 1024
    assert parse_size("100MB") == 100 << 20
    assert parse_size("") == 0
    assert parse_size("lots") is None
    assert fmt_seconds(0.25, 0.05) == "250 ms"
    assert fmt_seconds(2.5, 0.5) == "2.5 s"
    assert fmt_seconds(0.5, 0.5, span=2.0) == "0.5 s"      # one unit along an axis
    assert fmt_seconds(0.0001234, 1e-6) == "123 µs"


def test_the_model_package_imports_without_qt():
    """viewer/model/ (and the package's own __init__) import no Qt, at run time too: the
    import-linter contract sees the imports; this sees what loading them really loads."""
    import subprocess
    import sys
    code = ("import pkgutil, sys, importlib\n"
            "import vramscope.viewer.model as m\n"
            "for info in pkgutil.iter_modules(m.__path__):\n"
            "    importlib.import_module(f'vramscope.viewer.model.{info.name}')\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6'))\n"
            "print(len(list(pkgutil.iter_modules(m.__path__))), bad)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    count, bad = r.stdout.strip().split(" ", 1)
    assert int(count) >= 8 and bad == "[]", r.stdout


def test_the_iteration_around_an_entry_is_found_by_search_as_by_a_scan():
    """A finding's zoom reads the iteration that holds its entry from the analysis' map of
    entries to iterations (at 10^7 events, 10,000 findings scanning 2,000 iterations each took
    1.3 s of the viewer's open): the same iteration a scan in order finds, and the same zoom,
    for every entry, on a run with 30 iterations."""
    from helpers import DATA
    snap = open_snapshot(str(DATA / "protocol2.pickle"), use_cache=False)
    an = analyze(snap)
    d = DeviceData(snap, an, an.primary_device())
    assert len(d.iterations) >= 20
    for i in range(-1, d.n + 1):
        scan = next((it for it in d.iterations if it.start_index <= i <= it.end_index), None)
        assert d.da.iteration_at(i) == scan, i       # (made from the columns when asked: equal, not the same object)
        assert (scan is None) == (d.da.iteration_at(i) is None)
        if scan is not None:
            assert d.zoom_around(i) == d.zoom_around(i, scan.start_index, scan.end_index), i


def test_the_reserved_curve_is_read_from_its_changes_exactly():
    """Reserved bytes change only at segment events: the viewer keeps them as their changes
    (lod.StepCurve), not a value an entry; every value, block extreme and range query is the
    dense curve's."""
    from helpers import DATA
    from vramscope.classifiers import analyze as _analyze
    from vramscope.parsers import open_snapshot as _open
    from vramscope.viewer.model.lod import MinMaxPyramid, StepCurve
    import numpy as _np
    checked = 0
    for path in sorted(DATA.glob("**/*.pickle")):
        try:
            an = _analyze(_open(str(path), use_cache=False))
        except Exception:
            continue
        for da in an.devices.values():
            lm = da.live
            if lm.reserved_start is None or len(lm.live_after) < 64 or not len(lm.reserved_change_index):
                continue
            dense = _np.asarray(lm.reserved_after)
            sc = StepCurve(len(dense), lm.reserved_start, lm.reserved_change_index, lm.reserved_change_value)
            assert (sc.take(_np.arange(len(dense))) == dense).all()
            assert sc[len(dense) - 1] == int(dense[-1])
            live = _np.asarray(lm.live_after)
            p_dense, p_sparse = MinMaxPyramid([live, dense]), MinMaxPyramid([live, sc])
            assert all((x == y).all() for x, y in zip(p_dense.levels_max, p_sparse.levels_max))
            assert all((x == y).all() for x, y in zip(p_dense.levels_min, p_sparse.levels_min))
            rng = _np.random.default_rng(1)
            a = rng.integers(0, len(dense), 300)
            b = _np.minimum(a + rng.integers(1, len(dense) + 1, 300), len(dense))
            assert all((x == y).all() for x, y in zip(p_dense.query(a, b), p_sparse.query(a, b)))
            checked += 1
        if checked >= 6:
            break
    assert checked >= 3


def test_the_guessed_bands_share_the_event_codes_and_say_the_same():
    """The composition of what is a guess reads the same entry -> row codes as the full one
    (one int32 an entry, not two: 40 MB at 10^7 events) and gives what its own codes would."""
    from helpers import DATA, analysis_of
    from vramscope.classifiers.categories import CATEGORIES as _CATS
    from vramscope.classifiers.liveset import Composition
    import numpy as _np
    an = analysis_of(DATA / "levers/dev/llama_tied.base.pickle")
    da = an.devices[an.primary_device()]
    g = da.guessed_composition()
    assert g is not None and g.codes is da.composition().codes
    own = Composition(np.asarray(g._category), da.allocs, da.n_entries, len(_CATS) + 1)   # codes of its own
    assert own.codes is not g.codes
    idx = _np.arange(-1, da.n_entries, 7)
    assert (own.at(idx) == g.at(idx)).all()


def test_the_allocator_and_the_size_order_built_on_a_thread_are_those_built_in_line(monkeypatch):
    """On a big run DeviceData builds the x axis, the allocator's history and the rows by size on a thread
    beside the curves: the same arrays as built in line on a small one."""
    from helpers import DATA
    from vramscope.viewer.model import device as device_module
    path = str(DATA / "expandable.pickle")

    def built(rows_from: int):
        monkeypatch.setattr(device_module, "BACKGROUND_ROWS", rows_from)
        an = analyze(open_snapshot(path, use_cache=False), use_cache=False)
        dev = an.primary_device()
        return DeviceData(an.snapshot, an, dev)

    started = []
    real = device_module.in_order
    monkeypatch.setattr(device_module, "in_order", lambda jobs, name: started.append(name) or real(jobs, name=name))
    on_thread = built(0)
    assert started == ["vramscope-device", "vramscope-allocator"]
    in_line = built(10 ** 12)
    assert len(started) == 2
    assert in_line.allocator.known and len(in_line.allocator.address)
    for name in ("start", "end", "address", "size", "stream", "expandable", "small"):
        assert np.array_equal(getattr(on_thread.allocator, name), getattr(in_line.allocator, name)), name
    assert np.array_equal(on_thread.rows_by_size, in_line.rows_by_size)
    assert on_thread.x_axis == in_line.x_axis and on_thread.time_axis == in_line.time_axis
    assert on_thread.rows_by_size.dtype == np.int32
    sizes = np.asarray(in_line.allocs.size)[in_line.rows_by_size]
    assert (sizes[:-1] >= sizes[1:]).all()


def test_the_times_and_allocator_begun_beside_the_analysis_are_those_made_after(monkeypatch):
    """The viewer's load begins the device's times, x axis and allocator history as soon as the
    analysis has classified its rows (analyze's `beside`), on a thread on a big run, while the
    analysis goes on: the model is the one made after the analysis, and the allocator's history
    made then is the analysis' own. `beside` is called once per device analyzed, before its run
    facts, and not for an analysis read from the cache."""
    from helpers import DATA
    from vramscope.classifiers import analysis as analysis_module
    from vramscope.viewer.model import device as device_module
    from vramscope.viewer.model.load import load
    path = str(DATA / "expandable.pickle")
    monkeypatch.setattr(device_module, "BACKGROUND_ROWS", 0)
    threads: list = []
    real = device_module.in_order
    monkeypatch.setattr(device_module, "in_order", lambda jobs, name: threads.append(name) or real(jobs, name=name))
    called: list = []
    real_prep = device_module.DevicePrep.beside_analysis

    def seen(snap, da):
        called.append((da.device, da.run.kind.value))     # (run facts not found yet: the default)
        return real_prep(snap, da)
    monkeypatch.setattr(device_module.DevicePrep, "beside_analysis", staticmethod(seen))
    early = load(path, use_cache=False)
    assert threads[0] == "vramscope-device-early" and "vramscope-allocator" not in threads
    assert called == [(early.device, None)] and early.analysis.devices[early.device].run.kind.value is not None
    after = DeviceData(early.snapshot, early.analysis, early.device)     # made after, in full
    assert early.data.allocator is early.analysis.allocator(early.device)
    assert early.data.allocator.known and len(early.data.allocator.address)
    for name in ("start", "end", "address", "size", "stream", "expandable", "small"):
        assert np.array_equal(getattr(early.data.allocator, name), getattr(after.allocator, name)), name
    assert early.data.x_axis == after.x_axis and early.data.time_axis == after.time_axis
    assert np.array_equal(early.data.times, after.times) and early.data.t0 == after.t0
    assert np.array_equal(early.data.rows_by_size, after.rows_by_size)
    calls: list = []
    analysis_module.analyze(early.snapshot, beside=calls.append, use_cache=False)
    assert len(calls) == 1
