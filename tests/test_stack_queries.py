"""The per-stack queries (StackFacts.any / first_pos / first_frame / last_frame /
innermost_frame) against a loop over each stack's frames, on real traces, for a mask of no
frame, of every frame, and of some: the first two are answered without a pass over the slots."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from vramscope.classifiers.stacks import StackFacts
from vramscope.parsers import open_snapshot

from helpers import DATA

FILES = ["leak.pickle", "fx_frames.pickle", "forward_frames_213.pickle", "torch20_history.pickle", "made"]


def _made(path) -> str:
    """A trace whose stacks have 0, 1, 2 and 6 frames (the fixtures have none of one frame)."""
    frames = [{"name": f"fn{i}", "filename": f"/src/m{i % 3}.py", "line": i} for i in range(9)]
    stacks = [[], [frames[0]], [frames[1]], [frames[2], frames[0]], frames[3:9], [frames[8]]]
    trace = [{"action": "alloc", "addr": 0x7f0000000000 + 512 * k, "size": 512, "stream": 0,
              "time_us": 1_700_000_000_000_000 + k, "frames": list(st)} for k, st in enumerate(stacks)]
    snap = {"segments": [], "device_traces": [trace], "allocator_settings": {}, "external_annotations": []}
    out = path / "made.pickle"
    out.write_bytes(pickle.dumps(snap, protocol=4))
    return str(out)


def _reference(sf: StackFacts, mask: np.ndarray):
    any_, first, last = [], [], []
    for s in range(sf.n_stacks):
        fr = sf.frames[sf.offsets[s]:sf.offsets[s + 1]].tolist()
        hits = [p for p, f in enumerate(fr) if mask[f]]
        any_.append(bool(hits))
        first.append(hits[0] if hits else -1)
        last.append(fr[hits[-1]] if hits else -1)
    return np.array(any_, dtype=bool), np.array(first, dtype=np.int64), np.array(last, dtype=np.int64)


@pytest.mark.parametrize("name", FILES)
def test_stack_queries_match_a_loop(name, tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path))
    snap = open_snapshot(_made(tmp_path) if name == "made" else str(DATA / name))
    sf = StackFacts(snap)
    n_frames = len(sf.table.kind)
    assert sf.n_stacks > 1 and n_frames > 1
    rng = np.random.default_rng(0)
    masks = {"none": np.zeros(n_frames, dtype=bool), "all": np.ones(n_frames, dtype=bool),
             "some": rng.random(n_frames) < 0.3, "one": np.arange(n_frames) == int(sf.frames[0])}
    for what, mask in masks.items():
        want_any, want_first, want_last = _reference(sf, mask)
        assert np.array_equal(sf.any(mask), want_any), what
        assert np.array_equal(sf.first_pos(mask), want_first), what
        first_frame = np.where(want_first >= 0, sf.frames[sf.offsets[:-1] + np.maximum(want_first, 0)], -1)
        assert np.array_equal(sf.first_frame(mask), first_frame), what
        assert np.array_equal(sf.last_frame(mask), want_last), what
        inner = np.where(sf.outer_first, want_last, first_frame)
        assert np.array_equal(sf.innermost_frame(mask), inner), what
