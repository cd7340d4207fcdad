"""Out-of-memory reports (DESIGN.md §5): what was asked, what was free, what was live by
category, how much the allocator held back (reserved minus allocated), and the levers
to pull, ranked by what each would save at that moment. Levers are named, not worded:
vramscope.present words them.
"""
from __future__ import annotations

import numpy as np

from ..parsers.tables import A_OOM
from .evidence import EVIDENCE, EVIDENCED
from .levers import TRAINING_LEVERS, left_out, lever
from .liveset import by_category_evidence_at
from .profile import trains
from .results import Advice, Oom, RunProfile
from .timeline import PHASE_NAMES

PHASE_CODE = {name: k for k, name in enumerate(PHASE_NAMES)}

# the levers advice weighs: each with what it would save at one moment (levers.py says how
# each is estimated); the paged optimizer is said together with the 8-bit one
ADVICE_LEVERS = ("checkpointing", "half_batch", "adam8bit", "lora", "4bit")
MIN_SHARE = 0.05            # a lever that saves less than this share of live memory is not worth a line
MIN_SHARE_FALLBACK = 0.01   # ... unless it is the best there is and saves at least this share


def expandable_segments_on(settings) -> bool:
    """Whether the allocator ran with expandable segments (torch 2.3+ `allocator_settings`:
    its own flag, or PYTORCH_CUDA_ALLOC_CONF, whose values torch reads case-insensitively)."""
    if not isinstance(settings, dict):
        return False
    flag = settings.get("expandable_segments")
    if isinstance(flag, bool):
        if flag:
            return True
    elif isinstance(flag, str) and flag.strip().lower() in ("true", "1"):
        return True
    conf = str(settings.get("PYTORCH_CUDA_ALLOC_CONF", "")).replace(" ", "").lower()
    return any(part == "expandable_segments:true" for part in conf.split(","))


def oom_indices(trace) -> np.ndarray:
    return np.flatnonzero(np.asarray(trace.columns["action"]) == A_OOM).astype(np.int64)


def oom_reports(da, snap) -> tuple[Oom, ...]:
    t = snap.trace(da.device)
    size = np.asarray(t.columns["size"])
    tus = np.asarray(t.columns["time_us"])
    stack = np.asarray(t.columns["stack"])
    live = da.live
    expandable = expandable_segments_on(snap.allocator_settings)
    out = []
    for i in da.oom_indices.tolist():
        extra = t.extras.get(int(i), {}) or {}
        allocated = int(live.live_after[i]) if len(live.live_after) else live.start_bytes
        reserved = live.reserved_at(i)
        frag = da.reserved_unallocated_at(i)
        by_ev = by_category_evidence_at(da.category, da.evidence, da.allocs, i)
        byc = {c: sum(e.values()) for c, e in by_ev.items()}
        req = int(size[i])
        dev_free = extra.get("device_free")
        dev_free = int(dev_free) if isinstance(dev_free, int) and not isinstance(dev_free, bool) else None
        phase = PHASE_NAMES[int(da.timeline.phase[i])] if len(da.timeline.phase) else "none"
        out.append(Oom(index=int(i), time_us=int(tus[i]) if tus[i] >= 0 else None, requested=req,
                       device_free=dev_free, allocated=allocated, reserved=reserved, fragmentation_bytes=frag,
                       by_category=byc, phase=phase, expandable_segments=expandable, stack=int(stack[i]),
                       advice=advise(by_ev, allocated, da.profile, frag, req, expandable),
                       by_evidence=evidence_totals(by_ev)))
    return tuple(out)


def evidence_totals(by_category_evidence: dict) -> dict[str, int]:
    """{evidence: bytes} over every category, strongest first."""
    tot = {e: 0 for e in EVIDENCE}
    for per in by_category_evidence.values():
        for e, b in per.items():
            tot[e] += b
    return {e: b for e, b in tot.items() if b}


def advise(by_category_evidence: dict, live_bytes: int, profile: RunProfile | None = None,
           fragmentation: int | None = None, requested: int = 0, expandable: bool = False) -> tuple[Advice, ...]:
    """The levers worth pulling for memory in this state, most saving first, each with what
    it would save here and the evidence of the bytes it saves. Expandable segments lead when
    the allocator holds back more than was asked (an OOM from fragmentation: no other lever
    is needed); then each lever that can apply to this run (levers.left_out: one rule for
    every surface) by the bytes its factors take off the categories live now, counting only
    bytes with evidence (torch, stack, lifetime: never a guess), those that save at least
    MIN_SHARE of live memory.

    `by_category_evidence`: {category: {evidence: bytes}} live at the moment."""
    tips: list[Advice] = []
    if fragmentation is not None and requested and fragmentation >= requested and \
            left_out("expandable_segments", profile, expandable) is None:
        tips.append(Advice("expandable_segments", None, int(fragmentation), "lifetime"))
    known = {c: {e: b for e, b in per.items() if e in EVIDENCED} for c, per in by_category_evidence.items()}
    by_category = {c: sum(per.values()) for c, per in known.items()}
    scored = []
    for name in ADVICE_LEVERS:
        if left_out(name, profile, expandable) is not None:
            continue
        lv = lever(name)
        saves = sum(by_category.get(c, 0) * (1.0 - f) for c, f in lv.scales.items())
        main = max(lv.scales, key=lambda c: by_category.get(c, 0) * (1.0 - lv.scales[c]))
        weakest = max((EVIDENCE.index(e) for e in known.get(main, {})), default=EVIDENCE.index("lifetime"))
        scored.append((int(saves), name, main, EVIDENCE[weakest]))
    scored.sort(key=lambda t: -t[0])
    def target(name):
        if name == "checkpointing" and profile is not None and profile.blocks:
            return f"{profile.block_count} {profile.blocks}"
        return ""
    for saves, name, main, ev in scored:
        if saves > 0 and saves >= MIN_SHARE * max(1, live_bytes):
            tips.append(Advice(name, main, saves, ev, target(name)))
    if not tips and scored and scored[0][0] >= MIN_SHARE_FALLBACK * max(1, live_bytes):
        saves, name, main, ev = scored[0]          # nothing worth a line: still the best one, if it is not nothing
        tips.append(Advice(name, main, saves, ev, target(name)))
    return tuple(tips)


__all__ = ["oom_reports", "oom_indices", "advise", "evidence_totals", "trains", "expandable_segments_on", "ADVICE_LEVERS",
           "TRAINING_LEVERS"]
