"""The input of a pass's first block, found for every pass at once (`_FirstInputs.many`), is the
one the look-back of one call at a time finds (`_FirstInputs.__call__`): on random rows where
the walk back goes over many rows freed too early, and on the structure of real traces."""
from __future__ import annotations

import types

import numpy as np
import pytest

from vramscope.classifiers import analyze
from vramscope.classifiers.structure import _FirstInputs, structure
from vramscope.parsers import open_snapshot

from helpers import DATA


def _one_by_one(fi_, first, out_size, pass_start):
    return np.array([fi_(types.SimpleNamespace(first=int(f)), int(s), int(p))
                     for f, s, p in zip(first, out_size, pass_start)], dtype=np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_many_is_the_look_back_of_each_call(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    ai = np.sort(rng.choice(20_000, n, replace=False)).astype(np.int32)
    ai[rng.random(n) < 0.05] = -1                     # rows live before the trace
    life = rng.integers(1, 400, n)
    fi = np.where(rng.random(n) < 0.2, -1, ai + life).astype(np.int32)   # some never freed
    size = rng.choice([512, 1024, 4096], n).astype(np.int64)
    k = 400
    first = rng.integers(0, 20_000, k)
    pass_start = np.maximum(first - rng.integers(0, 3000, k), 0)
    out_size = rng.choice([512, 1024, 4096, 8192], k)     # 8192: no row of that size
    fi_ = _FirstInputs(ai, fi, size)
    want = _one_by_one(fi_, first, out_size, pass_start)
    got = _FirstInputs(ai, fi, size).many(first, out_size, pass_start)
    assert np.array_equal(got, want)
    assert (want >= 0).sum() > k // 4 and (want < 0).sum() > 0        # both kinds of answer met


@pytest.mark.parametrize("name", ["fit_b2.pickle", "cuda_lora.pickle", "cuda_ckpt.pickle"])
def test_first_calls_inputs_on_real_traces(name, tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path))
    an = analyze(open_snapshot(str(DATA / name)), use_cache=False)
    da = an.devices[an.primary_device()]
    st = structure(da)
    a = da.allocs
    firsts = [j for j, c in enumerate(st.calls) if c.block == 0 and st.outputs[j] >= 0]
    assert firsts
    fi_ = _FirstInputs(np.asarray(a.alloc_index), np.asarray(a.free_index), np.asarray(a.size, dtype=np.int64))
    for j in firsts:
        c = st.calls[j]
        want = fi_(c, int(a.size[st.outputs[j]]), int(st.passes[c.forward_pass, 0]))
        assert st.inputs[j] == want
