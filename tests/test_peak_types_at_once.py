"""The iterations' peak types found at once (classifiers/peaks.py `_backward_shares`, one pass
over the rows freed in the backward runs; `peak_types`) are the ones found one entry at a time
(recomputed here as `_backward_kind` found them before `peak_types` replaced it): the same share,
so the same word, at every backward entry asked about."""
from __future__ import annotations

import numpy as np
import pytest

from helpers import DATA, GROUNDTRUTH, analysis_of
from vramscope.classifiers import peaks
from vramscope.classifiers.timeline import P_BACKWARD

RUNS = [DATA / "cuda_full.pickle", DATA / "cuda_ckpt.pickle", DATA / "cuda_lora.pickle",
        DATA / "adamw_from_start.pickle", *sorted(GROUNDTRUTH.glob("*.pickle"))[:4]]


def _share_one_at_a_time(da, index: int) -> float:
    """`_backward_kind`'s share, read back from the word's cut points is too coarse: recomputed
    here as it does, on the rows freed in the entry's run."""
    t = da.timeline
    ids = t.segment_ids()
    seg = ids[index]
    s0 = int(np.searchsorted(ids, seg, side="left"))
    s1 = int(np.searchsorted(ids, seg, side="right")) - 1
    a = da.allocs
    rows = np.flatnonzero((a.free_index >= s0) & (a.free_index <= s1))
    ai = a.alloc_index[rows]
    consumed = (da.category[rows] == peaks.I_ACT) & (ai >= 0) & (ai < s0)
    total = int(a.size[rows][consumed].sum())
    if total > 0:
        return int(a.size[rows][consumed & (a.free_index[rows] <= index)].sum()) / total
    return (index - s0) / max(1, s1 - s0)


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.name)
def test_backward_shares_at_once_are_those_one_at_a_time(path):
    if not path.exists():
        pytest.skip(f"no {path.name}")
    an = analysis_of(path)
    da = an.devices[an.primary_device()]
    back = np.flatnonzero(da.timeline.phase == P_BACKWARD)
    if not len(back):
        pytest.skip("no backward in this run")
    rng = np.random.default_rng(0)
    asked = np.unique(np.r_[back[:3], back[-3:], rng.choice(back, size=min(200, len(back)), replace=False)])
    shares = peaks._backward_shares(da, np.r_[asked, -1, len(da.timeline.phase)])   # outside: left out
    assert sorted(shares) == asked.tolist()
    typed = peaks.peak_types(da, da.facts, asked)
    for k, word in zip(asked.tolist(), typed):
        assert shares[k] == pytest.approx(_share_one_at_a_time(da, k), abs=1e-12)
        assert word == peaks._backward_word(_share_one_at_a_time(da, k)) == peaks.peak_type(da, da.facts, k)


def test_a_run_with_backward_peaks_gets_them_typed_as_before():
    an = analysis_of(DATA / "cuda_full.pickle")
    da = an.devices[an.primary_device()]
    typed = [it.peak_type for it in da.iterations]
    assert typed and all(t == peaks.peak_type(da, da.facts, it.peak_index)
                         for t, it in zip(typed, da.iterations))


def test_no_backward_entry_asked_about_finds_nothing():
    an = analysis_of(DATA / "cuda_full.pickle")
    da = an.devices[an.primary_device()]
    not_back = np.flatnonzero(da.timeline.phase != P_BACKWARD)[:50]
    assert peaks._backward_shares(da, not_back) == {}


def test_activations_made_inside_the_run_are_not_counted_as_consumed(monkeypatch):
    """Rows made and freed inside one backward run, called activations here, are not consumed
    activations of it: the shares at once leave them out as one entry at a time does."""
    an = analysis_of(DATA / "cuda_full.pickle")
    da = an.devices[an.primary_device()]
    t, a = da.timeline, da.allocs
    ok = (a.alloc_index >= 0) & (a.free_index >= 0)
    ai, fi = np.maximum(a.alloc_index, 0), np.maximum(a.free_index, 0)
    ids = t.segment_ids()
    inside = ok & (t.phase[ai] == P_BACKWARD) & (ids[ai] == ids[fi])
    assert inside.any()
    cat = da.category.copy()
    cat[inside] = peaks.I_ACT
    monkeypatch.setattr(da, "category", cat)
    asked = np.unique(fi[inside])
    shares = peaks._backward_shares(da, asked)
    for k in asked.tolist():
        assert shares[k] == pytest.approx(_share_one_at_a_time(da, k), abs=1e-12)
        assert peaks._backward_word(shares[k]) == peaks._backward_word(_share_one_at_a_time(da, k))
