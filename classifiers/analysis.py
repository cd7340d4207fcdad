"""The one query API behind the viewer and the command line.

`analyze(snapshot)` returns per-device results: every allocation with its
category and the rule that produced it, iterations, the typed peak, leaks and
OOMs. (First version: categories are all `unknown` until the rule engine lands.)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..parsers import Allocations, LiveModel, Progress, Snapshot, allocations, live_model
from ..parsers.tables import A_ALLOC, A_OOM

CATEGORIES = ("weights", "activations", "gradients", "optimizer", "autograd", "quantization",
              "inputs", "temporary", "unknown")
UNKNOWN = CATEGORIES.index("unknown")


@dataclass
class DeviceAnalysis:
    device: int
    live: LiveModel
    allocs: Allocations
    category: np.ndarray                 # uint8 per allocation row, index into CATEGORIES
    rule: np.ndarray                     # int16 per allocation row, index into Analysis.rule_names
    iterations: list = field(default_factory=list)
    peak: dict = field(default_factory=dict)
    leaks: list = field(default_factory=list)
    ooms: list = field(default_factory=list)


@dataclass
class Analysis:
    snapshot: Snapshot
    devices: dict
    rule_names: list


def _by_category(da: DeviceAnalysis, at_index: int) -> dict:
    """Live bytes per category just after trace entry `at_index` (-1: at the start)."""
    a = da.allocs
    live = (a.alloc_index <= at_index) & ((a.free_index < 0) | (a.free_index > at_index))
    sums = np.bincount(da.category[live], weights=a.size[live], minlength=len(CATEGORIES))
    return {c: int(s) for c, s in zip(CATEGORIES, sums) if s}


def analyze(snap: Snapshot, progress: Progress | None = None) -> Analysis:
    devices = {}
    for dev in snap.devices:
        live = live_model(snap, dev)
        allocs = allocations(snap, dev)
        cat = np.full(len(allocs), UNKNOWN, dtype=np.uint8)
        rule = np.zeros(len(allocs), dtype=np.int16)
        da = DeviceAnalysis(dev, live, allocs, cat, rule)
        t = snap.trace(dev)
        tus = t.columns["time_us"]
        da.peak = {
            "bytes": live.peak_bytes, "index": live.peak_index,
            "time_us": int(tus[live.peak_index]) if live.peak_index >= 0 and tus[live.peak_index] >= 0 else None,
            "type": "other", "by_category": _by_category(da, live.peak_index),
        }
        for i in np.flatnonzero(t.columns["action"] == A_OOM):
            extra = t.extras.get(int(i), {})
            da.ooms.append({"index": int(i), "requested": int(t.columns["size"][i]),
                            "device_free": extra.get("device_free"),
                            "by_category": _by_category(da, int(i))})
        devices[dev] = da
    return Analysis(snap, devices, ["none"])


def summary_dict(an: Analysis, device: int | None = None) -> dict:
    snap = an.snapshot
    out = []
    for dev, da in an.devices.items():
        if device is not None and dev != device:
            continue
        t = snap.trace(dev)
        out.append({
            "device": dev,
            "entries": len(t),
            "allocations": int(np.count_nonzero(t.columns["action"] == A_ALLOC)),
            "peak": da.peak,
            "start_live_bytes": da.live.start_bytes,
            "end_live_bytes": da.live.end_bytes,
            "reserved_peak_bytes": da.live.reserved_peak,
            "iterations": da.iterations,
            "leaks": da.leaks,
            "ooms": da.ooms,
        })
    return {"file": snap.path, "devices": out}
