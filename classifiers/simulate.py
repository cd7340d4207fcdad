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
_PEAK_PART = 1 << 20        # entries summed at a time where only sizes change (Rewrite.total_peak) ...
_INT32_ROWS = 1 << 30       # ... in int32 where every row is under this many bytes
SIMULATED = ("checkpointing", "no_checkpointing", "half_batch", "lora")
_CAT = {c: i for i, c in enumerate(CATEGORIES)}


def _keys(entries) -> np.ndarray:
    """int64 event keys of recorded trace entries (-1 stays -1: before the trace / never)."""
    k = np.array(entries, dtype=np.int64)        # (a copy, worked on in place: two passes, not four)
    before = k < 0
    k <<= SHIFT
    k[before] = -1
    return k


class Rewrite:
    """The recorded rows, then edited by the levers; `finish` orders the events."""

    def __init__(self, da, st: Structure):
        a = da.allocs
        # the recorded entries as the allocations hold them (int32 below 2^31 entries: no
        # copies; read-only here), made int64 where shifted into keys
        ai = np.asarray(a.alloc_index)
        fi = np.asarray(a.free_index)
        self.da, self.st = da, st
        self.ai, self.fi = ai, fi
        self.shift = SHIFT
        self.n_entries = len(da.timeline.phase) if da.timeline is not None else 0
        self._fk: np.ndarray | None = None         # the free keys once a lever reads or moves one (fk)
        self._size0 = np.asarray(a.size, dtype=np.int64)
        self._size_read = self._size0.view()       # the recorded sizes, read-only (no copy)
        self._size_read.flags.writeable = False
        self._size: np.ndarray | None = None       # the sizes once a lever changes one (sizes_to_change)
        # read-only here (a lever changes sizes, frees and rows kept, never these): no copies
        self.cat = np.asarray(da.category, dtype=np.uint8)
        self.batch = st.batch
        self.seq2 = st.seq2
        self.keep = np.ones(len(ai), dtype=bool)
        self._next: dict = {}
        self._extra: list = []

    @property
    def fk(self) -> np.ndarray:
        """The rows' free event keys, read and moved in place by the levers that move frees;
        made from the recorded frees on first use (the half batch, which moves none, never
        makes them: 8 bytes a row, 35 MB at 4.4 million rows, at the highest memory of a cold
        `summary` of a torch 2.0 trace of 10^7 entries)."""
        if self._fk is None:
            self._fk = _keys(self.fi)
        return self._fk

    @property
    def size(self) -> np.ndarray:
        """The rows' sizes (read-only): the recorded ones until a lever changes one, without a
        copy of them for the levers that move lifetimes only (27 MB at 10^7 events, at the
        highest memory of a cold `summary` and of the viewer's open)."""
        return self._size_read if self._size is None else self._size

    def sizes_to_change(self) -> np.ndarray:
        """The rows' sizes, to be changed in place (copied from the recorded ones once)."""
        if self._size is None:
            self._size = self._size0.copy()
        return self._size

    def after(self, entry: int, n: int) -> np.ndarray:
        """`n` new event keys right after trace entry `entry`, after those taken before."""
        k = self.reserve(entry, n)
        return (np.int64(entry) << SHIFT) + np.arange(k, k + n, dtype=np.int64)

    def reserve_many(self, entries: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """`reserve` for each (entry, count) in turn, at once: the first key's place of each."""
        entries = np.asarray(entries, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        out = np.zeros(len(entries), dtype=np.int64)
        if not len(entries):
            return out
        order = np.argsort(entries, kind="stable")        # by entry, in turn within one
        e, c = entries[order], counts[order]
        new = np.ones(len(e), dtype=bool)
        new[1:] = e[1:] != e[:-1]
        first = np.flatnonzero(new)
        run = np.cumsum(c) - c                             # before each request, over all
        group = np.cumsum(new) - 1
        ue = e[first].tolist()
        start = np.fromiter((self._next.get(x, 1) for x in ue), dtype=np.int64, count=len(ue))
        at = start[group] + run - run[first][group]
        ends = at + c
        if len(ends) and int(ends.max()) >= (1 << SHIFT):
            raise OverflowError("too many events inserted after one trace entry")
        last = np.r_[first[1:], len(e)] - 1
        self._next.update(zip(ue, ends[last].tolist()))
        out[order] = at
        return out

    def reserve(self, entry: int, n: int) -> int:
        """Take `n` new event keys right after trace entry `entry` (after those taken before):
        the first one's place after it (the keys: (entry << SHIFT) + that, + 1, ...)."""
        k = self._next.get(entry, 1)
        if k + n >= (1 << SHIFT):
            raise OverflowError("too many events inserted after one trace entry")
        self._next[entry] = k + n
        return k

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

    @property
    def ak(self) -> np.ndarray:
        return _keys(self.ai)

    def total_peak(self) -> tuple[int, int]:
        """(highest live bytes of the rewritten run, the recorded entry it happens at or right
        after; -1: the start) without replaying every event: the recorded run's live bytes after
        each entry (LiveModel.live_after) plus the running difference the rewrite makes, which
        changes only at the events of the rows a lever touched (their recorded events taken out,
        their new ones and the added rows' put in). No sort of the touched events (only of the
        inserted ones): linear in the events and entries. In memory: one int64 per entry, the
        events added into it a part at a time (this ran at the highest memory of a cold
        `summary`). Equal to `finish()`'s highest total."""
        la = np.asarray(self.da.live.live_after)
        n = len(la)
        mask = (1 << SHIFT) - 1
        touched = self._touched()
        # diff[e]: what the rewrite changes at entry e (then, summed, the difference in force
        # there). Where only sizes change (the half batch: no event moved or added), an entry
        # takes the change of the one row allocated or freed there: int32 where every row is
        # under 2^30 bytes (half of int64's 76 MB at 10^7 entries, at the highest memory of the
        # viewer's open), summed a part at a time in int64
        sizes_only = self._fk is None and not self._extra and (
            not len(self._size0) or max(int(self._size0.max()), int(self.size.max()),
                                        -int(self.size.min()), -int(self._size0.min())) < _INT32_ROWS)
        diff = np.zeros(n + 1, dtype=np.int32 if sizes_only else np.int64)
        start_d = 0
        ins_parts: list = []         # (keys, deltas) of the events inserted between two entries

        def at_entries(e, d, is_alloc: bool) -> None:
            """Events at recorded entries `e` (-1: before the trace / never) with deltas `d`."""
            nonlocal start_d
            d = np.asarray(d, dtype=np.int64)
            if sizes_only and len(d):
                start_d += int(d[e < 0].sum()) if is_alloc else 0
                ok = (e >= 0) & (e < n)
                np.add.at(diff, e[ok], d[ok].astype(np.int32))
                return
            # (numpy 2's np.add.at: four times an indexed `+=` on 2^18 rows into 10^7 entries)
            if not len(e) or (int(e.min()) >= 0 and int(e.max()) < n):
                np.add.at(diff, e, d)
                return
            before = e < 0            # live before the trace: the start state; never freed: nothing
            if is_alloc and before.any():
                start_d += int(d[before].sum())
            ok = ~before & (e < n)
            np.add.at(diff, e[ok], d[ok])

        def at_keys(k, d, is_alloc: bool) -> None:
            """Events at event keys `k` (a lever's: maybe between two entries), deltas `d`."""
            nonlocal start_d
            k = np.asarray(k, dtype=np.int64)
            d = np.asarray(d, dtype=np.int64)
            before = k < 0
            if is_alloc and before.any():
                start_d += int(d[before].sum())
            k, d = k[~before], d[~before]
            # an event governs the entries from the first at or after its key
            first = np.minimum((k + mask) >> SHIFT, n)
            np.add.at(diff, first, d)
            mid = (k & mask) != 0                   # inserted between two entries
            if mid.any():
                ins_parts.append((k[mid], d[mid]))

        # The events the rewrite changes: a dropped row's alloc and free come out; a kept row's
        # alloc changes by its growth, its free too where it stays, else comes out there and
        # goes in at its new key; the added rows go in.
        kept = self.keep[touched]
        moved = np.zeros(len(touched), dtype=bool) if self._fk is None else \
            self._fk[touched] != _keys(self.fi[touched])
        if kept.all() and not moved.any():         # sizes changed only (the half batch): no copy of them
            groups = [(touched, "stays")]
        else:
            groups = [(touched[~kept], "dropped"), (touched[kept & ~moved], "stays"), (touched[kept & moved], "moved")]
        del touched, kept, moved
        chunk = 1 << 18             # rows at a time: a few MB of temporaries, not ~100 bytes per touched row
        for rows, what in ((g[i:i + chunk], what) for g, what in groups for i in range(0, len(g), chunk)):
            s0 = self._size0[rows]
            a_r, f_r = self.ai[rows], self.fi[rows]
            if what == "dropped":
                at_entries(a_r, -s0, True)
                at_entries(f_r, s0, False)
            else:
                grown = self.size[rows] - s0
                at_entries(a_r, grown, True)
                if what == "stays":
                    at_entries(f_r, -grown, False)
                else:
                    at_entries(f_r, s0, False)
                    at_keys(self.fk[rows], -self.size[rows], False)
            del s0, a_r, f_r
        del groups
        step = 2048                  # the added rows (one part per block call of a lever), a few thousand at once
        for j in range(0, len(self._extra), step):
            part = self._extra[j:j + step]
            sz = np.concatenate([np.asarray(x[2], dtype=np.int64) for x in part])
            at_keys(np.concatenate([np.asarray(x[0], dtype=np.int64) for x in part]), sz, True)
            at_keys(np.concatenate([np.asarray(x[1], dtype=np.int64) for x in part]), -sz, False)
        start = int(self.da.live.start_bytes) + start_d
        if not n:
            return start, -1
        if sizes_only:
            assert not ins_parts
            best, at = start, -1
            carry = 0
            step = _PEAK_PART
            for lo in range(0, n, step):
                hi = min(lo + step, n)
                run = np.cumsum(diff[lo:hi], dtype=np.int64)
                run += carry
                carry = int(run[-1])
                run += la[lo:hi]
                j = int(np.argmax(run))
                if int(run[j]) + start_d > best:
                    best, at = int(run[j]) + start_d, lo + j
            return best, at
        np.cumsum(diff, out=diff)                           # the difference in force at each entry
        np.add(diff[:n], la, out=diff[:n])                 # live bytes after each entry, rewritten
        e = int(np.argmax(diff[:n]))
        best, at = start, -1
        v = int(diff[e]) + start_d
        if v > best:
            best, at = v, e
        # The inserted events (between two entries), in key order: at each, the live bytes after
        # its entry plus the inserted events of that entry up to it. A range of entries at a time
        # (a few hundred thousand events each: this ran at the highest memory of a cold `summary`).
        m = sum(len(k) for k, _ in ins_parts)
        pieces = max(1, m >> 18)
        bounds = np.linspace(0, n, pieces + 1).astype(np.int64)
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            ks, ds = [], []
            for k, d in ins_parts:
                ent = k >> SHIFT
                sel = (ent >= lo) & (ent < hi)
                if sel.any():
                    ks.append(k[sel])
                    ds.append(d[sel])
            if not ks:
                continue
            k = np.concatenate(ks)
            d = np.concatenate(ds)
            del ks, ds
            o = np.argsort(k, kind="stable")
            k, d = k[o], d[o]
            del o
            ent = k >> SHIFT
            run = np.cumsum(d)                              # through each event
            own = np.searchsorted(ent, ent, side="left")    # its entry's first inserted event
            v = diff[ent] + run - (run[own] - d[own]) + start_d
            j = int(np.argmax(v))
            if int(v[j]) > best:
                best, at = int(v[j]), int(ent[j])
        return best, at

    def _touched(self) -> np.ndarray:
        """The rows a lever changed (dropped, resized or freed elsewhere), a slice at a time
        (no full-length temporaries)."""
        out = []
        step = 1 << 20
        # (row numbers in int32 below 2^31 rows: half the memory, at the highest of a cold `summary`)
        idx_t = np.int32 if len(self.ai) < (1 << 31) else np.int64
        for s in range(0, len(self.ai), step):
            sl = slice(s, s + step)
            t = ~self.keep[sl] | (self.size[sl] != self._size0[sl])
            if self._fk is not None:
                t |= self._fk[sl] != _keys(self.fi[sl])
            part = np.flatnonzero(t).astype(idx_t)
            part += s
            out.append(part)
        return np.concatenate(out) if out else np.zeros(0, dtype=idx_t)

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
            scales: dict | None = None, growth_only: bool = False) -> tuple[Rewrite, tuple]:
    """The run with the simulated levers `names` pulled (in a fixed order: un/checkpointing,
    LoRA, then the batch) and optionally category `scales` applied to the rows' sizes: the
    rewritten rows and what each lever did. `growth_only`: the half batch alone on what grows
    with the batch, found on its own (not the whole structure, which may be still being found:
    its rows that grow with the batch are these)."""
    from .levers import LEVERS
    ctx = Context(da, facts, lora_rank, lora_targets)
    wanted = [n for n in ORDER if n in names]
    if growth_only and wanted == ["half_batch"]:
        st = growth_structure(da, wait=False)
    else:
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
                   lora_targets: str = TARGETS_DEFAULT, growth_only: bool = False) -> tuple[int, int, tuple]:
    """(peak bytes, the recorded entry it happens at or right after, what each lever did) of the
    run with `names` pulled, without ordering every event again (Rewrite.total_peak): what
    advice reads; equal to simulate(...).peak().bytes."""
    rw, applied = rewrite(da, names, facts, lora_rank, lora_targets, growth_only=growth_only)
    b, e = rw.total_peak()
    return b, e, applied


__all__ = ["simulate", "simulated_peak", "rewrite", "Simulation", "Timeline", "Rewrite", "Context", "Applied",
           "SIMULATED", "LORA_RANK", "SHIFT"]
