"""The vectorized fast path: runs of same-shape trace entries decoded with numpy.

Almost every byte of a real snapshot belongs to trace entries of one fixed shape: torch
pickles every entry with the same key references (BINGET of the memoized key strings) in
the same order, small integers, and frames given either as a memo reference to a list
pickled earlier or as an inline list of memo references to frame dicts. Once the
interpreter has built one entry, `FastPath` knows its shape and decodes the following
entries thousands at a time, vectorized over their start positions. The raw bytes of an
inline frames list identify its stack, so stacks are interned by those bytes without
decoding them.

It produces exactly what the interpreter would (tests/test_fuzz.py checks it on every
case) and stays linear in the file size: a position that does not start with the shape's
prefix is rejected in O(1), candidate positions are found in a window that grows with
success, and failures back off exponentially.
"""
from __future__ import annotations

import struct
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from . import numbers
from .sink import MISSING_ACTION
from .tables import COMPONENT_KEY
from .values import DROPPED

if TYPE_CHECKING:  # pragma: no cover
    from .interpreter import Interpreter
    from .prefetch import Helper

# How the fast path decodes each key's value.
FAST_KINDS = {
    "action": "str", "addr": "int", "size": "int", "stream": "int", "time_us": "int",
    "frames": "list", "forward_frames": "list", "compile_context": "str",
    "user_metadata": "str", "category": "str", "pool_id": "tuple2", "internal_metadata": "str",
    COMPONENT_KEY: "str", "device_free": "int",
}
POOL_BASE = -(1 << 30)   # memo_fast codes at or below this name a pool tuple
_KIND_CODES = {"str": 1, "list": 2, "tuple2": 3}
MIN_WINDOW = 1 << 14     # bytes scanned for candidate entries after a failure
MAX_BATCH = 65536           # entries decoded at a time, at most ...
BATCH_BYTES = 6 << 20       # ... and about this many bytes of them (see `next_batch`)
_LUT_MAX = 1 << 20           # memo slots / string ids looked up by table below this

_OP_K, _OP_M, _OP_J, _OP_LONG1 = 0x4B, 0x4D, 0x4A, 0x8A
_OP_H, _OP_JJ = 0x68, 0x6A          # BINGET, LONG_BINGET
_OP_SHORTSTR, _OP_MEMOIZE = 0x8C, 0x94
_OP_EMPTY_LIST, _OP_MARK, _OP_APPENDS, _OP_APPEND, _OP_SETITEMS = 0x5D, 0x28, 0x65, 0x61, 0x75
_U8, _U32 = np.uint64(0xFF), np.uint64(0xFFFFFFFF)

# Int keys that are no column: kept with the entry's rare fields (`sink.extras`), as the
# interpreter keeps them (an `oom` entry's device_free, in place of its addr)
_EXTRA_INTS = ("device_free",)
# A key the fast path does not know (a field a newer torch adds to some entries) is of kind
# "any": its value read where it is an int, a float, True, False, None or a memo reference to
# something pickled before the batch, and kept with the entry's rare fields as the interpreter
# keeps it; any other value sends the entry to the interpreter.
_ANY_INT, _ANY_REF, _ANY_TRUE, _ANY_FALSE, _ANY_NONE, _ANY_FLOAT = 1, 2, 3, 4, 5, 6
_OP_NEWTRUE, _OP_NEWFALSE, _OP_NONE, _OP_BINFLOAT = 0x88, 0x89, 0x4E, 0x47
_MAX_OTHER_KEYS = 8          # keys of kind "any" in one shape, at most
_MAX_OTHER_SCANS = 16        # key objects of kind "any" looked for in the memo, at most (each a pass over it)


def kind_of(key: str) -> str:
    """How the fast path decodes the value of entry key `key`: FAST_KINDS', else "any"."""
    return FAST_KINDS.get(key, "any")


def is_extra(key: str) -> bool:
    """Whether `key`'s value goes with the entry's rare fields, not into a column."""
    return key in _EXTRA_INTS or key not in FAST_KINDS


def next_batch(batch: int, n: int, nbytes: int) -> int:
    """The entries to decode next after a whole batch of `n` entries over `nbytes` bytes: four
    times as many, up to MAX_BATCH and to about BATCH_BYTES of entries their size. (At most
    16,384 entries, a 10^7-event file took ~780 batches, each paying numpy's per-call costs
    again; 65,536 entries of 240 bytes, 15 MB, outgrew the helper's 16 MB reads and read
    slower than 16,384 had.)"""
    per = max(nbytes // max(n, 1), 1)
    return max(min(batch * 4, MAX_BATCH, BATCH_BYTES // per), 256)


class Win8:
    """`win8[pos]` -> the little-endian uint64 starting at each byte offset in `pos`: one
    gather from a view of the buffer whose elements overlap (an 8-byte item every byte)."""
    __slots__ = ("win",)

    def __init__(self, buf: bytes, n8: int):
        self.win = np.ndarray(shape=(max(n8, 0),), dtype="<u8", buffer=buf, strides=(1,))

    def __getitem__(self, pos):
        return self.win[pos]


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


def shape_fits(old: tuple, shape: tuple) -> bool:
    """Whether entries decoded for the shape `old` read as entries of `shape`: the same first
    key and `old`'s keys in order, `shape` at most adding optional ones (what `_merge_shapes`
    does when an entry with a new key, an oom's device_free, comes along)."""
    if not old or not shape or old[0] != shape[0]:
        return False
    it = iter(shape)
    return all(k in it for k in old)


def _decode_refs(op, win8, pos):
    """BINGET / LONG_BINGET at each of `pos` (opcode bytes `op`): (is BINGET, is
    LONG_BINGET, the memo index either would name)."""
    is_h = op == _OP_H
    is_jj = op == _OP_JJ
    u1 = win8[pos + 1]
    ref = np.where(is_h, (u1 & np.uint64(0xFF)).astype(np.int64), (u1 & np.uint64(0xFFFFFFFF)).astype(np.int64))
    return is_h, is_jj, ref


def _one_kind_ints(op, w, u1, win8, pos):
    """_decode_ints where every position holds the same opcode (an entry's field mostly does:
    addresses one LONG1 length, streams BININT1, ...): a few operations instead of every
    form's; None when the general decoding is needed."""
    k = len(pos)
    if op == _OP_K:
        return (u1 & _U8).astype(np.int64), 2, np.ones(k, dtype=bool)
    if op == _OP_M:
        return (u1 & np.uint64(0xFFFF)).astype(np.int64), 3, np.ones(k, dtype=bool)
    if op == _OP_J:
        return (u1 & _U32).astype(np.uint32).view(np.int32).astype(np.int64), 5, np.ones(k, dtype=bool)
    if op == _OP_LONG1:
        n = (u1 & _U8)
        n0 = int(n[0])
        if not 1 <= n0 <= 8 or not (n == n[0]).all():
            return None
        shift = np.uint64(64 - 8 * n0)
        body = w >> np.uint64(16) if n0 <= 6 else win8[pos + 2]   # the value's n0 bytes
        return (body << shift).view(np.int64) >> np.int64(64 - 8 * n0), 2 + n0, np.ones(k, dtype=bool)
    return None


def _decode_ints(arr, win8, pos):
    """Decode the int opcode at each of `pos` (BININT1/BININT2/BININT/LONG1 up to 8
    bytes): returns (values int64, widths in bytes, which ones were ints). One 8-byte read
    at each position gives the opcode and every short form."""
    w = win8[pos]
    op = (w & np.uint64(0xFF)).astype(np.uint8)
    u1 = w >> np.uint64(8)                      # the 7 bytes after the opcode
    if len(op) and (op == op[0]).all():
        one = _one_kind_ints(int(op[0]), w, u1, win8, pos)
        if one is not None:
            return one
    n = (u1 & np.uint64(0xFF)).astype(np.int64)  # LONG1's length byte
    is_k = op == _OP_K
    is_m = op == _OP_M
    is_j = op == _OP_J
    is_l = (op == _OP_LONG1) & (n <= 8)
    val = (u1 & np.uint64(0xFF)).astype(np.int64)            # BININT1 (and a placeholder)
    val = np.where(is_m, (u1 & np.uint64(0xFFFF)).astype(np.int64), val)
    val = np.where(is_j, (u1 & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32).astype(np.int64), val)
    if is_l.any():
        u2 = win8[pos + 2]
        shift = (64 - 8 * np.clip(n, 1, 8)).astype(np.uint64)
        lv = (u2 << shift).view(np.int64) >> shift.astype(np.int64)
        lv = np.where(n == 0, 0, lv)
        val = np.where(is_l, lv, val)
    good = is_k | is_m | is_j | is_l
    val = np.where(good, val, 0)
    width = np.where(is_k, 2, np.where(is_m, 3, np.where(is_j, 5, 2 + n)))
    return val, width, good


_REF_WIDTH = np.zeros(256, dtype=np.int64)     # by opcode: the width of a memo reference, else 0
_REF_WIDTH[_OP_H], _REF_WIDTH[_OP_JJ] = 2, 5


def _walk_lists(arr, act, pos, data_end, lst_end, lst_ok) -> None:
    """Walk the memo references of the multi-element inline lists `act` (indices into the
    batch; `pos[act]` is where each one's first reference starts), all at once, a reference
    per step, on compact arrays of the lists still open: where each one's APPENDS is
    (`lst_end`); False in `lst_ok` where something else than a reference comes first."""
    pa = pos[act]
    while len(act):
        width = _REF_WIDTH[arr[pa]]
        step = width != 0
        if not step.all():
            done = arr[pa] == _OP_APPENDS
            lst_end[act[done]] = pa[done]
            bad = ~done & ~step
            if bad.any():
                lst_ok[act[bad]] = False
            act, pa, width = act[step], pa[step], width[step]
        pa += width
        inside = pa < data_end
        if not inside.all():
            act, pa = act[inside], pa[inside]


def _end_before(arr, c_next, k) -> np.ndarray:
    """Where the APPENDS of an entry's last list would be, for entries followed by one starting
    at `c_next` (k of them; fewer known): before `APPENDS SETITEMS` or `APPENDS SETITEMS APPENDS
    MARK`; 0 where neither ends there."""
    guess = np.zeros(k, dtype=np.int64)
    nc = c_next[:k]
    m = len(nc)
    if not m:
        return guess
    nc = np.maximum(nc, 4)
    b1, b2 = arr[nc - 1], arr[nc - 2]
    a = (b1 == _OP_SETITEMS) & (b2 == _OP_APPENDS)
    b = (b1 == _OP_MARK) & (b2 == _OP_APPENDS) & (arr[nc - 3] == _OP_SETITEMS) & (arr[nc - 4] == _OP_APPENDS)
    guess[:m] = np.where(a, nc - 2, np.where(b, nc - 4, 0))
    return guess


_ALL_JJ = bytes((_OP_JJ,)) * 1024
_JJ_UNPACK: dict = {}          # k -> the unpacking of k LONG_BINGETs
_U32_AT = struct.Struct("<I").unpack_from


def ref_indices(b: bytes) -> list[int] | None:
    """The memo indices of `b` if it is BINGET / LONG_BINGET references and nothing else
    (whole ones), else None. A frames list of LONG_BINGETs only (up to 1,024 of them) by a
    slice compare and one unpack; any other by a loop over its references."""
    n = len(b)
    k = n // 5
    if not n % 5 and k <= len(_ALL_JJ) and b[0::5] == _ALL_JJ[:k]:
        unpack = _JJ_UNPACK.get(k)
        if unpack is None:
            unpack = _JJ_UNPACK[k] = struct.Struct("<" + "xI" * k).unpack
        return list(unpack(b))
    out: list[int] = []
    add = out.append
    i = 0
    while i < n:
        op = b[i]
        if op == _OP_H:
            if i + 2 > n:
                return None
            add(b[i + 1])
            i += 2
        elif op == _OP_JJ:
            if i + 5 > n:
                return None
            add(_U32_AT(b, i + 1)[0])
            i += 5
        else:
            return None
    return out


def _grown(lut: np.ndarray, top: int) -> np.ndarray:
    """`lut` with room for index top - 1 at least (new slots -1: not known yet)."""
    if top <= len(lut):
        return lut
    return np.concatenate([lut, np.full(max(top, 2 * len(lut)) - len(lut), -1, dtype=lut.dtype)])


def _pool_ints(pairs: list) -> np.ndarray:
    """(k, 2) int64: the two ints of each pool id tuple (torch's bit patterns)."""
    return np.array([(numbers.opaque(a, "pool id"), numbers.opaque(b, "pool id")) for a, b in pairs],
                    dtype=np.int64).reshape(-1, 2)


def _decode_any(op, arr, win8, pos):
    """A value of kind "any" at each of `pos`: (int64 value, its form, width in bytes): an int
    (the value), a memo reference (the slot), True, False, None, a BINFLOAT (its bits); form 0
    where it is anything else."""
    val, width, is_int = _decode_ints(arr, win8, pos)
    is_h, is_jj, ref = _decode_refs(op, win8, pos)
    is_f = op == _OP_BINFLOAT
    tag = np.zeros(len(pos), dtype=np.int8)
    tag[is_int] = _ANY_INT
    tag[is_h | is_jj] = _ANY_REF
    tag[op == _OP_NEWTRUE] = _ANY_TRUE
    tag[op == _OP_NEWFALSE] = _ANY_FALSE
    tag[op == _OP_NONE] = _ANY_NONE
    val = np.where(is_h | is_jj, ref, val)
    width = np.where(is_h, 2, np.where(is_jj, 5, np.where(is_int, width, 1)))
    if is_f.any():
        at = np.flatnonzero(is_f)
        inside = pos[at] + 9 <= len(arr)
        at = at[inside]
        tag[at] = _ANY_FLOAT
        val[at] = win8[pos[at] + 1].byteswap().view(np.int64)        # big-endian double
        width[at] = 9
    return val, tag, width


def _any_value(r, tag: int, v: int):
    """The object a value of kind "any" stands for, as the interpreter would have it."""
    if tag == _ANY_INT:
        return v
    if tag == _ANY_REF:
        return r.memo_get(v)
    if tag == _ANY_FLOAT:
        return float(np.int64(v).view(np.float64))
    if tag == _ANY_NONE:
        return None
    return tag == _ANY_TRUE                 # True or False


class FastPath:
    """Decodes runs of same-shape trace entries with numpy, thousands at a time."""

    def __init__(self, reader: "Interpreter"):
        self.r = reader
        self.shape: tuple = ()               # the entry keys of the current shape; () none yet
        self.key_map: dict[str, bytes] = {}
        self.key_bytes: list[bytes] = []
        self.prefix = b""
        self._learned_ids: tuple = ()
        self._cands = np.zeros(0, dtype=np.int64)
        self._cands_key: tuple[bytes, int] | None = None
        self._cands_lo = self._cands_hi = 0
        self._skip = 0
        self._penalty = 1
        self._batch = 256
        self.entries = 0
        self._str_lut = np.full(256, -1, dtype=np.int64)      # memo slot -> string id (-1: not yet)
        self._luts: dict = {}                                 # string id + 1 -> action, category, component code
        self._pools = np.zeros((0, 2), dtype=np.int64)        # pool code -> its two ints
        self.helpers: list[Helper] = []     # processes decoding later parts, in file order (prefetch.py)
        self._helper_tried = False
        self._other_keys: dict[int, tuple] = {}  # id -> (key string of kind "any", its memo slot or -1)
        self._other_scans = 0

    def learn(self, keys: tuple) -> None:
        """Take the key order and key reference bytes from a trace entry the
        interpreter just built (`keys` are the dict's own key objects)."""
        r = self.r
        if r.saw_put or not r.fast_enabled:
            return                      # no fast path for this file: nothing to learn
        ids = tuple(map(id, keys))
        if ids == self._learned_ids:    # the same key objects as last time: nothing new
            return
        self._learned_ids = ids
        refs = {}
        for k in keys:
            if type(k) is not str:
                return
            rec = r.key_memo.get(id(k)) if k in FAST_KINDS else self._other_key(k)
            if rec is None or rec[0] is not k:
                return
            idx = rec[1]
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
        if sum(k not in FAST_KINDS for k in merged) > _MAX_OTHER_KEYS:
            return                      # (each key costs every batch a pass)
        self.shape = merged
        self.key_map = key_map
        self.key_bytes = [key_map[k] for k in merged]
        self.prefix = b"}\x94(" + self.key_bytes[0]

    def _other_key(self, k: str) -> tuple | None:
        """(k, its memo slot) for a key string the interpreter does not keep track of (one of
        kind "any"), found in the memo once per key object; None where it is not there."""
        got = self._other_keys.get(id(k))
        if got is None or got[0] is not k:
            if self._other_scans >= _MAX_OTHER_SCANS:      # a file of ever new keys: no more looking
                return None
            self._other_scans += 1
            memo = self.r.memo
            idx = next((i for i, o in memo.items() if o is k), -1) if memo is not None else -1
            if len(self._other_keys) >= 256:
                self._other_keys.clear()
            got = self._other_keys[id(k)] = (k, idx)
        return got if got[1] >= 0 else None

    def _candidates(self, p0: int) -> np.ndarray:
        """Positions at or after p0 (which matches) where an entry of the current shape may
        begin, scanned in a window of about `_batch` entries and reused while it lasts."""
        r = self.r
        key = (self.prefix, r.generation)
        cands = self._cands
        if key == self._cands_key and self._cands_lo <= p0:
            i0 = int(np.searchsorted(cands, p0))
            if len(cands) - i0 >= self._batch or self._cands_hi >= r.data_end:
                return cands[i0:]
        end = r.data_end
        hi = min(end, p0 + max(MIN_WINDOW, self._batch * 512))
        pre = np.frombuffer(self.prefix, dtype=np.uint8)
        arr = r.arr
        z = np.flatnonzero(arr[p0:hi] == pre[0]) + p0
        z = z[z + len(pre) <= end]
        if len(pre) <= 8 and r.win8 is not None:      # the whole prefix, one 8-byte read each
            ok = (r.win8[z] & np.uint64((1 << (8 * len(pre))) - 1)) == np.uint64(int.from_bytes(self.prefix, "little"))
        else:
            ok = np.ones(len(z), dtype=bool)
            for i in range(1, len(pre)):
                ok &= arr[z + i] == pre[i]
        self._cands = z[ok]
        self._cands_key, self._cands_lo, self._cands_hi = key, p0, hi
        return self._cands

    def run(self, p0: int, device: int) -> int:
        """Decode entries starting at `p0`; return the position after the last one (in a new
        buffer, `r.generation` changed, where it jumped past entries the helper decoded)."""
        r = self.r
        if not self.shape or r.saw_put:
            return p0
        stop = None
        if self.helpers:
            at = r.base + p0
            nxt = self._from_helpers(at, device)
            if nxt is not None and nxt < 0:
                return r.jump(-nxt - 1)        # taken: go on after it
            if nxt is not None and nxt > at:
                stop = nxt - r.base            # our batch ends where a helper's begins
        if self._skip:
            self._skip -= 1
            return p0
        pre = self.prefix
        if r.buf[p0:p0 + len(pre)] != pre:
            return p0
        cands = self._candidates(p0)
        if not len(cands) or cands[0] != p0:
            return p0
        take = self._batch
        if stop is not None:
            take = max(1, min(take, int(np.searchsorted(cands, stop))))
        c_ext = cands[:take + 1].astype(np.int64)
        c = c_ext[:take]
        n, end_pos = self._decode(c, device, c_ext[1:])
        if n == len(c) and n >= 4096 and not self._helper_tried:
            self._start_helper(end_pos)
        if n < 16:
            self._skip = self._penalty
            self._penalty = min(self._penalty * 2, 512)
            self._batch = 256
        else:
            self._penalty = 1
            if n == len(c):
                self._batch = next_batch(self._batch, n, end_pos - int(c[0]))
        return end_pos if n else p0

    def _from_helpers(self, at: int, device: int) -> int | None:
        """At stream offset `at`: -(where it ends) - 1 where a helper's batch begins there and was
        taken; else where the next helper batch (or a helper's part) begins after `at`, if any."""
        for i, h in enumerate(self.helpers):
            later = self.helpers[i + 1].target if i + 1 < len(self.helpers) else None
            if later is not None and at >= later:
                continue                        # past this one's part
            if at < h.target:
                return h.target
            if not h.done:
                got = h.take(at)
                if got is not None and shape_fits(got.shape, self.shape):
                    n, end_at = self.consume(got, device)
                    if n:
                        h.taken += n
                        return -end_at - 1
                nxt = h.next_start(at)
                if nxt is not None:
                    return nxt
            return later
        return None

    def _start_helper(self, end_pos: int) -> None:
        """Once the shape has held for a full batch: helper processes for the later part of a
        big plain file (prefetch.py), one a CPU beside this one (up to prefetch.MAX_HELPERS),
        each on a part of what is left after what this one keeps (prefetch.main_share)."""
        self._helper_tried = True
        r = self.r
        source = getattr(r, "source", None)
        if source is None or not getattr(r, "fast_enabled", False):
            return
        from . import prefetch
        at = r.base + end_pos
        left = r.size - at
        k = prefetch.helpers_for(left)
        if not k:
            return
        first = at + int(prefetch.main_share(k) * left)
        bounds = [first + (r.size - first) * i // k for i in range(k + 1)]
        for i in range(k):
            h = prefetch.Helper.start(source[0], source[1], bounds[i], bounds[i + 1] if i + 1 < k else None, self)
            if h is None:
                break
            self.helpers.append(h)

    def _decode(self, c: np.ndarray, device: int, c_next: np.ndarray):
        """Decode the entries that may start at `c` (`c_next`: the candidate after each, as far
        as known); return how many were taken and where the last one ended."""
        fields, memo_inc, ok, end = self._structure(c, c_next)
        ok &= self._references_ok(fields, memo_inc, ok)
        n = self._chained(c, ok, end)
        if n == 0:
            return 0, c[0]
        n = self._emit(device, n, fields, memo_inc, c)
        if n == 0:
            return 0, c[0]
        return n, int(end[n - 1])

    def _structure(self, c: np.ndarray, c_next: np.ndarray):
        """Every field of the entries that may start at `c`, read from the bytes alone (no memo):
        (fields by key, memo slots each entry takes, whether each is well formed, where each ends)."""
        r = self.r
        arr = r.arr
        win8 = r.win8
        assert win8 is not None            # (refill made it before any entry)
        data_end = r.data_end
        k = len(c)
        pos = c + 3                      # after EMPTY_DICT MEMOIZE MARK
        ok = np.ones(k, dtype=bool)
        memo_inc = np.ones(k, dtype=np.int64)   # the entry dict itself
        fields: dict[str, tuple] = {}
        for fi, (key, kb) in enumerate(zip(self.shape, self.key_bytes)):
            # The key reference. Every key but the first may be absent from an
            # entry (torch leaves out frames on `snapshot` entries, forward_frames
            # off the backward pass...): present where its bytes match.
            if len(kb) <= 8:             # the key's bytes, one 8-byte read at each position
                present = (win8[pos] & np.uint64((1 << (8 * len(kb))) - 1)) == \
                    np.uint64(int.from_bytes(kb, "little"))
            else:
                present = np.ones(k, dtype=bool)
                for j, byte in enumerate(kb):
                    present &= arr[pos + j] == byte
            if fi == 0:
                ok &= present
            vpos = np.where(present, pos + len(kb), c)   # absent: any in-range position
            op = arr[vpos]
            kind = kind_of(key)
            if kind == "int":
                val, width, good = _decode_ints(arr, win8, vpos)
                after = vpos + width
                fields[key] = (val, present)
            elif kind == "any":
                val, tag, width = _decode_any(op, arr, win8, vpos)
                good = tag > 0
                after = vpos + width
                fields[key] = (val, tag, present)
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
                    # `]\x94` and anything but MARK or a reference APPENDed: nothing more belongs
                    # to it (an empty frames list before the next key's reference, forward_frames')
                    empty = is_inline & ~multi & ~single_ok
                    lst_end = np.zeros(k, dtype=np.int64)
                    walk = multi
                    if fi == len(self.shape) - 1:
                        # The last key: a list ends where the next entry begins, after its
                        # `APPENDS SETITEMS` (and `APPENDS MARK` where a batch of 1000 ends).
                        # Guessed so; _inline_list_sids takes the list only where its bytes are
                        # those of a list already decoded, or decode as memo references and
                        # nothing else, which is exactly where walking them would have ended.
                        guess = _end_before(arr, c_next, k)
                        guessed = multi & (guess > start)
                        lst_end[guessed] = guess[guessed]
                        walk = multi & ~guessed
                    _walk_lists(arr, np.flatnonzero(walk), start + 1, data_end, lst_end, lst_ok)
                    lst_ok &= ~(multi & (lst_end == 0))
                    start = np.where(multi, start + 1, start)
                    stop = np.where(multi, lst_end, np.where(single_ok, start + single_w, start))
                    after = np.where(multi, lst_end + 1,
                                     np.where(single_ok, start + single_w + 1, np.where(empty, start, after)))
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
        return fields, memo_inc, ok, end

    def _chained(self, c: np.ndarray, ok: np.ndarray, end: np.ndarray) -> int:
        """How many of the entries at `c` may be taken: up to the first not ok or not chained."""
        arr = self.r.arr
        data_end = self.r.data_end
        k = len(c)
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
        # The last entry taken must be followed by the next one or by APPENDS: anything else
        # could still act on it (memoize it again, add keys, wrap it in a tuple) as it sits on
        # the interpreter's stack; the interpreter takes such an entry.
        if n:
            last_end = int(end[n - 1])
            if last_end >= data_end or arr[last_end] not in (0x7D, _OP_APPENDS):
                n -= 1
        return n

    def _references_ok(self, fields: dict, memo_inc: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Whether every memo reference of each entry names an object of the kind its field
        needs, as the interpreter would find it: a string for action/category/..., a frames
        list for frames, a pair of ints for pool_id; pickled before this batch, or inline
        earlier in it. An entry that fails goes to the interpreter, which keeps odd values
        (an action that is not a string, a pool_id that is not a pair) the way it keeps them."""
        r = self.r
        k = len(ok)
        base = r.memo_count
        starts = np.zeros(k, dtype=np.int64)
        np.cumsum(memo_inc[:-1], out=starts[1:])
        # what this batch defines inline, by memo slot relative to base: 0 none, else the kind
        span = int(starts[-1] + memo_inc[-1]) if k else 0
        kinds = None
        good = np.ones(k, dtype=bool)
        for key in self.shape:
            kind = kind_of(key)
            if kind == "int":
                continue
            f = fields[key]
            if kind == "any":
                # a reference to something of this batch: the interpreter takes that entry
                good[f[2] & ok & (f[1] == _ANY_REF) & (f[0] >= base)] = False
                continue
            ref, inline, off, present = f[0], f[1], f[4], f[-1]
            is_ref = present & ~inline & ok
            if not is_ref.any():
                continue
            old = is_ref & (ref < base)
            where = np.flatnonzero(old)
            if len(where):
                good[where[~r.memo_kinds_ok(ref[where], kind)]] = False
            new = is_ref & ~old
            if new.any():
                if kinds is None:
                    kinds = np.zeros(max(span, 1), dtype=np.int8)
                    for key2 in self.shape:
                        kind2 = kind_of(key2)
                        if kind2 != "int" and kind2 != "any":
                            f2 = fields[key2]
                            kinds[(starts + f2[4])[f2[1]]] = _KIND_CODES[kind2]
                rel = ref[new] - base
                inside = rel < span
                rel = np.where(inside, rel, 0)
                good[new] &= inside & (kinds[rel] == _KIND_CODES[kind]) & (rel < (starts + off)[new])
        return good

    _DEFAULTS = {"addr": 0, "size": 0, "stream": 0, "time_us": -1}

    def _emit(self, device, n, fields, memo_inc, c, helped=None) -> int:
        """Append the first n decoded entries to the columns (fewer when an inline frames
        list refers to something of this batch: those go to the interpreter); return how many.
        `helped`: a batch the helper process decoded (prefetch.Batch), whose strings and lists
        are its own, not in this reader's buffer."""
        r = self.r
        sink = r.sink
        base = r.memo_count
        if helped is None:
            list_sids, n = self._inline_list_sids(fields, n, base)
        else:
            list_sids, n = self._list_sids_by_uid(fields, n, base, helped.lists)
        if n == 0:
            return 0
        dict_idx = base + np.concatenate(([0], np.cumsum(memo_inc[:n - 1])))
        r.memo_count = base + int(memo_inc[:n].sum())
        r.grow_memo_fast(r.memo_count)
        dev = sink.device(device)
        sink.entry_memo.add_batch(base, device, dev.n, memo_inc[:n])
        out = {}
        # Inline strings, lists and tuples first, for every field: a later entry
        # of this same batch may refer to them by memo.
        inline_ids = {}
        for key in self.shape:
            kind = kind_of(key)
            if kind == "str":
                ref, is_s, sstart, slen, off, _ = (x[:n] for x in fields[key])
                inline_ids[key] = self._inline_strings(is_s, sstart, slen, dict_idx + off,
                                                       r.buf if helped is None else helped.strings)
            elif kind == "list":
                ref, inline, start, stop, off, _ = (x[:n] for x in fields[key])
                where, sids = list_sids[key]
                keep = where < n
                where, sids = where[keep], sids[keep]
                ids = np.full(n, -1, dtype=np.int32)
                ids[where] = sids
                r.memo_fast[(dict_idx + off)[where]] = sids
                inline_ids[key] = ids
            elif kind == "tuple2":
                ref, inline, a_val, b_val, off, _ = (x[:n] for x in fields[key])
                self._inline_tuples(inline, a_val, b_val, dict_idx + off)
        extra = [key for key in self.shape if is_extra(key)]
        if extra:
            self._extras(dev, n, fields, extra)
        for key in self.shape:
            kind = kind_of(key)
            v = fields[key]
            present = v[-1][:n]
            if is_extra(key):
                continue
            elif kind == "int":
                vals = np.where(present, v[0][:n], self._DEFAULTS.get(key, 0))
                if key == "size":
                    vals = numbers.size_array(vals)
                elif key == "addr":
                    vals = numbers.addr_array(vals)
                elif key == "time_us":
                    vals = numbers.time_array(vals)
                out[key] = vals
            elif kind == "tuple2":
                ref, inline, a_val, b_val = (x[:n] for x in v[:4])
                a_val = np.where(present, a_val, -1)
                b_val = np.where(present, b_val, -1)
                # memo references to a pool's tuple (torch 2.13+ pickles one per pool and refers
                # to it from every entry): each distinct one read once, not once an entry (a
                # Python loop over 10^6 entries was 1.5 s of a tiled trace's 2.6 s parse)
                at = np.flatnonzero(present & ~inline)
                if len(at):
                    a_val[at], b_val[at] = self._ref_pools(ref[at])
                out["pool_a"], out["pool_b"] = a_val, b_val
            elif kind == "str":
                ref, is_s = v[0][:n], v[1][:n]
                ids = self._ref_strings(ref, is_s | ~present, inline_ids[key])
                ids[~present] = -1
                if key == "action":
                    out["action"] = self._action_codes(ids)
                elif key == "category":
                    out["category"] = self._name_codes(ids, sink.category_code)
                elif key == COMPONENT_KEY:
                    out["component"] = self._name_codes(ids, sink.component_code)
                else:
                    out[key] = ids.astype(np.int32)
            else:
                ref, inline = v[0][:n], v[1][:n]
                sids = self._ref_stacks(ref, inline | ~present, inline_ids[key])
                sids[~present] = -1
                out["stack" if key == "frames" else "forward_stack"] = sids
        if "action" not in out:
            out["action"] = np.full(n, sink.action_code(MISSING_ACTION), dtype=np.uint8)
        if "time_us" not in out:
            out["time_us"] = np.full(n, -1, dtype=np.int64)
        if "stack" not in out:
            out["stack"] = np.full(n, -1, dtype=np.int32)
        for k2 in ("addr", "size", "stream"):
            if k2 not in out:
                out[k2] = np.zeros(n, dtype=np.int64)
        dev.add_arrays(out, n)
        self.entries += n
        return n

    def _extras(self, dev, n: int, fields: dict, keys: list) -> None:
        """The values of `keys` (no column's: an oom's device_free, keys of kind "any"), where
        present, into the rare fields of the n rows about to be appended (few have one), each
        row's in its keys' order, as `sink.add_entry` keeps them (`sink.rare_value`)."""
        r = self.r
        rare_value = r.sink.rare_value
        present = [fields[k][-1][:n] for k in keys]
        rows = np.flatnonzero(np.logical_or.reduce(present))
        if not len(rows):
            return
        cols = []
        for k, p in zip(keys, present):
            f = fields[k]
            vals = f[0][:n][rows].tolist()
            tags = f[1][:n][rows].tolist() if kind_of(k) == "any" else None
            cols.append((k, p[rows].tolist(), vals, tags))
        for j, i in enumerate(rows.tolist()):
            out = {}
            for k, p, vals, tags in cols:
                if not p[j]:
                    continue
                v = rare_value(k, vals[j] if tags is None else _any_value(r, tags[j], vals[j]))
                if v is not DROPPED:
                    out[k] = v
            if out:
                dev.extras[dev.n + i] = out

    def _inline_list_sids(self, fields: dict, n: int, base: int) -> tuple[dict, int]:
        """Stack ids of the inline frames lists of the first n entries, interned by their raw
        bytes, and how many entries the fast path may take (`_cut_and_intern`)."""
        buf = self.r.buf
        get = self.r.stack_by_bytes.get
        looked, out = [], {}
        for key in self.shape:
            if kind_of(key) != "list":
                continue
            inline, start, stop = fields[key][1][:n], fields[key][2], fields[key][3]
            where = np.flatnonzero(inline)
            a_list = start[where].tolist()
            b_list = stop[where].tolist()
            # map over slices: a quarter faster than a list comprehension of buf[a:b]
            sids = list(map(get, map(buf.__getitem__, map(slice, a_list, b_list)), repeat(-1)))
            looked.append((where, lambda i, a=a_list, b=b_list: buf[a[i]:b[i]], sids))
            out[key] = (where, sids)
        n = self._cut_and_intern(looked, n, base)
        return {key: (where, np.asarray(sids, dtype=np.int32)) for key, (where, sids) in out.items()}, n

    def _list_sids_by_uid(self, fields: dict, n: int, base: int, uniq: list) -> tuple[dict, int]:
        """`_inline_list_sids` for a batch the helper decoded: each inline list given by the id
        of its bytes (`uniq[uid]`), so a distinct list is looked up once, not once an entry. The
        same cuts and the same stacks interned in the same order: a list's first entry stands
        for all of its entries (they share its bytes, so its lookup and its checks)."""
        get = self.r.stack_by_bytes.get
        looked, out = [], {}
        for key in self.shape:
            if kind_of(key) != "list":
                continue
            inline, uid = fields[key][1][:n], fields[key][2]
            where = np.flatnonzero(inline)
            us, first, inv = np.unique(uid[where], return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")                # the distinct lists, as first met
            keys = [uniq[u] for u in us[order].tolist()]
            sids = [get(k, -1) for k in keys]
            looked.append((where[first[order]], keys.__getitem__, sids))
            out[key] = (where, order, inv, sids)
        n = self._cut_and_intern(looked, n, base)
        result = {}
        for key, (where, order, inv, sids) in out.items():
            by_u = np.empty(len(sids), dtype=np.int32)
            by_u[order] = sids
            result[key] = (where, by_u[inv.reshape(-1)])
        return result, n

    def _cut_and_intern(self, looked: list, n: int, base: int) -> int:
        """For each list key's (entry of each list in order, its bytes by position, its stack id
        or -1: filled in here): how many entries the fast path may take, up to the first whose
        list is not memo references only (an end guessed wrong, a frame dict pickled inside),
        then up to the first whose list refers to memo slot `base` or beyond (the interpreter
        resolves those in order); the others' new stacks interned, in that order."""
        r = self.r
        by_bytes = r.stack_by_bytes
        parsed: dict = {}                      # (list key, i) -> its memo indices (each list parsed once)
        for li, (at, bytes_of, sids) in enumerate(looked):   # before anything is interned: where lists stop being lists
            if -1 in sids:
                for i, sid in enumerate(sids):
                    if sid == -1 and at[i] < n:
                        idxs = parsed[li, i] = ref_indices(bytes_of(i))
                        if idxs is None:
                            n = int(at[i])
                            break
        for li, (at, bytes_of, sids) in enumerate(looked):
            if -1 not in sids:
                continue
            for i, sid in enumerate(sids):
                if sid != -1:
                    continue
                if at[i] >= n:
                    break
                key_b = bytes_of(i)
                known = by_bytes.get(key_b)
                if known is None:
                    idxs = parsed.get((li, i))
                    known = r.stack_from_ref_bytes(key_b, base, idxs)
                    if known is None:
                        n = int(at[i])
                        break
                    by_bytes[key_b] = known
                sids[i] = known
        return n

    def consume(self, batch, device: int) -> tuple[int, int]:
        """Take entries the helper process decoded (`batch`, read at the position the
        interpreter has reached): their memo references checked and resolved here, as for a
        batch of our own. (how many were taken, the stream offset after the last one)."""
        fields, memo_inc = batch.fields(self.shape)
        n = batch.n
        ok = self._references_ok(fields, memo_inc, np.ones(n, dtype=bool))
        bad = np.flatnonzero(~ok)
        if len(bad):
            n = int(bad[0])
        if n:
            n = self._emit(device, n, fields, memo_inc, None, helped=batch)
        return n, (int(batch.end[n - 1]) if n else -1)

    def _inline_tuples(self, inline, a_val, b_val, memo_idx) -> None:
        """Record inline pool tuples by memo without a Python object per entry:
        the distinct tuples are few; memo_fast holds a code into `pool_tuples`."""
        if not inline.any():
            return
        r = self.r
        pairs = np.stack([a_val[inline], b_val[inline]], axis=1)
        uniq, inv = np.unique(pairs, axis=0, return_inverse=True)
        codes = np.asarray([r.pool_code((int(x), int(y))) for x, y in uniq], dtype=np.int64)
        r.memo_fast[memo_idx[inline]] = (POOL_BASE - codes[inv.reshape(-1)]).astype(np.int32)

    def _ref_pools(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two ints of the pool tuples at memo slots `m`: by the code each slot holds in
        memo_fast (`_references_ok` put one there for every slot a batch refers to) and a
        table of code -> ints, where a sort of the batch's references (np.unique) per batch
        was 0.8 s of a 10^7-entry torch 2.13 trace's parse; by the memo past them."""
        r = self.r
        mf = r.memo_fast
        codes = np.where(m < len(mf), mf[np.minimum(m, len(mf) - 1)], -1).astype(np.int64)
        if len(self._pools) < len(r.pool_tuples):
            self._pools = np.concatenate([self._pools, _pool_ints(r.pool_tuples[len(self._pools):])])
        known = codes <= POOL_BASE
        out = self._pools[np.where(known, POOL_BASE - codes, 0)]
        if not known.all():
            memo, inv = np.unique(m[~known], return_inverse=True)
            # pairs of ints: checked in _references_ok
            out[~known] = _pool_ints([r.memo_get(x) for x in memo.tolist()])[inv.reshape(-1)]
        return out[:, 0], out[:, 1]

    def _inline_strings(self, is_inline, sstart, slen, memo_idx, buf) -> np.ndarray:
        r = self.r
        ids = np.full(len(is_inline), -1, dtype=np.int64)
        if is_inline.any():
            where = np.flatnonzero(is_inline)
            string_id = r.sink.string_id
            got = [string_id(buf[a:a + ln].decode("utf-8", "surrogatepass"))
                   for a, ln in zip(sstart[where].tolist(), slen[where].tolist())]
            ids[where] = got
            r.memo_fast[memo_idx[where]] = -2 - np.asarray(got, dtype=np.int64)
        return ids

    def _ref_strings(self, ref, is_inline, ids) -> np.ndarray:
        """String ids for values given by memo reference (inline ones are in `ids`): by a table
        of memo slot -> string id kept across batches (a slot never names another object while
        the fast path runs), each slot resolved once; by its distinct slots past the table."""
        r = self.r
        refd = ~is_inline
        if refd.any():
            m = ref[refd]
            top = int(m.max()) + 1
            if top <= _LUT_MAX:
                lut = self._str_lut = _grown(self._str_lut, top)
                got = lut[m]
                miss = got < 0
                if miss.any():
                    for x in np.unique(m[miss]).tolist():
                        lut[x] = r.string_id_of_memo(x)
                    got = lut[m]
                ids[refd] = got
            else:
                uniq, inv = np.unique(m, return_inverse=True)
                vals = np.asarray([r.string_id_of_memo(int(x)) for x in uniq], dtype=np.int64)
                ids[refd] = vals[inv]
        return ids

    def _action_codes(self, string_ids: np.ndarray) -> np.ndarray:
        """uint8 action codes of string ids (-1: no action), by a table of string id -> code."""
        sink = self.r.sink
        return self._codes(string_ids, "action",
                           lambda i: sink.action_code(sink.interner.strings[i] if i >= 0 else MISSING_ACTION))

    def _name_codes(self, string_ids: np.ndarray, code_of) -> np.ndarray:
        """uint8 codes of named values (profiler categories, component names): `code_of`
        once per distinct string, 0 where the entry has none."""
        strings = self.r.sink.interner.strings
        return self._codes(string_ids, code_of, lambda i: code_of(strings[i]) if i >= 0 else 0)

    def _codes(self, string_ids: np.ndarray, table, code) -> np.ndarray:
        """uint8 `code(i)` of each string id i (-1: none), by a table kept across batches under
        the name `table` (string id + 1 -> code, -1 not known yet): `code` once per distinct id,
        where np.unique of every batch sorted it twice over; np.unique past _LUT_MAX."""
        top = int(string_ids.max()) + 2 if len(string_ids) else 1
        if top > _LUT_MAX:
            uniq, inv = np.unique(string_ids, return_inverse=True)
            return np.asarray([code(i) for i in uniq.tolist()], dtype=np.uint8)[inv.reshape(-1)]
        lut = self._luts[table] = _grown(self._luts.get(table, np.full(64, -1, dtype=np.int16)), top)
        got = lut[string_ids + 1]
        miss = got < 0
        if miss.any():
            for i in np.unique(string_ids[miss]).tolist():
                lut[i + 1] = code(i)
            got = lut[string_ids + 1]
        return got.astype(np.uint8)

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


