"""The general pickle interpreter: an allow-list of opcodes, bounded, building only small parts.

It steps over the opcode stream itself (never `pickle.load`) and accepts only the
data-building opcodes torch's snapshots use (DESIGN.md §2). Anything that imports or calls
(GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, PERSID, EXT*) is refused the
moment it is read, before it can act; so is anything past the bounds of limits.py.

It builds Python objects only for the small parts of a snapshot (segments, settings,
annotations, first occurrences of frames) and for trace entries the fast path does not
take, which go to the sink one row each: `device_traces` is built from `TraceList`s that
stream their entries out instead of storing them. Whenever it meets the start of a trace
entry it offers the position to the fast path (fastpath.py), which may decode thousands
of entries at once and hand back the position after them.

The file is read in chunks, so peak memory does not grow with its size.
"""
from __future__ import annotations

import struct
import sys
from typing import Protocol

import numpy as np

from ..common.files import pread_at
from . import limits
from .errors import (CorruptError, LimitError, NotASnapshotError, TruncatedError, UnsafePickleError,
                     UnsupportedPickleError)
from .fastpath import _OP_H, POOL_BASE, FastPath, Win8, ref_indices
from .limits import MAX_LONG_BYTES, MAX_NESTING, MAX_STACK, MAX_STRING
from .progress import Progress
from .sink import EntryRef, TraceList, TracesList, TraceSink, is_frames
from .tables import COMPONENT_KEY, HOST_DEVICE
from .values import StackRef

CHUNK = 4 << 20              # bytes read at a time
PAD = 16                     # zero bytes after the data so vector reads never run off
_MARGIN = 1100               # bytes kept ahead of the interpreter: covers every fixed-size opcode
JUMP_AHEAD = 64 << 10        # bytes read after a jump past a helper's batch (the next is usually one too)

_UNSAFE = {
    0x63: "GLOBAL", 0x93: "STACK_GLOBAL", 0x52: "REDUCE", 0x62: "BUILD", 0x69: "INST",
    0x6f: "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x50: "PERSID", 0x51: "BINPERSID",
    0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4",
}

_KEY_MEMO_MAX = 4096
KNOWN_ENTRY_KEYS = frozenset(("action", "addr", "size", "stream", "time_us", "frames", "compile_context",
                              "user_metadata", "forward_frames", "category", "device_free", "pool_id",
                              "internal_metadata", COMPONENT_KEY))

_MISSING = object()


class ByteSource(Protocol):
    """What the interpreter reads from: a binary file, or `Deframed` over one."""
    def read(self, n: int, /) -> bytes: ...

    def skip(self, n: int, /) -> None: ...


class Interpreter:
    def __init__(self, fh: ByteSource, size: int, sink: TraceSink, progress: Progress | None,
                 fast: bool = True, source: tuple | None = None):
        self.fh = fh
        self.source = source       # (path, os.stat_result) of a plain file: a helper may read it too
        self.size = size
        self.sink = sink
        self.progress = progress
        self.buf = b""
        self.base = 0              # file offset of buf[0]
        self.data_end = 0
        self.eof = False
        self.generation = 0
        self.arr = np.zeros(PAD, dtype=np.uint8)
        self.win8: Win8 | None = None
        self.memo: dict[int, object] = {}
        self.memo_count = 0
        self.memo_limit = limits.memo_limit(size)
        # what the interpreter keeps: Python's allocated blocks since we began, plus items put
        # into containers (an item costs a pointer, beyond any block), checked every chunk
        self.objects_limit = limits.objects_limit(size)
        self.blocks_at_start = sys.getallocatedblocks()
        self.items = 0
        self.memo_fast = np.full(1024, -1, dtype=np.int32)
        # the memoized entry key strings by id: (the string, its memo index); the fast path finds
        # the key references of a trace entry there. By object, not by text: a file may memoize
        # another "addr" later (a hand-made oom entry), and entries go on naming the first one
        self.key_memo: dict[int, tuple[str, int]] = {}
        self.saw_put = False       # BINPUT/LONG_BINPUT seen: the fast path's memo numbering is off
        # depth of every tuple that holds a tuple (kept alive so that ids stay unique)
        self.tuple_depth: dict[int, tuple[int, tuple]] = {}
        sink.memo = self.memo
        self.stack_by_bytes: dict[bytes, int] = {}
        self.pool_tuples: list[tuple] = []        # distinct pool_id tuples the fast path decoded
        self._pool_codes: dict[tuple, int] = {}
        self._frame_of_memo: dict[int, int] = {}
        self.fast = FastPath(self)
        self.fast_enabled = fast
        self.top = None
        self.traces: TracesList | None = None
        self.host_traces: TraceList | None = None   # `host_traces` (2.14): streamed like a device's
        self.protocol = None

    def stop_helper(self) -> None:
        """Let the fast path's helper processes go, if any were started (done or not)."""
        if self.fast is not None:
            for h in self.fast.helpers:
                h.close()

    def _key_memoized(self, key: str, idx: int) -> None:
        """Record that memo slot `idx` holds the entry key string `key` (this object)."""
        km = self.key_memo
        if len(km) >= _KEY_MEMO_MAX:     # a file memoizing key strings over and over
            km.clear()
        km[id(key)] = (key, idx)

    def release(self) -> None:
        """Drop what only the reading needed (the memo, the fast path's tables, the last chunk):
        the reader and its fast path reference each other, so without this they would wait for
        the cyclic collector while the analysis runs (10 MB of memo codes at 10^6 events)."""
        self.memo = {}
        self.sink.memo = None
        self.memo_fast = np.zeros(0, dtype=np.int32)
        self.key_memo = {}
        self.tuple_depth = {}
        self.stack_by_bytes = {}
        self._frame_of_memo = {}
        self.buf = b""
        self.arr = np.zeros(PAD, dtype=np.uint8)
        self.win8 = None
        self.fast = None  # type: ignore[assignment]
        self.fast_enabled = False

    # -- buffer -------------------------------------------------------------
    def check_objects(self) -> None:
        kept = sys.getallocatedblocks() - self.blocks_at_start + self.items // 8
        if kept > self.objects_limit:
            raise limits.objects_exceeded(self.objects_limit)

    def refill(self, pos: int, need: int, ahead: int | None = None) -> int:
        """Make at least `need` bytes available from `pos` (reading a chunk, or `ahead` bytes,
        at least); return the new pos."""
        self.check_objects()
        keep = self.buf[pos:self.data_end]
        want = max(CHUNK if ahead is None else ahead, need - len(keep))
        parts = self.fh.read_parts(want, ahead) if hasattr(self.fh, "read_parts") else [self.fh.read(want)]
        got = sum(len(p) for p in parts)
        if got < want:
            self.eof = True
        self.base += pos
        self.buf = b"".join([keep, *parts, bytes(PAD)])      # one copy
        self.data_end = len(self.buf) - PAD
        self.generation += 1
        self.arr = np.frombuffer(self.buf, dtype=np.uint8)
        # for reading little-endian 8-byte words at any offset
        self.win8 = Win8(self.buf, len(self.arr) - 7)
        if self.progress is not None:
            self.progress.update(getattr(self.fh, "raw_pos", self.base))
        return 0

    def jump(self, to: int) -> int:
        """Go on reading at stream offset `to` (at or after what the interpreter has reached:
        what lies between was read elsewhere); return the position in the new buffer."""
        rel = to - self.base
        if rel <= self.data_end:
            return rel
        self.fh.skip(to - (self.base + self.data_end))
        self.base, self.buf, self.data_end = to, b"", 0
        # a little only: where a helper's batch begins here too (its part of the file, batch
        # after batch), the reader reads none of the bytes it decoded (a full chunk a jump read
        # 90% of a 10^7-entry file on the reader's thread, where the helpers had 58% of it);
        # where none does, the loop reads a chunk once this is used up
        return self.refill(0, _MARGIN, JUMP_AHEAD)

    def grow_memo_fast(self, count: int) -> None:
        if count > len(self.memo_fast):
            # (the old slots copied, only the new ones filled: each byte written once, where
            # filling all and then copying wrote the old part twice; 26 million slots at 10^7)
            old = len(self.memo_fast)
            new = np.empty(max(count, 2 * old), dtype=np.int32)
            new[:old] = self.memo_fast
            new[old:] = -1
            self.memo_fast = new

    # -- memo resolution for the fast path --------------------------------------
    def memo_get(self, idx: int):
        """The object in memo slot idx: the interpreter's own, a code the fast path left
        (a stack, a string, a pool tuple), or a trace entry already streamed out."""
        obj = self.memo.get(idx, _MISSING)
        if obj is not _MISSING:
            return obj
        if idx < len(self.memo_fast):
            v = int(self.memo_fast[idx])
            if v >= 0:
                return StackRef(v)
            if v <= POOL_BASE:
                return self.pool_tuples[POOL_BASE - v]
            if v <= -2:
                return self.sink.interner.strings[-2 - v]
        where = self.sink.entry_memo.find(idx)
        if where is not None:
            return EntryRef(*where)
        raise CorruptError(f"memo reference {idx} to an object never stored")

    def memo_kinds_ok(self, refs: np.ndarray, kind: str) -> np.ndarray:
        """For the fast path: whether each memo slot in `refs` (all below memo_count) holds
        a str ("str"), a frames list ("list") or a pair of ints ("tuple2"). What it learns
        about the interpreter's objects it records in memo_fast, so the next batch only
        looks there."""
        mf = self.memo_fast
        if int(refs.max()) < len(mf):
            codes = mf[refs]
        else:
            inside = refs < len(mf)
            codes = np.full(len(refs), -1, dtype=np.int32)
            codes[inside] = mf[refs[inside]]
        if kind == "str":
            ok = (codes <= -2) & (codes > POOL_BASE)
        elif kind == "list":
            ok = codes >= 0
        else:
            ok = codes <= POOL_BASE
        unknown = codes == -1
        if unknown.any():
            uniq, inv = np.unique(refs[unknown], return_inverse=True)
            got = np.fromiter((self._memo_kind_ok(int(m), kind) for m in uniq.tolist()), dtype=bool,
                              count=len(uniq))
            ok[unknown] = got[inv.reshape(-1)]
        return ok

    def _memo_kind_ok(self, idx: int, kind: str) -> bool:
        obj = self.memo.get(idx, _MISSING)
        if obj is _MISSING:
            return False
        inside = idx < len(self.memo_fast)
        if kind == "str":
            if type(obj) is not str:
                return False
            if inside:
                self.memo_fast[idx] = -2 - self.sink.string_id(obj)
            return True
        if kind == "list":
            if not is_frames(obj):
                return False
            sid = self.sink.stack_of(obj)
            if inside:
                self.memo_fast[idx] = sid
            return True
        if type(obj) is not tuple or len(obj) != 2 or type(obj[0]) is not int or type(obj[1]) is not int:
            return False
        if inside:
            self.memo_fast[idx] = POOL_BASE - self.pool_code(obj)
        return True

    def pool_code(self, t: tuple) -> int:
        code = self._pool_codes.get(t)
        if code is None:
            code = self._pool_codes[t] = len(self.pool_tuples)
            self.pool_tuples.append(t)
        return code

    def string_id_of_memo(self, idx: int) -> int:
        obj = self.memo_get(idx)
        if type(obj) is not str:
            raise CorruptError(f"expected a string at memo {idx}")
        return self.sink.string_id(obj)

    def stack_id_of_memo(self, idx: int) -> int:
        obj = self.memo_get(idx)
        sid = self.sink.stack_of(obj)
        if sid < 0:
            raise CorruptError(f"expected a frames list at memo {idx}")
        if idx < len(self.memo_fast):
            self.memo_fast[idx] = sid
        return sid

    def stack_from_ref_bytes(self, b: bytes, limit: int, idxs: list | None = None) -> int | None:
        """Intern the stack an inline frames list names by memo references (its raw bytes;
        `idxs`: their memo indices where already read); None when one refers to memo slot
        `limit` or beyond (something of the same batch: the interpreter takes that entry, in
        stream order), or when the bytes are anything else than whole BINGET / LONG_BINGET
        references."""
        if idxs is None:
            idxs = ref_indices(b)     # every reference first: nothing is interned for bytes that are not a list
        if idxs is None or (idxs and max(idxs) >= limit):
            return None
        it = self.sink.interner
        fom = self._frame_of_memo
        fids: list = list(map(fom.get, idxs))
        if None in fids:
            for k, idx in enumerate(idxs):
                if fids[k] is None:
                    fid = fom.get(idx)          # (a frame twice in the list: read once)
                    if fid is None:
                        fid = fom[idx] = it.frame_of_dict(self.memo_get(idx))
                    fids[k] = fid
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
                idx = self.memo_count
                memo[idx] = obj
                t = type(obj)
                if t is str:
                    if obj in KNOWN_ENTRY_KEYS:
                        self._key_memoized(obj, idx)
                elif t is dict:
                    self._maybe_entry(obj, stack, metastack, idx)
                self.memo_count += 1
                if len(memo) > self.memo_limit:
                    raise limits.memo_exceeded(self.memo_limit)
            elif op == 0x68 or op == 0x6A:                   # BINGET, LONG_BINGET
                if op == 0x68:
                    idx = buf[pos]
                    pos += 1
                else:
                    idx = unpack_from("<I", buf, pos)[0]
                    pos += 4
                obj = memo.get(idx, _MISSING)
                stack.append(obj if obj is not _MISSING else self.memo_get(idx))
            elif op == 0x28:                                 # MARK
                if len(metastack) >= MAX_NESTING:
                    raise limits.nesting_exceeded()
                metastack.append(stack)
                stack = []
            elif op == 0x7D:                                 # EMPTY_DICT
                if metastack and metastack[-1] and type(metastack[-1][-1]) is TraceList:
                    # the entries before this one are complete: stream them out (at the same
                    # points whether or not the fast path runs, so both fail alike)
                    tl = metastack[-1][-1]
                    if stack:
                        tl.extend(stack)
                        stack.clear()
                    if self.fast_enabled:
                        gen = self.generation
                        newpos = fast.run(pos - 1, tl.device)
                        if self.generation != gen:          # jumped past entries read by the helper
                            buf = self.buf
                            pos = newpos
                            continue
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
                self.items += len(items) >> 1
                try:
                    for i in range(0, len(items), 2):
                        d[items[i]] = items[i + 1]
                except TypeError:
                    raise CorruptError("unhashable dict key") from None
                if metastack and metastack[-1] and type(metastack[-1][-1]) is TraceList:
                    fast.learn(tuple(d))
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
                    raise self._not_a_list(stack[-1] if stack else None, "APPENDS")
                if type(stack[-1]) is not TraceList:
                    if id(stack[-1]) in self.sink.interned_lists:
                        raise self._not_a_list(stack[-1], "APPENDS")
                    self.items += len(items)
                stack[-1].extend(items)
            elif op == 0x61:                                 # APPEND
                if len(stack) < 2 or not isinstance(stack[-2], list) or id(stack[-2]) in self.sink.interned_lists:
                    raise self._not_a_list(stack[-2] if len(stack) > 1 else None, "APPEND")
                v = stack.pop()
                self.items += 1
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
                    raise LimitError(f"a string of {n:,} bytes declared at byte {self.base + pos}; "
                                     f"no snapshot has strings over {MAX_STRING >> 20} MiB (bound)")
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
                self.saw_put = True
                if idx not in memo:
                    self.memo_count += 1
                    if len(memo) >= self.memo_limit:
                        raise limits.memo_exceeded(self.memo_limit)
                obj = stack[-1]
                memo[idx] = obj
                if idx < len(self.memo_fast):
                    self.memo_fast[idx] = -1        # the slot holds this object now
                t = type(obj)
                if t is str:
                    if obj in KNOWN_ENTRY_KEYS:
                        self._key_memoized(obj, idx)
                elif t is dict:
                    self._maybe_entry(obj, stack, metastack, idx)
            elif op == 0x86:                                 # TUPLE2
                if len(stack) < 2:
                    raise CorruptError("TUPLE2 on a short stack")
                b = stack.pop()
                a = stack[-1]
                stack[-1] = self._tuple((a, b)) if type(a) is tuple or type(b) is tuple else (a, b)
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
                a = stack[-1]
                stack[-1] = self._tuple((a,)) if type(a) is tuple else (a,)
            elif op == 0x87:                                 # TUPLE3
                if len(stack) < 3:
                    raise CorruptError("TUPLE3 on a short stack")
                c3 = stack.pop()
                b = stack.pop()
                stack[-1] = self._tuple((stack[-1], b, c3))
            elif op == 0x74:                                 # TUPLE
                if not metastack:
                    raise CorruptError("TUPLE without MARK")
                t = self._tuple(tuple(stack))
                stack = metastack.pop()
                stack.append(t)
            elif op == 0x8B:                                 # LONG4
                n = unpack_from("<i", buf, pos)[0]
                if n < 0 or n > MAX_LONG_BYTES:
                    raise LimitError(f"an integer of {n:,} bytes declared (bound: {MAX_LONG_BYTES})")
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
                self.check_objects()
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
                raise LimitError(f"more than {MAX_STACK:,} objects on one level of the pickle stack (bound)")
            if pos > self.data_end:
                if self.eof:
                    raise TruncatedError(f"file ends inside an opcode at byte {self.base + self.data_end}")
                raise CorruptError("an opcode runs past the read buffer")

    def _tuple(self, t: tuple) -> tuple:
        """Check a new tuple's nesting (tuples are hashed as dict keys, recursively, in C:
        a deep one overflows the C stack) and record it when it holds tuples."""
        depth = 1
        td = self.tuple_depth
        for x in t:
            if type(x) is tuple and x:
                rec = td.get(id(x))
                d = rec[0] + 1 if rec is not None else 2
                if d > depth:
                    depth = d
        if depth > 1:
            if depth > MAX_NESTING:
                raise limits.nesting_exceeded()
            td[id(t)] = (depth, t)
            if len(td) > self.memo_limit:
                raise LimitError(f"more than {self.memo_limit:,} nested tuples (bound: one per 8 bytes of file)")
        return t

    def _not_a_list(self, target, op: str) -> CorruptError:
        # A frames list an entry already used (interned as a stack, or taken whole by the
        # fast path) cannot change: rows already written name it. pickle.load would show
        # the change in every earlier entry; no snapshot torch writes does this.
        if type(target) is StackRef or (isinstance(target, list) and id(target) in self.sink.interned_lists):
            return CorruptError(f"{op} on a frames list after a trace entry used it")
        return CorruptError(f"{op} on something that is not a list")

    def _maybe_entry(self, d: dict, stack: list, metastack: list, idx: int) -> None:
        """A dict memoized where trace entries are built: remember its memo slot until the
        sink streams it out (then a later reference copies its row)."""
        if (len(stack) > 1 and type(stack[-2]) is TraceList) or \
                (metastack and metastack[-1] and type(metastack[-1][-1]) is TraceList):
            self.sink.entry_memo_ids[id(d)] = idx

    def _check_top_key(self, stack, metastack, s) -> None:
        # Fail early on pickles that are clearly something else, before building
        # a large unrelated object graph.
        if len(metastack) == 1 and len(stack) == 1 and len(metastack[0]) == 1 and type(metastack[0][0]) is dict \
                and self.top is None and not metastack[0][0]:
            if s not in ("segments", "device_traces", "allocator_settings", "external_annotations"):
                raise NotASnapshotError(f"a pickled dict whose first key is {s[:40]!r}, not a memory snapshot")

    def _new_list(self, stack, metastack):
        st = stack
        if st and type(st[-1]) is str and st[-1] == "host_traces" and self.host_traces is None \
                and len(metastack) == 1 and len(metastack[0]) == 1 and type(metastack[0][0]) is dict \
                and len(st) % 2 == 1:
            # torch 2.14's pinned host memory: one flat list of entries in the device layout
            self.host_traces = TraceList(HOST_DEVICE, self.sink)
            return self.host_traces
        if self.traces is None:
            if (len(metastack) == 1 and len(metastack[0]) == 1 and type(metastack[0][0]) is dict
                    and st and len(st) % 2 == 1 and st[-1] == "device_traces"):
                self.traces = TracesList()
                return self.traces
            return []
        if metastack and metastack[-1] and metastack[-1][-1] is self.traces:
            return TraceList(len(self.traces) + len(st), self.sink)
        if st and st[-1] is self.traces:
            return TraceList(len(self.traces), self.sink)
        return []


class Deframed:
    """A file whose protocol-4 FRAME headers are dropped as it is read.

    FRAME is only a buffering hint (PEP 3154), but one every 64 KiB would end
    every run of the fast path. Headers sit at a chain of known offsets: each
    says how long its frame is. If the chain ever stops at something that is not
    a FRAME (a large string written unframed), we stop dropping and let the
    interpreter see any later FRAME opcodes, which it treats as no-ops.
    """

    READ = 1 << 20          # bytes read from the file at a time (then cut at the headers in memory)

    def __init__(self, fh):
        self.fh = fh
        head = fh.read(2)
        self._raw = head            # read from the file, not handed out yet, from _off
        self._off = 0
        self.active = len(head) == 2 and head[0] == 0x80 and head[1] >= 4
        self.raw_pos = len(head)    # the file offset of _raw[_off] (2: after PROTO)
        self.next_frame = self.raw_pos
        self._at_start = True       # PROTO's two bytes are handed out as data

    def read(self, n: int) -> bytes:
        return b"".join(self.read_parts(n))

    def read_parts(self, n: int, ahead: int | None = None) -> list:
        """Up to n bytes of the stream without its FRAME headers (fewer only at the end), as
        pieces to join: the file is read a megabyte (`ahead`) at a time, never a frame at a
        time."""
        ahead = self.READ if ahead is None else max(1, ahead)
        out: list = []
        got = 0
        if self._at_start:
            self._at_start = False
            out.append(self._raw)
            got = len(self._raw)
            self._raw, self._off = b"", 0
        while got < n:
            if self.active and self.raw_pos == self.next_frame and self._past_header(ahead):
                continue
            avail = len(self._raw) - self._off
            if not avail:
                self._raw = self.fh.read(max(ahead, n - got))
                self._off = 0
                if not self._raw:
                    break
                continue
            take = min(n - got, avail)
            if self.active:
                take = min(take, self.next_frame - self.raw_pos)
            off = self._off
            out.append(self._raw if off == 0 and take == len(self._raw) else
                       memoryview(self._raw)[off:off + take])
            self._off += take
            self.raw_pos += take
            got += take
        return out


    def _past_header(self, read_ahead: int) -> bool:
        """At the start of a frame: step over its FRAME header, reading what is missing of its
        nine bytes (`read_ahead` more with them, in one read); False where what is there is not
        a FRAME: framing ends, the rest is data."""
        avail = len(self._raw) - self._off
        if avail < 9:                    # the header (or the end) straddles two reads
            self._raw = self._raw[self._off:] + self.fh.read(max(read_ahead, 9 - avail))
            self._off = 0
        hdr = self._raw[self._off:self._off + 9]
        if len(hdr) == 9 and hdr[0] == 0x95:
            self._off += 9
            self.raw_pos += 9
            self.next_frame = self.raw_pos + int.from_bytes(hdr[1:], "little")
            return True
        self.active = False
        return False

    def skip(self, n: int) -> None:
        """Step over the next n bytes of the stream without reading them: the frames sought
        over, their FRAME headers (nine bytes at each) read by position (`_peek`), the file
        then stepped over the whole range at once (CrcReader: its CRC thread reads it)."""
        if self._at_start:                # PROTO's two bytes, read already, come first
            self._at_start = False
            head, self._raw, self._off = self._raw, b"", 0
            if n < len(head):
                raise ValueError("skip into the first two bytes")
            n -= len(head)
        pending = 0                       # bytes of the file before raw_pos not yet stepped over
        while n > 0:
            avail = len(self._raw) - self._off
            if self.active and self.raw_pos == self.next_frame:
                hdr = self._peek(self.raw_pos, 9) if not avail else None
                if hdr is None:
                    self._step_over(pending)
                    pending = 0
                    if self._past_header(0):
                        continue
                elif len(hdr) == 9 and hdr[0] == 0x95:
                    pending += 9
                    self.raw_pos += 9
                    self.next_frame = self.raw_pos + int.from_bytes(hdr[1:], "little")
                    continue
                else:
                    self.active = False
                avail = len(self._raw) - self._off
            take = n if not self.active else min(n, self.next_frame - self.raw_pos)
            if avail:
                take = min(take, avail)
                self._off += take
            else:
                pending += take
            self.raw_pos += take
            n -= take
        self._step_over(pending)

    def _peek(self, at: int, n: int) -> bytes | None:
        """n bytes of the file at offset `at`, read by position (the file's own position, and
        a CrcReader's CRC, untouched); None where the file has no descriptor to read so."""
        peek = getattr(self.fh, "peek_at", None)
        return peek(at, n) if peek is not None else pread_at(self.fh, at, n)

    def _step_over(self, n: int) -> None:
        """The file (at raw_pos - n, nothing read ahead) steps over the n bytes before raw_pos."""
        if n <= 0:
            return
        if hasattr(self.fh, "skip"):      # CrcReader: its CRC thread reads them
            self.fh.skip(n)
        else:
            self.fh.seek(self.raw_pos)

def _decode(buf: bytes, pos: int, n: int) -> str:
    try:
        return buf[pos:pos + n].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise CorruptError(f"invalid UTF-8 in a string at byte {pos}") from None
