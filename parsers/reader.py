"""A pickle reader for torch memory snapshots that cannot be exploited.

We never call `pickle.load`: this module steps over the opcode stream itself and
accepts only the data-building opcodes torch's snapshots use (DESIGN.md §2).
Anything that imports or calls (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ,
NEWOBJ, PERSID, EXT*) is refused the moment it is read, before it can act.

It also never builds the whole object graph. Trace entries (almost every byte of
a real file) stream into per-device numpy columns:

* the general interpreter below builds Python objects only for the small parts
  (segments, settings, annotations, first occurrences of frames) and for odd
  trace entries, which it turns into one column row each;
* `_FastPath` decodes long runs of trace entries of one fixed shape with numpy,
  vectorized over thousands of entries: torch pickles every entry with the same
  key references (BINGET of the memoized key strings) in the same order, small
  integers, and frames given either as a memo reference to a list pickled
  earlier or as an inline list of memo references to frame dicts. The raw bytes
  of such an inline list identify its stack, so stacks are interned by those
  bytes without decoding them.

The file is read in chunks, so peak memory does not grow with its size.
"""
from __future__ import annotations

import struct
from typing import BinaryIO

import numpy as np

from .errors import (CorruptError, LimitError, NotASnapshotError, SnapshotError,
                     TruncatedError, UnsafePickleError, UnsupportedPickleError)
from .progress import Progress
from .tables import (ACTIONS, A_UNKNOWN, OPTIONAL_COLUMNS, PROFILER_CATEGORIES,
                     TRACE_COLUMNS, ColumnFile, Interner)

# Bounds no real snapshot comes near; they keep hostile input from making us
# allocate absurdly or grow without end.
MAX_STRING = 16 << 20        # one string
MAX_STACK = 100_000          # items on one level of the pickle stack (trace entries stream out)
MAX_MARK_DEPTH = 512         # nesting of MARKs (real files: < 10)
MAX_LONG_BYTES = 1024
CHUNK = 4 << 20              # bytes read at a time
PAD = 16                     # zero bytes after the data so vector reads never run off
_MARGIN = 1100               # bytes kept ahead of the interpreter: covers every fixed-size opcode

_UNSAFE = {
    0x63: "GLOBAL", 0x93: "STACK_GLOBAL", 0x52: "REDUCE", 0x62: "BUILD", 0x69: "INST",
    0x6f: "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x50: "PERSID", 0x51: "BINPERSID",
    0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4",
}

_KNOWN_ENTRY_KEYS = ("action", "addr", "size", "stream", "time_us", "frames",
                     "compile_context", "user_metadata", "forward_frames", "category",
                     "device_free", "pool_id")
# How the fast path decodes each key's value.
_FAST_KINDS = {
    "action": "str", "addr": "int", "size": "int", "stream": "int", "time_us": "int",
    "frames": "list", "forward_frames": "list", "compile_context": "str",
    "user_metadata": "str", "category": "str", "pool_id": "tuple2",
}

_MARK = object()
_POOL_BASE = -(1 << 30)   # memo_fast codes at or below this name a pool tuple


class _StackRef:
    """A frames list the fast path decoded, when the interpreter meets it again."""
    __slots__ = ("sid",)

    def __init__(self, sid: int):
        self.sid = sid


class _TracesList(list):
    """The `device_traces` list: holds one `_TraceList` per device."""


class _TraceList(list):
    """`device_traces[device]`: entries go to the sink instead of being stored."""
    __slots__ = ("device", "sink")

    def __init__(self, device: int, sink: "_Sink"):
        super().__init__()
        self.device = device
        self.sink = sink

    def append(self, obj):  # noqa: D401 - list protocol
        self.sink.add_entry(self.device, obj)

    def extend(self, objs):
        for obj in objs:
            self.sink.add_entry(self.device, obj)


class _DeviceColumns:
    """Rows of one device's trace, appended in order from two sources."""

    def __init__(self, sink: "_Sink", device: int):
        self.sink = sink
        self.device = device
        self.n = 0
        self.cols = {k: ColumnFile(dt, sink.path_for(device, k)) for k, dt in TRACE_COLUMNS.items()}
        self.pending: list[tuple] = []     # rows from the interpreter, flushed in order
        self.pending_opt: list[dict] = []
        self.extras: dict[int, dict] = {}  # rare fields (oom device_free, unknown keys)

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
            self.cols[k].append(np.asarray(values, dtype=TRACE_COLUMNS[k]))
        for name in list(self.cols):
            if name in TRACE_COLUMNS:
                continue
            dtype, default = OPTIONAL_COLUMNS[name]
            self.cols[name].append(np.asarray([o.get(name, default) for o in self.pending_opt], dtype=dtype))
        self.pending = []
        self.pending_opt = []

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
        for name, col in self.cols.items():
            a = arrays.get(name)
            if a is None:
                dtype, default = OPTIONAL_COLUMNS[name]
                col.fill(default, count)
            else:
                col.append(a)
        self.n += count


class _Sink:
    """Receives trace entries and interns what they name."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self.interner = Interner()
        self.devices: dict[int, _DeviceColumns] = {}
        self.action_names = list(ACTIONS)
        self._action_codes = {a: i for i, a in enumerate(ACTIONS)}
        self.category_names = list(PROFILER_CATEGORIES)
        self._category_codes = {c: i for i, c in enumerate(PROFILER_CATEGORIES)}
        self._list_stack_ids: dict[int, int] = {}  # id(python list) -> stack id
        self._keep_alive: list = []

    def path_for(self, device: int, column: str) -> str | None:
        if self.directory is None:
            return None
        import os
        return os.path.join(self.directory, f"d{device}_{column}.bin")

    def device(self, device: int) -> _DeviceColumns:
        d = self.devices.get(device)
        if d is None:
            d = self.devices[device] = _DeviceColumns(self, device)
        return d

    def action_code(self, name) -> int:
        code = self._action_codes.get(name)
        if code is None:
            if len(self.action_names) >= A_UNKNOWN:
                return A_UNKNOWN
            code = self._action_codes[name] = len(self.action_names)
            self.action_names.append(str(name))
        return code

    def category_code(self, name) -> int:
        code = self._category_codes.get(name)
        if code is None:
            if len(self.category_names) >= 255:
                return self._category_codes["unknown"]
            code = self._category_codes[name] = len(self.category_names)
            self.category_names.append(str(name))
        return code

    def stack_of(self, frames) -> int:
        """Intern a frames value the interpreter built (list of frame dicts)."""
        if frames is None:
            return -1
        if isinstance(frames, _StackRef):
            return frames.sid
        if not isinstance(frames, list):
            return -1
        key = id(frames)
        sid = self._list_stack_ids.get(key)
        if sid is None:
            it = self.interner
            sid = it.stack(it.frame_of_dict(f) for f in frames)
            self._list_stack_ids[key] = sid
            self._keep_alive.append(frames)  # keep id() stable
        return sid

    def add_entry(self, device: int, e) -> None:
        if not isinstance(e, dict):
            raise CorruptError(f"trace entry of device {device} is a {type(e).__name__}, not a dict")
        dev = self.device(device)
        opt = {}
        extra = None
        for k, v in e.items():
            if k in ("action", "addr", "size", "stream", "time_us", "frames"):
                continue
            if k == "category" and isinstance(v, str):
                opt["category"] = self.category_code(v)
            elif k in ("compile_context", "user_metadata") and isinstance(v, str):
                opt[k] = self.interner.string(v)
            elif k == "forward_frames" and isinstance(v, (list, _StackRef)):
                opt["forward_stack"] = self.stack_of(v)
            elif k == "pool_id" and isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, int) for x in v):
                opt["pool_a"], opt["pool_b"] = v
            else:
                if extra is None:
                    extra = {}
                extra[str(k)] = _jsonable(v, self)
        if extra:
            dev.extras[dev.n] = extra
        row = (
            self.action_code(e.get("action")),
            _int_or(e.get("addr"), 0),
            _int_or(e.get("size"), 0),
            _int_or(e.get("stream"), 0),
            _int_or(e.get("time_us"), -1),
            self.stack_of(e.get("frames")),
        )
        dev.add_row(row, opt)

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


def _int_or(v, default: int) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        if -(1 << 63) <= v < (1 << 63):
            return v
        return (v & ((1 << 64) - 1)) - (1 << 64) if v >= (1 << 63) else default
    return default


def _jsonable(v, sink: _Sink, depth: int = 0):
    if depth > 20:
        return None
    if v is None or isinstance(v, (bool, str, float)):
        return v
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 64) else str(v)
    if isinstance(v, _StackRef):
        return {"stack": v.sid}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x, sink, depth + 1) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x, sink, depth + 1) for k, x in v.items()}
    return repr(v)[:200]


# --------------------------------------------------------------------------- #
# The vectorized fast path
# --------------------------------------------------------------------------- #

_OP_K, _OP_M, _OP_J, _OP_LONG1 = 0x4B, 0x4D, 0x4A, 0x8A
_OP_H, _OP_JJ = 0x68, 0x6A          # BINGET, LONG_BINGET
_OP_SHORTSTR, _OP_MEMOIZE = 0x8C, 0x94
_OP_EMPTY_LIST, _OP_MARK, _OP_APPENDS, _OP_APPEND, _OP_SETITEMS = 0x5D, 0x28, 0x65, 0x61, 0x75


def _memo_ref_bytes(idx: int) -> bytes:
    # CPython's pickler writes BINGET below 256 and LONG_BINGET from there on.
    return bytes((_OP_H, idx)) if idx < 256 else bytes((_OP_JJ,)) + struct.pack("<I", idx)


def _merge_shapes(old: tuple | None, new: tuple) -> tuple:
    """One key order covering both shapes (every key after the first is optional),
    or just `new` when the two disagree on order or on the first key."""
    if not old or old[0] != new[0]:
        return new
    merged = list(old)
    prev = 0
    for key in new:
        if key in merged:
            prev = merged.index(key)
        else:
            prev += 1
            merged.insert(prev, key)
    order = [merged.index(k) for k in new]
    if order != sorted(order):
        return new
    return tuple(merged)


def _decode_refs(op, win8, pos):
    """BINGET / LONG_BINGET at each of `pos` (opcode bytes `op`): (is BINGET, is
    LONG_BINGET, the memo index either would name)."""
    is_h = op == _OP_H
    is_jj = op == _OP_JJ
    u1 = win8[pos + 1]
    ref = np.where(is_h, (u1 & np.uint64(0xFF)).astype(np.int64), (u1 & np.uint64(0xFFFFFFFF)).astype(np.int64))
    return is_h, is_jj, ref


def _decode_ints(arr, win8, pos):
    """Decode the int opcode at each of `pos` (BININT1/BININT2/BININT/LONG1 up to 8
    bytes): returns (values int64, widths in bytes, which ones were ints)."""
    op = arr[pos]
    u1 = win8[pos + 1]
    n = arr[pos + 1].astype(np.int64)
    is_k = op == _OP_K
    is_m = op == _OP_M
    is_j = op == _OP_J
    is_l = (op == _OP_LONG1) & (n <= 8)
    val = np.zeros(len(pos), dtype=np.int64)
    val = np.where(is_k, (u1 & np.uint64(0xFF)).astype(np.int64), val)
    val = np.where(is_m, (u1 & np.uint64(0xFFFF)).astype(np.int64), val)
    val = np.where(is_j, (u1 & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32).astype(np.int64), val)
    if is_l.any():
        u2 = win8[pos + 2]
        shift = (64 - 8 * np.clip(n, 1, 8)).astype(np.uint64)
        lv = (u2 << shift).view(np.int64) >> shift.astype(np.int64)
        lv = np.where(n == 0, 0, lv)
        val = np.where(is_l, lv, val)
    width = np.where(is_k, 2, np.where(is_m, 3, np.where(is_j, 5, 2 + n)))
    return val, width, is_k | is_m | is_j | is_l


class _FastPath:
    """Decodes runs of same-shape trace entries with numpy, thousands at a time."""

    def __init__(self, reader: "_Reader"):
        self.r = reader
        self.shape: tuple | None = None
        self.key_map: dict[str, bytes] = {}
        self.key_bytes: list[bytes] = []
        self.prefix = b""
        self._cands: dict[bytes, np.ndarray] = {}
        self._cands_gen = -1
        self._skip = 0
        self._penalty = 1
        self._batch = 256
        self.entries = 0

    def learn(self, keys: tuple) -> None:
        """Take the key order and key reference bytes from a trace entry the
        interpreter just built (`keys` are the dict's own key objects)."""
        r = self.r
        refs = {}
        for k in keys:
            if type(k) is not str or k not in _FAST_KINDS:
                return
            idx = r.key_memo_by_id.get(id(k))
            if idx is None:
                return
            refs[k] = _memo_ref_bytes(idx)
        names = tuple(keys)
        if not names:
            return
        if names == self.shape and all(self.key_map[k] == refs[k] for k in names):
            return
        if self.shape and all(self.key_map.get(k, v) == v for k, v in refs.items()):
            merged = _merge_shapes(self.shape, names)
            key_map = {**self.key_map, **refs}
        else:
            merged, key_map = names, refs
        self.shape = merged
        self.key_map = key_map
        self.key_bytes = [key_map[k] for k in merged]
        self.prefix = b"}\x94(" + self.key_bytes[0]

    def _candidates(self):
        r = self.r
        if self._cands_gen != r.generation:
            self._cands = {}
            self._cands_gen = r.generation
        got = self._cands.get(self.prefix)
        if got is None:
            arr = r.arr
            end = r.data_end
            z = np.flatnonzero(arr[:end] == 0x7D)
            pre = np.frombuffer(self.prefix, dtype=np.uint8)
            z = z[z + len(pre) <= end]
            ok = np.ones(len(z), dtype=bool)
            for i in range(1, len(pre)):
                ok &= arr[z + i] == pre[i]
            got = self._cands[self.prefix] = z[ok]
        return got

    def run(self, p0: int, device: int) -> int:
        """Decode entries starting at `p0`; return the position after the last one."""
        if self.shape is None:
            return p0
        if self._skip:
            self._skip -= 1
            return p0
        cands = self._candidates()
        i0 = int(np.searchsorted(cands, p0))
        if i0 >= len(cands) or cands[i0] != p0:
            return p0
        c = cands[i0:i0 + self._batch].astype(np.int64)
        n, end_pos = self._decode(c, device)
        if n < 16:
            self._skip = self._penalty
            self._penalty = min(self._penalty * 2, 512)
            self._batch = 256
        else:
            self._penalty = 1
            if n == len(c):
                self._batch = min(self._batch * 4, 16384)
        return end_pos if n else p0

    def _decode(self, c: np.ndarray, device: int):
        r = self.r
        arr = r.arr
        win8 = r.win8
        data_end = r.data_end
        k = len(c)
        pos = c + 3                      # after EMPTY_DICT MEMOIZE MARK
        ok = np.ones(k, dtype=bool)
        memo_inc = np.ones(k, dtype=np.int64)   # the entry dict itself
        fields = {}
        for fi, (key, kb) in enumerate(zip(self.shape, self.key_bytes)):
            # The key reference. Every key but the first may be absent from an
            # entry (torch leaves out frames on `snapshot` entries, forward_frames
            # off the backward pass...): present where its bytes match.
            present = np.ones(k, dtype=bool)
            for j, byte in enumerate(kb):
                present &= arr[pos + j] == byte
            if fi == 0:
                ok &= present
            vpos = np.where(present, pos + len(kb), c)   # absent: any in-range position
            op = arr[vpos]
            kind = _FAST_KINDS[key]
            if kind == "int":
                val, width, good = _decode_ints(arr, win8, vpos)
                after = vpos + width
                fields[key] = (val, present)
            elif kind == "tuple2":
                # inline `int int TUPLE2 MEMOIZE` (a fresh tuple per entry), or a memo ref
                is_h, is_jj, ref = _decode_refs(op, win8, vpos)
                a_val, a_w, a_ok = _decode_ints(arr, win8, vpos)
                p2 = np.minimum(vpos + a_w, data_end)
                b_val, b_w, b_ok = _decode_ints(arr, win8, p2)
                p3 = np.minimum(p2 + b_w, data_end)
                is_inline = a_ok & b_ok & (arr[p3] == 0x86) & (arr[p3 + 1] == _OP_MEMOIZE) & present
                good = is_h | is_jj | is_inline
                fields[key] = (ref, is_inline, a_val, b_val, memo_inc.copy(), present)
                memo_inc = memo_inc + is_inline
                after = np.where(is_inline, p3 + 2, np.where(is_h, vpos + 2, vpos + 5))
            elif kind == "str":
                is_h, is_jj, ref = _decode_refs(op, win8, vpos)
                slen = arr[vpos + 1].astype(np.int64)
                is_s = (op == _OP_SHORTSTR) & present
                is_s &= arr[np.minimum(vpos + 2 + slen, len(arr) - 1)] == _OP_MEMOIZE
                good = is_h | is_jj | is_s
                fields[key] = (ref, is_s, vpos + 2, slen, memo_inc.copy(), present)
                memo_inc = memo_inc + is_s
                after = np.where(is_h, vpos + 2, np.where(is_jj, vpos + 5, vpos + 3 + slen))
            else:  # list of frames: a memo ref, or an inline list of memo refs
                is_h, is_jj, ref = _decode_refs(op, win8, vpos)
                is_inline = (op == _OP_EMPTY_LIST) & (arr[vpos + 1] == _OP_MEMOIZE) & present
                start = vpos + 2
                stop = start.copy()
                after = np.where(is_h, vpos + 2, np.where(is_jj, vpos + 5, vpos))
                lst_ok = np.ones(k, dtype=bool)
                if is_inline.any():
                    nxt = arr[start]
                    multi = is_inline & (nxt == _OP_MARK)
                    single = is_inline & ((nxt == _OP_H) | (nxt == _OP_JJ))
                    single_w = np.where(nxt == _OP_H, 2, 5)
                    single_ok = single & (arr[start + single_w] == _OP_APPEND)
                    empty = is_inline & ~multi & ~single    # `]\x94`: nothing more belongs to it
                    # walk the refs of multi-element lists, all lists at once
                    p = np.where(multi, start + 1, 0)
                    active = np.flatnonzero(multi)
                    lst_end = np.zeros(k, dtype=np.int64)
                    while len(active):
                        pa = p[active]
                        o = arr[pa]
                        done = o == _OP_APPENDS
                        step = (o == _OP_H) | (o == _OP_JJ)
                        bad = ~done & ~step
                        if bad.any():
                            lst_ok[active[bad]] = False
                        lst_end[active[done]] = pa[done]
                        p[active[step]] = pa[step] + np.where(o[step] == _OP_H, 2, 5)
                        active = active[step]
                        active = active[p[active] < data_end]
                    lst_ok &= ~(multi & (lst_end == 0))
                    lst_ok &= ~single | single_ok
                    start = np.where(multi, start + 1, start)
                    stop = np.where(multi, lst_end, np.where(single, start + single_w, start))
                    after = np.where(multi, lst_end + 1,
                                     np.where(single, start + single_w + 1, np.where(empty, start, after)))
                good = (is_h | is_jj | is_inline) & lst_ok
                fields[key] = (ref, is_inline, start, stop, memo_inc.copy(), present)
                memo_inc = memo_inc + is_inline
            ok &= ~present | good
            pos = np.where(present, after, pos)
            over = pos > data_end
            ok &= ~over
            pos = np.minimum(pos, data_end)
        ok &= arr[pos] == _OP_SETITEMS
        end = pos + 1
        ok &= end <= data_end
        # Entries must chain: each ends where the next begins, possibly across an
        # APPENDS MARK pair (a new batch of 1000; nothing is pending on the stack).
        if k > 1:
            link = (end[:-1] == c[1:]) | ((end[:-1] + 2 == c[1:]) & (arr[end[:-1]] == _OP_APPENDS)
                                          & (arr[end[:-1] + 1] == _OP_MARK))
            good_chain = ok.copy()
            good_chain[1:] &= link
        else:
            good_chain = ok
        bad = np.flatnonzero(~good_chain)
        n = int(bad[0]) if len(bad) else k
        if n == 0:
            return 0, c[0]
        self._emit(device, n, fields, memo_inc, c)
        return n, int(end[n - 1])

    _DEFAULTS = {"addr": 0, "size": 0, "stream": 0, "time_us": -1}

    def _emit(self, device, n, fields, memo_inc, c):
        r = self.r
        sink = r.sink
        base = r.memo_count
        dict_idx = base + np.concatenate(([0], np.cumsum(memo_inc[:n - 1])))
        r.memo_count = base + int(memo_inc[:n].sum())
        r.grow_memo_fast(r.memo_count)
        out = {}
        # Inline strings, lists and tuples first, for every field: a later entry
        # of this same batch may refer to them by memo.
        inline_ids = {}
        for key in self.shape:
            kind = _FAST_KINDS[key]
            if kind == "str":
                ref, is_s, sstart, slen, off, _ = (x[:n] for x in fields[key])
                inline_ids[key] = self._inline_strings(is_s, sstart, slen, dict_idx + off)
            elif kind == "list":
                ref, inline, start, stop, off, _ = (x[:n] for x in fields[key])
                inline_ids[key] = self._inline_stacks(inline, start, stop, dict_idx + off)
            elif kind == "tuple2":
                ref, inline, a_val, b_val, off, _ = (x[:n] for x in fields[key])
                self._inline_tuples(inline, a_val, b_val, dict_idx + off)
        for key in self.shape:
            kind = _FAST_KINDS[key]
            v = fields[key]
            present = v[-1][:n]
            if kind == "int":
                out[key] = np.where(present, v[0][:n], self._DEFAULTS.get(key, 0))
            elif kind == "tuple2":
                ref, inline, a_val, b_val = (x[:n] for x in v[:4])
                a_val = np.where(present, a_val, -1)
                b_val = np.where(present, b_val, -1)
                for i in np.flatnonzero(present & ~inline).tolist():
                    t = r.memo_get(int(ref[i]))
                    ok_t = isinstance(t, tuple) and len(t) == 2 and all(isinstance(x, int) for x in t)
                    a_val[i], b_val[i] = (_int_or(t[0], -1), _int_or(t[1], -1)) if ok_t else (-1, -1)
                out["pool_a"], out["pool_b"] = a_val, b_val
            elif kind == "str":
                ref, is_s = v[0][:n], v[1][:n]
                ids = self._ref_strings(ref, is_s | ~present, inline_ids[key])
                ids[~present] = -1
                if key == "action":
                    out["action"] = self._action_codes(ids)
                elif key == "category":
                    out["category"] = np.asarray([sink.category_code(sink.interner.strings[i]) if i >= 0 else 0
                                                  for i in ids.tolist()], dtype=np.uint8)
                else:
                    out[key] = ids.astype(np.int32)
            else:
                ref, inline = v[0][:n], v[1][:n]
                sids = self._ref_stacks(ref, inline | ~present, inline_ids[key])
                sids[~present] = -1
                out["stack" if key == "frames" else "forward_stack"] = sids
        if "time_us" not in out:
            out["time_us"] = np.full(n, -1, dtype=np.int64)
        if "stack" not in out:
            out["stack"] = np.full(n, -1, dtype=np.int32)
        for k2 in ("addr", "size", "stream"):
            if k2 not in out:
                out[k2] = np.zeros(n, dtype=np.int64)
        sink.device(device).add_arrays(out, n)
        self.entries += n

    def _inline_tuples(self, inline, a_val, b_val, memo_idx) -> None:
        """Record inline pool tuples by memo without a Python object per entry:
        the distinct tuples are few; memo_fast holds a code into `pool_tuples`."""
        if not inline.any():
            return
        r = self.r
        pairs = np.stack([a_val[inline], b_val[inline]], axis=1)
        uniq, inv = np.unique(pairs, axis=0, return_inverse=True)
        codes = np.asarray([r.pool_code((int(x), int(y))) for x, y in uniq], dtype=np.int64)
        r.memo_fast[memo_idx[inline]] = (_POOL_BASE - codes[inv.reshape(-1)]).astype(np.int32)

    def _inline_strings(self, is_inline, sstart, slen, memo_idx) -> np.ndarray:
        r = self.r
        ids = np.full(len(is_inline), -1, dtype=np.int64)
        if is_inline.any():
            where = np.flatnonzero(is_inline)
            buf = r.buf
            it = r.sink.interner
            got = [it.string(buf[a:a + ln].decode("utf-8", "surrogatepass"))
                   for a, ln in zip(sstart[where].tolist(), slen[where].tolist())]
            ids[where] = got
            r.memo_fast[memo_idx[where]] = -2 - np.asarray(got, dtype=np.int64)
        return ids

    def _ref_strings(self, ref, is_inline, ids) -> np.ndarray:
        """String ids for values given by memo reference (inline ones are in `ids`)."""
        r = self.r
        refd = ~is_inline
        if refd.any():
            uniq, inv = np.unique(ref[refd], return_inverse=True)
            vals = np.asarray([r.string_id_of_memo(int(m)) for m in uniq], dtype=np.int64)
            ids[refd] = vals[inv]
        return ids

    def _action_codes(self, string_ids: np.ndarray) -> np.ndarray:
        sink = self.r.sink
        uniq, inv = np.unique(string_ids, return_inverse=True)
        codes = np.asarray([sink.action_code(sink.interner.strings[i]) if i >= 0 else A_UNKNOWN
                            for i in uniq.tolist()], dtype=np.uint8)
        return codes[inv]

    def _inline_stacks(self, inline, start, stop, memo_idx) -> np.ndarray:
        """Intern inline frames lists by their raw bytes (memo refs to frame dicts)."""
        r = self.r
        sids = np.full(len(inline), -1, dtype=np.int32)
        if inline.any():
            where = np.flatnonzero(inline)
            buf = r.buf
            by_bytes = r.stack_by_bytes
            get = by_bytes.get
            a_list = start[where].tolist()
            b_list = stop[where].tolist()
            out = [get(buf[a:b], -1) for a, b in zip(a_list, b_list)]
            if -1 in out:
                for i, sid in enumerate(out):
                    if sid == -1:
                        key = buf[a_list[i]:b_list[i]]
                        sid = by_bytes.get(key)
                        if sid is None:
                            sid = by_bytes[key] = r.stack_from_ref_bytes(key)
                        out[i] = sid
            out = np.asarray(out, dtype=np.int32)
            sids[where] = out
            r.memo_fast[memo_idx[where]] = out
        return sids

    def _ref_stacks(self, ref, inline, sids) -> np.ndarray:
        r = self.r
        refd = ~inline
        if refd.any():
            m = ref[refd]
            mf = r.memo_fast
            got = np.where(m < len(mf), mf[np.minimum(m, len(mf) - 1)], -1)
            miss = got < 0
            if miss.any():
                uniq, inv = np.unique(m[miss], return_inverse=True)
                vals = np.asarray([r.stack_id_of_memo(int(x)) for x in uniq], dtype=np.int64)
                got[miss] = vals[inv]
            sids[refd] = got
        return sids


# --------------------------------------------------------------------------- #
# The general interpreter
# --------------------------------------------------------------------------- #

class _Reader:
    def __init__(self, fh: BinaryIO, size: int, sink: _Sink, progress: Progress | None):
        self.fh = fh
        self.size = size
        self.sink = sink
        self.progress = progress
        self.buf = b""
        self.base = 0              # file offset of buf[0]
        self.data_end = 0
        self.eof = False
        self.generation = 0
        self.arr = np.zeros(PAD, dtype=np.uint8)
        self.win8 = None
        self.memo: dict[int, object] = {}
        self.memo_count = 0
        self.memo_fast = np.full(1024, -1, dtype=np.int32)
        # memo index of each key string object (entry keys are referenced by memo)
        self.key_memo_by_id: dict[int, int] = {}
        self.stack_by_bytes: dict[bytes, int] = {}
        self.pool_tuples: list[tuple] = []        # distinct pool_id tuples the fast path decoded
        self._pool_codes: dict[tuple, int] = {}
        self._frame_of_memo: dict[int, int] = {}
        self.fast = _FastPath(self)
        self.top = None
        self.traces: _TracesList | None = None
        self.protocol = None

    # -- buffer -------------------------------------------------------------
    def refill(self, pos: int, need: int) -> int:
        """Make at least `need` bytes available from `pos`; return the new pos."""
        keep = self.buf[pos:self.data_end]
        want = max(CHUNK, need - len(keep))
        chunk = self.fh.read(want)
        if len(chunk) < want:
            self.eof = True
        self.base += pos
        self.buf = keep + chunk + bytes(PAD)
        self.data_end = len(self.buf) - PAD
        self.generation += 1
        self.arr = np.frombuffer(self.buf, dtype=np.uint8)
        # an (n, 8) window for reading little-endian 8-byte words at any offset
        n8 = len(self.arr) - 7
        win = np.lib.stride_tricks.as_strided(self.arr, shape=(max(n8, 0), 8), strides=(1, 1))
        self.win8 = _Win8(win)
        if self.progress is not None:
            self.progress.update(getattr(self.fh, "raw_pos", self.base))
        return 0

    def grow_memo_fast(self, count: int) -> None:
        if count > len(self.memo_fast):
            new = np.full(max(count, 2 * len(self.memo_fast)), -1, dtype=np.int32)
            new[:len(self.memo_fast)] = self.memo_fast
            self.memo_fast = new

    # -- memo resolution for the fast path --------------------------------------
    def memo_get(self, idx: int):
        obj = self.memo.get(idx, _MARK)
        if obj is not _MARK:
            return obj
        if idx < len(self.memo_fast):
            v = int(self.memo_fast[idx])
            if v >= 0:
                return _StackRef(v)
            if v <= _POOL_BASE:
                return self.pool_tuples[_POOL_BASE - v]
            if v <= -2:
                return self.sink.interner.strings[-2 - v]
        raise CorruptError(f"memo reference {idx} to an object never stored")

    def pool_code(self, t: tuple) -> int:
        code = self._pool_codes.get(t)
        if code is None:
            code = self._pool_codes[t] = len(self.pool_tuples)
            self.pool_tuples.append(t)
        return code

    def string_id_of_memo(self, idx: int) -> int:
        obj = self.memo_get(idx)
        if not isinstance(obj, str):
            raise CorruptError(f"expected a string at memo {idx}")
        return self.sink.interner.string(obj)

    def stack_id_of_memo(self, idx: int) -> int:
        obj = self.memo_get(idx)
        sid = self.sink.stack_of(obj)
        if sid < 0:
            raise CorruptError(f"expected a frames list at memo {idx}")
        if idx < len(self.memo_fast):
            self.memo_fast[idx] = sid
        return sid

    def stack_from_ref_bytes(self, b: bytes) -> int:
        it = self.sink.interner
        fids = []
        i, n = 0, len(b)
        fom = self._frame_of_memo
        while i < n:
            if b[i] == _OP_H:
                idx = b[i + 1]
                i += 2
            else:
                idx = int.from_bytes(b[i + 1:i + 5], "little")
                i += 5
            fid = fom.get(idx)
            if fid is None:
                fid = fom[idx] = it.frame_of_dict(self.memo_get(idx))
            fids.append(fid)
        return it.stack(fids)

    # -- the opcode loop -----------------------------------------------------------
    def run(self):
        self.refill(0, 1)
        if self.data_end == 0:
            raise NotASnapshotError("empty file")
        if self.buf[0] != 0x80:
            head = self.buf[:4]
            if head.startswith(b"PK"):
                raise NotASnapshotError("a zip archive, not a pickled memory snapshot (torch.save files are zips)")
            raise NotASnapshotError(f"not a pickle of protocol 2 or later (starts with {head!r})")
        buf = self.buf
        pos = 0
        stack: list = []
        metastack: list[list] = []
        memo = self.memo
        fast = self.fast
        unpack_from = struct.unpack_from
        while True:
            if pos + _MARGIN > self.data_end and not self.eof:
                pos = self.refill(pos, _MARGIN)
                buf = self.buf
            if pos >= self.data_end:
                raise TruncatedError(f"file ends at byte {self.base + pos} before the pickle's STOP")
            op = buf[pos]
            pos += 1
            if op == 0x94:                                   # MEMOIZE
                if not stack:
                    raise CorruptError("MEMOIZE on an empty stack")
                obj = stack[-1]
                memo[self.memo_count] = obj
                if type(obj) is str and obj in _KNOWN_ENTRY_KEYS:
                    self.key_memo_by_id[id(obj)] = self.memo_count
                self.memo_count += 1
            elif op == 0x68 or op == 0x6A:                   # BINGET, LONG_BINGET
                if op == 0x68:
                    idx = buf[pos]
                    pos += 1
                else:
                    idx = unpack_from("<I", buf, pos)[0]
                    pos += 4
                obj = memo.get(idx, _MARK)
                stack.append(obj if obj is not _MARK else self.memo_get(idx))
            elif op == 0x28:                                 # MARK
                if len(metastack) >= MAX_MARK_DEPTH:
                    raise LimitError(f"nesting deeper than {MAX_MARK_DEPTH} levels")
                metastack.append(stack)
                stack = []
            elif op == 0x7D:                                 # EMPTY_DICT
                if metastack and metastack[-1] and type(metastack[-1][-1]) is _TraceList:
                    tl = metastack[-1][-1]
                    if stack:
                        tl.extend(stack)
                        stack.clear()
                    newpos = fast.run(pos - 1, tl.device)
                    if newpos > pos - 1:
                        pos = newpos
                        continue
                stack.append({})
            elif op == 0x75:                                 # SETITEMS
                if not metastack:
                    raise CorruptError("SETITEMS without MARK")
                items = stack
                stack = metastack.pop()
                if not stack or type(stack[-1]) is not dict or len(items) % 2:
                    raise CorruptError("SETITEMS on something that is not a dict")
                d = stack[-1]
                try:
                    for i in range(0, len(items), 2):
                        d[items[i]] = items[i + 1]
                except TypeError:
                    raise CorruptError("unhashable dict key") from None
                if metastack and metastack[-1] and type(metastack[-1][-1]) is _TraceList:
                    fast_learn(self, d)
                    # Stream out the entries before this one: torch's C++ pickler
                    # writes a whole trace as one MARK...APPENDS, which must not pile
                    # up on the stack. (This one stays: the C++ pickler PUTs a dict
                    # into the memo after it is complete.)
                    if len(stack) > 1:
                        metastack[-1][-1].extend(stack[:-1])
                        del stack[:-1]
            elif op == 0x4B:                                 # BININT1
                stack.append(buf[pos])
                pos += 1
            elif op == 0x4A:                                 # BININT
                stack.append(unpack_from("<i", buf, pos)[0])
                pos += 4
            elif op == 0x4D:                                 # BININT2
                stack.append(unpack_from("<H", buf, pos)[0])
                pos += 2
            elif op == 0x8A:                                 # LONG1
                n = buf[pos]
                stack.append(int.from_bytes(buf[pos + 1:pos + 1 + n], "little", signed=True))
                pos += 1 + n
            elif op == 0x8C:                                 # SHORT_BINUNICODE
                n = buf[pos]
                s = _decode(buf, pos + 1, n)
                stack.append(s)
                pos += 1 + n
                if len(stack) <= 4:
                    self._check_top_key(stack, metastack, s)
            elif op == 0x5D:                                 # EMPTY_LIST
                stack.append(self._new_list(stack, metastack))
            elif op == 0x65:                                 # APPENDS
                if not metastack:
                    raise CorruptError("APPENDS without MARK")
                items = stack
                stack = metastack.pop()
                if not stack or not isinstance(stack[-1], list):
                    raise CorruptError("APPENDS on something that is not a list")
                stack[-1].extend(items)
            elif op == 0x61:                                 # APPEND
                if len(stack) < 2 or not isinstance(stack[-2], list):
                    raise CorruptError("APPEND on something that is not a list")
                v = stack.pop()
                stack[-1].append(v)
            elif op == 0x73:                                 # SETITEM
                if len(stack) < 3 or type(stack[-3]) is not dict:
                    raise CorruptError("SETITEM on something that is not a dict")
                v = stack.pop()
                k = stack.pop()
                try:
                    stack[-1][k] = v
                except TypeError:
                    raise CorruptError("unhashable dict key") from None
            elif op == 0x58 or op == 0x8D:                   # BINUNICODE, BINUNICODE8
                if op == 0x58:
                    n = unpack_from("<I", buf, pos)[0]
                    pos += 4
                else:
                    n = unpack_from("<Q", buf, pos)[0]
                    pos += 8
                if n > MAX_STRING:
                    raise LimitError(f"a string of {n} bytes declared at byte {self.base + pos}; "
                                     f"no snapshot has strings over {MAX_STRING >> 20} MiB")
                if pos + n > self.data_end:
                    if self.eof:
                        raise TruncatedError(f"file ends inside a string at byte {self.base + pos}")
                    pos = self.refill(pos, n)
                    buf = self.buf
                    if pos + n > self.data_end:
                        raise TruncatedError(f"file ends inside a string at byte {self.base + pos}")
                s = _decode(buf, pos, n)
                stack.append(s)
                pos += n
                if len(stack) <= 4:
                    self._check_top_key(stack, metastack, s)
            elif op == 0x71 or op == 0x72:                   # BINPUT, LONG_BINPUT
                if op == 0x71:
                    idx = buf[pos]
                    pos += 1
                else:
                    idx = unpack_from("<I", buf, pos)[0]
                    pos += 4
                if not stack:
                    raise CorruptError("PUT on an empty stack")
                if idx not in memo:
                    self.memo_count += 1
                obj = stack[-1]
                if not (type(obj) is dict and metastack and metastack[-1]
                        and type(metastack[-1][-1]) is _TraceList):
                    memo[idx] = obj   # (nothing refers back to a trace entry: don't keep one per event)
                if type(obj) is str and obj in _KNOWN_ENTRY_KEYS:
                    self.key_memo_by_id[id(obj)] = idx
            elif op == 0x86:                                 # TUPLE2
                if len(stack) < 2:
                    raise CorruptError("TUPLE2 on a short stack")
                b = stack.pop()
                stack[-1] = (stack[-1], b)
            elif op == 0x89:                                 # NEWFALSE
                stack.append(False)
            elif op == 0x88:                                 # NEWTRUE
                stack.append(True)
            elif op == 0x4E:                                 # NONE
                stack.append(None)
            elif op == 0x95:                                 # FRAME (a hint only)
                pos += 8
            elif op == 0x47:                                 # BINFLOAT
                stack.append(unpack_from(">d", buf, pos)[0])
                pos += 8
            elif op == 0x29:                                 # EMPTY_TUPLE
                stack.append(())
            elif op == 0x85:                                 # TUPLE1
                if not stack:
                    raise CorruptError("TUPLE1 on an empty stack")
                stack[-1] = (stack[-1],)
            elif op == 0x87:                                 # TUPLE3
                if len(stack) < 3:
                    raise CorruptError("TUPLE3 on a short stack")
                c3 = stack.pop()
                b = stack.pop()
                stack[-1] = (stack[-1], b, c3)
            elif op == 0x74:                                 # TUPLE
                if not metastack:
                    raise CorruptError("TUPLE without MARK")
                t = tuple(stack)
                stack = metastack.pop()
                stack.append(t)
            elif op == 0x8B:                                 # LONG4
                n = unpack_from("<i", buf, pos)[0]
                if n < 0 or n > MAX_LONG_BYTES:
                    raise LimitError(f"an integer of {n} bytes declared")
                stack.append(int.from_bytes(buf[pos + 4:pos + 4 + n], "little", signed=True))
                pos += 4 + n
            elif op == 0x80:                                 # PROTO
                proto = buf[pos]
                pos += 1
                if proto > 5:
                    raise UnsupportedPickleError(f"pickle protocol {proto} is newer than any Python writes")
                self.protocol = proto
            elif op == 0x2E:                                 # STOP
                if pos > self.data_end:
                    raise TruncatedError("file ends inside the last opcode")
                if len(stack) != 1 or metastack:
                    raise CorruptError("the pickle stops with an unbalanced stack")
                self.top = stack[0]
                self.end_pos = self.base + pos
                return self.top
            elif op in _UNSAFE:
                raise UnsafePickleError(
                    f"refusing opcode {_UNSAFE[op]} at byte {self.base + pos - 1}: it would import or call "
                    "code, which no memory snapshot does")
            else:
                raise UnsupportedPickleError(
                    f"opcode 0x{op:02x} at byte {self.base + pos - 1} is not used by torch memory snapshots")
            if len(stack) > MAX_STACK:
                raise LimitError(f"more than {MAX_STACK} objects on one level of the pickle stack")
            if pos > self.data_end:
                if self.eof:
                    raise TruncatedError(f"file ends inside an opcode at byte {self.base + self.data_end}")
                raise CorruptError("an opcode runs past the read buffer")

    def _check_top_key(self, stack, metastack, s) -> None:
        # Fail early on pickles that are clearly something else, before building
        # a large unrelated object graph.
        if len(metastack) == 1 and len(stack) == 1 and len(metastack[0]) == 1 and type(metastack[0][0]) is dict \
                and self.top is None and not metastack[0][0]:
            if s not in ("segments", "device_traces", "allocator_settings", "external_annotations"):
                raise NotASnapshotError(f"a pickled dict whose first key is {s[:40]!r}, not a memory snapshot")

    def _new_list(self, stack, metastack):
        st = stack
        if self.traces is None:
            if (len(metastack) == 1 and len(metastack[0]) == 1 and type(metastack[0][0]) is dict
                    and st and len(st) % 2 == 1 and st[-1] == "device_traces"):
                self.traces = _TracesList()
                return self.traces
            return []
        if metastack and metastack[-1] and metastack[-1][-1] is self.traces:
            return _TraceList(len(self.traces) + len(st), self.sink)
        if st and st[-1] is self.traces:
            return _TraceList(len(self.traces), self.sink)
        return []


class _Deframed:
    """A file whose protocol-4 FRAME headers are dropped as it is read.

    FRAME is only a buffering hint (PEP 3154), but one every 64 KiB would end
    every run of the fast path. Headers sit at a chain of known offsets: each
    says how long its frame is. If the chain ever stops at something that is not
    a FRAME (a large string written unframed), we stop dropping and let the
    interpreter see any later FRAME opcodes, which it treats as no-ops.
    """

    def __init__(self, fh):
        self.fh = fh
        head = fh.read(2)
        self._pending = head
        self.active = len(head) == 2 and head[0] == 0x80 and head[1] >= 4
        self.raw_pos = len(head)
        self.next_frame = self.raw_pos

    def read(self, n: int) -> bytes:
        out = [self._pending] if self._pending else []
        got = len(self._pending)
        self._pending = b""
        fh = self.fh
        while got < n:
            if self.active and self.raw_pos == self.next_frame:
                hdr = fh.read(9)
                if len(hdr) == 9 and hdr[0] == 0x95:
                    self.raw_pos += 9
                    self.next_frame = self.raw_pos + int.from_bytes(hdr[1:], "little")
                    continue
                self.active = False
                out.append(hdr)
                got += len(hdr)
                self.raw_pos += len(hdr)
                if len(hdr) < 9:
                    break
                continue
            want = n - got
            if self.active:
                want = min(want, self.next_frame - self.raw_pos)
            data = fh.read(want)
            if not data:
                break
            out.append(data)
            got += len(data)
            self.raw_pos += len(data)
        return b"".join(out)


class _Win8:
    """`win8[pos]` -> the little-endian uint64 starting at each byte offset in `pos`."""
    __slots__ = ("win",)

    def __init__(self, win):
        self.win = win

    def __getitem__(self, pos):
        return np.ascontiguousarray(self.win[pos]).view("<u8").reshape(-1)


def fast_learn(reader: _Reader, d: dict) -> None:
    """After the interpreter completes a trace entry, teach the fast path its shape."""
    reader.fast.learn(tuple(d))


def _decode(buf: bytes, pos: int, n: int) -> str:
    try:
        return buf[pos:pos + n].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise CorruptError(f"invalid UTF-8 in a string at byte {pos}") from None


def read_pickle_stream(fh: BinaryIO, size: int, directory: str | None, progress: Progress | None = None):
    """Run the reader over an open file. Returns (top-level object, sink, reader)."""
    sink = _Sink(directory)
    reader = _Reader(_Deframed(fh), size, sink, progress)
    try:
        top = reader.run()
    except SnapshotError:
        sink.discard()
        raise
    except (IndexError, struct.error):
        sink.discard()
        raise TruncatedError("file ends inside an opcode") from None
    except RecursionError:
        sink.discard()
        raise LimitError("nesting too deep") from None
    except MemoryError:
        sink.discard()
        raise LimitError("the file asks for more memory than this machine has") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, UnicodeError) as e:
        # Untrusted bytes that slipped past the structural checks: still bad input.
        sink.discard()
        raise CorruptError(f"malformed pickle ({type(e).__name__})") from None
    except BaseException:
        sink.discard()
        raise
    return top, sink, reader
