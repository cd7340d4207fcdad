"""The type of a peak (DESIGN.md §4): which moment of a training step a peak is.

Types follow Salisbury's study of QLoRA fine-tuning peaks (labels A to I): loading or
quantizing weights before training, the end of forward, the loss spike, the start, top,
bottom and end of backward, the optimizer step, an OOM. A moment's type comes from the
phase of its entry and, inside backward, from how much of that backward's consumed
activations are already freed.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..common.arrays import isin
from .categories import CATEGORY_CODE
from .iterations import Iterations
from .timeline import P_BACKWARD, P_FORWARD, P_INPUTS, P_NONE, P_OPTIMIZER

PEAK_TYPES = ("quantization", "model_load", "forward", "loss", "backward_start", "backward_top",
              "backward_bottom", "backward_end", "optimizer_step", "oom", "other")
I_ACT = CATEGORY_CODE["activations"]


def peak_type(da, facts, index: int) -> str:
    """DESIGN.md §4 type of a peak reached at trace entry `index` ("other" for the start
    state, index -1, or an index outside the trace): `peak_types` of that one entry."""
    return peak_types(da, facts, [index])[0]


def peak_types(da, facts, indices) -> list[str]:
    """DESIGN.md §4 type of the moment at each trace entry of `indices`, for all of them at
    once (every iteration's peak: one call each was 6 µs, a second at 170,000 iterations).
    The first that holds: outside the trace, "other"; the next request failed (an OOM after it
    with live memory unchanged in between: a later OOM, after frees and other allocations,
    types its own moment), "oom"; before training (or with no iterations) "quantization" in a
    quantization's frames, "model_load" in a load's or construction's or outside any phase;
    then by the entry's phase, "loss" in the loss's frames; inside backward, by the share of that
    backward's consumed activations already freed; else "other"."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    out = np.full(len(idx), PEAK_TYPES.index("other"), dtype=np.int8)
    ok = np.flatnonzero((idx >= 0) & (idx < len(da.trace_action)))
    if not len(ok):
        return [PEAK_TYPES[c] for c in out.tolist()]
    i = idx[ok]
    t = da.timeline
    code = np.full(len(i), -1, dtype=np.int8)          # decided: a PEAK_TYPES index, -1 not yet

    def decide(mask, word: str) -> None:
        code[mask & (code < 0)] = PEAK_TYPES.index(word)

    ooms = np.asarray(da.oom_indices, dtype=np.int64)
    if len(ooms):
        k = np.searchsorted(ooms, i)
        decide((k < len(ooms)) & (i >= _still_since(da)[np.minimum(k, len(ooms) - 1)]), "oom")
    sid = np.asarray(da.trace_stack)[i].astype(np.int64)
    framed = sid > 0
    marker = np.full(len(i), -1, dtype=np.int64)
    marker[framed] = np.asarray(facts.stack_marker)[sid[framed]]
    names = list(facts.phase_markers)

    def marked(*words: str) -> np.ndarray:
        return isin(marker, [names.index(w) for w in words if w in names]) & (marker >= 0)
    quant = np.zeros(len(i), dtype=bool)
    if "quantization" in facts.has_marker:
        quant[framed] = np.asarray(facts.has_marker["quantization"], dtype=bool)[sid[framed]]
    in_tl = i < len(t.phase)
    at = np.where(in_tl, i, 0)
    ph = np.where(in_tl, t.phase[at], P_NONE) if len(t.phase) else np.full(len(i), P_NONE)
    it = np.where(in_tl, t.iteration_of(at), -1) if len(t.phase) else np.full(len(i), -1)
    before = (it < 0) & ((t.first_start < 0) | (i < t.first_start))
    decide(before & quant, "quantization")
    decide(before & (marked("model_load", "construct") | ((t.first_start >= 0) & isin(ph, (P_NONE, P_INPUTS)))),
           "model_load")
    forward = ph == P_FORWARD
    decide(forward & marked("loss"), "loss")
    decide(forward, "forward")
    decide(ph == P_OPTIMIZER, "optimizer_step")
    back = np.flatnonzero((ph == P_BACKWARD) & (code < 0))
    if len(back):
        share = _backward_shares(da, i[back])
        code[back] = [PEAK_TYPES.index(_backward_word(share[k])) for k in i[back].tolist()]
    decide(code < 0, "other")
    out[ok] = code
    return [PEAK_TYPES[c] for c in out.tolist()]


_STILL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # DeviceAnalysis -> np.ndarray


def _still_since(da) -> np.ndarray:
    """Per OOM (`da.oom_indices`, ascending): the first entry from which live memory stays as it
    is at the OOM, up to it. A moment is that OOM's when it is at or after it: one comparison,
    where a look at every entry up to the next OOM for each peak typed made a trace that ends in
    an OOM quadratic (10^7 entries, 5,248 iterations, an OOM at the end: their peaks 9.2 s, now
    0.08 s)."""
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


def _backward_word(f: float) -> str:
    if f < 0.02:
        return "backward_start"
    if f >= 0.98:
        return "backward_end"
    return "backward_top" if f < 0.5 else "backward_bottom"


def _backward_shares(da, indices: np.ndarray) -> dict[int, float]:
    """The share of its backward run's consumed activations freed by each of the trace entries
    `indices` in backward, in one pass
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


PART = 1 << 20            # entries of `live` compared at a time by `first_highest`
SHORT = 300               # ... which it vectorizes where the ranges average at most this many entries


def first_highest(live: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The first entry of the highest value of `live` in each range [start, end] (ends
    inclusive), -1 for an empty range: `start + argmax(live[start:end + 1])` of each. Short
    ranges in order that do not overlap (iterations of a few entries each) vectorized: the
    highest values by one `np.maximum.reduceat`, then where each is first met, PART entries at a
    time (a call per range was 2 µs, 0.19 s at 133,000 iterations). Other ranges: a call each."""
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    k = len(starts)
    out = np.full(k, -1, dtype=np.int64)
    if not k or not len(live):
        return out
    ordered = bool((starts >= 0).all() and (ends >= starts).all() and (ends < len(live)).all()
                   and (starts[1:] > ends[:-1]).all())
    # a call per range where ranges are long (a few thousand of 10^7 entries: 2 µs a call, where
    # the vectorized pass costs some 7 ns an entry)
    if not ordered or int((ends - starts).sum()) + k > SHORT * k:
        for j, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
            if e >= s and s < len(live):
                out[j] = s + int(np.argmax(live[s:e + 1]))
        return out
    j = 0
    while j < k:
        # ranges from j whose entries span at most PART (one longer range alone)
        lo = int(starts[j])
        m = max(j + 1, int(np.searchsorted(ends, lo + PART, side="left")))
        hi = int(ends[m - 1]) + 1
        sub = live[lo:hi]
        s, e = starts[j:m] - lo, ends[j:m] - lo
        bounds = np.empty(2 * (m - j) - 1, dtype=np.int64)
        bounds[0::2], bounds[1::2] = s, e[:-1] + 1
        top = np.maximum.reduceat(sub, bounds)[0::2]
        # each entry's range (-1 between ranges), then the first entry equal to its range's top
        step = np.zeros(hi - lo + 1, dtype=np.int32)
        step[s] += 1
        step[e + 1] -= 1
        inside = np.cumsum(step[:-1]) > 0
        owner = np.zeros(hi - lo, dtype=np.int32)
        owner[s[1:]] = 1
        owner = np.cumsum(owner, dtype=np.int32)
        hit = np.flatnonzero(inside & (sub == top[owner]))
        first = np.r_[True, owner[hit[1:]] != owner[hit[:-1]]] if len(hit) else np.zeros(0, dtype=bool)
        out[j + owner[hit[first]]] = lo + hit[first]
        j = m
    return out


def with_peaks(da, facts, iterations) -> Iterations:
    """The iterations (any sequence of them) with their own peak (bytes, entry, type) filled in."""
    its = Iterations.of(iterations)
    live = da.live.live_after
    peaks = first_highest(live, its.start, its.end)
    found = peaks >= 0
    types = np.array(its.peak_type, dtype=object)
    types[found] = peak_types(da, facts, peaks[found].tolist())
    return its.with_peaks(np.where(found, live[np.maximum(peaks, 0)], its.peak_bytes) if len(live) else its.peak_bytes,
                          np.where(found, peaks, its.peak_index), types.tolist())


__all__ = ["PEAK_TYPES", "peak_type", "peak_types", "with_peaks"]
