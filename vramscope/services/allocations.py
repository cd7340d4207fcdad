"""The allocation rows: one definition for every surface that lists allocations.

`vramscope allocations --csv` writes them and `vramscope.open(...).allocations()` returns
them as a numpy structured array, both from `allocation_columns`: one row per allocation
(blocks live before the trace began included, `index` -1), devices in ascending order,
`category`, `rule` and `evidence` as names (DESIGN.md §6). A column added here appears in both.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from ..classifiers.analysis import Analysis

COLUMNS = ("device", "index", "addr", "size", "alloc_us", "free_us", "category", "rule", "evidence")
NAMES = ("category", "rule", "evidence")       # the columns that hold names (the others: integers)
# (numpy and the classifiers are imported when rows are made: the command line starts without them)


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


__all__ = ["COLUMNS", "allocation_columns", "allocation_devices", "allocation_table"]
