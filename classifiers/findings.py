"""Peaks (typed, DESIGN.md §4), leaks and OOM reports (DESIGN.md §5), from a classified device.

Everything works on numpy columns; the Python loops run per iteration, per leaking stack
or per OOM entry, never per event or allocation.
"""
from __future__ import annotations

import math

import numpy as np

from ..parsers.tables import A_OOM
from ..common.units import fmt_bytes
from .rules import CATEGORIES
from .timeline import P_BACKWARD, P_FORWARD, P_INPUTS, P_NONE, P_OPTIMIZER

PEAK_TYPES = ("quantization", "model_load", "forward", "loss", "backward_start", "backward_top",
              "backward_bottom", "backward_end", "optimizer_step", "oom", "other")
I_ACT = CATEGORIES.index("activations")
LIBRARY_PATH = ("site-packages/", "dist-packages/", "/lib/python", "torch/", "<frozen", "<string>")


# -- live sets ----------------------------------------------------------------------------
def live_mask(allocs, index: int) -> np.ndarray:
    """bool per allocation row: live right after trace entry `index` (-1: before the trace)."""
    a = allocs
    return (a.alloc_index <= index) & ((a.free_index < 0) | (a.free_index > index))


def by_category_at(da, index: int) -> dict:
    """Live bytes per category right after entry `index` (-1: at the start), non-zero only."""
    live = live_mask(da.allocs, index)
    sums = np.bincount(da.category[live], weights=da.allocs.size[live].astype(np.float64),
                       minlength=len(CATEGORIES))
    return {c: int(s) for c, s in zip(CATEGORIES, sums) if s}


def live_by_category(da, at_indices) -> np.ndarray:
    """int64 [len(at_indices), len(CATEGORIES)]: live bytes per category right after each
    entry index (-1 = the start state). For timelines: one call per view, any number of
    query points, O((allocations + queries) log) with no per-event array per category."""
    at = np.asarray(at_indices, dtype=np.int64)
    a = da.allocs
    out = np.zeros((len(at), len(CATEGORIES)), dtype=np.int64)
    for c in range(len(CATEGORIES)):
        sel = da.category == c
        if not sel.any():
            continue
        ai = a.alloc_index[sel]
        fi = a.free_index[sel]
        sz = a.size[sel]
        start = int(sz[ai < 0].sum())
        ev = np.concatenate([ai[ai >= 0], fi[fi >= 0]])
        dv = np.concatenate([sz[ai >= 0], -sz[fi >= 0]])
        order = np.argsort(ev, kind="stable")
        ev, cum = ev[order], np.cumsum(dv[order])
        k = np.searchsorted(ev, at, side="right") - 1
        out[:, c] = start + np.where(k >= 0, cum[np.maximum(k, 0)] if len(cum) else 0, 0)
    return out


# -- presentation ----------------------------------------------------------------------
def stack_strings(facts, sid: int, limit: int = 12, python_only: bool = True) -> list:
    """Readable frames of a stack, innermost first (Python/profiler frames when any)."""
    if sid is None or sid < 0:
        return []
    snap = facts.stacks.snap
    fr = snap.stack(int(sid))
    kinds = facts.stacks.table.kind[fr] if len(fr) else np.zeros(0)
    if python_only and len(fr) and (kinds != 1).any():
        fr = fr[kinds != 1]
    return [facts.stacks.frame_text(int(f)) for f in fr[:limit]]


def user_frame(facts, sid: int) -> str:
    """The innermost frame in the user's own code (not torch, not site-packages)."""
    frames = stack_strings(facts, sid, limit=64)
    for f in frames:
        if not any(p in f for p in LIBRARY_PATH) and not f.startswith(("nn.Module:", "<")):
            return f
    return frames[0] if frames else "(no frames)"


def top_allocations(da, facts, rule_names, index: int, n: int = 10) -> list:
    """The largest allocations live right after entry `index`."""
    live = np.flatnonzero(live_mask(da.allocs, index))
    if not len(live):
        return []
    a = da.allocs
    pick = live[np.argsort(-a.size[live], kind="stable")[:n]]
    out = []
    for r in pick.tolist():
        sid = int(a.stack[r])
        out.append({"size": int(a.size[r]), "category": CATEGORIES[da.category[r]],
                    "rule": rule_names[da.rule[r]], "alloc_index": int(a.alloc_index[r]),
                    "addr": int(a.addr[r]), "where": user_frame(facts, sid),
                    "stack": stack_strings(facts, sid, limit=6)})
    return out


# -- peak types -----------------------------------------------------------------------------
def peak_type(da, facts, index: int) -> str:
    """DESIGN.md §4 type of a peak reached at trace entry `index` ("other" for the start
    state, index -1, or an index outside the trace)."""
    if index < 0 or index >= len(da.trace_action):
        return "other"
    t = da.timeline
    trace_action = da.trace_action
    live = da.live.live_after
    # the next allocation failed: an OOM right after the peak with nothing freed in between
    ooms = da.oom_indices
    if len(ooms):
        after = ooms[ooms >= index]
        if len(after) and live[after[0]] >= live[index]:
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
    order, sorted_fi = _free_order(da)
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


def _free_order(da):
    """Rows sorted by free index (cached on the DeviceAnalysis)."""
    cached = getattr(da, "_free_order_cache", None)
    if cached is None:
        fi = da.allocs.free_index
        order = np.argsort(fi, kind="stable")
        cached = (order, fi[order])
        da._free_order_cache = cached
    return cached


def iteration_peaks(da, facts) -> None:
    """Fill peak_bytes / peak_index / peak_type of every iteration dict."""
    live = da.live.live_after
    for it in da.iterations:
        s, e = it["start_index"], it["end_index"]
        if e < s or not len(live):
            continue
        k = s + int(np.argmax(live[s:e + 1]))
        it["peak_bytes"] = int(live[k])
        it["peak_index"] = k
        it["peak_type"] = peak_type(da, facts, k)


# -- leaks ------------------------------------------------------------------------------------
def find_leaks(da, facts, rule_names, min_bytes: int = 1) -> list:
    """Stacks whose allocations outlive the next iteration, iteration after iteration.

    An allocation (version chain) made in iteration k "stays" when it is still live at the
    end of iteration k+1 (for the last iteration: at the end of the trace). A stack leaks
    when its allocations stay in at least two iterations and in at least half of them,
    and live memory at iteration ends grows. One-time state (optimizer moments made in the
    first step), memory reserved by the allocator cache and blocks from before the trace
    are never counted; retain_graph-style keeping of one iteration's graph until the next
    is not a leak either (it is freed during the next iteration)."""
    its = da.iterations
    K = len(its)
    if K < 2:
        return []
    live = da.live.live_after
    ends = np.array([it["end_index"] for it in its], dtype=np.int64)
    end_live = live[ends]
    if end_live[-1] <= end_live[0]:
        return []
    a = da.allocs
    root, last = da.chain_root, da.chain_last
    is_root = root == np.arange(len(a))
    ai = a.alloc_index
    fi = a.free_index[last]
    it_a = np.where(ai >= 0, da.timeline.iteration[np.clip(ai, 0, max(len(live) - 1, 0))], -1)
    cand = is_root & (ai >= 0) & (it_a >= 0)
    # model weights made step by step (loading inside the first iterations) are not a leak
    cand &= (da.category != CATEGORIES.index("weights")) & (da.category != CATEGORIES.index("quantization"))
    nxt_end = np.where(it_a + 1 < K, ends[np.minimum(it_a + 1, K - 1)], np.iinfo(np.int64).max)
    stays = cand & ((fi < 0) | (fi > nxt_end))
    stays &= ~((it_a == K - 1) & (fi >= 0))
    rows = np.flatnonzero(stays)
    if not len(rows):
        return []
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
        leaks.append({
            "stack": int(s), "where": user_frame(facts, s), "frames": stack_strings(facts, s, limit=24),
            "bytes_per_iteration": int(np.median(per)), "iterations": [int(i) for i in iters],
            "total_bytes": total, "count": int(kc[sel].sum()),
            "category": CATEGORIES[int(np.argmax(cats))],
            "rule": rule_names[int(np.bincount(da.rule[sel_rows]).argmax())],
        })
    leaks.sort(key=lambda d: -d["total_bytes"])
    growth = int(end_live[-1] - end_live[0]) // max(1, K - 1)
    for lk in leaks:
        lk["growth_per_iteration"] = growth
    return leaks


# -- OOMs -------------------------------------------------------------------------------------
def oom_reports(da, snap) -> list:
    t = snap.trace(da.device)
    size = np.asarray(t.columns["size"])
    tus = np.asarray(t.columns["time_us"])
    live = da.live
    settings = snap.allocator_settings or {}
    expandable = bool(settings.get("expandable_segments")) or "expandable_segments:true" in \
        str(settings.get("PYTORCH_CUDA_ALLOC_CONF", "")).replace(" ", "").lower()
    out = []
    for i in da.oom_indices.tolist():
        extra = t.extras.get(int(i), {}) or {}
        allocated = int(live.live_after[i]) if len(live.live_after) else live.start_bytes
        reserved = live.reserved_at(i)
        frag = (reserved - allocated) if reserved is not None else None
        byc = by_category_at(da, i)
        req = int(size[i])
        dev_free = extra.get("device_free")
        rep = {"index": int(i), "time_us": int(tus[i]) if tus[i] >= 0 else None, "requested": req,
               "device_free": int(dev_free) if isinstance(dev_free, int) else None,
               "allocated": allocated, "reserved": reserved, "fragmentation_bytes": frag,
               "by_category": byc, "phase": _phase_name(da, i)}
        rep["suggestion"], rep["suggestions"] = _suggest(req, rep["device_free"], frag, byc, expandable,
                                                         rep["phase"])
        out.append(rep)
    return out


def _phase_name(da, i):
    from .timeline import PHASE_NAMES
    return PHASE_NAMES[int(da.timeline.phase[i])] if len(da.timeline.phase) else "none"


def _suggest(req, dev_free, frag, byc, expandable, phase):
    """The next step a user should try (DESIGN.md §5), most promising first."""
    tips = []
    total = sum(byc.values()) or 1
    share = {k: v / total for k, v in byc.items()}
    if frag is not None and frag >= req and not expandable:
        tips.append(f"set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (fragmentation: "
                    f"{fmt_bytes(frag)} reserved but unallocated, more than the {fmt_bytes(req)} requested)")
    act = share.get("activations", 0) + share.get("autograd", 0)
    order = sorted(share.items(), key=lambda kv: -kv[1])
    for cat, _ in order:
        if cat in ("activations", "autograd", "inputs", "temporary") and act > 0:
            tips.append("a smaller micro-batch with gradient accumulation, or gradient checkpointing "
                        "(activations dominate)")
        elif cat == "weights":
            tips.append("4-bit/8-bit weights (QLoRA) or LoRA on a frozen base in lower precision (weights dominate)")
        elif cat == "optimizer":
            tips.append("an 8-bit or paged optimizer (bitsandbytes AdamW8bit / PagedAdamW), or LoRA to shrink "
                        "the trainable set (optimizer state dominates)")
        elif cat == "gradients":
            tips.append("LoRA or freezing layers to cut gradients, or gradients in bf16 (gradients dominate)")
        elif cat == "quantization":
            tips.append("dequantization scratch is large: a smaller micro-batch or sequence length")
    if not tips:
        tips.append("a smaller micro-batch with gradient accumulation")
    seen, uniq = set(), []
    for t in tips:
        if t not in seen:
            seen.add(t)
            uniq.append(t)
    return uniq[0], uniq


def oom_indices(trace) -> np.ndarray:
    return np.flatnonzero(np.asarray(trace.columns["action"]) == A_OOM).astype(np.int64)


__all__ = ["PEAK_TYPES", "by_category_at", "live_by_category", "live_mask", "top_allocations", "peak_type",
           "iteration_peaks", "find_leaks", "oom_reports", "stack_strings", "user_frame", "oom_indices"]
