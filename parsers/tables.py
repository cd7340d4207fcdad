"""Interned tables and column sinks shared by the reader and the cache.

Nothing here holds a Python object per trace event: events live in numpy columns,
frames and stacks are interned once (a frame is `(filename_id, line, name_id)`, a
stack a tuple of frame ids, innermost first).
"""
from __future__ import annotations

import mmap
import os
import re
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable

import numpy as np

from . import numbers
from .values import as_text

# Action codes. Unknown future actions are interned after these (kept, not fatal).
# `annotate` (torch 2.14, pytorch #190575): `_annotate_tensor` / `_annotate_memory(ptr, md)`
# attach a note to a live allocation after the fact; `addr` is its base address and
# `user_metadata` the note. It changes no live or reserved memory.
ACTIONS = (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "snapshot", "oom", "free", "annotate",
)
A_ALLOC, A_FREE_REQUESTED, A_FREE_COMPLETED, A_SEGMENT_ALLOC, A_SEGMENT_FREE, \
    A_SEGMENT_MAP, A_SEGMENT_UNMAP, A_SNAPSHOT, A_OOM, A_FREE, A_ANNOTATE = range(len(ACTIONS))
A_UNKNOWN = 255  # more distinct unknown actions than a uint8 can name

# Pinned host memory (torch 2.14, pytorch #182407, `record_pinned_host_memory=True`): the
# snapshot's `host_traces` (one flat list of entries, the device entries' layout) and
# `host_segments` (segment dicts with device -1) are read into the same tables as a device's,
# under this device number. It is never one of `Snapshot.devices`: host memory is its own
# memory space, never part of a GPU's peak.
HOST_DEVICE = -1

# torch's memory component tracking (pytorch #182387/#182388, torch main): the component
# type an allocation is stamped with. UNVERIFIED: the snapshot key and its value form could
# not be read from torch's source (its Module.cpp / memory.py with component tracking are not
# in any source we could see; see docs/format.md); we read the key below with a string value,
# the lower-case names of `memory_stats()`' `component_bytes.<name>.*` (upper-case accepted),
# on trace entries and on blocks. Names are interned as the file spells them (as profiler
# categories are); the classifier maps them (classifiers/torch_tags.py).
COMPONENT_KEY = "component_type"

# torch's memory-profiler categories, as found on profiler-converted snapshots.
PROFILER_CATEGORIES = (
    "", "parameter", "optimizer_state", "gradient", "activation", "autograd_detail",
    "temporary", "input", "unknown",
)

# Block states in segments.
BLOCK_STATES = ("inactive", "active_allocated", "active_pending_free", "other")
LIVE_BLOCK_STATES = (1, 2)  # what counts as allocated (torch's allocated_size does the same)

# The base columns of every device trace, and optional ones created on first use.
TRACE_COLUMNS = {
    "action": np.uint8, "addr": np.int64, "size": np.int64, "stream": np.int64,
    "time_us": np.int64, "stack": np.int32,
}
OPTIONAL_COLUMNS = {
    "category": (np.uint8, 0),          # profiler-converted snapshots: torch's own category
    "compile_context": (np.int32, -1),  # string ids
    "user_metadata": (np.int32, -1),
    "forward_stack": (np.int32, -1),    # 2.13 forward_frames
    "pool_a": (np.int64, -1),           # 2.12 pool_id
    "pool_b": (np.int64, -1),
    "internal_metadata": (np.int32, -1),   # main (pytorch #193432): allocator tags, string ids
    "component": (np.uint8, 0),         # component tracking: code into Snapshot.component_names
}
ALL_COLUMNS = {**TRACE_COLUMNS, **{k: v[0] for k, v in OPTIONAL_COLUMNS.items()}}


# FX source mapping (pytorch #166676, in torch 2.13.0; torch/_utils.py `_augment_frames`):
# `_snapshot(augment_with_fx_traces=True)` adds to a frame of FX-generated code
# (`fx_generated__<hash>.py`) `fx_node_op`, `fx_node_name`, `fx_node_target` (str, or None
# for the first two) and, when the node has one, `fx_original_trace`: the node's
# `meta["stack_trace"]`, Python traceback text, outermost frame first.
FX_KEYS = ("fx_node_op", "fx_node_name", "fx_node_target", "fx_original_trace")
_FX_TRACE_LINE = re.compile(r'File "([^"\n]*)", line (\d{1,9}), in ([^\n]*)')
FX_TEXT_MAX = 1 << 16          # characters kept of one fx string
FX_FRAMES_MAX = 64             # frames kept of one original trace (the innermost)
FX_TEXT_TOTAL = 1 << 24        # characters of fx strings in the whole file; beyond: not kept


class Interner:
    """Strings, frames and stacks, each stored once."""

    def __init__(self):
        self.strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self.frame_file: list[int] = []
        self.frame_line: list[int] = []
        self.frame_name: list[int] = []
        self._frame_ids: dict[tuple, int] = {}
        self.stacks: list[tuple] = [()]   # stack 0 is the empty stack
        self._stack_ids: dict[tuple, int] = {(): 0}
        # frame id -> (op, node name, target, original trace): string ids (-1: none), and the
        # original trace's frames, innermost first (frame ids of ordinary frames)
        self.frame_fx: dict[int, tuple[int, int, int, int, tuple[int, ...]]] = {}
        self._fx_chars_left = FX_TEXT_TOTAL

    def string(self, s: str) -> int:
        i = self._string_ids.get(s)
        if i is None:
            i = self._string_ids[s] = len(self.strings)
            self.strings.append(s)
        return i

    def frame(self, filename, line, name) -> int:
        """Intern a frame. Values of the wrong type never reach `str()` (a nested object's
        repr can be unbounded): numbers.line and values.as_text decide what is kept."""
        fid_key = (self.string(filename if type(filename) is str else as_text(filename)),
                   line if type(line) is int and 0 <= line <= numbers.MAX_LINE else numbers.line(line),
                   self.string(name if type(name) is str else as_text(name)))
        i = self._frame_ids.get(fid_key)
        if i is None:
            i = self._frame_ids[fid_key] = len(self.frame_file)
            self.frame_file.append(fid_key[0])
            self.frame_line.append(fid_key[1])
            self.frame_name.append(fid_key[2])
        return i

    def frame_of_dict(self, d) -> int:
        if isinstance(d, str):
            # forward_frames (2.13) are traceback lines, not frame dicts
            return self.frame("", 0, d)
        if type(d) is not dict:
            # what the interpreter would hold there, whichever half of the reader met it:
            # a frames list the fast path took is a list, an entry it streamed out a dict
            name = type(d).__name__
            if name == "EntryRef":
                return self.frame("??", 0, "??")
            return self.frame("??", 0, "<list>" if name == "StackRef" else f"<{name}>")
        fid = self.frame(d.get("filename", "??"), d.get("line", 0), d.get("name", "??"))
        if len(d) > 3 and fid not in self.frame_fx:
            self._fx(fid, d)
        return fid

    def _fx(self, fid: int, d: dict) -> None:
        """Keep a frame's FX fields (the first dict seen for a frame decides), bounded."""
        vals = [d.get(k) for k in FX_KEYS]
        if not any(type(v) is str for v in vals) or self._fx_chars_left <= 0:
            return
        ids = []
        for v in vals:
            if type(v) is str:
                v = v[:FX_TEXT_MAX]
                self._fx_chars_left -= len(v)
                ids.append(self.string(v))
            else:
                ids.append(-1)
        trace = vals[3][:FX_TEXT_MAX] if type(vals[3]) is str else ""
        lines = _FX_TRACE_LINE.findall(trace)[-FX_FRAMES_MAX:]
        originals = tuple(self.frame(f, int(n), name.strip()) for f, n, name in reversed(lines))
        self.frame_fx[fid] = (ids[0], ids[1], ids[2], ids[3], originals)

    def stack(self, frame_ids: Iterable[int]) -> int:
        key = tuple(frame_ids)
        i = self._stack_ids.get(key)
        if i is None:
            i = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(key)
        return i


class CacheWriteError(Exception):
    """Writing a cache file failed (disk full, I/O error): the caller reads again without
    a cache. Not an OSError, so that it is never mistaken for an error reading the snapshot."""


_WRITER: tuple[int, ThreadPoolExecutor] | None = None
_MAX_PENDING = 32            # a column's writes queued at most before `append` waits for the oldest


def _writer() -> ThreadPoolExecutor:
    """The one thread that checksums and writes column files, in submission order (zlib and
    file writes release the GIL: the reading goes on meanwhile). A new one in a forked child."""
    global _WRITER
    if _WRITER is None or _WRITER[0] != os.getpid():
        _WRITER = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="vramscope-columns"))
    return _WRITER[1]


def constant_column(value, dtype, n: int) -> np.ndarray:
    """A read-only column of `n` entries all `value`, in no memory (a zero stride)."""
    return np.broadcast_to(np.array(value, dtype=dtype), (n,))


class ColumnFile:
    """An append-only column: to a file when we have a directory, else in memory. Keeps the
    CRC-32 of what it wrote (the cache entry records it; a reopen checks it). The file's
    checksum and writes run on a writer thread, in order; `get`, `finish` and `discard` wait for
    them, and a write's failure is raised by the next call.

    While every value appended is the same, nothing is written: `constant` holds it, and
    `finish` gives a column of it in no memory (`constant_column`). The columns of fields torch
    writes the same in every entry (a 2.13 trace's pool id (0, 0) and compile context, the
    stream of a one-stream run) were 200 MB at 10^7 entries, written, checksummed and, where a
    stage read them, paged in; the first different value writes what came before."""

    def __init__(self, dtype, path: str | None):
        self.dtype = np.dtype(dtype)
        self.path = path
        self.n = 0
        self.crc = 0
        self.constant: Any = None            # the one value of every entry so far (a numpy scalar; None: none yet or several)
        self._uniform = True
        self._chunks: list[np.ndarray] = []
        self._pending: deque[Future] = deque()
        self._error: CacheWriteError | None = None
        try:
            self._fh = open(path, "xb") if path else None
        except OSError as e:
            raise CacheWriteError(str(e)) from None

    def _write(self, arr: np.ndarray) -> None:          # on the writer thread
        if self._error is not None or self._fh is None:
            return
        self.crc = zlib.crc32(arr.data, self.crc)
        try:
            self._fh.write(arr.data)
        except OSError as e:
            self._error = CacheWriteError(str(e))

    def _wait(self, keep: int = 0) -> None:
        """Wait until at most `keep` writes are queued; raise a write's failure."""
        while len(self._pending) > keep:
            f = self._pending.popleft()
            if not f.cancelled():
                f.result()
        if self._error is not None:
            raise self._error

    def append(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if not len(arr):
            return
        if self._uniform:
            first = arr[0]
            if (self.n == 0 or first == self.constant) and bool((arr == first).all()):
                self.constant = first
                self.n += len(arr)
                return
            self._written_out()
        self._put(arr)

    @property
    def is_constant(self) -> bool:
        """Whether every entry holds `constant` (and nothing was written)."""
        return self._uniform and self.n > 0

    def _written_out(self) -> None:
        """Stop being constant: what was counted so far written as it was."""
        self._uniform = False
        held, value, self.n, self.constant = self.n, self.constant, 0, None
        while held > 0:
            k = min(held, 1 << 20)
            self._put(np.full(k, value, dtype=self.dtype))
            held -= k

    def _put(self, arr: np.ndarray) -> None:
        self.n += len(arr)
        if self._fh is not None:
            self._wait(_MAX_PENDING)
            self._pending.append(_writer().submit(self._write, arr))
        else:
            self._chunks.append(arr)

    def get(self, i: int):
        """Element i (a Python scalar), for the rare reference to an entry already written."""
        if self._uniform:
            if not 0 <= i < self.n:
                raise IndexError(i)
            return self.constant.item()
        if self._fh is not None:
            self._wait()
            try:
                self._fh.flush()
                with open(self._fh.name, "rb") as fh:
                    fh.seek(i * self.dtype.itemsize)
                    b = fh.read(self.dtype.itemsize)
            except OSError as e:
                raise CacheWriteError(str(e)) from None
            return np.frombuffer(b, dtype=self.dtype)[0].item()
        for c in self._chunks:
            if i < len(c):
                return c[i].item()
            i -= len(c)
        raise IndexError(i)

    def fill(self, value, count: int) -> None:
        if self._uniform and count > 0 and (self.n == 0 or self.constant == value):
            self.constant = np.array(value, dtype=self.dtype)[()]
            self.n += count
            return
        while count > 0:
            k = min(count, 1 << 20)
            self.append(np.full(k, value, dtype=self.dtype))
            count -= k

    def finish(self) -> np.ndarray:
        if self._uniform and self.n:
            self.discard()
            if self.path:
                try:
                    os.remove(self.path)
                except OSError:
                    pass
            return constant_column(self.constant, self.dtype, self.n)
        if self._fh is not None:
            self._wait()
            path = self._fh.name
            try:
                self._fh.close()       # no fsync: the entry's checksums catch what a crash leaves
            except OSError as e:
                raise CacheWriteError(str(e)) from None
            self._fh = None
            return map_column(path, self.dtype, self.n)
        if not self._chunks:
            return np.zeros(0, dtype=self.dtype)
        out = np.concatenate(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        self._chunks = []
        return out

    def discard(self) -> None:
        if self._fh is not None:
            self._error = self._error or CacheWriteError("discarded")     # what is queued writes nothing
            for f in self._pending:
                f.cancel()
            try:
                self._wait()
            except CacheWriteError:
                pass
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None


def _mapping_of(arr):
    """The mmap a memory-mapped column (`map_column`), or a view of one, reads from; None."""
    base, mm = arr, None
    while base is not None and mm is None:
        mm = getattr(base, "_mmap", None)
        base = getattr(base, "base", None)
    if mm is None or getattr(mmap, "MADV_DONTNEED", None) is None or not hasattr(mm, "madvise"):
        return None
    return mm


def release_mapped(arr) -> bool:
    """Drop this process's pages of a read-only memory-mapped column (`map_column`) or of the
    mapping a view of one shares: madvise(MADV_DONTNEED) on a shared read-only file mapping
    takes them out of the resident set and nothing else (the file's pages stay in the OS's
    cache; the next read faults them back in, unchanged). False where `arr` is not mapped, or
    the platform cannot."""
    mm = _mapping_of(arr)
    if mm is None:
        return False
    try:
        mm.madvise(mmap.MADV_DONTNEED)
    except (OSError, ValueError):
        return False
    return True


def take_released(arr, idx, part: int = 1 << 20) -> np.ndarray:
    """`arr[idx]` where `arr` is a column mapped from the cache (or a view of one): read a part
    of `part` entries at a time, in order, each part's pages handed back (`release_mapped`) once
    read. Entries spread over a whole column (a trace's segment events: one in a few hundred)
    otherwise page in nearly all of it, and keep it (240 MB of three columns at 10^7 entries,
    at the highest memory of the viewer's open). Any other array: `arr[idx]`. Indices in order
    (an allocation's entries) are read as they are: no sort of them, no copy."""
    idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        idx = idx.astype(np.int64)
    mm = _mapping_of(arr)
    if mm is None or len(idx) < 2 or not isinstance(arr, np.ndarray) or arr.ndim != 1 \
            or int(idx.min()) < 0 or int(idx.max()) >= len(arr):
        return np.asarray(arr)[idx]           # (numpy's own answer: negative indices, IndexError)
    try:
        start = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    except (TypeError, ValueError):
        return np.asarray(arr)[idx]
    at = arr.ctypes.data - start              # where arr[0] lies in the mapping
    step = arr.strides[0]
    if at < 0 or step <= 0:
        return np.asarray(arr)[idx]
    if bool((idx[1:] >= idx[:-1]).all()):
        order, sorted_idx = None, idx
    else:
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
    out = np.empty(len(idx), dtype=arr.dtype)
    page = mmap.PAGESIZE
    # (the parts' bounds in the indices' own type: numpy casts the indices to a wider one whole)
    b_t = sorted_idx.dtype if len(arr) + part < np.iinfo(sorted_idx.dtype).max else np.int64
    bounds = np.searchsorted(sorted_idx, np.arange(0, len(arr) + part, part, dtype=b_t))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if lo == hi:
            continue
        if order is None:
            out[lo:hi] = arr[sorted_idx[lo:hi]]
        else:
            out[order[lo:hi]] = arr[sorted_idx[lo:hi]]
        b0 = at + int(sorted_idx[lo]) * step
        b1 = at + int(sorted_idx[hi - 1]) * step + arr.itemsize
        p0 = b0 - b0 % page
        try:
            mm.madvise(mmap.MADV_DONTNEED, p0, b1 - p0)
        except (OSError, ValueError):
            pass
    return out


def map_column(path: str, dtype, n: int) -> np.ndarray:
    """Memory-map a raw column file read-only (an empty file cannot be mapped)."""
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))
