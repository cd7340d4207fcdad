"""vramscope from Python: `vramscope.open(path)` returns the analysis every surface reads.

    s = vramscope.open("run.pickle")
    s.devices[0].peak.bytes             # the device to look at first (an OOM, else the highest peak)
    s.devices[0].peak.by_category       # {"activations": ..., "weights": ...} at the peak
    s.summary()                         # the `vramscope summary --json` document (a dict)
    s.allocations().to_pandas()         # the rows of `allocations --csv` (numpy; pandas optional)
    s.whatif(levers=["checkpointing"], gpu="24GiB").scaled.bytes
    s.compare(vramscope.open("after.pickle")).devices[0].peak_delta

Nothing here computes a fact of its own: `devices` are the analysis' typed per-device
summaries (classifiers/results.py `DeviceSummary`) in the order of `summary --json`'s
`devices`, `summary()` is services/summary.py's document, `allocations()` the rows of
services/allocations.py, `whatif()` classifiers.whatif.what_if and `compare()` the typed
classifiers.compare.Comparison. Bad input raises the command line's one-line errors:
`SnapshotError` (not a snapshot, unsafe, truncated, corrupt, a missing file; its message
names the path), `ValueError` for a device the file has no data on or a bad what-if
argument, `RulesError` (a ValueError) for a rules file that cannot be used.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .classifiers.categories import CATEGORIES
from .classifiers.evidence import EVIDENCE
from .parsers import SnapshotError

if TYPE_CHECKING:
    from .classifiers.analysis import Analysis
    from .classifiers.compare import Comparison
    from .classifiers.results import DeviceSummary
    from .classifiers.whatif import WhatIf
    from .parsers import RunMetadata, Snapshot
    from .services.summary import SummaryJSON


class AllocationTable(np.ndarray):
    """The rows of `vramscope allocations --csv` as a numpy structured array (columns
    `device, index, addr, size, alloc_us, free_us, category, rule, evidence`; services/allocations.py).
    A column (`table["size"]`) is a plain numpy array, its reductions plain numbers; rows and
    slices stay a table."""

    def __getitem__(self, key):
        out = super().__getitem__(key)
        if isinstance(out, np.ndarray) and out.dtype.names is None:
            return out.view(np.ndarray)          # a column: not a table (it has no columns)
        return out

    def to_pandas(self):
        """The rows as a pandas DataFrame, `category`, `rule` and `evidence` as pandas categoricals."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install 'vramscope[pandas]'") from None
        df = pd.DataFrame({name: np.asarray(self[name]) for name in self.dtype.names})
        df["category"] = df["category"].astype(pd.CategoricalDtype(list(CATEGORIES)))
        df["rule"] = df["rule"].astype("category")
        df["evidence"] = df["evidence"].astype(pd.CategoricalDtype(list(EVIDENCE)))
        return df


class SnapshotAnalysis:
    """One snapshot, analysed (see the module docstring). `analysis` is the full query API
    (classifiers.analysis.Analysis) for what the shortcuts here do not cover."""

    def __init__(self, analysis: Analysis, device: int | None = None, rules: str | None = None):
        self.analysis = analysis
        self.device = device
        self.rules = rules                   # the extra rules file it was classified with
        order = analysis.device_order()
        self.devices: list[DeviceSummary] = [analysis.devices[d].summary() for d in order
                                             if device is None or d == device]

    @property
    def path(self) -> str:
        return self.analysis.snapshot.path

    @property
    def snapshot(self) -> Snapshot:
        return self.analysis.snapshot

    @property
    def metadata(self) -> RunMetadata | None:
        """What `vramscope.record` wrote about the run (versions, GPU, rank, parameter
        counts, optimizer, step), every field checked; None for other snapshots."""
        return self.analysis.snapshot.metadata

    def summary(self) -> SummaryJSON:
        """The `vramscope summary FILE --json [--device N]` document, as plain data (lists and
        dicts: any JSON writer takes it)."""
        from .services.summary import plain_document, summary_document
        return plain_document(summary_document(self.analysis, self.device))

    def allocations(self) -> AllocationTable:
        """One row per allocation, as `vramscope allocations FILE --csv [--device N]` writes them."""
        from .services.allocations import allocation_table
        return allocation_table(self.analysis, self.device).view(AllocationTable)

    def whatif(self, scales: dict[str, float] | None = None, levers=(), gpu: Any = None,
               device: int | None = None) -> WhatIf:
        """The peak over the whole run with categories scaled and levers pulled, the budget
        and whether it fits `gpu` (`vramscope whatif`); `device` defaults to the first of
        `devices`. Raises ValueError for an unknown category, lever or device."""
        from .classifiers.whatif import what_if
        return what_if(self.analysis, self._device(device), scales=scales, levers=levers, gpu=gpu)

    def compare(self, other: SnapshotAnalysis | str | os.PathLike, device: int | None = None) -> Comparison:
        """This file (A) against `other` (B, an opened snapshot or a path), as `vramscope
        compare A B`: peaks, the change by category and by code site (a path is opened with
        this file's rules). Raises SnapshotError (CompareError) when the two have no device
        in common."""
        from .services.compare import compare_analyses
        if not isinstance(other, SnapshotAnalysis):
            other = open(other, rules=self.rules)
        return compare_analyses(self.analysis, other.analysis, device if device is not None else self.device)

    def _device(self, device: int | None) -> int:
        if device is not None:
            return device
        if not self.devices:
            raise ValueError(f"{self.path}: no device with data (an empty snapshot)")
        return self.devices[0].device

    def __repr__(self) -> str:
        from .common.units import fmt_bytes
        from .present.words import peak_words
        parts = [f"cuda:{d.device} peak {fmt_bytes(d.peak.bytes)} "
                 f"{peak_words(d.peak.type, self.analysis.devices[d.device].state_only)}"
                 + (f", {len(d.ooms)} OOM" if d.ooms else "") + (f", {len(d.leaks)} leak" if d.leaks else "")
                 for d in self.devices]
        return f"<vramscope {os.path.basename(self.path)!r}: {'; '.join(parts) or 'no device with data'}>"


def open(path: str | os.PathLike, device: int | None = None, rules: str | os.PathLike | None = None,
         use_cache: bool = True) -> SnapshotAnalysis:
    """Read and analyse a snapshot (the cache of parsed columns and analyses is used as the
    command line uses it; `use_cache=False` as `--no-cache`). `device`: only that device,
    as `--device N`; `rules`: extra classification rules, as `--rules FILE`."""
    from .classifiers import analyze
    from .classifiers.rules import RulesError
    from .parsers import open_snapshot
    path = os.fspath(path)
    rules_path = None if rules is None else os.fspath(rules)
    if rules_path is not None and not os.path.isfile(rules_path):
        raise RulesError(f"rules file {rules_path}: no such file")
    try:
        an = analyze(open_snapshot(path, use_cache=use_cache), rules_path=rules_path, use_cache=use_cache)
    except SnapshotError as e:
        raise _with_path(e) from None
    if device is not None and device not in an.devices:
        listed = ", ".join(str(d) for d in sorted(an.devices)) or "none"
        raise ValueError(f"no device {device} in {path} (devices with data: {listed})")
    return SnapshotAnalysis(an, device, rules_path)


def _with_path(e: SnapshotError) -> SnapshotError:
    """The error as the command line prints it (`PATH: what is wrong`): its message names
    the file, so `str(e)` says which one."""
    line = e.one_line()
    e.args, e.path = (line,), None
    return e


__all__ = ["open", "SnapshotAnalysis", "AllocationTable"]
