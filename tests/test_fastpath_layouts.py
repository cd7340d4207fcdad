"""Every trace layout we know stays on the fast path at scale: each fixture and each shared real
snapshot, its trace replayed four times or more (benchmarks/tile_snapshot.py), reads past its
first replay almost wholly in the fast path's batches, and in long ones.

Not a timing test: it counts what the fast path decoded and in how many batches. It fails where a
layout falls off the fast path entry by entry, as three did, found by timing `summary` on every
layout tiled to 10^6 entries (none of them in the 10^7 benchmarks): an empty frames list before
forward_frames (torch 2.10+: 17% of entries to the interpreter, 88x pickle.load), a key the fast
path did not know on every 17th entry (86%, 35x), an oom entry's device_free (a batch cut at each
OOM: 13 to 850 entries a batch, 4x)."""
from __future__ import annotations

import io
import os
import pickle
import sys

import pytest

from helpers import DATA, SHARED
from vramscope.parsers import fastpath
from vramscope.parsers.cache import read_snapshot

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import tile_snapshot  # noqa: E402

FILES = sorted(DATA.glob("*.pickle")) + (
    sorted(p for p in SHARED.iterdir() if p.suffix in (".pickle", ".pkl")) if SHARED.is_dir() else [])


def _trace_of(path) -> dict | None:
    with open(path, "rb") as f:
        try:
            snap = tile_snapshot._DataOnly(io.BufferedReader(f)).load()
        except Exception:
            return None
    if not isinstance(snap, dict) or not isinstance(snap.get("device_traces"), list) or not any(snap["device_traces"]):
        return None
    return snap


@pytest.mark.parametrize("path", FILES, ids=[p.name[:60] for p in FILES])
def test_a_layout_replayed_reads_on_the_fast_path(path, tmp_path, monkeypatch):
    snap = _trace_of(path)
    if snap is None:
        pytest.skip("no trace to replay")
    n0 = max(len(t) for t in snap["device_traces"])
    tiled = tmp_path / "tiled.pickle"
    with open(tiled, "wb") as f:
        pickle.dump(tile_snapshot.tile(snap, max(4 * n0, 20_000)), f, protocol=4)
    late: list[int] = []               # of each batch, the entries past the first replay
    decode = fastpath.FastPath._decode

    def counting(self, c, device, *a):
        row = self.r.sink.device(device).n
        got = decode(self, c, device, *a)
        if row + got[0] > n0:
            late.append(row + got[0] - max(row, n0))
        return got
    monkeypatch.setattr(fastpath.FastPath, "_decode", counting)
    monkeypatch.setenv("VRAMSCOPE_PARSE_HELPER", "0")
    snap2 = read_snapshot(str(tiled), fast=True)
    total = max(len(snap2.trace(d)) for d in snap2.devices)
    assert sum(late) >= 0.97 * (total - n0), (sum(late), total, n0)
    assert (total - n0) / max(len(late), 1) >= 1500, (len(late), total, n0)
