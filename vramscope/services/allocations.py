"""The allocation rows: one definition for every surface that lists allocations.

`vramscope allocations --csv` writes them (through the CSV reporter, services/reporters.py)
and `vramscope.open(...).allocations()` returns them as a numpy structured array, both from
`allocation_columns`: one row per allocation (blocks live before the trace began included,
`index` -1), devices in ascending order, `category`, `rule` and `evidence` as names
(DESIGN.md §6). A column added here appears in both. `--extra` adds four text columns
(`EXTRA_COLUMNS`) after the contract's nine.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from .reporters import CsvReporter

if TYPE_CHECKING:       # the command line builds its parser from COLUMNS without loading the analysis
    import numpy as np

    from ..classifiers.analysis import Analysis, DeviceAnalysis

COLUMNS = ("device", "index", "addr", "size", "alloc_us", "free_us", "category", "rule", "evidence")
NAMES = ("category", "rule", "evidence")       # the columns that hold names (the others: integers)
EXTRA_COLUMNS = ("rules_category", "torch_tag", "metadata", "notes")
STEP = 65536


def allocation_devices(an: Analysis, device: int | None = None) -> list[int]:
    """The devices whose rows are listed, in the order they are listed."""
    return [d for d in sorted(an.devices) if device is None or d == device]


def allocation_columns(an: Analysis, device: int, start: int = 0, stop: int | None = None) -> dict[str, np.ndarray]:
    """Rows `start:stop` of `device`, column by column (COLUMNS order); names as object arrays."""
    import numpy as np

    from ..classifiers.categories import CATEGORIES
    from ..classifiers.evidence import EVIDENCE
    da = an.devices[device]
    a = da.allocs
    sl = slice(start, stop)
    index = a.alloc_index[sl]
    return {
        "device": np.full(len(index), device, dtype=np.int32), "index": index, "addr": a.addr[sl],
        "size": a.size[sl], "alloc_us": a.alloc_us[sl], "free_us": a.free_us[sl],
        "category": np.asarray(CATEGORIES, dtype=object)[da.category[sl]],
        "rule": np.asarray(an.rule_names, dtype=object)[da.rule[sl]],
        "evidence": np.asarray(EVIDENCE, dtype=object)[da.evidence[sl]],
    }


def extra_columns(da: DeviceAnalysis) -> tuple[np.ndarray, ...]:
    """The EXTRA_COLUMNS of every row of `da` (object arrays of text): our rules' category
    where torch's own tag decided another, torch's tag, the user_metadata, the notes (annotate,
    joined by ' | ')."""
    import numpy as np

    from ..classifiers.categories import CATEGORIES
    from .export import allocation_text_columns
    tags, meta, notes = allocation_text_columns(da, field=str)
    ours = np.full(len(da.allocs), "", dtype=object)
    if da.rules_category is not None:
        differs = da.rules_category != da.category
        ours[differs] = np.asarray(CATEGORIES, dtype=object)[da.rules_category[differs]]
    return ours, tags, meta, notes


def allocation_table(an: Analysis, device: int | None = None) -> np.ndarray:
    """Every row of every device (or of `device`) as one numpy structured array with the
    CSV's columns: integers as int64 (device int32), names as Python strings (dtype object,
    one shared string per name)."""
    import numpy as np
    parts = [allocation_columns(an, d) for d in allocation_devices(an, device)]
    dtype = [(name, np.int32 if name == "device" else object if name in NAMES else np.int64) for name in COLUMNS]
    out = np.empty(sum(len(p["index"]) for p in parts), dtype=dtype)
    at = 0
    for p in parts:
        n = len(p["index"])
        for name in COLUMNS:
            out[name][at:at + n] = p[name]
        at += n
    return out


class AllocationTable:
    """The rows `vramscope allocations` writes: every device's (by number) or `device`'s,
    with the EXTRA_COLUMNS when `extra`."""

    def __init__(self, analysis: Analysis, device: int | None = None, extra: bool = False):
        self.analysis = analysis
        self.device = device
        self.extra = extra

    def columns(self) -> Iterator[list[list]]:
        """The rows, STEP at a time, as columns (a list per header field, in its order)."""
        an = self.analysis
        for dev in allocation_devices(an, self.device):
            more = extra_columns(an.devices[dev]) if self.extra else ()
            for s in range(0, len(an.devices[dev].allocs), STEP):
                cols = allocation_columns(an, dev, s, s + STEP)
                yield [cols[c].tolist() for c in COLUMNS] + [m[s:s + STEP].tolist() for m in more]


ALLOCATIONS_CSV = CsvReporter(COLUMNS, AllocationTable.columns)
ALLOCATIONS_CSV_EXTRA = CsvReporter(COLUMNS + EXTRA_COLUMNS, AllocationTable.columns)

__all__ = ["COLUMNS", "EXTRA_COLUMNS", "allocation_columns", "allocation_devices", "allocation_table",
           "extra_columns", "AllocationTable", "ALLOCATIONS_CSV", "ALLOCATIONS_CSV_EXTRA"]
