"""Shared test helpers: where the real snapshots are, and a trusted reference reader.

The reference works on `pickle.load` output, so it may only ever see trusted
files (../shared/snapshots, our own fixtures); it is the independent definition
the parser's figures are checked against.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "snapshots"
GROUNDTRUTH = REPO / "tests" / "groundtruth"
DATA = REPO / "tests" / "data"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/snapshots is not here")

# The README of ../shared/snapshots: peak live bytes per device, which `vramscope summary` must reproduce.
REAL_PEAKS = {
    "cranberrii+ftcourse__memory_snapshot.pickle": {0: 5876132840},
    "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle": {0: 54802667524},
    "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_forward_mixed.pickle": {0: 23873313792},
    "MAGMA27+assignment2-systems__memory_snapshot.pickle": {0: 13923997700},
    "JasperSolt+EoR_NN__snapshot.pickle": {0: 108258676},
    "HugePandaCoder+octree-nca-groupeq__my_snapshot.pickle": {0: 5692437840},
    "Yiyi-philosophy+LLM-inference__1.3b_snapshot.pickle": {0: 5692346376},
    "Muduard+LayoutEditing__memory_snapshot.pkl": {1: 3308174782},
    "volcengine+verl__mem.pickle": {0: 25483614352},
    "SunnySood80+unsupervised_finetune_resnet50__dump_snapshot.pickle": {},
}
NOT_A_SNAPSHOT = "NOT_A_SNAPSHOT__peopleofdata+mygpt__memory.pickle"


def shared(name: str) -> str:
    return str(SHARED / name)


def require(path) -> Path:
    """`path`, when it is here. A snapshot of ../shared (not part of the repository) that is
    absent skips the test; a committed file (tests/data, tests/groundtruth, assets) that is
    absent fails it: a deleted fixture must never pass as a skip."""
    p = Path(path)
    if p.exists():
        return p
    if SHARED in p.parents:
        pytest.skip(f"{p.name} is not in ../shared/snapshots")
    pytest.fail(f"the committed file {p} is missing (tests/data/make_fixtures.py writes the synthetic fixtures)")


def reference_peaks(obj) -> dict:
    """Peak live bytes per device from a trusted, fully loaded snapshot object."""
    segs = obj["segments"] if isinstance(obj, dict) else obj
    traces = obj.get("device_traces", []) if isinstance(obj, dict) else []
    out = {}
    devices = {s["device"] for s in segs} | {i for i, t in enumerate(traces) if t}
    for dev in sorted(devices):
        live = {}
        for s in segs:
            if s["device"] != dev:
                continue
            cursor = s["address"]
            for b in s["blocks"]:
                a = b.get("address", cursor)
                cursor = a + b["size"]
                if b["state"] in ("active_allocated", "active_pending_free"):
                    live[a] = b.get("requested_size", b["size"])
        trace = traces[dev] if dev < len(traces) else []
        for e in reversed(trace):
            if e["action"] == "alloc":
                live.pop(e["addr"], None)
            elif e["action"] in ("free_completed", "free"):
                live[e["addr"]] = e["size"]
        cur = peak = sum(live.values())
        for e in trace:
            if e["action"] == "alloc":
                cur += e["size"]
                peak = max(peak, cur)
            elif e["action"] in ("free_completed", "free"):
                cur -= e["size"]
        out[dev] = peak
    return out


def live_curve(trace, start):
    """Live bytes after each entry of a trusted trace (a list of dicts), from `start`."""
    cur, out = start, []
    for e in trace:
        if e["action"] == "alloc":
            cur += e["size"]
        elif e["action"] in ("free_completed", "free"):
            cur -= e["size"]
        out.append(cur)
    return out


def phase_of(iteration, index):
    """The phase of a truth file's iteration (tests/groundtruth/*.truth.json) holding `index`."""
    return next(p["phase"] for p in iteration["phases"] if p["start_index"] <= index <= p["end_index"])


def load_trusted(path) -> object:
    with open(path, "rb") as fh:
        return pickle.load(fh)


@pytest.fixture
def no_cache(monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")


def env_without_cache() -> dict:
    env = dict(os.environ)
    env["VRAMSCOPE_CACHE_DIR"] = ""
    return env


def real_snapshots() -> list:
    """The real snapshots of ../shared (none where it is absent), less the one that is not a snapshot."""
    if not SHARED.is_dir():
        return []
    return [p for p in sorted(SHARED.iterdir()) if p.suffix in (".pickle", ".pkl") and p.name != NOT_A_SNAPSHOT]


_ANALYSES: dict = {}


def analysis_of(path):
    """`analyze(open_snapshot(path))` without the column cache, once per test process."""
    from vramscope.classifiers import analyze
    from vramscope.parsers import open_snapshot
    key = str(path)
    if key not in _ANALYSES:
        _ANALYSES[key] = analyze(open_snapshot(key, use_cache=False))
    return _ANALYSES[key]
