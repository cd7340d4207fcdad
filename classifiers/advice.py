"""The levers worth pulling, with what each saves: one number per lever, the same everywhere.

    items = advise(da, by_category_evidence, live_bytes, expandable=False)     # -> tuple[Advice, ...]

A simulated lever's saving is its simulated peak difference: the recorded run's peak minus the
peak of the run with the lever pulled (simulate.simulated_peak, the number `whatif --lever`
gives), for the peak's advice and every OOM's alike. An estimate (8-bit or paged optimizer,
4-bit weights) saves its factor's share of the evidenced bytes it acts on at that moment and
says it is an estimate. Only levers that apply to the run (levers.left_out, from its facts) and
save at least MIN_SHARE of the live bytes are advised; expandable segments lead at an OOM the
allocator's cache could have served. A lever that could not reach the smallest share advised
whatever its simulation gives is not simulated for the advice (`bounded_out`: checkpointing
where few of the forward's tensors are live at the peak), nor are the blocks found for it.
"""
from __future__ import annotations

import weakref

import numpy as np

from .evidence import EVIDENCE, EVIDENCED
from .levers import LEVERS, left_out, pulled
from .results import Advice

ADVICE_LEVERS = ("checkpointing", "half_batch", "adam8bit", "lora", "4bit")
MIN_SHARE = 0.05            # a lever that saves less than this share of live memory is not worth a line
MIN_SHARE_FALLBACK = 0.01   # ... unless it is the best there is and saves at least this share
_MAIN = {"checkpointing": "activations", "half_batch": "activations", "lora": "gradients",
         "adam8bit": "optimizer", "4bit": "weights"}

_SAVINGS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_BOUNDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()    # device -> checkpointing_bound


def needs_blocks(run, da=None) -> bool:
    """Whether the advice for a run with these facts simulates a lever on the blocks' structure
    (the half batch needs only what grows with the batch; checkpointing not where it is
    `bounded_out` of device `da`)."""
    return any(n != "half_batch" and LEVERS[n].simulated and LEVERS[n].why_not(run) is None
               and not (da is not None and bounded_out(da, n)) for n in ADVICE_LEVERS)


def checkpointing_bound(da) -> int | None:
    """The most simulated checkpointing could take off the recorded peak, without simulating
    it: the bytes live after the peak's entry that a forward pass made. The lever frees earlier
    only what a block call saved (rows made inside a forward pass); everything else it does
    (the replays it adds, the inputs it keeps until their backward) adds bytes. So the rewritten
    run's bytes after that entry are at least the recorded ones less these. None where the peak
    is the trace's start. Found once per device (the structure's thread asks, then the advice)."""
    if da in _BOUNDS:
        return _BOUNDS[da]
    _BOUNDS[da] = got = _checkpointing_bound(da)
    return got


def _checkpointing_bound(da) -> int | None:
    live = da.live
    p = int(live.peak_index)
    if p < 0:
        return None
    a = da.allocs
    ai, fi = np.asarray(a.alloc_index), np.asarray(a.free_index)
    passes = da.phase_runs("forward")
    if not len(passes):
        return 0
    k = np.searchsorted(passes[:, 0], ai, side="right") - 1
    in_pass = (k >= 0) & (ai >= 0) & (ai <= passes[np.maximum(k, 0), 1])
    held = in_pass & (ai <= p) & ((fi < 0) | (fi > p))
    return int(np.asarray(a.size, dtype=np.int64)[held].sum())


def bounded_out(da, name: str) -> bool:
    """Whether lever `name` cannot be advised on this device whatever its simulation gives, so
    it is not simulated for the advice: checkpointing, where the most it could save
    (`checkpointing_bound`) is under the smallest share advice names (MIN_SHARE_FALLBACK of the
    peak's live bytes) and no out-of-memory error asks for advice at a moment of fewer bytes.
    (A run whose peak is the optimizer's step, with the forward's tensors gone.)"""
    if name != "checkpointing" or len(getattr(da, "oom_indices", ())):
        return False
    bound = checkpointing_bound(da)
    return bound is not None and bound < MIN_SHARE_FALLBACK * max(1, int(da.live.peak_bytes))


def simulated_savings(da) -> dict[str, tuple[int, bool]]:
    """{lever: (bytes its simulation takes off the run's peak, applied)} for the simulated levers
    that apply to this run, computed once per device."""
    got = _SAVINGS.get(da)
    if got is not None:
        return got
    from .simulate import simulated_peak
    from .structure import being_found
    got = {}
    run = getattr(da, "run", None)
    facts = None
    wanted = [n for n in ADVICE_LEVERS if LEVERS[n].simulated and LEVERS[n].why_not(run) is None
              and not bounded_out(da, n)]
    # the half batch reads only what grows with the batch: simulated first, without waiting for
    # the blocks' structure while a thread finds it (the same number either way)
    for name in sorted(wanted, key=lambda n: n != "half_batch"):
        if name == "lora" and facts is None:
            facts = _budget_facts(da)
        peak, _at, applied = simulated_peak(da, [name], facts, growth_only=name == "half_batch" and being_found(da))
        ok = all(a.applied for a in applied)
        got[name] = (max(0, int(da.peak.bytes) - int(peak)) if ok else 0, ok)
    out = {n: got[n] for n in wanted}
    _SAVINGS[da] = out
    return out


def _budget_facts(da):
    """The budget's facts of the device (trainable parameters, dtypes) for the LoRA lever."""
    from types import SimpleNamespace

    from .budget import budget
    devs = list(getattr(da.snapshot, "devices", None) or [da.device])
    an = SimpleNamespace(devices={d: (da if d == da.device else None) for d in devs} | {da.device: da},
                         snapshot=da.snapshot)
    try:
        return budget(an, da.device).facts
    except (AttributeError, ValueError):
        return None


def advise(da, by_category_evidence: dict, live_bytes: int, fragmentation: int | None = None, requested: int = 0,
           expandable: bool = False) -> tuple[Advice, ...]:
    """The levers worth pulling for memory in this state, most saving first (see the module
    docstring). `by_category_evidence`: {category: {evidence: bytes}} live at the moment."""
    run = getattr(da, "run", None)
    tips: list[Advice] = []
    if fragmentation is not None and requested and fragmentation >= requested and \
            left_out("expandable_segments", run, expandable) is None:
        tips.append(Advice("expandable_segments", None, int(fragmentation), "lifetime", estimate=True))
    known = {c: {e: b for e, b in per.items() if e in EVIDENCED} for c, per in by_category_evidence.items()}
    by_category = {c: sum(per.values()) for c, per in known.items()}
    sims = simulated_savings(da)
    trains = bool(run is not None and run.trains)
    scored = []
    for name in ADVICE_LEVERS:
        if left_out(name, run, expandable) is not None:
            continue
        main = _MAIN[name]
        weakest = max((EVIDENCE.index(e) for e in known.get(main, {})), default=EVIDENCE.index("lifetime"))
        if LEVERS[name].simulated:
            saves, ok = sims.get(name, (0, False))
            if not ok:
                continue
            scored.append((saves, name, main, EVIDENCE[weakest], False))
        else:
            scales = pulled(name).scales
            saves = int(sum(by_category.get(c, 0) * (1.0 - f) for c, f in scales.items()))
            scored.append((saves, name, main, EVIDENCE[weakest], True))
    scored.sort(key=lambda t: -t[0])

    def target(name):
        if name == "checkpointing":
            from .structure import blocks
            b = blocks(da)
            return f"{b.count} {b.name}" if b is not None else ""
        return ""
    lower = bool(run is not None and run.truncated_by_oom.value)
    for saves, name, main, ev, est in scored:
        if saves > 0 and saves >= MIN_SHARE * max(1, live_bytes):
            tips.append(Advice(name, main, saves, ev, target(name), estimate=est, training=trains,
                               lower_bound=lower and not est))
    if not tips and scored and scored[0][0] >= MIN_SHARE_FALLBACK * max(1, live_bytes):
        saves, name, main, ev, est = scored[0]     # nothing worth a line: still the best one, if it is not nothing
        tips.append(Advice(name, main, saves, ev, target(name), estimate=est, training=trains,
                           lower_bound=lower and not est))
    return tuple(tips)


__all__ = ["advise", "needs_blocks", "simulated_savings", "checkpointing_bound", "bounded_out", "ADVICE_LEVERS",
           "MIN_SHARE"]
