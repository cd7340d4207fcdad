"""A folder of per-rank snapshots, read together: `vramscope ranks DIR` and the viewer's
rank overview.

`read_ranks(folder)` finds the files (rank_files.py: every file under the folder, one per
rank where the names say the rank and step), reads each with its own analysis
(rank_read.py: inline, in worker processes or on a Dask cluster), gives each its rank
(from the metadata document `vramscope.record` writes, else the file name, else the
sorted order of the files, which is a guess and said so) and compares them: the peaks'
spread, the outliers, the first rank to run out of memory. Each rank's figures are its
own `summary` document's, never derived again.

torchft's replica groups (`replica_{i}/` folders) each number their ranks from 0: a rank
there is (replica group i, rank r within it), numbered in the job as i x G + r, G the
group's size (the metadata's world size where the files agree, else the most ranks any
group names), so that every rank has one number; `replica` and `replica_rank` keep the two.

Outliers are ranks whose peak is further from the median peak than both `OUTLIER_MADS`
median absolute deviations (a robust 3.5 sigma: Iglewicz and Hoaglin's modified z-score
above 3.5) and `OUTLIER_SHARE` of the median (so that ranks that agree to the byte do
not make a small difference an outlier); with fewer than three ranks there are none.
The first OOM is the earliest OOM by the traces' `time_us` (the hosts' wall clocks); when
several ranks ran out and one of them has no times, which was first is unknown and
`first_oom` is null.
"""
from __future__ import annotations

import os
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from ..common.units import fmt_bytes, fmt_duration_us
from ..parsers import Progress
from .rank_files import RankFile, Skipped, choose, find_files, preference, why_not
from .rank_read import RankLive, RankRead, RanksError, default_jobs, read_files
from .summary import DeviceJSON, LeakJSON, OomJSON

OUTLIER_MADS = 3.5 * 1.4826     # 3.5 sigma of a normal distribution, measured by the MAD
OUTLIER_SHARE = 0.05
OUTLIER_RULE = (f"a peak further from the median peak than both {OUTLIER_MADS:.1f} median absolute deviations "
                f"(modified z-score above 3.5) and {OUTLIER_SHARE:.0%} of the median")
RANK_SOURCES = ("metadata", "file name", "order")


@dataclass(frozen=True)
class Rank:
    """One rank: its file and the `summary` document of the device the file leads with."""
    rank: int
    rank_source: str                     # RANK_SOURCES: "order" is a guess
    file: str
    relative: str                        # under the folder
    step: int | None
    exit_dump: bool
    device: int
    devices: tuple[int, ...]             # every device with data in the file
    summary: DeviceJSON
    live: RankLive
    replica: int | None = None           # torchft's replica group (`replica_{i}/`), or None
    replica_rank: int | None = None      # the rank within that group (what its process calls its rank)

    @property
    def peak_bytes(self) -> int:
        return self.summary["peak"]["bytes"]

    @property
    def first_oom_time_us(self) -> int | None:
        times = [o["time_us"] for o in self.summary["ooms"] if o["time_us"] is not None]
        return min(times) if times else None


@dataclass(frozen=True)
class NotRead:
    file: str
    error: str


@dataclass(frozen=True)
class FirstOom:
    rank: int
    file: str
    time_us: int | None


@dataclass(frozen=True)
class Overview:
    ranks: int
    peak_max: int
    peak_median: int
    peak_min: int
    imbalance: float | None              # peak_max / peak_median
    outliers: tuple[int, ...]            # ranks, by rank
    first_oom: FirstOom | None
    oom_ranks: tuple[int, ...]           # every rank that ran out, earliest first where times say it
    world_size: int | None               # from the metadata, where the files agree
    missing: tuple[int, ...]             # ranks below world_size with no file read


@dataclass(frozen=True)
class RanksResult:
    folder: str
    ranks: tuple[Rank, ...]              # by rank
    not_snapshots: tuple[NotRead, ...]
    skipped: tuple[Skipped, ...]
    overview: Overview
    internal_errors: tuple[NotRead, ...] = ()   # files whose reading failed by our fault (a bug, a worker killed)

    def rank(self, number: int) -> Rank | None:
        return next((r for r in self.ranks if r.rank == number), None)

    def primary(self) -> Rank | None:
        """The rank to look at first: the first OOM, else the highest peak."""
        fo = self.overview.first_oom
        if fo is not None:
            return self.rank(fo.rank)
        oom = next((r for r in self.ranks if r.summary["ooms"]), None)
        return oom or max(self.ranks, key=lambda r: (r.peak_bytes, -r.rank), default=None)


# -- reading ---------------------------------------------------------------------------------
def read_ranks(folder: str, rules_path: str | None = None, use_cache: bool = True, jobs: int | None = None,
               dask_address: str | None = None, progress: Progress | None = None) -> RanksResult:
    """Every rank under `folder` (see the module docstring), read by `jobs` processes
    (None: rank_read.default_jobs) or on the Dask scheduler at `dask_address`. Raises
    RanksError when the folder is not one (or Dask cannot run), Cancelled or
    KeyboardInterrupt when stopped, WorkerDied when a worker process was killed."""
    if not os.path.isdir(folder):
        raise RanksError(f"{folder}: " + ("is a file, not a folder (for one snapshot: vramscope summary FILE)"
                                          if os.path.exists(folder) else "no such folder"))
    if dask_address is not None:             # a bad address fails before any work (rank_dask.py)
        from .rank_dask import usable
        dask_address = usable(dask_address)
    files, problems = find_files(folder)
    kept, skipped = choose(files)
    jobs = default_jobs(len(kept)) if jobs is None else jobs
    reads = read_files([f.path for f in kept], rules_path, use_cache, jobs, dask_address, progress,
                       dask_checked=dask_address is not None)
    return assemble(folder, kept, reads, skipped, [NotRead(p, e) for p, e in problems])


def assemble(folder: str, files: list[RankFile], reads: list[RankRead], skipped: list[Skipped],
             not_read: list[NotRead]) -> RanksResult:
    """The ranks from what each file gave (in `files`' order, one read per file)."""
    bad = list(not_read) + [NotRead(rd.path, rd.error) for rd in reads if rd.error is not None and not rd.internal]
    internal = tuple(NotRead(rd.path, rd.error) for rd in reads if rd.error is not None and rd.internal)
    good = [(f, rd) for f, rd in zip(files, reads) if rd.error is None and rd.summary is not None and rd.live]
    worlds = {rd.world_size for _, rd in good if rd.world_size is not None}
    world = worlds.pop() if len(worlds) == 1 else None
    # each file's number within its replica group (the metadata's, else its name's) and the
    # group's size, so that (group, rank) is one rank of the job
    named_in_group = [(f, rd, *((rd.meta_rank, "metadata") if rd.meta_rank is not None else (f.rank, "file name")))
                      for f, rd in good]
    replicas = sorted({f.replica for f, _ in good if f.replica is not None})
    per_group = Counter(f.replica for f, _ in good)
    size = max([world or 0, max((n + 1 for *_, n, _ in named_in_group if n is not None), default=0),
                *per_group.values()])

    def offset(replica: int | None) -> int:
        if not replicas:
            return 0
        return size * (replica if replica is not None else replicas[-1] + 1)

    named: dict[int, tuple[RankFile, RankRead, str]] = {}
    unnamed: list[tuple[RankFile, RankRead]] = []
    skipped = list(skipped)
    for f, rd, group_rank, source in named_in_group:
        if group_rank is None:
            unnamed.append((f, rd))
            continue
        number = offset(f.replica) + group_rank
        old = named.get(number)
        # a rank named twice (the metadata may disagree with a name): the preferred file stands for it
        if old is not None and preference(old[0]) >= preference(f):
            skipped.append(Skipped(f.path, number, why_not(f, old[0])))
            continue
        if old is not None:
            skipped.append(Skipped(old[0].path, number, why_not(old[0], f)))
        named[number] = (f, rd, source)
    for f, rd in unnamed:                # the first free number of its group, in path order
        number = offset(f.replica)
        while number in named:
            number += 1
        named[number] = (f, rd, "order")
    ranks = tuple(Rank(number, source, f.path, f.relative, f.step, f.exit_dump, rd.device or 0, rd.devices,
                       rd.summary, rd.live,                      # type: ignore[arg-type]
                       f.replica if replicas else None, number - offset(f.replica) if replicas else None)
                  for number, (f, rd, source) in sorted(named.items()))
    job_world = None if world is None else world * (len(replicas) if replicas else 1)
    return RanksResult(folder, ranks, tuple(bad), tuple(sorted(skipped, key=lambda s: s.path)),
                       overview(ranks, job_world), internal)


def outliers(peaks: dict[int, int]) -> tuple[int, ...]:
    """The ranks whose peak stands out (OUTLIER_RULE), by rank."""
    if len(peaks) < 3:
        return ()
    med = statistics.median(peaks.values())
    mad = statistics.median(abs(p - med) for p in peaks.values())
    limit = max(OUTLIER_MADS * mad, OUTLIER_SHARE * med)
    return tuple(sorted(r for r, p in peaks.items() if abs(p - med) > limit))


def overview(ranks: tuple[Rank, ...], world: int | None = None) -> Overview:
    peaks = {r.rank: r.peak_bytes for r in ranks}
    values = list(peaks.values())
    med = int(round(statistics.median(values))) if values else 0
    ooms = [r for r in ranks if r.summary["ooms"]]
    timed = sorted((t, r.rank) for r in ooms if (t := r.first_oom_time_us) is not None)
    first = None
    if ooms and (len(timed) == len(ooms) or len(ooms) == 1):
        r = next(x for x in ooms if x.rank == (timed[0][1] if timed else ooms[0].rank))
        first = FirstOom(r.rank, r.file, r.first_oom_time_us)
    order = tuple(k for _, k in timed) + tuple(r.rank for r in ooms if r.first_oom_time_us is None)
    missing = tuple(k for k in range(world) if k not in peaks) if world is not None and world <= 1 << 16 else ()
    return Overview(len(ranks), max(values, default=0), med, min(values, default=0),
                    round(max(values) / med, 4) if values and med > 0 else None,
                    outliers(peaks), first, order, world, missing)


# -- the document ------------------------------------------------------------------------------
class PeakBriefJSON(TypedDict):
    bytes: int
    type: str
    by_category: dict[str, int]


class RankJSON(TypedDict):
    rank: int
    rank_source: str
    replica: int | None
    replica_rank: int | None
    file: str
    device: int
    peak: PeakBriefJSON
    reserved_peak_bytes: int | None
    ooms: list[OomJSON]
    first_oom_time_us: int | None
    leaks: list[LeakJSON]


class OverviewJSON(TypedDict):
    ranks: int
    peak_max: int
    peak_median: int
    peak_min: int
    imbalance: float | None
    outliers: list[int]
    first_oom: dict[str, Any] | None


class RanksJSON(TypedDict):
    folder: str
    ranks: list[RankJSON]
    overview: OverviewJSON
    not_snapshots: list[dict[str, str]]
    skipped: list[dict[str, Any]]
    internal_errors: list[dict[str, str]]


def ranks_document(res: RanksResult) -> RanksJSON:
    """The JSON of `vramscope ranks --json` (DESIGN.md §6): each rank's peak, OOMs and leaks
    are its own `summary --json` document's."""
    ov = res.overview
    ranks: list[RankJSON] = []
    for r in res.ranks:
        s = r.summary
        ranks.append({"rank": r.rank, "rank_source": r.rank_source, "replica": r.replica,
                      "replica_rank": r.replica_rank, "file": r.file, "device": r.device,
                      "peak": {"bytes": s["peak"]["bytes"], "type": s["peak"]["type"],
                               "by_category": s["peak"]["by_category"]},
                      "reserved_peak_bytes": s["reserved_peak_bytes"], "ooms": s["ooms"],
                      "first_oom_time_us": r.first_oom_time_us, "leaks": s["leaks"]})
    fo = ov.first_oom
    return {"folder": res.folder, "ranks": ranks,
            "overview": {"ranks": ov.ranks, "peak_max": ov.peak_max, "peak_median": ov.peak_median,
                         "peak_min": ov.peak_min, "imbalance": ov.imbalance, "outliers": list(ov.outliers),
                         "first_oom": None if fo is None else {"rank": fo.rank, "file": fo.file,
                                                               "time_us": fo.time_us}},
            "not_snapshots": [{"file": n.file, "error": n.error} for n in res.not_snapshots],
            "skipped": [{"file": s.path, "rank": s.rank, "reason": s.reason} for s in res.skipped],
            "internal_errors": [{"file": n.file, "error": n.error} for n in res.internal_errors]}


# -- the text ----------------------------------------------------------------------------------
def short_type(peak_type: str) -> str:
    return peak_type.replace("_", " ")


def top_categories(by_category: dict[str, int], n: int = 2) -> str:
    top = sorted(by_category.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{c} {fmt_bytes(b)}" for c, b in top) or "-"


def versus_median(peak: int, median: int) -> str:
    """'+31.2% over the median' / '-40.0% under the median'."""
    if median <= 0:
        return "the median is 0"
    d = (peak - median) / median
    return f"{d:+.1%} {'over' if d >= 0 else 'under'} the median"


def rank_notes(res: RanksResult, r: Rank) -> list[str]:
    """What sets a rank apart, in a few words each (the text's last column, the viewer's list)."""
    ov = res.overview
    notes = []
    if ov.first_oom is not None and ov.first_oom.rank == r.rank:
        notes.append("first OOM")
    if r.rank in ov.outliers:
        d = (r.peak_bytes - ov.peak_median) / ov.peak_median if ov.peak_median > 0 else 0.0
        notes.append(f"outlier ({d:+.1%})")
    if r.replica is not None:
        notes.append(f"replica {r.replica} rank {r.replica_rank}")
    if r.rank_source == "order":
        notes.append("rank guessed")
    if r.exit_dump:
        notes.append("failure dump")
    if len(r.devices) > 1:
        notes.append(f"cuda:{r.device} of {len(r.devices)} devices")
    return notes


def oom_text(res: RanksResult) -> str:
    """The first OOM (and the ranks that ran out after it), in one line."""
    ov = res.overview
    if not ov.oom_ranks:
        return "no rank ran out of memory"
    if ov.first_oom is None:
        return (f"{len(ov.oom_ranks)} ranks ran out of memory ({', '.join(map(str, sorted(ov.oom_ranks)))}); "
                "which was first is unknown: some of their snapshots have no times")
    fo = ov.first_oom
    r = res.rank(fo.rank)
    assert r is not None
    first_oom = next(o for o in r.summary["ooms"] if fo.time_us is None or o["time_us"] == fo.time_us)
    text = f"first OOM: rank {fo.rank}, requesting {fmt_bytes(first_oom['requested'])}"
    start = run_start_us(res)
    if fo.time_us is not None and start is not None:
        text += f", {fmt_duration_us(fo.time_us - start)} after the earliest trace began"
    after = []
    for k in ov.oom_ranks:
        other = res.rank(k)
        if k == fo.rank or other is None:
            continue
        t = other.first_oom_time_us
        after.append(f"{k} (+{fmt_duration_us(t - fo.time_us)})" if t is not None and fo.time_us is not None
                     else f"{k} (no time)")
    if after:
        text += f"; then rank{'s' if len(after) > 1 else ''} " + ", ".join(after)
    return text


def run_start_us(res: RanksResult) -> int | None:
    """The earliest trace time of any rank, when they have times."""
    starts = [int(r.live.edges[0]) for r in res.ranks if r.live.axis == "us"]
    return min(starts) if starts else None


def ranks_text(res: RanksResult) -> str:
    """The command line's text: one row per rank, then the overview."""
    ov = res.overview
    groups = sorted({r.replica for r in res.ranks if r.replica is not None})
    out = [f"{res.folder}: {ov.ranks} rank{'s' if ov.ranks != 1 else ''}" + (
        f" of {ov.world_size}" if ov.world_size is not None else "") + (
        f" in {len(groups)} replica group{'s' if len(groups) != 1 else ''} ({', '.join(map(str, groups))})"
        if groups else "")]
    rows = [("rank", "peak", "peak type", "top at the peak", "reserved", "OOMs", "leaks", "")]
    for r in res.ranks:
        s = r.summary
        rows.append((str(r.rank), fmt_bytes(r.peak_bytes), short_type(s["peak"]["type"]),
                     top_categories(s["peak"]["by_category"]), fmt_bytes(s["reserved_peak_bytes"]),
                     str(len(s["ooms"])) if s["ooms"] else "-",
                     f"{len(s['leaks'])} ({fmt_bytes(sum(lk['bytes_per_iteration'] for lk in s['leaks']))}/it)"
                     if s["leaks"] else "-",
                     "; ".join(rank_notes(res, r))))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    right = {0, 1, 4}
    for row in rows:
        cells = [c.rjust(w) if k in right else c.ljust(w) for k, (c, w) in enumerate(zip(row, widths))]
        out.append("  " + "  ".join(cells).rstrip())
    if res.ranks:
        hi = max(res.ranks, key=lambda r: (r.peak_bytes, -r.rank))
        lo = min(res.ranks, key=lambda r: (r.peak_bytes, r.rank))
        out.append(f"peaks: max {fmt_bytes(ov.peak_max)} (rank {hi.rank}), median {fmt_bytes(ov.peak_median)}, "
                   f"min {fmt_bytes(ov.peak_min)} (rank {lo.rank})"
                   + (f"; imbalance {ov.imbalance:.2f} (max / median)" if ov.imbalance is not None else ""))
        if ov.outliers:
            words = [f"rank {k} ({versus_median(res.rank(k).peak_bytes, ov.peak_median)})"  # type: ignore[union-attr]
                     for k in ov.outliers]
            out.append(f"outliers: {', '.join(words)}")
        else:
            out.append("outliers: none" + ("" if ov.ranks >= 3 else " (it takes three ranks to tell)"))
        out.append(f"  (an outlier has {OUTLIER_RULE})")
        out.append(oom_text(res))
    guessed = [r.rank for r in res.ranks if r.rank_source == "order"]
    if guessed:
        out.append(f"ranks {', '.join(map(str, guessed))} are guesses: neither the file's metadata nor its name "
                   "says its rank, so the files were numbered in path order")
    if ov.missing:
        shown = ", ".join(map(str, ov.missing[:20])) + (", …" if len(ov.missing) > 20 else "")
        out.append(f"missing: {len(ov.missing)} of {ov.world_size} ranks have no snapshot here ({shown})")
    if res.skipped:
        out.append(f"skipped {len(res.skipped)} file{'s' if len(res.skipped) != 1 else ''}: each rank's dump at the "
                   "failure is read, else its latest step (`--json` lists them)")
    for n in res.not_snapshots:
        out.append(f"not read: {n.file}: {n.error}")
    if res.internal_errors:          # each on stderr (the command line's error lines)
        out.append(f"{len(res.internal_errors)} file{'s' if len(res.internal_errors) != 1 else ''} not read by an "
                   "internal error (on stderr; `--json`: internal_errors)")
    return "\n".join(out)


# -- the overview's picture ----------------------------------------------------------------
@dataclass(frozen=True)
class LiveGrid:
    """Ranks x time of live memory, for a heatmap: `values[i, j]` is the highest live bytes
    of `ranks[i]` in column j (NaN where that rank recorded nothing), the columns spanning
    `x0`..`x1` on `axis`: 'seconds' since the earliest trace began (every rank has times)
    or 'fraction' of each rank's own trace (some have none)."""
    axis: str
    x0: float
    x1: float
    ranks: tuple[int, ...]
    values: np.ndarray                 # float64[n ranks, columns]
    ooms: tuple[tuple[int, float], ...]  # (row, x) of every OOM


def live_grid(res: RanksResult, columns: int = 1024) -> LiveGrid:
    """The ranks' live memory on one axis, `columns` wide (the viewer draws it; each cell is
    the highest of the rank's envelope buckets it overlaps, so no peak is lost)."""
    rs = res.ranks
    timed = bool(rs) and all(r.live.axis == "us" for r in rs)
    if timed:
        t0 = min(int(r.live.edges[0]) for r in rs)
        t1 = max(int(r.live.edges[-1]) for r in rs)
        scale = [(float(t0), 1e6)] * len(rs)
        x0, x1 = 0.0, (t1 - t0) / 1e6
    else:
        scale = [(float(r.live.edges[0]), float(r.live.edges[-1] - r.live.edges[0]) or 1.0) for r in rs]
        x0, x1 = 0.0, 1.0
    cols = np.linspace(x0, x1, max(1, columns) + 1)
    values = np.full((len(rs), max(1, columns)), np.nan)
    marks: list[tuple[int, float]] = []
    for i, r in enumerate(rs):
        off, unit = scale[i]
        edges = (r.live.edges.astype(np.float64) - off) / unit
        values[i] = _resample(edges, r.live.high, cols)
        for o in r.summary["ooms"]:
            pos = o["time_us"] if r.live.axis == "us" else o["index"]
            if pos is not None:
                marks.append((i, (float(pos) - off) / unit))
    return LiveGrid("seconds" if timed else "fraction", x0, x1, tuple(r.rank for r in rs), values, tuple(marks))


def _resample(edges: np.ndarray, high: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The highest of `high` (buckets between `edges`) over each column between `cols`;
    NaN for columns outside the buckets."""
    b = len(high)
    lo = np.searchsorted(edges, cols[:-1], side="right") - 1          # the bucket holding the column's start
    hi = np.searchsorted(edges, cols[1:], side="left") - 1            # the last bucket starting before its end
    ok = (cols[1:] > edges[0]) & (cols[:-1] < edges[-1])
    lo = np.clip(lo, 0, b - 1)
    hi = np.clip(hi, lo, b - 1)
    idx = np.stack([np.where(ok, lo, 0), np.where(ok, hi + 1, 1)], axis=1).ravel()
    ext = np.append(high.astype(np.float64), -np.inf)
    out = np.maximum.reduceat(ext, idx)[::2]
    out[~ok] = np.nan
    return out


__all__ = ["Rank", "NotRead", "FirstOom", "Overview", "RanksResult", "RanksError", "read_ranks", "assemble",
           "overview", "outliers", "ranks_document", "ranks_text", "rank_notes", "oom_text", "versus_median",
           "short_type", "top_categories", "LiveGrid", "live_grid", "OUTLIER_RULE", "OUTLIER_MADS",
           "OUTLIER_SHARE", "RanksJSON"]
