"""A streaming writer that produces, byte for byte, what CPython's C pickler
(``pickle.dump(obj, f, protocol=4)``, Modules/_pickle.c) writes.

Only the subset of object types found in CUDA memory snapshots is supported:
dict, list, tuple, str, int, float, bool and None.  The details that matter for
byte equality, all taken from the C implementation (the pure-Python
``pickle._Pickler`` differs in list batching, see below):

* PROTO 4 is written outside any frame.  Every ``save()`` call starts with an
  "opcode boundary": if the current frame holds >= 64 KiB, it is committed as
  ``FRAME <len:u64>`` + data.  Opcodes written after the last child of a
  container (APPENDS, SETITEMS, TUPLE2, ...) never start a frame by
  themselves.  Frames shorter than 4 bytes get no FRAME header.  STOP is
  written into the last frame.
* Every dict, list, non-empty tuple and str is memoized (MEMOIZE right after
  the object's opcodes; for containers right after EMPTY_DICT/EMPTY_LIST,
  before the items).  A second reference is BINGET (index < 256) or
  LONG_BINGET.
* Lists: one item -> item APPEND; otherwise batches of 1000 items, each
  ``MARK items APPENDS`` (the C pickler never writes a trailing single APPEND,
  unlike pickle.py).  Dicts: one item -> key value SETITEM; otherwise
  ``MARK k v ... SETITEMS`` in batches of 1000, and a dict of exactly a multiple
  of 1000 items gets a trailing empty ``MARK SETITEMS``.
* ints: BININT1 / BININT2 for 0..65535, BININT for other 32-bit signed values,
  LONG1 (minimal two's complement little endian) beyond.

Identity (what is memoized and shared) follows Python object identity, as the
real pickler: the same ``str``/``dict``/``list`` object written twice becomes
a memo reference.  Callers that want to write an object they will not keep
alive use the explicit helpers (``fresh_str`` etc.) that only bump the memo
counter.
"""

from __future__ import annotations

import struct

FRAME_SIZE_TARGET = 64 * 1024
FRAME_SIZE_MIN = 4
BATCHSIZE = 1000

PROTO4 = b"\x80\x04"
FRAME = b"\x95"
MEMOIZE = b"\x94"
MARK = b"("
STOP = b"."
EMPTY_DICT = b"}"
EMPTY_LIST = b"]"
EMPTY_TUPLE = b")"
SETITEM = b"s"
SETITEMS = b"u"
APPEND = b"a"
APPENDS = b"e"
TUPLE = b"t"
TUPLE_N = {1: b"\x85", 2: b"\x86", 3: b"\x87"}
NONE = b"N"
NEWTRUE = b"\x88"
NEWFALSE = b"\x89"
BINFLOAT = b"G"

_pack_q = struct.Struct("<Q").pack
_pack_i = struct.Struct("<i").pack
_pack_I = struct.Struct("<I").pack
_pack_d = struct.Struct(">d").pack


def enc_int(x: int) -> bytes:
    """Opcode bytes for an int, as the C pickler chooses them (protocol >= 2)."""
    if 0 <= x < 256:
        return b"K" + bytes((x,))
    if 0 <= x < 65536:
        return b"M" + x.to_bytes(2, "little")
    if -0x80000000 <= x <= 0x7FFFFFFF:
        return b"J" + _pack_i(x)
    nbytes = (x.bit_length() >> 3) + 1
    data = x.to_bytes(nbytes, "little", signed=True)
    if x < 0 and nbytes > 1 and data[-1] == 0xFF and (data[-2] & 0x80):
        data = data[:-1]
    n = len(data)
    if n < 256:
        return b"\x8a" + bytes((n,)) + data
    return b"\x8b" + _pack_i(n) + data


def enc_str(s: str) -> bytes:
    """Opcode bytes for a str (without its MEMOIZE)."""
    b = s.encode("utf-8", "surrogatepass")
    n = len(b)
    if n < 256:
        return b"\x8c" + bytes((n,)) + b
    if n <= 0xFFFFFFFF:
        return b"X" + _pack_I(n) + b
    return b"\x8d" + _pack_q(n) + b


def enc_get(idx: int) -> bytes:
    if idx < 256:
        return b"h" + bytes((idx,))
    return b"j" + _pack_I(idx)


class MemoRef:
    """Write a reference to an already-memoized object by its memo index."""

    __slots__ = ("idx",)

    def __init__(self, idx: int):
        self.idx = idx


class Writer:
    """Protocol-4 pickle writer with CPython's C-pickler framing.

    ``boundary()`` must be called at the start of every object save; the
    generic :meth:`save` does it.  ``put(data, parts)`` appends pre-encoded
    bytes of one or more complete saves: ``parts`` is a list of byte strings
    whose concatenation is ``data`` and each of which starts at a save
    boundary (``parts`` may be a zero-argument callable producing that list,
    only called when a frame may end inside ``data``).
    """

    def __init__(self, f):
        self.f = f
        self.cur = bytearray()
        self.memo_n = 0          # next memo index
        self.memo = {}           # id(obj) -> memo index
        self._keep = []          # keeps memoized objects alive (ids stay unique)
        self.bytes_written = 0
        f.write(PROTO4)
        self.bytes_written += 2

    # -- framing ---------------------------------------------------------
    def _commit(self):
        cur = self.cur
        n = len(cur)
        if not n:
            return
        if n >= FRAME_SIZE_MIN:
            self.f.write(FRAME + _pack_q(n))
            self.bytes_written += 9
        self.f.write(cur)
        self.bytes_written += n
        del cur[:]

    def boundary(self):
        if len(self.cur) >= FRAME_SIZE_TARGET:
            self._commit()

    def raw(self, b: bytes):
        """Bytes that do not start a save (MARK, APPENDS, SETITEMS, ...)."""
        self.cur += b

    def put(self, data: bytes, parts):
        cur = self.cur
        if len(cur) + len(data) <= FRAME_SIZE_TARGET:
            cur += data
            return
        if callable(parts):
            parts = parts()
        for p in parts:
            if len(self.cur) >= FRAME_SIZE_TARGET:
                self._commit()
            self.cur += p

    def finish(self):
        self.cur += STOP
        self._commit()

    # -- memo --------------------------------------------------------------
    def memoize(self) -> int:
        """Write MEMOIZE for an object nobody will reference by identity."""
        self.cur += MEMOIZE
        i = self.memo_n
        self.memo_n = i + 1
        return i

    def _memo_put(self, obj) -> int:
        self.cur += MEMOIZE
        i = self.memo_n
        self.memo_n = i + 1
        self.memo[id(obj)] = i
        self._keep.append(obj)
        return i

    def fresh_str(self, s: str) -> int:
        """A str object that is never referenced again (a save)."""
        self.boundary()
        self.cur += enc_str(s)
        return self.memoize()

    # -- generic save (C pickler semantics) ---------------------------------
    def save(self, obj):
        self.boundary()
        if obj is None:
            self.cur += NONE
            return
        if obj is True:
            self.cur += NEWTRUE
            return
        if obj is False:
            self.cur += NEWFALSE
            return
        t = type(obj)
        if t is int:
            self.cur += enc_int(obj)
            return
        if t is float:
            self.cur += BINFLOAT + _pack_d(obj)
            return
        if t is MemoRef:
            self.cur += enc_get(obj.idx)
            return
        idx = self.memo.get(id(obj))
        if idx is not None:
            self.cur += enc_get(idx)
            return
        if t is str:
            b = enc_str(obj)
            if len(b) >= FRAME_SIZE_TARGET and len(obj.encode("utf-8", "surrogatepass")) >= FRAME_SIZE_TARGET:
                # the C pickler writes a payload >= 64 KiB outside any frame
                self._commit()
                self.f.write(b)
                self.bytes_written += len(b)
            else:
                self.cur += b
            self._memo_put(obj)
        elif t is dict:
            self.cur += EMPTY_DICT
            self._memo_put(obj)
            self.batch_setitems(obj.items(), len(obj))
        elif t is list:
            self.cur += EMPTY_LIST
            self._memo_put(obj)
            self.batch_appends(obj, len(obj))
        elif t is tuple:
            n = len(obj)
            if n == 0:
                self.cur += EMPTY_TUPLE
                return
            if n <= 3:
                for x in obj:
                    self.save(x)
                self.cur += TUPLE_N[n]
            else:
                self.cur += MARK
                for x in obj:
                    self.save(x)
                self.cur += TUPLE
            self._memo_put(obj)
        else:
            raise TypeError(f"unsupported type in snapshot: {t.__name__}")

    def batch_appends(self, items, n: int, save=None):
        """Items of a list of known length ``n`` (C ``batch_list_exact``)."""
        save = save or self.save
        if n == 0:
            return
        if n == 1:
            for x in items:
                save(x)
            self.cur += APPEND
            return
        k = 0
        for x in items:
            if k % BATCHSIZE == 0:
                self.cur += MARK
            save(x)
            k += 1
            if k % BATCHSIZE == 0 or k == n:
                self.cur += APPENDS

    def batch_setitems(self, items, n: int):
        """Items of a dict of length ``n`` (C ``batch_dict_exact``)."""
        save = self.save
        if n == 0:
            return
        if n == 1:
            for k, v in items:
                save(k)
                save(v)
            self.cur += SETITEM
            return
        i = 0
        self.cur += MARK
        for k, v in items:
            save(k)
            save(v)
            i += 1
            if i == BATCHSIZE:
                self.cur += SETITEMS + MARK
                i = 0
        self.cur += SETITEMS
