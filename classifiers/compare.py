"""Two recordings of one training run, before and after a change: what moved the peak.

    cmp = compare(an_a, an_b, site_a, site_b, device=None)      # -> Comparison
    for dc in cmp.devices: dc.peak_delta, dc.by_category_delta, dc.sites, dc.iterations

Each side is summarised on its own (`CompareSide`: its peak exactly as `summary` reports
it, its iterations, where its timeline starts, and the bytes live at its peak grouped by
code site), then the two are set against each other (`DeviceComparison`). A viewer can
draw both totals on one axis from `CompareSide.origin_index` / `origin_us` (the first
iteration's start), the category bars at both peaks from `peak.by_category`, and the site
table from `sites`.

Code sites. The allocations live at a peak are grouped by the frame that names their stack
(a stack's user frame first; a backward allocation with only C++ frames is named by its
forward stack, torch 2.13), exactly as `present.stacks.Stacks.where_of` names a row. Which
string identifies a site across two files is the presentation layer's business
(`Stacks.site_key`: path tail and function, so two checkouts or two virtual environments
match); this module receives it as a callable per side and calls it once per distinct
stack live at the peak, never per allocation. Keys that still differ only in how much of
the path they kept (a profiler-shortened 'train.py' against '/home/me/proj/train.py' seen
as 'proj/train.py') are matched when the function is the same and the pairing is unique.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..parsers import SnapshotError
from .categories import CATEGORIES
from .results import Iteration, Peak

SiteOf = Callable[[int], tuple[str, str]]      # stack id -> (path tail, function)


class CompareError(SnapshotError):
    """The two files cannot be compared (no device in common, a side with no data): bad input."""

    kind = "mismatch"


@dataclass(frozen=True)
class SiteBytes:
    """Bytes live at one side's peak that one code site allocated."""
    file: str                       # the path tail of the naming frame; '' for C++ or no frames
    function: str                   # its function (for C++: the op, autograd node, ... as worded)
    bytes: int
    count: int                      # allocations
    lines: tuple[tuple[int, int], ...]  # (line of the naming frame, bytes), most bytes first; 0: unknown
    stacks: tuple[int, ...]         # the naming stacks (ids in this side's snapshot), most bytes first


@dataclass(frozen=True)
class CompareSide:
    """One file's device, as much of it as a comparison needs."""
    device: int
    entries: int                    # trace entries (0: a state-only snapshot)
    peak: Peak                      # the same as `summary` (DeviceAnalysis.peak)
    iterations: tuple[Iteration, ...]
    origin_index: int               # the entry both timelines are aligned at: the first iteration's
    origin_us: int | None           # start (entry 0 without iterations, -1 without entries), its time
    sites: tuple[SiteBytes, ...]    # live at the peak by code site, most bytes first; adds up to
                                    # sum(peak.by_category)
    state_only: bool = False        # a snapshot without a trace (its run's fact): its peak is the state it recorded


@dataclass(frozen=True)
class LineChange:
    """One line of a site at both peaks. Lines match only while the code above them is the
    same in both versions; a moved line shows as one line down and another up."""
    line: int                       # 0: unknown
    a_bytes: int
    b_bytes: int
    delta: int


@dataclass(frozen=True)
class SiteChange:
    """One code site at both peaks."""
    file: str                       # path tail (the shorter one when the two sides kept different tails)
    function: str
    a_bytes: int
    b_bytes: int
    delta: int                      # b_bytes - a_bytes
    a_count: int
    b_count: int
    lines: tuple[LineChange, ...]   # the site by line, largest change first
    a_stacks: tuple[int, ...]       # stack ids in A's snapshot
    b_stacks: tuple[int, ...]       # in B's


@dataclass(frozen=True)
class IterationPeaks:
    """Iteration `number`'s peak on each side (None: that side has fewer iterations)."""
    number: int
    a_bytes: int | None
    b_bytes: int | None
    delta: int | None
    a_type: str | None
    b_type: str | None


@dataclass(frozen=True)
class DeviceComparison:
    device: int
    a: CompareSide
    b: CompareSide
    peak_delta: int                 # b.peak.bytes - a.peak.bytes
    by_category_delta: dict[str, int]   # B - A at each side's own peak, every category live at
                                        # either peak (0 kept: unchanged), CATEGORIES order
    sites: tuple[SiteChange, ...]   # largest change first
    iterations: tuple[IterationPeaks, ...]


@dataclass(frozen=True)
class Comparison:
    devices: tuple[DeviceComparison, ...]
    only_a: tuple[int, ...]         # devices with data in A alone (not compared)
    only_b: tuple[int, ...]


# -- one side ---------------------------------------------------------------------------------
def naming_stacks(da, rows: np.ndarray) -> np.ndarray:
    """int64 per row: the stack that names it (Stacks.where_of): its own, or its forward
    stack (torch 2.13) when its own holds no user frame and the forward one does."""
    a = da.allocs
    stack = np.asarray(a.stack[rows], dtype=np.int64)
    fwd_col = da.trace_forward_stack
    if fwd_col is None or not len(fwd_col) or da.facts is None:
        return stack
    user_frame = da.facts.stacks.user_frame
    n = len(user_frame)

    def has_user(s: np.ndarray) -> np.ndarray:
        ok = (s >= 0) & (s < n)
        out = np.zeros(len(s), dtype=bool)
        out[ok] = user_frame[s[ok]] >= 0
        return out

    ai = np.asarray(a.alloc_index[rows], dtype=np.int64)
    fwd = np.full(len(rows), -1, dtype=np.int64)
    ok = (ai >= 0) & (ai < len(fwd_col))
    fwd[ok] = np.asarray(fwd_col)[ai[ok]]
    use_fwd = ~has_user(stack) & (fwd >= 0) & has_user(fwd)
    return np.where(use_fwd, fwd, stack)


def sites_at(da, index: int, site_of: SiteOf) -> tuple[SiteBytes, ...]:
    """Bytes live right after entry `index` grouped by code site, most bytes first: grouped
    by naming stack with numpy, then `site_of` once per distinct stack. Where torch's
    component tracking names the module each row was made in, a site is a code site in one
    module ('forward in layers.0': one line of a Linear runs in every layer)."""
    rows = np.flatnonzero(da.live_mask(index))
    if not len(rows):
        return ()
    naming = naming_stacks(da, rows)
    module = row_modules(da, rows)
    size = np.asarray(da.allocs.size[rows], dtype=np.int64)
    order = np.lexsort((module, naming))
    naming, module, size = naming[order], module[order], size[order]
    starts = np.flatnonzero(np.r_[True, (naming[1:] != naming[:-1]) | (module[1:] != module[:-1])])
    stack_bytes = np.add.reduceat(size, starts)            # int64: exact
    stack_count = np.diff(np.r_[starts, len(naming)])
    stack_ids = naming[starts]
    strings = da.snapshot.strings if da.snapshot is not None else []

    line_of = _line_getter(da)
    groups: dict[tuple[str, str], _Group] = {}
    for sid, mod, nbytes, count in zip(stack_ids.tolist(), module[starts].tolist(), stack_bytes.tolist(),
                                       stack_count.tolist()):
        file, function = site_of(int(sid))
        if mod >= 0:
            function = f"{function} in {strings[mod]}"
        g = groups.setdefault((str(file), str(function)), _Group())
        g.bytes += nbytes
        g.count += count
        line = line_of(sid)
        g.lines[line] = g.lines.get(line, 0) + nbytes
        g.stacks.append((nbytes, sid))
    out = [SiteBytes(file=k[0], function=k[1], bytes=g.bytes, count=g.count,
                     lines=tuple(sorted(g.lines.items(), key=lambda kv: (-kv[1], kv[0]))),
                     stacks=tuple(sid for _, sid in sorted(g.stacks, key=lambda bs: (-bs[0], bs[1]))))
           for k, g in groups.items()]
    out.sort(key=lambda s: (-s.bytes, s.file, s.function))
    return tuple(out)


def row_modules(da, rows: np.ndarray) -> np.ndarray:
    """int64 per row: the string id of the module it was made in (component tracking sets
    user_metadata to it; DeviceAnalysis.module_of), -1 unknown."""
    md = da.metadata() if getattr(da, "torch_component", None) is not None else None
    if md is None:
        return np.full(len(rows), -1, dtype=np.int64)
    return np.asarray(md.user[rows], dtype=np.int64)


@dataclass
class _Group:
    bytes: int = 0
    count: int = 0
    lines: dict[int, int] = field(default_factory=dict)
    stacks: list[tuple[int, int]] = field(default_factory=list)     # (bytes, stack id)


def _line_getter(da) -> Callable[[int], int]:
    """The line of the frame that names a stack (0: unknown)."""
    if da.facts is None:
        return lambda sid: 0
    st = da.facts.stacks
    best, line = st.best_frame, st.table.line

    def line_of(sid: int) -> int:
        if sid < 0 or sid >= len(best):
            return 0
        f = int(best[sid])
        return int(line[f]) if 0 <= f < len(line) else 0
    return line_of


def compare_side(da, site_of: SiteOf, time_us: np.ndarray | None = None) -> CompareSide:
    """What a comparison needs of one device of one file; `time_us` is its trace's time
    column (for the origin's time when there are no iterations)."""
    n = da.n_entries
    its = tuple(da.iterations)
    origin, origin_us = -1, None
    if its:
        origin, origin_us = its[0].start_index, its[0].start_us
    elif n:
        origin = 0
        if time_us is not None and len(time_us) and int(time_us[0]) >= 0:
            origin_us = int(time_us[0])
    return CompareSide(device=da.device, entries=n, peak=da.peak, iterations=its, origin_index=int(origin),
                       origin_us=origin_us, sites=sites_at(da, da.peak.index, site_of),
                       state_only=da.state_only)


# -- two sides --------------------------------------------------------------------------------
def _tail_parts(file: str) -> list[str]:
    return [p for p in file.split("/") if p]


def _tails_agree(x: str, y: str) -> bool:
    """One path tail ends with the other, component by component ('train.py' and
    'proj/train.py'; not 'rain.py')."""
    px, py = _tail_parts(x), _tail_parts(y)
    if not px or not py:
        return False
    k = min(len(px), len(py))
    return px[-k:] == py[-k:]


def _pair_keys(a_keys: list[tuple[str, str]], b_keys: list[tuple[str, str]]) -> dict:
    """A's key -> B's key: equal keys, then keys with the same function whose tails agree
    where that pairing is unique both ways."""
    pairs = {k: k for k in a_keys if k in set(b_keys)}
    rest_a = [k for k in a_keys if k not in pairs]
    taken = set(pairs.values())
    rest_b = [k for k in b_keys if k not in taken]

    def partners(k, pool):
        return [o for o in pool if o[1] == k[1] and _tails_agree(o[0], k[0])]
    for ka in rest_a:
        cand = partners(ka, rest_b)
        if len(cand) == 1 and len(partners(cand[0], rest_a)) == 1:
            pairs[ka] = cand[0]
    return pairs


def _shorter(x: str, y: str) -> str:
    return x if len(_tail_parts(x)) <= len(_tail_parts(y)) else y


def site_changes(a: tuple[SiteBytes, ...], b: tuple[SiteBytes, ...]) -> tuple[SiteChange, ...]:
    """Every site of either side with its bytes on both, the largest change first (then the
    larger site, then by name: the same order for the same two files)."""
    a_by = {(s.file, s.function): s for s in a}
    b_by = {(s.file, s.function): s for s in b}
    pairs = _pair_keys(list(a_by), list(b_by))
    out: list[SiteChange] = []
    for ka, sa in a_by.items():
        kb = pairs.get(ka)
        sb = b_by.get(kb) if kb is not None else None
        file = _shorter(sa.file, sb.file) if sb is not None else sa.file
        out.append(_change(file, sa.function, sa, sb))
    for kb, sb in b_by.items():
        if kb not in pairs.values():
            out.append(_change(sb.file, sb.function, None, sb))
    out.sort(key=lambda c: (-abs(c.delta), -max(c.a_bytes, c.b_bytes), c.file, c.function))
    return tuple(out)


def _change(file: str, function: str, sa: SiteBytes | None, sb: SiteBytes | None) -> SiteChange:
    ab = sa.bytes if sa else 0
    bb = sb.bytes if sb else 0
    la = dict(sa.lines) if sa else {}
    lb = dict(sb.lines) if sb else {}
    lines = sorted((LineChange(ln, la.get(ln, 0), lb.get(ln, 0), lb.get(ln, 0) - la.get(ln, 0))
                    for ln in set(la) | set(lb)), key=lambda c: (-abs(c.delta), -max(c.a_bytes, c.b_bytes), c.line))
    return SiteChange(file=file, function=function, a_bytes=ab, b_bytes=bb, delta=bb - ab,
                      a_count=sa.count if sa else 0, b_count=sb.count if sb else 0, lines=tuple(lines),
                      a_stacks=sa.stacks if sa else (), b_stacks=sb.stacks if sb else ())


def iteration_peaks(a: tuple[Iteration, ...], b: tuple[Iteration, ...]) -> tuple[IterationPeaks, ...]:
    out = []
    for k in range(max(len(a), len(b))):
        ia = a[k] if k < len(a) else None
        ib = b[k] if k < len(b) else None
        ab = ia.peak_bytes if ia else None
        bb = ib.peak_bytes if ib else None
        out.append(IterationPeaks(number=k + 1, a_bytes=ab, b_bytes=bb,
                                  delta=bb - ab if ab is not None and bb is not None else None,
                                  a_type=ia.peak_type if ia else None, b_type=ib.peak_type if ib else None))
    return tuple(out)


def compare_sides(a: CompareSide, b: CompareSide) -> DeviceComparison:
    cats = [c for c in CATEGORIES if c in a.peak.by_category or c in b.peak.by_category]
    by_cat = {c: b.peak.by_category.get(c, 0) - a.peak.by_category.get(c, 0) for c in cats}
    return DeviceComparison(device=a.device, a=a, b=b, peak_delta=b.peak.bytes - a.peak.bytes,
                            by_category_delta=by_cat, sites=site_changes(a.sites, b.sites),
                            iterations=iteration_peaks(a.iterations, b.iterations))


def paired_devices(devs_a, devs_b, device: int | None = None, a_name: str = "A",
                   b_name: str = "B") -> tuple[list[int], tuple[int, ...], tuple[int, ...]]:
    """(devices to compare, devices only in A, only in B). CompareError when there is nothing
    to compare: a side without data, no device in common, or `device` missing on a side."""
    sa, sb = sorted(devs_a), sorted(devs_b)
    for name, devs in ((a_name, sa), (b_name, sb)):
        if not devs:
            raise CompareError(f"{name}: no allocations recorded (an empty snapshot): nothing to compare")
    if device is not None:
        for name, devs in ((a_name, sa), (b_name, sb)):
            if device not in devs:
                raise CompareError(f"{name} has no data on device {device} (devices with data: "
                                   f"{', '.join(map(str, devs))})")
        return [device], (), ()
    common = [d for d in sa if d in sb]
    if not common:
        raise CompareError(f"no device in common: {a_name} has data on device {', '.join(map(str, sa))}, "
                           f"{b_name} on device {', '.join(map(str, sb))} (record both on the same device)")
    return common, tuple(d for d in sa if d not in sb), tuple(d for d in sb if d not in sa)


def compare(an_a, an_b, site_a: SiteOf, site_b: SiteOf, device: int | None = None, a_name: str = "A",
            b_name: str = "B") -> Comparison:
    """Compare two analyses device by device (the devices both have data on, or `device`)."""
    devs, only_a, only_b = paired_devices(an_a.devices, an_b.devices, device, a_name, b_name)
    out = tuple(compare_sides(_side(an_a, d, site_a), _side(an_b, d, site_b)) for d in devs)
    return Comparison(devices=out, only_a=only_a, only_b=only_b)


def _side(an, dev: int, site_of: SiteOf) -> CompareSide:
    cols = an.snapshot.trace(dev).columns
    return compare_side(an.devices[dev], site_of, np.asarray(cols["time_us"]) if "time_us" in cols else None)


__all__ = ["CompareError", "SiteBytes", "CompareSide", "LineChange", "SiteChange", "IterationPeaks", "DeviceComparison",
           "Comparison", "naming_stacks", "sites_at", "compare_side", "site_changes", "iteration_peaks",
           "compare_sides", "paired_devices", "compare", "SiteOf"]
