"""Exports for bug reports and profilers: a trimmed snapshot and a Perfetto/Chrome trace.

Trimmed snapshot (`export_trimmed`): the entries [start, end] of one device's
trace, written as a snapshot pickle in torch's own layout (plain dicts, lists,
tuples, str, int, bool, float through `pickle.dump`, like
`torch.cuda.memory._dump_snapshot`), so PyTorch's viewer (pytorch.org/memory_viz)
and vramscope both open it. A snapshot's `segments` describe the allocator at the
*end* of its trace, and readers recover the start by replaying the trace backwards
(DESIGN.md §2). So the exported segments hold exactly the blocks live right after
entry `end`, each as `active_allocated` with `requested_size` = the traced size
and the frames of its allocation; blocks that were live when the window opened and
are never allocated inside it thereby become pre-existing blocks, and live memory
is right at every entry of the window. Segments are the snapshot's segments
replayed back to the window's end through the `segment_*` entries after it, so
reserved memory is right too.

Perfetto (`export_perfetto`): Chrome trace-event JSON with one counter track
("ph": "C") per category per device, the live bytes of that category, so a
user can line memory up with a profiler trace in ui.perfetto.dev. Huge traces
are cut into at most `max_points` buckets and each bucket reports each
category's maximum (a peak never disappears; Perfetto's own counter mipmaps keep
the max for the same reason).
"""
from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
import orjson

from ..classifiers import CATEGORIES, annotation_regions
from ..classifiers.carried import KEY as CARRIED_KEY
from ..classifiers.carried import carried_document
from ..classifiers.liveset import series_at
from ..common.atomic import atomic_write
from ..parsers.tables import (
    A_FREE_REQUESTED,
    A_OOM,
    A_SEGMENT_ALLOC,
    A_SEGMENT_FREE,
    A_SEGMENT_MAP,
    A_SEGMENT_UNMAP,
    COMPONENT_KEY,
    FX_KEYS,
    LIVE_BLOCK_STATES,
)

ROUND = 512   # the caching allocator's block granularity


# -- trimmed snapshot ---------------------------------------------------------------

def csv_field(text: str) -> str:
    """One CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break."""
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def allocation_text_columns(da, field=csv_field) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The text columns of `allocations --csv` per row, as CSV fields (object arrays):
    torch's own tag, the user_metadata, the notes (annotate, joined by ' | '). Each distinct
    string is quoted once, never per row."""
    n = len(da.allocs)
    snap = da.snapshot
    tags = np.full(n, "", dtype=object)
    for col, names in ((da.torch_category, snap.category_names), (da.torch_component, snap.component_names)):
        if col is not None and len(col):
            lut = np.asarray([field(str(x)) for x in names] or [""], dtype=object)
            col = np.asarray(col)
            tags = np.where(col > 0, lut[np.minimum(col, len(lut) - 1)], tags)
    meta = np.full(n, "", dtype=object)
    notes = np.full(n, "", dtype=object)
    md = da.metadata()
    if md is not None and n:
        ids, inv = np.unique(md.user, return_inverse=True)
        lut = np.asarray([field(snap.strings[i]) if i >= 0 else "" for i in ids.tolist()], dtype=object)
        meta = lut[inv.reshape(-1)]
        for row, ns in md.notes.items():
            notes[row] = field(" | ".join(snap.strings[sid] for _, sid in ns))
    return tags, meta, notes


def window_around(n: int, center: int, width: int) -> tuple[int, int]:
    """[start, end] (inclusive) of `width` entries centred on `center`, clipped to the trace."""
    width = max(1, min(int(width), n))
    start = max(0, int(center) - width // 2)
    end = min(n - 1, start + width - 1)
    start = max(0, end - width + 1)
    return start, end


class _Frames:
    """Frame dicts and frame lists, each built once and shared, as torch pickles them
    (one dict per unique frame, one list per stack: the pickle memo keeps the file small)."""

    def __init__(self, snap, redact_paths=False):
        self.snap = snap
        self.redact = redact_paths
        self._frames = {}
        self._stacks = {}

    def frame(self, fid: int) -> dict:
        d = self._frames.get(fid)
        if d is None:
            filename, line, name = self.snap.frame(fid)
            if self.redact:
                filename = os.path.basename(filename)
            d = self._frames[fid] = {"name": name, "filename": filename, "line": line}
            fx = self.snap.frame_fx.get(fid)
            if fx is not None:      # augment_with_fx_traces: the frame's FX fields, as torch adds them
                for key, sid in zip(FX_KEYS, fx[:4]):
                    if sid >= 0:
                        d[key] = self.snap.strings[sid]
        return d

    def stack(self, sid: int) -> list | None:
        if sid < 0:
            return None
        s = self._stacks.get(sid)
        if s is None:
            s = self._stacks[sid] = [self.frame(int(f)) for f in self.snap.stack(sid)]
        return s


def _segments_at(snap, dev: int, end: int) -> list[dict]:
    """The device's segments right after entry `end`: the snapshot's segments with the
    `segment_*` entries after `end` undone, newest first."""
    seg = snap.device_segments(dev)
    segs: dict[int, dict[str, Any]] = {}
    for i in range(len(seg["address"])):
        segs[int(seg["address"][i])] = {
            "address": int(seg["address"][i]), "total_size": int(seg["total_size"][i]),
            "stream": int(seg["stream"][i]), "segment_type": int(seg["segment_type"][i]),
            "pool": (int(seg["pool_a"][i]), int(seg["pool_b"][i])),
            "is_expandable": bool(seg["is_expandable"][i]), "stack": int(seg["stack"][i]),
        }
    t = snap.trace(dev)
    action = np.asarray(t.columns["action"])
    after = np.flatnonzero(np.isin(action[end + 1:], (A_SEGMENT_ALLOC, A_SEGMENT_FREE,
                                                      A_SEGMENT_MAP, A_SEGMENT_UNMAP))) + end + 1
    addr_c, size_c, stream_c, stack_c = (t.columns[k] for k in ("addr", "size", "stream", "stack"))
    for i in after[::-1]:
        act, addr, size = int(action[i]), int(addr_c[i]), int(size_c[i])
        if act == A_SEGMENT_ALLOC:
            segs.pop(addr, None)
        elif act == A_SEGMENT_FREE:
            segs[addr] = {"address": addr, "total_size": size, "stream": int(stream_c[i]),
                          "segment_type": 1 if size > (1 << 20) else 0, "pool": (0, 0),
                          "is_expandable": False, "stack": int(stack_c[i])}
        elif act == A_SEGMENT_MAP:          # undo a map: the range goes away from every segment it overlaps
            _unmap_range(segs, addr, addr + size)
        elif act == A_SEGMENT_UNMAP:        # undo an unmap: the piece comes back
            before = next((s for s in segs.values() if s["address"] + s["total_size"] == addr), None)
            if before is not None:
                before["total_size"] += size
            else:
                segs[addr] = {"address": addr, "total_size": size, "stream": int(stream_c[i]),
                              "segment_type": 1, "pool": (0, 0), "is_expandable": True, "stack": int(stack_c[i])}
    return [segs[a] for a in sorted(segs)]


def _unmap_range(segs: dict, lo: int, hi: int) -> None:
    """Take [lo, hi) out of the segments: a segment it covers goes, one it cuts keeps the
    pieces outside it (a map that torch merged into neighbouring segments spans several)."""
    for s in [s for s in segs.values() if s["address"] < hi and lo < s["address"] + s["total_size"]]:
        s0, s1 = s["address"], s["address"] + s["total_size"]
        del segs[s0]
        if s0 < lo:
            segs[s0] = {**s, "total_size": lo - s0}
        if hi < s1:
            segs[hi] = {**s, "address": hi, "total_size": s1 - hi}


def _live_blocks_at(snap, dev: int, end: int):
    """Blocks live right after entry `end`: (addr, requested size, stack, rounded size, pending)."""
    from ..parsers import allocations
    a = allocations(snap, dev)
    live = (a.alloc_index <= end) & ((a.free_index < 0) | (a.free_index > end))
    addr, size, stack = a.addr[live], a.size[live], a.stack[live]
    # rounded block sizes: the snapshot's own where the block is the same one, else rounded up
    blk = snap.device_blocks(dev)
    known = {}
    for ba, bs, br, st in zip(blk["address"].tolist(), blk["size"].tolist(), blk["requested_size"].tolist(),
                              blk["state"].tolist()):
        if st in LIVE_BLOCK_STATES:
            known[ba] = (br, bs)
    rounded = []
    for ad, sz in zip(addr.tolist(), size.tolist()):
        k = known.get(ad)
        rounded.append(k[1] if k is not None and k[0] == sz else max(ROUND, -(-sz // ROUND) * ROUND))
    # a free requested but not completed by `end`: active_pending_free
    t = snap.trace(dev)
    action = np.asarray(t.columns["action"])
    pending = np.zeros(len(addr), dtype=bool)
    fr_idx = np.flatnonzero(action[:end + 1] == A_FREE_REQUESTED)
    if len(fr_idx):
        fr_addr = np.asarray(t.columns["addr"])[fr_idx]
        alloc_at = a.alloc_index[live]
        order = np.argsort(fr_addr, kind="stable")
        fa, fi = fr_addr[order], fr_idx[order]
        lo = np.searchsorted(fa, addr, side="left")
        hi = np.searchsorted(fa, addr, side="right")
        for j in np.flatnonzero(hi > lo):
            pending[j] = bool((fi[lo[j]:hi[j]] > alloc_at[j]).any())
    order = np.argsort(addr, kind="stable")
    return addr[order], size[order], stack[order], np.asarray(rounded, dtype=np.int64)[order], pending[order]


def trimmed_snapshot(snap, device: int, start: int, end: int, redact_paths: bool = False, analysis=None) -> dict:
    """The snapshot dict (torch's layout) of entries [start, end] of `device`'s trace. A
    device without a trace (a state-only snapshot) exports its state: (start, end) = (0, -1).
    With the whole run's `analysis`, the categories it gave every allocation of the window
    travel with it (classifiers/carried.py), so the trimmed file keeps them."""
    t = snap.trace(device)
    n = len(t)
    if n == 0:
        start, end = 0, -1
    elif not (0 <= start <= end < n):
        raise ValueError(f"window {start}:{end} is outside device {device}'s trace (0:{n - 1})")
    fr = _Frames(snap, redact_paths)
    cols = t.columns
    names = snap.action_names
    profiler = snap.layout == "profiler"

    # -- the trace window ------------------------------------------------------------
    sl = slice(start, end + 1)
    base = [cols[k][sl].tolist() for k in ("action", "addr", "size", "stream", "time_us", "stack")]
    opt = {k: cols[k][sl].tolist() for k in ("category", "compile_context", "user_metadata", "internal_metadata",
                                             "component", "forward_stack", "pool_a", "pool_b") if k in cols}
    entries = []
    for j, (act, addr, size, stream, tus, sid) in enumerate(zip(*base)):
        i = start + j
        name = names[act] if act < len(names) else "unknown"
        e = {"action": name}
        if act != A_OOM:
            e["addr"] = addr
        extra = t.extras.get(i)
        if act == A_OOM and extra and "device_free" in extra:
            e["device_free"] = extra["device_free"]
        e["size"] = size
        e["stream"] = stream
        if tus >= 0:
            e["time_us"] = tus
        frames = fr.stack(sid)
        if frames is not None:
            e["frames"] = frames
        if "category" in opt and opt["category"][j] > 0:
            e["category"] = snap.category_names[opt["category"][j]]
        for k in ("compile_context", "user_metadata", "internal_metadata"):
            if k in opt and opt[k][j] >= 0:
                e[k] = snap.strings[opt[k][j]]
        if "component" in opt and opt["component"][j] > 0:
            e[COMPONENT_KEY] = snap.component_names[opt["component"][j]]
        if "forward_stack" in opt and opt["forward_stack"][j] >= 0:
            e["forward_frames"] = fr.stack(opt["forward_stack"][j])
        if "pool_a" in opt and opt["pool_a"][j] >= 0:
            e["pool_id"] = (opt["pool_a"][j], opt["pool_b"][j])
        if extra:
            for k, v in extra.items():
                if k not in e:
                    e[k] = v
        entries.append(e)

    # -- the allocator state at the window's end ------------------------------------------
    b_addr, b_size, b_stack, b_round, b_pending = _live_blocks_at(snap, device, end)
    segments = []
    segs: list[dict[str, Any]]
    if profiler:
        # torch's _profile_to_snapshot: one pseudo-segment spanning every address seen,
        # blocks tiled from its start (inactive filler between them)
        seg_d = snap.device_segments(device)
        starts = [int(x) for x in seg_d["address"]] + ([int(b_addr[0])] if len(b_addr) else [])
        ends = [int(a + s) for a, s in zip(seg_d["address"], seg_d["total_size"])]
        if len(b_addr):
            ends.append(int(b_addr[-1] + b_round[-1]))
        seg_lo = min(starts) if starts else 0
        seg_hi = max(ends) if ends else 0
        segs = [{"address": seg_lo, "total_size": seg_hi - seg_lo, "stream": 0, "segment_type": 1,
                 "pool": None, "is_expandable": False, "stack": -1}]
    else:
        segs = _segments_at(snap, device, end)
    # assign blocks to the segment holding them (or the nearest one before)
    seg_starts = np.asarray([s["address"] for s in segs], dtype=np.int64)
    owner = np.searchsorted(seg_starts, b_addr, side="right") - 1 if len(segs) else np.zeros(0, np.int64)
    if len(segs) == 0 and len(b_addr):
        lo, hi = int(b_addr[0]), int(b_addr[-1] + b_round[-1])
        segs = [{"address": lo, "total_size": hi - lo, "stream": 0, "segment_type": 1, "pool": (0, 0),
                 "is_expandable": False, "stack": -1}]
        owner = np.zeros(len(b_addr), dtype=np.int64)
    owner = np.maximum(owner, 0)
    for si, s in enumerate(segs):
        sel = np.flatnonzero(owner == si)
        blocks = []
        cursor = s["address"]
        seg_end = s["address"] + s["total_size"]
        allocated = requested = 0
        for j in sel.tolist():
            addr, req, rnd = int(b_addr[j]), int(b_size[j]), int(b_round[j])
            nxt = int(b_addr[j + 1]) if j + 1 < len(b_addr) else None
            if profiler:
                rnd = req                  # tiled blocks: sizes must add up to the addresses
            elif nxt is not None and addr + rnd > nxt:      # never overlap the next block
                rnd = max(req, nxt - addr)
            if addr > cursor:
                blocks.append(_inactive(cursor, addr - cursor, profiler))
            blk = {"address": addr, "size": rnd, "requested_size": req,
                   "state": "active_pending_free" if b_pending[j] else "active_allocated",
                   "frames": fr.stack(int(b_stack[j])) or []}
            if profiler:
                del blk["address"]          # torch's converter tiles blocks; so do we (with filler)
            blocks.append(blk)
            cursor = max(cursor, addr + rnd)
            allocated += rnd
            requested += req
        if cursor < seg_end:
            blocks.append(_inactive(cursor, seg_end - cursor, profiler))
        if profiler:
            segments.append({"device": device, "address": s["address"], "total_size": max(seg_end, cursor) -
                             s["address"], "stream": s["stream"], "blocks": blocks})
            continue
        seg_out = {"device": device, "address": s["address"], "total_size": s["total_size"],
                   "allocated_size": allocated, "active_size": allocated, "requested_size": requested,
                   "stream": s["stream"], "segment_type": ("small", "large", "large")[s["segment_type"]],
                   "segment_pool_id": s["pool"], "is_expandable": s["is_expandable"],
                   "frames": fr.stack(s["stack"]) or [], "blocks": blocks}
        segments.append(seg_out)

    traces: list[list[dict]] = [[] for _ in range(max(snap.trace_device_count, device + 1))]
    traces[device] = entries
    out = {"segments": segments, "device_traces": traces}
    if snap.allocator_settings is not None:
        out["allocator_settings"] = snap.allocator_settings
    tus = cols["time_us"][sl]
    known = tus[tus >= 0]
    if len(known) and snap.annotations:
        out["external_annotations"] = _annotations_in(snap.annotations, device, int(known.min()),
                                                      int(known.max()))
    elif "external_annotations" in snap.extra or snap.annotations:
        out["external_annotations"] = []
    if analysis is not None and device in analysis.devices:
        carried = _carried(analysis, device, start, end)
        if carried is not None:
            out[CARRIED_KEY] = carried
    return out


def _carried(analysis, device: int, start: int, end: int) -> dict | None:
    """What the whole run's analysis said of the allocations the window holds: those made in
    it (their index moves by `start`) and those live when it begins (before the trimmed trace)."""
    da = analysis.devices[device]
    ai, fi = da.allocs.alloc_index, da.allocs.free_index
    inside = (ai >= start) & (ai <= end)
    before = (ai < start) & ((fi < 0) | (fi >= start))
    rows = np.flatnonzero(inside | before)
    return carried_document(da, analysis.rule_names, rows, np.where(inside[rows], ai[rows] - start, -1))


def _annotations_in(annotations, device: int, t0: int, t1: int) -> list:
    """External annotations inside [t0, t1], plus the START of every region that is still
    open when the window begins (an optimizer step that began before it), so phases stay known."""
    annotations = list(annotations or ())
    carried = [annotations[r.start_item] for r in annotation_regions(annotations, device)
               if r.start_us < t0 and (r.end_us is None or r.end_us >= t0)]
    inside = [a for a in annotations if isinstance(a, dict) and a.get("device", device) == device
              and isinstance(a.get("time_us"), int) and t0 <= a["time_us"] <= t1]
    return (sorted(carried, key=lambda a: a["time_us"])
            + sorted(inside, key=lambda a: a["time_us"]))


def _inactive(addr: int, size: int, profiler: bool) -> dict:
    b = {"address": addr, "size": size, "requested_size": 0, "state": "inactive", "frames": []}
    if profiler:
        b = {"size": size, "state": "inactive"}
    return b


def export_trimmed(snap, out_path: str, device: int, start: int | None = None, end: int | None = None,
                   around_peak: int | None = None, redact_paths: bool = False, analysis=None,
                   progress=None) -> dict:
    """Write a trimmed snapshot pickle; returns {path, device, start, end, entries, bytes}.

    Give `start`/`end` (inclusive, inside the trace), or `around_peak` = the window width
    in entries, centred on the device's peak. A device without trace entries exports
    its allocator state alone (entries 0)."""
    from ..parsers import live_model
    n = len(snap.trace(device))
    if n == 0:
        start, end = 0, -1
    elif around_peak is not None:
        lm = live_model(snap, device)
        start, end = window_around(n, max(lm.peak_index, 0), around_peak)
    elif start is None or end is None:
        raise ValueError("give a window (start and end) or around_peak")
    doc = trimmed_snapshot(snap, device, start, end, redact_paths, analysis)
    if progress is not None:      # parsers.Progress: cancelled, nothing is written
        progress.check()
    atomic_write(out_path, lambda fh: pickle.dump(doc, fh))
    return {"path": out_path, "device": device, "start": start, "end": end, "entries": end - start + 1,
            "bytes": os.path.getsize(out_path)}


# -- Perfetto / Chrome trace JSON -------------------------------------------------------

def perfetto_trace(analysis, device: int | None = None, max_points: int = 20000) -> dict:
    """Counter tracks of live bytes per category (one per category per device)."""
    snap = analysis.snapshot
    events = []
    origins: dict = {}
    for dev, da in analysis.devices.items():
        if device is not None and dev != device:
            continue
        n = da.live.n_events
        tus = np.asarray(snap.trace(dev).columns["time_us"])
        has_time = n > 0 and bool((tus >= 0).all())
        if has_time:
            ts_of = tus
        else:                               # no clock: one microsecond per entry
            ts_of = np.arange(n, dtype=np.int64)
        events.append({"name": "process_name", "ph": "M", "pid": dev,
                       "args": {"name": f"cuda:{dev} memory" + ("" if has_time else " (x = entry index)")}})
        events.append({"name": "thread_name", "ph": "M", "pid": dev, "tid": 0, "args": {"name": "live bytes"}})
        series = da.category_series()
        # entries that share a microsecond get a nanosecond each, in order (a counter keeps one
        # value per timestamp: the peak must not hide behind the free that follows it), and the
        # state before the trace takes the microsecond before the first entry
        # (counted from the trace's first entry: microseconds since the epoch leave a float64
        # no room for nanoseconds; otherData says where the clock starts)
        origin = int(ts_of[0]) if n else 0
        ts_of = _distinct_times(np.asarray(ts_of, dtype=np.int64) - origin)
        first_ts = (ts_of[0] - 1) if n else 0
        origins[f"cuda:{dev}"] = origin if has_time else None
        if n > max_points:
            edges = np.unique(np.linspace(0, n, max_points, endpoint=False).astype(np.int64))
            ends = np.append(edges[1:], n) - 1           # last entry of each bucket
        for c, name in enumerate(CATEGORIES):
            start, ev, vals = series[c].start, series[c].index, series[c].value
            pts = [(first_ts, start)]
            if n <= max_points:                         # exact: one point per change
                pts += zip(ts_of[ev].tolist(), vals.tolist())
            elif len(ev):
                # each bucket with a change: its maximum at its first time, then the value it
                # ends with at its last time, so no peak disappears and levels stay right
                one = [series[c]]
                b_of_ev = np.searchsorted(edges, ev, side="right") - 1
                bmax = series_at(one, edges - 1)[:, 0]
                np.maximum.at(bmax, b_of_ev, vals)
                at_end = series_at(one, ends)[:, 0]
                for b in np.unique(b_of_ev).tolist():
                    pts.append((ts_of[edges[b]], int(bmax[b])))
                    if at_end[b] != bmax[b]:
                        pts.append((ts_of[ends[b]], int(at_end[b])))
            for ts, v in pts:
                events.append({"name": name, "ph": "C", "ts": _ts(ts), "pid": dev, "tid": 0,
                               "args": {"bytes": int(v)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "vramscope", "file": os.path.basename(snap.path),
                          "time_origin_us": origins}}


def _distinct_times(ts: np.ndarray) -> np.ndarray:
    """float64 microseconds, entries that share one spread by a nanosecond each (in order)."""
    t = np.asarray(ts, dtype=np.float64)
    if len(t) < 2:
        return t
    same = np.r_[False, ts[1:] == ts[:-1]]
    run_start = np.maximum.accumulate(np.where(~same, np.arange(len(t)), 0))
    return t + (np.arange(len(t)) - run_start) * 1e-3


def _ts(t) -> int | float:
    """A Chrome-trace timestamp: whole microseconds as an int, else a float."""
    f = float(t)
    return int(f) if f.is_integer() else round(f, 3)


def export_perfetto(analysis, out_path: str, device: int | None = None, max_points: int = 20000,
                    progress=None) -> dict:
    doc = perfetto_trace(analysis, device, max_points)
    data = orjson.dumps(doc)
    if progress is not None:      # parsers.Progress: cancelled, nothing is written
        progress.check()
    atomic_write(out_path, data)
    n_counters = sum(1 for e in doc["traceEvents"] if e["ph"] == "C")
    return {"path": out_path, "counter_events": n_counters, "bytes": len(data)}
