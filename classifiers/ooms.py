"""Out-of-memory reports (DESIGN.md §5): what was asked, what was free, what was live by
category, how much the allocator held back (reserved minus allocated), and the levers
to pull, ranked by what each would save at that moment. Levers are named, not worded:
vramscope.present words them.
"""
from __future__ import annotations

import numpy as np

from ..parsers.tables import A_OOM
from .levers import TRAINING_LEVERS, lever
from .results import Advice, Oom
from .timeline import PHASE_NAMES

PHASE_CODE = {name: k for k, name in enumerate(PHASE_NAMES)}

# the levers advice weighs: each with what it would save at one moment (levers.py says how
# each is estimated); the paged optimizer is said together with the 8-bit one
ADVICE_LEVERS = ("checkpointing", "half_batch", "adam8bit", "lora", "4bit")
MIN_SHARE = 0.05            # a lever that saves less than this share of live memory is not worth a line


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


def trains(da) -> bool:
    """Does this device's trace train? False where forward passes were seen and no backward
    anywhere (inference, evaluation); a snapshot that cannot tell (no trace, no frames to
    find phases by) counts as training."""
    ph = da.timeline.phase
    return bool((ph == PHASE_CODE["backward"]).any()) or not bool((ph == PHASE_CODE["forward"]).any())


def oom_reports(da, snap) -> tuple[Oom, ...]:
    t = snap.trace(da.device)
    size = np.asarray(t.columns["size"])
    tus = np.asarray(t.columns["time_us"])
    stack = np.asarray(t.columns["stack"])
    live = da.live
    expandable = expandable_segments_on(snap.allocator_settings)
    training = trains(da)
    out = []
    for i in da.oom_indices.tolist():
        extra = t.extras.get(int(i), {}) or {}
        allocated = int(live.live_after[i]) if len(live.live_after) else live.start_bytes
        reserved = live.reserved_at(i)
        frag = (reserved - allocated) if reserved is not None else None
        byc = da.by_category_at(i)
        req = int(size[i])
        dev_free = extra.get("device_free")
        dev_free = int(dev_free) if isinstance(dev_free, int) and not isinstance(dev_free, bool) else None
        phase = PHASE_NAMES[int(da.timeline.phase[i])] if len(da.timeline.phase) else "none"
        out.append(Oom(index=int(i), time_us=int(tus[i]) if tus[i] >= 0 else None, requested=req,
                       device_free=dev_free, allocated=allocated, reserved=reserved, fragmentation_bytes=frag,
                       by_category=byc, phase=phase, expandable_segments=expandable, stack=int(stack[i]),
                       advice=advise(byc, allocated, frag, req, expandable, training=training)))
    return tuple(out)


def advise(by_category: dict, live_bytes: int, fragmentation: int | None = None, requested: int = 0,
           expandable: bool = False, training: bool = True) -> tuple[Advice, ...]:
    """The levers worth pulling for memory in this state, most saving first, each with what
    it would save here. Expandable segments lead when the allocator holds back more than
    was asked (an OOM from fragmentation: no other lever is needed); then each lever of
    levers.py by the bytes its factors take off the categories live now, those that save
    at least MIN_SHARE of live memory. `training` False (a trace with no backward: inference)
    leaves out the levers that act on training (checkpointing, 8-bit optimizer, LoRA)."""
    tips: list[Advice] = []
    if fragmentation is not None and requested and fragmentation >= requested and not expandable:
        tips.append(Advice("expandable_segments", None, int(fragmentation)))
    scored = []
    for name in ADVICE_LEVERS:
        if not training and name in TRAINING_LEVERS:
            continue
        lv = lever(name)
        saves = sum(by_category.get(c, 0) * (1.0 - f) for c, f in lv.scales.items())
        main = max(lv.scales, key=lambda c: by_category.get(c, 0) * (1.0 - lv.scales[c]))
        scored.append((int(saves), name, main))
    scored.sort(key=lambda t: -t[0])
    for saves, name, main in scored:
        if saves > 0 and saves >= MIN_SHARE * max(1, live_bytes):
            tips.append(Advice(name, main, saves))
    if not tips and scored and scored[0][0] > 0:
        saves, name, main = scored[0]
        tips.append(Advice(name, main, saves))
    return tuple(tips)


__all__ = ["oom_reports", "oom_indices", "advise", "trains", "expandable_segments_on", "ADVICE_LEVERS",
           "TRAINING_LEVERS"]
