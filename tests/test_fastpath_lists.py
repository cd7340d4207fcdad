"""The fast path's inline frames lists: where one ends is taken from where the next entry begins
when the list is an entry's last key (torch's order), walked otherwise; either way the snapshot
reads exactly as the interpreter reads it, and the fast path still takes most entries."""
from __future__ import annotations

import pickle
import random
import sys

import pytest

from helpers import DATA
from vramscope.parsers import fastpath
from vramscope.parsers.cache import read_snapshot

sys.path.insert(0, str(DATA))
import fuzzing  # noqa: E402
import hostile  # noqa: E402

KEYS_TORCH = ("action", "addr", "size", "stream", "time_us", "frames")
KEYS_FRAMES_INSIDE = ("action", "addr", "size", "frames", "stream", "time_us")


def _entries(n: int, keys: tuple, seed: int = 0) -> list[dict]:
    """n trace entries, each with a list of its own (pickled inline) of frame dicts shared
    across entries: 0 to 40 frames, up to 600 distinct frames (memo indices past 255: BINGET
    and LONG_BINGET mixed in a list), a new frame first met (pickled inside a list) every 40
    entries all along."""
    rng = random.Random(seed)
    frames = [{"name": f"f{i}", "filename": f"/srv/m{i % 7}.py", "line": i} for i in range(600)]
    out = []
    for k in range(n):
        known = min(len(frames), 300 + k // 40)
        depth = rng.choice((0, 1, 2, 3, 8, 15, 40))
        fr = [frames[rng.randrange(min(known, 300))] for _ in range(depth)]
        if k % 40 == 0 and known > 300:
            fr.append(frames[known - 1])
        vals = {"action": ("alloc", "free_requested", "free_completed")[k % 3],
                "addr": 0x7F0000000000 + 512 * (k // 3), "size": 512 * (1 + k % 5), "stream": 0,
                "time_us": 1_700_000_000_000_000 + k, "frames": fr}
        out.append({key: vals[key] for key in keys})
    return out


def read_fast(tmp_path, entries, protocol=4):
    """The snapshot of `entries` written and read with the fast path: (its path, the snapshot,
    the entries the fast path took in each of its batches)."""
    path = tmp_path / "entries.pickle"
    path.write_bytes(pickle.dumps(hostile._snapshot_with(entries), protocol=protocol))
    taken = []
    decode = fastpath.FastPath._decode

    def counting(self, *a):
        got = decode(self, *a)
        taken.append(got[0])
        return got
    fastpath.FastPath._decode = counting
    try:
        fast = read_snapshot(str(path), fast=True)
    finally:
        fastpath.FastPath._decode = decode
    return path, fast, taken


def read_helped(tmp_path, entries, monkeypatch):
    """The snapshot of `entries` written, read with a helper (the `with_helper` fixture set up)
    and without: (helped, alone)."""
    from test_prefetch import _without_helper
    path = tmp_path / "helped.pickle"
    path.write_bytes(pickle.dumps(hostile._snapshot_with(entries), protocol=4))
    return read_snapshot(str(path)), _without_helper(path, monkeypatch)


def _read_both(tmp_path, entries, protocol=4):
    path, fast, taken = read_fast(tmp_path, entries, protocol)
    slow = read_snapshot(str(path), fast=False)
    return fast, slow, sum(taken)


@pytest.mark.parametrize("keys", [KEYS_TORCH, KEYS_FRAMES_INSIDE], ids=["frames last", "frames inside"])
@pytest.mark.parametrize("protocol", [4, 5])
def test_inline_lists_read_as_the_interpreter_reads_them(tmp_path, keys, protocol):
    entries = _entries(6000, keys)
    fast, slow, taken = _read_both(tmp_path, entries, protocol)
    assert fuzzing.snapshot_signature(fast) == fuzzing.snapshot_signature(slow)
    assert len(fast.trace(0)) == 6000
    # the fast path took most entries (those with a new frame inside their list excepted),
    # an empty list before the next key's reference too (it read as a one-element list cut
    # short: 156 of 6,000 entries were taken with frames inside; torch 2.10+ writes
    # forward_frames after frames, and a tiled trace of it parsed at 1/50th of the speed)
    assert taken > 4000, taken


def test_a_list_whose_end_would_be_guessed_wrong_is_read_as_the_interpreter_reads_it(tmp_path):
    # frames last, and the bytes before the next entry look like a list's end but hold a frame
    # dict pickled inline: the guess must be refused, not taken as memo references
    entries = _entries(3000, KEYS_TORCH, seed=3)
    late = {"name": "late", "filename": "/srv/late.py", "line": 1}
    for e in entries[1500::97]:
        e["frames"] = list(e["frames"]) + [late, {"name": "x", "filename": "/srv/x.py", "line": 2}]
    fast, slow, _ = _read_both(tmp_path, entries)
    assert fuzzing.snapshot_signature(fast) == fuzzing.snapshot_signature(slow)


def test_only_whole_memo_references_count_as_a_list():
    assert fastpath.ref_indices(b"") is not None
    assert fastpath.ref_indices(b"h\x01j\x02\x01\x00\x00h\x65") is not None
    assert fastpath.ref_indices(b"h\x01}\x94(h\x02") is None        # a frame dict pickled inside
    assert fastpath.ref_indices(b"h\x01j\x02\x01") is None          # a reference cut short
    assert fastpath.ref_indices(b"h") is None


def test_memo_indices_of_one_form_or_mixed():
    jj = b"".join(b"j" + i.to_bytes(4, "little") for i in (300, 70_000, 256, 1 << 31))
    assert fastpath.ref_indices(jj) == [300, 70_000, 256, 1 << 31]
    assert fastpath.ref_indices(b"h\x01h\xffh\x00") == [1, 255, 0]
    assert fastpath.ref_indices(b"h\x05" + jj[:5] + b"h\x06") == [5, 300, 6]
    assert fastpath.ref_indices(jj + b"h\x02h\x01") == [300, 70_000, 256, 1 << 31, 2, 1]   # torch's: outer frames last
    assert fastpath.ref_indices(b"h\x02h\x01" + jj) == [2, 1, 300, 70_000, 256, 1 << 31]
    assert fastpath.ref_indices(jj[:5] + b"h\x6a" + jj[5:10] + b"h\x68") == [300, 0x6A, 70_000, 0x68]
    assert fastpath.ref_indices(jj + b"h") is None
    assert fastpath.ref_indices(b"") == []
    assert fastpath.ref_indices(jj[:-1]) is None                  # cut short
    assert fastpath.ref_indices(b"jh\x01\x00\x00") == [360]         # (an index's bytes are any bytes)
    assert fastpath.ref_indices(jj[:5] + b"}\x94") is None        # a dict pickled inside
    long = b"".join(b"j" + i.to_bytes(4, "little") for i in range(3000))   # past the one-form table
    assert fastpath.ref_indices(long) == list(range(3000))


def test_entries_that_share_a_pool_tuple_read_it_once(tmp_path, monkeypatch):
    """torch 2.13+ gives every entry its pool's id, one tuple per pool that the pickle refers to
    from every entry after the first. The fast path reads each tuple it meets from the memo once
    per batch, not once an entry (a Python loop over 10^6 entries was 1.5 s of a 2.6 s parse),
    and reads what the interpreter reads."""
    from vramscope.parsers.interpreter import Interpreter
    pools = [(0, 0), (1, 7), (2, -(1 << 63)), (3, (1 << 64) - 1)]      # (the last kept as its bit pattern)
    entries = []
    for k, e in enumerate(_entries(6000, KEYS_TORCH)):       # torch 2.13's order: the pool before the frames
        frames = e.pop("frames")
        entries.append({**e, "pool_id": pools[(k // 500) % len(pools)], "frames": frames})
    calls = [0]
    memo_get = Interpreter.memo_get

    def counted(self, i):
        calls[0] += 1
        return memo_get(self, i)
    monkeypatch.setattr(Interpreter, "memo_get", counted)
    fast, slow, taken = _read_both(tmp_path, entries)
    assert fuzzing.snapshot_signature(fast) == fuzzing.snapshot_signature(slow)
    cols = fast.trace(0).columns
    want = [pools[(k // 500) % len(pools)] for k in range(6000)]
    got = list(zip(cols["pool_a"].tolist(), cols["pool_b"].tolist()))
    assert got == [(a, b - (1 << 64) if b >= 1 << 63 else b) for a, b in want]
    assert taken > 4000 and calls[0] < 1000, (taken, calls[0])
