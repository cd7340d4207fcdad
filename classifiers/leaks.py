"""Leaks (DESIGN.md §5): live memory that grows from iteration to iteration, by the stack
whose allocations are never given back.

Not a leak: the allocator's cache (reserved but unallocated), one-time state (optimizer
moments made in the first step), blocks live before the trace began, weights made while
the first iterations load the model, and retain_graph-style keeping of one iteration's
graph until the next (it is freed during the next iteration).
"""
from __future__ import annotations

import math

import numpy as np

from .categories import CATEGORIES, CATEGORY_CODE
from .results import Leak


def find_leaks(da, rule_names, min_bytes: int = 1) -> tuple[Leak, ...]:
    """Stacks whose allocations outlive the next iteration, iteration after iteration.

    An allocation (version chain) made in iteration k "stays" when it is still live at the
    end of iteration k+1 (for the last iteration: at the end of the trace). A stack leaks
    when its allocations stay in at least two iterations and in at least half of them,
    and live memory at iteration ends grows."""
    its = da.iterations
    K = len(its)
    if K < 2:
        return ()
    live = da.live.live_after
    ends = np.array([it.end_index for it in its], dtype=np.int64)
    end_live = live[ends]
    if end_live[-1] <= end_live[0]:
        return ()
    a = da.allocs
    root, last = da.chain_root, da.chain_last
    is_root = root == np.arange(len(a))
    ai = a.alloc_index
    fi = a.free_index[last]
    it_a = np.where(ai >= 0, da.timeline.iteration[np.clip(ai, 0, max(len(live) - 1, 0))], -1)
    cand = is_root & (ai >= 0) & (it_a >= 0)
    # model weights made step by step (loading inside the first iterations) are not a leak
    cand &= (da.category != CATEGORY_CODE["weights"]) & (da.category != CATEGORY_CODE["quantization"])
    nxt_end = np.where(it_a + 1 < K, ends[np.minimum(it_a + 1, K - 1)], np.iinfo(np.int64).max)
    stays = cand & ((fi < 0) | (fi > nxt_end))
    stays &= ~((it_a == K - 1) & (fi >= 0))
    rows = np.flatnonzero(stays)
    if not len(rows):
        return ()
    stk = a.stack[rows].astype(np.int64)
    its_r = it_a[rows].astype(np.int64)
    # bytes per (stack, iteration)
    key = stk * (K + 1) + its_r
    ukey, inv = np.unique(key, return_inverse=True)
    kb = np.bincount(inv, weights=a.size[rows].astype(np.float64))
    kc = np.bincount(inv)
    ustk = ukey // (K + 1)
    uit = ukey % (K + 1)
    need = max(2, math.ceil(0.5 * K))
    growth = int(end_live[-1] - end_live[0]) // max(1, K - 1)
    leaks = []
    for s in np.unique(ustk).tolist():
        sel = ustk == s
        iters = sorted(set(uit[sel].tolist()))
        if len(iters) < need:
            continue
        per = kb[sel]
        total = int(per.sum())
        if total < min_bytes:
            continue
        sel_rows = rows[stk == s]
        cats = np.bincount(da.category[sel_rows], minlength=len(CATEGORIES))
        leaks.append(Leak(
            stack=int(s), bytes_per_iteration=int(np.median(per)),
            iterations=tuple(int(i) + 1 for i in iters), total_bytes=total, count=int(kc[sel].sum()),
            category=CATEGORIES[int(np.argmax(cats))],
            rule=rule_names[int(np.bincount(da.rule[sel_rows]).argmax())],
            growth_per_iteration=growth))
    leaks.sort(key=lambda lk: -lk.total_bytes)
    return tuple(leaks)


def leak_rows(da, leak: Leak) -> np.ndarray:
    """The allocation rows a leak is about: made in the trace from its stack and still
    live when the next iteration ends (never freed, mostly)."""
    a = da.allocs
    return np.flatnonzero((a.stack == leak.stack) & (a.free_index < 0) & (a.alloc_index >= 0))


__all__ = ["find_leaks", "leak_rows"]
