"""Hostile and broken inputs for vramscope's readers, as bytes generators (nothing committed).

Every case is a function returning ``bytes``; ``CASES`` maps a short name to a ``Case``
(name, kind, make, doc).  Use them in parametrized tests::

    import sys, pathlib, pytest
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "data"))  # from tests/<dir>/
    import hostile                            # tests/data has no __init__.py

    @pytest.mark.parametrize("name", hostile.names())
    def test_refused(name, tmp_path):
        path = hostile.write(name, tmp_path)          # tmp_path / f"{name}.pickle"
        ...  # vramscope must refuse it: exit code 3, one line on stderr, no traceback
        hostile.assert_not_pwned()

Kinds (``names(kind)`` filters):
  unsafe        a code-loading opcode (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ,
                NEWOBJ_EX, PERSID, BINPERSID, EXT1): never allowed in a snapshot, refuse before
                anything runs (several would run ``touch /tmp/vramscope_pwned`` under pickle.load)
  truncated     a real-layout snapshot cut short, or a length field pointing past the end
  too_large     a declared length (string, bytes, long, frame) of gigabytes, with the data absent:
                must be refused without allocating it
  corrupt       not a pickle, an unknown opcode/protocol, a memo reference never stored,
                a structure of the wrong types under the snapshot keys
  empty         a zero-byte file
  not_snapshot  a valid, safe pickle (or another container format) that is not a snapshot,
                including 200,000-deep nesting that a recursive reader would choke on

DANGER: never ``pickle.load`` these bytes outside a test that expects a failure; the payloads
only touch ``SENTINEL`` but they do execute under the standard unpickler.
"""
from __future__ import annotations

import io
import os
import pickle
import random
import struct
import zipfile
from dataclasses import dataclass
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
SENTINEL = "/tmp/vramscope_pwned"
CMD = "touch " + SENTINEL
DEPTH = 200_000

__all__ = ["SENTINEL", "Case", "CASES", "names", "get", "write", "write_all", "assert_not_pwned", "sentinel_cleanup"]


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    make: Callable[[], bytes]
    doc: str


CASES: dict[str, Case] = {}


def case(kind, doc):
    def deco(fn):
        name = fn.__name__
        CASES[name] = Case(name, kind, fn, doc)
        return fn
    return deco


def names(kind=None):
    return [n for n, c in CASES.items() if kind is None or c.kind == kind]


def get(name) -> bytes:
    return CASES[name].make()


def write(name, directory, suffix=".pickle"):
    """Write one case to ``directory/<name><suffix>`` and return the path (as str)."""
    path = os.path.join(str(directory), name + suffix)
    with open(path, "wb") as f:
        f.write(get(name))
    return path


def write_all(directory, suffix=".pickle"):
    return {n: write(n, directory, suffix) for n in CASES}


def assert_not_pwned():
    assert not os.path.exists(SENTINEL), "a hostile pickle was executed: %s exists" % SENTINEL


def sentinel_cleanup():
    if os.path.exists(SENTINEL):
        os.remove(SENTINEL)


# ---------------------------------------------------------------------------------------------
# small opcode helpers
# ---------------------------------------------------------------------------------------------
def _u(s):                    # BINUNICODE (protocol 2 and up)
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _su(s):                   # SHORT_BINUNICODE (protocol 4)
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _framed4(body):
    """PROTO 4 + one FRAME around `body` (which must end with STOP)."""
    return b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body


def _pickle4_unframed(obj):
    """Protocol 4 without FRAME opcodes (FRAME is optional), so bytes can be spliced."""
    buf = io.BytesIO()
    p = pickle._Pickler(buf, protocol=4)
    p.framer.start_framing = lambda: None
    p.framer.end_framing = lambda: None
    p.dump(obj)
    return buf.getvalue()


def _fixture(name):
    path = os.path.join(HERE, name)
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    return pickle.dumps(_mini_snapshot(), protocol=4 if name != "protocol2.pickle" else 2)


def _mini_snapshot():
    fr = [{"name": "forward", "filename": "/srv/model.py", "line": 12},
          {"name": "<module>", "filename": "/srv/train.py", "line": 3}]
    a = {"action": "alloc", "addr": 140000000000000, "size": 4096, "stream": 0, "time_us": 1700000000000000, "frames": list(fr)}
    return {
        "segments": [{"device": 0, "address": 140000000000000, "total_size": 2097152, "allocated_size": 4096,
                      "active_size": 4096, "requested_size": 4096, "stream": 0, "segment_type": "small",
                      "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                      "blocks": [{"address": 140000000000000, "size": 4096, "requested_size": 4096,
                                  "state": "active_allocated", "frames": a["frames"]},
                                 {"address": 140000000004096, "size": 2093056, "requested_size": 0,
                                  "state": "inactive", "frames": []}]}],
        "device_traces": [[a]],
        "allocator_settings": {"expandable_segments": False},
        "external_annotations": [],
    }


class _Evil:
    def __reduce__(self):
        return (os.system, (CMD,))


# ---------------------------------------------------------------------------------------------
# unsafe: code-loading opcodes
# ---------------------------------------------------------------------------------------------
@case("unsafe", "protocol 2: GLOBAL 'os system' + REDUCE (runs `touch /tmp/vramscope_pwned`)")
def global_reduce_os_system():
    return b"\x80\x02cos\nsystem\n" + _u(CMD) + b"\x85R."


@case("unsafe", "protocol 0 text pickle: GLOBAL + MARK + STRING + TUPLE + REDUCE")
def global_reduce_proto0():
    return b"cos\nsystem\n(S'" + CMD.encode() + b"'\ntR."


@case("unsafe", "protocol 4 (framed): STACK_GLOBAL 'os' 'system' + REDUCE")
def stack_global_reduce():
    body = _su("os") + b"\x94" + _su("system") + b"\x94\x93\x94" + _su(CMD) + b"\x94\x85\x94R\x94."
    return _framed4(body)


@case("unsafe", "pickle.dumps(obj, protocol=4) of an object whose __reduce__ is (os.system, (cmd,)): "
                "what an attacker would produce (module 'posix' or 'nt')")
def pickle_dumps_reduce():
    return pickle.dumps(_Evil(), protocol=4)


@case("unsafe", "the same with protocol 5 (the default since Python 3.8)")
def pickle_dumps_reduce_p5():
    return pickle.dumps(_Evil(), protocol=5)


@case("unsafe", "a real-layout snapshot (protocol 4) where one trace entry's 'size', deep inside, "
                "is STACK_GLOBAL os.system + REDUCE: refusal must not depend on the first bytes")
def reduce_inside_snapshot():
    snap = _mini_snapshot()
    marker = "VRAMSCOPE_MARKER_7f3a9c"
    entries = snap["device_traces"][0]
    for i in range(40):
        entries.append({"action": "free_requested" if i % 2 == 0 else "free_completed", "addr": 140000000000000,
                        "size": 4096, "stream": 0, "time_us": 1700000000000100 + i, "frames": []})
    entries[25]["size"] = marker
    data = _pickle4_unframed(snap)
    old = _su(marker) + b"\x94"
    assert data.count(old) == 1
    # exactly one MEMOIZE, like the string it replaces, so later memo indices stay right
    new = _su("os") + _su("system") + b"\x93" + _su(CMD) + b"\x85R\x94"
    return data.replace(old, new)


@case("unsafe", "GLOBAL of a harmless builtin (builtins.list) + REDUCE: refused all the same")
def global_harmless_builtin():
    return b"\x80\x02cbuiltins\nlist\n)R."


@case("unsafe", "BUILD on a plain dict (EMPTY_DICT, EMPTY_DICT, BUILD)")
def build_on_dict():
    return b"\x80\x02}q\x00}q\x01X\x01\x00\x00\x00aK\x01sb."


@case("unsafe", "GLOBAL collections.OrderedDict + EMPTY_TUPLE + NEWOBJ + state dict + BUILD")
def newobj_build():
    return b"\x80\x02ccollections\nOrderedDict\nq\x00)\x81q\x01}q\x02b."


@case("unsafe", "protocol 0 INST 'os system' with a MARKed argument (runs the command)")
def inst_os_system():
    return b"(S'" + CMD.encode() + b"'\nios\nsystem\n."


@case("unsafe", "protocol 1 OBJ: MARK, GLOBAL os.system, argument, OBJ (runs the command)")
def obj_os_system():
    return b"(cos\nsystem\nS'" + CMD.encode() + b"'\no."


@case("unsafe", "protocol 2 NEWOBJ: GLOBAL builtins.object + EMPTY_TUPLE + NEWOBJ")
def newobj():
    return b"\x80\x02cbuiltins\nobject\n)\x81."


@case("unsafe", "protocol 4 NEWOBJ_EX: STACK_GLOBAL builtins.object + args + kwargs + NEWOBJ_EX")
def newobj_ex():
    return _framed4(_su("builtins") + _su("object") + b"\x93)}\x92.")


@case("unsafe", "PERSID (persistent id as text) inside a dict")
def persid():
    return b"\x80\x02}q\x00X\x08\x00\x00\x00segmentsq\x01Pvramscope-persistent\nq\x02s."


@case("unsafe", "BINPERSID (persistent id from the stack)")
def binpersid():
    return b"\x80\x02" + _u("storage") + b"Q."


@case("unsafe", "EXT1: a copyreg extension code (loads a registered global)")
def ext1():
    return b"\x80\x02\x82\x01."


# ---------------------------------------------------------------------------------------------
# truncated
# ---------------------------------------------------------------------------------------------
@case("truncated", "tests/data/oom.pickle cut in the middle")
def truncated_half():
    data = _fixture("oom.pickle")
    return data[: len(data) // 2]


@case("truncated", "tests/data/oom.pickle without its final STOP byte")
def truncated_no_stop():
    data = _fixture("oom.pickle")
    assert data.endswith(b".")
    return data[:-1]


@case("truncated", "tests/data/oom.pickle cut 100 bytes after the first FRAME header")
def truncated_in_first_frame():
    data = _fixture("oom.pickle")
    return data[: 2 + 9 + 100]


@case("truncated", "tests/data/protocol2.pickle (no FRAME) cut at 2/3")
def truncated_protocol2():
    data = _fixture("protocol2.pickle")
    return data[: len(data) * 2 // 3]


@case("truncated", "only the PROTO opcode")
def truncated_proto_only():
    return b"\x80\x04"


@case("truncated", "a FRAME announcing 64 KiB followed by 10 bytes")
def truncated_frame_short():
    return b"\x80\x04\x95" + struct.pack("<Q", 65536) + b"}\x94(\x8c\x08segments"


# ---------------------------------------------------------------------------------------------
# too_large: huge declared lengths, data absent
# ---------------------------------------------------------------------------------------------
@case("too_large", "BINUNICODE8 declaring a 4 GiB string, then EOF")
def binunicode8_4gb():
    return _framed4(b"}\x94\x8c\x08segments\x94") + b"\x8d" + struct.pack("<Q", 4 << 30) + b"abc"


@case("too_large", "BINUNICODE declaring a 4 GiB - 16 string (32-bit length), then EOF")
def binunicode_4gb():
    return b"\x80\x02}q\x00" + _u("segments") + b"q\x01X" + struct.pack("<I", 0xFFFFFFF0) + b"abc"


@case("too_large", "BINBYTES8 declaring 8 GiB, then EOF")
def binbytes8_8gb():
    return b"\x80\x04\x8e" + struct.pack("<Q", 8 << 30) + b"\x00" * 16


@case("too_large", "BYTEARRAY8 (protocol 5) declaring 16 GiB, then EOF")
def bytearray8_16gb():
    return b"\x80\x05\x96" + struct.pack("<Q", 16 << 30) + b"\x00" * 16


@case("too_large", "LONG4 declaring a 2 GiB integer, then EOF")
def long4_2gb():
    return b"\x80\x02\x8b" + struct.pack("<i", 0x7FFFFFFF) + b"\x01\x02"


@case("too_large", "FRAME declaring 2**62 bytes")
def frame_huge():
    return b"\x80\x04\x95" + struct.pack("<Q", 1 << 62) + b"}\x94."


# ---------------------------------------------------------------------------------------------
# corrupt
# ---------------------------------------------------------------------------------------------
@case("corrupt", "64 KiB of random bytes (seeded)")
def random_bytes():
    return random.Random(20240611).randbytes(65536)


@case("corrupt", "PROTO 4 followed by 4 KiB of random bytes (seeded)")
def random_after_proto():
    return b"\x80\x04" + random.Random(7).randbytes(4096)


@case("corrupt", "a text file")
def text_file():
    return b"segments: []\ndevice_traces: []\n"


@case("corrupt", "an opcode that does not exist (0xff)")
def unknown_opcode():
    return b"\x80\x02}\xff."


@case("corrupt", "PROTO 9 (a protocol that does not exist)")
def unknown_protocol():
    return b"\x80\x09N."


@case("corrupt", "BINGET of memo index 5 when nothing was memoized")
def memo_binget_missing():
    return b"\x80\x02}q\x00" + _u("segments") + b"h\x05s."


@case("corrupt", "LONG_BINGET of memo index 0xFFFFFFFF")
def memo_long_binget_missing():
    return b"\x80\x02]q\x00j\xff\xff\xff\xffa."


@case("corrupt", "a real-layout snapshot (protocol2.pickle, no FRAME) whose 50th memo read (BINGET/LONG_BINGET) "
                 "is replaced by LONG_BINGET of a slot never stored")
def memo_missing_in_snapshot():
    import pickletools   # genops only decodes opcodes, it never executes them
    data = _fixture("protocol2.pickle")
    gets = [(pos, op.name) for op, arg, pos in pickletools.genops(data) if op.name in ("BINGET", "LONG_BINGET")]
    pos, name = gets[min(49, len(gets) - 1)]
    width = 2 if name == "BINGET" else 5
    return data[:pos] + b"j" + struct.pack("<I", 0x7FFFFFF0) + data[pos + width:]


@case("corrupt", "STOP with an empty stack")
def stop_on_empty_stack():
    return b"\x80\x02."


@case("corrupt", "200,000 MARKs then STOP (a mark storm; the stack underflows at STOP)")
def mark_storm():
    return b"\x80\x02" + b"(" * DEPTH + b"."


@case("corrupt", "'segments' is an int")
def segments_not_a_list():
    return pickle.dumps({"segments": 5, "device_traces": []}, protocol=4)


@case("corrupt", "segments of the wrong types (address a str, negative total_size, blocks a str)")
def segments_wrong_types():
    return pickle.dumps({"segments": [{"device": 0, "address": "0x7f00", "total_size": -1, "allocated_size": 0,
                                       "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
                                       "blocks": "none"}], "device_traces": [[]]}, protocol=4)


@case("corrupt", "a trace entry that is an int, another without 'action'")
def trace_entries_wrong_types():
    return pickle.dumps({"segments": [], "device_traces": [[1, {"addr": 5, "size": 512}]]}, protocol=4)


@case("corrupt", "'device_traces' is a dict")
def device_traces_not_a_list():
    return pickle.dumps({"segments": [], "device_traces": {"0": []}}, protocol=4)


# ---------------------------------------------------------------------------------------------
# empty
# ---------------------------------------------------------------------------------------------
@case("empty", "a zero-byte file")
def empty_file():
    return b""


# ---------------------------------------------------------------------------------------------
# not_snapshot: safe, valid containers that are not snapshots
# ---------------------------------------------------------------------------------------------
@case("not_snapshot", "a pickled list of ints")
def list_of_ints():
    return pickle.dumps(list(range(1000)), protocol=4)


@case("not_snapshot", "a pickled dict without 'segments'")
def dict_without_segments():
    return pickle.dumps({"model": "llama", "step": 1200, "loss": 1.25, "lr": [1e-4, 2e-4]}, protocol=4)


@case("not_snapshot", "a dict of dicts, like shared/snapshots/NOT_A_SNAPSHOT__* (a safe pickle of something else)")
def dict_of_dicts():
    return pickle.dumps({"woord": {"translation": "word", "score": 1}, "boek": {"translation": "book", "score": -1}}, protocol=4)


@case("not_snapshot", "a protocol 0 text pickle (DICT, UNICODE, SETITEM, PUT) of {'segments': []}")
def text_protocol0_dict():
    return pickle.dumps({"segments": []}, protocol=0)


@case("not_snapshot", "a pickled int")
def top_level_int():
    return pickle.dumps(42, protocol=2)


@case("not_snapshot", "a pickled None")
def top_level_none():
    return pickle.dumps(None, protocol=4)


@case("not_snapshot", "200,000 nested lists (EMPTY_LIST x 200k, APPEND x 199,999): a recursive reader overflows")
def nested_lists_200k():
    return b"\x80\x02" + b"]" * DEPTH + b"a" * (DEPTH - 1) + b"."


@case("not_snapshot", "200,000 nested tuples (MARK x 200k, TUPLE x 200k)")
def nested_tuples_200k():
    return b"\x80\x02" + b"(" * DEPTH + b"t" * DEPTH + b"."


@case("not_snapshot", "{'segments': [[[...]]]} nested 200,000 deep, 'device_traces': []")
def nested_inside_segments_200k():
    return (b"\x80\x02}" + _u("segments") + b"]" * DEPTH + b"a" * (DEPTH - 1) + b"s"
            + _u("device_traces") + b"]s.")


@case("not_snapshot", "a zip file shaped like torch.save output (archive/data.pkl, archive/version)")
def zip_torch_save_like():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"state_dict": {}}, protocol=2))
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


@case("not_snapshot", "a zip file holding a real-layout snapshot (compressed)")
def zip_with_snapshot_inside():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("snapshot.pickle", _fixture("oom.pickle"))
    return buf.getvalue()



# =============================================================================================
# Reproducers of issues 11, 12 and 30: inputs that once crashed, hung, blew up memory or time, or
# were refused although valid.  Unlike CASES (which must all be refused), each of these may end
# in success or a clean refusal, as `outcome` says: "0" (a valid snapshot: must be read),
# "3" (must be refused) or "0|3" (either, but quickly, in little memory, with one line).
# ``repro_names()``, ``write_repro(name, directory)``.
# =============================================================================================
REPRO: dict[str, Case] = {}
OUTCOME: dict[str, str] = {}


def repro(kind, outcome, doc):
    def deco(fn):
        REPRO[fn.__name__] = Case(fn.__name__, kind, fn, doc)
        OUTCOME[fn.__name__] = outcome
        return fn
    return deco


def repro_names(kind=None, outcome=None):
    return [n for n, c in REPRO.items()
            if (kind is None or c.kind == kind) and (outcome is None or OUTCOME[n] == outcome)]


def write_repro(name, directory, suffix=".pickle"):
    path = os.path.join(str(directory), name + suffix)
    with open(path, "wb") as f:
        f.write(REPRO[name].make())
    return path


class Ops:
    """A protocol-4 opcode stream written by hand (no FRAME), with the memo counted as
    MEMOIZE numbers it, so that hostile structures can be spliced into a snapshot layout."""

    def __init__(self):
        self.out = [b"\x80\x04"]
        self.memo = 0

    def raw(self, b):
        self.out.append(b)
        return self

    def memoize(self) -> int:
        self.out.append(b"\x94")
        self.memo += 1
        return self.memo - 1

    def s(self, text, memo=True):
        b = text.encode("utf-8", "surrogatepass")
        self.out.append((b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + struct.pack("<I", len(b))) + b)
        return self.memoize() if memo else None

    def i(self, v):
        if 0 <= v < 256:
            self.out.append(b"K" + bytes([v]))
        elif -(1 << 31) <= v < (1 << 31):
            self.out.append(b"J" + struct.pack("<i", v))
        else:
            n = (v.bit_length() + 8) // 8
            self.out.append(b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True))
        return self

    def get(self, idx):
        self.out.append(b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx))
        return self

    def bytes(self):
        return b"".join(self.out) + b"."


def _snapshot_with(entries=None, segments=None, settings=None, annotations=None, extra=None):
    """A small valid snapshot object around the given parts (defaults: the mini snapshot)."""
    snap = _mini_snapshot()
    if entries is not None:
        snap["device_traces"] = [entries]
    if segments is not None:
        snap["segments"] = segments
    if settings is not None:
        snap["allocator_settings"] = settings
    if annotations is not None:
        snap["external_annotations"] = annotations
    if extra:
        snap.update(extra)
    return snap


def _trace(n, frames=None, start_addr=0x7F0000000000):
    """n entries alloc/free_requested/free_completed in torch's key order, one shared stack."""
    fr = frames if frames is not None else [{"name": "forward", "filename": "/srv/model.py", "line": 12}]
    out = []
    for k in range(n):
        addr = start_addr + 512 * (k // 3)
        act = ("alloc", "free_requested", "free_completed")[k % 3]
        out.append({"action": act, "addr": addr, "size": 512, "stream": 0, "time_us": 1700000000000000 + k,
                    "frames": fr})
    return out


MARKER_INT = 0x5EED5EED5EED   # a LONG1 value that appears nowhere else: spliced away below


def _splice_marker(obj, replacement: bytes) -> bytes:
    """Pickle `obj` (protocol 4, unframed) where exactly one value is MARKER_INT, and put
    `replacement` (opcodes that push one object, memoizing nothing) in its place."""
    data = _pickle4_unframed(obj)
    old = _long1(MARKER_INT)
    assert data.count(old) == 1, data.count(old)
    return data.replace(old, replacement)


def _long1(v):
    n = (v.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)


def _deep_tuple(depth):
    return b"N" + b"\x85" * depth


# ---------------------------------------------------------------------------------------------
# nesting that no MARK shows: TUPLE1 200,000 deep (a segfault when hashed) and 20,000 deep
# ---------------------------------------------------------------------------------------------
for _depth in (200_000, 20_000):
    def _mk_key(depth=_depth):
        snap = _snapshot_with()
        snap["zzz_key_holder"] = {MARKER_INT: 1}
        return _splice_marker(snap, _deep_tuple(depth))

    def _mk_action(depth=_depth):
        entries = _trace(30)
        entries[10]["action"] = MARKER_INT
        return _splice_marker(_snapshot_with(entries), _deep_tuple(depth))

    def _mk_state(depth=_depth):
        snap = _snapshot_with()
        snap["segments"][0]["blocks"][0]["state"] = MARKER_INT
        return _splice_marker(snap, _deep_tuple(depth))

    def _mk_filename(depth=_depth):
        entries = _trace(30, frames=[{"name": "f", "filename": MARKER_INT, "line": 3}])
        return _splice_marker(_snapshot_with(entries), _deep_tuple(depth))

    _k = "200k" if _depth == 200_000 else "20k"
    for _what, _fn in (("dict_key", _mk_key), ("action", _mk_action), ("block_state", _mk_state),
                       ("frame_filename", _mk_filename)):
        _fn.__name__ = f"deep_tuple1_{_k}_{_what}"
        repro("deep", "0|3", f"a tuple nested {_depth:,} deep with TUPLE1 (no MARK) as a {_what.replace('_', ' ')}")(_fn)


# ---------------------------------------------------------------------------------------------
# memory bombs through memo references (631 bytes that expand to 10**25 items)
# ---------------------------------------------------------------------------------------------
def _bomb_ops(o: Ops, levels=25, fanout=10) -> int:
    """Push one list [L0, L1, ..., L(levels)] where L0 = [] and L(k) = [L(k-1)] * fanout (memo
    references, so a few bytes a level); return L(levels)'s memo index for later references."""
    o.raw(b"]")
    o.memoize()
    o.raw(b"(")
    o.raw(b"]")
    idx = o.memoize()
    for _ in range(levels):
        o.raw(b"]")
        new = o.memoize()
        o.raw(b"(")
        for _ in range(fanout):
            o.get(idx)
        o.raw(b"e")
        idx = new
    o.raw(b"e")
    return idx


def _bomb_at(where: str) -> bytes:
    """A small snapshot (six trace entries) with the bomb as `where`: built inline at its first
    use, referenced by memo at the others."""
    o = Ops()
    o.raw(b"}")
    o.memoize()
    o.raw(b"(")
    o.s("segments")
    o.raw(b"]")
    o.memoize()
    if where == "allocator_settings":
        o.s("allocator_settings")
        o.raw(b"}")
        o.memoize()
        o.s("PYTORCH_CUDA_ALLOC_CONF")
        _bomb_ops(o)
        o.raw(b"s")
    elif where == "external_annotations":
        o.s("external_annotations")
        _bomb_ops(o)
    elif where == "top_key":
        o.s("zz_unknown_top_level_key")
        _bomb_ops(o)
    o.s("device_traces")
    o.raw(b"]")
    o.memoize()
    o.raw(b"]")
    o.memoize()
    o.raw(b"(")
    bomb = None
    for k in range(6):
        o.raw(b"}")
        o.memoize()
        o.raw(b"(")
        o.s("action")
        o.s("alloc")
        o.s("addr")
        o.i(0x7F0000000000 + 512 * k)
        o.s("size")
        o.i(512)
        o.s("stream")
        o.i(0)
        o.s("frames")
        o.raw(b"]")
        o.memoize()
        o.raw(b"}")
        o.memoize()
        o.raw(b"(")
        o.s("filename")
        if where == "frame_filename":
            if bomb is None:
                bomb = _bomb_ops(o)
            else:
                o.get(bomb)
        else:
            o.s("/srv/model.py")
        o.s("line")
        o.i(3)
        o.s("name")
        o.s("forward")
        o.raw(b"u")
        o.raw(b"a")
        if where == "entry_key":
            o.s("zz_unknown_key")
            if bomb is None:
                bomb = _bomb_ops(o)
            else:
                o.get(bomb)
        o.raw(b"u")
    o.raw(b"e")
    o.raw(b"a")
    o.raw(b"u")
    return o.bytes()


for _where in ("allocator_settings", "external_annotations", "frame_filename", "entry_key", "top_key"):
    def _mk(where=_where):
        return _bomb_at(where)
    _mk.__name__ = f"memo_bomb_{_where}"
    repro("bomb", "0|3", f"a list of ten references to a list of ten references to ... (25 levels, "
                         f"10**25 items through memo references) as {_where.replace('_', ' ')}")(_mk)


@repro("bomb", "0|3", "a valid 20 MB file made of MEMOIZE opcodes (each one a memo slot)")
def memoize_flood_20mb():
    return (b"\x80\x04}\x94(\x8c\x08segments\x94]" + b"\x94" * (20 << 20)
            + b"\x8c\x0ddevice_traces\x94]\x94u.")


@repro("bomb", "3", "9 MB of EMPTY_DICT in a list under an unknown key: one byte each, 64 bytes of memory "
                    "each (no memo involved: the bound on objects built refuses it)")
def dict_flood_9mb():
    return (b"\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x04junk]" + (b"(" + b"}" * 90_000 + b"e") * 100
            + b"\x8c\x0ddevice_traces\x94]\x94u.")


@repro("bomb", "0|3", "a snapshot whose 2,000 segments all share one list of 2,000 blocks (4M block rows "
                      "once each reference becomes a copy)")
def shared_blocks_list():
    blocks = [{"address": 0x7F0000000000 + 512 * k, "size": 512, "requested_size": 512,
               "state": "active_allocated", "frames": []} for k in range(2000)]
    segs = [{"device": 0, "address": 0x7F0000000000, "total_size": 1 << 20, "allocated_size": 0,
             "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large", "blocks": blocks}
            for _ in range(2000)]
    return pickle.dumps(_snapshot_with(entries=[], segments=segs), protocol=4)


# ---------------------------------------------------------------------------------------------
# legal pickles that once took quadratic time
# ---------------------------------------------------------------------------------------------
def _fresh(s):
    return s.encode().decode()


@repro("quadratic", "0", "40,000 trace entries, each with its own copies of the key strings (legal pickle; "
                         "shared keys are what torch writes)")
def keys_per_entry_40k():
    fr = [{"name": "forward", "filename": "/srv/model.py", "line": 12}]
    entries = []
    for k in range(40_000):
        addr = 0x7F0000000000 + 512 * (k // 3)
        act = ("alloc", "free_requested", "free_completed")[k % 3]
        entries.append({_fresh("action"): act, _fresh("addr"): addr, _fresh("size"): 512, _fresh("stream"): 0,
                        _fresh("time_us"): 1700000000000000 + k, _fresh("frames"): fr})
    snap = _snapshot_with(entries)
    snap["segments"][0]["blocks"][0]["state"] = "inactive"
    return pickle.dumps(snap, protocol=4)


# ---------------------------------------------------------------------------------------------
# lone surrogates (legal in pickled strings)
# ---------------------------------------------------------------------------------------------
@repro("surrogate", "0", "a lone surrogate in a frame's filename and name")
def surrogate_frame():
    return pickle.dumps(_snapshot_with(_trace(30, frames=[{"name": "f\udc80", "filename": "/srv/\ud800.py",
                                                            "line": 3}])), protocol=4)


@repro("surrogate", "0", "a lone surrogate in an action (an unknown future action, then)")
def surrogate_action():
    entries = _trace(30)
    entries[7]["action"] = "alloc\udfff"
    return pickle.dumps(_snapshot_with(entries), protocol=4)


@repro("surrogate", "0", "a lone surrogate in a trace entry's key and a top-level key")
def surrogate_key():
    entries = _trace(30)
    entries[4]["k\ud83d"] = 1
    return pickle.dumps(_snapshot_with(entries, extra={"top\udc00": "v\udc01"}), protocol=4)


@repro("surrogate", "0", "lone surrogates in the allocator config and an annotation")
def surrogate_settings():
    return pickle.dumps(_snapshot_with(settings={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:\ud800",
                                                 "\udc80": 1},
                                       annotations=[{"name": "step\ud800", "stage": "START", "device": 0,
                                                     "time_us": 1700000000000000}]), protocol=4)


# ---------------------------------------------------------------------------------------------
# valid pickles once refused, or read wrong
# ---------------------------------------------------------------------------------------------
@repro("valid", "0", "the same entry dict listed twice in a trace, the second time as a memo reference "
                     "(early in the trace and after a run the fast path decodes)")
def entry_listed_twice():
    entries = _trace(300)
    entries.insert(2, entries[0])
    entries.append(entries[150])
    entries.append(entries[299])
    return pickle.dumps(_snapshot_with(entries), protocol=4)


@repro("valid", "0", "trace entries without an 'action' key (all but a few of them)")
def entries_without_action():
    entries = _trace(300)
    for k, e in enumerate(entries):
        if k % 50:
            del e["action"]
    return pickle.dumps(_snapshot_with(entries), protocol=4)


@repro("valid", "0", "two allocs at one address without a free between them (a dropped free)")
def double_alloc():
    base = 0x7F0000000000
    fr = [{"name": "forward", "filename": "/srv/model.py", "line": 12}]
    entries = [
        {"action": "alloc", "addr": base, "size": 31744, "stream": 0, "time_us": 1, "frames": fr},
        {"action": "alloc", "addr": base + 32768, "size": 1024, "stream": 0, "time_us": 2, "frames": fr},
        {"action": "alloc", "addr": base, "size": 4096, "stream": 0, "time_us": 3, "frames": fr},
        {"action": "free_requested", "addr": base + 32768, "size": 1024, "stream": 0, "time_us": 4, "frames": fr},
        {"action": "free_completed", "addr": base + 32768, "size": 1024, "stream": 0, "time_us": 5, "frames": fr},
    ]
    return pickle.dumps(_snapshot_with(entries), protocol=4)


@repro("valid", "0", "a free of a block that was freed already (a dropped alloc)")
def double_free():
    base = 0x7F0000000000
    entries = [
        {"action": "free_completed", "addr": base + 8192, "size": 2048, "stream": 0, "time_us": 1, "frames": []},
        {"action": "free_completed", "addr": base + 8192, "size": 2048, "stream": 0, "time_us": 2, "frames": []},
    ]
    return pickle.dumps(_snapshot_with(entries), protocol=4)


# ---------------------------------------------------------------------------------------------
# odd numbers (issue 11): what torch or a broken file puts into numeric fields
# ---------------------------------------------------------------------------------------------
U64_MAX = (1 << 64) - 1


@repro("odd_value", "0", "torch 2.5+: a trace frame's line is unsigned -1 (18446744073709551615)")
def line_u64_max_trace():
    return pickle.dumps(_snapshot_with(_trace(30, frames=[{"name": "f", "filename": "??", "line": U64_MAX},
                                                          {"name": "g", "filename": "/a.py", "line": 5}])),
                        protocol=4)


@repro("odd_value", "0", "torch 2.5+: a block's and a segment's frame line is unsigned -1")
def line_u64_max_block():
    snap = _snapshot_with()
    fr = [{"name": "f", "filename": "??", "line": U64_MAX}]
    snap["segments"][0]["blocks"][0]["frames"] = fr
    snap["segments"][0]["frames"] = fr
    return pickle.dumps(snap, protocol=4)


@repro("odd_value", "0|3", "frame lines of every odd width: -1, -2**40, 2**31, 2**32-1, 2**63, 2**70")
def line_odd_values():
    frames = [{"name": f"f{k}", "filename": "/a.py", "line": v}
              for k, v in enumerate((-1, -(1 << 40), 1 << 31, (1 << 32) - 1, 1 << 63, 1 << 70, "12", None))]
    return pickle.dumps(_snapshot_with(_trace(30, frames=frames)), protocol=4)


def _odd_field(field, values):
    entries = _trace(60)
    for k, v in enumerate(values):
        entries[3 + 5 * k][field] = v
    return pickle.dumps(_snapshot_with(entries), protocol=4)


_ODD = {
    "size": (U64_MAX, -1, -(1 << 40), 1 << 62, (1 << 63) - 1, 1 << 63, 1 << 80),
    "addr": (U64_MAX, -1, -(1 << 40), 1 << 63, 1 << 80),
    "stream": (U64_MAX, -1, 1 << 63, 1 << 80, -(1 << 70)),
    "time_us": (U64_MAX, -1, -(1 << 40), (1 << 63) - 1, 1 << 63, 1 << 80),
}
for _field, _values in _ODD.items():
    def _mk(field=_field, values=_values):
        return _odd_field(field, values)
    _mk.__name__ = f"odd_{_field}"
    repro("odd_value", "0|3", f"trace entries whose {_field} is unsigned -1, negative, 2**63 or beyond 64 bits")(_mk)


@repro("odd_value", "0|3", "every trace size 2**52 on 10,000 allocs: the live total passes int64")
def sizes_overflow_int64_sum():
    entries = [{"action": "alloc", "addr": 0x7F0000000000 + 512 * k, "size": 1 << 52, "stream": 0,
                "time_us": 1700000000000000 + k, "frames": []} for k in range(10_000)]
    return pickle.dumps(_snapshot_with(entries), protocol=4)


@repro("odd_value", "0|3", "segments and blocks with absurd sizes, addresses, devices and pool ids")
def odd_segments():
    snap = _snapshot_with()
    seg = snap["segments"][0]
    seg2 = dict(seg, device=(1 << 40), address=U64_MAX, total_size=1 << 63, segment_pool_id=(U64_MAX, -(1 << 70)),
                blocks=[dict(seg["blocks"][0], address=1 << 80, size=(1 << 63) - 1, requested_size=-5)])
    seg3 = dict(seg, device=-1, total_size=U64_MAX, blocks=[dict(seg["blocks"][0], size=1 << 62),
                                                            dict(seg["blocks"][0], size=1 << 62)])
    snap["segments"] += [seg2, seg3]
    return pickle.dumps(snap, protocol=4)


@repro("odd_value", "0|3", "torch 2.0 layout (no block address): block sizes that push the running address past 2**64")
def odd_torch20_cursor():
    seg = {"device": 0, "address": (1 << 64) - 4096, "total_size": 1 << 62, "allocated_size": 0, "active_size": 0,
           "requested_size": 0, "stream": 0, "segment_type": "large",
           "blocks": [{"size": 1 << 62, "state": "active_allocated", "history": [{"addr": 0, "real_size": 1, "frames": []}]},
                      {"size": 1 << 62, "state": "active_allocated", "history": []}]}
    return pickle.dumps({"segments": [seg], "device_traces": []}, protocol=4)


@repro("odd_value", "0|3", "pool ids and oom device_free of every odd width")
def odd_pool_and_device_free():
    entries = _trace(30)
    entries[4]["pool_id"] = (U64_MAX, 1 << 80)
    entries[5]["pool_id"] = (-1, -(1 << 70))
    entries.append({"action": "oom", "size": 1 << 80, "stream": 0, "time_us": 1700000000000999, "device_free": U64_MAX})
    entries.append({"action": "oom", "size": 512, "stream": 0, "time_us": 1700000001000000, "device_free": 1 << 90})
    return pickle.dumps(_snapshot_with(entries), protocol=4)

# ---------------------------------------------------------------------------------------------
# allocations and segments that do not meet (issue 30): the `skip_actions` inference reads
# which segment holds each allocation (classifiers/recording.py)
# ---------------------------------------------------------------------------------------------
@repro("no_segments", "0", "a trace with allocations and an empty segments list (a state cut from the file)")
def trace_without_segments():
    return pickle.dumps(_snapshot_with(_trace(30), segments=[]), protocol=4)


@repro("no_segments", "0", "40,000 trace entries with their own key strings and an empty segments list")
def keys_per_entry_40k_without_segments():
    snap = pickle.loads(keys_per_entry_40k())          # our own bytes: trusted
    snap["segments"] = []
    return pickle.dumps(snap, protocol=4)


@repro("no_segments", "0", "one entry dict listed several times (memo references) and an empty segments list")
def entry_listed_twice_without_segments():
    snap = pickle.loads(entry_listed_twice())          # our own bytes: trusted
    snap["segments"] = []
    return pickle.dumps(snap, protocol=4)


@repro("no_segments", "0", "the trace on device 0, every segment on device 1")
def segments_on_another_device():
    snap = _snapshot_with(_trace(30))
    snap["segments"][0]["device"] = 1
    snap["device_traces"].append([])
    return pickle.dumps(snap, protocol=4)


@repro("no_segments", "0", "allocations below, between and above the segments (two segments, no segment event)")
def allocs_outside_every_segment():
    snap = _snapshot_with(_trace(30, start_addr=0x1000))
    seg = snap["segments"][0]
    snap["segments"].append(dict(seg, address=seg["address"] + (1 << 30), blocks=[]))
    snap["device_traces"][0] += _trace(9, start_addr=seg["address"] + (1 << 29)) + _trace(9, start_addr=1 << 60)
    return pickle.dumps(snap, protocol=4)


if __name__ == "__main__":
    for n, c in CASES.items():
        print("%-28s %-12s %9d  %s" % (n, c.kind, len(c.make()), c.doc))
    for n, c in REPRO.items():
        print("%-36s %-10s %-4s %9d  %s" % (n, c.kind, OUTCOME[n], len(c.make()), c.doc))
