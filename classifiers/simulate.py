"""Levers simulated on the recorded timeline (DESIGN.md §8), from the run's own structure
(structure.py): the allocation rows are rewritten (lifetimes moved, rows split, recomputed
copies inserted, sizes scaled) and the new timeline is replayed exactly, so the peak may
move to another moment, as it would in the run with the lever pulled.

    sim = simulate(da, ["checkpointing"], facts)        # -> Simulation
    sim.peak(factors)                                   # ScaledPeak on the simulated run (index: trace entry)
    sim.live_at_many(entries)                           # int64 [K, C] after each recorded entry
    sim.timeline.growth(factors)                        # what does not grow / grows with the batch
                                                        # (or sequence) / with its square: for --fit

What each lever does lives with the lever (classifiers/levers/: checkpointing.py,
no_checkpointing.py, half_batch.py, lora.py); this module holds the rewrite they edit, the
replay, and the entry points.

A timeline is a set of rows (alloc key, free key, size, category); keys order events: an
original trace entry i is `i << SHIFT`, an inserted event after entry i is `(i << SHIFT) + k`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from .categories import CATEGORIES
from .category_live import CategoryLive, ScaledPeak
from .levers.base import Applied
from .levers.lora import LORA_RANK, TARGETS_DEFAULT
from .levers.structural import scale_rows
from .structure import Structure, growth_structure, structure

SHIFT = 21                  # room for 2^21 - 1 inserted events after one trace entry
SIMULATED = ("checkpointing", "no_checkpointing", "half_batch", "lora")
_CAT = {c: i for i, c in enumerate(CATEGORIES)}


class Rewrite:
    """The recorded rows, then edited by the levers; `finish` orders the events."""

    def __init__(self, da, st: Structure):
        a = da.allocs
        ai = np.asarray(a.alloc_index).astype(np.int64)
        fi = np.asarray(a.free_index).astype(np.int64)
        self.da, self.st = da, st
        self.ai, self.fi = ai, fi
        self.shift = SHIFT
        self.n_entries = len(da.timeline.phase) if da.timeline is not None else 0
        self.ak = np.where(ai >= 0, ai << SHIFT, -1)
        self.fk = np.where(fi >= 0, fi << SHIFT, -1)
        self.size = np.asarray(a.size, dtype=np.int64).copy()
        self._size0 = np.asarray(a.size, dtype=np.int64)
        self._fk0 = self.fk.copy()
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

    def total_peak(self) -> tuple[int, int]:
        """(highest live bytes of the rewritten run, the recorded entry it happens at or right
        after; -1: the start) without ordering every event again: the rows no lever touched
        add up per entry in trace order, and only the events of the rows a lever changed (or
        added) are sorted and merged in. Equal to `finish().growth()`'s highest total."""
        n = max(self.n_entries, int(max(self.ai.max(initial=-1), self.fi.max(initial=-1))) + 1)
        keep, size, ai, fi = self.keep, self.size, self.ai, self.fi
        same = keep & (size == self._size0) & (self.fk == self._fk0)
        d = np.zeros(n, dtype=np.int64)
        a_ok = same & (ai >= 0)
        f_ok = same & (fi >= 0)
        np.add.at(d, ai[a_ok], size[a_ok])
        np.subtract.at(d, fi[f_ok], size[f_ok])
        start = int(size[same & (ai < 0)].sum())
        base = np.cumsum(d)
        # the changed and added rows' events
        ch = keep & ~same
        parts_k = [self.ak[ch], self.fk[ch]]
        parts_d = [size[ch], -size[ch]]
        for ak, fk, sz, *_ in self._extra:
            parts_k += [ak, fk]
            parts_d += [sz, -sz]
        keys = np.concatenate(parts_k) if parts_k else np.zeros(0, np.int64)
        deltas = np.concatenate(parts_d) if parts_d else np.zeros(0, np.int64)
        valid = keys >= 0
        # allocations before the trace (key -1) are in the start state; frees never made (-1) never happen
        is_alloc = np.concatenate([np.ones(len(k), bool) if i % 2 == 0 else np.zeros(len(k), bool)
                                   for i, k in enumerate(parts_k)]) if parts_k else np.zeros(0, bool)
        start += int(deltas[~valid & is_alloc].sum())
        keys, deltas = keys[valid], deltas[valid]
        order = np.argsort(keys, kind="stable")
        keys, deltas = keys[order], deltas[order]
        cum = np.cumsum(deltas)
        best, at = start, -1
        if n:
            # after each recorded entry: the untouched rows up to it, the changed events up to its key
            if len(keys):
                k = np.searchsorted(keys, np.arange(n, dtype=np.int64) << SHIFT, side="right")
                v = start + base + np.where(k > 0, cum[np.maximum(k - 1, 0)], 0)
            else:
                v = start + base
            e = int(np.argmax(v))
            if v[e] > best:
                best, at = int(v[e]), e
        if len(keys):
            ent = keys >> SHIFT
            v = start + np.where(ent < n, base[np.minimum(ent, max(n - 1, 0))] if n else 0, 0) + cum
            j = int(np.argmax(v))
            if v[j] > best:
                best, at = int(v[j]), int(ent[j])
        return best, at

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


# -- the entry point ------------------------------------------------------------------------------------
@dataclass(eq=False)
class Context:
    """What the simulated levers read: the device, its structure (found on first use), the
    budget's facts, the LoRA rank and targets, the run's facts."""
    da: object
    facts: object = None
    lora_rank: int = LORA_RANK
    lora_targets: str = TARGETS_DEFAULT
    _structure: Structure | None = None

    @property
    def structure(self) -> Structure:
        if self._structure is None:
            self._structure = structure(self.da)
        return self._structure

    @property
    def run(self):
        return getattr(self.da, "run", None)


ORDER = ("checkpointing", "no_checkpointing", "lora", "half_batch")


def rewrite(da, names, facts=None, lora_rank: int = LORA_RANK, lora_targets: str = TARGETS_DEFAULT,
            scales: dict | None = None) -> tuple[Rewrite, tuple]:
    """The run with the simulated levers `names` pulled (in a fixed order: un/checkpointing,
    LoRA, then the batch) and optionally category `scales` applied to the rows' sizes: the
    rewritten rows and what each lever did."""
    from .levers import LEVERS
    ctx = Context(da, facts, lora_rank, lora_targets)
    wanted = [n for n in ORDER if n in names]
    st = ctx.structure if any(n != "half_batch" for n in wanted) else growth_structure(da)
    rw = Rewrite(da, st)
    applied = tuple(LEVERS[n].apply(rw, ctx) for n in wanted)
    for c, f in (scales or {}).items():
        if f != 1.0:
            scale_rows(rw, rw.cat == _CAT[c], f)
    return rw, applied


def simulate(da, names, facts=None, lora_rank: int = LORA_RANK, scales: dict | None = None,
             lora_targets: str = TARGETS_DEFAULT) -> Simulation:
    """The run with the simulated levers `names` pulled, as a Simulation (rewrite, then the
    events in order)."""
    rw, applied = rewrite(da, names, facts, lora_rank, lora_targets, scales)
    return Simulation(rw.finish(), applied)


def simulated_peak(da, names, facts=None, lora_rank: int = LORA_RANK,
                   lora_targets: str = TARGETS_DEFAULT) -> tuple[int, int, tuple]:
    """(peak bytes, the recorded entry it happens at or right after, what each lever did) of the
    run with `names` pulled, without ordering every event again (Rewrite.total_peak): what
    advice reads; equal to simulate(...).peak().bytes."""
    rw, applied = rewrite(da, names, facts, lora_rank, lora_targets)
    b, e = rw.total_peak()
    return b, e, applied


__all__ = ["simulate", "simulated_peak", "rewrite", "Simulation", "Timeline", "Rewrite", "Context", "Applied",
           "SIMULATED", "LORA_RANK", "SHIFT"]
