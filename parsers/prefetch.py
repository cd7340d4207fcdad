"""Helper processes that decode the later parts of a big trace while the reader does the rest.

The fast path (fastpath.py) spends most of its time on work that needs only the bytes: finding
where entries start, decoding their fields, and telling apart the frames lists by their raw
bytes. On a file of hundreds of megabytes, once the reader has learned the shape of the trace
entries, it starts one helper a CPU beside its own (up to MAX_HELPERS): `Helper.start` launches
`python -m vramscope.parsers.prefetch` on the file for a part of what is left (the reader keeps
the first `main_share`; the helpers share the rest, each stopping where the next one's part
begins). A helper decodes every run of entries of its part with the same code
(`FastPath._structure`, `FastPath._chained`), gives each distinct frames list an id, and appends
the batches to a scratch file. Everything that needs the reader's state (the memo: which object
each reference names, the strings and stacks interned, the memo slots the entries take) stays
here: when the reader reaches the start of a batch a helper wrote, exactly there,
`FastPath.consume` checks and resolves it as it would a batch of its own, and the reader jumps
past it (`Interpreter.jump`). A batch the reader never lands on is dropped; where a helper
stopped or failed, the reader reads on by itself. The result is the one a reading without
helpers gives, stacks in the same order (tests/test_prefetch.py), only sooner.

Off with VRAMSCOPE_PARSE_HELPER=0 (VRAMSCOPE_PARSE_HELPERS=N: at most N); only for plain files
(Deframed over a seekable file), not in a frozen app, and where this process may run on more
than one CPU.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from itertools import repeat
from typing import IO

import numpy as np

from .fastpath import MAX_BATCH, FastPath, Win8, kind_of, next_batch

MIN_BYTES = 96 << 20        # what must be left to read for a helper to pay for itself
MAX_HELPERS = 3             # one a CPU beside the reader's, up to this many
MAIN_SHARE = 0.42           # of what is left, what the reader keeps beside one helper (it resolves the rest)
WAIT_S = 60.0               # no new batch for this long from a helper still running: read on alone
_MAGIC = b"VSHLP001"
_HEAD = struct.Struct("<8sqqq")          # magic, start (stream offset), entries, payload bytes
_CHUNK = 16 << 20
_SLACK = 4 << 20            # bytes kept ahead of a batch (a few MB: fastpath.BATCH_BYTES)
_PAD = 16


def enabled(left: int) -> bool:
    """Whether a helper may read part of the `left` bytes still to be read, here."""
    return helpers_for(left) > 0


def helpers_for(left: int) -> int:
    """How many helpers to read part of the `left` bytes still to be read: one a CPU beside the
    reader's (VRAMSCOPE_PARSE_HELPERS caps it; 0 or VRAMSCOPE_PARSE_HELPER=0: none)."""
    if os.environ.get("VRAMSCOPE_PARSE_HELPER", "1") == "0" or getattr(sys, "frozen", False):
        return 0
    if left < _min_bytes():
        return 0
    k = min(_cpus() - 1, MAX_HELPERS)
    try:
        k = min(k, int(os.environ.get("VRAMSCOPE_PARSE_HELPERS", k)))
    except ValueError:
        pass
    return max(0, k)


def reading_fills_every_cpu(size: int) -> bool:
    """Whether reading a `size`-byte file keeps every CPU here busy with its thread and its
    helpers (on one CPU it has no helper: nothing else could run beside it anyway)."""
    k = helpers_for(size)
    return k > 0 and _cpus() - 1 - k <= 0


def main_share(k: int) -> float:
    """Of what is left, the share the reader decodes itself beside `k` helpers: decoding an
    entry costs a helper about what it costs the reader, and resolving one the helper decoded
    costs the reader about a quarter of that, so its part shrinks as helpers are added."""
    return MAIN_SHARE / max(1, k)


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _min_bytes() -> int:
    try:
        return int(os.environ.get("VRAMSCOPE_PARSE_HELPER_MIN", MIN_BYTES))
    except ValueError:
        return MIN_BYTES


# -- the batches, as written and read back ---------------------------------------------------

def _layout(shape: tuple) -> list[tuple[str, str, str]]:
    """(key, part, dtype) of the arrays a batch holds after `end`, in order. A key's `present`
    is written empty where every entry of the batch has the key, and a string key's `sstart`
    and `slen` hold its inline strings only (read_batch gives back arrays of every entry)."""
    out = []
    for key in shape:
        kind = kind_of(key)
        if kind == "int":
            out += [(key, "val", "<i8"), (key, "present", "u1")]
        elif kind == "tuple2":
            out += [(key, "ref", "<u4"), (key, "inline", "u1"), (key, "a", "<i8"), (key, "b", "<i8"),
                    (key, "present", "u1")]
        elif kind == "str":
            out += [(key, "ref", "<u4"), (key, "inline", "u1"), (key, "sstart", "<i8"), (key, "slen", "<i8"),
                    (key, "present", "u1")]
        else:
            out += [(key, "ref", "<u4"), (key, "inline", "u1"), (key, "uid", "<i4"), (key, "present", "u1")]
    return out


class Batch:
    """Entries the helper decoded: where each ends (stream offsets; the first begins at
    `start`), fields as `_structure` gives them, the bytes of their inline strings (`strings`)
    and the helper's frames lists by id (`lists`, shared by every batch of one helper)."""

    def __init__(self, start: int, n: int, arrays: dict, strings: bytes, lists: list, shape: tuple):
        self.start, self.n = start, n
        self.shape = shape
        self.end = arrays["end"]
        self.arrays = arrays
        self.strings = strings
        self.lists = lists

    def fields(self, shape: tuple) -> tuple[dict, np.ndarray]:
        """(fields, memo slots each entry takes) in `_structure`'s form."""
        a = self.arrays
        n = self.n
        memo_inc = np.ones(n, dtype=np.int64)
        fields: dict = {}
        mine = set(self.shape)
        for key in shape:
            kind = kind_of(key)
            if key not in mine:
                # a key the reader's shape took on after this helper started (an oom entry's
                # device_free): the helper decoded only entries without it
                fields[key] = _absent(kind, n, memo_inc)
                continue
            present = a[key, "present"].astype(bool)
            if kind == "int":
                fields[key] = (a[key, "val"], present)
                continue
            ref = a[key, "ref"].astype(np.int64)
            inline = a[key, "inline"].astype(bool)
            off = memo_inc.copy()
            if kind == "tuple2":
                fields[key] = (ref, inline, a[key, "a"], a[key, "b"], off, present)
            elif kind == "str":
                fields[key] = (ref, inline, a[key, "sstart"], a[key, "slen"], off, present)
            else:
                uid = a[key, "uid"].astype(np.int64)
                fields[key] = (ref, inline, uid, uid, off, present)
            memo_inc = memo_inc + inline
        return fields, memo_inc


def _absent(kind: str, n: int, memo_inc: np.ndarray) -> tuple:
    """`_structure`'s fields of a key none of n entries has."""
    zeros = np.zeros(n, dtype=np.int64)
    no = np.zeros(n, dtype=bool)
    if kind == "int":
        return (zeros, no)
    if kind == "any":
        return (zeros, np.zeros(n, dtype=np.int8), no)
    return (zeros, no, zeros, zeros, memo_inc.copy(), no)


def write_batch(out, start: int, n: int, end, fields: dict, shape: tuple, buf: bytes, base: int,
                uid_of: dict, new_lists: list) -> None:
    """Append one batch (its first n entries decoded, the first at stream offset `start`; `end`
    and the fields' positions in `buf`, which starts at stream offset `base`) to `out`; frames
    lists get ids from `uid_of` (new ones also go to `new_lists` as (uid, bytes) to be written
    with this batch)."""
    parts = [end[:n].astype("<i8") + base]
    strings: list = []
    spos = 0
    new_lists.clear()
    for key, part, dtype in _layout(shape):
        f = fields[key]
        kind = kind_of(key)
        if part == "present":
            present = np.asarray(f[-1][:n], dtype=dtype)
            # every entry has the key (the usual case): nothing written, read back as all
            parts.append(present[:0] if bool(present.all()) else present)
        elif part in ("val", "ref"):
            parts.append(np.asarray(f[0][:n]).astype(dtype))
        elif part == "inline":
            parts.append(np.asarray(f[1][:n], dtype=dtype))
        elif part in ("a", "b"):
            parts.append(np.asarray(f[2 if part == "a" else 3][:n], dtype=dtype))
        elif part == "sstart":
            # of the inline strings only (most entries name theirs by a memo reference)
            inl = np.flatnonzero(f[1][:n])
            starts = np.zeros(len(inl), dtype="<i8")
            lens = np.zeros(len(inl), dtype="<i8")
            if len(inl):
                a_l, l_l = f[2][inl].tolist(), f[3][inl].tolist()
                texts = [buf[x:x + ln] for x, ln in zip(a_l, l_l)]
                lens[:] = l_l
                np.cumsum(l_l[:-1], out=starts[1:])
                starts += spos
                spos += sum(l_l)
                strings += texts
            parts.append(starts)
            parts.append(lens)
        elif part == "slen":
            continue                                    # written with sstart
        elif part == "uid":
            assert kind == "list"
            uid = np.full(n, -1, dtype="<i4")
            inl = np.flatnonzero(f[1][:n])
            if len(inl):
                spans = list(map(buf.__getitem__, map(slice, f[2][inl].tolist(), f[3][inl].tolist())))
                got = list(map(uid_of.get, spans, repeat(-1)))
                if -1 in got:
                    for i, g in enumerate(got):
                        if g == -1:
                            span = spans[i]
                            g = uid_of.get(span, -1)
                            if g == -1:
                                g = uid_of[span] = len(uid_of)
                                new_lists.append((g, span))
                            got[i] = g
                uid[inl] = got
            parts.append(uid)
    parts.append(np.frombuffer(b"".join(strings), dtype="u1"))
    parts.append(np.asarray([g for g, _ in new_lists], dtype="<i4"))
    parts.append(np.asarray([len(b) for _, b in new_lists], dtype="<i8"))
    parts.append(np.frombuffer(b"".join(b for _, b in new_lists), dtype="u1"))
    # each part written from its own memory (a batch is a few MB: no copy of it made whole)
    lengths = [p.nbytes for p in parts]
    out.write(_HEAD.pack(_MAGIC, start, n, sum(lengths) + 8 * len(parts)))
    for nb, p in zip(lengths, parts):
        out.write(struct.pack("<q", nb))
        out.write(np.ascontiguousarray(p).data.cast("B"))
    out.flush()


def read_batch(body: bytes, start: int, n: int, shape: tuple, lists: list) -> Batch:
    """A batch back from its bytes (written by `write_batch` for this `shape`); its new frames
    lists go into `lists` by id."""
    pos = 0

    def take(dtype: str) -> np.ndarray:
        nonlocal pos
        (nb,) = struct.unpack_from("<q", body, pos)
        pos += 8
        if nb < 0 or pos + nb > len(body):
            raise ValueError("a helper batch ends early")
        a = np.frombuffer(body, dtype=dtype, count=nb // np.dtype(dtype).itemsize, offset=pos)
        pos += nb
        return a

    arrays: dict = {"end": take("<i8")}
    for key, part, dtype in _layout(shape):
        arrays[key, part] = take(dtype)
    strings = take("u1").tobytes()
    uids = take("<i4").tolist()
    lens = take("<i8").tolist()
    blob = take("u1").tobytes()
    at = 0
    for g, ln in zip(uids, lens):
        if g != len(lists):
            raise ValueError("helper list ids out of order")
        lists.append(blob[at:at + ln])
        at += ln
    for key, part, dtype in _layout(shape):
        got = arrays[key, part]
        if part == "present" and len(got) == 0:
            arrays[key, part] = np.ones(n, dtype=dtype)            # every entry has the key
        elif part in ("sstart", "slen"):                           # of the inline strings only
            inline = arrays[key, "inline"]
            if len(inline) != n or len(got) != int(np.count_nonzero(inline)):
                raise ValueError("a helper batch's arrays disagree")
            full = np.zeros(n, dtype=dtype)
            full[inline.astype(bool)] = got
            arrays[key, part] = full
        elif len(got) != n:
            raise ValueError("a helper batch's arrays disagree")
    if len(arrays["end"]) != n:
        raise ValueError("a helper batch's arrays disagree")
    return Batch(start, n, arrays, strings, lists, shape)


# -- the reader's side -----------------------------------------------------------------------

class Helper:
    """The helper process as the reader sees it: where its part begins (`target`, a stream
    offset), and its batches, read from the scratch file as the reader reaches them."""

    def __init__(self, proc, path: str, target: int, shape: tuple):
        self.proc = proc
        self.path = path
        self.target = target
        self.shape = shape
        self.lists: list = []
        self.queue: list[Batch] = []
        self.fh: IO[bytes] | None = None
        self.done = False          # nothing more will come (the helper ended, failed, or was let go)
        self.taken = 0             # entries taken from it (for the tests)

    @classmethod
    def start(cls, file_path: str, st: os.stat_result, target: int, stop: int | None,
              fast: FastPath) -> "Helper | None":
        """Launch a helper on `file_path` (the file `st` describes: the helper reads nothing
        from another) from stream offset `target` (to the entries that begin before `stop`, or
        to the end) for the shape `fast` has learned; None where one cannot be started."""
        # keys of kind "any" left out: the helper leaves an entry with one to the reader (its
        # value may name what the reader's memo holds), whose shape its batches still fit
        keep = [i for i, k in enumerate(fast.shape) if kind_of(k) != "any"]
        spec = json.dumps({"keys": [fast.shape[i] for i in keep], "key_bytes": [fast.key_bytes[i].hex() for i in keep],
                           "identity": _identity(st), "stop": stop})
        if not sys.executable:
            return None
        fd = -1
        try:
            fd, path = tempfile.mkstemp(prefix="vramscope-helper-", suffix=".bin")
            # POSIX: the helper writes to the descriptor it is handed, and the file's name is
            # gone as soon as we have it open too: nothing is left behind, whoever is killed
            out = f"fd:{fd}" if os.name == "posix" else path
            proc = subprocess.Popen([sys.executable, "-m", "vramscope.parsers.prefetch", file_path, str(target),
                                     out, spec], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, close_fds=True,
                                    pass_fds=(fd,) if os.name == "posix" else ())
        except (OSError, ValueError):
            return None
        finally:
            if fd >= 0:
                os.close(fd)            # (the helper has its own copy, or opens the file by name)
        helper = cls(proc, path, target, tuple(fast.shape[i] for i in keep))
        try:
            helper.fh = open(path, "rb")
            if os.name == "posix":
                os.unlink(path)
        except OSError:
            helper.close()
            return None
        return helper

    def _read_one(self) -> bool:
        """Read the next batch into the queue, waiting for it while the helper works on; False
        when none will come."""
        if self.done:
            return False
        since = time.monotonic()
        while True:
            running = self.proc.poll() is None       # (before the read: all it wrote is there)
            got = self._try_read()
            if got is not None:
                self.queue.append(got)
                return True
            if not running or time.monotonic() - since > WAIT_S:
                self.close()
                return False
            time.sleep(0.002)

    def _try_read(self) -> Batch | None:
        try:
            if self.fh is None:
                return None
            at = self.fh.tell()
            head = self.fh.read(_HEAD.size)
            if len(head) < _HEAD.size:
                self.fh.seek(at)
                return None
            magic, start, n, nbytes = _HEAD.unpack(head)
            if magic != _MAGIC or n <= 0 or nbytes < 0:
                raise ValueError("not a helper batch")
            body = self.fh.read(nbytes)
            if len(body) < nbytes:
                self.fh.seek(at)
                return None
            return read_batch(body, start, n, self.shape, self.lists)
        except (OSError, ValueError, struct.error):
            self.close()
            return None

    def take(self, at: int) -> Batch | None:
        """The helper's batch that begins at stream offset `at`, if it wrote one (waiting for it
        while it works); batches that begin before `at` are dropped (the reader passed them)."""
        if at < self.target:
            return None
        while True:
            while self.queue and self.queue[0].start < at:
                self.queue.pop(0)
            if self.queue:
                return self.queue.pop(0) if self.queue[0].start == at else None
            if not self._read_one():
                return None

    def next_start(self, at: int) -> int | None:
        """Where the reader's own batch from `at` should stop: the helper's next batch, or
        its starting point while none has come."""
        if at < self.target:
            return None if self.done else self.target
        while self.queue and self.queue[0].start <= at:
            self.queue.pop(0)
        if not self.queue:
            self._read_one()
        return self.queue[0].start if self.queue and self.queue[0].start > at else None

    def close(self) -> None:
        """Let the helper go (killed if still running) and remove its file."""
        self.done = True
        self.queue = []
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        if os.name != "posix":
            try:
                os.unlink(self.path)
            except OSError:
                pass


# -- the helper's side -----------------------------------------------------------------------

class _Region:
    """What FastPath reads (buf, arr, win8, data_end, generation) over the helper's part of
    the stream, a chunk at a time; `base` is the stream offset of buf[0]."""

    def __init__(self, src, base: int):
        self.src = src
        self.base = base
        self.buf = b""
        self.data_end = 0
        self.eof = False
        self.generation = 0
        self.arr = np.zeros(_PAD, dtype=np.uint8)
        self.win8: Win8 | None = None
        self.refill(0)

    def refill(self, pos: int) -> int:
        keep = self.buf[pos:self.data_end]
        parts = self.src.read_parts(_CHUNK)
        if sum(len(p) for p in parts) < _CHUNK:
            self.eof = True
        self.base += pos
        self.buf = b"".join([keep, *parts, bytes(_PAD)])
        self.data_end = len(self.buf) - _PAD
        self.generation += 1
        self.arr = np.frombuffer(self.buf, dtype=np.uint8)
        self.win8 = Win8(self.buf, len(self.arr) - 7)
        return 0


def _identity(st: os.stat_result) -> list:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def run_helper(file_path: str, target: int, out_path: str, spec: dict) -> None:
    """Decode every run of entries of the given shape from stream offset `target` to the end of
    `file_path`, appending the batches to `out_path`."""
    from .interpreter import Deframed
    parent = os.getppid()
    out_file = os.fdopen(int(out_path[3:]), "wb") if out_path.startswith("fd:") else open(out_path, "wb")
    with open(file_path, "rb") as fh, out_file as out:
        if _identity(os.fstat(fh.fileno())) != spec["identity"]:
            return                # not the file the reader has open (replaced since): nothing
        src = Deframed(fh)
        src.skip(target)
        reg = _Region(src, target)
        fp = FastPath(reg)  # type: ignore[arg-type]
        fp.shape = tuple(spec["keys"])
        fp.key_bytes = [bytes.fromhex(h) for h in spec["key_bytes"]]
        fp.prefix = b"}\x94(" + fp.key_bytes[0]
        uid_of: dict = {}
        new_lists: list = []
        batch = 256
        p = 0
        stop = spec.get("stop")
        while True:
            if os.getppid() != parent:           # the reader is gone: so is the need for us
                return
            if stop is not None and reg.base + p >= stop:
                return                           # the next helper's part
            if p + _SLACK > reg.data_end and not reg.eof:
                p = reg.refill(p)
            if p >= reg.data_end:
                break
            fp._batch = MAX_BATCH
            cands = fp._candidates(p)
            if not len(cands):
                if fp._cands_hi >= reg.data_end:
                    if reg.eof:
                        break
                    p = reg.refill(max(p, reg.data_end - 64))
                else:
                    p = fp._cands_hi
                continue
            take = batch
            if stop is not None:                 # entries that begin in our part only
                take = min(take, int(np.searchsorted(cands, stop - reg.base)))
                if take == 0:
                    return
            c_ext = cands[:take + 1].astype(np.int64)
            c = c_ext[:take]
            fields, _memo_inc, ok, end = fp._structure(c, c_ext[1:])
            n = fp._chained(c, ok, end)
            if n == 0:
                p = int(c[0]) + 1
                batch = 256
                continue
            write_batch(out, reg.base + int(c[0]), n, end, fields, fp.shape, reg.buf, reg.base, uid_of,
                        new_lists)
            p = int(end[n - 1])
            if n == len(c):
                batch = next_batch(batch, n, int(end[n - 1]) - int(c[0]))


def main(argv: list[str]) -> int:
    file_path, target, out_path, spec = argv
    from ..common.memory import keep_freed_pages
    keep_freed_pages()          # (each chunk a new 16 MB block: the heap's, not pages faulted in afresh)
    try:
        run_helper(file_path, int(target), out_path, json.loads(spec))
    except KeyboardInterrupt:
        return 130
    except Exception:          # the reader reads on alone: a helper's failure is never the user's error
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
