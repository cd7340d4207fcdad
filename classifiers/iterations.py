"""A device's iterations as columns: `Iterations`, a sequence of `Iteration`.

A trace of short steps has hundreds of thousands of iterations (a tiled single-step run at
10^7 entries: 1.3 million). As objects, each with its dict of phases, they cost a microsecond
or more apiece to make, copy, convert and cache, and a kilobyte apiece to hold: most of a cold
`summary --json`'s 51 s and 6.5 GB at that size. Here they are arrays, one row per iteration in
order; an `Iteration` is made only for the rows asked for (an index, a slice, a loop over them
all). Stages that read every iteration read the columns (`start`, `end`, `peak_index`, ...).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress
from typing import Any, overload

import numpy as np

from .results import Iteration

# an iteration's phases, in the order its `phases` dict lists them
PHASES = ("inputs", "forward", "backward", "optimizer", "eval", "unwind")
_ABSENT = -1                    # a phase the iteration does not have (its first and last entry)
NO_TIME = np.iinfo(np.int64).min   # start_us / end_us None
_COLUMNS = ("start", "end", "start_us", "end_us", "micro_batches", "peak_bytes", "peak_index")


class Iterations(Sequence):
    """Iterations numbered 1.. in order, held as columns (int64 arrays of one length):
    `start`, `end` (first and last entry, inclusive), `start_us`, `end_us` (`NO_TIME` for
    None), `lo`, `hi` (shape (len(PHASES), n): each phase's first and last entry, -1 where
    absent), `micro_batches`, `peak_bytes`, `peak_index` (-1: not found) and, as lists of
    str, `source` and `peak_type`. Indexing gives an `Iteration` (a slice, a tuple of them)."""

    __slots__ = ("start", "end", "start_us", "end_us", "lo", "hi", "micro_batches", "source",
                 "peak_bytes", "peak_index", "peak_type")

    def __init__(self, start, end, start_us=None, end_us=None, lo=None, hi=None, micro_batches=None,
                 source: str | list[str] = "phases", peak_bytes=None, peak_index=None,
                 peak_type: str | list[str] = "other"):
        def col(a, fill):
            if a is None:
                return np.full(n, fill, dtype=np.int64)
            a = np.asarray(a, dtype=np.int64)
            if a.shape != (n,):
                raise ValueError("iteration columns of different lengths")
            return a
        self.start = np.asarray(start, dtype=np.int64)
        n = len(self.start)
        self.end = col(end, 0)
        self.start_us, self.end_us = col(start_us, NO_TIME), col(end_us, NO_TIME)
        shape = (len(PHASES), n)
        self.lo = np.full(shape, _ABSENT, dtype=np.int64) if lo is None else np.asarray(lo, dtype=np.int64)
        self.hi = np.full(shape, _ABSENT, dtype=np.int64) if hi is None else np.asarray(hi, dtype=np.int64)
        if self.lo.shape != shape or self.hi.shape != shape:
            raise ValueError("iteration phase columns of the wrong shape")
        self.micro_batches = col(micro_batches, 0)
        self.peak_bytes, self.peak_index = col(peak_bytes, 0), col(peak_index, -1)
        self.source = [source] * n if isinstance(source, str) else list(source)
        self.peak_type = [peak_type] * n if isinstance(peak_type, str) else list(peak_type)
        if len(self.source) != n or len(self.peak_type) != n:
            raise ValueError("iteration columns of different lengths")

    # -- made from objects, and back -----------------------------------------------------
    @classmethod
    def of(cls, its: Iterable[Iteration]) -> Iterations:
        """The columns of `its` (already Iterations: itself). Their numbers must be 1, 2, ...
        in order, and their phases among PHASES (ValueError otherwise)."""
        if isinstance(its, Iterations):
            return its
        its = list(its)
        n = len(its)
        if any(it.number != k + 1 for k, it in enumerate(its)):
            raise ValueError("iterations are numbered 1, 2, ... in order")
        lo = np.full((len(PHASES), n), _ABSENT, dtype=np.int64)
        hi = lo.copy()
        for k, it in enumerate(its):
            for name, (a, b) in it.phases.items():
                if name not in PHASES:
                    raise ValueError(f"unknown phase {name!r}")
                j = PHASES.index(name)
                lo[j, k], hi[j, k] = a, b
        times = [(it.start_us, it.end_us) for it in its]
        return cls([it.start_index for it in its], [it.end_index for it in its],
                   [NO_TIME if a is None else a for a, _ in times], [NO_TIME if b is None else b for _, b in times],
                   lo, hi, [it.micro_batches for it in its], [it.source for it in its],
                   [it.peak_bytes for it in its], [it.peak_index for it in its], [it.peak_type for it in its])

    def _lists(self, a: int, b: int) -> dict[str, Any]:
        """Rows a..b-1 of every column as Python lists, for one loop over them (not kept: at a
        million rows they hold a gigabyte)."""
        cols = {c: getattr(self, c)[a:b].tolist() for c in _COLUMNS}
        cols["lo"], cols["hi"] = self.lo[:, a:b].tolist(), self.hi[:, a:b].tolist()
        return cols

    def _row(self, k: int, cols: dict[str, Any] | None = None, first: int = 0) -> Iteration:
        """Row k as an Iteration: from the arrays, or from `cols` (`_lists` from row `first`)."""
        if cols is None:       # one row: from the arrays (a list of every row would cost more)
            vals = [int(getattr(self, c)[k]) for c in _COLUMNS]
            lo, hi = self.lo[:, k].tolist(), self.hi[:, k].tolist()
        else:
            j = k - first
            vals = [cols[c][j] for c in _COLUMNS]
            lo, hi = [x[j] for x in cols["lo"]], [x[j] for x in cols["hi"]]
        start, end, t0, t1, micro, pb, pi = vals
        it = object.__new__(Iteration)         # (a frozen dataclass: its __init__ sets each field)
        it.__dict__.update(number=k + 1, start_index=start, end_index=end,
                           start_us=None if t0 == NO_TIME else t0, end_us=None if t1 == NO_TIME else t1,
                           phases={name: (a, b) for name, a, b in zip(PHASES, lo, hi) if b >= 0},
                           micro_batches=micro, source=self.source[k], peak_bytes=pb, peak_index=pi,
                           peak_type=self.peak_type[k])
        return it

    # -- the sequence ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.start)

    @overload
    def __getitem__(self, k: int) -> Iteration: ...
    @overload
    def __getitem__(self, k: slice) -> tuple[Iteration, ...]: ...

    def __getitem__(self, k):
        if isinstance(k, slice):
            rows = range(len(self))[k]
            if len(rows) <= 64:
                return tuple(self._row(i) for i in rows)
            a, b = min(rows[0], rows[-1]), max(rows[0], rows[-1]) + 1
            cols = self._lists(a, b)
            return tuple(self._row(i, cols, a) for i in rows)
        i = int(k)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("iteration index out of range")
        return self._row(i)

    def __iter__(self):
        cols = self._lists(0, len(self)) if len(self) > 8 else None
        return (self._row(i, cols) for i in range(len(self)))

    def __eq__(self, other) -> bool:
        if isinstance(other, Iterations):
            return len(self) == len(other) and all(
                np.array_equal(getattr(self, c), getattr(other, c)) for c in _COLUMNS + ("lo", "hi")) \
                and self.source == other.source and self.peak_type == other.peak_type
        if isinstance(other, (tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Iterations({len(self)})"

    # -- columns ---------------------------------------------------------------------------
    @property
    def numbers(self) -> np.ndarray:
        return np.arange(1, len(self) + 1, dtype=np.int64)

    def with_peaks(self, peak_bytes, peak_index, peak_type: list[str]) -> Iterations:
        """The same iterations with each one's peak (bytes, entry, type)."""
        return Iterations(self.start, self.end, self.start_us, self.end_us, self.lo, self.hi, self.micro_batches,
                          self.source, peak_bytes, peak_index, peak_type)

    def phase_bounds(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(first, last entry) of phase `name` in each iteration, -1 where it has none."""
        j = PHASES.index(name)
        return self.lo[j], self.hi[j]

    def phases_present(self) -> set[str]:
        """The phases some iteration has."""
        return {name for j, name in enumerate(PHASES) if bool((self.hi[j] >= 0).any())}

    def __plain__(self) -> list[dict]:
        """`to_plain`: the rows as the dicts an Iteration gives, made from the columns."""
        return self.plain(0, len(self))

    def plain(self, a: int, b: int) -> list[dict]:
        """`to_plain` of rows a..b-1 (a part at a time: a million rows' dicts take a gigabyte).
        Each row's phases are filled a phase at a time, over the rows that have it (in PHASES
        order, as an Iteration's): not a test of every phase in every row (114,000 rows: 0.37 s
        -> 0.19 s)."""
        cols = self._lists(a, b)
        phases: list[dict] = [{} for _ in range(b - a)]
        for name, lo, hi, have in zip(PHASES, cols["lo"], cols["hi"], (self.hi[:, a:b] >= 0).tolist()):
            if not any(have):
                continue
            for k in compress(range(b - a), have):
                phases[k][name] = [lo[k], hi[k]]
        return [{"number": number, "start_index": start, "end_index": end,
                 "start_us": None if t0 == NO_TIME else t0, "end_us": None if t1 == NO_TIME else t1,
                 "phases": ph, "micro_batches": micro, "source": src, "peak_bytes": pb, "peak_index": pi,
                 "peak_type": pt}
                for number, start, end, t0, t1, micro, pb, pi, src, pt, ph in zip(
                    range(a + 1, b + 1), cols["start"], cols["end"], cols["start_us"], cols["end_us"],
                    cols["micro_batches"], cols["peak_bytes"], cols["peak_index"], self.source[a:b],
                    self.peak_type[a:b], phases)]

    # -- the analysis cache ----------------------------------------------------------------
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, names) to store: the int64 columns, `lo` and `hi`, and `source` and
        `peak_type` as uint8 codes into `names[...]` (sorted names, JSON-ready)."""
        arrays = {c: np.ascontiguousarray(getattr(self, c)) for c in _COLUMNS}
        arrays["lo"], arrays["hi"] = np.ascontiguousarray(self.lo), np.ascontiguousarray(self.hi)
        names: dict[str, Any] = {"n": len(self)}
        for col in ("source", "peak_type"):
            values = getattr(self, col)
            table = sorted(set(values))
            if len(table) > 255:
                raise ValueError(f"too many distinct {col} values")
            code = {v: k for k, v in enumerate(table)}
            arrays[col] = np.fromiter((code[v] for v in values), dtype=np.uint8, count=len(values))
            names[col] = table
        return arrays, names

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], names: Any, n_entries: int) -> Iterations:
        """`to_arrays()` read back, checked (ValueError on anything else: a damaged cache):
        every array there with its dtype and shape, codes inside their tables, bounds inside a
        trace of `n_entries` and in order."""
        if not isinstance(names, dict) or type(names.get("n")) is not int or names["n"] < 0:
            raise ValueError("iteration names")
        n = names["n"]
        want = {**{c: ((n,), np.int64) for c in _COLUMNS}, "lo": ((len(PHASES), n), np.int64),
                "hi": ((len(PHASES), n), np.int64), "source": ((n,), np.uint8), "peak_type": ((n,), np.uint8)}
        if set(arrays) != set(want):
            raise ValueError("iteration arrays")
        for name, (shape, dt) in want.items():
            if arrays[name].shape != shape or arrays[name].dtype != np.dtype(dt):
                raise ValueError(f"iteration array {name}")
        texts = {}
        for col in ("source", "peak_type"):
            table = names.get(col)
            if not isinstance(table, list) or not all(type(v) is str for v in table):
                raise ValueError(f"iteration {col}")
            codes = np.asarray(arrays[col])
            if n and int(codes.max()) >= len(table):
                raise ValueError(f"iteration {col}")
            texts[col] = [table[k] for k in codes.tolist()]
        its = cls(np.asarray(arrays["start"]), np.asarray(arrays["end"]), np.asarray(arrays["start_us"]),
                  np.asarray(arrays["end_us"]), np.asarray(arrays["lo"]), np.asarray(arrays["hi"]), np.asarray(arrays["micro_batches"]),
                  texts["source"], np.asarray(arrays["peak_bytes"]), np.asarray(arrays["peak_index"]),
                  texts["peak_type"])
        s, e = its.start, its.end
        if n and not (int(s.min()) >= 0 and bool((s <= e).all()) and int(e.max()) < n_entries
                      and bool((e[:-1] < s[1:]).all())):
            raise ValueError("iteration bounds")
        return its


def starts_ends(its: Sequence[Iteration]) -> tuple[np.ndarray, np.ndarray]:
    """(first entries, last entries) of any sequence of iterations, as int64 arrays."""
    if isinstance(its, Iterations):
        return its.start, its.end
    return (np.fromiter((it.start_index for it in its), np.int64, len(its)),
            np.fromiter((it.end_index for it in its), np.int64, len(its)))


__all__ = ["Iterations", "NO_TIME", "PHASES", "starts_ends"]
