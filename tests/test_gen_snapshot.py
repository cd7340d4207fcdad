"""The benchmark snapshot generator (benchmarks/gen_snapshot.py) writes exactly
what pickle.dump(obj, f, protocol=4) writes, and its snapshots are
consistent."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import random
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import gen_snapshot  # noqa: E402
from _pickle4 import Writer  # noqa: E402

# opcodes a real snapshot may contain (DESIGN.md section 2)
ALLOWED_OPS = {"PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MARK",
               "EMPTY_DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_TUPLE",
               "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SHORT_BINUNICODE", "BINUNICODE", "BININT",
               "BININT1", "BININT2", "LONG1", "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE", "STOP"}


def _write(obj) -> bytes:
    b = io.BytesIO()
    w = Writer(b)
    w.save(obj)
    w.finish()
    return b.getvalue()


# -- the low-level writer -----------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 2, 999, 1000, 1001, 2000, 2001])
def test_writer_list_and_dict_batching(n):
    lst = [i * 7919 for i in range(n)]
    assert _write(lst) == pickle.dumps(lst, protocol=4)
    d = {f"k{i}": i for i in range(n)}
    assert _write(d) == pickle.dumps(d, protocol=4)


def test_writer_scalars_and_sharing():
    s = "shared string"
    inner = {"a": 1}
    obj = [None, True, False, 0, 255, 256, 65535, 65536, -1, -256, 2**31 - 1, 2**31, -2**31, -2**31 - 1,
           2**63, -2**63, 140_000_000_000_000, 1_750_000_000_000_000, 0.0, -1.5, 1e300,
           "", "", "x" * 255, "x" * 256, "é∂𝄞", (0, 0), (), (1,), (1, 2, 3), (1, 2, 3, 4),
           s, s, inner, inner, [inner, s], "y" * 70_000]
    assert _write(obj) == pickle.dumps(obj, protocol=4)


def test_writer_framing_random_objects():
    """Frames end at the first save() boundary past 64 KiB, exactly as the C
    pickler does, whatever nesting the boundary falls into."""
    for seed in range(12):
        r = random.Random(seed)
        pool = []
        budget = [6000]

        def obj(depth):
            budget[0] -= 1
            k = r.random()
            if depth > 2 or k < 0.4 or budget[0] <= 0:
                c = r.randrange(5)
                if c == 0:
                    return r.randrange(-2**40, 2**50)
                if c == 1 and pool:
                    return r.choice(pool)
                s = ("frame" * r.randrange(1, 120)).encode().decode() + str(r.random())
                pool.append(s)
                return s
            n = r.choice([1, 2, 6, 40, 1200] if depth == 0 else [1, 2, 6, 40])
            if k < 0.7:
                d = {f"key{i}": obj(depth + 1) for i in range(n)}
                pool.append(d)
                return d
            lst = [obj(depth + 1) for _ in range(n)]
            pool.append(lst)
            return lst

        o = [obj(0) for _ in range(4)]
        assert _write(o) == pickle.dumps(o, protocol=4), seed


# -- generated snapshots ------------------------------------------------------

def _gen(tmp_path, n, seed, **kw):
    p = tmp_path / f"snap_{n}_{seed}.pickle"
    stats = gen_snapshot.generate(str(p), n, seed=seed, **kw)
    return p.read_bytes(), stats


def _check_consistent(snap, n_events, free_stacks="free"):
    assert list(snap) == ["segments", "device_traces", "allocator_settings", "external_annotations"]
    trace = snap["device_traces"][0]
    assert n_events - 1 <= len(trace) <= n_events
    # frames: shared dicts {name, filename, line} with their own strings
    frames = {}
    for e in trace:
        assert list(e) == ["action", "addr", "size", "stream", "time_us", "frames"]
        for f in e["frames"]:
            frames[id(f)] = f
    for f in frames.values():
        assert list(f) == ["name", "filename", "line"]
    names = [id(f["name"]) for f in frames.values()]
    assert len(set(names)) == len(names)
    assert 10 <= max(len(e["frames"]) for e in trace) <= 70
    assert len({f["filename"] for f in frames.values() if f["line"] == 0}) > 3   # C++ frames
    # time increases, addresses look like CUDA VAs
    times = [e["time_us"] for e in trace]
    assert times == sorted(times) and times[0] > 1.7e15
    assert all(0x7F0000000000 <= e["addr"] < 0x800000000000 for e in trace)

    # live memory replay
    live = {}          # addr -> (size, frames list)
    freed_untraced = {}
    segs = {}
    prev = None
    for e in trace:
        a, addr, size = e["action"], e["addr"], e["size"]
        if a == "segment_alloc":
            assert addr not in segs
            segs[addr] = size
        elif a == "segment_free":
            assert segs.pop(addr, size) == size
        elif a == "alloc":
            assert addr not in live
            live[addr] = (size, e["frames"])
            if prev is not None and prev["action"] == "segment_alloc":
                assert prev["frames"] is e["frames"] and prev["addr"] == addr
        elif a == "free_requested":
            pass
        elif a == "free_completed":
            assert prev["action"] == "free_requested" and prev["addr"] == addr
            assert prev["frames"] is e["frames"]
            if addr in live:
                lsize, lframes = live.pop(addr)
                assert lsize == size
                if free_stacks == "alloc":
                    assert e["frames"] is lframes
                else:
                    assert e["frames"] is not lframes
            else:
                freed_untraced[addr] = size
        else:
            raise AssertionError(a)
        prev = e

    active = {}
    for s in snap["segments"]:
        assert list(s) == ["device", "address", "total_size", "allocated_size", "active_size",
                           "requested_size", "stream", "segment_type", "segment_pool_id",
                           "is_expandable", "blocks", "frames"]
        assert s["segment_pool_id"] == (0, 0) and s["is_expandable"] is False
        a = s["address"]
        alloc_sz = req_sz = 0
        for b in s["blocks"]:
            assert list(b) == ["address", "size", "requested_size", "state", "frames"]
            assert b["address"] == a and b["size"] % 512 == 0
            a += b["size"]
            if b["state"] == "active_allocated":
                alloc_sz += b["size"]
                req_sz += b["requested_size"]
                active[b["address"]] = b
            else:
                assert b["state"] == "inactive" and b["frames"] == []
        assert a == s["address"] + s["total_size"]
        assert (s["allocated_size"], s["active_size"], s["requested_size"]) == (alloc_sz, alloc_sz, req_sz)
        assert s["segment_type"] == ("small" if s["total_size"] == 2 * 1024 * 1024 else "large")
        if s["address"] in segs:
            assert segs.pop(s["address"]) == s["total_size"]
    assert not segs, "segments allocated in the trace and never freed must be in `segments`"

    # end state: blocks allocated in the trace carry the alloc's frames list;
    # the others were live before recording began
    for addr, (size, lframes) in live.items():
        b = active[addr]
        assert b["requested_size"] == size and b["frames"] is lframes
        assert b["size"] == max(512, (size + 511) // 512 * 512) or b["size"] > size
    pre = {addr: b["requested_size"] for addr, b in active.items() if addr not in live}
    assert all(active[a]["frames"] == [] for a in pre)
    cur = sum(pre.values()) + sum(freed_untraced.values())
    peak = cur
    for e in trace:
        if e["action"] == "alloc":
            cur += e["size"]
        elif e["action"] == "free_completed":
            cur -= e["size"]
        assert cur >= 0
        peak = max(peak, cur)
    assert cur == sum(b["requested_size"] for b in active.values())
    assert peak > cur

    ann = snap["external_annotations"]
    assert ann and len(ann) % 2 == 0
    for st, en in zip(ann[::2], ann[1::2]):
        assert list(st) == ["stage", "name", "device", "time_us"]
        assert (st["stage"], en["stage"]) == ("START", "END") and st["name"] == en["name"]
        assert st["time_us"] <= en["time_us"]
    return trace


@pytest.mark.parametrize("n,seed", [(3000, 1), (20000, 0)])
def test_generated_bytes_equal_pickle_dump(tmp_path, n, seed):
    data, stats = _gen(tmp_path, n, seed)
    snap = pickle.loads(data)
    assert pickle.dumps(snap, protocol=4) == data
    assert stats["entries"] == len(snap["device_traces"][0]) and stats["bytes"] == len(data)
    _check_consistent(snap, n)
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert ops <= ALLOWED_OPS
    assert {"FRAME", "LONG_BINGET", "LONG1", "BINUNICODE", "TUPLE2", "BINFLOAT"} <= ops


def test_variants_and_determinism(tmp_path):
    a, _ = _gen(tmp_path, 5000, 3, free_stacks="alloc", devices=3)
    snap = pickle.loads(a)
    assert pickle.dumps(snap, protocol=4) == a
    assert [len(t) for t in snap["device_traces"][1:]] == [0, 0]
    _check_consistent(snap, 5000, free_stacks="alloc")
    b, _ = _gen(tmp_path, 5000, 3, free_stacks="alloc", devices=3)
    assert a == b
    c, _ = _gen(tmp_path, 5000, 4)
    assert c != a


def test_real_file_shapes_are_mirrored(tmp_path):
    """Sharing as in real torch files: key strings shared, frame dicts shared,
    '' the only shared frame string, one tuple per segment."""
    data, _ = _gen(tmp_path, 4000, 0)
    snap = pickle.loads(data)
    trace = snap["device_traces"][0]
    assert len({id(k) for e in trace for k in e}) == 6
    assert len({id(e["action"]) for e in trace}) == len({e["action"] for e in trace})
    segs = snap["segments"]
    assert len({id(s["segment_pool_id"]) for s in segs}) == len(segs)
    assert len({id(s["segment_type"]) for s in segs}) <= 2
    fr = {id(f): f for e in trace for f in e["frames"]}
    empty = [f for f in fr.values() if f["filename"] == ""]
    assert empty and len({id(f["filename"]) for f in empty}) == 1
    contents = [(f["name"], f["filename"], f["line"]) for f in fr.values()]
    assert len(set(contents)) < len(contents)       # equal frames, distinct objects
    assert snap["allocator_settings"]["expandable_segments"] is False


def test_cli(tmp_path):
    out = tmp_path / "cli.pickle"
    r = subprocess.run([sys.executable, os.path.join(BENCH, "gen_snapshot.py"), "--events", "2e3",
                        "-o", str(out), "--seed", "5", "-q"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert pickle.dumps(pickle.loads(data), protocol=4) == data


# -- the benchmark harness ------------------------------------------------------

def test_bench_parse_harness_with_stand_in(tmp_path):
    """The harness measures (a), a stand-in CLI for (b)/(c), an extra command,
    and reports a failing command in its row instead of stopping."""
    import json

    standin = "{python} -c 'import json; print(json.dumps({\"file\": 1, \"devices\": []}))'"
    failing = "{python} -c 'import sys; sys.exit(\"no such thing\")'"
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_parse.py"), "--events", "2e3",
                        "--out", str(tmp_path), "--cli", standin, "--extra", failing, "--repeat", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    (size,) = res["sizes"]
    assert size["events"] == 2000 and size["generated"] and size["bytes"] > 0
    rows = size["rows"]
    assert rows["a"]["ok"] and rows["a"]["rss_mb"] > 1 and rows["a"]["work_s"] > 0
    assert rows["b"]["ok"] and rows["c"]["ok"] and "time_ratio" in rows["b"] and "rss_ratio" in rows["c"]
    assert not rows["d1"]["ok"] and "no such thing" in rows["d1"]["error"]
    assert len(size["raw"]["a"]) == 2
    assert "FAILED" in r.stdout
    # a second run reuses the snapshot
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_parse.py"), "--events", "2e3",
                        "--out", str(tmp_path), "--cli", standin, "--only", "a"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["sizes"][0]["generated"] is False and list(res["sizes"][0]["rows"]) == ["a"]
