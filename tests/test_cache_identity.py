"""The column cache never serves a wrong answer: an entry is checked against the file it came
from (identity) and against its own checksums (integrity) on every open, and a damaged entry
is rebuilt, never used and never fatal. Each case compares the command line's output with
the cache to its output with --no-cache."""
from __future__ import annotations

import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

from vramscope.parsers import open_snapshot
from vramscope.parsers import cache as pcache
from vramscope.parsers.cache import read_snapshot

from helpers import DATA, GROUNDTRUTH

sys.path.insert(0, str(DATA))
import fuzzing  # noqa: E402
import hostile  # noqa: E402


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(d))
    return d


def outputs(path, no_cache=False) -> tuple:
    """What a user sees: `summary --json` and `allocations --csv`."""
    extra = ["--no-cache"] if no_cache else []
    rc1, summary, err1 = fuzzing.run_cli(["summary", str(path), "--json"] + extra)
    rc2, rows, err2 = fuzzing.run_cli(["allocations", str(path), "--csv"] + extra)
    assert (rc1, rc2) == (0, 0), err1 + err2
    return summary, rows


def entry_of(path) -> Path:
    snap = open_snapshot(str(path))
    assert snap.from_cache
    return Path(snap.cache_entry)


def copy_of(tmp_path, name, src=GROUNDTRUTH / "leak.pickle") -> Path:
    p = tmp_path / name
    shutil.copyfile(src, p)
    return p


def flip(path: Path, offset: int | None = None) -> None:
    b = bytearray(path.read_bytes())
    i = len(b) // 2 if offset is None else offset
    b[i] ^= 0x10
    path.write_bytes(bytes(b))


def test_swapped_entries_are_not_served(tmp_path, cache_dir):
    a = copy_of(tmp_path, "a.pickle", GROUNDTRUTH / "leak.pickle")
    b = copy_of(tmp_path, "b.pickle", GROUNDTRUTH / "lora.pickle")
    want_a, want_b = outputs(a, no_cache=True), outputs(b, no_cache=True)
    outputs(a)
    outputs(b)
    ea, eb = entry_of(a), entry_of(b)
    tmp = ea.with_name("swap")
    ea.rename(tmp)
    eb.rename(ea)
    tmp.rename(eb)
    assert outputs(a) == want_a
    assert outputs(b) == want_b
    assert entry_of(a).exists() and entry_of(b).exists()     # rebuilt, and good again


def _same_width_edit(data: bytes) -> tuple[int, bytes]:
    """An edit in the middle of the file (outside the 64 KiB of head and tail the cache key
    reads) that keeps the size: a 4-byte integer made 512 larger."""
    for s, e, name, arg in fuzzing.ops(data):
        if name == "BININT" and len(data) // 3 < s < 2 * len(data) // 3 and 4096 < arg < (1 << 30):
            return s, b"J" + struct.pack("<i", arg + 512)
    raise AssertionError("no BININT in the middle")


@pytest.mark.parametrize("racy_ns", [pcache.RACY_NS, 0], ids=["just written", "long ago"])
def test_an_edit_that_keeps_size_and_mtime_is_seen(tmp_path, cache_dir, monkeypatch, racy_ns):
    """`racy_ns=0` makes the cache trust the recorded stat identity at once (as it does for a
    file older than RACY_NS): then only the ctime tells the edit, which no user can set back."""
    monkeypatch.setattr(pcache, "RACY_NS", racy_ns)
    p = copy_of(tmp_path, "s.pickle")
    outputs(p)
    assert open_snapshot(str(p)).from_cache
    data = p.read_bytes()
    st = os.stat(p)
    at, new = _same_width_edit(data)
    with open(p, "r+b") as fh:            # in place: same inode, same size
        fh.seek(at)
        fh.write(new)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(p).st_size == st.st_size and os.stat(p).st_mtime_ns == st.st_mtime_ns
    assert outputs(p) == outputs(p, no_cache=True)
    assert not open_snapshot(str(p)).from_cache or True   # (reparsed once; served again after)
    assert open_snapshot(str(p)).from_cache


def test_an_unchanged_file_costs_one_stat(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(pcache, "RACY_NS", 0)
    p = copy_of(tmp_path, "s.pickle")
    open_snapshot(str(p))
    hashed = []
    real = pcache.crc32_file

    def counting(fh, *a, **k):
        hashed.append(getattr(fh, "name", "?"))
        return real(fh, *a, **k)
    monkeypatch.setattr(pcache, "crc32_file", counting)
    assert open_snapshot(str(p)).from_cache
    assert str(p) not in hashed                      # the snapshot was not read again


def test_a_copy_is_served_after_one_hash(tmp_path, cache_dir):
    p = copy_of(tmp_path, "s.pickle")
    open_snapshot(str(p))
    q = tmp_path / "copy.pickle"
    shutil.copy2(p, q)                      # same size and mtime, another inode: same key
    snap = open_snapshot(str(q))
    assert snap.from_cache and snap.path == str(q)


@pytest.mark.parametrize("target", ["d0_size.bin", "d0_action.bin", "d0_stack.bin", "tables.npz", "manifest",
                                    "source"])
def test_flipped_bytes_in_the_entry_are_not_served(tmp_path, cache_dir, target):
    p = copy_of(tmp_path, "s.pickle")
    want = outputs(p, no_cache=True)
    columns = fuzzing.snapshot_signature(read_snapshot(str(p)))
    outputs(p)
    flip(entry_of(p) / target)
    # what the parser hands out (the command line's output may come from cached analysis)
    assert fuzzing.snapshot_signature(open_snapshot(str(p))) == columns
    flip(entry_of(p) / target)
    assert outputs(p) == want
    assert outputs(p) == want               # rebuilt: served from the cache again, right


@pytest.mark.parametrize("damage", ["flip", "truncate", "fifo", "directory", "drop_sum"])
def test_a_damaged_artifact_reads_as_missing(tmp_path, cache_dir, damage):
    p = copy_of(tmp_path, "s.pickle")
    want = outputs(p, no_cache=True)
    outputs(p)
    entry = entry_of(p)
    arts = sorted(entry.glob("art-an-*-d0-live_after.npy")) + sorted(entry.glob("art-summary-*.json"))
    assert len(arts) == 2
    for art in arts:
        if damage == "flip":
            flip(art, len(art.read_bytes()) - 3)
        elif damage == "truncate":
            art.write_bytes(art.read_bytes()[:-5])
        elif damage == "drop_sum":
            (entry / ("sum-" + art.name[4:])).unlink()
        else:
            art.unlink()
            if damage == "fifo" and hasattr(os, "mkfifo"):
                os.mkfifo(art)
            else:
                art.mkdir()
    assert outputs(p) == want


def test_a_damaged_tables_npz_is_never_fatal(tmp_path, cache_dir):
    """A bad CRC inside the zip once crashed every later run until the cache was cleared."""
    p = copy_of(tmp_path, "s.pickle")
    want = outputs(p, no_cache=True)
    outputs(p)
    npz = entry_of(p) / "tables.npz"
    b = bytearray(npz.read_bytes())
    b[60] ^= 0xFF                           # inside the first member's data: zip's own CRC fails
    npz.write_bytes(bytes(b))
    for _ in range(3):
        assert outputs(p) == want


def test_a_fifo_in_the_cache_does_not_hang(tmp_path, cache_dir):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    p = copy_of(tmp_path, "s.pickle")
    want = outputs(p, no_cache=True)
    outputs(p)
    col = entry_of(p) / "d0_addr.bin"
    col.unlink()
    os.mkfifo(col)
    assert outputs(p) == want


def test_lone_surrogates_are_cached_and_read_back(tmp_path, cache_dir):
    for name in ("surrogate_frame", "surrogate_action", "surrogate_key", "surrogate_settings"):
        path = hostile.write_repro(name, tmp_path)
        first = open_snapshot(path)
        again = open_snapshot(path)
        assert not first.from_cache and again.from_cache, name
        assert again.strings == first.strings and again.action_names == first.action_names
        assert again.allocator_settings == first.allocator_settings and again.extra == first.extra
        assert {d: t.extras for d, t in again.traces.items()} == {d: t.extras for d, t in first.traces.items()}
    assert not list(cache_dir.rglob(".tmp-*"))


def test_artifacts_round_trip(tmp_path, cache_dir):
    import numpy as np
    p = copy_of(tmp_path, "s.pickle", GROUNDTRUTH / "sgd_accum.pickle")
    snap = open_snapshot(str(p))
    assert pcache.write_artifact(snap, "x.json", b'{"a": 1}')
    assert pcache.read_artifact(snap, "x.json") == b'{"a": 1}'
    for arr in (np.arange(10, dtype=np.int32), np.zeros(0, dtype=np.int64), np.ones((3, 4), dtype=np.float32)):
        assert pcache.write_artifact_array(snap, "a.npy", arr)
        got = pcache.map_artifact_array(snap, "a.npy")
        assert got.dtype == arr.dtype and np.array_equal(got, arr)
    assert pcache.read_artifact(snap, "absent") is None and pcache.map_artifact_array(snap, "absent") is None
    assert "a.npy" in pcache.artifact_names(snap) and not any(n.startswith("sum-") for n in pcache.artifact_names(snap))
    pcache.prune_artifacts(snap, lambda n: n == "a.npy")
    assert not (Path(snap.cache_entry) / "sum-a.npy").exists()


def test_the_cache_serves_under_an_address_space_limit(tmp_path):
    """Reading a cache file must not reserve its size bound up front (read(limit) allocates
    the whole limit): under a 2 GB address space the entry is still served."""
    import subprocess
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from vramscope.parsers import open_snapshot\n"
            "open_snapshot(sys.argv[1])\n"
            "print(open_snapshot(sys.argv[1]).from_cache)\n")
    env = dict(os.environ, VRAMSCOPE_CACHE_DIR=str(tmp_path / "c"))
    r = subprocess.run([sys.executable, "-c", code, str(GROUNDTRUTH / "sgd_accum.pickle")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
