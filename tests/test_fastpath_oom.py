"""`oom` entries on the fast path: torch writes them with `device_free` where other entries have
`addr` (action, device_free, size, stream, time_us, frames), and a trace that catches OOMs and
goes on (a batch-size search, a retry loop) holds one every few hundred entries. They read as
the interpreter reads them (device_free kept with the entry), the fast path decodes them in
its batches instead of stopping at each, a helper's batches still fit once the reader's shape
has taken the new key on, and a file that memoizes a key string again (an `addr` of its own
in an oom entry) does not leave the fast path stuck on that one entry's shape."""
from __future__ import annotations

import sys

from helpers import DATA
from test_fastpath_lists import read_fast as _read
from test_fastpath_lists import read_helped
from test_prefetch import with_helper  # noqa: F401  (a fixture)
from vramscope.parsers import fastpath
from vramscope.parsers.cache import read_snapshot

sys.path.insert(0, str(DATA))
import fuzzing  # noqa: E402

EVERY = 300


def _with_ooms(n: int, every: int = EVERY, odd_addr: bool = False) -> list[dict]:
    """n entries (their frames lists 40 shared ones, pickled once, then by memo reference), an
    oom in torch's layout after every `every` (`odd_addr`: each also given an `addr` of a
    string object of its own, last, as an old tiler wrote them)."""
    frames = [{"name": f"f{i}", "filename": f"/srv/m{i % 7}.py", "line": i} for i in range(200)]
    lists = [[frames[(7 * j + i) % 200] for i in range(j % 12)] for j in range(40)]
    out = []
    for k in range(n):
        e = {"action": ("alloc", "free_requested", "free_completed")[k % 3],
             "addr": 0x7F0000000000 + 512 * (k // 3), "size": 512 * (1 + k % 5), "stream": 0,
             "time_us": 1_700_000_000_000_000 + k, "frames": lists[(k // 3) % 40]}
        out.append(e)
        if k % every == every - 1:
            oom = {"action": "oom", "device_free": 1 << 20 if (k // every) % 2 else 1 << 62, "size": 3 << 30,
                   "stream": 0, "time_us": e["time_us"], "frames": e["frames"]}
            if odd_addr:
                oom["".join(("ad", "dr"))] = 0          # equal to "addr", another object
            out.append(oom)
    return out


def test_oom_entries_read_as_the_interpreter_reads_them_and_on_the_fast_path(tmp_path):
    entries = _with_ooms(9000)
    n_oom = sum(e["action"] == "oom" for e in entries)
    path, fast, decoded = _read(tmp_path, entries)
    slow = read_snapshot(str(path), fast=False)
    assert fuzzing.snapshot_signature(fast) == fuzzing.snapshot_signature(slow)
    frees = [e["device_free"] for e in fast.trace(0).extras.values()]
    assert len(frees) == n_oom == 30
    assert frees.count(1 << 20) == 15 and frees.count(None) == 15    # 2^62 bytes free: absurd, unknown
    # the interpreter builds the entries that pickle a frames list first (120) and the first
    # oom (its key is new then); every other oom is decoded in a batch with the entries around
    # it (stopping at each, the fast path took 96 batches, 8,843 entries)
    assert sum(decoded) >= len(entries) - 120 - 10, (sum(decoded), len(entries))
    assert len(decoded) < 30, len(decoded)


def test_a_key_string_memoized_again_does_not_hold_the_fast_path(tmp_path):
    entries = _with_ooms(9000, odd_addr=True)
    path, fast, decoded = _read(tmp_path, entries)
    slow = read_snapshot(str(path), fast=False)
    assert fuzzing.snapshot_signature(fast) == fuzzing.snapshot_signature(slow)
    # each odd oom goes to the interpreter, and the entries after it to the fast path again
    # (held on the odd shape, it took 1,206 of a million entries of a tiled trace)
    assert sum(decoded) >= len(entries) - 120 - 30 - 60, sum(decoded)


def test_a_helpers_batches_fit_after_the_reader_learns_the_oom_key(tmp_path, with_helper, monkeypatch):
    # the first oom comes after the helper has started (at the first batch of 4,096): the
    # reader's shape then has device_free, the helper's has not
    helped, alone = read_helped(tmp_path, _with_ooms(60_000, every=20_000), monkeypatch)
    assert with_helper and with_helper[0] > 10_000, with_helper
    assert fuzzing.snapshot_signature(helped) == fuzzing.snapshot_signature(alone)
    assert len(helped.trace(0).extras) == 3


def test_shape_fits():
    torch_shape = ("action", "addr", "size", "stream", "time_us", "frames")
    merged = ("action", "device_free", "addr", "size", "stream", "time_us", "frames")
    assert fastpath.shape_fits(torch_shape, merged)
    assert fastpath.shape_fits(torch_shape, torch_shape)
    assert not fastpath.shape_fits(merged, torch_shape)
    assert not fastpath.shape_fits(("action", "size", "addr"), torch_shape)
    assert not fastpath.shape_fits(("addr", "action"), ("action", "addr"))
    assert not fastpath.shape_fits((), torch_shape)
