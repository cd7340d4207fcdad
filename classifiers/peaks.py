"""The type of a peak (DESIGN.md §4): which moment of a training step a peak is.

Types follow Salisbury's study of QLoRA fine-tuning peaks (labels A to I): loading or
quantizing weights before training, the end of forward, the loss spike, the start, top,
bottom and end of backward, the optimizer step, an OOM. A moment's type comes from the
phase of its entry and, inside backward, from how much of that backward's consumed
activations are already freed.
"""
from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from .categories import CATEGORY_CODE
from .results import Iteration
from .timeline import P_BACKWARD, P_FORWARD, P_INPUTS, P_NONE, P_OPTIMIZER

PEAK_TYPES = ("quantization", "model_load", "forward", "loss", "backward_start", "backward_top",
              "backward_bottom", "backward_end", "optimizer_step", "oom", "other")
I_ACT = CATEGORY_CODE["activations"]


def peak_type(da, facts, index: int, backward_share: dict | None = None) -> str:
    """DESIGN.md §4 type of a peak reached at trace entry `index` ("other" for the start
    state, index -1, or an index outside the trace). `backward_share`: {entry: share of its
    backward's consumed activations freed by it} found for many entries at once
    (`_backward_shares`), where `index` is one of them."""
    if index < 0 or index >= len(da.trace_action):
        return "other"
    t = da.timeline
    # the next request failed: an OOM after the peak with live memory unchanged in between
    # (a later OOM, after frees and other allocations, types its own moment, not this one)
    ooms = da.oom_indices
    if len(ooms):
        k = int(np.searchsorted(ooms, index))
        if k < len(ooms) and index >= _still_since(da)[k]:
            return "oom"
    sid = int(da.trace_stack[index])
    marker = facts.stack_marker[sid] if sid > 0 else -1
    mname = facts.phase_markers[marker] if marker >= 0 else None
    quant = sid > 0 and "quantization" in facts.has_marker and bool(facts.has_marker["quantization"][sid])
    it = t.iteration_of(index) if 0 <= index < len(t.phase) else -1
    ph = int(t.phase[index]) if len(t.phase) else P_NONE
    if it < 0 and (t.first_start < 0 or index < t.first_start):
        # before training (or no iterations at all)
        if quant:
            return "quantization"
        if mname in ("model_load", "construct") or (t.first_start >= 0 and ph in (P_NONE, P_INPUTS)):
            return "model_load"
    if ph == P_FORWARD:
        return "loss" if mname == "loss" else "forward"
    if ph == P_OPTIMIZER:
        return "optimizer_step"
    if ph == P_BACKWARD:
        if backward_share is not None and index in backward_share:
            return _backward_word(backward_share[index])
        return _backward_kind(da, index)
    return "other"


_STILL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # DeviceAnalysis -> np.ndarray


def _still_since(da) -> np.ndarray:
    """Per OOM (`da.oom_indices`, ascending): the first entry from which live memory stays as it
    is at the OOM, up to it. A moment is that OOM's when it is at or after it: one comparison
    where a look at every entry up to the next OOM, for each peak typed, made a trace that ends
    in an OOM quadratic (10^7 entries, 5,248 iterations: the iterations' peaks 0.07 -> 9.2 s)."""
    got = _STILL.get(da)
    if got is not None:
        return got
    live = da.live.live_after
    ooms = np.asarray(da.oom_indices, dtype=np.int64)
    out = np.zeros(len(ooms), dtype=np.int64)
    for j, o in enumerate(ooms.tolist()):
        o = min(max(o, 0), len(live) - 1)             # (OOMs are trace entries: inside it)
        v, width, start = live[o], 4096, 0
        while True:                                     # back from the OOM, in widening windows
            lo = max(0, o + 1 - width)
            other = np.flatnonzero(live[lo:o + 1] != v)
            if len(other):
                start = lo + int(other[-1]) + 1
                break
            if lo == 0:
                break
            width *= 4
        out[j] = start
    _STILL[da] = out
    return out


def _backward_kind(da, index: int) -> str:
    """Where in backward: by the share of this backward's saved activations already freed."""
    t = da.timeline
    s0, s1 = (int(x) for x in t.segment_bounds(t.segment_of(index)))
    a = da.allocs
    order, sorted_fi = da.free_order()
    # keys in the column's own dtype: int64 keys would make numpy copy the int32 column
    # (millions of rows) on every call, 1 ms a peak at 10^7 events
    lo, hi = np.searchsorted(sorted_fi, np.array([s0, s1 + 1], dtype=sorted_fi.dtype))
    rows = order[lo:hi]                      # rows freed inside this backward run
    fi = a.free_index[rows]
    ai = a.alloc_index[rows]
    consumed = (da.category[rows] == I_ACT) & (ai >= 0) & (ai < s0)
    sz = a.size[rows]
    total = float(sz[consumed].sum())
    if total > 0:
        f = float(sz[consumed & (fi <= index)].sum()) / total
    else:
        f = (index - s0) / max(1, s1 - s0)
    return _backward_word(f)


def _backward_word(f: float) -> str:
    if f < 0.02:
        return "backward_start"
    if f >= 0.98:
        return "backward_end"
    return "backward_top" if f < 0.5 else "backward_bottom"


def _backward_shares(da, indices: np.ndarray) -> dict[int, float]:
    """`_backward_kind`'s share for each of the trace entries `indices` in backward, in one pass
    over the rows freed in their backward runs (one call per iteration scanned its run's rows
    once per iteration: 0.4 s for 5,000 iterations at 10^7 events), exactly as it finds it: the
    bytes of the run's consumed activations (made before the run began) freed up to the entry,
    over all of them, else how far the entry is into its run."""
    t = da.timeline
    idx = np.unique(np.asarray(indices, dtype=np.int64))
    idx = idx[(idx >= 0) & (idx < len(t.phase))]
    idx = idx[t.phase[idx] == P_BACKWARD]
    if not len(idx):
        return {}
    seg = t.segment_of(idx)
    s0, s1 = t.segment_bounds(seg)
    a = da.allocs
    order, sorted_fi = da.free_order()
    dt = sorted_fi.dtype
    # rows freed in the runs asked about: each run's range of the free order, each row once
    runs, first = np.unique(seg, return_index=True)
    lo = np.searchsorted(sorted_fi, s0[first].astype(dt))
    hi = np.searchsorted(sorted_fi, (s1[first] + 1).astype(dt))
    n_run = hi - lo
    pos = np.repeat(lo - np.cumsum(n_run) + n_run, n_run) + np.arange(int(n_run.sum()))
    rows = order[pos]
    run_s0 = np.repeat(s0[first], n_run)
    ai = a.alloc_index[rows]
    consumed = (da.category[rows] == I_ACT) & (ai >= 0) & (ai < run_s0)
    w = np.where(consumed, a.size[rows], 0).astype(np.int64)
    csum = np.concatenate(([0], np.cumsum(w)))                  # exact: integer bytes
    base = np.concatenate(([0], np.cumsum(n_run)))[:-1]        # each run's start in `rows`
    r = np.searchsorted(runs, seg)                              # each entry's run
    total = csum[base[r] + n_run[r]] - csum[base[r]]
    upto = np.searchsorted(sorted_fi, idx.astype(dt), side="right") - lo[r]
    part = csum[base[r] + upto] - csum[base[r]]
    out = {}
    for k, tot, pa, a0, a1 in zip(idx.tolist(), total.tolist(), part.tolist(), s0.tolist(), s1.tolist()):
        out[k] = float(pa) / float(tot) if tot > 0 else (k - a0) / max(1, a1 - a0)
    return out


def with_peaks(da, facts, iterations) -> tuple[Iteration, ...]:
    """The iterations with their own peak (bytes, entry, type) filled in."""
    live = da.live.live_after
    peaks = []
    for it in iterations:
        s, e = it.start_index, it.end_index
        peaks.append(-1 if e < s or not len(live) else s + int(np.argmax(live[s:e + 1])))
    shares = _backward_shares(da, np.asarray([k for k in peaks if k >= 0], dtype=np.int64))
    out = []
    for it, k in zip(iterations, peaks):
        if k < 0:
            out.append(it)
            continue
        # (its fields with the peak's: dataclasses.replace looked at each field, 7 µs an
        # iteration, a second at 10^5 iterations)
        out.append(type(it)(**{**it.__dict__, "peak_bytes": int(live[k]), "peak_index": k,
                               "peak_type": peak_type(da, facts, k, shares)}))
    return tuple(out)


__all__ = ["PEAK_TYPES", "peak_type", "with_peaks"]
