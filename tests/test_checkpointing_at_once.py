"""The checkpointing lever rewrites every block call at once (numpy over all calls, the event
keys handed out call by call in the same order): the rewritten run is the one the call-by-call
rewrite gives, key for key, on recorded runs of transformers and CNNs; where the calls' edits
could depend on each other it declines and the call-by-call rewrite runs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import DATA, analysis_of
from vramscope.classifiers.levers import checkpointing as ck
from vramscope.classifiers.simulate import Context, Rewrite, _keys

RUNS = ["levers/dev/llama_tied.base.pickle", "levers/dev/bert_dropout.base.pickle", "levers/dev/gpt2_bf16.base.pickle",
        "levers/dev/cnn_bn.base.pickle", "levers/cpu/gpt_l4_s128_b4_full.pickle", "levers/cpu/gpt_l4_s128_b4_lora.pickle",
        "facts/oom_first_forward.run.pickle"]


def _both(da, st):
    a, b = Rewrite(da, st), Rewrite(da, st)
    kept = ck._kept(a, st)
    return a, ck._rewrite_at_once(a, st, *kept), b, ck._rewrite_call_by_call(b, st, *kept)


def _extra(rw, i):
    return np.concatenate([np.asarray(p[i]) for p in rw._extra]) if rw._extra else np.zeros(0)


@pytest.mark.parametrize("name", RUNS)
def test_at_once_is_the_call_by_call_rewrite(name):
    an = analysis_of(DATA / name)
    da = an.devices[an.primary_device()]
    st = Context(da).structure
    if st.blocks is None:
        pytest.skip("no blocks found")
    a, done_a, b, done_b = _both(da, st)
    assert done_a is not None and done_a == done_b > 0
    assert (a.fk != _keys(a.fi)).any()           # it did rewrite the run
    assert (a.fk == b.fk).all()
    assert a._next == b._next
    for i in range(7):
        assert (_extra(a, i) == _extra(b, i)).all()
    # the inputs kept until their block's backward: some were moved, and identically
    moved = np.asarray(st.inputs)[np.asarray(st.inputs) >= 0]
    assert (a.fk[moved] == b.fk[moved]).all()


def test_a_shared_input_is_left_to_the_call_by_call_rewrite():
    an = analysis_of(DATA / RUNS[0])
    da = an.devices[an.primary_device()]
    st = Context(da).structure
    inputs = np.asarray(st.inputs).copy()
    inputs[1:] = inputs[1]                      # every call's input the same row
    shared = dataclasses.replace(st, inputs=inputs)
    rw = Rewrite(da, shared)
    assert ck._rewrite_at_once(rw, shared, *ck._kept(rw, shared)) is None
    assert not rw._extra and not rw._next       # nothing was edited before declining


def test_reserve_many_hands_out_the_keys_reserve_would_one_at_a_time():
    import random
    rng = random.Random(3)
    an = analysis_of(DATA / RUNS[0])
    da = an.devices[an.primary_device()]
    st = Context(da).structure
    a, b = Rewrite(da, st), Rewrite(da, st)
    for rw in (a, b):
        rw.reserve(5, 3)                       # some taken before
    entries = [rng.choice((1, 5, 9, 12)) for _ in range(200)]
    counts = [rng.randrange(1, 6) for _ in entries]
    one_by_one = [a.reserve(e, c) for e, c in zip(entries, counts)]
    assert b.reserve_many(np.array(entries), np.array(counts)).tolist() == one_by_one
    assert a._next == b._next
    with pytest.raises(OverflowError):
        b.reserve_many(np.array([9]), np.array([1 << 21]))
