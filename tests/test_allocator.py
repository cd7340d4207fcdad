"""The caching allocator over the trace (classifiers/allocator.py): segments, blocks, pending
frees, rounding, the reserved-but-unallocated bytes and the cache outside the largest free
block, several streams; and that its totals are the analysis' own figures (the live and
reserved lines, the OOM reports) on every real snapshot and fixture."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from vramscope.classifiers import analyze
from vramscope.classifiers.allocator import ROUND, SMALL_SEGMENT, rounded, small_pool
from vramscope.parsers import open_snapshot
from vramscope.parsers.tables import A_FREE_REQUESTED

from helpers import DATA, GROUNDTRUTH, NOT_A_SNAPSHOT, REPO, SHARED

MiB = 1 << 20
FILES = sorted(
    [p for p in SHARED.glob("*.p*kl*") if p.name != NOT_A_SNAPSHOT] if SHARED.is_dir() else []
) + sorted(DATA.glob("*.pickle")) + sorted(GROUNDTRUTH.glob("*.pickle")) + [REPO / "assets" / "example.pickle"]


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


def analysis(path):
    return analyze(open_snapshot(str(path), use_cache=False), use_cache=False)


def test_state_of_two_streams_with_a_pending_free(tmp_path):
    an = analysis(two_stream_snapshot(tmp_path / "streams.pickle"))
    h, da = an.allocator(0), an.devices[0]
    st = h.state_at(6)                     # after free_requested (5), before free_completed (8)
    assert st.streams == [0, 7] and len(st.segments) == 2
    assert [s.stream for s in st.segments] == [0, 7]
    big = st.segments[0]
    # a block whose free is pending is still allocated (torch counts it so), and said apart
    assert big.pending == 5 * MiB and big.allocated == 3 * MiB + 100 + 5 * MiB
    assert big.rounding == (3 * MiB + 512) - (3 * MiB + 100)
    assert big.cached == 20 * MiB - (3 * MiB + 512) - 5 * MiB
    small = st.segments[1]
    assert small.small and small.allocated == 700 + 512 and small.rounding == 1024 - 700
    assert st.reserved == da.live.reserved_at(6) == 22 * MiB
    assert st.allocated == int(da.live.live_after[6]) and st.pending_free == 5 * MiB
    assert st.reserved == st.allocated + st.rounding + st.cached
    assert st.reserved_unallocated == st.rounding + st.cached == da.reserved_unallocated_at(6)
    # the pending block is free once its stream is done
    later = h.state_at(8)
    assert later.pending_free == 0 and later.segments[0].cached == 20 * MiB - (3 * MiB + 512) - MiB
    # the cache outside the largest free block: the freed block joined its neighbours
    gaps = [12 * MiB - (3 * MiB + 512), 20 * MiB - 13 * MiB]
    assert later.segments[0].largest_free == max(gaps) == later.largest_free
    assert later.cached_outside_largest_free == pytest.approx(1 - max(gaps) / later.cached)
    assert 0 < later.cached_outside_largest_free < 1


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_the_allocator_adds_up_to_the_analysis(path):
    """At the peak, every OOM, the ends and 15 random entries: the simulation's reserved and
    allocated bytes are the live and reserved lines' (so "reserved but unallocated" is one
    number, wherever it is read), every live allocation sits in a segment, rounded to whole
    512-byte units, and each segment's free stretches add up to what it caches."""
    an = analysis(path)
    for dev, da in an.devices.items():
        h = an.allocator(dev)
        n = da.n_entries
        assert h.known == (da.live.reserved_start is not None and not da.reserved_unknown())
        rng = np.random.default_rng(0)
        moments = {-1, n - 1, da.peak.index, *(o.index for o in da.ooms), *rng.integers(0, max(n, 1), 15).tolist()}
        for i in sorted(moments):
            st = h.state_at(int(i))
            if not h.known:
                assert not st.known and st.reserved_unallocated is None and da.reserved_unallocated_at(i) is None
                continue
            live = int(da.live.live_after[i]) if 0 <= i < n else da.live.start_bytes
            assert st.reserved == da.live.reserved_at(i)
            assert st.allocated == live and len(st.block_row) == len(da.live_rows(i))
            assert st.reserved_unallocated == da.reserved_unallocated_at(i)
            assert st.reserved == st.allocated + st.rounding + st.cached
            assert np.all(st.block_rounded % ROUND == 0) and np.all(st.block_rounded >= st.block_size)
            assert all(0 <= s.largest_free <= s.cached for s in st.segments)
            assert 0.0 <= st.cached_outside_largest_free <= 1.0
            segs = h.segments_at(int(i))
            assert int(segs.size.sum()) == st.reserved and int(segs.allocated.sum()) == st.allocated
        for o in da.ooms:                       # the OOM report reads the same figure
            assert o.fragmentation_bytes == da.reserved_unallocated_at(o.index)


@pytest.mark.parametrize("path", FILES[:3] + [DATA / "oom.pickle", DATA / "expandable.pickle"],
                         ids=lambda p: p.name)
def test_live_rows_are_the_live_mask(path):
    an = analysis(path)
    for da in an.devices.values():
        assert np.all(np.diff(da.allocs.alloc_index.astype(np.int64)) >= 0)     # rows in allocation order
        for i in (-1, 0, da.n_entries // 2, da.peak.index, da.n_entries - 1):
            assert np.array_equal(da.live_rows(i), np.flatnonzero(da.live_mask(i)))


def test_rounded():
    assert rounded(np.array([1, 512, 513, 3 * MiB + 100])).tolist() == [512, 512, 1024, 3 * MiB + 512]


def test_small_pool_is_told_by_what_a_segment_holds_not_by_its_size_alone():
    """An expandable large-pool segment grows by 2 MiB pages: a 2 MiB piece holding (part of)
    a request over 1 MiB is the large pool's, though it has the small pool's size."""
    seg_addr = np.array([0, 2 * MiB, 4 * MiB, 6 * MiB, 100 * MiB])
    seg_size = np.array([SMALL_SEGMENT] * 4 + [20 * MiB])
    # piece 0: small requests only; piece 1: a 1.5 MiB request starts in it; piece 3: a 5 MiB
    # request that started in piece 2 reaches into it; the 20 MiB segment: large by size
    alloc_addr = np.array([0, 512 * 1024, 2 * MiB, 4 * MiB + 4096, 100 * MiB])
    alloc_size = np.array([4096, 1 * MiB, 3 * MiB // 2, 5 * MiB, 8 * MiB])
    assert small_pool(seg_addr, seg_size, alloc_addr, alloc_size).tolist() == [True, False, False, False, False]
    assert small_pool(seg_addr, seg_size, alloc_addr[:1], alloc_size[:1]).tolist() == [True] * 4 + [False]
    for part in (1, 2, 3):          # the requests read a few at a time: the same answer
        assert small_pool(seg_addr, seg_size, alloc_addr, alloc_size, part).tolist() == \
            [True, False, False, False, False]


def test_small_pool_and_the_segment_events_read_by_parts_are_as_read_whole():
    """On random segments and requests (reaching across pieces, in any address order), the
    small pool found reading the requests a part at a time is the one found reading them whole;
    and the allocator's history of a real expandable run is the same whatever part its segment
    events are made Python values in."""
    from vramscope.classifiers import allocator as allocator_module
    rng = np.random.default_rng(3)
    for _ in range(20):
        k = int(rng.integers(1, 40))
        seg_addr = np.sort(rng.integers(0, 200, k)) * MiB
        seg_size = np.where(rng.random(k) < 0.7, SMALL_SEGMENT, 20 * MiB)
        m = int(rng.integers(1, 300))
        alloc_addr = rng.integers(0, 200 * MiB, m)
        alloc_size = rng.integers(1, 6 * MiB, m)
        whole = small_pool(seg_addr, seg_size, alloc_addr, alloc_size, part=1 << 30)
        # by definition: a 2 MiB segment is the small pool's unless a request over 1 MiB overlaps it
        big = alloc_size > 1 * MiB
        told = [bool(size == SMALL_SEGMENT and not np.any(big & (alloc_addr < p + SMALL_SEGMENT) &
                                                         (alloc_addr + alloc_size > p)))
                for p, size in zip(seg_addr.tolist(), seg_size.tolist())]
        assert whole.tolist() == told
        for part in (1, 7, 64):
            assert np.array_equal(small_pool(seg_addr, seg_size, alloc_addr, alloc_size, part), whole)
    an = analysis(DATA / "expandable.pickle")
    dev = an.primary_device()
    whole = allocator_module.AllocatorHistory(an.snapshot, an.devices[dev])
    real = allocator_module._segment_events
    try:
        allocator_module._segment_events = lambda *a: real(*a, part=3)
        parts = allocator_module.AllocatorHistory(an.snapshot, an.devices[dev])
    finally:
        allocator_module._segment_events = real
    assert whole.known and len(whole.start) > 3
    for name in ("start", "end", "address", "size", "stream", "expandable", "small"):
        assert np.array_equal(getattr(parts, name), getattr(whole, name)), name


@pytest.mark.parametrize("name", ["oom.pickle", "keep_loss.pickle", "streams"])
def test_free_requested_pairs_with_the_block_it_frees(name, tmp_path):
    path = two_stream_snapshot(tmp_path / "s.pickle") if name == "streams" else DATA / name
    an = analysis(path)
    dev = an.primary_device()
    da = an.devices[dev]
    got = an.allocator(dev).free_requested_index()
    addr = np.asarray(an.snapshot.trace(dev).columns["addr"])
    ra, ai, fi = np.asarray(da.allocs.addr), np.asarray(da.allocs.alloc_index), np.asarray(da.allocs.free_index)
    want = np.full(len(ra), -1)
    for e in np.flatnonzero(da.trace_action == A_FREE_REQUESTED).tolist():     # a plain scan: the block live there
        live = np.flatnonzero((ra == addr[e]) & (ai < e) & ((fi < 0) | (fi >= e)))
        if len(live):
            want[live[-1]] = e
    assert np.array_equal(got, want)


def _segment_ranges_by_looking_at_every_one(events):
    """The definition segment_ranges keeps: each free or unmap reaches every live range it
    overlaps, in the order they were put in (a plain look over all of them)."""
    out, live = [], {}
    for e, a, n_bytes, up, st, mapped in events:
        b = a + n_bytes
        if up:
            live[a] = (b, e, st, mapped)
            continue
        covered = 0
        for pa in [pa for pa, (pb, _, _, _) in live.items() if pa < b and pb > a]:
            pb, pe, pst, pm = live.pop(pa)
            out.append((pe, e, pa, pb - pa, pst, pm))
            covered += min(pb, b) - max(pa, a)
            if pa < a:
                live[pa] = (a, e, pst, pm)
            if pb > b:
                live[b] = (pb, e, pst, pm)
        if n_bytes - covered > 0:
            out.append((-1, e, a, n_bytes - covered, st, mapped))
    return out, live


@pytest.mark.parametrize("seed", range(6))
def test_segment_ranges_found_by_search_are_those_of_a_look_at_every_one(seed):
    """Maps of pages, unmaps of parts of them and across several, frees of segments mapped
    before the trace, and (from a lost event) ranges that overlap, a zero size: the ranges
    reached by searching the sorted starts are those, in the order, of a look at every live one."""
    from vramscope.classifiers.allocator import segment_ranges
    rng = np.random.default_rng(seed)
    page = 2 * MiB
    for trial in range(40):
        events, live_pages = [], set()
        overlapping = trial % 4 == 3
        for e in range(int(rng.integers(1, 300))):
            a = int(rng.integers(0, 64)) * page
            n = int(rng.integers(1, 6)) * page
            if overlapping and rng.random() < 0.1:
                a += int(rng.integers(0, 4)) * 512 * 1024          # misaligned: overlaps a neighbour
            if trial % 7 == 0 and rng.random() < 0.02:
                n = 0
            up = bool(rng.random() < 0.55)
            if up and not overlapping:                              # a sane trace maps what is free
                pages = set(range(a // page, (a + n) // page))
                if pages & live_pages:
                    continue
                live_pages |= pages
            elif not up and not overlapping:
                live_pages -= set(range(a // page, (a + n) // page))
            events.append((e, a, n, up, int(rng.integers(0, 2)), bool(rng.random() < 0.5)))
        assert segment_ranges(iter(events)) == _segment_ranges_by_looking_at_every_one(events)


def test_segments_only_made_are_segment_ranges_answer():
    """A trace that only makes segments (a run's warm-up) takes `_made_only`, not the search per
    event: the same live ranges in the same order (as arrays), where an address is made again
    (the latest's end, the first's place), a range is mapped, or a size is zero."""
    from vramscope.classifiers.allocator import _made_only, _segment_events, segment_ranges
    from vramscope.parsers.tables import A_SEGMENT_ALLOC, A_SEGMENT_MAP
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(1, 400))
        act = np.where(rng.random(n) < 0.3, A_SEGMENT_MAP, A_SEGMENT_ALLOC).astype(np.uint8)
        addr = rng.integers(0, 60, n).astype(np.int64) * (2 << 20)      # repeats and overlaps
        size = rng.integers(0, 4, n).astype(np.int64) * (2 << 20)
        stream = rng.integers(0, 3, n).astype(np.int64)
        ev = np.arange(n)
        fields = (addr, size, stream)
        want_out, want = segment_ranges(_segment_events(ev, fields, np.ones(n, dtype=bool), act))
        a, b, e, st, mapped = _made_only(ev, fields, act)
        got = list(zip(a.tolist(), zip(b.tolist(), e.tolist(), st.tolist(), mapped.tolist())))
        assert want_out == [] and got == list(want.items())


@pytest.mark.parametrize("seed", range(4))
def test_segments_made_and_freed_whole_are_segment_ranges_answer(seed):
    """A trace whose segments are made and freed whole (the caching allocator's, no mapping)
    takes `_whole_segments`: the ranges that ended (in the order of their frees, those made
    before the trace with start -1) and those live at the end (in the order of their making)
    are segment_ranges', also where a segment is made inside another's range once that one is
    freed (the driver reuses addresses). Where two segments are live at once over the same
    addresses, a free's size is not its making's, two makings come in a row at an address, or
    a range is mapped, it declines (None) and the search answers."""
    from vramscope.classifiers.allocator import _segment_events, _whole_segments, segment_ranges
    from vramscope.parsers.tables import A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP
    rng = np.random.default_rng(seed)
    page = 2 << 20
    declined = answered = reused = 0
    for trial in range(60):
        slots = int(rng.integers(1, 40))
        live: dict[int, int] = {}
        before: set[int] = set()
        acts, addrs, sizes = [], [], []
        for _ in range(int(rng.integers(1, 400))):
            base = int(rng.integers(0, slots)) * 64 * page       # places far enough apart
            slot, other = base, base + 8 * page                  # ... one of whose addresses is
            if rng.random() < 0.3:                               # made again inside the other's
                slot, other = other, slot                        # range once that is freed
            if other in live:
                continue
            if slot in live and rng.random() < 0.7:
                acts.append(A_SEGMENT_FREE)
                sizes.append(live.pop(slot))
            elif slot not in live:
                acts.append(A_SEGMENT_ALLOC)
                live[slot] = int(rng.integers(1, 32)) * page
                sizes.append(live[slot])
            elif base not in before:                              # one made before the trace, freed
                before.add(base)
                acts.append(A_SEGMENT_FREE)
                sizes.append(int(rng.integers(1, 20)) * page)
                slot = base + 40 * page
            else:
                continue
            addrs.append(slot)
        n = len(acts)
        bad = trial % 5
        if bad == 1 and n > 1:
            sizes[-1] += page                                   # a free (or making) of another size
        elif bad == 2 and n > 1:
            addrs[-1] += page // 2                              # inside another place's range
        elif bad == 3:
            acts[0] = A_SEGMENT_MAP
        act = np.asarray(acts, dtype=np.uint8)
        ev = np.sort(rng.choice(10 * n, n, replace=False)).astype(np.int64)
        full = np.zeros(10 * n, dtype=np.uint8)
        full[ev] = act
        up = (full == A_SEGMENT_ALLOC) | (full == A_SEGMENT_MAP)
        fields = (np.asarray(addrs, dtype=np.int64), np.asarray(sizes, dtype=np.int64),
                  rng.integers(0, 3, n).astype(np.int64))
        want_out, want = segment_ranges(_segment_events(ev, fields, up, full))
        got = _whole_segments(ev, fields, up, full)
        if got is None:
            declined += 1
            assert bad in (1, 2, 3), trial
            continue
        answered += 1
        made_at = {x for x, y in zip(addrs, acts) if y == A_SEGMENT_ALLOC}
        reused += any(x + 8 * page in made_at for x in made_at)
        ended, (a, b, e, st, mapped) = got
        assert list(zip(*(c.tolist() for c in ended))) == want_out
        assert list(zip(a.tolist(), zip(b.tolist(), e.tolist(), st.tolist(), mapped.tolist()))) == list(want.items())
    assert answered >= 20 and declined >= 10 and reused >= 10


@pytest.mark.parametrize("path", [DATA / "oom.pickle", DATA / "expandable.pickle", DATA / "multi_device.pickle"],
                         ids=lambda p: p.name)
def test_segments_are_counted_a_part_of_the_rows_at_a_time(path, monkeypatch):
    """segments_at counts the live rows a part at a time (a moment of millions of live
    allocations): every part size gives what one pass over them all gives."""
    from vramscope.classifiers import allocator
    an = analysis(path)
    most = 0
    for da in an.devices.values():
        h = allocator.AllocatorHistory(an.snapshot, da)
        moments = sorted({-1, da.n_entries - 1, da.peak.index, *(o.index for o in da.ooms)})
        whole = [h.segments_at(i) for i in moments]
        most = max(most, *(len(da.live_rows(i)) for i in moments))
        for part in (1, 3):
            monkeypatch.setattr(allocator, "_PART", part)
            for i, w in zip(moments, whole):
                got = h.segments_at(i)
                assert np.array_equal(got.allocated, w.allocated) and np.array_equal(got.address, w.address)
        monkeypatch.undo()
    assert most > 3                             # (several parts, at 1 and 3 rows a part)


def test_segment_events_that_do_not_add_up_leave_reserved_memory_unknown(tmp_path, capsys):
    """Reserved memory is found from the segments the snapshot holds at its end, back through
    the trace's segment events. A trace whose events map more than that state holds (the
    expandable fixture's trace replayed three times over its own end state) went below zero:
    -471 GiB reserved at an OOM, 'reserved-but-free memory (-471.3 GiB)'. Where the events do
    not add up (less than nothing reserved at some moment), reserved memory is unknown, says
    why, and no OOM claims what the cache could have held."""
    import sys

    import orjson

    from helpers import load_trusted
    from vramscope.cli import main
    sys.path.insert(0, str(REPO / "benchmarks"))
    from tile_snapshot import tile
    snap = load_trusted(DATA / "expandable.pickle")
    n = max(len(t) for t in snap["device_traces"])
    path = tmp_path / "replayed.pickle"
    path.write_bytes(pickle.dumps(tile(snap, 3 * n), protocol=4))
    an = analysis(path)
    da = an.devices[0]
    assert int(da.live.reserved_start) < 0                 # (what the events say, read back from the end)
    why = "the trace's segment events do not add up to the segments the snapshot holds"
    assert da.reserved_unknown_why() == why and da.reserved_unallocated_at(da.ooms[0].index) is None
    assert len(da.ooms) == 3 and all(o.reserved is None and o.fragmentation_bytes is None for o in da.ooms)
    assert not an.allocator(0).known
    assert main(["summary", str(path), "--json"]) == 0
    d = orjson.loads(capsys.readouterr().out)["devices"][0]
    assert d["reserved_peak_bytes"] is None and d["reserved_unknown"] == why
    assert all("unknown" in o["diagnosis"] and "could not have held" not in o["diagnosis"] for o in d["ooms"])
    assert main(["summary", str(path)]) == 0
    assert f"reserved peak  unknown ({why})" in capsys.readouterr().out
    # the fit counts no allocator overhead read from reserved memory that is unknown, and says why
    assert main(["whatif", str(path), "--gpu", "80", "--json"]) == 0
    fit = capsys.readouterr().out
    assert f'"overhead_ratio":null' in fit.replace(" ", "") and f"allocator overhead unknown ({why})" in fit
    assert main(["report", str(path), "-o", str(tmp_path / "report")]) == 0
    assert f"| Reserved peak | unknown ({why}) |" in (tmp_path / "report" / "report.md").read_text()
    # the fixture itself adds up: its reserved memory and its OOM's cache as before
    one = analysis(DATA / "expandable.pickle").devices[0]
    assert one.reserved_unknown_why() is None and one.ooms[0].fragmentation_bytes == 15927296
