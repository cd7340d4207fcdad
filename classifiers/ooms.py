"""Out-of-memory reports (DESIGN.md §5): what was asked, what was free, what was live by
category, how much the allocator held back (reserved minus allocated), and the levers
to pull, most promising first. Levers are named, not worded: vramscope.present words them.
"""
from __future__ import annotations

import numpy as np

from ..parsers.tables import A_OOM
from .liveset import by_category_at
from .results import Advice, Oom
from .timeline import PHASE_NAMES

# the lever each category's dominance points at
_CATEGORY_LEVER = {
    "activations": "micro_batch", "autograd": "micro_batch", "inputs": "micro_batch", "temporary": "micro_batch",
    "weights": "quantize_weights", "optimizer": "optimizer_8bit", "gradients": "fewer_gradients",
    "quantization": "dequant_scratch",
}


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
        frag = (reserved - allocated) if reserved is not None else None
        byc = by_category_at(da.category, da.allocs, i)
        req = int(size[i])
        dev_free = extra.get("device_free")
        dev_free = int(dev_free) if isinstance(dev_free, int) and not isinstance(dev_free, bool) else None
        phase = PHASE_NAMES[int(da.timeline.phase[i])] if len(da.timeline.phase) else "none"
        out.append(Oom(index=int(i), time_us=int(tus[i]) if tus[i] >= 0 else None, requested=req,
                       device_free=dev_free, allocated=allocated, reserved=reserved, fragmentation_bytes=frag,
                       by_category=byc, phase=phase, expandable_segments=expandable, stack=int(stack[i]),
                       advice=advise(req, frag, byc, expandable)))
    return tuple(out)


def advise(requested: int, fragmentation: int | None, by_category: dict, expandable: bool) -> tuple[Advice, ...]:
    """The levers for memory in this state, most promising first: expandable segments when
    the allocator holds back more than was asked, then one lever per category by its
    share of live memory."""
    tips: list[Advice] = []
    if fragmentation is not None and fragmentation >= requested and not expandable:
        tips.append(Advice("expandable_segments", None, fragmentation))
    order = sorted(by_category.items(), key=lambda kv: -kv[1])
    # a smaller micro-batch only helps when something grows with it
    per_batch = by_category.get("activations", 0) + by_category.get("autograd", 0)
    for cat, _ in order:
        lever = _CATEGORY_LEVER.get(cat)
        if lever is None or (lever == "micro_batch" and not per_batch):
            continue
        if lever not in {t.lever for t in tips}:
            tips.append(Advice(lever, cat, None))
    if not tips:
        tips.append(Advice("micro_batch", None, None))
    return tuple(tips)


__all__ = ["oom_reports", "oom_indices", "advise", "expandable_segments_on"]
