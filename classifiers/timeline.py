"""Phases (forward / backward / optimizer) of every trace entry, and training iterations.

Evidence, all vectorized over entries:
  * the entry's stack: its phase marker (rules.toml [phases]) maps to a timeline phase.
    `alloc` entries always count; `free_requested` entries count too unless the file
    gives frees the allocation's frames (profiler-converted files, context='alloc'), which
    we detect by comparing the stacks of paired allocs and frees;
  * external_annotations (record_function regions with time_us), mapped by name;
  * allocations with empty frames in a file that otherwise records Python frames: the
    autograd engine's device thread (stacks='python' gives it no frames). Right after
    forward or backward evidence they are backward evidence.
Entries without evidence take the phase of the last evidence before them, except that a
stretch leading into a forward is outside the phases (the next batch being prepared).
An out-of-memory error ends what was running: the entries after an `oom` entry up to the next
allocation are the unwinding (P_UNWIND: the exception's frames let go of their tensors; frees
only, whatever their frames say), never backward. A program that catches the error and goes on
starts again at its next allocation.

Iterations: with optimizer steps, an iteration is everything from a forward that follows
an optimizer step (or the first forward) to the end of the next optimizer step; several
forward/backward pairs before one step are micro-batches. Without optimizer steps,
backward ends an iteration; without either, each forward run separated by non-training
work is one (source "forward_runs": a guess, nothing marks where an iteration ends; one
inference may make several such runs). Allocations before the first iteration are "before
training".
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..parsers.tables import A_ALLOC, A_FREE, A_FREE_COMPLETED, A_FREE_REQUESTED, A_OOM, take_released
from .iterations import NO_TIME, Iterations, starts_ends
from .results import Region

MANY_RANGES = 20_000       # more disjoint ranges than this are marked at once, not one by one
P_NONE, P_INPUTS, P_FORWARD, P_BACKWARD, P_OPTIMIZER, P_PRE = range(6)
P_NEVER = 6
P_UNWIND = 7        # after an out-of-memory error: the exception unwinding, tensors freed as frames go
PHASE_NAMES = ("none", "inputs", "forward", "backward", "optimizer", "pre", "never", "unwind")
PHASE_CODE = {n: i for i, n in enumerate(PHASE_NAMES)}


@dataclass
class Timeline:
    """The phase of every entry; the runs of equal phase ("segments") and the iterations as
    bounds, not as an id per entry (two int32 per entry were 80 MB at 10^7 events, kept for
    the analysis' whole life): `segment_of` / `iteration_of` look a few entries up, and
    `segment_ids` / `iteration_ids` make the id of every entry for a pass over all rows, for
    the caller to drop."""
    phase: np.ndarray          # uint8 per entry (P_*)
    seg_start: np.ndarray      # int64 per run of equal phase (as first found): its first entry, ascending from 0
    iterations: Sequence = field(default_factory=tuple)   # Iterations (peaks not filled in yet), in order
    first_start: int = -1      # entry where the first iteration starts (-1: no iterations)
    frees_carry_alloc_frames: bool = False
    _bounds: tuple = field(default=(None, None, None), init=False, repr=False, compare=False)

    # -- runs of equal phase --------------------------------------------------------------
    def segment_ids(self) -> np.ndarray:
        """int32 per entry: the run of equal phase it belongs to (numbered from 0)."""
        ids = np.zeros(len(self.phase), dtype=np.int32)
        ids[self.seg_start[1:]] = 1
        return np.cumsum(ids, out=ids)

    def segment_of(self, index):
        """The run of each of the entries `index` (an int or an array of them, in the trace)."""
        return np.searchsorted(self.seg_start, index, side="right") - 1

    def segment_bounds(self, seg):
        """(first entry, last entry) of the runs `seg` (an int or an array of them)."""
        ends = np.r_[self.seg_start[1:] - 1, len(self.phase) - 1]
        return self.seg_start[seg], ends[seg]

    # -- iterations -----------------------------------------------------------------------
    def _iteration_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(first entry, last entry) of each iteration, made once per list of iterations
        (the analysis replaces the list by one with its peaks filled in)."""
        its = self.iterations
        if self._bounds[0] is not its:
            self._bounds = (its, *starts_ends(its))
        return self._bounds[1], self._bounds[2]

    def iteration_ids(self) -> np.ndarray:
        """int32 per entry: its iteration's `number - 1`, -1 outside every iteration."""
        n = len(self.phase)
        starts, ends = self._iteration_bounds()
        if len(starts) > MANY_RANGES:   # every iteration at once: its number at its start, carried on
            ids = np.zeros(n + 1, dtype=np.int32)
            num = np.arange(1, len(starts) + 1, dtype=np.int32)   # (+1: 0 marks nothing)
            ids[starts] = num               # (disjoint and in order)
            ids[ends + 1] -= num
            np.cumsum(ids, out=ids)         # (in place: no second array of every entry)
            ids -= 1
            return ids[:n]
        ids = np.full(n, -1, dtype=np.int32)
        for k, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
            ids[a:b + 1] = k
        return ids

    def iteration_of(self, index):
        """`iteration_ids()` at the entries `index` (an int or an array of them), found by a
        search of the iterations' bounds."""
        starts, ends = self._iteration_bounds()
        if isinstance(index, (int, np.integer)):
            # one entry (a peak's, a finding's): a bisection of the arrays, a few microseconds,
            # where numpy's search of one value took 17 (and their lists, at 1.3 million
            # iterations, 107 MB at the viewer's highest memory)
            i = int(index)
            j = bisect_right(starts, i) - 1
            return j if j >= 0 and i <= int(ends[j]) else -1
        k = np.searchsorted(starts, index, side="right") - 1
        kc = np.maximum(k, 0)
        inside = (k >= 0) & (np.asarray(index) <= ends[kc]) if len(ends) else np.zeros(np.shape(k), bool)
        out = np.where(inside, k, -1)
        return int(out) if np.ndim(out) == 0 else out.astype(np.int32)


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _int64s(values: list) -> np.ndarray:
    """Times from the file (any Python int) as int64, clamped: a search needs no more."""
    return np.array([min(max(v, _I64_MIN), _I64_MAX) for v in values], dtype=np.int64)


def annotation_regions(annotations, device: int, rules=None) -> list[Region]:
    """The snapshot's record_function regions on `device`: each START paired with the END
    of the same name that closes it (innermost first, as the regions nest), in START
    order; a START never closed gets `end_us` None. With `rules`, each region gets the
    phase its name maps to (rules.toml [annotations]), else ""."""
    open_: dict = {}
    out: list = []
    for k, a in enumerate(annotations or ()):
        if not isinstance(a, dict):
            continue
        dev = a.get("device")
        if dev is not None and dev != device:
            continue
        name, stage, t = a.get("name"), a.get("stage"), a.get("time_us")
        if not isinstance(name, str) or not isinstance(t, int) or isinstance(t, bool):
            continue
        if stage == "START":
            open_.setdefault(name, []).append(len(out))
            out.append([name, t, None, k])
        elif stage == "END" and open_.get(name):
            out[open_[name].pop()][2] = t
    regions = []
    phase_of: dict[str, str] = {}       # region names repeat (one per step): each matched once
    for name, t0, t1, k in out:
        phase = phase_of.get(name)
        if phase is None:
            phase = ""
            for rx, ph in (rules.annotations if rules is not None else ()):
                if rx.search(name):
                    phase = ph
                    break
            phase_of[name] = phase
        regions.append(Region(name, t0, t1, phase, k))
    return regions


def version_bumps(allocs):
    """(previous version, is a bump) per allocation row. Profiler-converted snapshots write an
    in-place update (a version bump) as the free of the old version right before the alloc
    of the new one: same address, size and stack, the stack being the FIRST version's."""
    n = len(allocs)
    ar = np.arange(n, dtype=np.int64)
    if n == 0:
        return ar, np.zeros(0, dtype=bool)
    fi = allocs.free_index
    ai = allocs.alloc_index
    order = np.argsort(fi, kind="stable")
    sfi = fi[order]
    target = ai - 1
    pos = np.searchsorted(sfi, target)
    pos = np.minimum(pos, n - 1)
    cand = order[pos]
    ok = (ai > 0) & (sfi[pos] == target) & (fi[cand] >= 0)
    ok &= allocs.addr[cand] == allocs.addr
    ok &= allocs.size[cand] == allocs.size
    ok &= allocs.stack[cand] == allocs.stack
    ok &= cand != ar
    return cand, ok


def periodic_boundaries(live_after: np.ndarray, min_periods: int = 3) -> list:
    """Iteration ends found from the periodicity of live memory alone (for traces whose
    stacks say nothing about phases, e.g. recorded without frames): the lag of the highest
    autocorrelation peak of the detrended live-bytes curve (FFT, on at most 2^16 points)
    is the period; each iteration ends at the lowest live memory near a multiple of it.
    The first end is the lowest point of the first period, so an iteration only starts after
    it; the last one may end with the trace."""
    n = len(live_after)
    if n < 64:
        return []
    stride = max(1, n // 65536)
    x = live_after[::stride].astype(np.float64)
    m = len(x)
    t = np.arange(m, dtype=np.float64)
    slope, icpt = np.polyfit(t, x, 1)
    x = x - (slope * t + icpt)
    if not np.any(x):
        return []
    f = np.fft.rfft(x, 2 * m)
    ac = np.fft.irfft(f * np.conj(f))[:m]
    if ac[0] <= 0:
        return []
    ac = ac / ac[0] * (m / np.maximum(m - np.arange(m), 1))     # unbiased: no taper with the lag
    neg = np.flatnonzero(ac < 0)
    hi = m // min_periods
    if not len(neg) or neg[0] >= hi:
        return []
    z = int(neg[0])
    lag = z + int(np.argmax(ac[z:hi]))
    if ac[lag] < 0.3:
        return []
    period = lag * stride
    ends = [int(np.argmin(live_after[:period]))]
    while True:
        lo = ends[-1] + period // 2
        hi_ = min(n, ends[-1] + period + period // 2)
        if lo >= n or hi_ - lo < period // 2:
            break
        ends.append(lo + int(np.argmin(live_after[lo:hi_])))
    # a trace that stops right after an iteration ends: the tail is one more iteration when
    # it is long enough and its last entry is (nearly) its lowest point, not a cut-off one
    tail = live_after[ends[-1] + 1:]
    if len(tail) >= period * 3 // 4:
        lo_t, hi_t = int(tail.min()), int(tail.max())
        if int(tail[-1]) - lo_t <= 0.1 * (hi_t - lo_t):
            ends.append(n - 1)
    return ends


def _mark_unwinding(phase: np.ndarray, action: np.ndarray) -> None:
    """In place: the entries after each `oom` entry up to the next allocation are P_UNWIND."""
    ooms = np.flatnonzero(action == A_OOM)
    if not len(ooms):
        return
    allocs = np.flatnonzero(action == A_ALLOC)
    nxt = np.searchsorted(allocs, ooms, side="right")
    ends = np.where(nxt < len(allocs), allocs[np.minimum(nxt, len(allocs) - 1)], len(action))
    for o, e in zip(ooms.tolist(), ends.tolist()):
        phase[o + 1:e] = P_UNWIND


def unwinding(phase: np.ndarray) -> tuple[int, int] | None:
    """(first, last) entry of the unwinding that ends the trace, None when the trace goes on
    after its last out-of-memory error (or has none)."""
    n = len(phase)
    if not n or phase[-1] != P_UNWIND:
        return None
    k = np.flatnonzero(phase != P_UNWIND)
    return (int(k[-1]) + 1 if len(k) else 0, n - 1)


def frees_carry_alloc_frames(allocs, sid: np.ndarray, profiler_like: bool) -> bool:
    """Whether the trace's frees carry the frames of the allocation they end, not their own
    (the free's site): a profiler-converted file, or one where most allocations and the frees
    paired with them (`allocs`) share a stack."""
    if profiler_like:
        return True
    paired = allocs.free_index >= 0
    paired &= allocs.alloc_index >= 0
    if not paired.any():
        return True
    return _mostly_same(sid[allocs.alloc_index[paired]], sid[allocs.free_index[paired]])


def _mostly_same(alloc_sids: np.ndarray, free_sids: np.ndarray) -> bool:
    """Whether most paired allocs and frees share a stack: the one rule of `frees_carry_alloc_frames` and its guess."""
    return float(np.mean(alloc_sids == free_sids)) > 0.5


def guess_frees_carry_alloc_frames(trace, entries: int = 1 << 17) -> bool | None:
    """`frees_carry_alloc_frames` read off the trace's first `entries` entries alone (each alloc
    paired with the next free at its address there), before the rows are paired: a guess, for
    building the timeline beside the pairing, which the caller checks against the answer of
    all the rows once they are paired. None where those entries pair nothing."""
    action = np.asarray(trace.columns["action"])[:entries]
    addr = np.asarray(trace.columns["addr"])[:entries]
    sid = np.asarray(trace.columns["stack"])[:entries]
    frees = (action == A_FREE_COMPLETED) | (action == A_FREE)
    if not frees.any():
        frees = action == A_FREE_REQUESTED          # (a trace recorded without completions)
    ev = np.flatnonzero(frees | (action == A_ALLOC))
    if len(ev) < 2:
        return None
    ev = ev[np.lexsort((ev, addr[ev]))]             # by address, then time
    is_alloc = action[ev] == A_ALLOC
    pair = is_alloc[:-1] & ~is_alloc[1:] & (addr[ev[:-1]] == addr[ev[1:]])
    if not pair.any():
        return None
    return _mostly_same(sid[ev[:-1][pair]], sid[ev[1:][pair]])


def build_timeline(snap, device, trace, allocs, stack_timeline, stack_marker, blocking_markers,
                   rules, profiler_like: bool, live_after: Callable[[], np.ndarray] | None = None,
                   frees_carry_alloc: bool | None = None) -> Timeline:
    """`stack_timeline`: int8 per stack, the timeline phase of its phase marker (-1 none);
    `stack_marker`: int16 per stack, index of its phase marker (-1 none);
    `blocking_markers`: marker indices that stop an iteration's start from reaching back
    (model loading). `frees_carry_alloc`: `frees_carry_alloc_frames` where the caller has it
    (then `allocs` is read only in a profiler-converted file, and may be None otherwise)."""
    action = np.asarray(trace.columns["action"])
    sid = np.asarray(trace.columns["stack"])
    n = len(action)
    if n == 0:
        return Timeline(np.zeros(0, np.uint8), np.zeros(0, np.int64))

    # do frees carry their own (free-site) frames?
    if frees_carry_alloc is None:
        frees_carry_alloc = frees_carry_alloc_frames(allocs, sid, profiler_like)
    use = action == A_ALLOC
    if not frees_carry_alloc:
        use |= (action == A_FREE_REQUESTED) | (action == A_FREE)
    use &= sid > 0
    bump_at = np.zeros(n, dtype=bool)
    if profiler_like and len(allocs):
        # a version bump carries the stack of the tensor's first allocation, not of the op
        # that updated it (the optimizer's in-place step on gradients made in backward), so
        # it says nothing of the phase it happens in; except for optimizer state, which
        # only the optimizer step updates
        _, bump = version_bumps(allocs)
        bump_at[allocs.alloc_index[bump]] = True
        del bump
        use &= ~bump_at | (stack_timeline[np.maximum(sid, 0)] == P_OPTIMIZER)
    s = np.where(use, sid, 0)
    # stack 0 (no frames) names no phase: the tables with -1 there, so one gather does
    tl0 = np.asarray(stack_timeline, dtype=np.int8).copy()
    mk0 = np.asarray(stack_marker, dtype=np.int16).copy()
    if len(tl0):
        tl0[0] = -1
        mk0[0] = -1
        ev = tl0[s]
        evm = mk0[s]
    else:
        ev = np.full(n, -1, dtype=np.int8)
        evm = np.full(n, -1, dtype=np.int16)
    del s, tl0, mk0
    # the free(s) written just before a bump are the same update (bumps: profiler-converted runs)
    bi = np.flatnonzero(bump_at & use) if profiler_like else np.zeros(0, dtype=np.int64)
    for k in (1, 2):
        j = bi - k
        ok = (j >= 0) & np.isin(action[np.maximum(j, 0)], (A_FREE_REQUESTED, A_FREE))
        ev[j[ok]] = ev[bi[ok]]
        evm[j[ok]] = evm[bi[ok]]
    del use, bi

    # annotations (time ranges)
    tus = np.asarray(trace.columns["time_us"])
    if rules.annotations and snap.annotations and n and bool((tus >= 0).all()):
        if bool(np.all(tus[1:] >= tus[:-1])):          # searchsorted needs sorted times
            marked = [r for r in annotation_regions(snap.annotations, device, rules)
                      if r.phase and r.end_us is not None]
            if marked:     # every region's entries by two searches in all (later regions win)
                los = np.searchsorted(tus, _int64s([r.start_us for r in marked]), side="left")
                his = np.searchsorted(tus, _int64s([r.end_us for r in marked]), side="right")
                for r, lo, hi in zip(marked, los.tolist(), his.tolist()):
                    if hi > lo:
                        ev[lo:hi] = PHASE_CODE[r.phase]

    idx_t = np.int32 if n < 2**31 - 1 else np.int64

    def positions_where(mask, other):
        """Each entry's index where `mask`, else `other`: one array of n (no index array kept
        beside the phases through all of this: 40 MB at 10^7 entries)."""
        out = np.arange(n, dtype=idx_t)
        out[~mask] = other
        return out

    def prev_anchor(mask):
        out = positions_where(mask, -1)
        return np.maximum.accumulate(out, out=out)          # in place: one array of n, not two

    # the autograd engine's thread: empty frames right after forward/backward evidence, in a
    # trace that trains (a backward or an optimizer step shows somewhere, by frames or
    # annotations): without either, nothing ran on that thread, and frameless entries say
    # nothing of a phase
    has_frames = bool((sid > 0).any())
    trains_here = bool(((ev == P_BACKWARD) | (ev == P_OPTIMIZER)).any())
    # (another device's stacks count: under DataParallel the loss and the step run on one)
    trains_anywhere = trains_here or bool(((stack_timeline == P_BACKWARD) | (stack_timeline == P_OPTIMIZER)).any())
    if not profiler_like and has_frames and trains_anywhere:
        empty = (action == A_ALLOC) & (sid == 0)
        if not frees_carry_alloc:
            empty |= ((action == A_FREE_REQUESTED) | (action == A_FREE)) & (sid == 0)
        empty &= ev < 0
        if empty.any():
            pa = prev_anchor(ev >= 0)
            a_ph = np.where(pa >= 0, ev[np.maximum(pa, 0)], -1)
            ev[empty & ((a_ph == P_FORWARD) | (a_ph == P_BACKWARD))] = P_BACKWARD
            del pa, a_ph
    if has_frames and not frees_carry_alloc and bool((ev == P_FORWARD).any()) and not trains_anywhere:
        # forward passes only (inference, evaluation): a free the user's code makes outside the
        # model (its frames name no phase: the previous output dropped) lies between two passes,
        # so the loop's steps stand apart instead of merging into one long forward
        outside = ((action == A_FREE_REQUESTED) | (action == A_FREE)) & (sid > 0) & (ev < 0)
        ev[outside] = P_NONE
        del outside

    anchor = ev >= 0
    pa = prev_anchor(anchor)
    na = positions_where(anchor, n)[::-1]
    na = np.minimum.accumulate(na, out=na)[::-1]
    # the phase of the anchor before and after each entry: `ev` with a -1 after its end, which
    # index -1 (no anchor before) and index n (none after) both read
    ev_pad = np.empty(n + 1, dtype=np.int8)
    ev_pad[:n] = ev
    ev_pad[n] = -1
    A = ev_pad[pa]
    B = ev_pad[na]
    del ev_pad
    # a stretch leading into a forward is the next batch being prepared, from its first
    # allocation on; the frees before that still close the previous phase
    del na
    # (an allocation with frames since the previous anchor: the last such one comes after it;
    # one array of n and a compare, where counting them took three arrays of n at 10^6 events)
    after_first_alloc = prev_anchor((action == A_ALLOC) & (sid > 0) & ~bump_at) > pa
    del pa
    lead_in = (B == P_FORWARD) & (A != P_FORWARD) & (after_first_alloc | (A < 0))
    del after_first_alloc
    fill = np.where(A == B, A, np.where(lead_in, P_NONE, A))
    del A, B, lead_in
    fill[fill < 0] = P_NONE
    phase = np.where(anchor, ev, fill).astype(np.uint8)
    del fill
    _mark_unwinding(phase, action)

    # runs of equal phase
    change = np.flatnonzero(phase[1:] != phase[:-1]) + 1
    seg_start = np.r_[0, change].astype(np.int64)
    seg_end = np.r_[change - 1, n - 1].astype(np.int64)
    seg_phase = phase[seg_start].astype(np.int16)
    nseg = len(seg_start)
    tl = Timeline(phase, seg_start, frees_carry_alloc_frames=frees_carry_alloc)
    has = {p: bool((seg_phase == p).any()) for p in (P_FORWARD, P_BACKWARD, P_OPTIMIZER)}
    if not any(has.values()):
        # no phase evidence at all and (almost) no frames to tell: iterations from the
        # periodicity of live memory, without phases
        allocs_with_frames = np.count_nonzero((action == A_ALLOC) & (sid > 0))
        frameless = allocs_with_frames < 0.1 * max(1, int(np.count_nonzero(action == A_ALLOC)))
        ends = periodic_boundaries(live_after()) if live_after is not None and frameless else []
        e = np.asarray(ends, dtype=np.int64)
        s0, e0 = e[:-1] + 1, e[1:]
        its = Iterations(s0, e0, *_stamps(tus, s0, e0), source="periodicity")
        tl.iterations = its
        tl.first_start = its[0].start_index if its else -1
        return tl
    start_ph = P_FORWARD if has[P_FORWARD] else (P_BACKWARD if has[P_BACKWARD] else P_OPTIMIZER)
    delim = P_OPTIMIZER if has[P_OPTIMIZER] else (P_BACKWARD if has[P_BACKWARD] else P_NONE)
    sidx = np.arange(nseg)
    nn = seg_phase != P_NONE
    # previous non-NONE segment of each segment
    last_nn = np.maximum.accumulate(np.where(nn, sidx, -1))
    prev_nn = np.r_[-1, last_nn[:-1]]
    prev_ph = np.where(prev_nn >= 0, seg_phase[np.maximum(prev_nn, 0)], -1)
    is_start = seg_phase == start_ph
    if delim == P_NONE:
        prev_imm = np.r_[-1, seg_phase[:-1]]
        is_start &= (prev_imm == P_NONE) | (prev_ph < 0)
    else:
        is_start &= (prev_ph == delim) | (prev_ph < 0) | (prev_ph == P_UNWIND)
    if start_ph == P_FORWARD and has[P_BACKWARD]:
        # a forward that no backward follows (evaluation, no_grad) does not start an iteration
        last_tr = np.minimum.accumulate(np.where(nn & (seg_phase != P_FORWARD), sidx, nseg)[::-1])[::-1]
        next_tr = np.r_[last_tr[1:], nseg]
        next_ph = np.where(next_tr < nseg, seg_phase[np.minimum(next_tr, nseg - 1)], -1)
        # ... unless the trace ends in it with an OOM (the step that failed)
        ooms = np.flatnonzero(action == A_OOM)
        oom_tail = ((next_ph < 0) & (len(ooms) > 0) & (seg_end >= (ooms[-1] if len(ooms) else n))) \
            | (next_ph == P_UNWIND)
        train_fwd = (seg_phase == P_FORWARD) & ((next_ph == P_BACKWARD) | oom_tail)
        is_start &= train_fwd
    else:
        train_fwd = seg_phase == P_FORWARD
    cands = np.flatnonzero(train_fwd) if start_ph == P_FORWARD else np.flatnonzero(seg_phase == start_ph)
    if not len(cands):
        cands = np.flatnonzero(seg_phase == start_ph)
    is_start[int(cands[0])] = True
    starts = np.flatnonzero(is_start)

    # entry ranges: an iteration also owns the non-training stretch just before it
    # (the batch being prepared), except for model loading before the first one
    ent_start = seg_start[starts].copy()
    lead = np.flatnonzero((starts > 0) & (seg_phase[np.maximum(starts - 1, 0)] == P_NONE))
    ent_start[lead] = seg_start[starts[lead] - 1]
    if len(lead) and lead[0] == 0:
        # before the first iteration: model loading up to the last blocking marker is not its own
        lo, hi = int(seg_start[starts[0] - 1]), int(seg_end[starts[0] - 1])
        blk = np.flatnonzero(np.isin(evm[lo:hi + 1], blocking_markers)) if len(blocking_markers) \
            else np.zeros(0, dtype=np.int64)
        ent_start[0] = lo + (int(blk[-1]) + 1 if len(blk) else 0)
    last_train = int(np.flatnonzero(seg_phase != P_NONE)[-1])
    ent_end = np.r_[ent_start[1:] - 1, seg_end[last_train]]
    tus = np.asarray(trace.columns["time_us"])
    its = _iterations(ent_start, ent_end, seg_start, seg_end, seg_phase, train_fwd, phase, tus,
                      "forward_runs" if delim == P_NONE else "phases")
    tl.iterations = its
    tl.first_start = its[0].start_index if its else -1
    return tl




def _iterations(ent_start, ent_end, seg_start, seg_end, seg_phase, train_fwd, phase, tus,
                source: str = "phases") -> Iterations:
    """The iterations over entry ranges [ent_start, ent_end] (empty ones dropped), all at once
    over (iteration, segment) pairs: numbered, the NONE runs that lead into a training
    forward inside an iteration marked inputs in `phase`, each iteration's phase ranges and
    micro-batches (training forwards); `source`: how their bounds were found (Iteration)."""
    keep = np.flatnonzero(ent_end >= ent_start)
    s0, e0 = ent_start[keep], ent_end[keep]
    k_its = len(keep)
    g0 = np.searchsorted(seg_start, s0, side="right") - 1      # the runs they begin and end in
    g1 = np.searchsorted(seg_start, e0, side="right") - 1
    counts = g1 - g0 + 1
    it = np.repeat(np.arange(k_its), counts)                       # each pair's iteration
    first = np.cumsum(counts) - counts
    g = np.arange(len(it)) - np.repeat(first, counts) + np.repeat(g0, counts)   # each pair's segment
    last_of_it = g == np.repeat(g1, counts)
    sp = seg_phase[g]
    ss = np.maximum(seg_start[g], s0[it])
    se = np.minimum(seg_end[g], e0[it])
    nseg = len(seg_phase)
    nxt_train = np.where(last_of_it, False, train_fwd[np.minimum(g + 1, nseg - 1)])
    inp = (sp == P_NONE) & nxt_train
    ia, ib = ss[inp], se[inp]
    if len(ia) > MANY_RANGES:        # (disjoint ranges: marked at once where there are many)
        mark = np.zeros(len(phase) + 1, dtype=np.int8)
        mark[ia] = 1
        np.subtract.at(mark, ib + 1, 1)
        np.cumsum(mark, out=mark)
        phase[mark[:-1].view(bool)] = P_INPUTS
    else:
        for a, b in zip(ia.tolist(), ib.tolist()):
            phase[a:b + 1] = P_INPUTS
    tf = train_fwd[g]
    # (in the order of iterations.PHASES: inputs, forward, backward, optimizer, eval, unwind)
    sels = (inp, (sp == P_FORWARD) & tf, sp == P_BACKWARD, sp == P_OPTIMIZER, (sp == P_FORWARD) & ~tf,
            sp == P_UNWIND)
    big = np.iinfo(np.int64).max
    lo = np.full((len(sels), k_its), big, dtype=np.int64)
    hi = np.full((len(sels), k_its), -1, dtype=np.int64)
    for j, sel in enumerate(sels):
        np.minimum.at(lo[j], it[sel], ss[sel])
        np.maximum.at(hi[j], it[sel], se[sel])
    lo[hi < 0] = -1
    micro = np.bincount(it[sels[1]], minlength=k_its)
    its = Iterations(s0, e0, *_stamps(tus, s0, e0), lo, hi, micro, source=source)
    return its


def _stamps(tus, s0, e0) -> tuple[np.ndarray, np.ndarray]:
    """The time stamps (µs, NO_TIME where unknown) at the iterations' first and last entries.
    A part of the times at a time, its pages handed back (take_released): stamps read an
    iteration apart page in the whole column."""
    t0, t1 = (np.asarray(take_released(tus, i), dtype=np.int64) for i in (s0, e0))
    return np.where(t0 >= 0, t0, NO_TIME), np.where(t1 >= 0, t1, NO_TIME)
