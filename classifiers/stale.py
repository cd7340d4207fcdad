"""Stale gradients: the previous step's gradients still live while the next step runs.

With `optimizer.zero_grad(set_to_none=True)` called after the forward (or no zero_grad
before it, or gradients zeroed in place instead of freed), every gradient of the last
step stays allocated through the next forward, where live memory is highest in many
runs: a whole copy of the trainable parameters that nothing reads until the backward
has replaced it. Gradients made in the trace are found by their category; gradients
made before a trace recorded mid-training are blocks live before it, freed during it,
sized like the gradients the trace makes (rule `gradients.previous_step`).
"""
from __future__ import annotations

import numpy as np

from .categories import CATEGORY_CODE
from .results import StaleGradients
from .timeline import PHASE_NAMES

_SKIP = ("none", "pre", "never")


def stale_gradients(da) -> StaleGradients | None:
    """Gradients live when an iteration's forward starts that were made before that
    iteration began (the largest such set over the run), or None."""
    a = da.allocs
    rows = np.flatnonzero(da.category == CATEGORY_CODE["gradients"])
    if not len(rows) or not da.iterations:
        return None
    ai, fi, size = a.alloc_index[rows], a.free_index[rows], a.size[rows]
    best = None
    stale_in = []
    for it in da.iterations:
        fwd = it.phases.get("forward")
        if fwd is None:
            continue
        f0 = fwd[0]
        stale = (ai < it.start_index) & ((fi < 0) | (fi > f0))
        if not stale.any():
            continue
        stale_in.append(it.number)
        b = int(size[stale].sum())
        if best is None or b > best[0]:
            best = (b, it, stale)
    if best is None:
        return None
    nbytes, it, stale = best
    freed = fi[stale][fi[stale] >= 0]
    first, last = (int(freed.min()), int(freed.max())) if len(freed) else (-1, -1)
    end = last if last >= 0 else it.end_index
    ph = da.timeline.phase[it.start_index:end + 1]
    codes, first_at = np.unique(ph, return_index=True)
    phases = tuple(PHASE_NAMES[int(c)] for c in codes[np.argsort(first_at)] if PHASE_NAMES[int(c)] not in _SKIP)
    p = da.peak.index
    at_peak = stale & (ai <= p) & ((fi < 0) | (fi > p)) if p >= 0 else stale & (ai < 0)
    stack = int(da.trace_stack[last]) if 0 <= last < len(da.trace_stack) else -1
    return StaleGradients(bytes=nbytes, count=int(stale.sum()), iterations=tuple(stale_in), freed_first=first,
                          freed_last=last, phases=phases, live_at_peak=int(size[at_peak].sum()), free_stack=stack)


__all__ = ["stale_gradients"]
