"""`vramscope allocations`: one row per allocation (DESIGN.md §6), blocks live before the
trace began included (`index` -1). The columns and the rows are made here, once, for
every format that lists them (the CSV of the command line)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from .reporters import CsvReporter

if TYPE_CHECKING:       # the command line builds its parser from COLUMNS without loading the analysis
    from ..classifiers import Analysis

COLUMNS = ("device", "index", "addr", "size", "alloc_us", "free_us", "category", "rule")


class AllocationTable:
    """Every allocation row of `analysis` (one device's, or all devices' by number). (A plain
    class: the command line imports this module to list COLUMNS, on every start.)"""

    def __init__(self, analysis: Analysis, device: int | None = None):
        self.analysis = analysis
        self.device = device

    def columns(self) -> Iterator[list[list]]:
        """The rows, 65,536 at a time, as columns in COLUMNS order (from the numpy columns:
        no Python object per row before a batch is written)."""
        import numpy as np

        from ..classifiers.categories import CATEGORIES
        an = self.analysis
        cats_of = np.asarray(CATEGORIES, dtype=object)
        rules_of = np.asarray(an.rule_names, dtype=object)
        step = 65536
        for dev in sorted(an.devices):
            if self.device is not None and dev != self.device:
                continue
            da = an.devices[dev]
            a = da.allocs
            for s in range(0, len(a), step):
                e = min(len(a), s + step)
                yield [[dev] * (e - s), a.alloc_index[s:e].tolist(), a.addr[s:e].tolist(), a.size[s:e].tolist(),
                       a.alloc_us[s:e].tolist(), a.free_us[s:e].tolist(), cats_of[da.category[s:e]].tolist(),
                       rules_of[da.rule[s:e]].tolist()]


ALLOCATIONS_CSV = CsvReporter(COLUMNS, AllocationTable.columns)

__all__ = ["COLUMNS", "AllocationTable", "ALLOCATIONS_CSV"]
