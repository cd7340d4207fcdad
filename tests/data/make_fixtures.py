#!/usr/bin/env python3
"""Generate the synthetic CUDA memory-snapshot fixtures in tests/data/ and expected.json.

    python tests/data/make_fixtures.py            # (re)write the fixtures + expected.json
    python tests/data/make_fixtures.py --check    # regenerate in memory, compare with the files on disk
    python tests/data/make_fixtures.py --real DIR # also print the reference figures of real snapshots

The fixtures are what a CPU-only machine cannot record: snapshots in torch's exact layout
(plain dicts/lists/tuples/str/int/bool/float pickled with ``pickle.dump`` like
``torch.cuda.memory._dump_snapshot``; ``protocol2.pickle`` is written the way the C++
``_memory_snapshot_pickled`` writes it).  A small caching-allocator simulator (``Dev``) produces
them, so every fixture is internally consistent: block rounding to 512 bytes, small (<= 1 MiB)
allocations in 2 MiB segments, large ones in 20 MiB or 2 MiB-rounded segments, best-fit reuse,
splitting and merging of inactive blocks, ``segment_free`` of wholly free segments, expandable
segments mapped/unmapped in 2 MiB (small) / 20 MiB (large) pieces.

Object sharing follows torch (``torch/csrc/cuda/Module.cpp``, ``py_symbolize``):
  * one dict object per unique frame ``{name, filename, line}`` ({filename, name, line} in 2.0);
  * one frames list object per captured traceback: an ``alloc`` entry, the block it produced in
    ``segments`` and, when the alloc opened a segment, the ``segment_alloc``/``segment_map`` entry
    and that segment's ``frames`` all share the alloc's list;
  * context='all' (the default of ``_record_memory_history``): ``free_requested`` and its
    ``free_completed`` share one list, the stack at free time;
    context='alloc' (and torch 2.0): frees reuse the allocation's list, so alloc, free_requested,
    free_completed and the block all share ONE list;
  * an entry without a recorded context has no ``frames`` key; segments/blocks without one get
    torch's single shared empty list; ``snapshot`` entries have no ``frames``.

REFERENCE FIGURES (``reference()`` below; expected.json holds its output per fixture and device)
  live set at the end  = {block address: requested_size} for blocks of the device in state
                         'active_allocated' or 'active_pending_free' (2.0 blocks have no 'address':
                         segment address + sizes of the blocks before it);
  backward replay      = walk device_traces[device] from the last entry to the first:
                         'alloc' removes its addr from the set, 'free_completed'/'free' (re)adds
                         addr -> size; start_bytes = sum of the set afterwards (blocks live before
                         the trace began);
  forward replay       = live = start_bytes; 'alloc' adds size, 'free_completed'/'free' subtract
                         size; every other action (free_requested, segment_*, snapshot, oom,
                         unknown) leaves live bytes unchanged;
  peak_bytes           = max(start_bytes, live after every alloc); peak_index = position in
                         device_traces[device] of the alloc that first reached it (-1 when the
                         start state is the peak); peak_time_us = that entry's time_us (None if
                         -1 or no time_us); end_bytes = live after the last entry (equals the
                         live set at the end in a consistent file);
  reserved             = end: sum of segment total_size of the device; backward: 'segment_alloc'/
                         'segment_map' subtract, 'segment_free'/'segment_unmap' add ->
                         reserved_start; forward: the inverse; reserved_peak = max over time;
  ooms                 = for each 'oom' entry: index, requested (= its size), device_free,
                         live_bytes and reserved_bytes at that point of the forward replay, and
                         fragmentation_bytes = reserved_bytes - live_bytes.
  entries / allocs     = len(device_traces[device]) / number of 'alloc' entries.
  Devices reported     = devices that own a segment or a non-empty trace.

This reference reproduces the README figures of every real file in shared/snapshots/ (run with
``--real``).  ``truth_*`` figures in expected.json are the generator's intent (the category it
gave each allocation), meant for classifier tests with tolerance, not a parser contract.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import struct
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# =============================================================================================
# Reference figures (pure functions on the unpickled Python objects)
# =============================================================================================
LIVE_STATES = ("active_allocated", "active_pending_free")
FREE_ACTIONS = ("free_completed", "free")
SEG_ADD = ("segment_alloc", "segment_map")
SEG_SUB = ("segment_free", "segment_unmap")


def snapshot_parts(snap):
    """(segments, device_traces) of a snapshot dict or of a bare list of segments."""
    if isinstance(snap, list):
        return snap, []
    return snap.get("segments", []), snap.get("device_traces", [])


def iter_blocks(seg):
    """(address, block) for the blocks of a segment; 2.0 blocks: address from the sizes."""
    addr = seg["address"]
    for b in seg.get("blocks", []):
        yield b.get("address", addr), b
        addr += b["size"]


def devices_of(snap):
    segs, traces = snapshot_parts(snap)
    return sorted({s.get("device", 0) for s in segs} | {i for i, t in enumerate(traces) if t})


def reference(snap, device):
    segs, traces = snapshot_parts(snap)
    trace = traces[device] if device < len(traces) else []
    segs = [s for s in segs if s.get("device", 0) == device]
    live = {}
    for s in segs:
        for a, b in iter_blocks(s):
            if b["state"] in LIVE_STATES:
                live[a] = b["requested_size"]
    end_state = sum(live.values())
    reserved_end = sum(s["total_size"] for s in segs)
    r = reserved_end
    for e in reversed(trace):
        act = e["action"]
        if act == "alloc":
            live.pop(e["addr"], None)
        elif act in FREE_ACTIONS:
            live[e["addr"]] = e["size"]
        elif act in SEG_ADD:
            r -= e["size"]
        elif act in SEG_SUB:
            r += e["size"]
    start = sum(live.values())
    reserved_start = r
    cur = peak = start
    idx = -1
    rpeak = r
    ooms = []
    for i, e in enumerate(trace):
        act = e["action"]
        if act == "alloc":
            cur += e["size"]
            if cur > peak:
                peak, idx = cur, i
        elif act in FREE_ACTIONS:
            cur -= e["size"]
        elif act in SEG_ADD:
            r += e["size"]
            rpeak = max(rpeak, r)
        elif act in SEG_SUB:
            r -= e["size"]
        elif act == "oom":
            ooms.append({"index": i, "requested": e["size"], "device_free": e.get("device_free"),
                         "live_bytes": cur, "reserved_bytes": r, "fragmentation_bytes": r - cur})
    return {
        "device": device,
        "entries": len(trace),
        "allocs": sum(1 for e in trace if e["action"] == "alloc"),
        "peak_bytes": peak,
        "peak_index": idx,
        "peak_time_us": trace[idx].get("time_us") if idx >= 0 else None,
        "start_bytes": start,
        "end_bytes": cur,
        "end_state_bytes": end_state,
        "reserved_start": reserved_start,
        "reserved_peak": rpeak,
        "reserved_end": reserved_end,
        "ooms": ooms,
    }


def reference_all(snap):
    return [reference(snap, d) for d in devices_of(snap)]


# =============================================================================================
# Consistency checks of a (loaded) fixture
# =============================================================================================
def check_consistency(snap, name):
    segs, traces = snapshot_parts(snap)
    for dev in devices_of(snap):
        ref = reference(snap, dev)
        assert ref["end_bytes"] == ref["end_state_bytes"], (name, dev, "replay does not end in end state")
        trace = traces[dev] if dev < len(traces) else []
        # rebuild the start set and replay forward, checking every free/alloc
        live = {}
        dsegs = [s for s in segs if s.get("device", 0) == dev]
        for s in dsegs:
            for a, b in iter_blocks(s):
                if b["state"] in LIVE_STATES:
                    live[a] = b["requested_size"]
        for e in reversed(trace):
            if e["action"] == "alloc":
                live.pop(e["addr"], None)
            elif e["action"] in FREE_ACTIONS:
                live[e["addr"]] = e["size"]
        for i, e in enumerate(trace):
            if e["action"] == "alloc":
                assert e["addr"] not in live, (name, dev, i, "alloc of a live address")
                live[e["addr"]] = e["size"]
            elif e["action"] in FREE_ACTIONS:
                assert live.get(e["addr"]) == e["size"], (name, dev, i, "free of a non-live block")
                del live[e["addr"]]
            elif e["action"] == "free_requested":
                assert live.get(e["addr"]) == e["size"], (name, dev, i, "free_requested of a non-live block")
        # reserved never below live, never negative
        r = ref["reserved_start"]
        cur = ref["start_bytes"]
        assert cur <= r, (name, dev)
        for e in trace:
            a = e["action"]
            if a == "alloc":
                cur += e["size"]
            elif a in FREE_ACTIONS:
                cur -= e["size"]
            elif a in SEG_ADD:
                r += e["size"]
            elif a in SEG_SUB:
                r -= e["size"]
            assert 0 <= cur <= r, (name, dev, "live above reserved")
        # segment invariants
        for s in dsegs:
            blocks = s["blocks"]
            assert sum(b["size"] for b in blocks) == s["total_size"], (name, "block sizes")
            assert all(b["size"] % 512 == 0 for b in blocks)
            if "allocated_size" in s:
                assert s["allocated_size"] == sum(b["size"] for b in blocks if b["state"] == "active_allocated")
                assert s["active_size"] == sum(b["size"] for b in blocks if b["state"] != "inactive")
            st = [b["state"] for b in blocks]
            assert not any(st[i] == st[i + 1] == "inactive" for i in range(len(st) - 1)), (name, "unmerged")
            for a, b in iter_blocks(s):
                if "address" in b:
                    assert b["address"] == a, (name, "block address")
    # one dict object per unique frame
    seen = {}
    for f in _all_frame_dicts(snap):
        key = tuple(sorted(f.items()))
        other = seen.setdefault(key, f)
        assert other is f, (name, "duplicate frame dict", key)


def check_sharing(snap, name, context):
    """Object identity as torch produces it (see the module docstring)."""
    segs, traces = snapshot_parts(snap)
    # blocks without a context (inactive ones) all hold torch's single shared empty list; an
    # empty list from a traceback without Python frames (autograd thread) is its own object
    empties = {id(b["frames"]) for x in segs for b in x["blocks"] if b["state"] == "inactive" and "frames" in b}
    assert len(empties) <= 1, (name, "inactive blocks' empty frames are not one shared list")
    for dev, trace in enumerate(traces):
        last_alloc, last_req = {}, {}
        alloc_lists = []
        for i, e in enumerate(trace):
            a = e["action"]
            f = e.get("frames")
            if a == "alloc":
                last_alloc[e["addr"]] = e
                if f is not None:
                    alloc_lists.append(id(f))
            elif a in ("segment_alloc", "segment_map") and f is not None:
                nxt = next((x for x in trace[i + 1:] if x["action"] not in ("segment_map",)), None)
                assert nxt is not None and nxt["action"] == "alloc" and nxt["frames"] is f, (name, i, "segment_alloc/map frames")
            elif a == "free_requested":
                last_req[e["addr"]] = e
                al = last_alloc.get(e["addr"])
                if al is not None and f is not None:
                    if context == "alloc":
                        assert f is al["frames"], (name, i, "free must reuse the allocation's frames")
                    else:
                        assert f is not al["frames"], (name, i, "free must have its own frames")
            elif a == "free_completed" and e["addr"] in last_req:
                assert f is last_req[e["addr"]].get("frames"), (name, i, "free_completed frames")
        assert len(alloc_lists) == len(set(alloc_lists)), (name, "two allocs share a frames list")
        for x in segs:
            if x.get("device", 0) != dev:
                continue
            for _, b in iter_blocks(x):   # _ = the block address
                if b["state"] == "inactive":
                    continue
                al = last_alloc.get(_)
                if al is not None and "frames" in b:
                    assert b["frames"] is al["frames"], (name, "block frames not shared with its alloc")
                if al is not None and b.get("history"):
                    assert b["history"][0].get("frames") is al.get("frames"), (name, "history frames")


def _all_frame_dicts(snap):
    segs, traces = snapshot_parts(snap)
    for s in segs:
        yield from s.get("frames", [])
        for b in s["blocks"]:
            yield from b.get("frames", [])
            for h in b.get("history", []):
                yield from h.get("frames", [])
    for t in traces:
        for e in t:
            f = e.get("frames")
            if isinstance(f, list):
                yield from f


# =============================================================================================
# The C++ pickler (torch/csrc/jit/serialization/pickler.cpp), protocol 2
# =============================================================================================
def cpp_pickle(obj):
    """Bytes as torch::jit::Pickler writes them for ``_memory_snapshot_pickled``: PROTO 2, no
    FRAME; str as BINUNICODE memoized by value (BINPUT after each new string, BINGET after);
    dict = EMPTY_DICT MARK k v ... SETITEMS (also when empty, never batched); list = EMPTY_LIST
    MARK ... APPENDS; containers referenced more than once (and frame dicts / frames lists, which
    torch holds elsewhere too) are memoized AFTER they are complete; ints: BININT1 (0..255),
    BININT2 (..65535), BININT (int32), else LONG1 with 8 bytes; bools NEWTRUE/NEWFALSE;
    floats BINFLOAT; tuples TUPLE1-3 / MARK ... TUPLE."""
    refs = Counter()
    forced = set()

    def count(o, parent_key=None):
        if isinstance(o, (dict, list, tuple)):
            refs[id(o)] += 1
            if refs[id(o)] > 1:
                return
            if parent_key == "frames" or (isinstance(o, dict) and ("filename" in o or "frames" in o)):
                forced.add(id(o))
            if isinstance(o, dict):
                for k, v in o.items():
                    count(k)
                    count(v, k)
            else:
                for v in o:
                    count(v)

    count(obj)
    out = bytearray(b"\x80\x02")
    memo_obj, memo_str = {}, {}
    next_id = [0]

    def put():
        i = next_id[0]
        out.extend(b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i))
        next_id[0] += 1
        return i

    def get(i):
        out.extend(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))

    def push(o):
        # tuples are built fresh for every entry by the C++ code: never shared, never memoized
        if isinstance(o, (dict, list)) and (refs[id(o)] > 1 or id(o) in forced):
            if id(o) in memo_obj:
                get(memo_obj[id(o)])
                return
            impl(o)
            memo_obj[id(o)] = put()
        else:
            impl(o)

    def impl(o):
        if o is None:
            out.extend(b"N")
        elif o is True:
            out.extend(b"\x88")
        elif o is False:
            out.extend(b"\x89")
        elif isinstance(o, int):
            if 0 <= o <= 0xFF:
                out.extend(b"K" + bytes([o]))
            elif 0 <= o <= 0xFFFF:
                out.extend(b"M" + struct.pack("<H", o))
            elif -(1 << 31) <= o < (1 << 31):
                out.extend(b"J" + struct.pack("<i", o))
            else:
                out.extend(b"\x8a\x08" + struct.pack("<q", o))
        elif isinstance(o, float):
            out.extend(b"G" + struct.pack(">d", o))
        elif isinstance(o, str):
            if o in memo_str:
                get(memo_str[o])
            else:
                data = o.encode("utf-8")
                out.extend(b"X" + struct.pack("<I", len(data)) + data)
                memo_str[o] = put()
        elif isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                push(k)
                push(v)
            out.extend(b"u")
        elif isinstance(o, list):
            out.extend(b"](")
            for v in o:
                push(v)
            out.extend(b"e")
        elif isinstance(o, tuple):
            if len(o) == 0:
                out.extend(b")")
            elif len(o) <= 3:
                for v in o:
                    push(v)
                out.extend({1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(o)])
            else:
                out.extend(b"(")
                for v in o:
                    push(v)
                out.extend(b"t")
        else:
            raise TypeError(type(o))

    push(obj)
    out.extend(b".")
    return bytes(out)


# =============================================================================================
# Caching-allocator simulator
# =============================================================================================
SMALL_SIZE = 1 * MiB      # kSmallSize: requests up to this go to the small pool
SMALL_BUFFER = 2 * MiB    # kSmallBuffer
LARGE_BUFFER = 20 * MiB   # kLargeBuffer
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB


def round_size(n):
    return 512 if n < 512 else (n + 511) // 512 * 512


def segment_size_for(rsize):
    if rsize <= SMALL_SIZE:
        return SMALL_BUFFER
    if rsize < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (rsize + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class OutOfMemory(Exception):
    """Raised by Dev.alloc when the simulated device is full (after the 'oom' entry is recorded)."""


class Blk:
    __slots__ = ("addr", "size", "req", "state", "frames", "free_frames", "history", "cat", "seg", "mapped",
                 "component")

    def __init__(self, addr, size, seg, req=0, mapped=True):
        self.addr, self.size, self.seg, self.req = addr, size, seg, req
        self.mapped = mapped
        self.state = "inactive" if mapped else "unmapped"
        self.frames = None
        self.free_frames = None
        self.history = []
        self.cat = None
        self.component = None       # component tracking's tag of the block (None: untagged)


class Seg:
    __slots__ = ("addr", "blocks", "small", "stream", "pool", "frames", "expandable", "mapped", "device")

    def __init__(self, addr, small, stream, pool, device, expandable=False):
        self.addr, self.small, self.stream, self.pool, self.device = addr, small, stream, pool, device
        self.blocks = []
        self.frames = None
        self.expandable = expandable
        self.mapped = 0

    @property
    def total(self):
        return sum(b.size for b in self.blocks if b.mapped)


class Snap:
    """One snapshot under construction: layout version, frame interning, clock, devices."""

    def __init__(self, version, t0=1_717_000_000_000_000, context="all", cpp=False,
                 alloc_conf="", expandable=False, max_split_size=-1):
        self.v = tuple(version)
        self.context = context            # 'all' | 'alloc'
        self.cpp = cpp                    # C++ _memory_snapshot_pickled key order
        self.t = t0
        self.empty = []                   # torch's single shared empty frames list
        self._frames = {}
        self._strs = {}
        self.devs = {}
        self.annotations = []
        self.compile_context = "N/A"
        self.user_metadata = ""
        self.component = None             # component tracking: the thread's current component type
        self.skip_actions = ()            # _record_memory_history(skip_actions=...): never recorded
        self.host = None                  # HostDev: pinned host memory (2.14 record_pinned_host_memory)
        self.alloc_conf = alloc_conf
        self.expandable = expandable
        self.max_split_size = max_split_size

    # -- strings / frames -------------------------------------------------------------------
    def s(self, text):
        return self._strs.setdefault(text, text)

    def frame(self, filename, line, name):
        key = (filename, line, name)
        f = self._frames.get(key)
        if f is None:
            if self.v < (2, 1):
                f = {"filename": self.s(filename), "name": self.s(name), "line": line}
            else:
                f = {"name": self.s(name), "filename": self.s(filename), "line": line}
            self._frames[key] = f
        return f

    def tb(self, stack):
        """A new captured traceback (frames list) for a stack of (filename, line, name)."""
        return [self.frame(*fr) for fr in call(stack)]

    # -- clock / devices / annotations -------------------------------------------------------
    def tick(self, dt=37):
        self.t += dt
        return self.t

    def device(self, index, base, **kw):
        d = Dev(self, index, base, **kw)
        self.devs[index] = d
        return d

    def annotate(self, name, stage, device=0, dt=5):
        self.annotations.append({"stage": stage, "name": name, "device": device, "time_us": self.tick(dt)})

    # -- output ---------------------------------------------------------------------------
    def allocator_settings(self):
        d = {
            "PYTORCH_CUDA_ALLOC_CONF": self.alloc_conf,
            "max_split_size": self.max_split_size,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": self.expandable,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
        }
        if self.v >= (2, 10):
            d["graph_capture_record_stream_reuse"] = False
        if self.v >= (2, 13):
            d["max_round_threshold"] = 0
            d["max_cached_size"] = 0
        d["roundup_power2_divisions"] = {str(1 << i): 0 for i in range(16)}
        return d

    def build(self, ndevices=None):
        segs = []
        for d in self.devs.values():
            segs.extend(d.segment_dicts())
        segs.sort(key=lambda x: x["address"])
        n = ndevices if ndevices is not None else max(self.devs) + 1
        traces = [self.devs[i].trace if i in self.devs else [] for i in range(n)]
        out = {"segments": segs, "device_traces": traces}
        if self.v >= (2, 3):
            out["allocator_settings"] = self.allocator_settings()
        if self.v >= (2, 5):
            out["external_annotations"] = self.annotations
        if self.v >= (2, 13):
            out["host_segments"] = self.host.segment_dicts() if self.host is not None else []
            out["host_traces"] = self.host.trace if self.host is not None else []
        return out


class Dev:
    def __init__(self, snap, index, base, expandable=False, va_size=64 * GiB, capacity=None):
        self.snap = snap
        self.capacity = capacity       # bytes the allocator may reserve (device memory minus context)
        self.index = index
        self.trace = []
        self.cats = []                 # category of each trace entry's allocation (alloc only)
        self.segs = []
        self.next_addr = base
        self.free_ranges = {}          # size -> [addr] of released segments (cudaMalloc reuses them)
        self.expandable = expandable
        self.va_size = va_size
        self.exp_segs = {}
        self.recording = True
        self.start_live = None          # {addr: (req, cat)} when recording starts
        self.by_addr = {}

    # ---------------------------------------------------------------------------------- trace
    def entry(self, action, addr, size, stream=0, frames=None, pool=(0, 0), extra=None, device_free=None,
              forward_frames=None, dt=None, cat=None):
        sn = self.snap
        e = {"action": action}
        if action in sn.skip_actions:       # the allocator never records it (its clock still moves)
            sn.tick(dt if dt is not None else 37)
            return e
        if action == "oom":
            e["device_free"] = device_free
        else:
            e["addr"] = addr
        e["size"] = size
        e["stream"] = stream
        t = sn.tick(dt if dt is not None else 37)
        extra = dict(extra or {})
        internal = extra.pop("internal_metadata", None)
        pool = (pool[0], pool[1])        # a new tuple object per entry, as pybind11 makes them
        if sn.cpp:
            e["compile_context"] = sn.compile_context
            e["user_metadata"] = sn.user_metadata
            if internal:
                e["internal_metadata"] = internal
            e["time_us"] = t
            e["pool_id"] = pool
        else:
            if sn.v >= (2, 2):
                e["time_us"] = t
            if sn.v >= (2, 8):
                e["compile_context"] = sn.compile_context
            if sn.v >= (2, 10):
                e["user_metadata"] = sn.user_metadata
            if internal:
                e["internal_metadata"] = internal
            if sn.v >= (2, 12):
                e["pool_id"] = pool
        if sn.component is not None:
            # UNVERIFIED key and value form (see COMPONENT_NOTE): the stamp of the thread's
            # component type at the time of the event
            e["component_type"] = sn.component
        if frames is not None:
            e["frames"] = frames
        if forward_frames:
            e["forward_frames"] = forward_frames
        if extra:
            e.update(extra)
        self.trace.append(e)
        self.cats.append(cat)
        return e

    def start_recording(self):
        self.recording = True
        self.start_live = {b.addr: (b.req, b.cat) for s in self.segs for b in s.blocks
                           if b.state in LIVE_STATES}

    # ----------------------------------------------------------------------------- segments
    def _new_va(self, size):
        lst = self.free_ranges.get(size)
        if lst:
            return lst.pop()
        a = self.next_addr
        self.next_addr += size + 2 * MiB    # a hole between segments, like real address maps
        return a

    def _fits(self, size):
        return self.capacity is None or self.reserved_bytes() + size <= self.capacity

    def _oom(self, rsize, stream, frames):
        """cudaMalloc failed even after freeing the cache: record 'oom' and raise."""
        if self.recording:
            self.entry("oom", None, rsize, stream, frames, device_free=self.capacity - self.reserved_bytes())
        raise OutOfMemory(rsize)

    def _new_segment(self, rsize, small, stream, pool, frames):
        size = segment_size_for(rsize)
        if not self._fits(size):
            # release_cached_blocks(): cudaFree every wholly free segment, then retry
            self.release(frames=frames)
            if not self._fits(size):
                self._oom(rsize, stream, frames)
        seg = Seg(self._new_va(size), small, stream, pool, self.index)
        blk = Blk(seg.addr, size, seg)
        seg.blocks.append(blk)
        seg.frames = frames if self.recording else self.snap.empty
        self.segs.append(seg)
        if self.recording:
            self.entry("segment_alloc", seg.addr, size, stream, frames, pool)
        return seg

    def _exp_segment(self, small, stream, pool):
        key = (small, stream, pool)
        seg = self.exp_segs.get(key)
        if seg is None:
            seg = Seg(self.next_addr, small, stream, pool, self.index, expandable=True)
            self.next_addr += self.va_size
            self.exp_segs[key] = seg
            self.segs.append(seg)
        return seg

    def _map(self, seg, need, frames, rsize):
        """Map granules of an expandable segment so that a free block of `need` bytes exists:
        first an unmapped hole whose neighbours make it large enough, else the end."""
        for attempt in (0, 1):
            i, size = self._map_plan(seg, need)
            if self._fits(size):
                if i is None:
                    end = seg.addr + sum(b.size for b in seg.blocks)
                    seg.blocks.append(Blk(end, size, seg, mapped=False))
                    i = len(seg.blocks) - 1
                self._map_range(seg, i, size, frames)
                return
            if attempt == 0:
                self.release(frames=frames)
        self._oom(rsize, seg.stream, frames)

    def _map_plan(self, seg, need):
        gran = SMALL_BUFFER if seg.small else LARGE_BUFFER
        bl = seg.blocks
        for i, g in enumerate(bl):
            if g.mapped:
                continue
            prev_free = bl[i - 1].size if i > 0 and bl[i - 1].state == "inactive" else 0
            next_free = bl[i + 1].size if i + 1 < len(bl) and bl[i + 1].state == "inactive" else 0
            if prev_free + g.size >= need:
                return i, min(g.size, -(-(need - prev_free) // gran) * gran)
            if prev_free + g.size + next_free >= need:
                return i, g.size
        tail = bl[-1].size if bl and bl[-1].state == "inactive" else 0
        return None, -(-(need - tail) // gran) * gran

    def _map_range(self, seg, i, size, frames):
        g = seg.blocks[i]
        addr = g.addr
        if size < g.size:
            seg.blocks.insert(i + 1, Blk(addr + size, g.size - size, seg, mapped=False))
            g.size = size
        g.mapped = True
        g.state = "inactive"
        if addr == seg.addr and seg.frames is None:
            seg.frames = frames if self.recording else self.snap.empty
        if self.recording:
            self.entry("segment_map", addr, size, seg.stream, frames, seg.pool)
        self._merge(g)

    def _find(self, rsize, small, stream, pool):
        best = None
        for seg in self.segs:
            if seg.small != small or seg.stream != stream or seg.pool != pool:
                continue
            for b in seg.blocks:
                if b.state == "inactive" and b.size >= rsize:  # (unmapped holes have state 'unmapped')
                    if best is None or (b.size, b.addr) < (best.size, best.addr):
                        best = b
        return best

    # ------------------------------------------------------------------------------- alloc
    def alloc(self, size, stack, cat="unknown", stream=0, pool=(0, 0), extra=None, forward_frames=None,
              frames=None, dt=None):
        sn = self.snap
        if self.recording:
            frames = frames if frames is not None else sn.tb(stack)
        else:
            frames = sn.empty
        rsize = round_size(size)
        small = rsize <= SMALL_SIZE
        blk = self._find(rsize, small, stream, pool)
        if blk is None:
            if self.expandable:
                seg = self._exp_segment(small, stream, pool)
                self._map(seg, rsize, frames, rsize)
            else:
                self._new_segment(rsize, small, stream, pool, frames)
            blk = self._find(rsize, small, stream, pool)
        seg = blk.seg
        rem = blk.size - rsize
        if (small and rem >= 512) or (not small and rem > SMALL_SIZE):
            new = Blk(blk.addr, rsize, seg)
            seg.blocks.insert(seg.blocks.index(blk), new)
            blk.addr += rsize
            blk.size = rem
            blk = new
        blk.state = "active_allocated"
        blk.req = size
        blk.frames = frames
        blk.cat = cat
        blk.component = sn.component
        if sn.v < (2, 1):
            # 2.0 keeps a history only while recording; newest first, one older entry kept
            if self.recording:
                blk.history = [{"addr": blk.addr, "real_size": size, "frames": frames}] + blk.history[:1]
            else:
                blk.history = []
        self.by_addr[blk.addr] = blk
        if self.recording:
            self.entry("alloc", blk.addr, size, stream, frames, pool, extra=extra,
                       forward_frames=forward_frames, dt=dt, cat=cat)
        return blk.addr

    # -------------------------------------------------------------------------------- free
    def _free_frames(self, blk, stack):
        if self.snap.context == "alloc" or self.snap.v < (2, 1):
            return blk.frames if blk.frames is not self.snap.empty else None
        return self.snap.tb(stack or ())

    def free(self, addr, stack=None, pending=False, legacy=False, extra=None, dt=None):
        blk = self.by_addr[addr]
        assert blk.state == "active_allocated", hex(addr)
        pool = blk.seg.pool
        if self.recording:
            fr = self._free_frames(blk, stack)
            blk.free_frames = fr
            if legacy:
                self.entry("free", addr, blk.req, blk.seg.stream, fr, pool, extra=extra, dt=dt)
            else:
                self.entry("free_requested", addr, blk.req, blk.seg.stream, fr, pool, extra=extra, dt=dt)
                if not pending:
                    self.entry("free_completed", addr, blk.req, blk.seg.stream, fr, pool, dt=3)
        if pending:
            blk.state = "active_pending_free"
            return
        self._release_block(blk)

    def complete(self, addr):
        blk = self.by_addr[addr]
        assert blk.state == "active_pending_free"
        if self.recording:
            self.entry("free_completed", addr, blk.req, blk.seg.stream, blk.free_frames, blk.seg.pool)
        self._release_block(blk)

    def _release_block(self, blk):
        del self.by_addr[blk.addr]
        blk.state = "inactive"
        blk.frames = None
        blk.component = None
        self._merge(blk)

    def tag(self, addr, component):
        """component tracking's `_tag_block(ptr, type)`: re-tag a live block (no trace entry)."""
        self.by_addr[addr].component = component

    def _merge(self, blk):
        seg = blk.seg
        i = seg.blocks.index(blk)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == "inactive":
            nb = seg.blocks.pop(i + 1)
            blk.size += nb.size
            blk.history = blk.history + nb.history
        if i > 0 and seg.blocks[i - 1].state == "inactive":
            pb = seg.blocks.pop(i - 1)
            blk.addr = pb.addr
            blk.size += pb.size
            blk.history = blk.history + pb.history

    # ----------------------------------------------------------------------- cache release
    def release(self, stack=None, frames=None):
        """torch.cuda.empty_cache() / the retry before an OOM: cudaFree wholly free segments,
        unmap the free tail of expandable segments."""
        if self.recording and frames is None:
            frames = self.snap.tb(stack or ())
        for seg in list(self.segs):
            if seg.expandable:
                # unmap every whole granule inside a free block (release_expandable_segment)
                gran = SMALL_BUFFER if seg.small else LARGE_BUFFER
                for b in list(seg.blocks):
                    if b.state != "inactive":
                        continue
                    off = b.addr - seg.addr
                    lo = seg.addr + -(-off // gran) * gran
                    hi = seg.addr + (off + b.size) // gran * gran
                    if hi - lo < gran:
                        continue
                    if self.recording:
                        self.entry("segment_unmap", lo, hi - lo, seg.stream, frames, seg.pool)
                    i = seg.blocks.index(b)
                    parts = []
                    if lo > b.addr:
                        parts.append(Blk(b.addr, lo - b.addr, seg, req=b.req))
                    parts.append(Blk(lo, hi - lo, seg, mapped=False))
                    if b.addr + b.size > hi:
                        parts.append(Blk(hi, b.addr + b.size - hi, seg, req=b.req))
                    seg.blocks[i:i + 1] = parts
                # merge neighbouring holes, drop the hole at the end
                merged = []
                for b in seg.blocks:
                    if merged and not b.mapped and not merged[-1].mapped:
                        merged[-1].size += b.size
                    else:
                        merged.append(b)
                while merged and not merged[-1].mapped:
                    merged.pop()
                seg.blocks[:] = merged
                if not seg.blocks or not seg.blocks[0].mapped:
                    seg.frames = None
                continue
            if len(seg.blocks) == 1 and seg.blocks[0].state == "inactive":
                if self.recording:
                    fr = frames if self.snap.context == "all" and self.snap.v >= (2, 1) else (
                        seg.frames if seg.frames is not self.snap.empty else None)
                    self.entry("segment_free", seg.addr, seg.total, seg.stream, fr, seg.pool)
                self.segs.remove(seg)
                self.free_ranges.setdefault(seg.total, []).append(seg.addr)
        return frames

    def marker(self):
        """A 'snapshot' entry: addr 0, size = active bytes, no frames."""
        active = sum(b.size for s in self.segs for b in s.blocks if b.state in LIVE_STATES)
        self.entry("snapshot", 0, active)

    # ------------------------------------------------------------------------------ output
    def live_bytes(self):
        return sum(b.req for b in self.by_addr.values())

    def reserved_bytes(self):
        return sum(s.total for s in self.segs)

    def segment_dicts(self):
        sn = self.snap
        out = []
        ranges = []
        for seg in self.segs:
            cur = []
            for b in seg.blocks:
                if b.mapped:
                    cur.append(b)
                elif cur:
                    ranges.append((seg, cur))
                    cur = []
            if cur:
                ranges.append((seg, cur))
        for seg, rblocks in ranges:
            blocks = []
            for b in rblocks:
                if sn.v < (2, 1):
                    bd = {"size": b.size, "requested_size": b.req, "state": b.state}
                    if b.history:
                        bd["history"] = b.history
                else:
                    bd = {"address": b.addr, "size": b.size, "requested_size": b.req, "state": b.state}
                    if b.component is not None and b.state != "inactive":
                        bd["component_type"] = b.component       # UNVERIFIED (COMPONENT_NOTE)
                    bd["frames"] = b.frames if (b.state != "inactive" and b.frames is not None) else sn.empty
                blocks.append(bd)
            head_frames = seg.frames if rblocks[0].addr == seg.addr else None
            d = {
                "device": seg.device,
                "address": rblocks[0].addr,
                "total_size": sum(b.size for b in rblocks),
                "allocated_size": sum(b.size for b in rblocks if b.state == "active_allocated"),
                "active_size": sum(b.size for b in rblocks if b.state != "inactive"),
                "requested_size": sum(b.req for b in rblocks if b.state != "inactive"),
                "stream": seg.stream,
                "segment_type": "small" if seg.small else "large",
            }
            if sn.v >= (2, 1):
                d["segment_pool_id"] = (seg.pool[0], seg.pool[1])
                d["is_expandable"] = seg.expandable
                if head_frames is None or head_frames is sn.empty:
                    d["frames"] = sn.empty
                    d["blocks"] = blocks
                else:
                    d["blocks"] = blocks
                    d["frames"] = head_frames
            else:
                d["blocks"] = blocks
            out.append(d)
        return out

    def truth_at(self, index):
        """Live bytes by the generator's category after trace entry `index` (-1: start)."""
        if self.start_live is not None:
            live = dict(self.start_live)
        elif self.trace:
            live = {}
        else:   # nothing recorded (state only): the live blocks now
            live = {b.addr: (b.req, b.cat) for s in self.segs for b in s.blocks if b.state in LIVE_STATES}
        for i, e in enumerate(self.trace[: index + 1]):
            if e["action"] == "alloc":
                live[e["addr"]] = (e["size"], self.cats[i])
            elif e["action"] in FREE_ACTIONS:
                live.pop(e["addr"], None)
        out = Counter()
        for req, cat in live.values():
            out[cat or "unknown"] += req
        return dict(sorted(out.items()))


# =============================================================================================
# Stack helpers
# =============================================================================================
def call(*frames):
    """Frames innermost first; tuples (filename, line, name) or lists of them are flattened."""
    out = []
    for f in frames:
        if isinstance(f, tuple) and len(f) == 3 and isinstance(f[0], str) and isinstance(f[1], int):
            out.append(f)
        else:
            out.extend(call(*f))
    return tuple(out)


def module_call(mp, line_call=1747, line_wrapped=1736):
    """The two torch.nn.Module.__call__ frames between a caller and a module's forward."""
    return [(mp + "torch/nn/modules/module.py", line_call, "_call_impl"),
            (mp + "torch/nn/modules/module.py", line_wrapped, "_wrapped_call_impl")]


def fmt_stack(frames):
    """forward_frames strings, as anomaly mode stores traceback.format_stack() lines."""
    return ['  File "%s", line %d, in %s\n    %s\n' % (f, l, n, src) for (f, l, n, src) in frames]


# =============================================================================================
# Fixture 1: oom.pickle
# =============================================================================================
OOM_CAPACITY = 11_500_000_000


def fx_oom(capacity=OOM_CAPACITY, seq1=1280, seq2=2048, layers=4):
    sn = Snap((2, 5), t0=1_716_912_000_000_000, context="all")
    d = sn.device(0, base=0x7F2A_4000_0000, capacity=capacity)
    SP = "/opt/conda/envs/ft/lib/python3.11/site-packages/"
    TR = "/workspace/qlora-llama/train_qlora.py"
    LL = SP + "transformers/models/llama/modeling_llama.py"
    MU = SP + "transformers/modeling_utils.py"
    BM = SP + "bitsandbytes/nn/modules.py"
    BF = SP + "bitsandbytes/functional.py"
    BA = SP + "bitsandbytes/autograd/_functions.py"
    BO = SP + "bitsandbytes/optim/optimizer.py"
    PL = SP + "peft/tuners/lora/layer.py"
    AC = SP + "accelerate/utils/modeling.py"
    M = module_call(SP)
    hidden, inter, vocab, r, batch = 4096, 11008, 32000, 16, 4
    shapes = [("q_proj", hidden, hidden), ("k_proj", hidden, hidden), ("v_proj", hidden, hidden),
              ("o_proj", hidden, hidden), ("gate_proj", inter, hidden), ("up_proj", inter, hidden),
              ("down_proj", hidden, inter)]

    # ---- model load, recorded: bf16 embeddings/norms, 4-bit linears via a bf16 copy on the GPU
    load_tail = [(MU, 4091, "_load_pretrained_model"), (MU, 3838, "from_pretrained"),
                 (SP + "transformers/models/auto/auto_factory.py", 564, "from_pretrained"),
                 (TR, 47, "load_model"), (TR, 112, "main"), (TR, 131, "<module>")]
    plain = [(AC, 329, "set_module_tensor_to_device"), (MU, 902, "_load_state_dict_into_meta_model")] + load_tail
    q_ctx = [(BM, 331, "to"), (SP + "transformers/integrations/bitsandbytes.py", 97, "set_module_quantized_tensor_to_device"),
             (MU, 893, "_load_state_dict_into_meta_model")] + load_tail
    d.alloc(vocab * hidden * 2, plain, "weights")
    for layer in range(layers):
        for _, o, i in shapes:
            n = o * i
            tmp = d.alloc(n * 2, call((BM, 296, "_quantize"), q_ctx), "quantization")
            d.alloc(n // 2, call((BF, 1234, "quantize_4bit"), (BM, 297, "_quantize"), q_ctx), "quantization")
            d.alloc(n // 64 * 4, call((BF, 1229, "quantize_4bit"), (BM, 297, "_quantize"), q_ctx), "quantization")
            d.free(tmp, call((BM, 303, "_quantize"), q_ctx))
        d.alloc(hidden * 2, plain, "weights")
        d.alloc(hidden * 2, plain, "weights")
    d.alloc(hidden * 2, plain, "weights")
    d.alloc(vocab * hidden * 2, plain, "weights")
    # LoRA adapters on q_proj and v_proj (r=16, fp32)
    lora_tail = [(SP + "torch/nn/modules/module.py", 1340, "convert"), (PL, 217, "_move_adapter_to_device_of_base_layer"),
                 (PL, 145, "update_layer"), (SP + "peft/tuners/lora/bnb.py", 298, "__init__"),
                 (SP + "peft/tuners/lora/model.py", 352, "_create_new_module"), (SP + "peft/tuners/tuners_utils.py", 496, "inject_adapter"),
                 (SP + "peft/mapping.py", 193, "get_peft_model"), (TR, 61, "load_model"), (TR, 112, "main"), (TR, 131, "<module>")]
    lora = []
    for layer in range(layers):
        for _ in range(2):
            lora.append((d.alloc(r * hidden * 4, lora_tail, "weights"), r * hidden * 4))
            lora.append((d.alloc(hidden * r * 4, lora_tail, "weights"), hidden * r * 4))

    trainer = [(SP + "transformers/trainer.py", 3633, "compute_loss"), (SP + "transformers/trainer.py", 3579, "training_step"),
               (SP + "transformers/trainer.py", 2481, "_inner_training_loop"), (SP + "transformers/trainer.py", 2122, "train"),
               (TR, 124, "main"), (TR, 131, "<module>")]
    data = [(SP + "transformers/trainer.py", 3540, "_prepare_input"), (SP + "transformers/trainer.py", 3560, "_prepare_inputs"),
            (SP + "transformers/trainer.py", 3575, "training_step")] + trainer[2:]
    peft = [(SP + "peft/tuners/tuners_utils.py", 197, "forward"), M, (SP + "peft/peft_model.py", 1644, "forward"), M] + trainer
    causal = [(LL, 1190, "forward"), M] + peft          # LlamaForCausalLM.forward -> self.model(...)
    model = [(LL, 945, "forward"), M] + causal          # LlamaModel.forward -> decoder_layer(...)

    def forward(seq):
        tok = batch * seq
        inputs = [d.alloc(tok * 8, data, "inputs") for _ in range(3)]
        h = d.alloc(tok * hidden * 2, call((SP + "torch/nn/functional.py", 2551, "embedding"), (SP + "torch/nn/modules/sparse.py", 190, "forward"), M, (LL, 884, "forward"), M, causal), "activations")
        per_layer = [[h]]

        def rmsnorm(acts, ctx):
            ctx = [M] + ctx
            acts.append(d.alloc(tok * hidden * 4, call((LL, 73, "forward"), ctx), "activations"))
            sq = d.alloc(tok * hidden * 4, call((LL, 74, "forward"), ctx), "temporary")
            acts.append(d.alloc(tok * 4, call((LL, 74, "forward"), ctx), "activations"))
            d.free(sq, call((LL, 74, "forward"), ctx))
            acts.append(d.alloc(tok * hidden * 2, call((LL, 76, "forward"), ctx), "activations"))

        def linear4bit(acts, ctx, o, i, lora_on=False):
            lin = [(BM, 484, "forward"), M] + ([(PL, 557, "forward"), M] if lora_on else []) + ctx
            mm = [(BA, 577, "forward"), (SP + "torch/autograd/function.py", 575, "apply"), (BA, 642, "matmul_4bit")] + lin
            deq = d.alloc(o * i * 2, call((BF, 1343, "dequantize_4bit"), mm), "quantization")
            acts.append(d.alloc(tok * o * 2, mm, "activations"))
            d.free(deq, mm)
            if lora_on:
                lctx = [(PL, 569, "forward"), M] + ctx
                acts.append(d.alloc(tok * r * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, lctx), "activations"))
                b = d.alloc(tok * o * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, lctx), "temporary")
                acts.append(d.alloc(tok * o * 2, lctx, "activations"))
                d.free(b, lctx)

        for layer in range(layers):
            acts = []
            per_layer.append(acts)
            rmsnorm(acts, [(LL, 713, "forward"), M] + model)
            attn = [(LL, 720, "forward"), M] + model
            for j, (name, o, i) in enumerate(shapes[:3]):
                linear4bit(acts, [(LL, 603 + j, "forward"), M] + attn, o, i, lora_on=name in ("q_proj", "v_proj"))
            rot = [(LL, 617, "forward"), M] + attn
            acts.append(d.alloc(tok * hidden * 2, call((LL, 231, "apply_rotary_pos_emb"), rot), "activations"))
            acts.append(d.alloc(tok * hidden * 2, call((LL, 232, "apply_rotary_pos_emb"), rot), "activations"))
            sdpa = [(SP + "torch/nn/functional.py", 5560, "scaled_dot_product_attention"), (LL, 641, "forward"), M] + attn
            acts.append(d.alloc(tok * hidden * 2, sdpa, "activations"))
            acts.append(d.alloc(batch * 32 * seq * 4, sdpa, "activations"))
            linear4bit(acts, [(LL, 655, "forward"), M] + attn, hidden, hidden)
            acts.append(d.alloc(tok * hidden * 2, call((LL, 721, "forward"), M, model), "activations"))
            rmsnorm(acts, [(LL, 734, "forward"), M] + model)
            mlp = [(LL, 316, "forward"), M, (LL, 735, "forward"), M] + model
            linear4bit(acts, mlp, inter, hidden)
            acts.append(d.alloc(tok * inter * 2, call((SP + "torch/nn/functional.py", 2380, "silu"), (SP + "transformers/activations.py", 56, "forward"), M, mlp), "activations"))
            linear4bit(acts, mlp, inter, hidden)
            acts.append(d.alloc(tok * inter * 2, mlp, "activations"))
            linear4bit(acts, mlp, hidden, inter)
            acts.append(d.alloc(tok * hidden * 2, call((LL, 736, "forward"), M, model), "activations"))
        final = []
        per_layer.append(final)
        rmsnorm(final, [(LL, 977, "forward"), M] + causal)
        head = [(SP + "torch/nn/modules/linear.py", 125, "forward"), M, (LL, 1199, "forward"), M] + peft
        logits = d.alloc(tok * vocab * 2, head, "activations")
        logits32 = d.alloc(tok * vocab * 4, call((LL, 1204, "forward"), M, peft), "activations")
        ce = [(SP + "torch/nn/functional.py", 3479, "cross_entropy"), (SP + "torch/nn/modules/loss.py", 1295, "forward"), M, (LL, 1214, "forward"), M] + peft
        lsm = d.alloc(tok * vocab * 4, ce, "activations")
        loss = d.alloc(4, ce, "activations")
        return tok, inputs, per_layer, logits, logits32, lsm, loss

    def backward(state):
        tok, inputs, per_layer, logits, logits32, lsm, loss = state
        # autograd thread (stacks='python'): no Python frames, except inside the bitsandbytes
        # custom autograd Function, whose backward is Python code
        g = d.alloc(tok * vocab * 4, (), "autograd")
        d.free(lsm, ())
        gl = d.alloc(tok * vocab * 2, (), "autograd")
        d.free(g, ())
        d.free(logits32, ())
        d.free(logits, ())
        bwd_py = [(BA, 594, "backward"), (SP + "torch/autograd/function.py", 307, "apply")]
        grads = []
        for acts in reversed(per_layer[1:]):
            for name, o, i in (reversed(shapes) if acts is not per_layer[-1] else ()):
                deq = d.alloc(o * i * 2, call((BF, 1343, "dequantize_4bit"), bwd_py), "quantization")
                gi = d.alloc(tok * i * 2, bwd_py, "autograd")
                d.free(deq, bwd_py)
                d.free(gl, ())
                gl = gi
                if name in ("q_proj", "v_proj") and len(grads) < len(lora):
                    grads.append(d.alloc(lora[len(grads)][1], (), "gradients"))
                    grads.append(d.alloc(lora[len(grads)][1], (), "gradients"))
            for a in reversed(acts):
                d.free(a, ())
        for a in per_layer[0]:
            d.free(a, ())
        d.free(gl, ())
        d.free(loss, call((SP + "accelerate/accelerator.py", 2248, "backward"), (SP + "transformers/trainer.py", 3612, "training_step"), trainer[2:]))
        return inputs, grads

    # ---- step 1: a batch of 1536 tokens per sequence: forward, backward, 8-bit AdamW, zero_grad
    sn.tick(2_500_000)
    st = forward(seq1)
    inputs, grads = backward(st)
    opt = [(BO, 287, "step"), (SP + "torch/optim/optimizer.py", 493, "wrapper"), (SP + "accelerate/optimizer.py", 171, "step"),
           (SP + "transformers/trainer.py", 2531, "_inner_training_loop"), (SP + "transformers/trainer.py", 2122, "train"), (TR, 124, "main"), (TR, 131, "<module>")]
    for p, n in lora:
        for line in (470, 471):
            d.alloc(n // 4, call((BO, 332, "get_state_buffer"), (BO, line, "init_state"), opt), "optimizer")
        d.alloc((n // 4 + 255) // 256 * 4, call((BO, 478, "init_state"), opt), "optimizer")
        d.alloc((n // 4 + 255) // 256 * 4, call((BO, 479, "init_state"), opt), "optimizer")
    zg = [(SP + "torch/optim/optimizer.py", 975, "zero_grad"), (SP + "transformers/trainer.py", 2540, "_inner_training_loop"),
          (SP + "transformers/trainer.py", 2122, "train"), (TR, 124, "main"), (TR, 131, "<module>")]
    for g in grads:
        d.free(g, zg)
    for x in inputs:
        d.free(x, call((SP + "transformers/trainer.py", 2478, "_inner_training_loop"), trainer[3:]))
    # ---- step 2: a longer batch (2048 tokens per sequence) -> OOM at logits.float()
    sn.tick(900_000)
    try:
        backward(forward(seq2))
    except OutOfMemory:
        pass
    else:
        raise AssertionError("oom.pickle: the second step did not run out of memory")
    info = {
        "what": "QLoRA fine-tune (Llama-style, %d layers, 4-bit weights loaded in the trace via a bf16 "
                "copy, LoRA q/v, 8-bit AdamW): one full step at sequence length %d, then a longer batch "
                "(%d) OOMs at logits.float() (the allocator first cudaFrees its wholly free cached "
                "segments: segment_free entries right before the oom, sharing its frames); the cached "
                "blocks of the shorter step were split by the longer tensors, so reserved-but-unallocated "
                "memory exceeds the request; expandable_segments off" % (layers, seq1, seq2),
        "layout": "torch 2.5: time_us, allocator_settings, external_annotations (empty); stacks='python', context='all'",
        "expect": {"oom_hint": "expandable_segments",
                   "oom_note": "fragmentation_bytes (reserved - allocated at the OOM) exceeds the request: "
                               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is the first thing to try"},
    }
    return sn, info


# =============================================================================================
# Fixture 2: expandable.pickle
# =============================================================================================
EXP_CAPACITY = 24_700_000_000


def fx_expandable(capacity=EXP_CAPACITY, big_batch=80):
    sn = Snap((2, 6), t0=1_726_000_000_000_000, context="all", expandable=True,
              alloc_conf="expandable_segments:True")
    d = sn.device(0, base=0x7F80_0000_0000, expandable=True, capacity=capacity)
    SP = "/home/ml/.venv/lib/python3.12/site-packages/"
    TR = "/home/ml/gpt/train_gpt.py"
    MD = "/home/ml/gpt/model.py"
    M = module_call(SP)
    main = [(TR, 210, "main"), (TR, 240, "<module>")]
    layers, T, C, V = 6, 1024, 768, 50304
    # weights (before recording: model.to('cuda') happened first)
    d.recording = False
    params = []
    for _ in range(layers):
        for n in (3 * C * C, 3 * C, C * C, C, 4 * C * C, 4 * C, 4 * C * C, C, C, C, C, C):
            params.append((d.alloc(n * 4, (), "weights"), n * 4))
    params.append((d.alloc(V * C * 4, (), "weights"), V * C * 4))
    d.start_recording()
    opt_state = []
    live = []            # allocations of the current batch, freed on an OOM

    def A(size, stack, cat):
        a = d.alloc(size, stack, cat)
        live.append(a)
        return a

    def F(a, stack):
        live.remove(a)
        d.free(a, stack)

    def step(B):
        tok = B * T
        fwd = [(TR, 172, "train_step")] + main
        x = A(tok * 8, call((TR, 166, "train_step"), main), "inputs")
        y = A(tok * 8, call((TR, 167, "train_step"), main), "inputs")
        sn.annotate("forward", "START")
        acts = []
        gpt = [(MD, 188, "forward"), M] + fwd
        lin = (SP + "torch/nn/modules/linear.py", 125, "forward")
        acts.append(A(tok * C * 4, call((SP + "torch/nn/functional.py", 2551, "embedding"), (SP + "torch/nn/modules/sparse.py", 190, "forward"), M, (MD, 181, "forward"), M, fwd), "activations"))
        for layer in range(layers):
            blk = [(MD, 105, "forward"), M] + gpt
            ln = [(SP + "torch/nn/functional.py", 2910, "layer_norm"), (SP + "torch/nn/modules/normalization.py", 217, "forward"), M] + blk
            att = [(MD, 64, "forward"), M] + blk
            sdpa = [(SP + "torch/nn/functional.py", 5560, "scaled_dot_product_attention"), (MD, 70, "forward"), M] + blk
            mlp = [(MD, 88, "forward"), M, (MD, 106, "forward"), M] + gpt
            acts.append(A(tok * C * 4, call(ln), "activations"))
            acts.append(A(tok * 3 * C * 4, call(lin, M, att), "activations"))
            acts.append(A(tok * C * 4, call(sdpa), "activations"))
            acts.append(A(B * 12 * T * 4, call(sdpa), "activations"))
            acts.append(A(tok * C * 4, call(lin, M, (MD, 72, "forward"), M, blk), "activations"))
            acts.append(A(tok * C * 4, call(blk), "activations"))
            acts.append(A(tok * C * 4, call(ln), "activations"))
            acts.append(A(tok * 4 * C * 4, call(lin, M, mlp), "activations"))
            acts.append(A(tok * 4 * C * 4, call((SP + "torch/nn/modules/activation.py", 734, "forward"), M, (MD, 89, "forward"), M, gpt), "activations"))
            acts.append(A(tok * C * 4, call(lin, M, (MD, 90, "forward"), M, gpt), "activations"))
            acts.append(A(tok * C * 4, call((MD, 106, "forward"), M, gpt), "activations"))
        logits = A(tok * V * 4, call(lin, M, (MD, 192, "forward"), M, fwd), "activations")
        loss_ctx = [(SP + "torch/nn/functional.py", 3479, "cross_entropy"), (MD, 193, "forward"), M] + fwd
        lsm = A(tok * V * 4, call(loss_ctx), "activations")
        loss = A(4, call(loss_ctx), "activations")
        sn.annotate("forward", "END")
        sn.annotate("backward", "START")
        bwd = call((SP + "torch/autograd/graph.py", 825, "_engine_run_backward"), (SP + "torch/autograd/__init__.py", 347, "backward"),
                   (SP + "torch/_tensor.py", 581, "backward"), (TR, 176, "train_step"), main)
        g1 = A(tok * V * 4, (), "autograd")   # autograd thread: no Python frames
        F(lsm, ())
        g2 = A(tok * V * 4, (), "autograd")
        F(g1, ())
        F(logits, ())
        grads = []
        for a in reversed(acts):
            F(a, ())
        for p, n in params:
            grads.append(A(n, (), "gradients"))
        F(g2, ())
        F(loss, bwd)
        sn.annotate("backward", "END")
        sn.annotate("Optimizer.step#AdamW.step", "START")
        opt = [(SP + "torch/optim/optimizer.py", 493, "wrapper"), (TR, 181, "train_step")] + main
        if not opt_state:
            for p, n in params:
                opt_state.append(d.alloc(n, call((SP + "torch/optim/adamw.py", 183, "_init_group"), (SP + "torch/optim/adamw.py", 209, "step"), opt), "optimizer"))
                opt_state.append(d.alloc(n, call((SP + "torch/optim/adamw.py", 187, "_init_group"), (SP + "torch/optim/adamw.py", 209, "step"), opt), "optimizer"))
        foreach = [(SP + "torch/optim/adamw.py", 561, "_multi_tensor_adamw"), (SP + "torch/optim/adamw.py", 760, "adamw"), (SP + "torch/optim/adamw.py", 225, "step")] + opt
        tmp = [A(n, call(foreach), "temporary") for p, n in params[:8]]
        for t in tmp:
            F(t, call([(SP + "torch/optim/adamw.py", 575, "_multi_tensor_adamw")] + foreach[1:]))
        sn.annotate("Optimizer.step#AdamW.step", "END")
        sn.annotate("Optimizer.zero_grad#AdamW.zero_grad", "START")
        for g in grads:
            F(g, call((SP + "torch/optim/optimizer.py", 975, "zero_grad"), (SP + "torch/_compile.py", 32, "inner"), (TR, 183, "train_step"), main))
        sn.annotate("Optimizer.zero_grad#AdamW.zero_grad", "END")
        F(x, call((TR, 166, "train_step"), main))
        F(y, call((TR, 167, "train_step"), main))

    step(16)
    sn.tick(400_000)
    step(16)
    sn.tick(400_000)
    d.release(call((SP + "torch/cuda/memory.py", 192, "empty_cache"), (TR, 226, "main"), (TR, 240, "<module>")))
    sn.tick(200_000)
    # a larger batch is tried: CUDA out of memory in its forward pass
    try:
        step(big_batch)
    except OutOfMemory:
        pass
    else:
        raise AssertionError("expandable.pickle: the big batch did not run out of memory")
    # the script catches the OOM, drops the batch and empties the cache
    exc = call((TR, 232, "main"), (TR, 240, "<module>"))
    for a in reversed(list(live)):
        F(a, exc)
    d.release(call((SP + "torch/cuda/memory.py", 192, "empty_cache"), (TR, 233, "main"), (TR, 240, "<module>")))
    info = {
        "what": "GPT-2-small training with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: "
                "segment_map as memory grows, segment_unmap of free pages on empty_cache() (which "
                "splits the mapped range into several segments), an OOM with a bigger batch "
                "(expandable segments already on, little reserved-but-unallocated memory: the hint is "
                "activations / micro-batch), then recovery; weights allocated before recording",
        "layout": "torch 2.6: time_us, allocator_settings (expandable_segments True), external_annotations; stacks='python', context='all'",
        "expect": {"oom_hint": "activations",
                   "oom_note": "expandable_segments is already on and fragmentation is small: reduce the micro-batch or checkpoint activations"},
    }
    return sn, info


# =============================================================================================
# Fixture 3: qlora_4bit.pickle
# =============================================================================================
CPP_MALLOC = [
    ("??", 0, "torch::unwind::unwind()"),
    ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
    ("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    ("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
    ("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)"),
    ("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
]
CPP_FREE = [
    ("??", 0, "torch::unwind::unwind()"),
    ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
    ("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    ("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*)"),
    ("", 0, "c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void*)"),
    ("??", 0, "c10::StorageImpl::~StorageImpl()"),
    ("??", 0, "c10::TensorImpl::~TensorImpl()"),
]
CPP_EMPTY = [("??", 0, "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)"),
             ("??", 0, "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)")]
CPP_PY = [("/usr/local/src/conda/python-3.11.9/Objects/methodobject.c", 543, "cfunction_call"),
          ("/usr/local/src/conda/python-3.11.9/Objects/call.c", 215, "_PyObject_MakeTpCall")]
CPP_ENGINE = [("??", 0, "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
              ("??", 0, "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
              ("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
              ("??", 0, "torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
              ("??", 0, "torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
              ("/opt/conda/conda-bld/gcc-compiler_1654084175708/work/gcc/libstdc++-v3/src/c++11/thread.cc", 82, "execute_native_thread_routine"),
              ("??", 0, "start_thread"), ("??", 0, "clone")]


def fx_qlora_4bit():
    sn = Snap((2, 7), t0=1_733_100_000_000_000, context="all")
    d = sn.device(0, base=0x7FC1_2000_0000)
    SP = "/usr/local/lib/python3.11/dist-packages/"
    NB = "/content/qlora_colab.py"
    LL = SP + "transformers/models/llama/modeling_llama.py"
    MU = SP + "transformers/modeling_utils.py"
    BM = SP + "bitsandbytes/nn/modules.py"
    BF = SP + "bitsandbytes/functional.py"
    BA = SP + "bitsandbytes/autograd/_functions.py"
    BO = SP + "bitsandbytes/optim/optimizer.py"
    PL = SP + "peft/tuners/lora/layer.py"
    PB = SP + "peft/tuners/lora/bnb.py"
    M = module_call(SP, 1762, 1751)
    hidden, inter, vocab, layers, r = 2048, 5632, 32000, 5, 16
    batch, seq = 2, 512
    tok = batch * seq
    shapes = [("q_proj", hidden, hidden), ("k_proj", 256, hidden), ("v_proj", 256, hidden), ("o_proj", hidden, hidden),
              ("gate_proj", inter, hidden), ("up_proj", inter, hidden), ("down_proj", hidden, inter)]

    def cpp(stack, kind="malloc", op=CPP_EMPTY):
        base = CPP_MALLOC if kind == "malloc" else CPP_FREE
        return call(base, op, CPP_PY, stack)

    # before recording: embeddings, norms, lm_head (bf16) and a rotary cache buffer
    d.recording = False
    pre = {}
    pre["embed"] = d.alloc(vocab * hidden * 2, (), "weights")
    for i in range(layers * 2 + 1):
        pre["norm%d" % i] = d.alloc(hidden * 2, (), "weights")
    pre["lm_head"] = d.alloc(vocab * hidden * 2, (), "weights")
    pre["rope_cache"] = d.alloc(4096 * 64 * 4, (), "temporary")
    pre["scratch"] = d.alloc(8 * MiB, (), "temporary")
    d.start_recording()
    load_tail = [(MU, 4091, "_load_pretrained_model"), (MU, 3838, "from_pretrained"),
                 (SP + "transformers/models/auto/auto_factory.py", 564, "from_pretrained"), (NB, 31, "<module>")]
    q_ctx = [(BM, 318, "cuda"), (BM, 331, "to"), (SP + "transformers/integrations/bitsandbytes.py", 97, "set_module_quantized_tensor_to_device"),
             (MU, 893, "_load_state_dict_into_meta_model")] + load_tail
    # a buffer from before the trace is freed at the start of it (free without alloc)
    d.free(pre.pop("scratch"), cpp(load_tail, "free"))
    q_weights = []
    for layer in range(layers):
        for name, o, i in shapes:
            n = o * i
            w16 = d.alloc(n * 2, cpp([(BM, 296, "_quantize")] + q_ctx, op=CPP_EMPTY), "quantization")
            qz = [(BF, 1234, "quantize_4bit"), (BM, 297, "_quantize")] + q_ctx
            absmax = d.alloc(n // 64 * 4, cpp([(BF, 1229, "quantize_4bit")] + qz[1:]), "quantization")
            packed = d.alloc(n // 2, cpp(qz), "quantization")
            # bnb_4bit_use_double_quant: absmax is itself quantized (QuantState.state2)
            qabs = d.alloc(n // 64, cpp([(BF, 759, "quantize_blockwise"), (BF, 1262, "quantize_4bit")] + qz[1:]), "quantization")
            absmax2 = d.alloc(n // 64 // 256 * 4, cpp([(BF, 762, "quantize_blockwise"), (BF, 1262, "quantize_4bit")] + qz[1:]), "quantization")
            d.free(absmax, cpp([(BF, 1265, "quantize_4bit")] + qz[1:], "free"))
            d.free(w16, cpp([(BM, 303, "_quantize")] + q_ctx, "free"))
            q_weights.append((packed, qabs, absmax2, o, i))
    # LoRA adapters (r=16) on q_proj and v_proj, fp32
    lora_tail = [(PL, 217, "_move_adapter_to_device_of_base_layer"), (PL, 145, "update_layer"), (PB, 298, "__init__"),
                 (SP + "peft/tuners/lora/model.py", 352, "_create_new_module"),
                 (SP + "peft/tuners/tuners_utils.py", 496, "inject_adapter"), (SP + "peft/mapping.py", 193, "get_peft_model"), (NB, 44, "<module>")]
    lora = []
    for layer in range(layers):
        for o in (hidden, 256):
            a = d.alloc(r * hidden * 4, cpp([(SP + "torch/nn/modules/module.py", 1340, "convert")] + lora_tail), "weights")
            b = d.alloc(o * r * 4, cpp([(SP + "torch/nn/modules/module.py", 1340, "convert")] + lora_tail), "weights")
            lora.extend([(a, r * hidden * 4), (b, o * r * 4)])
    sn.tick(1_800_000)

    # one training step
    trainer = [(SP + "transformers/trainer.py", 3633, "compute_loss"), (SP + "transformers/trainer.py", 3579, "training_step"),
               (SP + "transformers/trainer.py", 2481, "_inner_training_loop"), (SP + "transformers/trainer.py", 2122, "train"), (NB, 77, "<module>")]
    ids = d.alloc(tok * 8, cpp([(SP + "transformers/trainer.py", 3540, "_prepare_input")] + trainer[1:]), "inputs")
    labels = d.alloc(tok * 8, cpp([(SP + "transformers/trainer.py", 3540, "_prepare_input")] + trainer[1:]), "inputs")
    peft = [(SP + "peft/tuners/tuners_utils.py", 197, "forward"), M, (SP + "peft/peft_model.py", 1644, "forward"), M] + trainer
    causal = [(LL, 1190, "forward"), M] + peft
    model = [(LL, 945, "forward"), M] + causal
    h = d.alloc(tok * hidden * 2, cpp([(SP + "torch/nn/functional.py", 2551, "embedding"), (SP + "torch/nn/modules/sparse.py", 190, "forward"), M, (LL, 884, "forward"), M] + causal), "activations")
    emb_acts = [h]
    layer_acts = []
    for layer in range(layers):
        acts = []
        layer_acts.append(acts)
        for j, (name, o, i) in enumerate(shapes):
            ctx = [(LL, 603 + j, "forward"), M, (LL, 720, "forward"), M] + model if j < 4 else \
                  [(LL, 316, "forward"), M, (LL, 735, "forward"), M] + model
            lin = [(BM, 484, "forward"), M] + ([(PB, 486, "forward"), M] if name in ("q_proj", "v_proj") else []) + ctx
            mm = [(BA, 577, "forward"), (SP + "torch/autograd/function.py", 575, "apply"), (BA, 642, "matmul_4bit")] + lin
            deq = d.alloc(o * i * 2, cpp([(BF, 1343, "dequantize_4bit")] + mm), "quantization")
            out = d.alloc(tok * o * 2, cpp(mm), "activations")
            d.free(deq, cpp(mm, "free"))
            acts.append(out)
            if name in ("q_proj", "v_proj"):
                lctx = [(PB, 509, "forward"), M] + ctx
                drop = d.alloc(tok * hidden * 2, cpp([(SP + "torch/nn/functional.py", 1425, "dropout"), (SP + "torch/nn/modules/dropout.py", 70, "forward"), M] + lctx), "activations")
                a = d.alloc(tok * r * 4, cpp([(SP + "torch/nn/modules/linear.py", 125, "forward"), M] + lctx), "activations")
                b = d.alloc(tok * o * 4, cpp([(SP + "torch/nn/modules/linear.py", 125, "forward"), M] + lctx), "activations")
                s = d.alloc(tok * o * 2, cpp(lctx), "activations")
                acts.extend([drop, a, b, s])
            if name == "o_proj":
                acts.append(d.alloc(tok * hidden * 2, cpp([(LL, 721, "forward"), M] + model), "activations"))
            if name == "up_proj":
                acts.append(d.alloc(tok * inter * 2, cpp([(LL, 316, "forward"), M, (LL, 735, "forward"), M] + model), "activations"))
        h = d.alloc(tok * hidden * 2, cpp([(LL, 736, "forward"), M] + model), "activations")
        acts.append(h)
    head = [(SP + "torch/nn/modules/linear.py", 125, "forward"), M, (LL, 1199, "forward"), M] + peft
    logits = d.alloc(tok * vocab * 2, cpp(head), "activations")
    logits32 = d.alloc(tok * vocab * 4, cpp([(LL, 1204, "forward"), M] + peft), "activations")
    loss_ctx = [(SP + "torch/nn/functional.py", 3479, "cross_entropy"), (SP + "transformers/loss/loss_utils.py", 36, "fixed_cross_entropy"), (LL, 1210, "forward"), M] + peft
    lsm = d.alloc(tok * vocab * 4, cpp(loss_ctx), "activations")
    loss = d.alloc(4, cpp(loss_ctx), "activations")
    sn.tick(50_000)
    # backward: autograd thread, C++-only stacks except the bitsandbytes custom Function (Python)
    eng = lambda: call(CPP_MALLOC, CPP_EMPTY, CPP_ENGINE)
    eng_free = lambda: call(CPP_FREE, CPP_ENGINE)
    g = d.alloc(tok * vocab * 4, eng(), "autograd")
    d.free(lsm, eng_free())
    g2 = d.alloc(tok * vocab * 2, eng(), "autograd")
    d.free(g, eng_free())
    d.free(logits32, eng_free())
    d.free(logits, eng_free())
    grads = {}
    bwd_py = [(BA, 594, "backward"), (SP + "torch/autograd/function.py", 307, "apply")]
    gl = g2
    for layer in reversed(range(layers)):
        for name, o, i in reversed(shapes):
            deq = d.alloc(o * i * 2, call(CPP_MALLOC, CPP_EMPTY, CPP_PY, [(BF, 1343, "dequantize_4bit")] + bwd_py, CPP_ENGINE), "quantization")
            gi = d.alloc(tok * i * 2, call(CPP_MALLOC, CPP_EMPTY, CPP_PY, bwd_py, CPP_ENGINE), "autograd")
            d.free(deq, call(CPP_FREE, CPP_PY, bwd_py, CPP_ENGINE))
            d.free(gl, eng_free())
            gl = gi
        for _ in range(4):  # LoRA A/B grads of this layer (AccumulateGrad)
            idx = len(grads)
            p, n = lora[layer * 4 + (idx % 4)]
            grads[p] = d.alloc(n, call(CPP_MALLOC, CPP_EMPTY, [("??", 0, "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")], CPP_ENGINE), "gradients")
        # activations of this layer are released
        for a in reversed(layer_acts.pop()):
            d.free(a, eng_free())
    d.free(gl, eng_free())
    for a in emb_acts:
        d.free(a, eng_free())
    d.free(loss, cpp([(SP + "accelerate/accelerator.py", 2248, "backward"), (SP + "transformers/trainer.py", 3612, "training_step")] + trainer[2:], "free"))
    sn.tick(20_000)
    # paged 8-bit AdamW: state1/state2 (uint8) + absmax for each LoRA param (small ones are not paged)
    step = [(BO, 287, "step"), (SP + "torch/optim/optimizer.py", 493, "wrapper"), (SP + "accelerate/optimizer.py", 171, "step"),
            (SP + "transformers/trainer.py", 2531, "_inner_training_loop"), (SP + "transformers/trainer.py", 2122, "train"), (NB, 77, "<module>")]
    for p, n in lora:
        numel = n // 4
        for line in (470, 471):
            d.alloc(numel, cpp([(BO, 332, "get_state_buffer"), (BO, line, "init_state")] + step), "optimizer")
        for line in (478, 479):
            d.alloc((numel + 255) // 256 * 4, cpp([(BO, line, "init_state")] + step), "optimizer")
    for p, n in lora[:6]:
        t = d.alloc(n, cpp([(BF, 1595, "optimizer_update_8bit_blockwise"), (BO, 573, "update_step")] + step), "temporary")
        d.free(t, cpp([(BO, 573, "update_step")] + step, "free"))
    # zero_grad(set_to_none) frees the gradients; inputs dropped
    for p in list(grads):
        d.free(grads.pop(p), cpp([(SP + "torch/optim/optimizer.py", 975, "zero_grad"), (SP + "transformers/trainer.py", 2540, "_inner_training_loop"), (SP + "transformers/trainer.py", 2122, "train"), (NB, 77, "<module>")], "free"))
    d.free(ids, cpp(trainer[1:], "free"))
    d.free(labels, cpp(trainer[1:], "free"))
    info = {
        "what": "bitsandbytes 4-bit load (bf16 copy -> quantize_4bit packed + absmax, double-quantized "
                "absmax via quantize_blockwise) and one QLoRA "
                "step: dequantize_4bit scratch in forward and in MatMul4Bit.backward, LoRA adapters "
                "(update_layer), paged 8-bit AdamW state, gradients, activations; stacks='all' "
                "(C++ frames, autograd-thread stacks without Python frames); embeddings/lm_head "
                "live before the trace began and a pre-trace buffer freed inside it",
        "layout": "torch 2.7: time_us, allocator_settings, external_annotations (empty); stacks='all', context='all'",
        "expect": {},
    }
    return sn, info


# =============================================================================================
# Fixture 4: backward_thread.pickle
# =============================================================================================
def fx_backward_thread():
    sn = Snap((2, 4), t0=1_722_000_000_000_000, context="all")
    d = sn.device(0, base=0x7F55_0000_0000)
    SP = "/usr/lib/python3/dist-packages/"
    TR = "/srv/exp/mlp_train.py"
    M = module_call(SP, 1553, 1562)
    B, D, H, L = 256, 1024, 4096, 4
    d.recording = False
    params = []
    for _ in range(L):
        params.append((d.alloc(H * D * 4, (), "weights"), H * D * 4))
        params.append((d.alloc(H * 4, (), "weights"), H * 4))
        params.append((d.alloc(D * H * 4, (), "weights"), D * H * 4))
        params.append((d.alloc(D * 4, (), "weights"), D * 4))
    d.start_recording()
    main = [(TR, 58, "train"), (TR, 77, "<module>")]
    state = []
    for it in range(2):
        x = d.alloc(B * D * 4, call((TR, 44, "train"), main[1:]), "inputs")
        acts = []
        for layer in range(L):
            blk = [(TR, 21, "forward"), M, (TR, 30, "forward"), M, (TR, 50, "train")] + main[1:]
            acts.append(d.alloc(B * H * 4, call((SP + "torch/nn/modules/linear.py", 116, "forward"), M, blk), "activations"))
            acts.append(d.alloc(B * H * 4, call((SP + "torch/nn/functional.py", 1500, "gelu"), (SP + "torch/nn/modules/activation.py", 696, "forward"), M, blk), "activations"))
            acts.append(d.alloc(B * D * 4, call((SP + "torch/nn/modules/linear.py", 116, "forward"), M, [(TR, 22, "forward")] + blk[1:]), "activations"))
        loss = d.alloc(4, call((SP + "torch/nn/functional.py", 3372, "mse_loss"), (TR, 51, "train"), main[1:]), "activations")
        # backward on the autograd thread: frames == [] for allocations and frees
        go = d.alloc(B * D * 4, (), "autograd")
        grads = []
        for layer in reversed(range(L)):
            gi = d.alloc(B * H * 4, (), "autograd")
            if it == 0:
                grads.append(d.alloc(params[layer * 4 + 2][1], (), "gradients"))
                grads.append(d.alloc(params[layer * 4 + 3][1], (), "gradients"))
            d.free(acts.pop(), ())
            d.free(go, ())
            gh = d.alloc(B * H * 4, (), "autograd")
            d.free(gi, ())
            d.free(acts.pop(), ())
            go = d.alloc(B * D * 4, (), "autograd")
            if it == 0:
                grads.append(d.alloc(params[layer * 4][1], (), "gradients"))
                grads.append(d.alloc(params[layer * 4 + 1][1], (), "gradients"))
            d.free(gh, ())
            d.free(acts.pop(), ())
        d.free(go, ())
        d.free(loss, call((TR, 52, "train"), main[1:]))
        opt = [(SP + "torch/optim/optimizer.py", 391, "wrapper"), (TR, 53, "train")] + main[1:]
        if it == 0:
            for p, n in params:
                state.append(d.alloc(4, call((SP + "torch/optim/adamw.py", 102, "_init_group"), (SP + "torch/optim/adamw.py", 177, "step"), opt), "optimizer"))
                state.append(d.alloc(n, call((SP + "torch/optim/adamw.py", 106, "_init_group"), (SP + "torch/optim/adamw.py", 177, "step"), opt), "optimizer"))
                state.append(d.alloc(n, call((SP + "torch/optim/adamw.py", 109, "_init_group"), (SP + "torch/optim/adamw.py", 177, "step"), opt), "optimizer"))
        foreach = [(SP + "torch/optim/adamw.py", 598, "_multi_tensor_adamw"), (SP + "torch/optim/adamw.py", 335, "adamw"), (SP + "torch/optim/adamw.py", 187, "step")] + opt
        tmps = [d.alloc(n, call(foreach), "temporary") for p, n in params]
        for t in tmps:
            d.free(t, call([(SP + "torch/optim/adamw.py", 612, "_multi_tensor_adamw")] + foreach[1:]))
        d.free(x, call((TR, 44, "train"), main[1:]))
        sn.tick(30_000)
    info = {
        "what": "two iterations of an MLP: forward allocations with Python frames, every backward "
                "allocation and free on the autograd thread with frames == [] (stacks='python'), "
                "AdamW state on the first step and foreach temporaries (torch/optim/adamw.py); "
                "gradients kept between steps (zero_grad not called); weights allocated before recording",
        "layout": "torch 2.4: time_us, allocator_settings, no external_annotations; stacks='python', context='all'",
        "expect": {},
    }
    return sn, info


# =============================================================================================
# Fixture 5: torch20_history.pickle
# =============================================================================================
def fx_torch20():
    sn = Snap((2, 0), t0=0, context="alloc")
    d = sn.device(0, base=0x7FC8_A000_0000)
    SP = "/opt/conda/lib/python3.10/site-packages/"
    TR = "/home/u/infer/gen.py"
    FM = "/home/u/infer/flex_model.py"
    d.recording = False
    w = [d.alloc(n, (), "weights") for n in (100 * MiB, 4 * MiB, 4 * MiB, 16 * MiB, 16 * MiB, 64 * 1024)]
    gone = d.alloc(6 * MiB, (), "temporary")
    d.start_recording()
    main = [(TR, 88, "generate"), (TR, 120, "<module>")]
    d.free(gone, None)                        # pre-trace block, freed: no frames key (no context)
    kv = []
    for step in range(4):
        ctx = [(FM, 283, "compute_layer"), (FM, 301, "forward")] + main
        a = d.alloc(3 * MiB + 1000, call((SP + "torch/nn/functional.py", 2515, "layer_norm"), ctx), "activations")
        b = d.alloc(12 * MiB, call((FM, 290, "compute_layer"), ctx[1:]), "activations")
        c = d.alloc(900 * KiB, call((FM, 294, "compute_layer"), ctx[1:]), "temporary")
        kv.append(d.alloc(2 * MiB, call((FM, 297, "compute_layer"), ctx[1:]), "activations"))
        d.free(a)
        d.free(c)
        if step % 2 == 0:
            d.free(b)
        d.alloc(700, call((FM, 310, "sample"), main), "temporary") if step == 3 else None
    info = {
        "what": "torch 2.0 layout: segments without segment_pool_id/is_expandable/frames, blocks "
                "without address/frames but with history [{addr, real_size, frames}] (newest first; "
                "inactive blocks keep old history or have none), entries without time_us; frees "
                "share the allocation's frames (context='alloc'); a pre-trace block freed with no frames key",
        "layout": "torch 2.0: no time_us, no allocator_settings/external_annotations, frame keys filename/name/line",
        "expect": {},
    }
    return sn, info


# =============================================================================================
# Fixture 6: multi_device.pickle
# =============================================================================================
def fx_multi_device():
    sn = Snap((2, 6), t0=1_730_000_000_000_000, context="all")
    SP = "/opt/venv/lib/python3.12/site-packages/"
    TR = "/work/pp/pipeline.py"
    M = module_call(SP)
    d0 = sn.device(0, base=0x7F10_0000_0000)
    d1 = sn.device(1, base=0x7F30_0000_0000)
    d2 = sn.device(2, base=0x7F50_0000_0000)
    for dv in (d0, d1, d2):
        dv.recording = False
        dv.alloc(8 * MiB, (), "weights")
        dv.start_recording()
    main = [(TR, 140, "run"), (TR, 171, "<module>")]
    # device 1: nothing recorded (trace empty), only the pre-trace block above
    for stage, dv in ((0, d0), (2, d2)):
        sn.tick(1000)
        ctx = [(TR, 90 + stage, "forward_stage"), (TR, 120, "step")] + main
        w = [dv.alloc(n, call((SP + "torch/nn/modules/module.py", 1340, "convert"), (TR, 60, "build"), main), "weights") for n in (48 * MiB, 48 * MiB, 512 * KiB)]
        a1 = dv.alloc(24 * MiB, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, ctx), "activations")
        a2 = dv.alloc(24 * MiB, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, ctx), "activations")
        t = dv.alloc(300 * KiB, call((SP + "torch/nn/functional.py", 1704, "relu"), ctx), "temporary")
        dv.free(t, call((SP + "torch/nn/functional.py", 1704, "relu"), ctx), extra={"future_field": 7} if stage == 0 else None)
        # a legacy 'free' action (no free_requested/free_completed pair)
        dv.free(a1, call((TR, 124, "step"), main), legacy=True)
        # an unknown future action, with unknown keys; must be kept and not counted
        dv.entry("future_action", a2, 24 * MiB, 0, sn.tb(call((TR, 125, "step"), main)),
                 extra={"future_payload": {"reason": "prefetch", "ratio": 0.5}, "future_flag": True})
        if stage == 2:
            dv.free(a2, call((TR, 126, "step"), main))
    snap = sn.build(ndevices=3)
    snap["future_top_level_key"] = {"schema": 99, "note": "unknown top-level keys must be kept"}
    snap["segments"][0]["future_segment_key"] = [1, 2, 3]
    info = {
        "what": "3 devices: 0 and 2 with traces and segments, 1 with an empty trace and one block "
                "from before recording; a legacy 'free' action, an unknown 'future_action' entry, "
                "unknown keys on entries, on a segment and on the top-level dict",
        "layout": "torch 2.6 + unknown keys; stacks='python', context='all'",
        "expect": {"unknown_actions": ["future_action"], "top_level_extra_keys": ["future_top_level_key"]},
    }
    return sn, info, snap


# =============================================================================================
# Fixture 7: annotated_210.pickle
# =============================================================================================
def fx_annotated():
    sn = Snap((2, 13), t0=1_760_000_000_000_000, context="all")
    d = sn.device(0, base=0x7E00_0000_0000)
    SP = "/home/dev/.venv/lib/python3.13/site-packages/"
    TR = "/home/dev/proj/train.py"
    MD = "/home/dev/proj/net.py"
    M = module_call(SP, 1784, 1773)
    d.recording = False
    params = [(d.alloc(n, (), "weights"), n) for n in (16 * MiB, 16 * MiB, 64 * KiB, 4 * MiB)]
    d.start_recording()
    main = [(TR, 97, "main"), (TR, 130, "<module>")]
    graph_pool = (0, 1)
    state = []
    for it in range(3):
        sn.user_metadata = "step=%d" % it
        x = d.alloc(2 * MiB, call((TR, 71, "train_step"), main), "inputs")
        sn.annotate("forward", "START")
        sn.compile_context = "Torch-Compiled Region: 0/0"
        fwd = [(SP + "torch/_inductor/output_code.py", 584, "__call__"), (SP + "torch/_dynamo/eval_frame.py", 838, "compile_wrapper"),
               (MD, 41, "forward"), M, (TR, 73, "train_step")] + main
        acts = [d.alloc(8 * MiB, call(("/tmp/torchinductor_dev/ab/cabxyz.py", 120 + 7 * k, "call"), fwd), "activations") for k in range(4)]
        tmp = d.alloc(512 * KiB, call(("/tmp/torchinductor_dev/ab/cabxyz.py", 160, "call"), fwd), "temporary")
        d.free(tmp, call(("/tmp/torchinductor_dev/ab/cabxyz.py", 171, "call"), fwd))
        sn.compile_context = "N/A"
        sn.annotate("forward", "END")
        sn.annotate("backward", "START")
        # backward allocations: anomaly mode recorded the forward stack (forward_frames)
        ff = fmt_stack([(TR, 130, "<module>", "main()"), (TR, 97, "main", "train_step(model, batch)"),
                        (TR, 73, "train_step", "out = model(x)"), (MD, 41, "forward", "return self.net(x).relu()")])
        grads_now = []
        for p, n in params:
            grads_now.append(d.alloc(n, (), "gradients", forward_frames=ff))
        bw = [d.alloc(8 * MiB, (), "autograd", forward_frames=ff) for _ in range(2)]
        for a in bw:
            d.free(a, ())
        for a in acts:
            d.free(a, ())
        sn.annotate("backward", "END")
        sn.annotate("Optimizer.step#AdamW.step", "START")
        opt = [(SP + "torch/optim/optimizer.py", 516, "wrapper"), (TR, 76, "train_step")] + main
        if it == 0:
            for p, n in params:
                state.append(d.alloc(n, call((SP + "torch/optim/adamw.py", 186, "_init_group"), (SP + "torch/optim/adamw.py", 232, "step"), opt), "optimizer"))
                state.append(d.alloc(n, call((SP + "torch/optim/adamw.py", 190, "_init_group"), (SP + "torch/optim/adamw.py", 232, "step"), opt), "optimizer"))
        t = d.alloc(16 * MiB, call((SP + "torch/optim/adamw.py", 540, "_multi_tensor_adamw"), (SP + "torch/optim/adamw.py", 867, "adamw"), (SP + "torch/optim/adamw.py", 248, "step"), opt), "temporary",
                    extra={"internal_metadata": "foreach:group0"} if it == 0 else None)
        d.free(t, call((SP + "torch/optim/adamw.py", 552, "_multi_tensor_adamw"), (SP + "torch/optim/adamw.py", 867, "adamw"), (SP + "torch/optim/adamw.py", 248, "step"), opt))
        sn.annotate("Optimizer.step#AdamW.step", "END")
        sn.annotate("Optimizer.zero_grad#AdamW.zero_grad", "START")
        for g in grads_now:
            d.free(g, call((SP + "torch/optim/optimizer.py", 1004, "zero_grad"), (TR, 78, "train_step"), main))
        sn.annotate("Optimizer.zero_grad#AdamW.zero_grad", "END")
        d.free(x, call((TR, 71, "train_step"), main))
        if it == 1:
            d.marker()
        sn.tick(100_000)
    # a CUDA-graph private pool (segment_pool_id (0, 1)) for the eval step, still alive
    sn.user_metadata = "eval"
    sn.compile_context = "Torch-Compiled Region: 1/0"
    gctx = [(SP + "torch/cuda/graphs.py", 88, "capture_begin"), (SP + "torch/cuda/graphs.py", 187, "__enter__"), (TR, 110, "evaluate"), (TR, 128, "<module>")]
    g_out = [d.alloc(n, call(gctx), "activations", pool=graph_pool) for n in (6 * MiB, 6 * MiB, 256 * KiB)]
    g_tmp = d.alloc(4 * MiB, call(gctx), "temporary", pool=graph_pool)
    d.free(g_tmp, call(gctx))
    sn.compile_context = "N/A"
    sn.user_metadata = ""
    # a block used on a side stream (record_stream): free requested, not completed at dump time
    side = d.alloc(3 * MiB, call((TR, 116, "prefetch"), (TR, 129, "<module>")), "inputs")
    d.free(side, call((TR, 118, "prefetch"), (TR, 129, "<module>")), pending=True)
    info = {
        "what": "torch >= 2.10 style: compile_context and user_metadata on every entry, "
                "external_annotations START/END for forward/backward/Optimizer.step#AdamW.step/"
                "zero_grad per iteration, a 'snapshot' entry, pool_id tuples (2.12+), forward_frames "
                "(2.13, anomaly-mode strings) on backward allocations, internal_metadata on one entry, "
                "a private pool (segment_pool_id (0, 1)), an active_pending_free block, host_segments/host_traces",
        "layout": "torch 2.13 (Python path of _snapshot): entry keys action, addr, size, stream, time_us, compile_context, user_metadata, pool_id, frames, forward_frames",
        "expect": {"iterations": 3, "pending_free_blocks": 1, "private_pools": [[0, 1]]},
    }
    return sn, info


# =============================================================================================
# Fixture 8: protocol2.pickle
# =============================================================================================
def fx_protocol2():
    sn = Snap((2, 13), t0=1_761_000_000_000_000, context="all", cpp=True)
    d = sn.device(0, base=0x7D00_0000_0000)
    SP = "/usr/lib/python3.12/site-packages/"
    TR = "/opt/svc/serve.py"
    d.recording = False
    w = [d.alloc(n, (), "weights") for n in (40 * MiB, 40 * MiB, 2 * MiB)]
    d.start_recording()
    main = [(TR, 201, "handle"), (SP + "uvicorn/protocols/http/h11_impl.py", 412, "run_asgi"), (TR, 240, "<module>")]
    for req in range(30):
        ctx = [(TR, 150 + (req % 5), "infer")] + main
        a = d.alloc(3 * MiB + 512 * req, call((SP + "torch/nn/modules/linear.py", 125, "forward"), ctx), "activations")
        b = d.alloc(900 * KiB, call((SP + "torch/nn/functional.py", 2141, "softmax"), ctx), "temporary")
        d.free(b, call((SP + "torch/nn/functional.py", 2141, "softmax"), ctx))
        c = d.alloc(64 * KiB, call((TR, 160, "infer"), main), "activations")
        d.free(a, call((TR, 170, "infer"), main))
        if req % 7 != 3:
            d.free(c, call((TR, 171, "infer"), main))
    d.release(call((SP + "torch/cuda/memory.py", 192, "empty_cache"), (TR, 230, "maybe_trim"), main))
    info = {
        "what": "small inference snapshot written like torch's C++ _memory_snapshot_pickled: "
                "protocol 2, no FRAME, BINUNICODE strings memoized by value, containers memoized "
                "with BINPUT/LONG_BINPUT after they are complete, LONG1 with 8 bytes, MARK+SETITEMS "
                "for every dict, unbatched APPENDS; key order of the C++ path (time_us after user_metadata)",
        "layout": "torch 2.13 C++ path: entry keys action, addr, size, stream, compile_context, user_metadata, time_us, pool_id, frames",
        "expect": {},
    }
    return sn, info


# =============================================================================================
# Fixture 9: bare_list.pickle
# =============================================================================================
def fx_bare_list():
    sn = Snap((2, 1), t0=0, context="all")
    d0 = sn.device(0, base=0x7F40_0000_0000)
    d1 = sn.device(1, base=0x7F60_0000_0000)
    for dv, scale in ((d0, 1), (d1, 2)):
        dv.recording = False
        ws = [dv.alloc(n * scale, (), "weights") for n in (160 * MiB, 40 * MiB, 3 * MiB, 700 * KiB, 12 * KiB)]
        dv.free(ws[1])
        dv.alloc(5 * MiB, (), "activations")
        dv.free(ws[3])
    snap = sn.build()
    info = {
        "what": "old torch.cuda.memory_snapshot() style: a bare list of segments (devices 0 and 1), "
                "no traces; state only",
        "layout": "list of segments in the 2.1+ segment layout (frames empty)",
        "expect": {},
    }
    return sn, info, snap["segments"]


# =============================================================================================
# Fixtures 10/11: leak.pickle and clean_loop.pickle
# =============================================================================================
LEAK_FRAME = ("/home/user/project/train.py", 42, "train_step")


def fx_loop(leak):
    sn = Snap((2, 6), t0=1_727_500_000_000_000, context="all")
    d = sn.device(0, base=0x7F70_0000_0000)
    SP = "/home/user/.venv/lib/python3.11/site-packages/"
    TR = LEAK_FRAME[0]
    MD = "/home/user/project/model.py"
    M = module_call(SP, 1739, 1750)
    B, T, C, V, L = 8, 256, 1024, 32000, 4
    tok = B * T
    d.recording = False
    shapes = []
    for _ in range(L):
        shapes += [3 * C * C, C * C, 4 * C * C, 4 * C * C, C, C]
    shapes += [V * C]
    params = [(d.alloc(n * 4, (), "weights"), n * 4) for n in shapes]
    d.start_recording()
    main = [(TR, 61, "main"), (TR, 70, "<module>")]
    step_ctx = [(TR, 38, "train_step")] + main
    history = []
    state = []
    grads = []
    ends = []
    for it in range(6):
        sn.annotate("Optimizer.zero_grad#AdamW.zero_grad", "START")
        for g in grads:
            d.free(g, call((SP + "torch/optim/optimizer.py", 975, "zero_grad"), (TR, 36, "train_step"), main))
        grads = []
        sn.annotate("Optimizer.zero_grad#AdamW.zero_grad", "END")
        x = d.alloc(tok * 8, call((TR, 33, "train_step"), main), "inputs")
        y = d.alloc(tok * 8, call((TR, 34, "train_step"), main), "inputs")
        acts = []
        net = [(MD, 60, "forward"), M] + step_ctx
        acts.append(d.alloc(tok * C * 2, call((SP + "torch/nn/modules/sparse.py", 190, "forward"), M, net), "activations"))
        for layer in range(L):
            blk = [(MD, 31, "forward"), M] + net
            acts.append(d.alloc(tok * 3 * C * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, blk), "activations"))
            acts.append(d.alloc(tok * C * 2, call((SP + "torch/nn/functional.py", 5560, "scaled_dot_product_attention"), blk), "activations"))
            acts.append(d.alloc(tok * 4 * C * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, [(MD, 33, "forward")] + blk[1:]), "activations"))
            acts.append(d.alloc(tok * 4 * C * 2, call((SP + "torch/nn/functional.py", 1704, "gelu"), [(MD, 33, "forward")] + blk[1:]), "activations"))
            acts.append(d.alloc(tok * C * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, [(MD, 34, "forward")] + blk[1:]), "activations"))
        logits = d.alloc(tok * V * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, [(MD, 62, "forward"), M] + step_ctx), "activations")
        loss_ctx = [(SP + "torch/nn/functional.py", 3479, "cross_entropy"), (TR, 39, "train_step")] + main
        lsm = d.alloc(tok * V * 4, call(loss_ctx), "activations")
        loss = d.alloc(4, call(loss_ctx), "activations")
        if leak:
            # train.py:42  history.append(logits.float())  -> fp32 copy kept with its graph, every step
            history.append(d.alloc(tok * V * 4, call(LEAK_FRAME, main), "activations"))
        sn.annotate("backward", "START")
        g = d.alloc(tok * V * 4, (), "autograd")
        d.free(lsm, ())
        g2 = d.alloc(tok * V * 2, (), "autograd")
        d.free(g, ())
        d.free(logits, ())
        for a in reversed(acts):
            d.free(a, ())
        for p, n in params:
            grads.append(d.alloc(n, (), "gradients"))
        d.free(g2, ())
        sn.annotate("backward", "END")
        sn.annotate("Optimizer.step#AdamW.step", "START")
        opt = [(SP + "torch/optim/optimizer.py", 493, "wrapper"), (TR, 45, "train_step")] + main
        if not state:
            for p, n in params:
                for line in (183, 187):
                    state.append(d.alloc(n, call((SP + "torch/optim/adamw.py", line, "_init_group"), (SP + "torch/optim/adamw.py", 209, "step"), opt), "optimizer"))
        tmp = [d.alloc(n, call((SP + "torch/optim/adamw.py", 561, "_multi_tensor_adamw"), (SP + "torch/optim/adamw.py", 760, "adamw"), (SP + "torch/optim/adamw.py", 225, "step"), opt), "temporary") for p, n in params[-3:]]
        for t in tmp:
            d.free(t, call((SP + "torch/optim/adamw.py", 575, "_multi_tensor_adamw"), (SP + "torch/optim/adamw.py", 760, "adamw"), (SP + "torch/optim/adamw.py", 225, "step"), opt))
        sn.annotate("Optimizer.step#AdamW.step", "END")
        if it == 5:
            # evaluation on a long sequence: a large temporary that leaves a cached segment behind
            ev = [(TR, 52, "evaluate"), (TR, 63, "main"), (TR, 70, "<module>")]
            big = d.alloc(1536 * MiB, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, ev), "temporary")
            d.free(big, call(ev))
        d.free(loss, call((TR, 47, "train_step"), main))   # loss.item() logged, tensor dropped
        d.free(x, call((TR, 33, "train_step"), main))
        d.free(y, call((TR, 34, "train_step"), main))
        ends.append((len(d.trace) - 1, d.live_bytes()))
        sn.tick(250_000)
    expect = {"iterations": 6,
              "iteration_end_index": [i for i, _ in ends],
              "live_bytes_at_iteration_end": [b for _, b in ends]}
    if leak:
        expect["leaks"] = [{"filename": LEAK_FRAME[0], "line": LEAK_FRAME[1], "name": LEAK_FRAME[2],
                            "blocks": 6, "bytes": 6 * tok * V * 4, "bytes_per_iteration": tok * V * 4}]
    else:
        expect["leaks"] = []
    expect["not_leaks"] = {
        "optimizer_state_bytes": sum(2 * n for _, n in params),          # created once, first step
        "eval_cached_segment_bytes": 1536 * MiB,                          # wholly free at the end
        "wholly_free_segments_bytes_at_end": sum(sg.total for sg in d.segs
                                                 if all(b.state == "inactive" for b in sg.blocks)),
        "pre_trace_bytes": sum(n for _, n in params),                     # weights, before recording
    }
    info = {
        "what": ("6 iterations of a training loop where train.py:42 train_step "
                 "(history.append(logits.float())) keeps one fp32 logits copy per step: live memory "
                 "grows every iteration" if leak else
                 "the same 6-iteration loop without the leak: no growth after the first step") +
                "; one-time AdamW state on the first step, a cached-but-unallocated 1.5 GiB segment "
                "left by an evaluation in the last iteration, weights live before the trace began",
        "layout": "torch 2.6: time_us, allocator_settings, external_annotations (zero_grad/backward/Optimizer.step); stacks='python', context='all'",
        "expect": expect,
    }
    return sn, info


# =============================================================================================
# Shared by the fixtures below: a decoder-only LM's training step on one simulated device
# =============================================================================================
def lm_param_sizes(C, L, V):
    """fp32 bytes of each parameter: per layer qkv, proj, fc, out, two norms; then embeddings."""
    shapes = []
    for _ in range(L):
        shapes += [3 * C * C, C * C, 4 * C * C, 4 * C * C, C, C]
    shapes += [V * C]
    return [n * 4 for n in shapes]


class LMStep:
    """One training step of a decoder-only LM (fp32 weights, bf16 activations under autocast)
    with the stacks torch records under stacks='python', context='all':
      * forward: the op's frames under nn.Module.__call__ frames (`module_call`), the model's
        forward and the user's line that calls the model (`call_site`);
      * the loss: F.cross_entropy under the user's loss line (`loss_site`);
      * backward: the loss's gradient (ones_like, 4 bytes) is made on the main thread in
        torch/autograd/__init__.py _make_grads under torch/_tensor.py backward and the user's
        `loss.backward()` line (`backward_site`); everything else runs on the autograd
        engine's device thread, which has no Python frames (frames == []);
      * optimizer: AdamW (foreach) under torch/optim/optimizer.py wrapper and the user's
        `optimizer.step()` line: state on the first step (_init_group), _foreach_sqrt-sized
        scratch for every parameter (_multi_tensor_adamw);
      * zero_grad(set_to_none=True): frees every gradient under torch/optim/optimizer.py
        zero_grad and the user's line."""

    def __init__(self, sn, d, SP, MD, C, L, V, params, M=None):
        self.sn, self.d, self.SP, self.MD = sn, d, SP, MD
        self.C, self.L, self.V = C, L, V
        self.params = params                   # [(addr, bytes)]
        self.M = M if M is not None else module_call(SP, 1739, 1750)
        self.state = []
        self.grads = []

    def forward(self, tok, call_site, loss_site):
        """-> dict of the step's tensors; `saved` = what autograd keeps for backward."""
        st = {}
        for _ in self.model_forward_steps(tok, call_site, st):
            pass
        self.loss(st, loss_site)
        return st

    def model_forward_steps(self, tok, call_site, st):
        """The model's forward as a generator that yields after every block, so that several
        devices' forwards can interleave (DataParallel runs them in threads)."""
        d, SP, MD, M, C, V = self.d, self.SP, self.MD, self.M, self.C, self.V
        net = [(MD, 88, "forward"), M] + call_site
        st["tok"] = tok
        saved = st["saved"] = [d.alloc(tok * C * 2, call((SP + "torch/nn/functional.py", 2551, "embedding"),
                                                        (SP + "torch/nn/modules/sparse.py", 190, "forward"), M, net), "activations")]
        yield
        for layer in range(self.L):
            blk = [(MD, 52, "forward"), M, (MD, 86, "forward")] + net[1:]
            norm = [(MD, 31, "forward"), M] + blk
            # RMSNorm upcasts to fp32 for the variance: freed inside the forward
            tmp = d.alloc(tok * C * 4, call((MD, 29, "_norm"), norm), "temporary")
            saved.append(d.alloc(tok * C * 2, call((MD, 30, "_norm"), norm), "activations"))
            d.free(tmp, call((MD, 29, "_norm"), norm))
            attn = [(MD, 44, "forward"), M, (MD, 53, "forward")] + blk[1:]
            saved.append(d.alloc(tok * 3 * C * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, attn), "activations"))
            saved.append(d.alloc(tok * C * 2, call((SP + "torch/nn/functional.py", 5560, "scaled_dot_product_attention"),
                                                   [(MD, 46, "forward")] + attn[1:]), "activations"))
            saved.append(d.alloc(tok * C * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M,
                                                   [(MD, 47, "forward")] + attn[1:]), "activations"))
            mlp = [(MD, 64, "forward"), M, (MD, 54, "forward")] + blk[1:]
            saved.append(d.alloc(tok * 4 * C * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, mlp), "activations"))
            saved.append(d.alloc(tok * 4 * C * 2, call((SP + "torch/nn/functional.py", 1704, "gelu"),
                                                       [(MD, 64, "forward")] + mlp[1:]), "activations"))
            saved.append(d.alloc(tok * C * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M,
                                                   [(MD, 65, "forward")] + mlp[1:]), "activations"))
            yield
        st["logits"] = d.alloc(tok * V * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M,
                                                 [(MD, 90, "forward")] + net[1:]), "activations")

    def loss(self, st, loss_site, tok=None):
        d = self.d
        tok = st["tok"] if tok is None else tok
        ce = [(self.SP + "torch/nn/functional.py", 3479, "cross_entropy")] + loss_site
        st["lsm"] = d.alloc(tok * self.V * 4, call(ce), "activations")
        st["loss"] = d.alloc(4, call(ce), "activations")
        return st

    def make_grads_stack(self, backward_site):
        SP = self.SP
        return call((SP + "torch/autograd/__init__.py", 220, "_make_grads"),
                    (SP + "torch/autograd/__init__.py", 340, "backward"),
                    (SP + "torch/_tensor.py", 626, "backward"), backward_site)

    def backward_start(self, st, backward_site):
        """The loss's gradient on the main thread, then the first autograd-thread allocation:
        the gradient of the fp32 log-softmax, the step's spike. Returns its address."""
        d = self.d
        st["grad_loss"] = d.alloc(4, self.make_grads_stack(backward_site), "autograd")
        return d.alloc(st["tok"] * self.V * 4, (), "autograd")

    def backward_rest(self, st, g, free_saved=True, grad_cat="gradients"):
        """The rest of backward on the autograd thread: activations freed layer by layer
        (unless the graph is retained), one gradient per parameter (AccumulateGrad)."""
        d = self.d
        if free_saved:
            d.free(st["lsm"], ())
        g2 = d.alloc(st["tok"] * self.V * 2, (), "autograd")
        d.free(g, ())
        d.free(st["grad_loss"], ())
        for _ in self.backward_layer_steps(st, g2, free_saved, grad_cat):
            pass

    def backward_layer_steps(self, st, g2, free_saved=True, grad_cat="gradients"):
        """From the gradient of the logits down to the embeddings, a generator that yields
        after every block (devices interleave under DataParallel)."""
        d, tok, C = self.d, st["tok"], self.C
        new = {}
        new[len(self.params) - 1] = d.alloc(self.params[-1][1], (), grad_cat)   # lm head (tied embeddings)
        gl = d.alloc(tok * C * 2, (), "autograd")
        d.free(g2, ())
        saved = list(st["saved"])
        yield
        for layer in reversed(range(self.L)):
            per = saved[1 + 7 * layer: 1 + 7 * (layer + 1)]
            for k in (3, 2, 0, 1, 5, 4):          # fc/out, qkv/proj, norms, in backward order
                pi = 6 * layer + k
                new[pi] = d.alloc(self.params[pi][1], (), grad_cat)
            gi = d.alloc(tok * 4 * C * 2, (), "autograd")
            if free_saved:
                for a in reversed(per):
                    d.free(a, ())
            d.free(gi, ())
            gn = d.alloc(tok * C * 2, (), "autograd")
            d.free(gl, ())
            gl = gn
            yield
        if free_saved:
            d.free(saved[0], ())
        d.free(gl, ())
        self.grads = [new[i] for i in range(len(self.params))]

    def optimizer_step(self, opt_site):
        d, SP = self.d, self.SP
        opt = [(SP + "torch/optim/optimizer.py", 493, "wrapper")] + opt_site
        if not self.state:
            for _, n in self.params:
                for line in (183, 187):
                    self.state.append(d.alloc(n, call((SP + "torch/optim/adamw.py", line, "_init_group"),
                                                      (SP + "torch/optim/adamw.py", 209, "step"), opt), "optimizer"))
        fe = [(SP + "torch/optim/adamw.py", 760, "adamw"), (SP + "torch/optim/adamw.py", 225, "step")] + opt
        tmp = [d.alloc(n, call((SP + "torch/optim/adamw.py", 561, "_multi_tensor_adamw"), fe), "temporary")
               for _, n in self.params]
        for t in tmp:
            d.free(t, call((SP + "torch/optim/adamw.py", 575, "_multi_tensor_adamw"), fe))

    def zero_grad(self, site):
        stack = call((self.SP + "torch/optim/optimizer.py", 975, "zero_grad"), site)
        for g in self.grads:
            self.d.free(g, stack)
        self.grads = []


def _phase_ranges(marks, end):
    """[(phase, first index, last index)] from [(phase, first index)] and the end (exclusive)."""
    out = []
    for k, (ph, lo) in enumerate(marks):
        hi = (marks[k + 1][1] if k + 1 < len(marks) else end) - 1
        out.append({"phase": ph, "start_index": lo, "end_index": hi})
    return out


def _live_curve(trace, start):
    cur, out = start, []
    for e in trace:
        if e["action"] == "alloc":
            cur += e["size"]
        elif e["action"] in FREE_ACTIONS:
            cur -= e["size"]
        out.append(cur)
    return out


def _peak_in(trace, curve, lo, hi):
    """(index, bytes) of the alloc in [lo, hi] that first reaches the range's highest live bytes."""
    best = None
    for i in range(lo, hi + 1):
        if trace[i]["action"] == "alloc" and (best is None or curve[i] > curve[best]):
            best = i
    return best, curve[best]


# =============================================================================================
# Fixture 12: oom_step3.pickle
# =============================================================================================
OOM3_CAPACITY = 3_800_000_000


def fx_oom_step3(capacity=OOM3_CAPACITY):
    sn = Snap((2, 6), t0=1_731_000_000_000_000, context="all")
    d = sn.device(0, base=0x7F3C_0000_0000, capacity=capacity)
    SP = "/home/ana/.venv/lib/python3.11/site-packages/"
    TR = "/home/ana/lm/train.py"
    MD = "/home/ana/lm/model.py"
    C, L, V, B = 1024, 4, 32000, 4
    seqs = [1024, 1024, 1536]          # the third batch is longer (bucketed by length)
    d.recording = False
    params = [(d.alloc(n, (), "weights"), n) for n in lm_param_sizes(C, L, V)]
    d.start_recording()
    lm = LMStep(sn, d, SP, MD, C, L, V, params)
    main = [(TR, 141, "main"), (TR, 160, "<module>")]
    step = lambda line: [(TR, line, "train_step")] + main
    iters = []
    oom = None
    for it, T in enumerate(seqs):
        tok = B * T
        start = len(d.trace)
        marks = [("inputs", start)]
        x = d.alloc(tok * 8, call((TR, 102, "train_step"), main), "inputs")
        y = d.alloc(tok * 8, call((TR, 103, "train_step"), main), "inputs")
        marks.append(("forward", len(d.trace)))
        st = lm.forward(tok, step(105), step(106))
        marks.append(("backward", len(d.trace)))
        try:
            g = lm.backward_start(st, step(107))
        except OutOfMemory:
            # the third batch: the gradient of the fp32 log-softmax does not fit. The script
            # catches torch.OutOfMemoryError and dumps the snapshot; the aborted graph task
            # drops the loss's gradient first.
            oom = next(i for i in range(len(d.trace) - 1, -1, -1) if d.trace[i]["action"] == "oom")
            d.free(st["grad_loss"], ())
            iters.append({"iteration": it, "seq_len": T, "start_index": start, "end_index": len(d.trace) - 1,
                          "phases": _phase_ranges(marks, len(d.trace))})
            break
        spike = len(d.trace) - 1
        lm.backward_rest(st, g)
        marks.append(("optimizer", len(d.trace)))
        lm.optimizer_step(step(108))
        lm.zero_grad(step(109))
        d.free(st["loss"], call((TR, 110, "train_step"), main))    # loss.item() logged, tensors dropped
        d.free(st["logits"], call((TR, 110, "train_step"), main))
        d.free(x, call((TR, 110, "train_step"), main))
        d.free(y, call((TR, 110, "train_step"), main))
        iters.append({"iteration": it, "seq_len": T, "start_index": start, "end_index": len(d.trace) - 1,
                      "phases": _phase_ranges(marks, len(d.trace)), "_spike": spike})
        sn.tick(400_000)
    else:
        raise AssertionError("oom_step3.pickle: the third step did not run out of memory")
    assert len(iters) == 3 and oom is not None
    # per-iteration peaks, from the trace itself (the reference definition)
    snap = sn.build()
    ref = reference(snap, 0)
    trace = snap["device_traces"][0]
    curve = _live_curve(trace, ref["start_bytes"])
    peaks = []
    for itd in iters:
        idx, nbytes = _peak_in(trace, curve, itd["start_index"], itd["end_index"])
        phase = next(p["phase"] for p in itd["phases"] if p["start_index"] <= idx <= p["end_index"])
        spike = itd.pop("_spike", None)
        if spike is not None:
            assert idx == spike, ("oom_step3: the peak is not the backward spike", itd["iteration"])
        peaks.append({"iteration": itd["iteration"], "index": idx, "bytes": nbytes, "phase": phase,
                      "type": "oom" if spike is None else "backward_start"})
    assert peaks[2]["phase"] == "backward" and oom > peaks[2]["index"]
    info = {
        "what": "three steps of LM training (4 layers, d 1024, vocab 32000, micro-batch 4, AdamW) on a "
                "device with 3.8 GB for the allocator: steps 1 and 2 (sequence length 1024) peak at the "
                "start of backward (the gradient of the fp32 log-softmax while every activation is "
                "live); step 3 gets a longer batch (1536) and runs out of memory at that same "
                "allocation (no wholly free cached segment is left to release); the trace ends right "
                "after (the aborted graph task drops the loss's gradient, then the script dumps the "
                "snapshot from its except handler); weights live before the trace",
        "layout": "torch 2.6: time_us, allocator_settings, external_annotations (empty); stacks='python', context='all'",
        "expect": {
            "iterations": 3,
            "oom_iteration": 2,
            "iteration_numbering": "0-based, in trace order",
            "micro_batch": B,
            "seq_len_per_iteration": seqs,
            "iteration_table": iters,
            "iteration_peaks": peaks,
            "oom": {"index": oom, "iteration": 2, "phase": "backward",
                    "at": "gradient of the fp32 log-softmax (the first autograd-thread allocation of backward)",
                    "requested": trace[oom]["size"]},
            "phase_markers": {
                "forward": "torch/nn/modules/module.py _call_impl frames under train.py:105 train_step",
                "backward": "torch/autograd/__init__.py _make_grads < torch/_tensor.py backward < "
                            "train.py:107 train_step, then autograd-thread allocations with frames == []",
                "optimizer": "torch/optim/optimizer.py wrapper < train.py:108 train_step (adamw.py _init_group, "
                             "_multi_tensor_adamw); zero_grad at train.py:109"},
        },
    }
    return sn, info


# =============================================================================================
# Fixture 13: forward_frames_213.pickle
# =============================================================================================
CPP_ENGINE_213 = [
    ("??", 0, "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
    ("??", 0, "torch::autograd::call_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&)"),
    ("??", 0, "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
    ("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
    ("??", 0, "torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
    ("??", 0, "torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
    ("??", 0, "execute_native_thread_routine"), ("??", 0, "start_thread"), ("??", 0, "__clone3")]
CPP_MALLOC_213 = [
    ("??", 0, "torch::unwind::unwind()"),
    ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
    ("??", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    ("??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
    ("??", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)"),
    ("??", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
    ("??", 0, "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)"),
    ("??", 0, "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)")]
CPP_FREE_213 = [
    ("??", 0, "torch::unwind::unwind()"),
    ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
    ("??", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    ("??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*)"),
    ("??", 0, "c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void*)"),
    ("??", 0, "c10::StorageImpl::~StorageImpl()"),
    ("??", 0, "c10::TensorImpl::~TensorImpl()")]
CPP_PY_313 = [("??", 0, "cfunction_call"), ("??", 0, "_PyObject_MakeTpCall"), ("??", 0, "_PyEval_EvalFrameDefault")]


OP_SIGNATURES = {
    "mm": "at::Tensor const&, at::Tensor const&",
    "gelu": "at::Tensor const&, c10::basic_string_view<char>",
    "gelu_backward": "at::Tensor const&, at::Tensor const&, c10::basic_string_view<char>",
    "_log_softmax": "at::Tensor const&, long, bool",
    "_log_softmax_backward_data": "at::Tensor const&, at::Tensor const&, long, c10::ScalarType",
    "nll_loss_nd": "at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt",
    "nll_loss_backward": "at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, at::Tensor const&",
    "to": "at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, bool, std::optional<c10::MemoryFormat>",
    "ones_like": "at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>",
    "zeros_like": "at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>",
    "zeros": "c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>",
}


def _op_frames(op, kernel):
    """The dispatcher frames of one aten op, innermost first: the kernel, then
    at::_ops::<op>::call(<signature>) as the symbolizer prints it."""
    return [("??", 0, kernel), ("??", 0, "at::_ops::%s::call(%s)" % (op, OP_SIGNATURES[op]))]


def fx_forward_frames_213():
    sn = Snap((2, 13), t0=1_763_000_000_000_000, context="all")
    d = sn.device(0, base=0x7E40_0000_0000)
    SP = "/home/dev/.venv/lib/python3.13/site-packages/"
    TR = "/home/dev/mlp/train.py"
    MD = "/home/dev/mlp/model.py"
    M = module_call(SP, 1784, 1773)
    B, D, H, K = 512, 1024, 4096, 1000
    d.recording = False
    for n in (H * D * 4, H * H * 4, K * H * 4):      # the three weights, loaded before recording
        d.alloc(n, (), "weights")
    d.start_recording()
    psizes = [H * D * 4, H * H * 4, K * H * 4]
    main = [(TR, 88, "main"), (TR, 97, "<module>")]
    ctx = [(TR, 61, "train_step")] + main
    src = {  # the source lines format_stack shows, per (file, line)
        (TR, 97): "main()", (TR, 88): "train_step(model, opt, x, y)", (TR, 61): "logits = model(x)",
        (TR, 62): "loss = F.cross_entropy(logits, y)",
        (SP + "torch/nn/modules/module.py", 1773): "return self._call_impl(*args, **kwargs)",
        (SP + "torch/nn/modules/module.py", 1784): "return forward_call(*args, **kwargs)",
        (MD, 21): "h = F.gelu(self.fc1(x))", (MD, 22): "h = F.gelu(self.fc2(h))", (MD, 23): "return self.head(h)",
        (SP + "torch/nn/modules/linear.py", 134): "return F.linear(input, self.weight, self.bias)",
        (SP + "torch/nn/functional.py", 3462): "return torch._C._nn.cross_entropy_loss(",
    }

    def fwd_strings(frames):
        """A fresh forward_frames list for one captured context: traceback.format_list lines
        (torch.fx.traceback.format_stack), outermost first; new str objects every time, as
        each context's std::vector<std::string> becomes new Python strings."""
        return ['  File "%s", line %d, in %s\n    %s\n' % (f, l, n, src[(f, l)]) for (f, l, n) in reversed(frames)]

    def py_stack(line, extra=()):
        """Python frames of a forward op inside model.py:line (innermost first)."""
        return list(extra) + [(MD, line, "forward"), M] + ctx

    lin = lambda line: py_stack(line, [(SP + "torch/nn/modules/linear.py", 134, "forward"), M])
    layers = [("fc1", 21, H), ("fc2", 22, H), ("head", 23, K)]
    mm_fwd = _op_frames("mm", "at::native::structured_mm_out_cuda::impl(at::Tensor const&, at::Tensor const&, at::Tensor const&)") + \
        [("??", 0, "at::_ops::matmul::call(at::Tensor const&, at::Tensor const&)"), ("??", 0, "at::_ops::linear::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)"),
         ("??", 0, "torch::autograd::THPVariable_linear(_object*, _object*, _object*)")]
    gelu_fwd = _op_frames("gelu", "at::native::structured_gelu_out_cuda::impl(at::Tensor const&, std::basic_string_view<char, std::char_traits<char> >, at::Tensor const&)") + \
        [("??", 0, "torch::autograd::THPVariable_gelu(_object*, _object*, _object*)")]
    ce_fwd = _op_frames("_log_softmax", "at::native::structured_log_softmax_cuda_out::impl(at::Tensor const&, long, bool, at::Tensor const&)") + \
        [("??", 0, "at::_ops::cross_entropy_loss::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, double)"),
         ("??", 0, "torch::autograd::THPVariable_cross_entropy_loss(_object*, _object*, _object*)")]
    ce_py = [(SP + "torch/nn/functional.py", 3462, "cross_entropy"), (TR, 62, "train_step")] + main

    def fwd_alloc(size, cpp_op, py, cat):
        return d.alloc(size, call(CPP_MALLOC_213, cpp_op, CPP_PY_313, py), cat)

    node_ops = {  # backward node -> its dispatcher frames (innermost first), under the node's apply
        "MmBackward0": _op_frames("mm", "at::native::structured_mm_out_cuda::impl(at::Tensor const&, at::Tensor const&, at::Tensor const&)") +
        [("??", 0, "torch::autograd::generated::details::mm_mat2_backward(at::Tensor const&, at::Tensor const&, c10::ArrayRef<long>, c10::ArrayRef<long>, c10::Layout, c10::Scalar const&)")],
        "GeluBackward0": _op_frames("gelu_backward", "at::native::structured_gelu_backward_out_cuda::impl(at::Tensor const&, at::Tensor const&, std::basic_string_view<char, std::char_traits<char> >, at::Tensor const&)"),
        "LogSoftmaxBackward0": _op_frames("_log_softmax_backward_data", "at::native::structured_log_softmax_backward_cuda_out::impl(at::Tensor const&, at::Tensor const&, long, c10::ScalarType, at::Tensor const&)"),
        "NllLossBackward0": _op_frames("nll_loss_backward", "at::native::structured_nll_loss_backward_out_cuda::impl(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, long, at::Tensor const&, at::Tensor const&)"),
    }

    def node_frames(node, kind="malloc"):
        apply = ("??", 0, "torch::autograd::generated::%s::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)" % node)
        if kind == "malloc":
            return call(CPP_MALLOC_213, node_ops[node], apply, CPP_ENGINE_213)
        return call(CPP_FREE_213, apply, CPP_ENGINE_213)

    records = []

    def bwd_alloc(size, node, fwd_py, cat, it):
        fwd_py = list(call(fwd_py))
        a = d.alloc(size, node_frames(node), cat, forward_frames=fwd_strings(fwd_py))
        i = len(d.trace) - 1
        user = next(f for f in fwd_py if "site-packages" not in f[0])
        records.append({"iteration": it, "index": i, "size": size, "node": node,
                        "forward_user_frame": "%s:%d:%s" % user,
                        "forward_innermost_frame": "%s:%d:%s" % fwd_py[0]})
        return a

    def bwd_free(addr, node, fwd_py):
        fwd_py = list(call(fwd_py))
        # a free inside a node's evaluation: the context is gathered there, so it carries the
        # node's forward traceback too (free_requested and free_completed share one context)
        d.free(addr, node_frames(node, "free"), extra=None)
        e_req, e_done = d.trace[-2], d.trace[-1]
        ff = fwd_strings(fwd_py)
        e_req["forward_frames"] = ff
        e_done["forward_frames"] = ff

    state = []
    for it in range(2):
        x = fwd_alloc(B * D * 4, _op_frames("to", "at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)"),
                      [(TR, 86, "main"), (TR, 97, "<module>")], "inputs")
        y = fwd_alloc(B * 8, _op_frames("to", "at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)"),
                      [(TR, 87, "main"), (TR, 97, "<module>")], "inputs")
        # forward (main thread, anomaly mode on): Linear (mm) + GELU twice, head, cross-entropy
        acts = []   # (addr, forward python stack, node that frees it)
        for name, line, out in layers:
            z = fwd_alloc(B * out * 4, mm_fwd, lin(line), "activations")
            acts.append((z, lin(line), "MmBackward0" if name == "head" else "GeluBackward0"))
            if name != "head":
                g = fwd_alloc(B * out * 4, gelu_fwd, py_stack(line), "activations")
                acts.append((g, py_stack(line), "MmBackward0"))
        logits = acts[-1][0]
        lsm = fwd_alloc(B * K * 4, ce_fwd, ce_py, "activations")
        loss = fwd_alloc(4, _op_frames("nll_loss_nd", "at::native::structured_nll_loss_forward_out_cuda::impl(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, long, at::Tensor const&, at::Tensor const&)") +
                         [("??", 0, "torch::autograd::THPVariable_cross_entropy_loss(_object*, _object*, _object*)")], ce_py, "activations")
        sn.tick(20_000)
        # backward on the autograd thread: C++ frames only, forward_frames of the node's forward
        g_loss = fwd_alloc(4, _op_frames("ones_like", "at::native::ones_like(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)"),
                           [(SP + "torch/autograd/__init__.py", 229, "_make_grads"), (SP + "torch/autograd/__init__.py", 350, "backward"),
                            (SP + "torch/_tensor.py", 647, "backward"), (TR, 63, "train_step")] + main, "autograd")
        g_nll = bwd_alloc(B * K * 4, "NllLossBackward0", ce_py, "autograd", it)
        bwd_free(g_loss, "NllLossBackward0", ce_py)
        g_lsm = bwd_alloc(B * K * 4, "LogSoftmaxBackward0", ce_py, "autograd", it)
        bwd_free(g_nll, "LogSoftmaxBackward0", ce_py)
        bwd_free(lsm, "LogSoftmaxBackward0", ce_py)
        grads = {}
        g_out = g_lsm
        inputs_of = [x] + [a for a, _, _ in acts[1::2]]     # the input of each Linear
        for li in reversed(range(len(layers))):
            name, line, out = layers[li]
            fpy = lin(line)
            if name != "head":
                # GeluBackward0: gradient w.r.t. the pre-activation
                gz = bwd_alloc(B * out * 4, "GeluBackward0", py_stack(line), "autograd", it)
                bwd_free(g_out, "GeluBackward0", py_stack(line))
                bwd_free(acts[2 * li][0], "GeluBackward0", py_stack(line))   # saved pre-activation
                g_out = gz
            # MmBackward0: grad of the weight (kept by AccumulateGrad) and of the input
            grads[li] = bwd_alloc(psizes[li], "MmBackward0", fpy, "gradients", it)
            if li > 0:
                gin = bwd_alloc(B * layers[li - 1][2] * 4, "MmBackward0", fpy, "autograd", it)
                bwd_free(g_out, "MmBackward0", fpy)
                g_out = gin
            else:
                bwd_free(g_out, "MmBackward0", fpy)
            if li > 0:
                bwd_free(inputs_of[li], "MmBackward0", fpy)    # the saved input (the GELU output)
        # logits (the head's output) is the user's tensor: dropped at the end of the step
        d.free(loss, call(CPP_FREE_213, CPP_PY_313, [(TR, 64, "train_step")] + main))
        d.free(logits, call(CPP_FREE_213, CPP_PY_313, [(TR, 64, "train_step")] + main))
        # AdamW (fused): state on the first step, then the step itself allocates nothing
        opt = [(SP + "torch/optim/optimizer.py", 516, "wrapper"), (TR, 65, "train_step")] + main
        if it == 0:
            for n in psizes:
                state.append(d.alloc(4, call(CPP_MALLOC_213, _op_frames("zeros", "at::native::zeros_symint(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)"),
                                             CPP_PY_313, (SP + "torch/optim/adamw.py", 178, "_init_group"), (SP + "torch/optim/adamw.py", 232, "step"), opt), "optimizer"))
                for line in (186, 190):
                    state.append(d.alloc(n, call(CPP_MALLOC_213, _op_frames("zeros_like", "at::native::zeros_like(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)"),
                                                     CPP_PY_313, (SP + "torch/optim/adamw.py", line, "_init_group"), (SP + "torch/optim/adamw.py", 232, "step"), opt), "optimizer"))
        zg = call(CPP_FREE_213, CPP_PY_313, (SP + "torch/optim/optimizer.py", 1004, "zero_grad"), (TR, 66, "train_step"), main)
        for li in range(len(layers)):
            d.free(grads[li], zg)
        d.free(x, call(CPP_FREE_213, CPP_PY_313, [(TR, 89, "main"), (TR, 97, "<module>")]))
        d.free(y, call(CPP_FREE_213, CPP_PY_313, [(TR, 89, "main"), (TR, 97, "<module>")]))
        sn.tick(50_000)
    info = {
        "what": "torch 2.13 with stacks='all' and anomaly mode on (torch.autograd.set_detect_anomaly(True)): "
                "two steps of a 3-layer MLP (Linear without bias + GELU, cross-entropy, fused AdamW). Forward "
                "allocations carry C++ frames (caching allocator, dispatcher, THPVariable_*) then Python "
                "frames; backward allocations and frees on the autograd thread carry only C++ frames "
                "(torch::autograd::generated::<Node>::apply, at::_ops::<op>::call, the engine's thread) "
                "and forward_frames: the forward traceback the node stored at creation, a list of "
                "traceback.format_list strings, outermost first",
        "layout": "torch 2.13 (Python path of _snapshot): entry keys action, addr, size, stream, time_us, compile_context, "
                  "user_metadata, pool_id, frames, forward_frames; host_segments/host_traces",
        "expect": {
            "iterations": 2,
            "forward_frames_format": "list of str: '  File \"<file>\", line <n>, in <function>\\n    <source>\\n', outermost first "
                                     "(traceback.format_list via torch.fx.traceback.format_stack), one fresh list per entry "
                                     "except free_requested/free_completed of one free, which share their context",
            "forward_frames_on": "alloc, free_requested and free_completed entries made while an autograd node runs "
                                 "(the engine's thread); never on forward or optimizer entries. The segment_alloc "
                                 "entries such allocs open are left without it here (the CPU build's sources do not "
                                 "show whether torch copies it there)",
            "forward_user_frame_rule": "the innermost frame of forward_frames outside site-packages",
            "backward_allocs": records,
        },
    }
    return sn, info


# =============================================================================================
# Fixture 14: stale_grads.pickle
# =============================================================================================
def fx_stale_grads():
    sn = Snap((2, 6), t0=1_734_000_000_000_000, context="all")
    d = sn.device(0, base=0x7F5A_0000_0000)
    SP = "/workspace/.venv/lib/python3.11/site-packages/"
    TR = "/workspace/ft/train.py"
    MD = "/workspace/ft/model.py"
    C, L, V, B, T = 2048, 4, 32000, 4, 1024
    tok = B * T
    sizes = lm_param_sizes(C, L, V)
    # recorded mid-training: weights, AdamW state and the previous step's gradients (made by
    # AccumulateGrad on the autograd thread before recording started) are live at the start
    d.recording = False
    params = [(d.alloc(n, (), "weights"), n) for n in sizes]
    state = [d.alloc(n, (), "optimizer") for n in sizes for _ in range(2)]
    grads = [d.alloc(n, (), "gradients") for n in sizes]
    d.start_recording()
    lm = LMStep(sn, d, SP, MD, C, L, V, params)
    lm.state, lm.grads = state, grads
    main = [(TR, 151, "main"), (TR, 160, "<module>")]
    site = lambda line: [(TR, line, "train")] + main
    zg_frame = (SP + "torch/optim/optimizer.py", 975, "zero_grad")
    iters, stale = [], []
    for it in range(3):
        start = len(d.trace)
        marks = [("inputs", start)]
        x = d.alloc(tok * 8, call(site(99)), "inputs")
        y = d.alloc(tok * 8, call(site(99)), "inputs")
        marks.append(("forward", len(d.trace)))
        st = lm.forward(tok, site(100), site(101))
        fwd_end = len(d.trace)
        # train.py:102  optimizer.zero_grad(set_to_none=True), right before loss.backward():
        # the previous step's gradients were live through this step's forward
        marks.append(("zero_grad", len(d.trace)))
        stale_grads = list(lm.grads)
        lm.zero_grad(site(102))
        stale.append({"iteration": it, "blocks": len(stale_grads), "bytes": sum(sizes),
                      "allocated_before_trace": it == 0,
                      "freed_index_range": [fwd_end, len(d.trace) - 1]})
        marks.append(("backward", len(d.trace)))
        g = lm.backward_start(st, site(103))
        lm.backward_rest(st, g)
        marks.append(("optimizer", len(d.trace)))
        lm.optimizer_step(site(104))
        d.free(st["loss"], call(site(105)))          # loss.item() logged, tensor dropped
        d.free(st["logits"], call(site(105)))
        d.free(x, call(site(105)))
        d.free(y, call(site(105)))
        iters.append({"iteration": it, "start_index": start, "end_index": len(d.trace) - 1,
                      "phases": _phase_ranges(marks, len(d.trace))})
        sn.tick(600_000)
    snap = sn.build()
    ref = reference(snap, 0)
    # the stale gradients of iterations 1 and 2 are the ones the previous backward made
    for k in (1, 2):
        lo = next(p["start_index"] for p in iters[k - 1]["phases"] if p["phase"] == "backward")
        hi = next(p["end_index"] for p in iters[k - 1]["phases"] if p["phase"] == "backward")
        stale[k]["allocated_index_range"] = [lo, hi]
    pk = ref["peak_index"]
    pk_it = next(i for i in iters if i["start_index"] <= pk <= i["end_index"])
    pk_phase = next(p["phase"] for p in pk_it["phases"] if p["start_index"] <= pk <= p["end_index"])
    assert pk_phase == "forward", pk_phase
    info = {
        "what": "a trace recorded mid-training (LM, 4 layers, d 2048, vocab 32000, AdamW): weights, AdamW "
                "state and the previous step's gradients are live before the trace began; the loop calls "
                "optimizer.zero_grad(set_to_none=True) only right before loss.backward() (train.py:102), so "
                "every step's forward runs with the previous step's gradients (one block per parameter, "
                "exactly its size) still live; zero_grad frees them (frames: torch/optim/optimizer.py "
                "zero_grad < train.py:102 train), backward makes new ones on the autograd thread (frames "
                "== []), the optimizer steps; 3 steps. The peak is at the end of a forward, with the "
                "stale gradients in it",
        "layout": "torch 2.6: time_us, allocator_settings, external_annotations (empty); stacks='python', context='all'",
        "expect": {
            "iterations": 3,
            "iteration_table": iters,
            "param_sizes": sizes,
            "stale_gradients": {
                "bytes": sum(sizes),
                "blocks_per_iteration": len(sizes),
                "live_through_phases": ["forward"],
                "note": "from the previous step's backward (before the trace for iteration 0) through the "
                        "previous optimizer step (where they are used) and this step's inputs and forward "
                        "(where they are stale), until zero_grad",
                "freed_by": {"filename": zg_frame[0], "line": zg_frame[1], "name": zg_frame[2],
                             "user_frame": "%s:%d:%s" % (TR, 102, "train")},
                "per_iteration": stale,
            },
            "peak": {"index": pk, "iteration": pk_it["iteration"], "phase": pk_phase,
                     "stale_gradient_bytes_live": sum(sizes)},
            "not_leaks": {"pre_trace_bytes": ref["start_bytes"]},
        },
    }
    return sn, info


# =============================================================================================
# Fixture 15: keep_loss.pickle
# =============================================================================================
KEEP_LOSS_SITE = ("/home/kim/exp/train.py", 180, "main")


def fx_keep_loss():
    sn = Snap((2, 6), t0=1_735_000_000_000_000, context="all")
    d = sn.device(0, base=0x7F62_0000_0000)
    SP = "/home/kim/.venv/lib/python3.12/site-packages/"
    TR = KEEP_LOSS_SITE[0]
    MD = "/home/kim/exp/model.py"
    C, L, V, B, T = 1024, 2, 32000, 4, 512
    tok = B * T
    d.recording = False
    params = [(d.alloc(n, (), "weights"), n) for n in lm_param_sizes(C, L, V)]
    d.start_recording()
    lm = LMStep(sn, d, SP, MD, C, L, V, params, M=module_call(SP, 1762, 1751))
    mod = [(TR, 201, "<module>")]
    at = lambda line: [(TR, line, "main")] + mod
    iters, ends, kept = [], [], []
    for it in range(6):
        start = len(d.trace)
        # train.py:180  loss = F.cross_entropy(model(batch["x"].cuda()), batch["y"].cuda())
        x = d.alloc(tok * 8, call(at(180)), "inputs")
        y = d.alloc(tok * 8, call(at(180)), "inputs")
        st = lm.forward(tok, at(180), at(180))
        # the bf16 logits are no tensor autograd keeps (the fp32 log-softmax is): dropped at the
        # end of the line
        d.free(st["logits"], call(at(180)))
        bwd = len(d.trace)
        # train.py:181  loss.backward(retain_graph=True): the graph keeps its saved tensors
        g = lm.backward_start(st, at(181))
        lm.backward_rest(st, g, free_saved=False)
        opt = len(d.trace)
        lm.optimizer_step(at(182))
        lm.zero_grad(at(183))
        # train.py:184  losses.append(loss)  (no .detach()): the loss keeps its graph, and with it
        # the embedding's indices (x), nll_loss's target (y) and every saved activation
        kept.append({"iteration": it, "addrs": [x, y] + st["saved"] + [st["lsm"], st["loss"]]})
        iters.append({"iteration": it, "start_index": start, "end_index": len(d.trace) - 1,
                      "phases": _phase_ranges([("forward", start), ("backward", bwd), ("optimizer", opt)], len(d.trace))})
        ends.append((len(d.trace) - 1, d.live_bytes()))
        sn.tick(300_000)
    snap = sn.build()
    trace = snap["device_traces"][0]
    # the kept allocations: the iteration's allocs still live at the end (optimizer state aside)
    last = {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc" or e["action"] in FREE_ACTIONS:
            last[e["addr"]] = i
    alive = {i for a, i in last.items() if trace[i]["action"] == "alloc"}
    by_cat, per_it_blocks, per_it_bytes = Counter(), [], []
    for k in kept:
        itd = iters[k["iteration"]]
        blocks = [i for i in sorted(alive) if itd["start_index"] <= i <= itd["end_index"] and d.cats[i] != "optimizer"]
        assert sorted(trace[i]["addr"] for i in blocks) == sorted(k["addrs"]), k["iteration"]
        per_it_blocks.append(len(blocks))
        per_it_bytes.append(sum(trace[i]["size"] for i in blocks))
        for i in blocks:
            assert KEEP_LOSS_SITE in [(f["filename"], f["line"], f["name"]) for f in trace[i]["frames"]]
            if k["iteration"] == 0:
                by_cat[d.cats[i]] += trace[i]["size"]
    assert len(set(per_it_bytes)) == 1 and len(set(per_it_blocks)) == 1
    growth = [b - a for (_, a), (_, b) in zip(ends, ends[1:])]
    assert set(growth) == {per_it_bytes[0]}, (growth, per_it_bytes)
    info = {
        "what": "6 iterations of a flat training loop in train.py main: line 180 computes the loss "
                "(model forward and cross-entropy), line 181 calls loss.backward(retain_graph=True), line 184 "
                "appends the loss to a list without .detach(): every step's loss keeps its autograd graph and "
                "the graph keeps its saved tensors (activations, the fp32 log-softmax, and the batch: the "
                "embedding saves its indices, nll_loss its target), so live memory grows by the same bytes "
                "every iteration; not leaks: one-time AdamW state, weights from before the trace",
        "layout": "torch 2.6: time_us, allocator_settings, external_annotations (empty); stacks='python', context='all'",
        "expect": {
            "iterations": 6,
            "iteration_table": iters,
            "iteration_end_index": [i for i, _ in ends],
            "live_bytes_at_iteration_end": [b for _, b in ends],
            "leaks": [{"filename": KEEP_LOSS_SITE[0], "line": KEEP_LOSS_SITE[1], "name": KEEP_LOSS_SITE[2],
                       "categories": sorted(by_cat),
                       "bytes_by_category_per_iteration": dict(sorted(by_cat.items())),
                       "blocks_per_iteration": per_it_blocks[0],
                       "bytes_per_iteration": per_it_bytes[0],
                       "blocks": sum(per_it_blocks), "bytes": sum(per_it_bytes),
                       "kept_by": {"filename": TR, "line": 184, "code": "losses.append(loss)"},
                       "retain_graph": True,
                       "note": "every leaked block's stack contains train.py:180 main (the line that builds "
                               "the loss); without retain_graph=True backward would free the saved tensors "
                               "and only the 4-byte losses would stay"}],
            "not_leaks": {"optimizer_state_bytes": sum(2 * n for _, n in params),
                          "pre_trace_bytes": sum(n for _, n in params)},
        },
    }
    return sn, info


# =============================================================================================
# Fixture 16: multi_device_oom.pickle
# =============================================================================================
MDO_CAPACITY_1 = 2_000_000_000     # GPU 1 is shared with another job: little is left for us


def fx_multi_device_oom(capacity1=MDO_CAPACITY_1):
    sn = Snap((2, 6), t0=1_736_000_000_000_000, context="all")
    SP = "/opt/conda/lib/python3.11/site-packages/"
    PY = "/opt/conda/lib/python3.11/"
    TR = "/home/lab/dp/train_dp.py"
    MD = "/home/lab/dp/model.py"
    C, L, V, B = 2048, 2, 32000, 4               # B: micro-batch per device
    seqs = [1024, 2048]
    sizes = lm_param_sizes(C, L, V)
    devs = [sn.device(0, base=0x7F10_0000_0000), sn.device(1, base=0x7F30_0000_0000, capacity=capacity1),
            sn.device(2, base=0x7F50_0000_0000)]
    d0 = devs[0]
    d0.recording = False
    params0 = [(d0.alloc(n, (), "weights"), n) for n in sizes]
    for dv in devs:
        dv.start_recording()
    main = [(TR, 77, "main"), (TR, 95, "<module>")]
    M = module_call(SP)
    dp = [(SP + "torch/nn/parallel/data_parallel.py", 193, "forward"), M, (TR, 58, "train_step")] + main
    replicate = call((SP + "torch/cuda/comm.py", 67, "broadcast_coalesced"),
                     (SP + "torch/nn/parallel/_functions.py", 23, "forward"),
                     (SP + "torch/autograd/function.py", 575, "apply"),
                     (SP + "torch/nn/parallel/replicate.py", 69, "_broadcast_coalesced_reshape"),
                     (SP + "torch/nn/parallel/replicate.py", 119, "replicate"),
                     (SP + "torch/nn/parallel/data_parallel.py", 200, "replicate"), dp)
    scatter = call((SP + "torch/cuda/comm.py", 205, "scatter"), (SP + "torch/nn/parallel/_functions.py", 107, "forward"),
                   (SP + "torch/autograd/function.py", 575, "apply"), (SP + "torch/nn/parallel/scatter_gather.py", 38, "scatter_map"),
                   (SP + "torch/nn/parallel/scatter_gather.py", 64, "scatter"), (SP + "torch/nn/parallel/data_parallel.py", 207, "scatter"), dp)
    gather = call((SP + "torch/cuda/comm.py", 240, "gather"), (SP + "torch/nn/parallel/_functions.py", 75, "forward"),
                  (SP + "torch/autograd/function.py", 575, "apply"), (SP + "torch/nn/parallel/scatter_gather.py", 95, "gather_map"),
                  (SP + "torch/nn/parallel/scatter_gather.py", 107, "gather"), (SP + "torch/nn/parallel/data_parallel.py", 213, "gather"), dp)
    worker = [(SP + "torch/nn/parallel/parallel_apply.py", 83, "_worker"), (PY + "threading.py", 1012, "run"),
              (PY + "threading.py", 1075, "_bootstrap_inner"), (PY + "threading.py", 1032, "_bootstrap")]
    lm0 = LMStep(sn, d0, SP, MD, C, L, V, params0, M=M)
    oom = None
    iters = []
    for it, T in enumerate(seqs):
        tok = B * T
        start = [len(dv.trace) for dv in devs]
        x = d0.alloc(3 * tok * 8, call((TR, 55, "train_step"), main), "inputs")
        y = d0.alloc(3 * tok * 8, call((TR, 56, "train_step"), main), "inputs")
        try:
            # DataParallel.forward: replicas of every parameter on devices 1 and 2 (device 0's
            # replica is the module itself), the batch scattered, the replicas' forwards run in
            # threads (their allocations interleave), the outputs gathered on device 0
            reps = {0: params0}
            for k in (1, 2):
                reps[k] = [(devs[k].alloc(n, replicate, "weights"), n) for n in sizes]
            xs = {0: None}
            for k in (1, 2):
                xs[k] = devs[k].alloc(tok * 8, scatter, "inputs")
            lms = {k: (lm0 if k == 0 else LMStep(sn, devs[k], SP, MD, C, L, V, reps[k], M=M)) for k in range(3)}
            sts = {k: {} for k in range(3)}
            gens = [lms[k].model_forward_steps(tok, worker, sts[k]) for k in range(3)]
            live_gens = list(gens)
            while live_gens:
                for g_ in list(live_gens):
                    try:
                        next(g_)
                    except StopIteration:
                        live_gens.remove(g_)
        except OutOfMemory:
            oom = next((k, i) for k, dv in enumerate(devs) for i in range(len(dv.trace))
                       if dv.trace[i]["action"] == "oom")
            iters.append({"iteration": it, "seq_len": T, "start_index_per_device": start,
                          "end_index_per_device": [len(dv.trace) - 1 for dv in devs]})
            break
        logits = d0.alloc(3 * tok * V * 2, gather, "activations")
        for k in range(3):
            (devs[k]).free(sts[k]["logits"], ())     # gathered: the replicas' outputs are released
        st0 = {"tok": 3 * tok}
        lm0.loss(st0, [(TR, 59, "train_step")] + main)
        # backward: device 0's autograd thread from the loss, then Gather's backward scatters the
        # logits' gradient to every device, whose threads run their replica's backward
        g = lm0.backward_start(st0, [(TR, 60, "train_step")] + main)
        d0.free(st0["lsm"], ())
        g_logits = {k: devs[k].alloc(tok * V * 2, (), "autograd") for k in range(3)}
        d0.free(g, ())
        d0.free(st0["grad_loss"], ())
        d0.free(logits, ())
        gens = [lms[k].backward_layer_steps(sts[k], g_logits[k], True, "autograd") for k in range(3)]
        while gens:
            for g_ in list(gens):
                try:
                    next(g_)
                except StopIteration:
                    gens.remove(g_)
        # Broadcast's backward (ReduceAddCoalesced): every parameter's gradient summed on device 0
        reduce = call((SP + "torch/cuda/comm.py", 130, "reduce_add_coalesced"), (SP + "torch/nn/parallel/_functions.py", 46, "backward"),
                      (SP + "torch/autograd/function.py", 307, "apply"))
        grads0 = [d0.alloc(n, reduce, "gradients") for n in sizes]
        for k in range(3):
            for gr in lms[k].grads:
                devs[k].free(gr, ())
            lms[k].grads = []
        for k in (1, 2):
            for a, _ in reps[k]:
                devs[k].free(a, ())
            devs[k].free(xs[k], ())
        lm0.grads = grads0
        lm0.optimizer_step([(TR, 61, "train_step")] + main)
        lm0.zero_grad([(TR, 62, "train_step")] + main)
        d0.free(st0["loss"], call((TR, 63, "train_step"), main))
        d0.free(x, call((TR, 63, "train_step"), main))
        d0.free(y, call((TR, 63, "train_step"), main))
        iters.append({"iteration": it, "seq_len": T, "start_index_per_device": start,
                      "end_index_per_device": [len(dv.trace) - 1 for dv in devs]})
        sn.tick(500_000)
    else:
        raise AssertionError("multi_device_oom.pickle: device 1 did not run out of memory")
    assert oom is not None and oom[0] == 1, oom
    snap = sn.build(ndevices=3)
    refs = {r["device"]: r for r in reference_all(snap)}
    peaks = {str(k): refs[k]["peak_bytes"] for k in range(3)}
    assert max(range(3), key=lambda k: refs[k]["peak_bytes"]) == 0
    assert refs[1]["ooms"] and not refs[0]["ooms"] and not refs[2]["ooms"]
    info = {
        "what": "nn.DataParallel over 3 GPUs in one process (LM, 2 layers, d 2048, vocab 32000, micro-batch 4 per "
                "device): device 0 holds the module, the gathered logits, the loss, the summed gradients and the "
                "AdamW state (highest peak); devices 1 and 2 get parameter replicas (replicate.py / "
                "comm.broadcast_coalesced) and scattered inputs each step, their forwards run in "
                "parallel_apply threads (allocations interleaved across devices); GPU 1 is shared with another "
                "job (2 GB left for the allocator) and runs out of memory in the second step's forward "
                "(sequence length 2048 after 1024); the trace ends there",
        "layout": "torch 2.6: time_us, allocator_settings, external_annotations (empty); stacks='python', context='all'",
        "expect": {
            "devices": [0, 1, 2],
            "peaks": peaks,
            "peak_index": {str(k): refs[k]["peak_index"] for k in range(3)},
            "oom_device": 1,
            "highest_peak_device": 0,
            "oom": {"device": 1, "index": oom[1], "iteration": 1, "phase": "forward",
                    "requested": snap["device_traces"][1][oom[1]]["size"]},
            # steps started, not `iterations`: the second one is cut short in its forward by the
            # OOM, and on device 0 it is no more than a partial forward
            "steps": 2,
            "step_table": iters,
        },
    }
    return sn, info, snap


# =============================================================================================
# The newest torch (2.14 and main): issue 25's fixtures
# =============================================================================================
# Where each layout comes from (docs/format.md says the same, field by field):
#   * annotate entries, pinned host memory, user_metadata/internal_metadata, FX frames: torch
#     2.14.1's torch/cuda/memory.py and torch/_utils.py (`_augment_frames`), and the dict keys
#     and their order in 2.14.1's THCPModule_memorySnapshot (torch/csrc/cuda/Module.cpp, read
#     from the compiled libtorch_python.so: the C++ source of 2.14/main is not in any source we
#     could see); internal_metadata from pytorch #193432 (main);
#   * skip_actions: torch 2.13/2.14 _record_memory_history (the actions are never recorded).
COMPONENT_NOTE = (
    "UNVERIFIED: where torch main writes an allocation's component type in a snapshot could "
    "not be read from its source (memory_component_tracker.py, pytorch #182388, is all we "
    "saw: it stamps each allocation with a component type and sets user_metadata to the "
    "module's qualified name); this fixture writes `component_type` with the lower-case names "
    "of memory_stats()' component_bytes.<name> keys (#182387) on trace entries (the stamp at "
    "the event) and on live blocks (the tag now, after _tag_block re-tags by pointer)")


class HostDev:
    """torch 2.14's pinned host allocator (at::CachingHostAllocatorImpl with #182407's
    recording): every request rounded up to a power of two, one block per segment (it never
    splits), freed blocks cached by size and reused, cudaFreeHost only on empty_cache.
    Entries have the device entries' layout (the same conversion in Module.cpp) with
    user_metadata '' (2.14's _set_memory_metadata docstring: 'not on pinned host-memory
    allocations'); host segments are written with device -1, stream 0, segment_type 'small',
    one block whose requested_size is its size."""

    def __init__(self, snap, base):
        self.snap = snap
        self.trace = []
        self.blocks = {}            # addr -> [size, state, frames]
        self.cached = {}            # size -> [addr]
        self.next_addr = base

    def entry(self, action, addr, size, frames):
        sn = self.snap
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": sn.tick(11),
             "compile_context": "N/A", "user_metadata": "", "pool_id": (0, 0)}
        if frames is not None:
            e["frames"] = frames
        self.trace.append(e)

    def alloc(self, size, stack):
        frames = self.snap.tb(stack)
        rsize = 1 << max(0, (size - 1).bit_length())
        if self.cached.get(rsize):
            addr = self.cached[rsize].pop()
        else:
            addr = self.next_addr
            self.next_addr += max(rsize, 4096)
            self.entry("segment_alloc", addr, rsize, frames)
        self.blocks[addr] = [rsize, "active_allocated", frames]
        self.entry("alloc", addr, rsize, frames)
        return addr

    def free(self, addr, stack):
        b = self.blocks[addr]
        frames = self.snap.tb(stack)
        self.entry("free_requested", addr, b[0], frames)
        self.entry("free_completed", addr, b[0], frames)
        b[1], b[2] = "inactive", self.snap.empty
        self.cached.setdefault(b[0], []).append(addr)

    def empty_cache(self, stack):
        frames = self.snap.tb(stack)
        for size, addrs in sorted(self.cached.items()):
            for addr in addrs:
                self.entry("segment_free", addr, size, frames)
                del self.blocks[addr]
        self.cached = {}

    def live_bytes(self):
        return sum(b[0] for b in self.blocks.values() if b[1] == "active_allocated")

    def segment_dicts(self):
        out = []
        for addr, (size, state, frames) in sorted(self.blocks.items()):
            live = state == "active_allocated"
            d = {"device": -1, "address": addr, "total_size": size, "allocated_size": size if live else 0,
                 "active_size": size if live else 0, "requested_size": size, "stream": 0,
                 "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False}
            block = {"address": addr, "size": size, "requested_size": size, "state": state}
            if live:        # a captured context: its frames key is added last (py_symbolize)
                block["frames"] = frames
                d["blocks"] = [block]
                d["frames"] = frames
            else:
                block["frames"] = self.snap.empty
                d["frames"] = self.snap.empty
                d["blocks"] = [block]
            out.append(d)
        return out


def _tiny_lm(sn, d, SP, MD, C=256, L=2, V=8192):
    """Weights of a tiny LM allocated before recording begins, and its LMStep."""
    d.recording = False
    params = [(d.alloc(n, (), "weights"), n) for n in lm_param_sizes(C, L, V)]
    d.start_recording()
    return LMStep(sn, d, SP, MD, C, L, V, params)


# =============================================================================================
# Fixture: component_tracking.pickle (torch main, component tracking)
# =============================================================================================
def fx_component_tracking():
    sn = Snap((2, 15), t0=1_790_000_000_000_000, context="all")
    d = sn.device(0, base=0x7A00_0000_0000)
    SP = "/home/kim/.venv/lib/python3.12/site-packages/"
    TR = "/home/kim/lm/train.py"
    MD = "/home/kim/lm/model.py"
    C, L, V, B, T = 256, 2, 8192, 4, 256
    tok = B * T
    main = [(TR, 88, "main"), (TR, 99, "<module>")]
    step = lambda line: [(TR, line, "train_step")] + main
    # component_tracking.enable() before the model is built: its weights are stamped 'other'
    # at allocation; the first forward re-tags them by pointer (_tag_block PARAMETER)
    sn.component, sn.user_metadata = "other", ""
    params = [(d.alloc(n, call((SP + "torch/nn/modules/linear.py", 106, "__init__"), (MD, 70, "__init__"),
                                 (TR, 80, "main"), (TR, 99, "<module>")), "weights"), n)
              for n in lm_param_sizes(C, L, V)]
    lm = LMStep(sn, d, SP, MD, C, L, V, params)
    for it in range(3):
        sn.component, sn.user_metadata = "other", ""
        x = d.alloc(tok * 8, call((TR, 60, "train_step"), main), "inputs")
        y = d.alloc(tok * 8, call((TR, 61, "train_step"), main), "inputs")
        st = {}
        fwd = lm.model_forward_steps(tok, step(63), st)
        sn.component, sn.user_metadata = "activation", "embed"
        next(fwd)
        if it == 0:
            for p, _ in params:
                d.tag(p, "parameter")
        for layer in range(L):
            sn.user_metadata = "layers.%d" % layer
            if it == 0 and layer == 0:
                # a rotary cache built lazily in the first forward and registered as a buffer:
                # stamped 'activation', re-tagged 'buffer' by pointer on the next forward
                rope = d.alloc(T * C * 4, call((MD, 35, "_rope_cache"), (MD, 44, "forward"), lm.M, (MD, 53, "forward"),
                                               lm.M, (MD, 86, "forward"), lm.M, (MD, 88, "forward"), lm.M, step(63)),
                               "weights")
            next(fwd)
        if it == 1:
            d.tag(rope, "buffer")
        sn.user_metadata = "lm_head"
        for _ in fwd:
            pass
        sn.component, sn.user_metadata = "other", ""          # the loss, between modules
        lm.loss(st, step(64))
        g = lm.backward_start(st, step(65))
        sn.component, sn.user_metadata = "temp", "lm_head"
        d.free(st["lsm"], ())
        g2 = d.alloc(tok * V * 2, (), "autograd")
        d.free(g, ())
        d.free(st["grad_loss"], ())
        bw = lm.backward_layer_steps(st, g2)
        next(bw)
        for layer in reversed(range(L)):
            sn.user_metadata = "layers.%d" % layer
            next(bw)
        sn.user_metadata = "embed"
        for _ in bw:
            pass
        for pi, gaddr in enumerate(lm.grads):      # post-accumulate-grad hooks: _tag_block GRADIENT
            d.tag(gaddr, "gradient")
        sn.component, sn.user_metadata = "optimizer_state", "optimizer"
        lm.optimizer_step(step(66))
        sn.component, sn.user_metadata = "other", ""
        if it < 2:
            lm.zero_grad(step(67))
        d.free(st["loss"], call((TR, 68, "train_step"), main))
        d.free(st["logits"], call((TR, 68, "train_step"), main))
        d.free(x, call((TR, 68, "train_step"), main))
        d.free(y, call((TR, 68, "train_step"), main))
        sn.tick(300_000)
    info = {
        "what": "three steps of a tiny LM (2 layers, d 256, vocab 8192, AdamW) recorded with "
                "torch.accelerator.memory.component_tracking enabled before the model was built: "
                "every entry carries the thread's component type (other / activation / temp / "
                "optimizer_state) and user_metadata is the module's qualified name (embed, layers.0, "
                "layers.1, lm_head), 'optimizer' inside optimizer.step(), '' between modules; weights "
                "re-tagged parameter, a rotary cache made in the first forward re-tagged buffer, and the "
                "last step's gradients gradient by pointer (on their blocks); "
                "the snapshot is taken before the last zero_grad",
        "layout": "torch main (2.15 dev): 2.14 entry keys plus component_type; " + COMPONENT_NOTE,
        "expect": {"modules": ["embed", "layers.0", "layers.1", "lm_head"],
                   "precise_tags": ["parameter", "buffer", "gradient"], "coarse_tags": ["activation", "temp",
                                                                              "optimizer_state", "other"]},
    }
    return sn, info


# =============================================================================================
# Fixture: metadata_annotate.pickle (2.14 annotate action; main's dict user_metadata and
# internal_metadata)
# =============================================================================================
def fx_metadata_annotate():
    sn = Snap((2, 15), t0=1_791_000_000_000_000, context="all")
    d = sn.device(0, base=0x7B00_0000_0000)
    SP = "/opt/conda/lib/python3.12/site-packages/"
    TR = "/work/rl/train.py"
    MD = "/work/rl/model.py"
    C, L, V, B, T = 256, 2, 8192, 2, 256
    tok = B * T
    lm = _tiny_lm(sn, d, SP, MD, C, L, V)
    main = [(TR, 140, "main"), (TR, 150, "<module>")]
    step = lambda line: [(TR, line, "train_step")] + main
    notes = []
    for it in range(3):
        # _set_memory_metadata({"step": it, "phase": ...}) stamps compact JSON on every entry
        sn.user_metadata = json.dumps({"step": 12 + it, "phase": "forward"}, separators=(",", ":"))
        x = d.alloc(tok * 8, call((TR, 120, "train_step"), main), "inputs")
        st = lm.forward(tok, step(122), step(123))
        # _annotate_tensor(logits, ...) after the fact: an 'annotate' entry at the logits'
        # base address, the note as its user_metadata, the annotation site's frames
        sz = d.by_addr[st["logits"]].req
        d.entry("annotate", st["logits"], sz, 0, sn.tb(call((SP + "torch/cuda/memory.py", 1325, "_annotate_memory"),
                                                            (SP + "torch/cuda/memory.py", 1346, "_annotate_tensor"),
                                                            (TR, 124, "train_step"), main)),
                extra=None)
        d.trace[-1]["user_metadata"] = "kept for the eval logger"
        notes.append(len(d.trace) - 1)
        sn.user_metadata = json.dumps({"step": 12 + it, "phase": "backward"}, separators=(",", ":"))
        g = lm.backward_start(st, step(125))
        lm.backward_rest(st, g)
        sn.user_metadata = json.dumps({"step": 12 + it, "phase": "optimizer"}, separators=(",", ":"))
        lm.optimizer_step(step(126))
        lm.zero_grad(step(127))
        # the allocator's own tag (mallocWithAddress's prefix block, #193432) on one pair
        t = d.alloc(64 * KiB, call((SP + "torch/cuda/memory.py", 980, "_with_address"), step(128)), "temporary",
                    extra={"internal_metadata": "mallocWithAddress"} if it == 1 else None)
        d.free(t, call((SP + "torch/cuda/memory.py", 982, "_with_address"), step(128)),
               extra={"internal_metadata": "mallocWithAddress"} if it == 1 else None)
        d.free(st["loss"], call((TR, 130, "train_step"), main))
        if it < 2:
            d.free(st["logits"], call((TR, 131, "train_step"), main))
        d.free(x, call((TR, 131, "train_step"), main))
        sn.tick(200_000)
    sn.user_metadata = "eval"       # a plain string: 2.10-2.14 files only have those
    e = d.alloc(2 * MiB, call((TR, 145, "evaluate"), main), "activations")
    sn.user_metadata = ""
    info = {
        "what": "three steps of a tiny LM with _set_memory_metadata(dict) per phase (user_metadata is "
                "compact JSON: {\"step\":12,\"phase\":\"forward\"} ...), an annotate entry per step on the "
                "logits (_annotate_tensor: the note in user_metadata, the annotation site's frames), the "
                "last step's logits still live and annotated, internal_metadata 'mallocWithAddress' on one "
                "alloc/free pair, a plain-string user_metadata 'eval' at the end",
        "layout": "torch main (2.15 dev): entry keys action, addr, size, stream, time_us, compile_context, "
                  "user_metadata, internal_metadata (only when non-empty, #193432), pool_id, frames; annotate "
                  "(2.14, #190575): addr = the allocation's base address, size its size, user_metadata the note",
        "expect": {"annotate_indices": notes, "steps": [12, 13, 14],
                   "internal_metadata": "mallocWithAddress", "live_annotated_logits": st["logits"], "eval": e},
    }
    return sn, info


# =============================================================================================
# Fixture: host_pinned.pickle (2.14 record_pinned_host_memory)
# =============================================================================================
def fx_host_pinned():
    sn = Snap((2, 14), t0=1_789_000_000_000_000, context="all")
    d = sn.device(0, base=0x7C00_0000_0000)
    h = sn.host = HostDev(sn, base=0x7F00_1000_0000)
    SP = "/usr/local/lib/python3.12/site-packages/"
    TR = "/srv/train/loop.py"
    MD = "/srv/train/model.py"
    C, L, V, B, T = 256, 2, 8192, 4, 256
    tok = B * T
    lm = _tiny_lm(sn, d, SP, MD, C, L, V)
    main = [(TR, 70, "main"), (TR, 80, "<module>")]
    step = lambda line: [(TR, line, "train_step")] + main
    pin = lambda line: call((SP + "torch/utils/data/_utils/pin_memory.py", 62, "pin_memory"),
                            (SP + "torch/utils/data/dataloader.py", 1402, "_next_data"), (TR, line, "main"),
                            (TR, 80, "<module>"))
    host_peak = 0
    for it in range(3):
        # the DataLoader pins each batch (two pinned buffers of the next batch in flight)
        hx = h.alloc(tok * 8 + 1000, pin(50))
        hy = h.alloc(tok * 8 + 1000, pin(50))
        host_peak = max(host_peak, h.live_bytes())
        x = d.alloc(tok * 8, call((TR, 52, "main"), (TR, 80, "<module>")), "inputs")
        y = d.alloc(tok * 8, call((TR, 53, "main"), (TR, 80, "<module>")), "inputs")
        h.free(hx, pin(54))
        h.free(hy, pin(54))
        st = lm.forward(tok, step(56), step(57))
        g = lm.backward_start(st, step(58))
        lm.backward_rest(st, g)
        lm.optimizer_step(step(59))
        lm.zero_grad(step(60))
        # the loss copied to a pinned buffer for logging
        hl = h.alloc(4, call((SP + "torch/_tensor.py", 1120, "to"), (TR, 61, "main"), (TR, 80, "<module>")))
        host_peak = max(host_peak, h.live_bytes())
        d.free(st["loss"], call((TR, 62, "main"), (TR, 80, "<module>")))
        d.free(st["logits"], call((TR, 62, "main"), (TR, 80, "<module>")))
        d.free(x, call((TR, 62, "main"), (TR, 80, "<module>")))
        d.free(y, call((TR, 62, "main"), (TR, 80, "<module>")))
        if it < 2:
            h.free(hl, call((TR, 63, "main"), (TR, 80, "<module>")))
        sn.tick(250_000)
    # a large pinned staging buffer for a checkpoint, freed and released by empty_cache
    ck = h.alloc(48 * MiB, call((SP + "torch/serialization.py", 880, "_save"), (TR, 66, "main"), (TR, 80, "<module>")))
    host_peak = max(host_peak, h.live_bytes())
    h.free(ck, call((TR, 67, "main"), (TR, 80, "<module>")))
    h.empty_cache(call((SP + "torch/cuda/memory.py", 230, "empty_cache"), (TR, 68, "main"), (TR, 80, "<module>")))
    info = {
        "what": "three training steps with a DataLoader pinning every batch (record_pinned_host_memory=True): "
                "host_traces and host_segments beside the GPU's trace; a 64 MiB (48 MiB rounded to a power "
                "of two) pinned checkpoint buffer at the end, freed and released by empty_cache; one small "
                "pinned loss buffer still live",
        "layout": "torch 2.14 (Python path of _snapshot): host_segments: segments with device -1, stream 0, "
                  "segment_type 'small', one block each, requested_size = size (Module.cpp of 2.14.1); "
                  "host_traces: ONE flat list of entries in the device entries' layout, sizes rounded to a "
                  "power of two",
        "expect": {"host_peak_bytes": host_peak, "host_end_bytes": h.live_bytes(),
                   "host_entries": len(h.trace)},
    }
    return sn, info


# =============================================================================================
# Fixture: fx_frames.pickle (_snapshot(augment_with_fx_traces=True))
# =============================================================================================
FX_FILE = "fx_generated__1f3a9c2e8b7d4a60.py"


def fx_fx_frames():
    sn = Snap((2, 14), t0=1_788_000_000_000_000, context="all")
    d = sn.device(0, base=0x7D80_0000_0000)
    SP = "/home/li/.venv/lib/python3.12/site-packages/"
    TR = "/home/li/proj/run.py"
    MD = "/home/li/proj/net.py"
    d.recording = False
    w = [d.alloc(n, (), "weights") for n in (4 * MiB, 16 * KiB, 4 * MiB, 16 * KiB)]
    d.start_recording()
    main = [(TR, 40, "main"), (TR, 52, "<module>")]
    gm = [(SP + "torch/fx/graph_module.py", 387, "__call__"), (SP + "torch/fx/graph_module.py", 848, "call_wrapped"),
          (SP + "torch/nn/modules/module.py", 1784, "_call_impl"), (SP + "torch/nn/modules/module.py", 1773,
                                                                     "_wrapped_call_impl"), (TR, 31, "step")] + main
    # the generated forward's lines, and the FX node each runs (torch.fx.graph_module
    # _lineno_map): augmentation adds fx_* to these frame dicts, in place (shared by every stack)
    nodes = {
        10: ("call_function", "linear", "<built-in function linear>",
             [(MD, 24, "forward", "h = self.fc1(x)"), (SP + "torch/nn/modules/linear.py", 125, "forward",
                                                        "return F.linear(input, self.weight, self.bias)")]),
        11: ("call_function", "relu", "<built-in method relu of type object>",
             [(MD, 25, "forward", "h = torch.relu(h)")]),
        12: ("call_function", "linear_1", "<built-in function linear>",
             [(MD, 26, "forward", "return self.fc2(h)"), (SP + "torch/nn/modules/linear.py", 125, "forward",
                                                           "return F.linear(input, self.weight, self.bias)")]),
        13: ("output", "output", "output", None),
    }
    for line, (op, name, target, orig) in nodes.items():
        f = sn.frame(FX_FILE, line, "forward")
        f["fx_node_op"] = op
        f["fx_node_name"] = name
        f["fx_node_target"] = target
        if orig:
            f["fx_original_trace"] = "".join('  File "%s", line %d, in %s\n    %s\n' % fr for fr in orig)
    rows = 512
    for it in range(3):
        x = d.alloc(rows * 1024 * 4, call((TR, 29, "step"), main), "inputs")
        h = d.alloc(rows * 1024 * 4, call((FX_FILE, 10, "forward"), gm), "activations")
        r = d.alloc(rows * 1024 * 4, call((FX_FILE, 11, "forward"), gm), "activations")
        d.free(h, call((FX_FILE, 11, "forward"), gm))
        out = d.alloc(rows * 1024 * 4, call((FX_FILE, 12, "forward"), gm), "activations")
        d.free(r, call((FX_FILE, 13, "forward"), gm))
        d.free(x, call((TR, 33, "step"), main))
        if it < 2:
            d.free(out, call((TR, 34, "step"), main))
        sn.tick(100_000)
    info = {
        "what": "an FX GraphModule (Linear, relu, Linear) run three times, snapshot taken with "
                "_snapshot(augment_with_fx_traces=True): the frames of the generated forward (%s) carry "
                "fx_node_op, fx_node_name, fx_node_target and, except the output node, fx_original_trace "
                "(the node's stack_trace: the model's net.py lines); inference only, the last output kept" % FX_FILE,
        "layout": "torch 2.14 (torch/_utils.py _augment_frames): frame dicts {name, filename, line, fx_node_op, "
                  "fx_node_name, fx_node_target[, fx_original_trace]}; the generated file is "
                  "fx_generated__<hash>.py (torch/fx/graph_module.py FX_GRAPH_MODULE_FILE_PREFIX)",
        "expect": {"original_user_frames": {"linear": [MD, 24], "relu": [MD, 25], "linear_1": [MD, 26]},
                   "generated_file": FX_FILE},
    }
    return sn, info


# =============================================================================================
# Fixture: skip_actions.pickle (_record_memory_history(skip_actions=[...]))
# =============================================================================================
SKIPPED = ("free_requested", "segment_alloc", "segment_free")


def fx_skip_actions():
    sn = Snap((2, 14), t0=1_787_000_000_000_000, context="all")
    sn.skip_actions = SKIPPED
    d = sn.device(0, base=0x7D40_0000_0000)
    SP = "/home/oz/.venv/lib/python3.12/site-packages/"
    TR = "/home/oz/exp/train.py"
    MD = "/home/oz/exp/model.py"
    C, L, V, B, T = 256, 2, 8192, 4, 256
    tok = B * T
    lm = _tiny_lm(sn, d, SP, MD, C, L, V)
    main = [(TR, 30, "main"), (TR, 40, "<module>")]
    step = lambda line: [(TR, line, "train_step")] + main
    for it in range(3):
        x = d.alloc(tok * 8, call((TR, 11, "train_step"), main), "inputs")
        st = lm.forward(tok, step(12), step(13))
        g = lm.backward_start(st, step(14))
        lm.backward_rest(st, g)
        lm.optimizer_step(step(15))
        lm.zero_grad(step(16))
        for k in ("loss", "logits"):
            d.free(st[k], call((TR, 17, "train_step"), main))
        d.free(x, call((TR, 17, "train_step"), main))
        if it == 1:
            # empty_cache(): segments released (their segment_free entries are skipped too)
            d.release(call((SP + "torch/cuda/memory.py", 230, "empty_cache"), (TR, 19, "train_step"), main))
        sn.tick(300_000)
    info = {
        "what": "three steps of a tiny LM recorded with skip_actions=%s: frees appear only as "
                "free_completed, and no segment event is recorded although segments were allocated and "
                "one empty_cache() released some (allocations in the trace lie in segments the snapshot "
                "no longer has)" % list(SKIPPED),
        "layout": "torch 2.14 (Python path of _snapshot), _record_memory_history(skip_actions=%s)" % list(SKIPPED),
        "expect": {"skipped": list(SKIPPED)},
    }
    return sn, info


# =============================================================================================
# Driver
# =============================================================================================
FIXTURES = [
    ("oom.pickle", fx_oom),
    ("expandable.pickle", fx_expandable),
    ("qlora_4bit.pickle", fx_qlora_4bit),
    ("backward_thread.pickle", fx_backward_thread),
    ("torch20_history.pickle", fx_torch20),
    ("multi_device.pickle", fx_multi_device),
    ("annotated_210.pickle", fx_annotated),
    ("protocol2.pickle", fx_protocol2),
    ("bare_list.pickle", fx_bare_list),
    ("leak.pickle", lambda: fx_loop(True)),
    ("clean_loop.pickle", lambda: fx_loop(False)),
    ("oom_step3.pickle", fx_oom_step3),
    ("forward_frames_213.pickle", fx_forward_frames_213),
    ("stale_grads.pickle", fx_stale_grads),
    ("keep_loss.pickle", fx_keep_loss),
    ("multi_device_oom.pickle", fx_multi_device_oom),
    ("component_tracking.pickle", fx_component_tracking),
    ("metadata_annotate.pickle", fx_metadata_annotate),
    ("host_pinned.pickle", fx_host_pinned),
    ("fx_frames.pickle", fx_fx_frames),
    ("skip_actions.pickle", fx_skip_actions),
]
MAX_BYTES = 200_000


def _all_fixtures():
    """FIXTURES, then those of evidence_fixtures.py (the cases of how sure an answer is)."""
    sys.path.insert(0, HERE)
    try:
        import evidence_fixtures
    finally:
        sys.path.remove(HERE)
    return FIXTURES + evidence_fixtures.FIXTURES


def generate():
    """{name: (bytes, info, sim)} for every fixture."""
    out = {}
    for name, fn in _all_fixtures():
        res = fn()
        sn, info = res[0], res[1]
        obj = res[2] if len(res) > 2 else sn.build()
        if name == "protocol2.pickle":
            data = cpp_pickle(obj)
            info["protocol"] = 2
        else:
            data = pickle.dumps(obj, protocol=4)
            info["protocol"] = 4
        out[name] = (data, info, sn)
    return out


def expected_for(name, data, info, sn):
    snap = pickle.loads(data)
    check_consistency(snap, name)
    check_sharing(snap, name, "alloc" if sn.context == "alloc" or sn.v < (2, 1) else "all")
    devs = []
    for ref in reference_all(snap):
        dv = sn.devs.get(ref["device"])
        ref = dict(ref)
        del ref["end_state_bytes"]
        if dv is not None:
            ref["truth_by_category_at_peak"] = dv.truth_at(ref["peak_index"])
        devs.append(ref)
    return {
        "what": info["what"],
        "layout": info["layout"],
        "pickle_protocol": info["protocol"],
        "top_level": type(snap).__name__,
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "devices": devs,
        "expect": info.get("expect", {}),
    }


def real_figures(directory):
    out = {}
    for fn in sorted(os.listdir(directory)):
        if not fn.endswith((".pickle", ".pkl")):
            continue
        with open(os.path.join(directory, fn), "rb") as f:
            snap = pickle.load(f)   # trusted files only
        if not (isinstance(snap, list) or (isinstance(snap, dict) and "segments" in snap)):
            out[fn] = "not a snapshot"
            continue
        out[fn] = [{k: v for k, v in r.items() if k not in ("end_state_bytes", "ooms")} for r in reference_all(snap)]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the files on disk, write nothing")
    ap.add_argument("--real", metavar="DIR", help="also compute the reference on real snapshots in DIR")
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args(argv)
    gen = generate()
    expected = {
        "_doc": "Reference figures of the synthetic fixtures; see the docstring of make_fixtures.py "
                "(reference()) and README.md for the exact definition. Regenerate with "
                "`python tests/data/make_fixtures.py`.",
        "definition": {
            "live_at_end": "requested_size of blocks in state active_allocated or active_pending_free",
            "start_bytes": "live set at the end replayed backwards: alloc removes addr, free_completed/free re-adds addr->size",
            "peak_bytes": "max(start, live after each alloc); forward: alloc +size, free_completed/free -size",
            "peak_index": "position in device_traces[device] of the alloc that first reached the peak; -1 if the start is the peak",
            "reserved": "end = sum(segment total_size); segment_alloc/segment_map add, segment_free/segment_unmap subtract",
            "ooms": "live_bytes/reserved_bytes at the oom entry; fragmentation_bytes = reserved_bytes - live_bytes",
            "truth_by_category_at_peak": "generator's intended category of each live allocation at the peak (not a parser contract)",
        },
        "fixtures": {},
    }
    failures = []
    for name, (data, info, sn) in gen.items():
        if len(data) >= MAX_BYTES:
            failures.append("%s is %d bytes (limit %d)" % (name, len(data), MAX_BYTES))
        expected["fixtures"][name] = expected_for(name, data, info, sn)
    if args.real:
        expected["real_snapshots"] = real_figures(args.real)
    else:
        old = os.path.join(args.out, "expected.json")
        if os.path.exists(old):
            with open(old) as f:
                prev = json.load(f)
            if "real_snapshots" in prev:
                expected["real_snapshots"] = prev["real_snapshots"]
    text = json.dumps(expected, indent=1, sort_keys=False) + "\n"
    if args.check:
        for name, (data, _, _) in gen.items():
            p = os.path.join(args.out, name)
            if not os.path.exists(p) or open(p, "rb").read() != data:
                failures.append("%s differs from the generator" % name)
        p = os.path.join(args.out, "expected.json")
        if not os.path.exists(p) or json.load(open(p))["fixtures"] != json.loads(text)["fixtures"]:
            failures.append("expected.json differs from the generator")
    else:
        for name, (data, _, _) in gen.items():
            with open(os.path.join(args.out, name), "wb") as f:
                f.write(data)
        with open(os.path.join(args.out, "expected.json"), "w") as f:
            f.write(text)
    for name, fx in expected["fixtures"].items():
        for dv in fx["devices"]:
            print("%-24s dev %d  %7d B  entries %5d allocs %4d  peak %13d @ %5d  start %12d end %12d  reserved peak %12d  ooms %d"
                  % (name, dv["device"], fx["size_bytes"], dv["entries"], dv["allocs"], dv["peak_bytes"], dv["peak_index"],
                     dv["start_bytes"], dv["end_bytes"], dv["reserved_peak"], len(dv["ooms"])))
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
