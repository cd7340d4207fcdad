"""Reading the ranks: one analysis per file, in this process, in worker processes or on a
Dask cluster, with the same result whichever runs it.

`read_rank(path)` is the whole job for one file: open it (through its column cache), take
its `summary` document (cached beside the columns: services/summary.py) and the device
that document leads with (an OOM, else the highest peak), the rank and world size from the
metadata document `vramscope.record` writes (`vramscope_metadata.distributed.rank` and
`.world_size`, read and checked by parsers/metadata.py as `vramscope.open(...).metadata`
reads them) and a compact envelope of
live memory over time (the highest live bytes in each of `ENVELOPE_BUCKETS` stretches of
the run) for the overview's picture; all of it is kept between runs, a small record per
file (rank_cache.py). It returns a small picklable `RankRead`, so it can run anywhere: `read_files` maps it over the files inline
(`jobs=1`), in `jobs` processes (a `concurrent.futures.ProcessPoolExecutor`) or on an existing
Dask cluster (`dask_address`); progress and cancellation go through one `Progress`.
"""
from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import threading
import zlib
from collections import deque, namedtuple
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..classifiers.timeaxis import choose_x_axis
from ..common.interrupts import came_from_interrupt
from ..parsers import Cancelled, Progress, RunMetadata, SnapshotError, live_model, open_snapshot
from ..parsers.cache import cache_root
from ..present.words import BUG_REPORT, internal_error_text
from . import rank_cache
from .summary import DeviceJSON, IterationRows, cached_summary_document

# what the x-axis rule reads of an iteration (the summary document's, a dict)
_Iteration = namedtuple("_Iteration", "number start_index end_index")

ENVELOPE_BUCKETS = 1024
_AXES = ("us", "entries")


class RanksError(Exception):
    """A request that cannot run (no such folder, Dask missing or unreachable): a usage error."""


class WorkerDied(Exception):
    """A worker process ended without an answer (killed, or out of memory)."""


@dataclass(frozen=True)
class RankLive:
    """Live memory over a rank's run, coarsely: `high[j]` is the highest live bytes between
    `edges[j]` and `edges[j + 1]` on `axis` ('us': time_us since the epoch, comparable across
    ranks; 'entries': trace entry index, when the trace has no times)."""
    axis: str
    edges: np.ndarray          # int64[B + 1]
    high: np.ndarray           # int64[B]


@dataclass(frozen=True)
class RankRead:
    """What one file gave: its summary (of the device it leads with) or why it could not."""
    path: str
    error: str | None = None                   # one line: not a snapshot, truncated, records nothing
    meta_rank: int | None = None               # from the metadata document, when valid
    world_size: int | None = None
    device: int | None = None
    devices: tuple[int, ...] = ()              # every device with data in the file
    summary: DeviceJSON | None = None          # `summary --json`'s document for `device`
    live: RankLive | None = None
    internal: bool = False                     # `error` is an internal error (a bug, a worker that died), not the file's


# -- one file --------------------------------------------------------------------------------
def read_rank(path: str, rules_path: str | None = None, use_cache: bool = True,
              progress: Progress | None = None) -> RankRead:
    """Read one file (any process). Bad input is returned as `error`, never raised; so is an
    internal error (a bug of ours reading this file: `internal`, its one line asking for a
    bug report), so that the other ranks still count (VRAMSCOPE_DEBUG=1 raises it instead).
    With the cache, a file read before with the same code is not opened again (rank_cache.py)."""
    try:
        return _read_rank(path, rules_path, use_cache, progress)
    except Cancelled:
        raise
    except Exception as e:  # noqa: BLE001 - one rank's bug is that rank's error
        if came_from_interrupt(e):           # a Ctrl-C whose unwinding failed in turn: not a bug
            raise KeyboardInterrupt from e
        if os.environ.get("VRAMSCOPE_DEBUG"):
            raise
        return RankRead(path, error=internal_error_text(e), internal=True)


def _read_rank(path: str, rules_path: str | None, use_cache: bool, progress: Progress | None) -> RankRead:
    key = _code_key(rules_path) if use_cache and cache_root() else None
    if key is not None:
        known = from_record(path, rank_cache.lookup(path, key))
        if known is not None:
            return known
        checked_ns = rank_cache.now_ns()
        try:
            before = os.stat(path)
        except OSError:
            key = None
    try:
        snap = open_snapshot(path, progress=progress, use_cache=use_cache)
        doc = cached_summary_document(snap, rules_path)
    except SnapshotError as e:
        return RankRead(path, error=_without_path(e))
    rank, world = metadata_rank(snap.metadata)
    if not doc["devices"]:
        return RankRead(path, error="records no memory on any device (no trace entries, no allocator segments)",
                        meta_rank=rank, world_size=world)
    dev_doc = doc["devices"][0]                # the device to look at first leads the document
    dev = dev_doc["device"]
    read = RankRead(path, None, rank, world, dev, tuple(sorted(d["device"] for d in doc["devices"])), dev_doc,
                    live_envelope(snap, dev, iterations=dev_doc.get("iterations") or ()))
    if key is not None:
        rank_cache.store(path, key, to_record(read), before, checked_ns)
    return read


def to_record(read: RankRead) -> dict[str, Any]:
    """What the rank cache keeps of a read (the path is where it is found again)."""
    live = read.live
    assert live is not None
    return {"meta_rank": read.meta_rank, "world_size": read.world_size, "device": read.device,
            "devices": list(read.devices), "summary": read.summary,
            "live": {"axis": live.axis, "edges": live.edges.tolist(), "high": live.high.tolist()}}


def from_record(path: str, rec: dict | None) -> RankRead | None:
    """A read from a cache record, or None unless every field is what `to_record` writes
    (and the summary holds what `ranks` reads of it)."""
    if rec is None:
        return None
    live, summary, devices = rec.get("live"), rec.get("summary"), rec.get("devices")
    if not (isinstance(live, dict) and live.get("axis") in _AXES and isinstance(summary, dict)
            and isinstance(devices, list) and all(type(d) is int for d in devices)
            and all(rank_cache.int_or_none(rec.get(k)) for k in ("meta_rank", "world_size"))
            and type(rec.get("device")) is int and _summary_ok(summary)):
        return None
    edges, high = rank_cache.int_array(live.get("edges")), rank_cache.int_array(live.get("high"))
    if edges is None or high is None or len(high) < 1 or len(edges) != len(high) + 1:
        return None
    return RankRead(path, None, rec["meta_rank"], rec["world_size"], rec["device"], tuple(devices),
                    summary, RankLive(live["axis"], edges, high))       # type: ignore[arg-type]


def _summary_ok(s: dict) -> bool:
    peak, ooms, leaks = s.get("peak"), s.get("ooms"), s.get("leaks")
    return (isinstance(peak, dict) and type(peak.get("bytes")) is int and isinstance(peak.get("type"), str)
            and isinstance(peak.get("type_words"), str) and isinstance(peak.get("by_category"), dict)
            and rank_cache.int_or_none(s.get("reserved_peak_bytes")) and type(s.get("device")) is int
            and isinstance(ooms, list) and all(isinstance(o, dict) and rank_cache.int_or_none(o.get("time_us"))
                                               and type(o.get("index")) is int and type(o.get("requested")) is int
                                               and isinstance(o.get("suggestion"), str) for o in ooms)
            and isinstance(leaks, list) and all(isinstance(lk, dict) and type(lk.get("bytes_per_iteration")) is int
                                                and isinstance(lk.get("where"), str) for lk in leaks))


def _without_path(e: SnapshotError) -> str:
    msg = e.one_line()
    prefix = f"{e.path}: " if e.path else ""
    return msg[len(prefix):] if prefix and msg.startswith(prefix) else msg


def metadata_rank(meta: RunMetadata | None) -> tuple[int | None, int | None]:
    """(rank, world size) from a snapshot's checked metadata (parsers/metadata.py: the
    recorder's `distributed` section, each a plain integer in range, the rank below the
    world size), each None when absent or unusable."""
    if meta is None:
        return None, None
    return meta.rank, meta.world_size


def live_envelope(snap, device: int, buckets: int = ENVELOPE_BUCKETS, iterations=()) -> RankLive:
    """The highest live bytes in each of `buckets` equal stretches of the trace (by time_us
    when the one x-axis rule, classifiers/timeaxis.py, gives the device seconds, else by
    entry), from the same live memory as the peak (parsers.live_model): the envelope's
    maximum is the summary's peak. `iterations`: the summary's (the rule reads them)."""
    lm = live_model(snap, device)
    live = np.asarray(lm.live_after, dtype=np.int64)
    n = len(live)
    cols = snap.trace(device).columns
    times = np.asarray(cols["time_us"], dtype=np.int64) if n and "time_us" in cols else None
    if times is not None and times.min() >= 0 and times[-1] > times[0] and \
            choose_x_axis(times, iterations.its if isinstance(iterations, IterationRows) else
                          [_Iteration(it["number"], it["start_index"], it["end_index"])
                           if isinstance(it, dict) else it for it in iterations]).seconds:
        axis, x = "us", np.maximum.accumulate(times)    # a clock that steps back stays where it was
    else:
        axis, x = "entries", np.arange(n, dtype=np.int64)
    if n == 0:
        return RankLive("entries", np.array([0, 1], np.int64), np.array([lm.start_bytes], np.int64))
    lo, hi = int(x[0]), int(x[-1]) + 1
    edges = np.unique(np.linspace(lo, hi, min(buckets, hi - lo) + 1).astype(np.int64))
    first = np.searchsorted(x, edges[:-1], side="left")
    # entering each stretch: the level left by the entry before it
    level_in = np.where(first > 0, live[np.maximum(first - 1, 0)], lm.start_bytes)
    high = level_in.copy()
    filled = np.append(first[1:], n) > first
    if filled.any():
        np.maximum.at(high, np.flatnonzero(filled), np.maximum.reduceat(live, first[filled]))
    return RankLive(axis, edges, high)


def _code_key(rules_path: str | None) -> str | None:
    """The key of what a read depends on besides the file: the summary document's key (the
    analysis' code and rules, the presentation layer, the summary service) and this module's
    code; None when the rules cannot be keyed (then nothing is kept). Worked out once per
    process and rules file (as it is on disk: the viewer may outlive an edit of it)."""
    from ..classifiers.rules import user_rules_path
    user = user_rules_path(rules_path)
    try:
        st = os.stat(user) if user is not None else None
        stamp = (str(user), st.st_size, st.st_mtime_ns) if st is not None else None
    except OSError:
        stamp = (str(user), -1, -1)
    return _code_key_for(rules_path, stamp)


@functools.lru_cache(maxsize=8)
def _code_key_for(rules_path: str | None, _rules_stamp) -> str | None:
    from .summary import _document_key
    doc_key = _document_key(rules_path)
    if doc_key is None:
        return None
    blob = f"{doc_key}{ENVELOPE_BUCKETS}".encode() + Path(__file__).read_bytes()
    return f"{zlib.crc32(blob):08x}{zlib.adler32(blob):08x}"


# -- many files ------------------------------------------------------------------------------
def default_jobs(n_files: int) -> int:
    """One process per core (this one included), at most 8 (each holds one snapshot's
    columns and analysis: about a quarter of `pickle.load`'s memory for the file), never
    more than the files."""
    return max(1, min(os.cpu_count() or 1, 8, n_files))


def read_files(paths: list[str], rules_path: str | None = None, use_cache: bool = True, jobs: int = 1,
               dask_address: str | None = None, progress: Progress | None = None,
               dask_checked: bool = False) -> list[RankRead]:
    """`read_rank` of every path, in order. Raises `Cancelled` (progress.cancel(), in any
    thread) or KeyboardInterrupt with the workers stopped, RanksError for Dask problems,
    WorkerDied when a worker process ended without an answer."""
    progress = progress or Progress()
    progress.start("Reading ranks", max(1, len(paths)))
    if not paths:
        return []
    if dask_address is not None:
        from .rank_dask import on_dask
        out = on_dask(paths, rules_path, use_cache, dask_address, progress, checked=dask_checked)
    elif jobs <= 1 or len(paths) == 1:
        out = [_inline(k, p, len(paths), rules_path, use_cache, progress) for k, p in enumerate(paths)]
    else:
        out = _on_processes(paths, rules_path, use_cache, jobs, progress)
    progress.finish()
    return out


class _Within(Progress):
    """The progress of one file among n, reported as the outer progress of the whole;
    the outer one's cancel stops the file too."""

    def __init__(self, outer: Progress, k: int, n: int):
        super().__init__()
        self.outer, self.k, self.n = outer, k, n

    def check(self) -> None:
        self.outer.check()

    def start(self, label: str, total: float) -> None:
        self.total = float(total)
        self.outer.check()

    def update(self, done: float) -> None:
        frac = min(1.0, done / self.total) if self.total > 0 else 0.0
        self.outer.update((self.k + frac) * self.outer.total / self.n)

    def finish(self) -> None:
        self.outer.check()


def _inline(k: int, path: str, n: int, rules_path, use_cache, progress: Progress) -> RankRead:
    progress.check()
    read = read_rank(path, rules_path, use_cache, _Within(progress, k, n))
    progress.update((k + 1) * progress.total / n)
    return read


# -- worker processes --------------------------------------------------------------------------
WORKER_DIED = ("internal error: the worker process reading it ended without an answer, twice (killed, or out of "
               f"memory: try fewer --jobs) ({BUG_REPORT})")


def _quiet_worker() -> None:
    """A worker's initializer: Ctrl-C is the parent's to handle (it stops the workers). The
    worker was spawned with SIGINT blocked (`_spawning`), so it ignored Ctrl-C from its first
    instruction on; now it ignores it for good (a Ctrl-C pending meanwhile is dropped)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _spawning():
    """Around a call that may start a worker process (`submit`). SIGINT is blocked in this
    thread, and a process inherits the mask across fork and exec: the worker starts deaf to
    Ctrl-C (before its interpreter has even imported anything, no traceback of its own). A
    Ctrl-C that reaches this process meanwhile is held (in the main thread; elsewhere Ctrl-C
    is not this code's) and raised once the call returns, so no process is left half started."""
    main = threading.current_thread() is threading.main_thread()
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum)) if main else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)     # a Ctrl-C still pending arrives now
    if held:
        raise KeyboardInterrupt


def _ready() -> bool:
    """A worker's first task: it answers once the worker has started."""
    return True


class _PoolBroke(Exception):
    """A worker process ended without an answer: the files in flight then (each may be the
    cause, or a victim: the pool fails them all)."""

    def __init__(self, in_flight: list[int]):
        super().__init__(in_flight)
        self.in_flight = in_flight


def _on_processes(paths, rules_path, use_cache, jobs: int, progress: Progress) -> list[RankRead]:
    """`jobs` processes read the files: `jobs - 1` workers from the start of the list and
    this process from its end. When a worker dies (killed, out of memory), the files it
    and its pool had in flight are read again at the end, each by a worker of its own: a
    file that kills that one too is an internal error of its rank alone, and every other
    rank still counts."""
    n = len(paths)
    out: list[Any] = [None] * n
    todo = deque(range(n))
    again: list[int] = []
    count = [0]
    while todo:
        try:
            _pool_reads(paths, rules_path, use_cache, min(jobs - 1, len(todo) - 1) or 1, todo, out, count,
                        progress, this_process=True)
        except _PoolBroke as e:
            again += e.in_flight
    for k in again:                          # one at a time, in a fresh worker each
        try:
            _pool_reads(paths, rules_path, use_cache, 1, deque([k]), out, count, progress, this_process=False)
        except _PoolBroke:
            out[k] = RankRead(paths[k], error=WORKER_DIED, internal=True)
            count[0] += 1
    return out


def _pool_reads(paths, rules_path, use_cache, workers: int, todo: deque, out: list, count: list,
                progress: Progress, this_process: bool) -> None:
    """Read the files `todo` names (indices; taken off as they start) with a fresh pool of
    `workers` processes and, with `this_process`, this one from the end of the list. A
    worker is given files only once it has started (an interpreter and our imports: about a
    second on a busy machine), two at a time, so a folder this process finishes alone (a
    cached one, where a file takes milliseconds) never waits for a worker. Raises _PoolBroke
    with the files in flight when a worker dies, WorkerDied when one dies while starting."""
    n = len(paths)
    # spawn: a fresh interpreter per worker, safe from a threaded parent (the viewer)
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_quiet_worker)
    running: dict[Future, int] = {}
    ready = 0
    try:
        with _spawning():
            starting = [ex.submit(_ready) for _ in range(workers)]
        while todo or running:
            for f in [f for f in starting if f.done()]:
                starting.remove(f)
                if f.exception() is not None and running:
                    raise _PoolBroke(sorted(running.values()))      # a reading worker died: the pool with it
                _result(f, "starting")
                ready += 1
            while todo and len(running) < 2 * ready:
                k = todo.popleft()
                with _spawning():
                    running[ex.submit(read_rank, paths[k], rules_path, use_cache)] = k
            if todo and this_process:
                k = todo.pop()
                progress.check()
                out[k] = read_rank(paths[k], rules_path, use_cache, _Within(progress, count[0], n))
                count[0] += 1
            elif running or starting:
                wait(list(running) + starting, timeout=0.1, return_when=FIRST_COMPLETED)
            broke = False
            for f in [f for f in running if f.done()]:
                try:
                    out[running[f]] = f.result()
                except BrokenProcessPool:
                    broke = True                 # the answers that came before it are kept
                    continue
                del running[f]
                count[0] += 1
            if broke:
                raise _PoolBroke(sorted(running.values()))
            progress.update(count[0] * progress.total / n)
    finally:
        _stop(ex)          # done: the workers hold nothing (one may still be starting: no need to wait)


def _result(f: Future, doing: str) -> Any:
    try:
        return f.result()
    except BrokenProcessPool:
        raise WorkerDied(f"a worker process ended without an answer while {doing} (killed, out of memory, or "
                         "started from a Python script without `if __name__ == '__main__':`); try fewer "
                         "--jobs") from None


def _stop(ex: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers now (a file half read leaves no
    cache entry behind: entries are renamed into place when complete, and results are
    only sent once written)."""
    terminate: Callable[[], None] | None = getattr(ex, "terminate_workers", None)   # Python 3.14+
    if terminate is not None:
        terminate()                      # shuts the executor down too
        return
    procs = list((getattr(ex, "_processes", None) or {}).values())      # gone after shutdown()
    manager = getattr(ex, "_executor_manager_thread", None)
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(5)
    # Python before 3.12 wakes every executor's manager at exit through a pipe the manager
    # may have closed by then ("Exception ignored ... Bad file descriptor" after Ctrl-C):
    # the workers are gone, so let the manager finish and take it off that list
    if manager is not None:
        manager.join(5)
        if manager.is_alive():
            # a worker killed while it sent its answer left half a message in the answers' pipe,
            # and the manager waits for the rest of it; once every worker is gone, this process's
            # own end for writing is the last: closed, the manager reads the end of the pipe and
            # finishes (it hung the exit after a Ctrl-C, in `concurrent.futures`' atexit join)
            writer = getattr(getattr(ex, "_result_queue", None), "_writer", None)
            if writer is not None and not any(p.is_alive() for p in procs):
                try:
                    writer.close()
                except OSError:
                    pass
                manager.join(5)
        import concurrent.futures.process as cfp
        wakeups = getattr(cfp, "_threads_wakeups", None)
        if wakeups is not None and not manager.is_alive():
            wakeups.pop(manager, None)


__all__ = ["RankLive", "RankRead", "RanksError", "WorkerDied", "read_rank", "read_files", "live_envelope",
           "metadata_rank", "default_jobs", "ENVELOPE_BUCKETS"]
