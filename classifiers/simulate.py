"""Levers simulated on the recorded timeline (DESIGN.md §8), from the run's own structure
(structure.py): the allocation rows are rewritten (lifetimes moved, rows split, recomputed
copies inserted, sizes scaled) and the new timeline is replayed exactly, so the peak may
move to another moment, as it would in the run with the lever pulled.

    sim = simulate(da, ["checkpointing"], facts)        # -> Simulation
    sim.peak(factors)                                   # ScaledPeak on the simulated run (index: trace entry)
    sim.live_at_many(entries)                           # int64 [K, C] after each recorded entry
    sim.timeline.growth(factors)                        # what does not grow / grows with the batch
                                                        # (or sequence) / with its square: for --fit

The simulated levers:
  checkpointing     each block keeps its input; the rest of what it saved for backward is
                    freed when its forward ends, and recomputed (its forward replayed, scratch
                    included) right before its own backward starts: after the last activation
                    saved later in the forward has been freed
  no_checkpointing  the reverse, for a checkpointed run: each recomputed tensor is matched (by
                    order and size) to the tensor its forward made, which is then kept until the
                    recomputed one's free; the recompute goes
  half_batch        every row that grows with the micro-batch (structure.batch) is halved,
                    recomputed ones included
  lora              frozen weights; gradients, optimizer state and optimizer scratch for adapters
                    of rank r over every weight matrix of the blocks (r.(in + out) parameters each,
                    in + out from the block's width); the adapters' weights; what only the frozen
                    weights' gradients needed goes (the first block's input, the LM head's input,
                    a Python norm's `weight * x` input); the adapter branch's saved input to B
                    (tokens x r per adapted matrix until the block's backward) and, at each
                    adapted matrix's backward, its gradient of x
A timeline is a set of rows (alloc key, free key, size, category); keys order events: an
original trace entry i is `i << SHIFT`, an inserted event after entry i is `(i << SHIFT) + k`.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from .categories import CATEGORIES
from .category_live import CategoryLive, ScaledPeak
from .structure import (
    R_OUTPUT,
    R_OUTSIDE_SAVED,
    R_RECOMPUTE_SAVED,
    R_RECOMPUTE_SCRATCH,
    R_SAVED,
    R_SCRATCH,
    Structure,
    structure,
)
from .levers import SIMULATED
from .timeline import P_BACKWARD, P_OPTIMIZER

SHIFT = 21                  # room for 2^21 - 1 inserted events after one trace entry
LORA_RANK = 8
ADAPTER_BYTES = 4           # adapters (and their gradients) in fp32, as PEFT keeps them
_CAT = {c: i for i, c in enumerate(CATEGORIES)}


@dataclass(frozen=True)
class Applied:
    """What one simulated lever did to this run."""
    name: str
    applied: bool            # False: nothing to do here (the reason is in `assumption`)
    assumption: str


class Rewrite:
    """The recorded rows, then edited by the levers; `finish` orders the events."""

    def __init__(self, da, st: Structure):
        a = da.allocs
        ai = np.asarray(a.alloc_index).astype(np.int64)
        fi = np.asarray(a.free_index).astype(np.int64)
        self.da, self.st = da, st
        self.ai, self.fi = ai, fi
        self.ak = np.where(ai >= 0, ai << SHIFT, -1)
        self.fk = np.where(fi >= 0, fi << SHIFT, -1)
        self.size = np.asarray(a.size, dtype=np.int64).copy()
        self.cat = np.asarray(da.category, dtype=np.uint8).copy()
        self.batch = st.batch.copy()
        self.seq2 = st.seq2.copy()
        self.keep = np.ones(len(ai), dtype=bool)
        self._next: dict = {}
        self._extra: list = []

    def after(self, entry: int, n: int) -> np.ndarray:
        """`n` new event keys right after trace entry `entry`, after those taken before."""
        k = self._next.get(entry, 1)
        if k + n >= (1 << SHIFT):
            raise OverflowError("too many events inserted after one trace entry")
        self._next[entry] = k + n
        return (np.int64(entry) << SHIFT) + np.arange(k, k + n, dtype=np.int64)

    def add(self, ak, fk, rows):
        """New rows with these keys, copying size, category and growth flags from `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        self._extra.append((np.asarray(ak, np.int64), np.asarray(fk, np.int64), self.size[rows], self.cat[rows],
                            self.batch[rows], self.seq2[rows], rows))

    def add_new(self, ak, fk, size, cat: str, batch: bool):
        """New rows of the lever's own (adapters and their tensors): no recorded row behind them."""
        n = len(ak)
        self._extra.append((np.asarray(ak, np.int64), np.asarray(fk, np.int64), np.asarray(size, np.int64),
                            np.full(n, _CAT[cat], np.uint8), np.full(n, batch), np.zeros(n, bool),
                            np.full(n, -1, np.int64)))

    def finish(self) -> "Timeline":
        k = self.keep
        parts = [(self.ak[k], self.fk[k], self.size[k], self.cat[k], self.batch[k], self.seq2[k],
                  np.flatnonzero(k))] + self._extra
        cols = [np.concatenate([p[i] for p in parts]) for i in range(7)]
        return Timeline.build(*cols)


@dataclass(eq=False)
class Timeline:
    """Rows on a renumbered timeline: every alloc and free its own entry, in key order."""
    alloc_index: np.ndarray     # int64 per row, -1: live before the trace
    free_index: np.ndarray      # int64 per row, -1: never freed
    size: np.ndarray
    category: np.ndarray        # uint8 per row (CATEGORIES)
    batch: np.ndarray
    seq2: np.ndarray
    origin: np.ndarray          # int64 per row: the recorded allocation row it comes from (-1: new)
    keys: np.ndarray            # int64 per new entry: its event key (sorted)

    @classmethod
    def build(cls, ak, fk, size, cat, batch, seq2, origin) -> "Timeline":
        has_a, has_f = ak >= 0, fk >= 0
        keys = np.concatenate([ak[has_a], fk[has_f]])
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        if len(keys) > 1 and (keys[1:] == keys[:-1]).any():
            raise ValueError("two events share a key")
        ai = np.searchsorted(keys, ak)
        fi = np.searchsorted(keys, fk)
        ai = np.where(has_a, ai, -1)
        fi = np.where(has_f, fi, -1)
        return cls(ai, fi, size, cat, batch, seq2, origin, keys)

    @property
    def n_entries(self) -> int:
        return len(self.keys)

    def entry_of(self, index: int) -> int:
        """The recorded trace entry a simulated entry happens at (or right after)."""
        return -1 if index < 0 else int(self.keys[index] >> SHIFT)

    def index_after(self, entries) -> np.ndarray:
        """Simulated entry of the state right after each recorded entry (-1: the start)."""
        e = np.asarray(entries, dtype=np.int64)
        out = np.searchsorted(self.keys, np.where(e >= 0, e << SHIFT, -1), side="right") - 1
        return np.where(e >= 0, out, -1)

    def as_device(self):
        """What CategoryLive.build reads of a DeviceAnalysis."""
        from .liveset import Composition
        allocs = SimpleNamespace(alloc_index=self.alloc_index, free_index=self.free_index, size=self.size)
        comp = Composition(self.category, allocs, self.n_entries)
        return SimpleNamespace(allocs=allocs, category=self.category, composition=lambda: comp,
                               live=SimpleNamespace(live_after=np.empty(self.n_entries, dtype=np.int8)))

    def growth(self, factors=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Live bytes after each simulated entry (the start state first) of the rows that do
        not grow (A), grow linearly with the batch or sequence (B), with the sequence's
        square (C); `factors` (float64 per CATEGORIES code) scales each row's size first."""
        n = self.n_entries
        size = self.size if factors is None else \
            np.rint(self.size * np.asarray(factors, dtype=np.float64)[self.category]).astype(np.int64)
        out = []
        for sel in (~self.batch, self.batch & ~self.seq2, self.seq2):
            ai, fi, s = self.alloc_index[sel], self.free_index[sel], size[sel].astype(np.float64)
            # every entry is one event: the deltas land on distinct entries, exact in float64
            d = np.bincount(ai[ai >= 0] + 1, weights=s[ai >= 0], minlength=n + 1).astype(np.float64)
            d -= np.bincount(fi[fi >= 0] + 1, weights=s[fi >= 0], minlength=n + 1)
            d[0] = s[ai < 0].sum()
            out.append(np.cumsum(d.astype(np.int64)))
        return out[0], out[1], out[2]


@dataclass(eq=False)
class Simulation:
    """A simulated run: its timeline, what each lever did, and an exact per-category model
    (built on first use)."""
    timeline: Timeline
    applied: tuple              # Applied per simulated lever
    _model: CategoryLive | None = field(default=None, repr=False)

    @property
    def model(self) -> CategoryLive:
        if self._model is None:
            self._model = CategoryLive.build(self.timeline.as_device())
        return self._model

    def peak(self, factors: dict | None = None) -> ScaledPeak:
        """The exact peak of the simulated run with categories scaled; `index` is the
        recorded trace entry it happens at (inserted events: the entry they follow)."""
        p = self.model.peak(factors)
        return ScaledPeak(p.bytes, self.timeline.entry_of(p.index), p.by_category)

    def live_at_many(self, entries, factors: dict | None = None) -> np.ndarray:
        """int64 [K, len(CATEGORIES)]: the simulated live bytes per category right after each
        recorded entry (-1: the start), scaled by `factors`, in CATEGORIES order."""
        from .category_live import scale_live
        idx = self.timeline.index_after(entries)
        live = self.model.live_at_many(idx)
        live = scale_live(live, self.model.factors(factors))
        out = np.zeros((len(idx), len(CATEGORIES)), dtype=np.int64)
        for k, c in enumerate(self.model.categories):
            out[:, CATEGORIES.index(c)] = live[:, k]
        return out


# -- the levers --------------------------------------------------------------------------------------
def _checkpointing(rw: Rewrite, st: Structure) -> Applied:
    if st.blocks is None:
        return Applied("checkpointing", False, "no repeated blocks found in the stacks: nothing to checkpoint")
    if st.checkpointed:
        return Applied("checkpointing", False, f"the {st.blocks.name} blocks are checkpointed already")
    ai, fi, role = rw.ai, rw.fi, st.role
    # what each forward pass saved for backward, by allocation: for each block, the last of
    # those made after it and freed before its own backward starts
    kept = np.flatnonzero(np.isin(role, (R_SAVED, R_OUTSIDE_SAVED, R_OUTPUT)) & (fi >= 0))
    kept = kept[np.argsort(ai[kept], kind="stable")]
    done = 0
    for j, c in enumerate(st.calls):
        r = c.rows
        saved = r[role[r] == R_SAVED]
        if not len(saved):
            continue
        first_free = int(fi[saved].min())
        lo, hi = np.searchsorted(ai[kept], [c.last + 1, st.passes[c.forward_pass][1] + 1])
        later = fi[kept[lo:hi]]
        later = later[later < first_free]
        base = int(later.max()) if len(later) else first_free - 1
        # replay the window up to its last saved tensor (torch stops the recompute there):
        # its allocations and its scratch's frees, in their order, right after `base`
        replay = r[np.isin(role[r], (R_SAVED, R_SCRATCH)) & (ai[r] <= int(ai[saved].max()))]
        scratch = replay[role[replay] == R_SCRATCH]
        ev_key = np.concatenate([ai[replay], fi[scratch]])
        new_key = np.empty(len(ev_key), dtype=np.int64)
        new_key[np.argsort(ev_key, kind="stable")] = rw.after(base, len(ev_key))
        free_key = rw.fk[replay].copy()
        free_key[role[replay] == R_SCRATCH] = new_key[len(replay):]
        rw.add(new_key[:len(replay)], free_key, replay)
        # forward: what the block saved goes when its forward ends
        rw.fk[saved] = rw.after(c.last, len(saved))
        # its input stays until its backward has run
        inp = int(st.inputs[j])
        end = int(fi[saved].max())
        if inp >= 0 and rw.fk[inp] >= 0 and (rw.fk[inp] >> SHIFT) < end:
            rw.fk[inp] = rw.after(end, 1)[0]
        done += 1
    b = st.blocks
    return Applied("checkpointing", done > 0,
                   f"activation checkpointing of the {b.count} {b.name} blocks: each block "
                   f"keeps its input; what it saved for backward is freed when its forward ends and recomputed "
                   f"(its forward replayed, scratch included) right before its own backward; the logits, loss "
                   f"and embeddings outside the blocks are unchanged; about a third more compute")


def _no_checkpointing(rw: Rewrite, st: Structure) -> Applied:
    if st.blocks is None or not st.checkpointed:
        return Applied("no_checkpointing", False, "the run is not checkpointed: nothing is recomputed")
    role, size = st.role, rw.size
    by = {(c.forward_pass, c.block): c for c in st.calls}
    done = 0
    for w in st.recomputes:
        c = by.get((w.forward_pass, w.block))
        q = w.rows
        rw.keep[q[role[q] == R_RECOMPUTE_SCRATCH]] = False
        if c is None:
            continue
        sm = difflib.SequenceMatcher(None, size[c.rows].tolist(), size[q].tolist(), autojunk=False)
        for blk in sm.get_matching_blocks():
            for t in range(blk.size):
                f, x = int(c.rows[blk.a + t]), int(q[blk.b + t])
                if role[x] == R_RECOMPUTE_SAVED:
                    if rw.fk[x] < 0 or (rw.fk[f] >= 0 and rw.fk[f] < rw.fk[x]):
                        rw.fk[f] = rw.fk[x]
                    rw.keep[x] = False
        done += 1
    # the checkpoint kept the first block's input for its recompute; without it, nothing keeps
    # it when nothing before the first block trains (frozen embeddings: LoRA)
    frozen = not _trains_before_blocks(rw.da, st)
    if frozen:
        _frozen_base(rw, _without_checkpoint(st), tail=False)
    b = st.blocks
    return Applied("no_checkpointing", done > 0,
                   f"no activation checkpointing of the {b.count} {b.name} blocks: each tensor "
                   f"recomputed during backward is matched (by order and size) to the one its forward made, which "
                   f"is kept until the recomputed one was freed; the recompute and its scratch go"
                   + ("; the first block's input, which only the checkpoint kept (nothing before the blocks "
                      "trains), goes when the first block's forward ends" if frozen else "")
                   + "; about a quarter less compute")


def _without_checkpoint(st: Structure) -> Structure:
    """The structure as if nothing were checkpointed (the first block's input not kept)."""
    blk = dataclasses.replace(st.blocks, checkpointed=False) if st.blocks is not None else None
    return dataclasses.replace(st, blocks=blk)


def _scale_rows(rw: Rewrite, sel: np.ndarray, f: float) -> None:
    rw.size[sel] = np.rint(rw.size[sel].astype(np.float64) * f).astype(np.int64)


def _half_batch(rw: Rewrite, st: Structure) -> Applied:
    _scale_rows(rw, rw.batch, 0.5)
    return Applied("half_batch", True,
                   "half the micro-batch (keep the effective batch with 2x gradient accumulation): every tensor "
                   "that grows with the batch is halved: activations, backward intermediates, inputs, forward "
                   "and recompute scratch made in the forward and backward passes; weights, "
                   "gradients, optimizer state and its scratch, library workspaces (cuBLAS), 16-bit weight copies "
                   "(autocast) and what was live before the trace stay")


def _block_matrices(da, st: Structure, facts) -> tuple[list, int | None]:
    """([(numel, count)] of the trained weight matrices the blocks repeat, the width).

    Trained: a weight with a gradient of its size (the gradients live at their highest);
    repeated: a size that comes at least once per block (the blocks' share of it: the
    whole multiple of the block count; an embedding may share a size); a matrix, not a
    vector: its numel is above 16 widths. The width is the most common vector size the
    blocks repeat (their norms) that divides every such matrix."""
    from .budget import _category_max_moment, _live_rows
    a = da.allocs
    size = np.asarray(a.size, dtype=np.int64)
    dt = facts.trainable_dtype_bytes if facts is not None and facts.trainable_dtype_bytes else 4.0
    ratio = facts.gradient_ratio if facts is not None and facts.gradient_ratio else 1.0
    w = np.flatnonzero((np.asarray(da.category) == _CAT["weights"]) & (np.asarray(a.free_index) < 0))
    g = _live_rows(da, _category_max_moment(da, _CAT["gradients"]), _CAT["gradients"])
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


def lora_adapter_params(da, st: Structure, facts, rank: int) -> tuple[int, int, str]:
    """(adapter parameters, adapted matrices, how they were counted) for rank-`rank` adapters
    on every weight matrix of the blocks: r.(in + out) each, one side being the width."""
    mats, width = _block_matrices(da, st, facts)
    total = 0
    for numel, k in mats:
        side = width if width else math.sqrt(numel)
        total += k * int(round(rank * (side + numel / side)))
    n_mats = sum(k for _, k in mats)
    how = (f"{n_mats} weight matrices in the blocks, r.(width + numel / width) parameters each, width {width}"
           if width else f"{n_mats} weight matrices in the blocks, taken as square (no width found)")
    return total, n_mats, how


def _lora(rw: Rewrite, st: Structure, da, facts, rank: int) -> Applied:
    if facts is None or not facts.trainable_params:
        return Applied("lora", False, "no trainable parameters recognized: nothing to replace with adapters")
    p_adapt, n_mats, how = lora_adapter_params(da, st, facts, rank)
    if not p_adapt:
        return Applied("lora", False, "no weight matrices repeated by the blocks: nothing to put adapters on")
    phi = min(1.0, p_adapt / facts.trainable_params)
    cat, ai = rw.cat, rw.ai
    ph = da.timeline.phase if da.timeline is not None else np.zeros(0, np.uint8)
    opt_scratch = np.zeros(len(cat), dtype=bool)
    if len(ph):
        opt_scratch = (cat == _CAT["temporary"]) & (ai >= 0) & (ph[np.clip(ai, 0, len(ph) - 1)] == P_OPTIMIZER)
    for sel in (cat == _CAT["gradients"], cat == _CAT["optimizer"], opt_scratch):
        _scale_rows(rw, sel, phi)
    rw.add_new([-1], [-1], [p_adapt * ADAPTER_BYTES], "weights", False)
    _norm_weight_inputs(rw, st, da)
    _frozen_base(rw, st)
    _adapter_branch(rw, st, da, facts, rank, n_mats)
    return Applied("lora", True,
                   f"LoRA of rank {rank} instead of full fine-tuning: the weights stay (frozen); "
                   f"gradients, optimizer state and optimizer scratch shrink to the adapters' {p_adapt:,} parameters "
                   f"({phi:.2%} of the {facts.trainable_params:,} trained now; {how}), whose fp32 weights are added; "
                   f"each adapted matrix saves its input to B (tokens x r) until the block's backward and, at its "
                   f"backward, holds one more tokens x in tensor (the adapter's gradient of x beside the base's); "
                   f"nothing before the first block is kept (frozen embeddings), nor the LM head's input or a "
                   f"Python norm's `weight * x` input (frozen weights need no gradient); adapters on every weight "
                   f"matrix of the blocks (all-linear): with fewer, less is kept and the peak is lower")


def _frozen_base(rw: Rewrite, st: Structure, tail: bool = True) -> None:
    """What is kept only for the frozen parts' weight gradients, or for a checkpoint: the first
    block's input goes when that block's forward ends (nothing before the blocks trains, and
    without a checkpoint nothing keeps it); with `tail`, the tensors the size of the residual
    stream kept after the last block (the final norm's output, the LM head's input) go when
    the forward ends (a frozen head needs no weight gradient)."""
    role, ai = st.role, rw.ai
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for j, c in enumerate(st.calls):
        first.setdefault(c.forward_pass, j)
        last[c.forward_pass] = j
    for p, (s, e) in enumerate(st.passes):
        if p not in first:
            continue
        c0, cn = st.calls[first[p]], st.calls[last[p]]
        inp = int(st.inputs[first[p]])
        if inp >= 0 and not st.checkpointed and (rw.fk[inp] < 0 or rw.fk[inp] > (c0.end << SHIFT)):
            rw.fk[inp] = rw.after(c0.end, 1)[0]
        if not tail or st.outputs[last[p]] < 0:
            continue
        out_size = rw.size[st.outputs[last[p]]]
        kept = np.flatnonzero((role == R_OUTSIDE_SAVED) & (ai > cn.end) & (ai <= e)
                              & np.isin(rw.size, [out_size, out_size // 2]))
        if len(kept):
            rw.fk[kept] = rw.after(e, len(kept))


def _norm_weight_inputs(rw: Rewrite, st: Structure, da) -> None:
    """A norm that scales by its weight in Python (`weight * x`, Llama's RMSNorm) keeps x only
    for the weight's gradient, which a frozen norm does not need: a block's saved tensor the
    size of the residual stream whose next allocation is the same function's tensor of its size
    (the product), and which backward frees right after making a vector's gradient (the norm
    weight's), goes when that product is made. Fused norms (layer_norm) keep their input for
    the input's gradient: their input is made elsewhere, so they never match."""
    if st.function is None or not st.output_bytes:
        return
    ai, fi, size, fn = rw.ai, rw.fi, rw.size, st.function
    cat = np.asarray(da.category)
    grads = np.flatnonzero((cat == _CAT["gradients"]) & (ai >= 0))
    if not len(grads):
        return
    big = int(size[grads].max())
    vector_grad = np.zeros(len(da.timeline.phase) + 1, dtype=bool)
    vector_grad[ai[grads[size[grads] * size[grads] < 4 * big]]] = True
    allocs = np.sort(ai[ai >= 0])
    for c in st.calls + st.recomputes:
        r = c.rows
        cand = np.flatnonzero(np.isin(st.role[r[:-1]], (R_SAVED, R_RECOMPUTE_SAVED)) & (size[r[:-1]] == st.output_bytes)
                              & (size[r[1:]] == size[r[:-1]]) & (fn[r[:-1]] == fn[r[1:]]) & (fn[r[:-1]] >= 0))
        for i in cand.tolist():
            x = r[i]
            k = int(np.searchsorted(allocs, fi[x])) - 1
            if k >= 0 and vector_grad[allocs[k]]:
                rw.fk[x] = rw.after(int(ai[r[i + 1]]), 1)[0]


def _trains_before_blocks(da, st: Structure) -> bool:
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


def _adapter_branch(rw: Rewrite, st: Structure, da, facts, rank: int, n_mats: int) -> None:
    """The adapter branch of each adapted matrix: x @ A^T (tokens x r) saved from the block's
    forward (its recompute, when checkpointed) until its backward; in backward, at the matrix's
    gradient (full fine-tuning makes it there), the branch's gradients: tokens x (its larger
    side + r), freed when the matrix's backward is done."""
    if st.blocks is None or not st.blocks.count or not st.output_bytes:
        return
    mats, width = _block_matrices(da, st, facts)
    if not width:
        return
    # the residual stream in the weights' dtype (fp32 weights under autocast: an fp32 stream)
    act = float(facts.trainable_dtype_bytes or 4.0)
    tokens = st.output_bytes / (width * act)
    per_block = n_mats // st.blocks.count
    xa = int(round(tokens * rank * act))
    fi = rw.fi
    starts = {(w.forward_pass, w.block): w for w in st.recomputes}
    for c in st.calls:
        saved = c.rows[np.isin(st.role[c.rows], (R_SAVED, R_OUTPUT))]
        w = starts.get((c.forward_pass, c.block))
        if w is not None:
            saved = w.rows[st.role[w.rows] == R_RECOMPUTE_SAVED]
        if not len(saved) or not per_block:
            continue
        frees = np.sort(fi[saved])
        at = frees[np.linspace(0, len(frees) - 1, per_block).astype(int)]
        f_keys = np.array([rw.after(int(x), 1)[0] for x in at.tolist()], dtype=np.int64)
        rw.add_new(rw.after(w.end if w is not None else c.last, per_block), f_keys, [xa] * per_block,
                   "activations", True)
    # the branch's gradients, where full fine-tuning makes each matrix's gradient: the adapter's
    # gradient of x (tokens x in) and its sum with the base's come beside the base's own, while
    # x itself, which the frozen base does not keep, has gone after A's gradient: one tokens x in
    # tensor more than full fine-tuning has there. `in` is the side whose tokens x in tensor full
    # fine-tuning allocates next to the matrix's gradient (its input's gradient); the larger side
    # where none is seen
    ratio = facts.gradient_ratio if facts.gradient_ratio else 1.0
    dt = facts.trainable_dtype_bytes or 4.0
    sides = {int(round(m * dt * ratio)): (width, m / width) for m, _k in mats}
    cat = np.asarray(da.category)
    size = np.asarray(da.allocs.size, dtype=np.int64)
    g = np.flatnonzero((cat == _CAT["gradients"]) & (rw.ai >= 0) & np.isin(size, list(sides)))
    ph = da.timeline.phase
    g = g[ph[rw.ai[g]] == P_BACKWARD]
    by_entry = np.full(len(ph), -1, dtype=np.int64)
    has = rw.ai >= 0
    by_entry[rw.ai[has]] = np.flatnonzero(has)
    alloc_entries = np.sort(rw.ai[has])
    for r in g.tolist():
        e = int(rw.ai[r])
        a_side, b_side = sides[int(size[r])]
        k = int(np.searchsorted(alloc_entries, e))
        near = [alloc_entries[j] for j in (k - 1, k + 1) if 0 <= j < len(alloc_entries)]
        fin, end = max(a_side, b_side), e
        for x in near:
            nb = int(size[by_entry[x]])
            hit = [sd for sd in (a_side, b_side) if abs(nb - tokens * sd * act) < 1]
            if hit and cat[by_entry[x]] == _CAT["autograd"]:
                fin, end = hit[0], max(e, int(x))
                break
        nbytes = int(round(tokens * fin * act))
        rw.add_new(rw.after(e - 1, 1), rw.after(end, 1), [nbytes], "autograd", True)


# -- the entry point ------------------------------------------------------------------------------------
def simulate(da, names, facts=None, lora_rank: int = LORA_RANK, scales: dict | None = None) -> Simulation:
    """The run with the simulated levers `names` pulled (in a fixed order: un/checkpointing,
    LoRA, then the batch), and optionally category `scales` applied to the rows' sizes (for
    growth: the exact peak applies factors itself)."""
    st = structure(da)
    rw = Rewrite(da, st)
    applied = []
    names = list(names)
    if "checkpointing" in names:
        applied.append(_checkpointing(rw, st))
    if "no_checkpointing" in names:
        applied.append(_no_checkpointing(rw, st))
    if "lora" in names:
        applied.append(_lora(rw, st, da, facts, lora_rank))
    if "half_batch" in names:
        applied.append(_half_batch(rw, st))
    for c, f in (scales or {}).items():
        if f != 1.0:
            _scale_rows(rw, rw.cat == _CAT[c], f)
    return Simulation(rw.finish(), tuple(applied))


__all__ = ["simulate", "Simulation", "Timeline", "Applied", "SIMULATED", "LORA_RANK", "lora_adapter_params",
           "SHIFT"]
