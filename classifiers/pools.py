"""Private memory pools over the trace: memory_viz's pool envelopes, as numbers.

memory_viz's "Allocated Memory (incl. Private Pools)" view (torch/utils/viz/MemoryViz.js and
process_alloc_data.js, pytorch #177289, #179490, #180515) draws each private pool (a CUDA
graph's, a `MemPool`'s: any `segment_pool_id` but (0, 0)) as one envelope per (pool,
stream) whose height only grows: the larger of the pool's live allocations and its
reserved segments at their highest, since a private pool keeps its segments until it is
released. The height above the live allocations is the pool's fragmentation.

`pool_footprints(snap, da)` computes those heights exactly, per (pool, stream): an
allocation's pool is its entry's `pool_id` (2.12+), else the pool of the final segment that
holds its address (what memory_viz does); its stream the entry's, else the segment's.
Segment events go to the pool of their entry or of the segment at their address. Reserved
bytes are replayed backwards from the final segments, as live memory is (parsers/live.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..parsers.tables import A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP


@dataclass(frozen=True)
class PoolFootprint:
    """One private pool on one stream (memory_viz's envelope)."""
    pool: tuple[int, int]
    stream: int
    allocations: int
    active_peak_bytes: int          # its allocations' live bytes at their highest
    reserved_peak_bytes: int        # its segments' bytes at their highest
    reserved_end_bytes: int
    envelope_bytes: int             # max of the two: what it holds of the device at most


def _segment_lookup(seg: dict):
    """address -> (pool a, pool b, stream) of the final segment holding it, vectorized."""
    order = np.argsort(seg["address"], kind="stable")
    start = seg["address"][order]
    end = start + seg["total_size"][order]
    pa, pb, st = seg["pool_a"][order], seg["pool_b"][order], seg["stream"][order]

    def find(addr: np.ndarray):
        k = np.searchsorted(start, addr, side="right") - 1
        ok = (k >= 0) & (addr < end[np.maximum(k, 0)]) if len(start) else np.zeros(len(addr), dtype=bool)
        kk = np.maximum(k, 0)
        miss = np.full(len(addr), -1, dtype=np.int64)
        if not len(start):
            return miss, miss.copy(), miss.copy(), ok
        return np.where(ok, pa[kk], -1), np.where(ok, pb[kk], -1), np.where(ok, st[kk], -1), ok
    return find


def pool_footprints(snap, da) -> tuple[PoolFootprint, ...]:
    """Every private pool of the device, per stream, largest envelope first (see the module
    docstring); () when the device has none."""
    seg = snap.device_segments(da.device)
    cols = snap.trace(da.device).columns
    has_entry_pool = "pool_a" in cols
    if not (((seg["pool_a"] != 0) | (seg["pool_b"] != 0)) & (seg["pool_a"] >= 0)).any() and not (
            has_entry_pool and ((np.asarray(cols["pool_a"]) > 0) | (np.asarray(cols["pool_b"]) > 0)).any()):
        return ()
    find = _segment_lookup(seg)
    a = da.allocs
    ai = np.asarray(a.alloc_index, dtype=np.int64)
    pa, pb, st, _ = find(np.asarray(a.addr))
    traced = ai >= 0
    stream_col = np.asarray(cols["stream"])
    st = np.where(traced, stream_col[np.maximum(ai, 0)], st) if len(stream_col) else st
    if has_entry_pool:
        ea, eb = np.asarray(cols["pool_a"]), np.asarray(cols["pool_b"])
        known = traced & (ea[np.maximum(ai, 0)] >= 0)
        pa = np.where(known, ea[np.maximum(ai, 0)], pa)
        pb = np.where(known, eb[np.maximum(ai, 0)], pb)
    action = np.asarray(cols["action"])
    ev = np.flatnonzero(np.isin(action, (A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP)))
    sa, sb, ss, _ = find(np.asarray(cols["addr"])[ev])
    ss = np.where(ss >= 0, ss, stream_col[ev]) if len(ev) else ss
    if has_entry_pool and len(ev):
        known = ea[ev] >= 0
        sa, sb = np.where(known, ea[ev], sa), np.where(known, eb[ev], sb)
    sign = np.where(np.isin(action[ev], (A_SEGMENT_ALLOC, A_SEGMENT_MAP)), 1, -1) * np.asarray(cols["size"])[ev]
    out = []
    both = np.concatenate([np.stack([pa, pb, st], axis=1), np.stack([sa, sb, ss], axis=1)]).astype(np.int64)
    seg_pa, seg_pb, seg_st = seg["pool_a"], seg["pool_b"], seg["stream"]
    n_allocs = len(pa)
    for (x, y, s), members in _private_groups(both):
        rows = members[members < n_allocs]          # (ascending: the groups keep row order)
        active = _peak_of(a, rows, da.n_entries)
        mine = members[members >= n_allocs] - n_allocs
        end = int(seg["total_size"][(seg_pa == x) & (seg_pb == y) & (seg_st == s)].sum())
        steps = np.cumsum(sign[mine])
        start = end - (int(steps[-1]) if len(steps) else 0)
        reserved = max(start, int((steps + start).max()) if len(steps) else start)
        out.append(PoolFootprint(pool=(x, y), stream=s, allocations=len(rows), active_peak_bytes=active,
                                 reserved_peak_bytes=reserved, reserved_end_bytes=end,
                                 envelope_bytes=max(active, reserved)))
    out.sort(key=lambda p: (-p.envelope_bytes, p.pool, p.stream))
    return tuple(out)


def _private_groups(keys: np.ndarray):
    """((pool a, pool b, stream), the indices of its rows in ascending order) for each distinct
    row of `keys` (k, 3) in a private pool (not (0, 0), not unknown): one sort of those rows, not
    np.unique(axis=0) of them all (0.4 s at 10^6 events) and a pass over every row a pool."""
    idx = np.flatnonzero((keys[:, 0] >= 0) & ~((keys[:, 0] == 0) & (keys[:, 1] == 0)))
    if not len(idx):
        return
    sub = keys[idx]
    order = np.lexsort((sub[:, 2], sub[:, 1], sub[:, 0]))        # stable: rows in order within a pool
    ks = sub[order]
    cuts = np.flatnonzero(np.r_[True, (ks[1:] != ks[:-1]).any(axis=1)]).tolist() + [len(order)]
    for i in range(len(cuts) - 1):
        x, y, s = (int(v) for v in ks[cuts[i]])
        yield (x, y, s), idx[order[cuts[i]:cuts[i + 1]]]


def _peak_of(a, rows: np.ndarray, n: int) -> int:
    """The highest sum of live bytes of `rows` over the trace (their own live memory)."""
    if not len(rows):
        return 0
    ai, fi = np.asarray(a.alloc_index)[rows].astype(np.int64), np.asarray(a.free_index)[rows].astype(np.int64)
    size = np.asarray(a.size)[rows].astype(np.int64)
    start = int(size[ai < 0].sum())
    t = np.concatenate([ai[ai >= 0], fi[fi >= 0]])
    d = np.concatenate([size[ai >= 0], -size[fi >= 0]])
    order = np.lexsort((d, t))          # at one entry, a free before an alloc
    cur = start + np.cumsum(d[order])
    return int(max(start, int(cur.max()) if len(cur) else start))


__all__ = ["PoolFootprint", "pool_footprints"]
