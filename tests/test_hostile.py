"""Hostile and broken input: no code runs, a clean one-line error, exit 3, quickly, in little memory."""
from __future__ import annotations

import io
import os
import pickle
import random
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramscope.parsers import SnapshotError, UnsafePickleError, open_snapshot

from helpers import GROUNDTRUTH, env_without_cache

MARKER = "/tmp/vramscope_pwned_by_test"


class _RunsCode:
    def __init__(self, proto_global=True):
        pass

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


class _Builds:
    """An object whose pickle uses NEWOBJ + BUILD."""

    def __init__(self):
        self.x = 1


def _small_snapshot() -> bytes:
    with open(GROUNDTRUTH / "sgd_accum.pickle", "rb") as fh:
        obj = pickle.load(fh)
    obj["device_traces"][0] = obj["device_traces"][0][:300]
    return pickle.dumps(obj)


def _nested(depth: int) -> bytes:
    # [[[[...]]]] built as EMPTY_LIST pushes then APPENDs: the stack grows `depth` deep
    return b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."


def _marks(depth: int) -> bytes:
    return b"\x80\x04" + b"(" * depth + b"."


HOSTILE = {
    "global_reduce_p0": pickle.dumps(_RunsCode(), protocol=0),
    "global_reduce_p2": pickle.dumps(_RunsCode(), protocol=2),
    "stack_global_reduce_p4": pickle.dumps(_RunsCode(), protocol=4),
    "stack_global_reduce_p5": pickle.dumps(_RunsCode(), protocol=5),
    "newobj_build": pickle.dumps(_Builds(), protocol=4),
    "reduce_in_snapshot": (lambda b: b[:-1] + b"\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R0.")(_small_snapshot()),
    "persid": b"\x80\x04P1\n.",
    "truncated_snapshot": _small_snapshot()[: len(_small_snapshot()) // 2],
    "truncated_one_byte": _small_snapshot()[:-1],
    "random_bytes": random.Random(7).randbytes(100_000),
    "random_after_proto": b"\x80\x04" + random.Random(8).randbytes(100_000),
    "empty": b"",
    "zip": (lambda: (lambda buf: (zipfile.ZipFile(buf, "w").writestr("data.pkl", b"x"), buf.getvalue())[1])(io.BytesIO()))(),
    "string_4gb_binunicode": b"\x80\x04X" + struct.pack("<I", 0xFFFFFFF0) + b"abc",
    "string_4gb_binunicode8": b"\x80\x04\x8d" + struct.pack("<Q", 4 << 30) + b"abc",
    "nesting_200k_lists": _nested(200_000),
    "nesting_200k_marks": _marks(200_000),
    "memo_never_stored": b"\x80\x04}\x94(\x8c\x08segments\x94j\x10\x27\x00\x00u.",
    "list_of_ints": pickle.dumps(list(range(1000))),
    "dict_without_segments": pickle.dumps({"device_traces_not": [], "x": 1}),
    "plain_int": pickle.dumps(42),
    "text_protocol_0": pickle.dumps({"segments": []}, protocol=0),
}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    if os.path.exists(MARKER):
        os.remove(MARKER)
    yield
    assert not os.path.exists(MARKER), "a pickle ran code"


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_input_is_refused_cleanly(tmp_path, name):
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(HOSTILE[name])
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(SnapshotError) as exc:
        open_snapshot(str(path))
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 5
    assert peak < 64 << 20, f"{peak >> 20} MiB allocated for {name}"
    line = exc.value.one_line()
    assert "\n" not in line and line
    if "reduce" in name or "global" in name or "build" in name or name == "persid":
        assert isinstance(exc.value, (UnsafePickleError,)) or "protocol" in line or "not a" in line


@pytest.mark.parametrize("name", ["global_reduce_p2", "stack_global_reduce_p4", "truncated_snapshot",
                                  "string_4gb_binunicode", "nesting_200k_lists", "zip", "empty"])
def test_cli_exit_3_one_line_no_traceback(tmp_path, name):
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(HOSTILE[name])
    r = subprocess.run([sys.executable, "-m", "vramscope", "summary", str(path)], capture_output=True, text=True,
                       env=env_without_cache(), timeout=60)
    assert r.returncode == 3
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def test_missing_path_exit_3():
    r = subprocess.run([sys.executable, "-m", "vramscope", "summary", "/no/such/file.pickle"],
                       capture_output=True, text=True, env=env_without_cache())
    assert r.returncode == 3
    assert r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr


def test_unsafe_opcode_message_names_it(tmp_path):
    path = tmp_path / "x.pickle"
    path.write_bytes(HOSTILE["stack_global_reduce_p4"])
    with pytest.raises(UnsafePickleError, match="STACK_GLOBAL"):
        open_snapshot(str(path))


_SEED_BYTES = _small_snapshot()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_SEED_BYTES) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, len(_SEED_BYTES)), st.booleans())
def test_fuzz_mutated_snapshot_gives_only_clean_errors(tmp_path_factory, edits, cut, do_cut):
    data = bytearray(_SEED_BYTES)
    for pos, val in edits:
        data[pos] = val
    if do_cut:
        data = data[:cut]
    path = tmp_path_factory.mktemp("fuzz") / "m.pickle"
    path.write_bytes(bytes(data))
    try:
        snap = open_snapshot(str(path))
    except SnapshotError as e:
        assert "\n" not in e.one_line()
        return
    # when it parses, the result is usable
    from vramscope.parsers import allocations, live_model
    for d in snap.devices:
        live_model(snap, d)
        allocations(snap, d)
