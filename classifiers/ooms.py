"""Out-of-memory reports (DESIGN.md §5): what was asked, what was free, what was live by
category, how much the allocator held back (reserved minus allocated), and the levers
to pull, ranked by what each would save at that moment. Levers are named, not worded:
vramscope.present words them.
"""
from __future__ import annotations

import numpy as np

from ..parsers.tables import A_OOM
from .advice import ADVICE_LEVERS, advise
from .evidence import EVIDENCE
from .liveset import by_category_evidence_at_many
from .results import Oom
from .timeline import PHASE_NAMES

PHASE_CODE = {name: k for k, name in enumerate(PHASE_NAMES)}


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
    at = da.oom_indices.tolist()
    live_by = by_category_evidence_at_many(da.category, da.evidence, da.allocs, at, da.n_entries)
    for i, by_ev in zip(at, live_by):
        extra = t.extras.get(int(i), {}) or {}
        allocated = int(live.live_after[i]) if len(live.live_after) else live.start_bytes
        reserved = None if da.reserved_unknown() else live.reserved_at(i)
        frag = da.reserved_unallocated_at(i)
        byc = {c: sum(e.values()) for c, e in by_ev.items()}
        req = int(size[i])
        dev_free = extra.get("device_free")
        dev_free = int(dev_free) if isinstance(dev_free, int) and not isinstance(dev_free, bool) else None
        phase = PHASE_NAMES[int(da.timeline.phase[i])] if len(da.timeline.phase) else "none"
        out.append(Oom(index=int(i), time_us=int(tus[i]) if tus[i] >= 0 else None, requested=req,
                       device_free=dev_free, allocated=allocated, reserved=reserved, fragmentation_bytes=frag,
                       by_category=byc, phase=phase, expandable_segments=expandable, stack=int(stack[i]),
                       advice=advise(da, by_ev, allocated, frag, req, expandable),
                       by_evidence=evidence_totals(by_ev)))
    return tuple(out)


def evidence_totals(by_category_evidence: dict) -> dict[str, int]:
    """{evidence: bytes} over every category, strongest first."""
    tot = {e: 0 for e in EVIDENCE}
    for per in by_category_evidence.values():
        for e, b in per.items():
            tot[e] += b
    return {e: b for e, b in tot.items() if b}


__all__ = ["oom_reports", "oom_indices", "advise", "evidence_totals", "expandable_segments_on", "ADVICE_LEVERS"]
