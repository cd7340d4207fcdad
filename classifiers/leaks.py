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

from ..common.arrays import isin
from .categories import CATEGORIES, CATEGORY_CODE
from .iterations import starts_ends
from .results import Leak
from .stacks import ROLE_USER


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
    ends = starts_ends(its)[1]
    end_live = live[ends]
    if end_live[-1] <= end_live[0]:
        return ()
    a = da.allocs
    root, last = da.chain_root, da.chain_last
    is_root = root == np.arange(len(a))
    ai = a.alloc_index
    fi = a.free_index[last]
    it_a = np.where(ai >= 0, da.timeline.iteration_ids()[np.clip(ai, 0, max(len(live) - 1, 0))], -1)
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
    per_stack = []
    # The keys are sorted, so each stack's (stack, iteration) pairs are one run of them: read by
    # its bounds, not by comparing every pair with each stack (quadratic in the stacks that stay).
    # Each member is (stack, its iterations, its bytes in each, its count): its run of the keys'
    # iterations (ascending, distinct) and of `kb`, as views, not a dict per stack (a trace of
    # 170,000 iterations held 200 MB of them)
    bounds = np.flatnonzero(np.r_[True, ustk[1:] != ustk[:-1], True]).tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi - lo < need:
            continue
        per_stack.append((int(ustk[lo]), uit[lo:hi], kb[lo:hi], int(kc[lo:hi].sum())))
    leaks = []
    traced = (ai >= 0) & (it_a >= 0)
    for group in _by_site(per_stack, da.facts):
        stacks_ = tuple(g[0] for g in group["members"])
        if not _grows(a, root, fi, traced & isin(a.stack, stacks_), ends, len(live) - 1):
            continue
        # the members of a group leak in the same iterations: their bytes add up element-wise
        per = np.sum([m[2] for m in group["members"]], axis=0)
        total = int(per.sum())
        if total < min_bytes:
            continue
        sel_rows = rows[isin(stk, stacks_)]
        count_per_it = len(sel_rows) / max(1, len(group["iterations"]))
        cat_bytes = np.bincount(da.category[sel_rows], weights=a.size[sel_rows].astype(np.float64),
                                minlength=len(CATEGORIES))
        by_cat = {c: int(b) for c, b in zip(CATEGORIES, cat_bytes) if b}
        graph = by_cat.get("activations", 0) + by_cat.get("autograd", 0)
        leaks.append(Leak(
            stack=group["members"][0][0], site=group["site"], stacks=stacks_,
            bytes_per_iteration=int(np.median(per)), iterations=tuple((group["iterations"] + 1).tolist()),
            total_bytes=total, count=sum(g[3] for g in group["members"]),
            category=CATEGORIES[int(np.argmax(cat_bytes))], by_category=by_cat,
            rule=rule_names[int(np.bincount(da.rule[sel_rows]).argmax())],
            # a graph kept alive holds what many ops saved; one or two tensors a step are a
            # list or a cache that grows (the loss appended without .item(), say)
            cause="graph" if graph * 2 >= total and count_per_it >= 3 else "container",
            growth_per_iteration=growth))
    leaks.sort(key=lambda lk: -lk.total_bytes)
    return tuple(leaks)


GROWING_STEPS = 0.5      # a leak's live bytes at iteration ends rise at more than this share of the steps
FALLING_STEPS = 0.1      # ... and fall at no more than this share


def _grows(a, root, fi, rows_mask, ends, last) -> bool:
    """Whether the allocations of `rows_mask` (one site) hold more at the same point of each
    iteration (its end) as the run goes on, and still hold some at the end of the trace: a
    leak grows. Allocate-then-free churn, however long each allocation lives, does not: its
    live bytes at the iteration ends go up and down, and nothing is left at the end."""
    rows = np.flatnonzero(rows_mask & (root == np.arange(len(root))))
    if not len(rows):
        return False
    size = a.size[rows].astype(np.int64)
    f = fi[rows]
    # live bytes of the site right after each iteration's end: a sweep over its allocs and frees
    ev = np.r_[a.alloc_index[rows], f[f >= 0]]
    delta = np.r_[size, -size[f >= 0]]
    order = np.argsort(ev, kind="stable")
    cum = np.cumsum(delta[order])
    k = np.searchsorted(ev[order], np.r_[ends, last], side="right") - 1
    held = np.where(k >= 0, cum[np.maximum(k, 0)], 0)
    per_end, at_last = held[:-1], int(held[-1])
    if at_last <= 0 or per_end[-1] <= per_end[0]:
        return False
    steps = np.diff(per_end)
    # it keeps growing: up at more than half of the steps, almost never down (a loop that
    # holds the last one or two outputs steps up once, then stays flat)
    return bool(np.count_nonzero(steps > 0) > GROWING_STEPS * len(steps)
                and np.count_nonzero(steps < 0) <= FALLING_STEPS * len(steps))


def _user_frames(facts, sid: int) -> list[int]:
    """The user-code frames of a stack, innermost first, the script's top level left out
    (every stack of a script shares it)."""
    if facts is None or sid < 0:
        return []
    sf = facts.stacks
    t = sf.table
    fr = sf.snap.stack(sid)
    keep = [int(f) for f in fr.tolist() if t.role[f] == ROLE_USER and t.names[t.name_ids[f]] != "<module>"]
    return keep


def _by_site(per_stack: list, facts) -> list[dict]:
    """Group leaking stacks into causes: the same iterations, and a user frame in common.
    The largest stack leads each group; `site` is the innermost frame all share."""
    groups: list[dict] = []
    for member in sorted(per_stack, key=lambda m: -float(m[2].sum())):
        sid, iters = member[0], member[1]
        frames = _user_frames(facts, sid)
        for g in groups:
            if len(g["iterations"]) == len(iters) and g["common"] & set(frames) \
                    and np.array_equal(g["iterations"], iters):
                g["common"] &= set(frames)
                g["members"].append(member)
                break
        else:
            groups.append({"iterations": iters, "common": set(frames), "members": [member], "lead": frames})
    for g in groups:
        g["site"] = next((f for f in g["lead"] if f in g["common"]), -1)
        if g["site"] < 0 and facts is not None and g["members"][0][0] >= 0:
            g["site"] = int(facts.stacks.best_frame[g["members"][0][0]])
    return groups


def leak_rows(da, leak: Leak) -> np.ndarray:
    """The allocation rows a leak is about: made in the trace from its stacks and never
    freed."""
    a = da.allocs
    return np.flatnonzero(isin(a.stack, leak.stacks) & (a.free_index < 0) & (a.alloc_index >= 0))


__all__ = ["find_leaks", "leak_rows"]
