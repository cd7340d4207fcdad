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


if __name__ == "__main__":
    for n, c in CASES.items():
        print("%-28s %-12s %9d  %s" % (n, c.kind, len(c.make()), c.doc))
