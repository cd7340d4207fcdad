"""Hostile and broken input: no code runs, a clean one-line error, exit 3, quickly, in little
memory. The inputs are the one catalogue in tests/data/hostile.py (kinds: unsafe, truncated,
too_large, corrupt, empty, not_snapshot); mutated real snapshots come from hypothesis."""
from __future__ import annotations

import pickle
import subprocess
import sys
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramscope.parsers import SnapshotError, UnsafePickleError, allocations, live_model, open_snapshot

from helpers import DATA, GROUNDTRUTH, env_without_cache

sys.path.insert(0, str(DATA))
import hostile  # noqa: E402


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    hostile.sentinel_cleanup()
    yield
    hostile.assert_not_pwned()


@pytest.mark.parametrize("name", hostile.names())
def test_every_hostile_case_is_refused(tmp_path, name):
    path = hostile.write(name, tmp_path)
    tracemalloc.start()
    t0 = time.process_time()          # this process's CPU time: other work on the machine does not count
    try:
        with pytest.raises(SnapshotError) as exc:
            open_snapshot(str(path))
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        hostile.assert_not_pwned()
    assert time.process_time() - t0 < 5
    assert peak < 64 << 20, f"{peak >> 20} MiB allocated for {name}"
    line = exc.value.one_line()
    assert "\n" not in line and line
    if hostile.CASES[name].kind == "unsafe":
        assert isinstance(exc.value, UnsafePickleError) or "protocol" in line or "not a" in line


@pytest.mark.parametrize("name", ["global_reduce_os_system", "stack_global_reduce", "truncated_half",
                                  "binunicode_4gb", "nested_lists_200k", "zip_torch_save_like", "empty_file"])
def test_cli_exit_3_one_line_no_traceback(tmp_path, name):
    path = hostile.write(name, tmp_path)
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
    with pytest.raises(UnsafePickleError, match="STACK_GLOBAL"):
        open_snapshot(hostile.write("stack_global_reduce", tmp_path))


def _small_snapshot() -> bytes:
    with open(GROUNDTRUTH / "sgd_accum.pickle", "rb") as fh:
        obj = pickle.load(fh)
    obj["device_traces"][0] = obj["device_traces"][0][:300]
    return pickle.dumps(obj)


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
    for d in snap.devices:
        live_model(snap, d)
        allocations(snap, d)
