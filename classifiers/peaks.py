"""The type of a peak (DESIGN.md §4): which moment of a training step a peak is.

Types follow Salisbury's study of QLoRA fine-tuning peaks (labels A to I): loading or
quantizing weights before training, the end of forward, the loss spike, the start, top,
bottom and end of backward, the optimizer step, an OOM. A moment's type comes from the
phase of its entry and, inside backward, from how much of that backward's consumed
activations are already freed.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .categories import CATEGORY_CODE
from .results import Iteration
from .timeline import P_BACKWARD, P_FORWARD, P_INPUTS, P_NONE, P_OPTIMIZER

PEAK_TYPES = ("quantization", "model_load", "forward", "loss", "backward_start", "backward_top",
              "backward_bottom", "backward_end", "optimizer_step", "oom", "other")
I_ACT = CATEGORY_CODE["activations"]


def peak_type(da, facts, index: int) -> str:
    """DESIGN.md §4 type of a peak reached at trace entry `index` ("other" for the start
    state, index -1, or an index outside the trace)."""
    if index < 0 or index >= len(da.trace_action):
        return "other"
    t = da.timeline
    live = da.live.live_after
    # the next request failed: an OOM after the peak with live memory unchanged in between
    # (a later OOM, after frees and other allocations, types its own moment, not this one)
    ooms = da.oom_indices
    if len(ooms):
        after = ooms[ooms >= index]
        if len(after) and bool((live[index:int(after[0]) + 1] == live[index]).all()):
            return "oom"
    sid = int(da.trace_stack[index])
    marker = facts.stack_marker[sid] if sid > 0 else -1
    mname = facts.phase_markers[marker] if marker >= 0 else None
    quant = sid > 0 and "quantization" in facts.has_marker and bool(facts.has_marker["quantization"][sid])
    it = int(t.iteration[index]) if len(t.iteration) else -1
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
        return _backward_kind(da, index)
    return "other"


def _backward_kind(da, index: int) -> str:
    """Where in backward: by the share of this backward's saved activations already freed."""
    t = da.timeline
    seg = t.segment[index]
    s0 = int(np.searchsorted(t.segment, seg, side="left"))
    s1 = int(np.searchsorted(t.segment, seg, side="right")) - 1
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
    if f < 0.02:
        return "backward_start"
    if f >= 0.98:
        return "backward_end"
    return "backward_top" if f < 0.5 else "backward_bottom"


def with_peaks(da, facts, iterations) -> tuple[Iteration, ...]:
    """The iterations with their own peak (bytes, entry, type) filled in."""
    live = da.live.live_after
    out = []
    for it in iterations:
        s, e = it.start_index, it.end_index
        if e < s or not len(live):
            out.append(it)
            continue
        k = s + int(np.argmax(live[s:e + 1]))
        out.append(dataclasses.replace(it, peak_bytes=int(live[k]), peak_index=k,
                                       peak_type=peak_type(da, facts, k)))
    return tuple(out)


__all__ = ["PEAK_TYPES", "peak_type", "with_peaks"]
