"""The allocator's events as an event list (classifiers/events.py, vramscope/present/events.py):
each entry's allocation, category and code, the block map's header, the segment events, on
the real CUDA runs, the real snapshots in ../shared and the fixtures; the rows an entry
belongs to are checked against an independent reading of the raw trace (pickle.load)."""
from __future__ import annotations

import os
import pickle
import re

import numpy as np
import pytest

os.environ.setdefault("VRAMSCOPE_CACHE_DIR", "")

from vramscope.classifiers import CATEGORIES  # noqa: E402
from vramscope.classifiers.evidence import EVIDENCE  # noqa: E402
from vramscope.classifiers.events import (  # noqa: E402
    allocation_rows,
    event_window,
    next_segment_event,
    segment_events,
)
from vramscope.common.units import fmt_bytes  # noqa: E402
from vramscope.present.events import addr_text, event_header, event_rows  # noqa: E402
from vramscope.present.stacks import Stacks  # noqa: E402

from helpers import DATA, analysis_of, real_snapshots  # noqa: E402

SEGMENT = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
FILES = sorted(DATA.glob("cuda_*.pickle")) + [DATA / n for n in (
    "oom.pickle", "skip_actions.pickle", "metadata_annotate.pickle", "torch20_history.pickle",
    "multi_device.pickle", "expandable.pickle", "state_only_noframes.pickle")]
FILES += real_snapshots()


def raw_traces(path) -> list:
    with open(path, "rb") as fh:
        obj = pickle.load(fh)          # our own fixtures and ../shared: trusted files
    return obj.get("device_traces", []) if isinstance(obj, dict) else []


def reference_owner(trace) -> list:
    """Per entry, an independent reading: the (address, index of its alloc) of the block the
    entry acts on, walking the trace forwards; None for an entry on no block we saw
    allocated (segment events, blocks from before the trace)."""
    live: dict = {}
    out = []
    for i, e in enumerate(trace):
        act, addr = e["action"], e.get("addr")
        if act == "alloc":
            live[addr] = i
            out.append((addr, i))
        elif act in ("free_completed", "free"):
            out.append((addr, live.pop(addr)) if addr in live else None)
        elif act in ("free_requested", "annotate"):
            out.append((addr, live[addr]) if addr in live else None)
        else:
            out.append(None)
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_entry_belongs_to_the_allocation_the_raw_trace_says(path):
    an = analysis_of(path)
    traces = raw_traces(path)
    for dev, da in an.devices.items():
        n = da.n_entries
        rows = allocation_rows(da, np.arange(n))
        a = da.allocs
        # every alloc and every free that ends a row is that row's
        has = a.alloc_index >= 0
        assert (rows[a.alloc_index[has]] == np.flatnonzero(has)).all()
        ends = a.free_index >= 0
        assert (rows[a.free_index[ends]] == np.flatnonzero(ends)).all()
        names = [an.snapshot.action_names[c] for c in da.trace_action]
        assert all(rows[i] < 0 for i, nm in enumerate(names) if nm in SEGMENT + ("snapshot", "oom"))
        if dev < len(traces) and len(traces[dev]) == n and "free_completed" in names:
            ref = reference_owner(traces[dev])
            for i, owner in enumerate(ref):
                if owner is not None and rows[i] >= 0:
                    r = int(rows[i])
                    assert (int(a.addr[r]), int(a.alloc_index[r])) == owner, (dev, i)
                elif owner is not None and names[i] != "free_requested":
                    pytest.fail(f"entry {i} ({names[i]}) belongs to no row")
                elif rows[i] >= 0:           # a block from before the trace
                    assert a.alloc_index[rows[i]] < 0 and int(a.addr[rows[i]]) == traces[dev][i]["addr"]


@pytest.mark.parametrize("path", FILES[:4], ids=lambda p: p.name)
def test_a_window_is_the_trace_columns_with_each_rows_category(path):
    an = analysis_of(path)
    da = an.devices[an.primary_device()]
    cols = an.snapshot.trace(da.device).columns
    n = da.n_entries
    for start in (0, n // 2, n - 7):
        w = event_window(da, start, start + 300)
        stop = min(n, start + 300)
        assert len(w) == stop - start and w.index[0] == start
        for k in ("action", "addr", "size", "stream", "time_us", "stack"):
            assert (getattr(w, k) == np.asarray(cols[k])[start:stop]).all()
        has = w.row >= 0
        assert (w.category[has] == da.category[w.row[has]]).all() and (w.category[~has] == -1).all()
        assert (w.evidence[has] == da.evidence[w.row[has]]).all()
    assert len(event_window(da, n - 2, n + 50)) == 2 and len(event_window(da, -10, 0)) == 0


def test_the_rows_of_the_h100_lora_run_say_what_happened_and_where():
    an = analysis_of(DATA / "cuda_lora.pickle")
    da = an.devices[0]
    st = Stacks(an)
    p = da.peak.index
    rows = event_rows(da, st, p - 50, p + 50)
    assert [r.index for r in rows] == list(range(p - 50, p + 50))
    for r in rows:
        assert r.action in an.snapshot.action_names
        if r.action in ("alloc", "free_requested", "free_completed"):
            assert r.category in CATEGORIES and r.row >= 0 and r.evidence
        if r.action in SEGMENT:
            assert r.category == "" and r.row == -1
        assert r.where and r.time_us is not None and r.time_us > 0
    peak = next(r for r in rows if r.index == p)
    assert peak.action == "alloc" and peak.size == int(an.snapshot.trace(0).columns["size"][p])
    # the code an entry came from: its user frame, briefly, when it has one
    sid = int(an.snapshot.trace(0).columns["stack"][p])
    uf = int(an.facts.stacks.user_frame[sid])
    if uf >= 0:
        fv = st.frame(uf)
        assert peak.where == f"{fv.file.rsplit('/', 1)[-1]}:{fv.line}"
    user = [r for r in event_rows(da, st, 0, da.n_entries) if re.fullmatch(r"record_cuda\.py:\d+", r.where)]
    assert len(user) > 100


def test_a_free_from_cpp_alone_is_named_by_the_allocation_it_frees():
    """On the H100 LoRA run (stacks='all') many frees happen in C++ destructors
    ('std::vector<at::Tensor>::~vector'): the list names them by what they free."""
    an = analysis_of(DATA / "cuda_lora.pickle")
    da = an.devices[0]
    st = Stacks(an)
    cols = an.snapshot.trace(0).columns
    user = an.facts.stacks.user_frame
    rows = event_rows(da, st, 0, da.n_entries)
    frees = [r for r in rows if r.action in ("free_requested", "free_completed") and r.row >= 0]
    cpp = [r for r in frees if not user[int(cols["stack"][r.index])] >= 0 and
           int(da.allocs.stack[r.row]) != int(cols["stack"][r.index])]
    assert len(cpp) > 100, "the run frees from C++ destructors"
    for r in cpp:
        assert r.where == "of " + st.site_short_of(int(da.allocs.stack[r.row]))
        assert "~" not in r.where and "std::" not in r.where
    # a free from the user's own code keeps its own line
    own = [r for r in frees if user[int(cols["stack"][r.index])] >= 0]
    assert own and all(not r.where.startswith("of ") for r in own)


def test_the_block_maps_header_names_the_event():
    an = analysis_of(DATA / "cuda_lora.pickle")
    da = an.devices[0]
    st = Stacks(an)
    cols = an.snapshot.trace(0).columns
    names = an.snapshot.action_names
    fc = next(i for i in range(da.n_entries) if names[int(cols["action"][i])] == "free_completed"
              and int(cols["size"][i]) >= 1 << 20)
    h = event_header(da, st, fc)
    row = int(allocation_rows(da, [fc])[0])
    assert h.startswith(f"entry {fc:,}: free_completed {fmt_bytes(int(cols['size'][fc]))} "
                        f"({CATEGORIES[int(da.category[row])]}")
    assert f" at {addr_text(int(cols['addr'][fc]))}, " in h and h.endswith(event_rows(da, st, fc, fc + 1)[0].where)
    assert re.search(r" at 0x[0-9a-f]+, ", h)
    seg = int(segment_events(da)[0])
    hs = event_header(da, st, seg)
    assert hs.startswith(f"entry {seg:,}: {names[int(cols['action'][seg])]} ") and "(" not in hs.split(" at ")[0]
    assert event_header(da, st, -1) == "before the trace"


def test_a_guessed_category_says_so_in_the_header():
    an = analysis_of(DATA / "adamw_after_step1.pickle")
    da = an.devices[0]
    st = Stacks(an)
    rows = allocation_rows(da, np.arange(da.n_entries))
    guessed = [i for i, r in enumerate(rows.tolist()) if r >= 0 and EVIDENCE[da.evidence[r]] == "guess"]
    assert guessed
    for i in guessed:
        assert f"({CATEGORIES[da.category[rows[i]]]}, a guess)" in event_header(da, st, i)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_segment_events_are_found_forward_and_backward(path):
    an = analysis_of(path)
    for da in an.devices.values():
        names = an.snapshot.action_names
        ref = [i for i, c in enumerate(da.trace_action.tolist()) if names[c] in SEGMENT]
        seg = segment_events(da)
        assert seg.tolist() == ref
        probes = ([0, da.n_entries - 1, -1] + ref[:3] + [r + 1 for r in ref[-3:]]) if da.n_entries else [-1, 0]
        for i in probes:
            nxt = [r for r in ref if r > i]
            prv = [r for r in ref if r < i]
            assert next_segment_event(da, i) == (nxt[0] if nxt else -1)
            assert next_segment_event(da, i, -1) == (prv[-1] if prv else -1)


def test_a_state_only_dump_has_no_events_and_says_nothing_wrong():
    an = analysis_of(DATA / "state_only_noframes.pickle")
    da = an.devices[0]
    assert da.n_entries == 0 and len(event_window(da, 0, 100)) == 0
    assert event_rows(da, Stacks(an), 0, 100) == [] and segment_events(da).size == 0
    assert next_segment_event(da, 0) == -1 and next_segment_event(da, 0, -1) == -1
    assert event_header(da, Stacks(an), 0) == "entry 0: not in the trace (0 entries)"
