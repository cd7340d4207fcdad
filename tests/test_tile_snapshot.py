"""The benchmarks' tiler (benchmarks/tile_snapshot.py): a real snapshot's trace replayed to N
entries reads back as N entries whose replays pair up as the original's do, and a file that
names a class is refused, not run."""
from __future__ import annotations

import os
import pickle
import sys

from helpers import DATA, require

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import tile_snapshot  # noqa: E402


def test_a_tiled_trace_reads_back_as_its_replays(tmp_path):
    src = require(DATA / "oom.pickle")
    out = tmp_path / "tiled.pickle"
    assert tile_snapshot.main([str(src), "--events", "4000", "-o", str(out)]) == 0
    from vramscope.classifiers import analyze
    from vramscope.parsers import open_snapshot
    one = analyze(open_snapshot(str(src), use_cache=False), use_cache=False)
    many = analyze(open_snapshot(str(out), use_cache=False), use_cache=False)
    dev = max(one.devices, key=lambda d: one.devices[d].n_entries)
    n = one.devices[dev].n_entries
    assert many.devices[dev].n_entries == 4000
    # each whole replay allocates what the original did, at its own addresses
    whole = 4000 // n
    assert whole >= 2
    assert int((many.devices[dev].allocs.alloc_index >= 0).sum()) >= whole * int((one.devices[dev].allocs.alloc_index >= 0).sum())
    # an oom entry is replayed as torch writes one: device_free, no addr added
    with open(out, "rb") as f:
        ooms = [e for t in pickle.load(f)["device_traces"] for e in t if e["action"] == "oom"]
    assert len(ooms) >= whole
    assert all("device_free" in e and "addr" not in e for e in ooms)


def test_a_file_that_names_a_class_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 0, "time_us": 1,
                                                       "frames": [dict]}]]}, protocol=4))
    assert tile_snapshot.main([str(bad), "-o", str(tmp_path / "x.pickle")]) == 3
    assert "refusing" in capsys.readouterr().err
    assert not (tmp_path / "x.pickle").exists()
