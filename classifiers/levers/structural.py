"""What the simulated levers share: the blocks' weight matrices, what only frozen weights'
gradients (or a checkpoint) keep, a Python norm's `weight * x` input, the adapter branch."""
from __future__ import annotations

import dataclasses

import numpy as np

from ...common.arrays import isin
from ..categories import CATEGORIES
from ..structure import R_OUTPUT, R_OUTSIDE_SAVED, R_RECOMPUTE_SAVED, R_SAVED, Structure
from ..timeline import P_BACKWARD

_CAT = {c: i for i, c in enumerate(CATEGORIES)}


def scale_rows(rw, sel: np.ndarray, f: float) -> None:
    """Scale the sizes of the rows `sel` of the rewritten run by `f` (rounded to whole bytes)."""
    size = rw.sizes_to_change()
    size[sel] = np.rint(size[sel].astype(np.float64) * f).astype(np.int64)


def block_matrices(da, st: Structure, facts) -> tuple[list, int | None]:
    """([(numel, count)] of the trained weight matrices the blocks repeat, the width).

    Trained: a weight with a gradient of its size (the gradients live at their highest);
    repeated: a size that comes at least once per block (the blocks' share of it: the
    whole multiple of the block count; an embedding may share a size); a matrix, not a
    vector: its numel is above 16 widths. The width is the most common vector size the
    blocks repeat (their norms) that divides every such matrix."""
    from ..budget import _category_max_moment, _live_rows
    a = da.allocs
    size = np.asarray(a.size, dtype=np.int64)
    dt = facts.trainable_dtype_bytes if facts is not None and facts.trainable_dtype_bytes else 4.0
    ratio = facts.gradient_ratio if facts is not None and facts.gradient_ratio else 1.0
    at = _category_max_moment(da, _CAT["gradients"])
    g = _live_rows(da, at, _CAT["gradients"])
    # the weights alive when the gradients are (a script may free its model before the dump)
    w = _live_rows(da, at, _CAT["weights"], evidenced_only=False)
    names = da.rule_names or []
    if "weights.autocast_copy" in names:
        w = w[np.asarray(da.rule)[w] != names.index("weights.autocast_copy")]
    n = st.blocks.count if st.blocks is not None else 0
    if not n or not len(w):
        return [], None
    gu, gc = np.unique(size[g], return_counts=True)
    grads = dict(zip(gu.tolist(), gc.tolist()))
    u, c = np.unique(size[w], return_counts=True)
    rep = []
    for s, k in zip(u.tolist(), c.tolist()):
        k = min(k, grads.get(int(round(s * ratio)), 0))
        numel = s / dt
        if k >= n and numel == int(numel):
            rep.append((numel, (k // n) * n))
    if not rep:
        return [], None
    biggest = max(x for x, _ in rep)
    vectors = sorted(((k, x) for x, k in rep if x * x < 4 * biggest), reverse=True)
    width = None
    for _k, x in vectors:
        if all(m % x == 0 for m, _ in rep if m * m >= 4 * biggest):
            width = int(x)
            break
    floor = 16 * width if width else 4096
    return [(x, k) for x, k in rep if x >= floor], width


def without_checkpoint(st: Structure) -> Structure:
    """The structure as if nothing were checkpointed (the first block's input not kept)."""
    blk = dataclasses.replace(st.blocks, checkpointed=False) if st.blocks is not None else None
    return dataclasses.replace(st, blocks=blk)


def frozen_base(rw, st: Structure, tail: bool = True) -> None:
    """What is kept only for the frozen parts' weight gradients, or for a checkpoint: the first
    block's input goes when that block's forward ends (nothing before the blocks trains, and
    without a checkpoint nothing keeps it); with `tail`, the tensors the size of the residual
    stream kept after the last block (the final norm's output, the LM head's input) go when
    the forward ends (a frozen head needs no weight gradient)."""
    role, ai = st.role, rw.ai
    # what the forward passes kept outside the blocks, in allocation order: each pass takes its range
    outside = np.flatnonzero(role == R_OUTSIDE_SAVED)
    outside = outside[np.argsort(ai[outside], kind="stable")]
    ai_outside = ai[outside].astype(np.int64)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for j, c in enumerate(st.calls):
        first.setdefault(c.forward_pass, j)
        last[c.forward_pass] = j
    for p in sorted(first):                 # (the passes the blocks run through, in order)
        e = int(st.passes[p, 1])
        c0, cn = st.calls[first[p]], st.calls[last[p]]
        inp = int(st.inputs[first[p]])
        if inp >= 0 and not st.checkpointed and (rw.fk[inp] < 0 or rw.fk[inp] > (c0.end << rw.shift)):
            rw.fk[inp] = rw.after(c0.end, 1)[0]
        if not tail or st.outputs[last[p]] < 0:
            continue
        out_size = rw.size[st.outputs[last[p]]]
        lo, hi = np.searchsorted(ai_outside, [cn.end + 1, e + 1])
        kept = outside[lo:hi]
        kept = kept[isin(rw.size[kept], [out_size, out_size // 2])]
        if len(kept):
            rw.fk[kept] = rw.after(e, len(kept))


def trains_before_blocks(da, st: Structure) -> bool:
    """Whether backward makes gradients after the first block's backward is done (the
    embeddings train), seen in any backward: False for LoRA-like runs."""
    cat = np.asarray(da.category)
    ai = np.asarray(da.allocs.alloc_index).astype(np.int64)
    fi = np.asarray(da.allocs.free_index).astype(np.int64)
    ph = da.timeline.phase
    grads = np.flatnonzero((cat == _CAT["gradients"]) & (ai >= 0))
    grads = grads[ph[ai[grads]] == P_BACKWARD] if len(ph) else grads[:0]
    windows = st.recomputes if st.checkpointed else st.calls
    wanted = R_RECOMPUTE_SAVED if st.checkpointed else R_SAVED
    for w in [w for w in windows if w.block == 0][:3]:      # a few backward passes tell
        saved = w.rows[st.role[w.rows] == wanted]
        saved = saved[fi[saved] >= 0]
        if not len(saved):
            continue
        done = int(fi[saved].max())
        nxt = np.flatnonzero((ph[done:] != P_BACKWARD))
        end = done + int(nxt[0]) if len(nxt) else len(ph)
        if ((ai[grads] > done) & (ai[grads] < end)).any():
            return True
    return False


__all__ = ["scale_rows", "block_matrices", "without_checkpoint", "frozen_base", "trains_before_blocks"]
