"""Opening, analyzing and modelling a snapshot for the viewer (any thread, no Qt here).

The window's worker (viewer/worker.py) runs these; each reports through the GUI-neutral
`parsers.Progress` and raises `Cancelled` when asked to stop.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...classifiers import Analysis, analyze
from ...parsers import Progress, Snapshot, open_snapshot
from ...present.stacks import Stacks
from ...services.compare import compare_analyses, compare_devices
from .compare import CompareResult
from .device import DeviceData, DevicePrep


@dataclass
class LoadResult:
    path: str
    snapshot: Snapshot
    analysis: Analysis
    device: int | None
    data: DeviceData | None
    stacks: Stacks


def pick_device(analysis: Analysis, wanted: int | None) -> int | None:
    """The device asked for, else the one to look at first (an OOM, else the highest peak)."""
    if wanted is not None and wanted in analysis.devices:
        return wanted
    return analysis.primary_device()


def load(path: str, device: int | None = None, use_cache: bool = True,
         progress: Progress | None = None) -> LoadResult:
    """Open, analyze and model one snapshot (any thread). Raises SnapshotError, Cancelled."""
    progress = progress or Progress()
    snap = open_snapshot(path, progress=progress, use_cache=use_cache)
    progress.check()
    progress.start("analyzing", 1.0)
    # the device's times and allocator history made as soon as its rows are classified, while
    # the analysis goes on: for the device asked for, else the only one (with several, the one
    # shown is known once all are analyzed: its model is all made after)
    preps: dict[int, DevicePrep] = {}

    def beside(da) -> None:
        if da.device == device or (device is None and len(snap.devices) == 1):
            preps[da.device] = DevicePrep.beside_analysis(snap, da)
    an = analyze(snap, progress=progress, beside=beside)
    progress.check()
    dev = pick_device(an, device)
    stacks = Stacks(an)
    data = DeviceData(snap, an, dev, progress, stacks, preps.get(dev)) if dev is not None else None
    return LoadResult(path, snap, an, dev, data, stacks)


def switch_device(result: LoadResult, device: int, progress: Progress | None = None) -> LoadResult:
    data = DeviceData(result.snapshot, result.analysis, device, progress, result.stacks)
    return LoadResult(result.path, result.snapshot, result.analysis, device, data, result.stacks)


def compare_results(a: LoadResult, b: LoadResult, progress: Progress | None = None,
                    across_devices: bool = False) -> CompareResult:
    """A and B compared as `vramscope compare A B` compares them (any thread), or, with
    `across_devices`, the device each shows (two ranks, each on its own GPU). Raises
    CompareError (a SnapshotError: no device in common, a side with no data)."""
    if progress is not None:
        progress.start("comparing", 1.0)
    if across_devices and a.device is not None and b.device is not None:
        cmp = compare_devices(a.analysis, a.device, b.analysis, b.device)
    else:
        cmp = compare_analyses(a.analysis, b.analysis)
    if progress is not None:
        progress.check()
    return CompareResult(a, b, cmp)


def load_compare(a: LoadResult, path_b: str, use_cache: bool = True,
                 progress: Progress | None = None, across_devices: bool = False) -> CompareResult:
    """Open, analyze and model B (on the device A shows, where B has it), then compare."""
    progress = progress or Progress()
    b = load(path_b, a.device, use_cache, progress)
    progress.check()
    return compare_results(a, b, progress, across_devices)


def swap_compare(cr: CompareResult, device: int | None, progress: Progress | None = None) -> CompareResult:
    """B becomes A (the file the timeline shows, on `device` where it has it) and A becomes B."""
    b = cr.b
    if device is not None and device in b.analysis.devices and (b.data is None or b.data.device != device):
        b = switch_device(b, device, progress)
    return compare_results(b, cr.a, progress, any(dc.a.device != dc.b.device for dc in cr.comparison.devices))
