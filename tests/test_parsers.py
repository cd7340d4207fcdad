"""The parser on real snapshots, re-pickled variants and the column cache."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from vramscope.parsers import Cancelled, Progress, live_model, open_snapshot, allocations
from vramscope.parsers.cache import cache_root

from helpers import (GROUNDTRUTH, NOT_A_SNAPSHOT, REAL_PEAKS, REPO, SHARED, env_without_cache, load_trusted,
                     needs_shared, reference_peaks, shared)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _peaks(snap) -> dict:
    return {d: live_model(snap, d).peak_bytes for d in snap.devices}


@needs_shared
@pytest.mark.parametrize("name", sorted(REAL_PEAKS))
def test_real_snapshot_peaks_match_readme(name):
    snap = open_snapshot(shared(name))
    assert _peaks(snap) == REAL_PEAKS[name]


def _assert_same_as_pickle(snap, obj):
    """Every trace column and every stack equals what pickle.load gives."""
    traces = obj.get("device_traces", []) if isinstance(obj, dict) else []
    for dev, trace in enumerate(traces):
        t = snap.trace(dev)
        assert len(t) == len(trace)
        if not trace:
            continue
        assert [snap.action_names[a] for a in t.action] == [e["action"] for e in trace]
        assert t.addr.tolist() == [e.get("addr", 0) for e in trace]
        assert t.size.tolist() == [e["size"] for e in trace]
        assert t.stream.tolist() == [e.get("stream", 0) for e in trace]
        assert t.time_us.tolist() == [e.get("time_us", -1) for e in trace]
        for i, e in enumerate(trace):
            if "frames" in e:
                want = [(f["filename"], f["line"], f["name"]) for f in e["frames"]]
                assert snap.stack_frames_list(int(t.stack[i])) == want, i
            else:
                assert t.stack[i] == -1


@needs_shared
@pytest.mark.parametrize("name", sorted(REAL_PEAKS))
def test_real_snapshot_columns_equal_pickle_load(name):
    _assert_same_as_pickle(open_snapshot(shared(name)), load_trusted(shared(name)))


@pytest.mark.parametrize("path", sorted(GROUNDTRUTH.glob("*.pickle")) + [REPO / "assets" / "example.pickle"],
                         ids=lambda p: p.name)
def test_profiler_converted_snapshots_equal_pickle_load(path):
    snap = open_snapshot(str(path))
    obj = load_trusted(path)
    _assert_same_as_pickle(snap, obj)
    assert _peaks(snap) == reference_peaks(obj)
    assert snap.layout == "profiler"
    assert live_model(snap, snap.devices[0]).reserved_peak is None  # torch's pseudo-segment is not reserved memory


def test_profiler_categories_are_kept():
    path = GROUNDTRUTH / "transformer_adamw.with_category.pickle"
    snap = open_snapshot(str(path))
    obj = load_trusted(path)
    t = snap.trace(0)
    got = [snap.category_names[c] if c else None for c in t.category]
    assert got == [e.get("category") for e in obj["device_traces"][0]]
    assert {"parameter", "optimizer_state", "gradient", "activation"} <= set(got)


@needs_shared
@pytest.mark.parametrize("protocol", [2, 3, 5])
def test_repickled_protocols_give_the_same_figures(tmp_path, protocol):
    name = "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle"
    obj = load_trusted(shared(name))
    path = tmp_path / f"p{protocol}.pickle"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    snap = open_snapshot(str(path))
    assert _peaks(snap) == REAL_PEAKS[name]
    _assert_same_as_pickle(snap, obj)


@needs_shared
def test_not_a_snapshot_is_refused_with_exit_3():
    r = subprocess.run([sys.executable, "-m", "vramscope", "summary", shared(NOT_A_SNAPSHOT)],
                       capture_output=True, text=True, env=env_without_cache())
    assert r.returncode == 3
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a memory snapshot" in lines[0]


@needs_shared
def test_summary_json_contract():
    name = "JasperSolt+EoR_NN__snapshot.pickle"
    r = subprocess.run([sys.executable, "-m", "vramscope", "summary", shared(name), "--json"],
                       capture_output=True, env=env_without_cache())
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["file"].endswith(name)
    (dev,) = doc["devices"]
    assert dev["device"] == 0
    # allocations: the rows of `allocations --csv`, the 31 blocks live before the trace included
    assert dev["entries"] == 5803 and dev["allocations"] == 1966 and dev["allocations_before_trace"] == 31
    assert dev["peak"]["bytes"] == 108258676
    assert dev["peak"]["index"] >= 0
    # `index` is the position in device_traces[0] of the alloc that reached the peak
    obj = load_trusted(shared(name))
    assert sum(e["action"] == "alloc" for e in obj["device_traces"][0]) == 1966 - 31
    assert obj["device_traces"][0][dev["peak"]["index"]]["action"] == "alloc"
    assert dev["peak"]["time_us"] == obj["device_traces"][0][dev["peak"]["index"]]["time_us"]
    for key in ("type", "by_category"):
        assert key in dev["peak"]
    for key in ("start_live_bytes", "end_live_bytes", "reserved_peak_bytes", "iterations", "leaks", "ooms"):
        assert key in dev
    assert sum(dev["peak"]["by_category"].values()) == dev["peak"]["bytes"]


@needs_shared
def test_summary_device_option():
    name = "Muduard+LayoutEditing__memory_snapshot.pkl"
    ok = subprocess.run([sys.executable, "-m", "vramscope", "summary", shared(name), "--json", "--device", "1"],
                        capture_output=True, env=env_without_cache())
    assert ok.returncode == 0
    assert [d["device"] for d in orjson.loads(ok.stdout)["devices"]] == [1]
    bad = subprocess.run([sys.executable, "-m", "vramscope", "summary", shared(name), "--device", "0"],
                         capture_output=True, text=True, env=env_without_cache())
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2():
    r = subprocess.run([sys.executable, "-m", "vramscope", "summary"], capture_output=True, text=True)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1


@needs_shared
def test_allocation_intervals_account_for_every_byte():
    """Live bytes from the allocation table equal the live-memory curve at every event."""
    name = "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle"
    snap = open_snapshot(shared(name))
    m = live_model(snap, 0)
    a = allocations(snap, 0)
    n = m.n_events
    delta = np.zeros(n + 1, dtype=np.int64)
    start = a.alloc_index < 0
    np.add.at(delta, np.where(start, 0, a.alloc_index + 1), a.size)
    freed = a.free_index >= 0
    np.add.at(delta, a.free_index[freed] + 1, -a.size[freed])
    curve = np.cumsum(delta)
    assert curve[0] == m.start_bytes
    assert np.array_equal(curve[1:], m.live_after)


# --------------------------------------------------------------------------- cache

def test_cache_reopen_is_from_cache_and_identical():
    path = str(GROUNDTRUTH / "mlp_adamw.pickle")
    first = open_snapshot(path)
    second = open_snapshot(path)
    assert not first.from_cache and second.from_cache
    for col in ("action", "addr", "size", "time_us", "stack"):
        assert np.array_equal(first.trace(0).columns[col], second.trace(0).columns[col])
    assert first.strings == second.strings
    assert _peaks(first) == _peaks(second)


def _only_entry():
    root = cache_root()
    entries = [p for p in Path(root).iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1
    return entries[0]


def test_changed_file_is_reparsed(tmp_path):
    src = load_trusted(GROUNDTRUTH / "sgd_accum.pickle")
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(src))
    a = open_snapshot(str(path))
    src["device_traces"][0] = src["device_traces"][0][: len(src["device_traces"][0]) // 2]
    path.write_bytes(pickle.dumps(src))
    os.utime(path, ns=(1, 1))   # even with an old mtime, size and content differ
    b = open_snapshot(str(path))
    assert not b.from_cache
    assert len(b.trace(0)) == len(a.trace(0)) // 2


@pytest.mark.parametrize("damage", ["truncate_column", "drop_meta", "garbage_meta", "bad_stack_ids"])
def test_damaged_cache_is_rebuilt(damage):
    path = str(GROUNDTRUTH / "mlp_adamw.pickle")
    good = _peaks(open_snapshot(path))
    entry = _only_entry()
    if damage == "truncate_column":
        col = entry / "d0_size.bin"
        col.write_bytes(col.read_bytes()[:-8])
    elif damage == "drop_meta":   # what a crash half-way through writing looks like
        (entry / "manifest").unlink()
    elif damage == "garbage_meta":
        (entry / "manifest").write_bytes(b"{not json")
    else:
        col = entry / "d0_stack.bin"
        col.write_bytes(np.full(len(col.read_bytes()) // 4, 10**8, dtype=np.int32).tobytes())
    again = open_snapshot(path)
    assert not again.from_cache
    assert _peaks(again) == good
    assert open_snapshot(path).from_cache   # and the rebuilt entry is good


def test_unwritable_cache_dir_still_opens(tmp_path, monkeypatch):
    """A cache folder that cannot be made: the file opens without a cache, exactly as an
    uncached open reads it, and nothing is written anywhere."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(blocker / "cache"))
    path = str(GROUNDTRUTH / "mlp_adamw.pickle")
    snap = open_snapshot(path)
    assert not snap.from_cache and not snap.cache_entry
    plain = open_snapshot(path, use_cache=False)
    assert snap.devices == plain.devices and len(snap.trace(0)) == len(plain.trace(0)) > 0
    for k, col in plain.trace(0).columns.items():
        assert np.array_equal(np.asarray(snap.trace(0).columns[k]), np.asarray(col)), k
    assert _peaks(snap) == _peaks(plain) == reference_peaks(load_trusted(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"] and blocker.read_text() == "not a directory"


def test_cancel_leaves_no_cache_behind():
    p = Progress()
    p.cancel()
    with pytest.raises(Cancelled):
        open_snapshot(str(GROUNDTRUTH / "transformer_adamw.pickle"), progress=p)
    root = Path(cache_root())
    assert not root.exists() or not any(root.iterdir())


def test_progress_reports_bytes():
    seen = []
    p = Progress(lambda label, done, total: seen.append((done, total)), min_interval=0)
    path = GROUNDTRUTH / "transformer_adamw.pickle"
    open_snapshot(str(path), progress=p)
    assert seen and seen[-1][0] == seen[-1][1] == path.stat().st_size


# --------------------------------------------------------------------------- layering

def test_parsers_and_classifiers_import_no_qt():
    code = ("import sys, vramscope.parsers, vramscope.classifiers, vramscope.cli\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'PyQt5', 'PyQt6', 'shiboken6')]\n"
            "print(bad)\n"
            "sys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for folder in ("parsers", "classifiers"):
        for src in (REPO / folder).rglob("*.py"):
            text = src.read_text()
            for qt in ("PySide6", "pyqtgraph", "PyQt"):
                assert f"import {qt}" not in text and f"from {qt}" not in text, src


@needs_shared
@pytest.mark.parametrize("fresh_strings", [False, True])
def test_torch_212_213_entry_fields(tmp_path, fresh_strings):
    """pool_id tuples (2.12), forward_frames on some entries (2.13), compile_context and
    user_metadata (2.10), as shared or as fresh string objects, and key strings that are
    other objects than the segments' keys: all decoded, by the fast path too."""
    name = "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle"
    obj = load_trusted(shared(name))
    for i, e in enumerate(obj["device_traces"][0]):
        frames = e.pop("frames")
        e["compile_context"] = "".join(["N", "/A"]) if fresh_strings else "N/A"
        e["user_metadata"] = f"step{i // 5000}"
        e["frames"] = frames
        e["pool_id"] = (0, i % 3)
        if i % 5 == 0:
            e["forward_frames"] = frames
    path = tmp_path / "v213.pickle"
    path.write_bytes(pickle.dumps(obj))
    snap = open_snapshot(str(path))
    t = snap.trace(0)
    entries = obj["device_traces"][0]
    assert t.pool_a.tolist() == [0] * len(entries)
    assert t.pool_b.tolist() == [e["pool_id"][1] for e in entries]
    assert [snap.strings[i] for i in t.compile_context] == ["N/A"] * len(entries)
    assert [snap.strings[i] for i in t.user_metadata] == [e["user_metadata"] for e in entries]
    fw = [snap.stack_frames_list(int(x)) if x >= 0 else None for x in t.forward_stack]
    assert fw == [[(f["filename"], f["line"], f["name"]) for f in e["forward_frames"]] if "forward_frames" in e
                  else None for e in entries]
    _assert_same_as_pickle(snap, obj)
    assert _peaks(snap) == REAL_PEAKS[name]


def test_cache_keeps_only_recent_entries(tmp_path, monkeypatch):
    from vramscope.parsers import cache as cache_mod
    monkeypatch.setattr(cache_mod, "MAX_ENTRIES", 3)
    src = (GROUNDTRUTH / "sgd_accum.pickle").read_bytes()
    for i in range(5):
        p = tmp_path / f"s{i}.pickle"
        p.write_bytes(src)
        os.utime(p, ns=(i * 10**9, i * 10**9))
        open_snapshot(str(p))
    entries = [e for e in Path(cache_root()).iterdir() if not e.name.startswith(".")]
    assert len(entries) == 3


def test_unbatched_protocol2_trace_longer_than_the_stack_limit(tmp_path):
    """torch's C++ pickler (protocol 2) writes a list as one MARK ... APPENDS with no
    batching of 1000; a long trace must stream through, not hit the stack bound."""
    import struct
    from vramscope.parsers.limits import MAX_STACK

    def u(s):
        b = s.encode()
        return b"X" + struct.pack("<I", len(b)) + b

    n = MAX_STACK + 20_000
    entry_a = b"}(" + u("action") + u("alloc") + u("addr") + b"J%s" + u("size") + b"K\x10" + u("stream") + b"K\x00u"
    entry_f = entry_a.replace(u("alloc"), u("free_completed"))
    body = []
    for i in range(n // 2):
        addr = struct.pack("<i", 4096 + 16 * i)
        body.append(entry_a.replace(b"%s", addr))
        body.append(entry_f.replace(b"%s", addr))
    data = (b"\x80\x02}(" + u("segments") + b"]" + u("device_traces") + b"](](" + b"".join(body)
            + b"eeu.")
    path = tmp_path / "cxx.pickle"
    path.write_bytes(data)
    snap = open_snapshot(str(path))
    assert len(snap.trace(0)) == n
    m = live_model(snap, 0)
    assert m.peak_bytes == 16 and m.end_bytes == 0


def test_summary_is_cached_beside_the_columns_and_survives_damage(tmp_path):
    env = dict(os.environ, VRAMSCOPE_CACHE_DIR=str(tmp_path / "c"))
    path = str(GROUNDTRUTH / "leak.pickle")

    def run():
        r = subprocess.run([sys.executable, "-m", "vramscope", "summary", path, "--json"],
                           capture_output=True, env=env)
        assert r.returncode == 0, r.stderr
        return orjson.loads(r.stdout)

    first = run()
    arts = list((tmp_path / "c").rglob("art-summary-*.json"))
    assert len(arts) == 1
    assert run() == first
    arts[0].write_bytes(b"{damaged")
    assert run() == first
    # stored again whole, but for the iterations: the analysis cache's arrays hold them
    stored = orjson.loads(arts[0].read_bytes())["devices"]
    assert [d["iterations"] for d in stored] == ["in the analysis cache"] * len(stored)
    assert [{**d, "iterations": None} for d in stored] == [{**d, "iterations": None} for d in first["devices"]]


def test_bad_rules_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "rules.toml"
    bad.write_text("this is = not [valid\n")
    r = subprocess.run([sys.executable, "-m", "vramscope", "summary", str(GROUNDTRUTH / "leak.pickle"),
                        "--rules", str(bad)], capture_output=True, text=True, env=env_without_cache())
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "rules" in r.stderr and "Traceback" not in r.stderr
