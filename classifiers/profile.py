"""What kind of run a device's trace shows, from evidence only: the facts advice must fit.

    profile = run_profile(da, sfacts)          # -> results.RunProfile

Training or inference, fine-tuning a pretrained model or training from scratch, weights
already quantized, adapters already there, how much of the memory at the peak the
analysis actually knows (evidence `torch`, `stack` or `lifetime`) and how much it guesses.
`levers.left_out` reads it: one rule decides which levers apply, for the peak's and the
OOMs' advice, what-if, the report and the viewer alike.

Every fact here comes from frames or recorded lifetimes: weights that are a guess (blocks
live before the trace, no frames) are never counted as "seen".
"""
from __future__ import annotations

import numpy as np

from ..parsers.tables import A_ALLOC
from .categories import CATEGORY_CODE
from .evidence import E_GUESS
from .results import RunProfile
from .timeline import PHASE_CODE

GRAD_RATIOS = (1.0, 2.0, 0.5)        # gradient bytes / weight bytes of one parameter tensor
_W, _G, _Q = CATEGORY_CODE["weights"], CATEGORY_CODE["gradients"], CATEGORY_CODE["quantization"]


def _counts(sizes: np.ndarray) -> dict[int, int]:
    u, c = np.unique(np.asarray(sizes, dtype=np.int64), return_counts=True)
    return dict(zip(u.tolist(), c.tolist()))


def _matched_bytes(w: dict[int, int], g: dict[int, int], ratio: float) -> int:
    """Bytes of the weight tensors in `w` that have a partner of `ratio` times their size in `g`."""
    total = 0
    for s, n in w.items():
        t = s * ratio
        if t == int(t):
            total += min(n, g.get(int(t), 0)) * s
    return total


def _marked(sfacts, name: str, stacks: np.ndarray) -> bool:
    has = sfacts.has_marker.get(name) if sfacts is not None else None
    if has is None or not len(stacks):
        return False
    st = stacks[stacks >= 0]
    return bool(len(st) and has[np.unique(st)].any())


def trains(da) -> bool:
    """Does this device's trace train? False where forward passes were seen and no backward
    anywhere (inference, evaluation); a snapshot that cannot tell (no trace, no frames to
    find phases by) counts as training."""
    ph = da.timeline.phase
    return bool((ph == PHASE_CODE["backward"]).any()) or not bool((ph == PHASE_CODE["forward"]).any())


def run_profile(da, sfacts) -> RunProfile:
    a = da.allocs
    ph = da.timeline.phase
    backward = bool((ph == PHASE_CODE["backward"]).any())
    forward = bool((ph == PHASE_CODE["forward"]).any())
    frames = bool(sfacts is not None and len(a) and (sfacts.stacks.lengths[np.maximum(a.stack, 0)] > 0).any())
    evidenced = da.evidence < E_GUESS
    stacks = a.stack.astype(np.int64)

    # weights seen (with evidence), and whether gradients match them
    w_rows = np.flatnonzero(evidenced & (da.category == _W))
    g_rows = np.flatnonzero(da.category == _G)
    w_counts = _counts(a.size[w_rows])
    w_bytes = int(a.size[w_rows].sum())
    g_counts = _counts(a.size[g_rows])
    trainable = max((_matched_bytes(w_counts, g_counts, r) for r in GRAD_RATIOS), default=0) if g_rows.size else 0
    share = trainable / w_bytes if w_bytes else None
    # frozen weights: seen in a run that trains, with no gradient of theirs (in inference every
    # weight is frozen, which says nothing of whether the model is a pretrained one)
    frozen = bool(w_bytes) and backward and trainable < 0.5 * w_bytes

    # the recorder's metadata (vramscope.record) counts the model exactly: it outranks sizes
    meta = getattr(sfacts.stacks.snap, "metadata", None) if sfacts is not None else None
    if meta is not None and meta.trainable is not None and meta.frozen is not None and not meta.params_not_on_gpu \
            and meta.device in (None, da.device):
        n_t, n_f = meta.trainable_params or 0, meta.frozen_params or 0
        if n_t + n_f:
            share = n_t / (n_t + n_f)
            frozen = n_f > 0

    quantized = ""
    if _marked(sfacts, "quant_4bit", stacks):
        quantized = "4-bit"
    elif _marked(sfacts, "quant_8bit", stacks):
        quantized = "8-bit"
    elif np.any(evidenced & (da.category == _Q) & (a.free_index < 0)):
        quantized = "quantized"

    from .structure import blocks
    blk = blocks(da) if bool(np.any(da.trace_action == A_ALLOC)) else None

    peak_live = da.live_mask(da.peak.index) if len(a) else np.zeros(0, dtype=bool)
    size = a.size.astype(np.int64)
    known = int(size[peak_live & evidenced].sum())
    guessed = int(size[peak_live & ~evidenced].sum())
    return RunProfile(
        recorded="trace" if bool((da.trace_action == A_ALLOC).any()) else ("state_only" if len(a) else "empty"),
        frames=frames,
        training=trains(da),
        backward_seen=backward, forward_seen=forward,
        pretrained_load=_marked(sfacts, "pretrained_load", stacks),
        frozen_weights=frozen,
        trainable_share=share,
        adapters=_marked(sfacts, "adapters", stacks),
        quantized=quantized,
        peak_evidenced_bytes=known,
        peak_guessed_bytes=guessed,
        blocks=blk.name if blk is not None else "", block_count=blk.count if blk is not None else 0,
        checkpointed=bool(blk is not None and blk.checkpointed))


__all__ = ["run_profile", "trains"]
