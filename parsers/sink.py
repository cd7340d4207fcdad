"""Where trace entries go: one numpy column row each, never a Python object per event.

`TraceSink` receives entries from both halves of the reader (the interpreter hands it one
dict at a time, the fast path whole arrays), normalizes every field (numbers.py), interns
what the entry names (actions, categories, strings, stacks) and appends rows to the
device's columns. Fields outside the schema go to `extras` as bounded flattened values.

A trace entry is streamed out and forgotten, but a pickle may list the same entry dict
twice (the second time as a memo reference). `EntryMemo` remembers, compactly, which memo
slot held which entry (device, row), so that such a reference copies the row.
"""
from __future__ import annotations

import bisect
import os
from array import array

import numpy as np

from . import numbers
from .errors import CorruptError, LimitError
from .limits import RowBudget
from .tables import (A_UNKNOWN, ACTIONS, COMPONENT_KEY, HOST_DEVICE, OPTIONAL_COLUMNS, PROFILER_CATEGORIES,
                     TRACE_COLUMNS, ColumnFile, Interner)
from .values import DROPPED, Flattener, StackRef

MISSING_ACTION = "(missing)"     # an entry without an 'action' key
INVALID_ACTION = "(invalid)"     # an 'action' that is not a string
OTHER_ACTION = "(other)"         # code 255: more distinct actions than a uint8 can name

# keys of a trace entry that have columns (the rest is kept in extras)
_COLUMN_KEYS = frozenset(("action", "addr", "size", "stream", "time_us", "frames"))
_MAX_STACKS = (1 << 31) - 2
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_STRINGS = (1 << 29)         # string ids share the fast path's int32 memo codes


class TracesList(list):
    """The `device_traces` list: holds one `TraceList` per device."""


class TraceList(list):
    """`device_traces[device]`: entries go to the sink instead of being stored."""
    __slots__ = ("device", "sink")

    def __init__(self, device: int, sink: "TraceSink"):
        super().__init__()
        self.device = device
        self.sink = sink

    def append(self, obj):  # noqa: D401 - list protocol
        self.sink.add_entry(self.device, obj)

    def extend(self, objs):
        for obj in objs:
            self.sink.add_entry(self.device, obj)


def is_frames(v) -> bool:
    """Whether a value can be interned as a stack (a frames list, or one the fast path took)."""
    return type(v) is StackRef or (isinstance(v, list) and not isinstance(v, (TraceList, TracesList)))


class EntryRef:
    """A memo reference to a trace entry already streamed into columns (unhashable, like
    the dict it stands for)."""
    __slots__ = ("device", "row")
    __hash__ = None  # type: ignore[assignment]  # unhashable, like the dict it stands for

    def __init__(self, device: int, row: int):
        self.device = device
        self.row = row


class EntryMemo:
    """Which memo slot held which streamed entry, in a few bytes an entry: the interpreter's
    entries one by one (memo index, device and row packed), the fast path's per batch
    (the first entry's memo index and how many slots each entry used)."""

    def __init__(self):
        self._idx = array("q")
        self._packed = array("q")
        self._unordered: dict[int, tuple[int, int]] = {}
        self._batch_base: list[int] = []
        self._batches: list[tuple] = []

    def add_one(self, memo_idx: int, device: int, row: int) -> None:
        if self._idx and memo_idx <= self._idx[-1]:
            self._unordered[memo_idx] = (device, row)
            return
        self._idx.append(memo_idx)
        self._packed.append((device << 40) | row)

    def add_batch(self, base: int, device: int, first_row: int, slots: np.ndarray) -> None:
        """`slots[j]`: memo slots entry j used (its dict, then inline strings, lists, tuples)."""
        if self._batch_base and base <= self._batch_base[-1]:
            return      # memo numbering went backwards (BINPUT games): such refs stay unresolved
        slots = np.asarray(slots, dtype=np.int64)
        compact = int(slots[0]) if len(slots) and bool((slots == slots[0]).all()) else slots.astype(np.uint8)
        self._batch_base.append(base)
        self._batches.append((device, first_row, len(slots), compact))

    def find(self, memo_idx: int) -> tuple[int, int] | None:
        got = self._unordered.get(memo_idx)
        if got is not None:
            return got
        k = bisect.bisect_left(self._idx, memo_idx)
        if k < len(self._idx) and self._idx[k] == memo_idx:
            p = self._packed[k]
            return p >> 40, p & ((1 << 40) - 1)
        k = bisect.bisect_right(self._batch_base, memo_idx) - 1
        if k < 0:
            return None
        device, first_row, n, slots = self._batches[k]
        off = memo_idx - self._batch_base[k]
        if isinstance(slots, int):
            if off % slots or off // slots >= n:
                return None
            return device, first_row + off // slots
        starts = np.concatenate(([0], np.cumsum(slots[:-1], dtype=np.int64)))
        j = int(np.searchsorted(starts, off))
        if j < n and starts[j] == off:
            return device, first_row + j
        return None


class DeviceColumns:
    """Rows of one device's trace, appended in order from two sources."""

    def __init__(self, sink: "TraceSink", device: int):
        self.sink = sink
        self.device = device
        self.n = 0
        self.cols = {k: ColumnFile(dt, sink.path_for(device, k)) for k, dt in TRACE_COLUMNS.items()}
        self.pending: list[tuple] = []     # rows from the interpreter, flushed in order
        self.pending_opt: list[dict] = []
        self.extras: dict[int, dict] = {}  # rare fields (oom device_free, unknown keys)
        self.size_total = 0.0              # sum of sizes: bounded so that live sums fit int64

    def ensure_optional(self, name: str) -> ColumnFile:
        col = self.cols.get(name)
        if col is None:
            dtype, default = OPTIONAL_COLUMNS[name]
            col = self.cols[name] = ColumnFile(dtype, self.sink.path_for(self.device, name))
            col.fill(default, self.n - len(self.pending))
        return col

    def flush(self) -> None:
        if not self.pending:
            return
        rows = self.pending
        arr = list(zip(*rows))
        for k, values in zip(TRACE_COLUMNS, arr):
            a = np.asarray(values, dtype=TRACE_COLUMNS[k])
            if k == "size":
                self._count_sizes(a)
            self.cols[k].append(a)
        for name in list(self.cols):
            if name in TRACE_COLUMNS:
                continue
            dtype, default = OPTIONAL_COLUMNS[name]
            self.cols[name].append(np.asarray([o.get(name, default) for o in self.pending_opt], dtype=dtype))
        self.pending = []
        self.pending_opt = []

    def _count_sizes(self, sizes: np.ndarray) -> None:
        self.size_total += float(sizes.sum(dtype=np.float64))
        numbers.check_total(self.size_total, f"the sizes in device {self.device}'s trace")

    def add_row(self, row: tuple, opt: dict) -> None:
        for name in opt:
            if name not in self.cols:
                self.ensure_optional(name)
        self.pending.append(row)
        self.pending_opt.append(opt)
        self.n += 1
        if len(self.pending) >= 65536:
            self.flush()

    def add_arrays(self, arrays: dict, count: int) -> None:
        self.flush()
        for name in arrays:
            if name not in self.cols:
                self.ensure_optional(name)
        self._count_sizes(arrays["size"])
        for name, col in self.cols.items():
            a = arrays.get(name)
            if a is None:
                dtype, default = OPTIONAL_COLUMNS[name]
                col.fill(default, count)
            else:
                col.append(a)
        self.n += count

    def row(self, i: int) -> tuple[tuple, dict]:
        """Row i as (base column values, optional column values that differ from the default)."""
        first_pending = self.n - len(self.pending)
        if i >= first_pending:
            return self.pending[i - first_pending], dict(self.pending_opt[i - first_pending])
        base = tuple(self.cols[k].get(i) for k in TRACE_COLUMNS)
        opt = {}
        for name, col in self.cols.items():
            if name not in TRACE_COLUMNS:
                v = col.get(i)
                if v != OPTIONAL_COLUMNS[name][1]:
                    opt[name] = v
        return base, opt


class TraceSink:
    """Receives trace entries and interns what they name."""

    def __init__(self, directory: str | None, file_size: int = 0):
        self.directory = directory
        self.interner = Interner()
        self.devices: dict[int, DeviceColumns] = {}
        self.action_names = list(ACTIONS)
        self._action_codes = {a: i for i, a in enumerate(ACTIONS)}
        self.category_names = list(PROFILER_CATEGORIES)
        self._category_codes = {c: i for i, c in enumerate(PROFILER_CATEGORIES)}
        self.component_names = [""]          # component tracking's names, as the file spells them
        self._component_codes = {"": 0}
        self._list_stack_ids: dict[int, int] = {}  # id(python list) -> stack id
        self.interned_lists = self._list_stack_ids   # (the interpreter refuses to change them)
        self._frame_ids: dict[int, int] = {}       # id(frame dict) -> frame id
        self._keep_alive: list = []
        self.flat = Flattener()
        self.rows = RowBudget(file_size)
        # entry dicts the interpreter memoized, until they are streamed out: id -> memo index
        self.entry_memo_ids: dict[int, int] = {}
        self.entry_memo = EntryMemo()
        self.memo: dict | None = None   # the interpreter's memo (set by it)

    def path_for(self, device: int, column: str) -> str | None:
        if self.directory is None:
            return None
        return os.path.join(self.directory, f"d{device}_{column}.bin")

    def device(self, device: int) -> DeviceColumns:
        d = self.devices.get(device)
        if d is None:
            if device != HOST_DEVICE:
                numbers.device(device)      # device_traces has more than 65536 lists: refused
            d = self.devices[device] = DeviceColumns(self, device)
        return d

    def action_code(self, name: str) -> int:
        code = self._action_codes.get(name)
        if code is None:
            if len(self.action_names) >= A_UNKNOWN:
                if len(self.action_names) == A_UNKNOWN:
                    self.action_names.append(OTHER_ACTION)
                return A_UNKNOWN
            code = self._action_codes[name] = len(self.action_names)
            self.action_names.append(name)
        return code

    def category_code(self, name: str) -> int:
        code = self._category_codes.get(name)
        if code is None:
            if len(self.category_names) >= 255:
                return self._category_codes["unknown"]
            code = self._category_codes[name] = len(self.category_names)
            self.category_names.append(name)
        return code

    def component_code(self, name: str) -> int:
        """Code of a component-tracking name (0: none; more than 255 distinct: 0 too)."""
        code = self._component_codes.get(name)
        if code is None:
            if len(self.component_names) >= 255:
                return 0
            code = self._component_codes[name] = len(self.component_names)
            self.component_names.append(name)
        return code

    def stack_of(self, frames) -> int:
        """Intern a frames value the interpreter built (list of frame dicts)."""
        if type(frames) is StackRef:
            return frames.sid
        if not is_frames(frames):
            return -1
        key = id(frames)
        sid = self._list_stack_ids.get(key)
        if sid is None:
            it = self.interner
            fids = self._frame_ids
            ids = []
            for f in frames:
                # frame dicts are shared objects: intern each once (kept alive: ids stay unique)
                fid = fids.get(id(f))
                if fid is None:
                    fid = fids[id(f)] = it.frame_of_dict(f)
                    self._keep_alive.append(f)
                ids.append(fid)
            sid = it.stack(ids)
            if sid > _MAX_STACKS:
                raise LimitError(f"more than {_MAX_STACKS:,} distinct stacks")
            self._list_stack_ids[key] = sid
            self._keep_alive.append(frames)  # keep id() stable
        return sid

    def string_id(self, s: str) -> int:
        i = self.interner.string(s)
        if i >= _MAX_STRINGS:
            raise LimitError(f"more than {_MAX_STRINGS:,} distinct strings")
        return i

    def rare_value(self, key, v):
        """An entry field kept with its rare fields (no column's: an oom's device_free, a key
        nothing here knows) as it is stored: normalized, JSON-able, counted against the file's
        total; DROPPED once that is spent. The interpreter's entries and the fast path's alike."""
        if key == "device_free" and type(key) is str:
            v = numbers.optional_size(v)
        return self.flat.value(v)

    def add_entry(self, device: int, e) -> None:
        if type(e) is EntryRef:
            self._copy_row(e, device)
            return
        if type(e) is not dict:
            where = "the pinned host memory trace" if device == HOST_DEVICE else f"device {device}"
            raise CorruptError(f"trace entry of {where} is a {type(e).__name__}, not a dict")
        dev = self.device(device)
        opt = {}
        extra: dict | None = None
        for k, v in e.items():
            if k in _COLUMN_KEYS and type(k) is str:
                continue
            if k == "category" and type(v) is str:
                opt["category"] = self.category_code(v)
            elif (k == "compile_context" or k == "user_metadata" or k == "internal_metadata") and type(v) is str:
                opt[k] = self.string_id(v)
            elif k == COMPONENT_KEY and type(v) is str:
                opt["component"] = self.component_code(v)
            elif k == "forward_frames" and is_frames(v):
                opt["forward_stack"] = self.stack_of(v)
            elif k == "pool_id" and type(v) is tuple and len(v) == 2 and all(type(x) is int for x in v):
                opt["pool_a"] = numbers.opaque(v[0], "pool id")
                opt["pool_b"] = numbers.opaque(v[1], "pool id")
            else:
                v = self.rare_value(k, v)
                if v is not DROPPED:
                    if extra is None:
                        extra = {}
                    extra[k if type(k) is str else self.flat.key(k, len(extra))] = v
        if extra:
            dev.extras[dev.n] = extra
        action = e.get("action", MISSING_ACTION)
        code = self._action_codes.get(action) if type(action) is str else None
        addr, size, stream, tus = e.get("addr", 0), e.get("size", 0), e.get("stream", 0), e.get("time_us", -1)
        # the common case inline (ints in range); numbers.py decides the rest
        row = (
            code if code is not None else self.action_code(action if type(action) is str else INVALID_ACTION),
            addr if type(addr) is int and 0 <= addr < _INT64_MAX else numbers.addr(addr),
            size if type(size) is int and 0 <= size <= numbers.MAX_SIZE else numbers.size(size),
            stream if type(stream) is int and _INT64_MIN <= stream <= _INT64_MAX else numbers.opaque(stream),
            tus if type(tus) is int and 0 <= tus <= numbers.MAX_TIME_US else -1,
            self.stack_of(e.get("frames")),
        )
        idx = self.entry_memo_ids.pop(id(e), None) if self.entry_memo_ids else None
        if idx is not None:
            # nothing needs the dict any more: a later reference copies the row instead
            if self.memo is not None and self.memo.get(idx) is e:
                del self.memo[idx]
            self.entry_memo.add_one(idx, device, dev.n)
        dev.add_row(row, opt)

    def _copy_row(self, ref: EntryRef, device: int) -> None:
        src = self.devices[ref.device]
        base, opt = src.row(ref.row)
        dst = self.device(device)
        extra = src.extras.get(ref.row)
        if extra:
            self.flat.nodes_left -= len(extra)
            dst.extras[dst.n] = dict(extra)
        dst.add_row(tuple(base), opt)

    def finish(self) -> dict:
        out = {}
        for device, dev in sorted(self.devices.items()):
            dev.flush()
            out[device] = ({k: c.finish() for k, c in dev.cols.items()}, dev.extras)
        return out

    def discard(self) -> None:
        for dev in self.devices.values():
            for c in dev.cols.values():
                c.discard()


__all__ = ["TraceSink", "TraceList", "TracesList", "EntryRef", "EntryMemo", "DeviceColumns",
           "MISSING_ACTION", "INVALID_ACTION", "OTHER_ACTION"]
