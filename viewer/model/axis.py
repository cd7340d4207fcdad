"""The x axis of every timeline the viewer draws, from the one rule (no Qt here).

`classifiers/timeaxis.py` decides seconds or entries for one device (`x_axis`); the main
timeline (model/device.py), Compare (model/compare.py), the report's PNGs (report_png.py,
compare_png.py) and the rank overview (services/rank_read.py) all start from it, so a run
never shows in entries in one view and squeezed into seconds in another (issue 33, item 9:
the report's PNG and Compare decided in seconds with a rule of their own).

Seconds are read as the timeline draws them: time stamps out of order (several streams)
as their running maximum.
"""
from __future__ import annotations

import numpy as np

from ...classifiers.timeaxis import XAxis, x_axis


def axis_of(da) -> XAxis:
    """The x axis one device of an analysis starts with (a DeviceAnalysis)."""
    return x_axis(da)


def trace_times(da) -> np.ndarray | None:
    """The device's time stamps, monotonic (running maximum), or None without usable ones."""
    cols = da.snapshot.trace(da.device).columns if da.snapshot is not None else {}
    tus = cols.get("time_us")
    if tus is None or not len(tus):
        return None
    tus = np.asarray(tus, dtype=np.int64)
    if int(tus.min()) < 0:
        return None
    return tus if bool(np.all(tus[1:] >= tus[:-1])) else np.maximum.accumulate(tus)


def x_values(da) -> tuple[np.ndarray, XAxis]:
    """Every entry's x on the device's axis: seconds since the first entry, or the entry
    index; and the axis."""
    ax = axis_of(da)
    n = int(da.live.n_events)
    tus = trace_times(da) if ax.seconds else None
    if tus is not None and len(tus) == n:
        return (tus - tus[0]).astype(np.float64) / 1e6, ax
    return np.arange(n, dtype=np.float64), ax


__all__ = ["axis_of", "trace_times", "x_values"]
