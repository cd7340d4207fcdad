"""Apply the rules: markers per stack, lifetimes per allocation, first matching rule wins.

Costs: regexes run once per unique file/function string, marker tests once per stack
(a cumsum over the CSR stack array), and each rule a handful of numpy operations over
the allocations that no earlier rule took. No Python loop touches an event or an
allocation.

Version bumps: torch's profiler writes an in-place update (optimizer step, gradient
accumulation) as free + alloc of the same address and size, and the bump carries the
frames of the tensor's first allocation. In profiler-converted files such an alloc
continues the allocation it replaces (same address, size and stack, right after its
free); the chain is classified once, from its first allocation's stack and phase and
its last version's free, and every version gets the chain's category.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common.arrays import isin, unique, unique_inverse
from ..parsers.tables import A_ALLOC, A_OOM
from .categories import CATEGORIES, CATEGORY_CODE
from .evidence import E_NONE, EVIDENCE_CODE, row_evidence
from .rules import Matcher, RuleSet
from .stacks import KIND_PYTHON, StackFacts
from .timeline import P_NEVER, P_PRE, PHASE_CODE, Timeline, build_timeline, frees_carry_alloc_frames, version_bumps

F_SAME, F_LATER_PHASE, F_LATER_ITER, F_NEVER = range(4)
FREED_CODE = {"same_phase": F_SAME, "later_phase": F_LATER_PHASE, "later_iteration": F_LATER_ITER,
              "never": F_NEVER}
UNKNOWN = CATEGORIES.index("unknown")


@dataclass
class SnapshotFacts:
    """Per-snapshot (all devices) results of the stack pass."""
    stacks: StackFacts
    marker_names: list
    has_marker: dict            # marker name -> bool per stack
    marker_pos: dict            # marker name -> innermost position per stack (-1 none)
    stack_marker: np.ndarray    # int16 per stack: index into phase_markers of its phase marker, -1 none
    stack_timeline: np.ndarray  # int8 per stack: timeline phase of that marker, -1 none
    phase_markers: list
    rule_stack_ok: list         # per rule: bool per stack (its stack-only conditions)
    profiler_like: bool
    dequant: np.ndarray         # bool per stack: a dequantization (sizes feed the size matcher)


def stack_pass(snap, rules: RuleSet) -> SnapshotFacts:
    sf = StackFacts(snap)
    profiler_like = snap.layout == "profiler" or (sf.table.profiler_frames > 0 and
                                                  sf.table.profiler_frames * 2 >= len(sf.table.kind))
    has, pos = {}, {}
    for name, matchers in rules.markers.items():
        fm = np.zeros(len(sf.table.kind), dtype=bool)
        for m in matchers:
            fm |= sf.frame_mask(m)
        has[name] = sf.any(fm)
        pos[name] = sf.first_pos(fm)
    phase_markers = rules.phase_markers
    n = sf.n_stacks
    stack_marker = np.full(n, -1, dtype=np.int16)
    decided = np.zeros(n, dtype=bool)
    for level in rules.levels:
        best_pos = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        best = np.full(n, -1, dtype=np.int16)
        for name in level:            # innermost frame wins inside a level; ties: listed first
            p = pos[name]
            better = (p >= 0) & (p < best_pos) & ~decided
            best_pos[better] = p[better]
            best[better] = phase_markers.index(name)
        got = best >= 0
        stack_marker[got] = best[got]
        decided |= got
    tl_codes = np.array([PHASE_CODE[rules.timeline[m]] for m in phase_markers] + [-1], dtype=np.int8)
    stack_timeline = tl_codes[stack_marker]          # -1 index -> the trailing -1
    stack_timeline[stack_marker < 0] = -1

    rule_ok = []
    for r in rules.rules:
        ok = np.ones(n, dtype=bool)
        for m in r.markers:
            ok &= has[m]
        for m in r.not_markers:
            ok &= ~has[m]
        if r.stack_phase is not None:
            allowed = [phase_markers.index(m) if m != "none" else -1 for m in r.stack_phase]
            ok &= np.isin(stack_marker, allowed)
        if r.top is not None:
            tm = np.zeros(len(sf.table.kind), dtype=bool)
            for m in r.top:
                tm |= sf.frame_mask(m)
            ok &= sf.top_mask(tm)
        if r.op is not None:
            ok &= sf.op_mask(r.op)
        if r.innermost is not None:
            im = np.zeros(len(sf.table.kind), dtype=bool)
            for m in r.innermost:
                im |= sf.frame_mask(m)
            ok &= sf.first_pos(im) == 0
        if r.profiler_converted is not None and r.profiler_converted != profiler_like:
            ok[:] = False
        if r.frames == "empty":
            ok &= sf.lengths == 0
        elif r.frames == "present":
            ok &= sf.lengths > 0
        rule_ok.append(ok)
    dequant = sf.any(sf.frame_mask(Matcher(name=r"(?i)dequant", kind=(KIND_PYTHON,))))
    return SnapshotFacts(sf, list(rules.markers), has, pos, stack_marker, stack_timeline, phase_markers,
                         rule_ok, profiler_like, dequant)


def version_chains(allocs, enabled: bool):
    """(root, last) per allocation row: the first and last version of its chain."""
    n = len(allocs)
    if not enabled or n == 0:
        # every row its own chain: one identity for both, in int32 below 2^31 rows (it lives
        # through classify and into the analysis: 35 MB as int64 at 4.4 million rows)
        ident = np.arange(n, dtype=np.int32 if n < 2**31 - 1 else np.int64)
        return ident, ident
    ar = np.arange(n, dtype=np.int64)
    cand, ok = version_bumps(allocs)
    parent = np.where(ok, cand, ar)
    while True:
        nxt = parent[parent]
        if np.array_equal(nxt, parent):
            break
        parent = nxt
    root = parent
    last = ar.copy()
    np.maximum.at(last, root, ar)
    return root, last[root]


def quantized_sizes(allocs, sfacts: SnapshotFacts, frameless_pre: np.ndarray) -> set:
    """Sizes of frameless pre-trace blocks explained as packed weights / absmax buffers of
    the dequantizations seen in the trace (bitsandbytes-style blockwise 4/8-bit).

    For a dequantized weight of D bytes (itemsize 2 or 4, so n = D/itemsize elements) the
    packed weight has n*bits/8 bytes and the absmax n/blocksize*4 bytes (fp32) or
    n/blocksize (nested, uint8). One (itemsize, bits, blocksize) hypothesis is chosen for
    the whole file: the one that explains the most dequantization sizes with BOTH a packed
    weight and an absmax buffer among the frameless blocks."""
    traced = allocs.alloc_index >= 0
    st = np.maximum(allocs.stack, 0)
    dq = traced & sfacts.dequant[st] & (allocs.size >= 4096)
    if not dq.any() or not frameless_pre.any():
        return set()
    dsizes = unique(allocs.size[dq]).tolist()
    pre_sizes = set(unique(allocs.size[frameless_pre]).tolist())
    best, best_score = None, 0
    for itemsize in (2, 4):
        for bits in (4, 8):
            for bs in (64, 128, 256, 512, 1024, 2048, 4096):
                score, hits = 0, set()
                for d in dsizes:
                    if d % itemsize:
                        continue
                    ne = d // itemsize
                    packed = ne * bits // 8
                    absmax = [ne // bs * 4, ne // bs] if ne % bs == 0 else []
                    am = [a for a in absmax if a in pre_sizes]
                    if packed in pre_sizes and am:
                        score += 1
                        hits.add(packed)
                        hits.update(am)
                if score > best_score:
                    best, best_score = hits, score
    return best or set()


@dataclass
class Classified:
    category: np.ndarray      # uint8 per allocation row
    rule: np.ndarray          # int16 per allocation row (index into rule_names; 0 = none)
    evidence: np.ndarray      # uint8 per allocation row (index into evidence.EVIDENCE)
    root: np.ndarray          # int32 per row: first version of its chain
    last: np.ndarray          # int32 per row: last version of its chain
    row_phase: np.ndarray     # uint8 per row: phase at its chain's allocation (P_*; P_PRE)


def _freed_within_run(trace, ai, fi, pre, stack_has) -> np.ndarray:
    """Per allocation chain (allocated at entry `ai`, its last version freed at `fi`): freed
    before the run of consecutive allocations whose stacks have the marker ends, i.e. before
    the next allocation without it. For `recompute`: scratch of an activation-checkpointing
    recompute, freed before the backward op it was recomputed for runs."""
    if not stack_has.any():
        return np.zeros(len(ai), dtype=bool)
    act = np.asarray(trace.columns["action"])
    stk = np.asarray(trace.columns["stack"])
    alloc_at = np.flatnonzero(act == A_ALLOC)
    st = stk[alloc_at]
    marked = np.where(st >= 0, stack_has[np.maximum(st, 0)], False)
    # for every alloc entry: the trace index of the next alloc entry without the marker
    outside = alloc_at[~marked]
    k = np.searchsorted(outside, np.maximum(ai, 0), side="right")
    run_end = np.where(k < len(outside), outside[np.minimum(k, len(outside) - 1)], len(act))
    return (~pre) & (fi >= 0) & (fi < run_end)


def _gradient_sized(size: np.ndarray, category: np.ndarray, pre: np.ndarray, todo: np.ndarray, ok: np.ndarray,
                    n_iterations: int) -> np.ndarray:
    """For `size_match = "gradients"`: which of the candidate rows `todo[ok]` are sized like
    the gradients the trace itself makes (the rows earlier rules called gradients), as a
    whole set: per size, no more blocks than one step's gradients of that size. The
    previous step's gradients, left live by a `zero_grad()` that comes late, are exactly
    that set; a chance match of one size is not."""
    out = np.zeros(len(todo), dtype=bool)
    grads = (category == CATEGORY_CODE["gradients"]) & ~pre
    if not grads.any() or not ok.any():
        return out
    g_sizes, g_counts = np.unique(size[grads], return_counts=True)
    per_step = -(-g_counts // max(1, n_iterations))
    cand = todo[ok]
    c_sizes, c_inv, c_counts = np.unique(size[cand], return_inverse=True, return_counts=True)
    k = np.searchsorted(g_sizes, c_sizes)
    kc = np.minimum(k, len(g_sizes) - 1)
    fits = (g_sizes[kc] == c_sizes) & (c_counts <= per_step[kc])
    out[np.flatnonzero(ok)] = fits[c_inv]
    return out


PARAM_LOOP_SHARE = 0.8      # of a stack's candidates, the parameter-sized share that makes it a loop over parameters
PARAM_LOOP_PER_ITER = 4     # ... and at least this many of them per iteration


def _parameter_sized(size: np.ndarray, stack: np.ndarray, category: np.ndarray, pre: np.ndarray,
                     never: np.ndarray, todo: np.ndarray, ok: np.ndarray, n_iterations: int) -> np.ndarray:
    """For `size_match = "parameters"`: which candidate rows `todo[ok]` come from a loop over
    the model's parameters, one tensor the size of each (a perturbation, an update, a copy):
    per stack, most of its candidates are the size of a weight (the blocks live before the
    trace and never freed, or rows earlier rules called weights), several per iteration.
    A batch is one or two tensors a step, not one per parameter."""
    out = np.zeros(len(todo), dtype=bool)
    weights = (pre & never) | (category == CATEGORY_CODE["weights"])
    if not weights.any() or not ok.any():
        return out
    psizes = unique(size[weights])
    cand = todo[ok]
    sized = isin(size[cand], psizes)
    st = stack[cand].astype(np.int64)
    ust, inv = unique_inverse(st)
    n = np.bincount(inv)
    hits = np.bincount(inv, weights=sized.astype(np.float64))
    loop = (hits >= PARAM_LOOP_SHARE * n) & (hits >= PARAM_LOOP_PER_ITER * max(1, n_iterations)) & (ust >= 0)
    out[np.flatnonzero(ok)] = loop[inv] & sized
    return out


def _optimizer_moments(size: np.ndarray, addr: np.ndarray, category: np.ndarray, pre: np.ndarray,
                       todo: np.ndarray, ok: np.ndarray, n_iterations: int, stepped: bool) -> np.ndarray:
    """For `size_match = "optimizer_moments"`: among blocks live before the trace with no
    frames (the candidates), the ones that are most likely Adam's two moments of the
    parameters whose gradients the trace makes: for a size with g gradients a step, 3g such
    blocks are a parameter and two moments each (the two with the higher addresses taken as
    the moments: which is which cannot be seen), and 2g of a size twice that of g others are
    fp32 moments of 16-bit parameters. Only in a trace whose optimizer steps."""
    out = np.zeros(len(todo), dtype=bool)
    grads = (category == CATEGORY_CODE["gradients"]) & ~pre
    if not stepped or not grads.any() or not ok.any():
        return out
    g_sizes, g_counts = np.unique(size[grads], return_counts=True)
    per_step = dict(zip(g_sizes.tolist(), (-(-g_counts // max(1, n_iterations))).tolist()))
    cand = todo[ok]
    c_sizes, c_counts = np.unique(size[cand], return_counts=True)
    have = dict(zip(c_sizes.tolist(), c_counts.tolist()))
    pick = np.zeros(len(cand), dtype=bool)
    for sz, c in have.items():
        g = per_step.get(sz, 0)
        if not g:
            continue
        take = 2 * g if c == 3 * g else (c if c == 2 * g and have.get(sz // 2, 0) >= g and sz % 2 == 0 else 0)
        if take:
            rows = np.flatnonzero(size[cand] == sz)
            pick[rows[np.argsort(addr[cand[rows]], kind="stable")[c - take:]]] = True
    out[np.flatnonzero(ok)] = pick
    return out


# cuBLAS's workspace, per handle and stream (CUBLAS_WORKSPACE_CONFIG's default :4096:2:16:8 before
# Hopper, :4096:8 on Hopper): a frameless block of one of these sizes, a few of them at most (one
# per handle and stream), in a CUDA trace (a profiler-converted CPU run has none)
CUBLAS_WORKSPACE_SIZES = (8_519_680, 4_325_376, 33_554_432, 33_685_504)
CUBLAS_WORKSPACES_AT_MOST = 4
FOURS_SHARE = 0.8           # of a state-only dump's frameless bytes, this share in sizes that come in fours


def _autocast_copies(size, stack, category, pre, never, ai, n_pass, todo, ok, autocast_marked,
                     dropout_marked) -> np.ndarray:
    """For `size_match = "autocast_copy"`: forward rows that are autocast's 16-bit copy of a
    weight: half the size of a weight matrix (rows earlier rules called weights, or blocks live
    before the trace and never freed), and either made under at::autocast's cast (C++ frames),
    or made right before an allocation of the same stack (the op that reads the copy: the cast
    happens inside the op's call, before its output), or, for a size, about one per weight of
    twice its size in every forward pass."""
    out = np.zeros(len(todo), dtype=bool)
    weights = (category == CATEGORY_CODE["weights"]) | (pre & never)
    mats = size[weights & (size >= 64 * 1024)]
    if len(mats) < 2 or not ok.any():
        return out
    halves = unique(mats[mats % 2 == 0] // 2)
    # per place in `todo`, not per candidate gathered out of it: a bool each, where the
    # candidates' row numbers were 8 bytes each (35 MB at 4.4 million rows, at the highest memory
    # of a cold `summary` of a torch 2.0 trace of 10^7 entries)
    half = isin(size, halves)[todo]           # (not the candidates' sizes gathered: 8 bytes each)
    half &= ok
    if not half.any():
        return out
    if autocast_marked.any():
        st_c = stack[todo]
        by_marker = autocast_marked[np.maximum(st_c, 0)] & (st_c > 0)
        by_marker &= ok
        del st_c
    else:                           # (no stack shows autocast's cast: no gather of every candidate's)
        by_marker = np.zeros(len(todo), dtype=bool)
    # where a size is also an activation's, the copy is the one made right before an allocation of
    # the same stack and another size (the op's output follows its casts)
    # only candidates of half a weight matrix's size can be copies: what follows looks at those
    # (a size's counts are the same among them, every candidate of the size being one)
    hc = todo[half]
    n_pass = max(1, n_pass)
    w_counts = dict(zip(*[x.tolist() for x in np.unique(mats, return_counts=True)]))
    # the candidates' sizes numbered among the half sizes (each is one: sorted, distinct), not
    # sorted again (a torch 2.0 trace of 10^7 entries: 930,000 candidates, six arrays of them
    # at classify's highest memory); a half size with no candidate counts none
    c_sizes = halves
    c_inv = np.searchsorted(halves, size[hc])
    c_all = np.bincount(c_inv, minlength=len(c_sizes))
    if not by_marker.any():
        # the most the sizes' counts can call copies (a size counted among those made right
        # before their op is counted among all its candidates too): under the least the test
        # below asks for, nothing is a copy, and the ops' order is not looked at
        most = sum(k for k, c in ((w_counts.get(int(s) * 2, 0), c) for s, c in zip(c_sizes.tolist(), c_all.tolist()))
                   if k and c >= k * n_pass)
        if most < max(2, 0.25 * len(mats)):
            return out
    if len(ai) > 1 and bool((ai[1:] >= ai[:-1]).all()):
        # the rows in the order of their allocation (those live before the trace first, at -1):
        # the allocated ones are a slice, no index of them (35 MB at 4.4 million rows)
        first = int(np.searchsorted(ai, ai.dtype.type(0)))     # (a Python 0 makes numpy cast ai whole)
        ai_sorted = ai[first:]
        order = None
    else:
        order = np.flatnonzero(ai >= 0)
        ai_sorted = ai[order]
        if len(order) > 1 and not bool((ai_sorted[1:] >= ai_sorted[:-1]).all()):
            # (version chains' roots reorder them)
            by_ai = np.argsort(ai_sorted, kind="stable")
            order, ai_sorted = order[by_ai], ai_sorted[by_ai]
    same_op = np.zeros(len(hc), dtype=bool)
    if len(ai_sorted):
        pos = np.searchsorted(ai_sorted, ai[hc], side="right")
        nxt = np.minimum(pos, len(ai_sorted) - 1)
        if order is None:
            nxt += first
        else:
            nxt = order[nxt]
        same_op = (pos < len(ai_sorted)) & (stack[nxt] == stack[hc]) & (stack[hc] > 0) & (size[nxt] != size[hc])
        same_op &= ~dropout_marked[np.maximum(stack[hc], 0)]        # a dropout's mask comes before its output too
    # per size: about one per weight of twice the size in every forward pass, of all the size's
    # candidates or of those made right before their op's output
    c_same = np.bincount(c_inv, weights=same_op.astype(np.float64), minlength=len(c_sizes))

    def fits(s, c):
        k = w_counts.get(int(s) * 2, 0)
        return bool(k) and k * n_pass <= c <= 1.25 * k * n_pass + n_pass
    counted = np.array([fits(s, c) for s, c in zip(c_sizes.tolist(), c_all.tolist())], dtype=bool)
    counted_same = np.array([fits(s, c) for s, c in zip(c_sizes.tolist(), c_same.tolist())], dtype=bool) & ~counted
    # autocast is on only where its casts show in the frames, or most weight matrices have their
    # copies counted so (an fp32 run's activations of a weight's half size are not copies); a
    # size with more candidates than copies could be (activations of the same size: a small
    # model, or a batch that makes them so) and not told apart by their op decides nothing
    hit = sum(w_counts.get(int(s) * 2, 0) for s in c_sizes[counted | counted_same].tolist())
    crowded = sum(w_counts.get(int(s) * 2, 0) for s, c in zip(c_sizes.tolist(), c_all.tolist())
                  if c > 1.25 * w_counts.get(int(s) * 2, 0) * n_pass + n_pass) - \
        sum(w_counts.get(int(s) * 2, 0) for s in c_sizes[counted_same].tolist())
    if not by_marker.any() and (hit < 0.75 * (len(mats) - crowded) or hit < max(2, 0.25 * len(mats))):
        return out
    out[half] = by_marker[half] | counted[c_inv] | (counted_same[c_inv] & same_op)
    return out


def _workspace_sized(size, todo, ok, profiler_like: bool) -> np.ndarray:
    """For `size_match = "cublas_workspace"`: candidates of a cuBLAS workspace's size, where a
    size has a few of them at most (one per handle and stream), in a CUDA trace."""
    out = np.zeros(len(todo), dtype=bool)
    if profiler_like or not ok.any():
        return out
    cand = todo[ok]
    hit = isin(size[cand], CUBLAS_WORKSPACE_SIZES)
    if hit.any():
        u, inv, cnt = np.unique(size[cand], return_inverse=True, return_counts=True)
        hit &= cnt[inv] <= CUBLAS_WORKSPACES_AT_MOST
    out[np.flatnonzero(ok)] = hit
    return out


def _fours(size, addr, frameless_pre, todo, ok, traced: bool, part: str, memo: dict) -> np.ndarray:
    """For `size_match = "fours_*"`: in a state-only dump (no trace) whose frameless blocks come
    in fours of a size (a weight, its gradient and Adam's two moments, as a training step leaves
    them), a quarter of each such size read as weights, a quarter as gradients and half as
    optimizer state, by address (which is which cannot be seen: a guess). The roles are found
    once for the three rules (`memo`)."""
    out = np.zeros(len(todo), dtype=bool)
    if traced or not ok.any():
        return out
    if "fours" not in memo:
        memo["fours"] = _fours_roles(size, addr, frameless_pre)
    role = memo["fours"]
    if role is None:
        return out
    want = {"fours_weights": 0, "fours_gradients": 1, "fours_moments": 2}[part]
    out[np.flatnonzero(ok)] = role[todo[ok]] == want
    return out


def _fours_roles(size, addr, frameless_pre) -> np.ndarray | None:
    """Per row: 0 weight, 1 gradient, 2 optimizer state, -1 none, for `_fours`; None where the
    frameless blocks do not come in fours enough. Each size's blocks by address: the first
    quarter, the second, the rest (one sort by size and address, not a sort per size)."""
    pool = np.flatnonzero(frameless_pre & (size >= 1 << 20))
    if not len(pool):
        return None
    ps = size[pool]
    u, c = np.unique(ps, return_counts=True)
    fours = u[c % 4 == 0]
    in_fours = np.isin(ps, fours)
    if float(ps[in_fours].sum()) < FOURS_SHARE * float(ps.sum()):
        return None
    rows = pool[in_fours]
    rows = rows[np.lexsort((addr[rows], size[rows]))]      # by size, then address (stable)
    rs = size[rows]
    starts = np.flatnonzero(np.r_[True, rs[1:] != rs[:-1]])
    counts = np.diff(np.r_[starts, len(rows)])
    rank = np.arange(len(rows)) - np.repeat(starts, counts)
    q = np.repeat(counts // 4, counts)
    role = np.full(len(size), -1, dtype=np.int8)
    role[rows] = np.where(rank < q, 0, np.where(rank < 2 * q, 1, 2))
    return role


def _one_of(codes: list) -> np.ndarray:
    """bool per uint8 code: whether it is one of `codes` (a table to index by the codes: one
    gather where np.isin sorts or builds a table of its own)."""
    table = np.zeros(256, dtype=bool)
    table[codes] = True
    return table


def timeline_of(snap, trace, allocs, live_after, sfacts: SnapshotFacts, rules: RuleSet, device: int,
                frees_carry_alloc: bool | None = None) -> Timeline:
    """The device's phases and iterations (timeline.build_timeline) from the snapshot's stack
    facts. `allocs` may be None where `frees_carry_alloc` is given and the file is not
    profiler-converted: then it can be built beside the rows' pairing."""
    marker_idx = {m: i for i, m in enumerate(sfacts.phase_markers)}
    blocking = [marker_idx[m] for m in ("model_load", "construct") if m in marker_idx]
    return build_timeline(snap, device, trace, allocs, sfacts.stack_timeline, sfacts.stack_marker,
                          np.asarray(blocking, dtype=np.int16), rules, sfacts.profiler_like, live_after,
                          frees_carry_alloc)


def classify_device(snap, trace, allocs, live_after, sfacts: SnapshotFacts, rules: RuleSet, device: int,
                    begun=None):
    """-> (Timeline, Classified). `live_after()`: the live bytes after each entry (LiveModel's),
    asked for only where the phases must be found from memory's periodicity. `begun`: a
    `Later` of the timeline begun before the rows were paired, on a guess of whether frees carry
    their allocation's frames (timeline.guess_frees_carry_alloc_frames): taken where the rows
    give the same answer, else built again here with theirs."""
    tl = begun.get() if begun is not None else None
    exact = None
    if tl is not None:
        exact = frees_carry_alloc_frames(allocs, np.asarray(trace.columns["stack"]), sfacts.profiler_like)
        if tl.frees_carry_alloc_frames != exact:
            tl = None
    if tl is None:
        tl = timeline_of(snap, trace, allocs, live_after, sfacts, rules, device, exact)
    n = len(allocs)
    root, last = version_chains(allocs, sfacts.profiler_like)
    # without version chains (a CUDA trace) every row is its own chain: its columns as they are
    # (read only here), not a copy of each through the identity
    chained = bool(sfacts.profiler_like and n)

    def of_root(col):
        return col[root] if chained else col
    ai = of_root(allocs.alloc_index)
    fi = allocs.free_index[last] if chained else allocs.free_index
    stk = of_root(allocs.stack)
    size_r, addr_r = of_root(allocs.size), of_root(allocs.addr)
    st0 = np.maximum(stk, 0)
    pre = ai < 0
    phase_e = tl.phase
    n_ent = len(phase_e)
    aic = np.clip(ai, 0, max(n_ent - 1, 0))
    fic = np.clip(fi, 0, max(n_ent - 1, 0))
    if n_ent:
        row_phase = np.where(pre, -1, phase_e[aic]).astype(np.int16)
        free_phase = np.where(fi < 0, P_NEVER, phase_e[fic]).astype(np.uint8)
        ids = tl.segment_ids()              # (per entry, made here and dropped: not kept by the timeline)
        seg_a = ids[aic]
        seg_f = ids[fic]
        ids = tl.iteration_ids()
        it_a = np.where(pre, -1, ids[aic]).astype(np.int32)
        it_f = np.where(fi < 0, -1, ids[fic]).astype(np.int32)
        del ids
    else:
        row_phase = np.full(n, -1, dtype=np.int16)
        free_phase = np.full(n, P_NEVER, dtype=np.uint8)
        seg_a = seg_f = np.zeros(n, dtype=np.int64)
        it_a = it_f = np.full(n, -1, dtype=np.int32)
    # blocks from before the trace: the phase their stack names, else "pre"
    stl = sfacts.stack_timeline[st0]
    row_phase = np.where(pre, np.where(stl >= 0, stl, P_PRE), row_phase).astype(np.uint8)
    phase_from_stack = pre & (stl >= 0)
    freed = np.full(n, F_LATER_PHASE, dtype=np.uint8)
    freed[fi < 0] = F_NEVER
    traced_freed = (~pre) & (fi >= 0)
    freed[traced_freed & (seg_a == seg_f)] = F_SAME
    freed[traced_freed & (seg_a != seg_f) & (it_f > it_a) & (it_a >= 0)] = F_LATER_ITER
    del it_a, it_f                  # (not needed past here: 31 MB at 10^7 events)
    if n_ent:
        # a trace that begins inside a phase (a ring buffer that wrapped mid-backward): a block
        # from before it, of that phase by its stack, freed before the phase ends, was made in
        # the same run of it
        is_shown = phase_e != PHASE_CODE["none"]
        k = int(np.argmax(is_shown))                    # the first entry of a phase, if any
        shown = bool(is_shown[k])
        del is_shown                                    # (a bool per entry: 10 MB at 10^7)
        if shown:
            run_phase, run_seg = int(phase_e[k]), int(tl.segment_of(k))
            freed[pre & (fi >= 0) & (seg_f == run_seg) & (stl == run_phase)] = F_SAME
    del traced_freed, seg_a, seg_f, stl
    first = tl.first_start
    before_training = pre | (ai < first) if first >= 0 else np.ones(n, dtype=bool)
    frameless_pre = pre & (sfacts.stacks.lengths[st0] == 0)
    traced = bool(n_ent) and bool((np.asarray(trace.columns["action"]) == A_ALLOC).any())
    qsizes = quantized_sizes(allocs, sfacts, frameless_pre)
    size_q = isin(size_r, list(qsizes)) if qsizes else np.zeros(n, dtype=bool)

    # how many other allocations were made while it lived (never freed: a lot)
    if n_ent:
        act = np.asarray(trace.columns["action"])
        alloc_or_oom = act == A_ALLOC
        alloc_or_oom |= act == A_OOM                          # a failed allocation counts too
        cum = np.cumsum(alloc_or_oom, dtype=np.int32 if n_ent < 2**31 - 1 else np.int64)
        del alloc_or_oom
        alive_allocs = np.where((fi >= 0) & ~pre, cum[fic] - cum[aic], np.iinfo(np.int32).max)
        del cum, aic, fic
    else:
        alive_allocs = np.full(n, np.iinfo(np.int32).max)
    # the stack of each chain's free, where the file's frees carry their own frames (not the
    # allocation's): what freed it (zero_grad, the optimizer, the user's code, a quantizer)
    own_free = not tl.frees_carry_alloc_frames and n_ent > 0
    if own_free:
        tstack = np.asarray(trace.columns["stack"])
        own = np.where(fi >= 0, tstack[np.clip(fi, 0, n_ent - 1)], -1).astype(np.int64)
        free_framed = (own >= 0) & (sfacts.stacks.lengths[np.maximum(own, 0)] > 0)
        fst: np.ndarray | None = own
        del own
    else:
        fst = None                  # (no free of its own frames: no stack to look up per row)
        free_framed = np.zeros(n, dtype=bool)

    def free_has(m):
        if fst is None:
            return free_framed
        return free_framed & sfacts.has_marker[m][np.maximum(fst, 0)]
    within = {m: _freed_within_run(trace, ai, fi, pre, sfacts.has_marker[m])
              for m in {r.freed_within for r in rules.rules if r.freed_within}} if n_ent else {}
    category = np.full(n, UNKNOWN, dtype=np.uint8)
    rule = np.zeros(n, dtype=np.int16)
    # classify chain roots, then copy to the other versions
    # (row numbers as numpy's own index type: an int32 index is made int64 by every gather, twice
    # the time of each of the rules' dozens)
    todo = np.flatnonzero(root == np.arange(n)) if chained else np.arange(n)
    st_todo = st0[todo]                 # kept beside todo: compressed with it, not gathered again
    fours_memo: dict = {}
    for ri, r in enumerate(rules.rules):
        if not len(todo):
            break
        stack_ok = sfacts.rule_stack_ok[ri]
        if not stack_ok.any():          # no stack of this trace passes the rule's frames
            continue
        ok = stack_ok[st_todo]
        if r.phase is not None:
            ok &= _one_of([PHASE_CODE[p] for p in r.phase])[row_phase[todo]]
        if r.free_phase is not None:
            ok &= _one_of([PHASE_CODE[p] for p in r.free_phase])[free_phase[todo]]
        if r.freed is not None:
            ok &= _one_of([FREED_CODE[f] for f in r.freed])[freed[todo]]
        if r.preexisting is not None:
            ok &= pre[todo] == r.preexisting
        if r.before_training is not None:
            ok &= before_training[todo] == r.before_training
        if r.max_allocs_alive is not None:
            ok &= alive_allocs[todo] <= r.max_allocs_alive
        if r.freed_within is not None:
            ok &= within[r.freed_within][todo] if n_ent else False
        for m in r.free_markers:
            ok &= free_has(m)[todo]
        if r.free_not_markers:
            ok &= free_framed[todo]
            for m in r.free_not_markers:
                ok &= ~free_has(m)[todo]
        if r.size_match == "quantized":
            ok &= size_q[todo]
        elif r.size_match == "parameters":
            ok &= _parameter_sized(size_r, stk, category, pre, fi < 0, todo, ok, len(tl.iterations))
        elif r.size_match == "optimizer_moments":
            ok &= _optimizer_moments(size_r, addr_r, category, pre, todo, ok,
                                     len(tl.iterations), bool((phase_e == PHASE_CODE["optimizer"]).any()))
        elif r.size_match == "gradients":
            ok &= _gradient_sized(size_r, category, pre, todo, ok, len(tl.iterations))
        elif r.size_match == "autocast_copy":
            # the forward passes: entries of the forward phase right after one that is not
            fwd = phase_e == PHASE_CODE["forward"]
            n_pass = int(fwd[0]) + int(np.count_nonzero(fwd[1:] > fwd[:-1])) if len(fwd) else 0
            del fwd
            none_marked = np.zeros(sfacts.stacks.n_stacks + 1, dtype=bool)
            ok &= _autocast_copies(size_r, stk, category, pre, fi < 0, ai, n_pass, todo, ok,
                                   sfacts.has_marker.get("autocast_cast", none_marked),
                                   sfacts.has_marker.get("dropout_op", none_marked))
        elif r.size_match == "cublas_workspace":
            ok &= _workspace_sized(size_r, todo, ok, sfacts.profiler_like)
        elif r.size_match in ("fours_weights", "fours_gradients", "fours_moments"):
            ok &= _fours(size_r, addr_r, frameless_pre, todo, ok, traced, r.size_match, fours_memo)
        if r.trace is not None:
            ok &= traced == r.trace
        hit = todo[ok]
        category[hit] = CATEGORIES.index(r.category)
        rule[hit] = ri + 1
        keep = ~ok
        todo = todo[keep]
        st_todo = st_todo[keep]
    levels = np.array([E_NONE] + [EVIDENCE_CODE[r.evidence] for r in rules.rules], dtype=np.uint8)
    evidence = row_evidence(rule, levels, sfacts.stacks.lengths[st0] > 0, pre, fi < 0, phase_from_stack)
    evidence[category == UNKNOWN] = E_NONE          # what no rule could tell rests on nothing
    if chained:
        category = category[root]
        rule = rule[root]
        evidence = evidence[root]
    idx_t = np.int32 if n < 2**31 - 1 else np.int64
    root_i = root.astype(idx_t, copy=False)
    last_i = root_i if last is root else last.astype(idx_t, copy=False)
    return tl, Classified(category, rule, evidence, root_i, last_i, row_phase)


__all__ = ["stack_pass", "classify_device", "SnapshotFacts", "Classified", "version_chains", "quantized_sizes"]
