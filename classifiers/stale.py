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
from .iterations import Iterations
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
    models = da.run.models_alive.value
    if models is not None and models > 1:
        return None         # the gradients may be another model's (a model trained before): the models finding says so
    ai, fi, size = a.alloc_index[rows], a.free_index[rows], a.size[rows]
    its = Iterations.of(da.iterations)
    fwd_lo, _ = its.phase_bounds("forward")
    keep = np.flatnonzero(fwd_lo >= 0)              # the iterations with a forward
    if not len(keep):
        return None
    starts, fwd = its.start[keep], fwd_lo[keep]
    # a row is stale in iterations k that began after it was made (starts[k] > ai) and whose
    # forward starts before it is freed (fwd[k] < fi): a run of k, [k0, k1) (both arrays
    # increase with k); summed over rows with a difference array, one pass for all k
    k0 = np.searchsorted(starts, ai, side="right")
    k1 = np.where(fi < 0, len(keep), np.searchsorted(fwd, fi, side="left"))
    live = k1 > k0
    if not live.any():
        return None
    diff = np.zeros(len(keep) + 1, dtype=np.int64)
    np.add.at(diff, k0[live], size[live])
    np.subtract.at(diff, k1[live], size[live])
    per_it = np.cumsum(diff[:-1])
    stale_in = (keep[per_it > 0] + 1).tolist()       # their numbers
    k = int(np.argmax(per_it))
    nbytes, it = int(per_it[k]), its[int(keep[k])]
    stale = (ai < it.start_index) & ((fi < 0) | (fi > fwd[k]))
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
