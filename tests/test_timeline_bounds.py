"""The timeline keeps its runs of equal phase and its iterations as bounds, and answers for any
entry from them: the id of every entry, made on demand, and the lookup of a few, agree with
each other, with the iterations' own bounds and with the phases. It keeps no int array per
entry besides the phase (two were 80 MB at 10^7 events for the analysis' whole life)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import DATA, GROUNDTRUTH, analysis_of
from vramscope.classifiers.timeline import P_INPUTS, P_NONE

RUNS = [DATA / "cuda_full.pickle", DATA / "cuda_ckpt.pickle", DATA / "oom.pickle",
        DATA / "adamw_from_start.pickle", *sorted(GROUNDTRUTH.glob("*.pickle"))[:3]]


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.name)
def test_runs_and_iterations_from_their_bounds(path):
    an = analysis_of(path)
    da = an.devices[an.primary_device()]
    t = da.timeline
    n = len(t.phase)
    assert n > 0 and len(da.iterations) > 0

    # runs: the runs of equal phase, reading the batch being prepared inside an iteration
    # (marked inputs after the runs were found) as the outside-phase run it was
    ph = np.where(t.phase == P_INPUTS, P_NONE, t.phase)
    want_start = np.r_[0, np.flatnonzero(ph[1:] != ph[:-1]) + 1]
    assert t.seg_start.tolist() == want_start.tolist()
    ids = t.segment_ids()
    assert ids.dtype == np.int32 and len(ids) == n
    assert ids.tolist() == (np.searchsorted(want_start, np.arange(n), side="right") - 1).tolist()
    every = np.arange(n)
    assert t.segment_of(every).tolist() == ids.tolist()
    lo, hi = t.segment_bounds(ids)
    assert (lo <= every).all() and (every <= hi).all()
    assert (ids[lo] == ids).all() and (ids[hi] == ids).all()

    # iterations: number - 1 over each one's entries, -1 elsewhere
    want = np.full(n, -1)
    for k, it in enumerate(da.iterations):
        assert it.number == k + 1
        want[it.start_index:it.end_index + 1] = k
    got = t.iteration_ids()
    assert got.dtype == np.int32 and got.tolist() == want.tolist()
    assert t.iteration_of(every).tolist() == want.tolist()
    for i in {0, n - 1, da.iterations[0].start_index, da.iterations[-1].end_index, da.peak.index}:
        if 0 <= i < n:
            assert t.iteration_of(int(i)) == want[i]
            k = want[i]
            assert da.iteration_at(int(i)) == (da.iterations[k] if k >= 0 else None)

    # nothing per entry kept but the phase
    for f in dataclasses.fields(t):
        v = getattr(t, f.name)
        if isinstance(v, np.ndarray) and f.name != "phase":
            assert len(v) <= len(want_start), f.name


def test_no_iterations_and_an_empty_trace():
    from vramscope.classifiers.timeline import Timeline
    t = Timeline(np.array([0, 0, 2, 2], np.uint8), np.array([0, 2]))
    assert t.iteration_ids().tolist() == [-1] * 4
    assert t.iteration_of(3) == -1 and t.iteration_of(np.arange(4)).tolist() == [-1] * 4
    assert t.segment_ids().tolist() == [0, 0, 1, 1]
    assert [int(x) for x in t.segment_bounds(1)] == [2, 3]
    e = Timeline(np.zeros(0, np.uint8), np.zeros(0, np.int64))
    assert len(e.segment_ids()) == 0 and len(e.iteration_ids()) == 0
