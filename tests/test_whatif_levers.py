"""The levers simulated on the recorded timeline, against runs recorded with the lever pulled;
the run's structure they rest on; how far the batch can grow (`--fit`), confirmed by recorded
runs. The whole validation grid is benchmarks/whatif_accuracy.py; here the recorded pairs
in the repository:

  tests/data/cuda_lora.pickle <-> cuda_ckpt.pickle   a Llama LoRA run on an H100, without / with
                                                     activation checkpointing (record_cuda.py)
  tests/groundtruth/ft_base, ft_checkpointing, ft_batch2x, transformer_adamw, checkpointing
                                                     CPU runs (record_runs.py)
  tests/data/fit_b2, fit_b5, fit_b6, fit_b5_ckpt, fit_b6_ckpt
                                                     a 2-layer GPT at micro-batch 2, 5 and 6 (record_fit.py)
"""
from __future__ import annotations

import math

import numpy as np
import orjson
import pytest

from helpers import DATA, GROUNDTRUTH
from test_whatif import _an                         # one analysis per file for both modules
from vramscope.classifiers import CATEGORIES
from vramscope.classifiers.category_live import scale_live
from vramscope.classifiers.levers import SIMULATED
from vramscope.classifiers.structure import blocks, structure
from vramscope.classifiers.whatif import WhatIfError, growth_peak, levers_left_out, what_if
from vramscope.common.units import MiB


def _peak(path) -> int:
    return _an(path).devices[0].peak.bytes


# -- the structure ---------------------------------------------------------------------------------
def test_blocks_of_a_llama_run_on_an_h100():
    """Python-only CUDA stacks: the decoder layer's forward, called 4 times a pass (its line
    goes back to the start at each new layer); checkpointing shows as recompute windows."""
    b = blocks(_an(DATA / "cuda_lora.pickle").devices[0])
    assert (b.name, b.count, b.passes, b.checkpointed) == ("modeling_llama.py:forward", 4, 4, False)
    st = structure(_an(DATA / "cuda_ckpt.pickle").devices[0])
    assert st.blocks.count == 4 and st.checkpointed
    assert [w.block for w in st.recomputes[:4]] == [3, 2, 1, 0]             # backward: last block first
    assert len(st.recomputes) == 16 and all(w.first > st.calls[-1].last or w.forward_pass < 3
                                            for w in st.recomputes)
    # the residual stream between blocks: 8 x 256 tokens x 256 fp32
    assert (st.output_bytes, st.tokens, st.hidden_bytes) == (2 * MiB, 2048, 1024)


def test_blocks_of_a_profiler_converted_run_are_named_by_their_module():
    """Function-level frames (`file.py(N): name`) and `nn.Module: Block_k` frames."""
    st = structure(_an(GROUNDTRUTH / "ft_checkpointing.pickle").devices[0])
    assert (st.blocks.name, st.blocks.count, st.checkpointed) == ("Block", 2, True)
    # each call's saved activations, its output (the next block's input) and what it freed itself
    for j, c in enumerate(st.calls):
        assert st.outputs[j] == c.rows[-1] or st.outputs[j] in c.rows
        if c.block:
            assert st.inputs[j] == st.outputs[j - 1]
    assert not structure(_an(GROUNDTRUTH / "ft_base.pickle").devices[0]).checkpointed
    # an MLP has no repeated blocks: its Linear calls do not allocate alike
    assert blocks(_an(GROUNDTRUTH / "mlp_adamw.pickle").devices[0]) is None


def test_what_grows_with_the_batch_and_the_sequence():
    """cuBLAS workspaces, weights, gradients and optimizer state do not grow with the batch;
    with sdpa's fused attention on the H100 nothing grows with the square of the sequence,
    the CPU runs' explicit softmax attention does."""
    da = _an(DATA / "cuda_lora.pickle").devices[0]
    st = structure(da)
    rule = np.array(da.rule_names)[da.rule]
    assert not st.batch[rule == "temporary.library_workspace"].any()
    for c in ("weights", "gradients", "optimizer"):
        assert not st.batch[da.category == CATEGORIES.index(c)].any()
    assert not st.seq2.any()
    da = _an(GROUNDTRUTH / "ft_base.pickle").devices[0]
    st = structure(da)
    assert st.seq2.any() and not (st.seq2 & ~st.batch).any()
    # the scores of a block (4 heads x 128 x 128 fp32 per sequence, micro-batch 4)
    assert set(np.unique(da.allocs.size[st.seq2]).tolist()) == {4 * 4 * 128 * 128 * 4}


# -- levers against recorded runs ------------------------------------------------------------------
# (each lever against the run recorded with it pulled, these pairs included, within 0.5%: test_lever_pairs.py)


def test_h100_checkpointing_moves_only_what_the_blocks_saved():
    """The recorded checkpointed run peaks at the start of backward with the logits and the loss
    (outside the blocks) still live: the lever keeps them and lands on the recorded peak's type."""
    r = what_if(_an(DATA / "cuda_lora.pickle"), 0, levers=["checkpointing"])
    ckpt = _an(DATA / "cuda_ckpt.pickle").devices[0].peak
    assert r.scaled.type == ckpt.type == "backward_start"
    assert r.scaled.by_category["temporary"] == ckpt.by_category["temporary"]          # cuBLAS workspaces
    assert abs(r.scaled.by_category["activations"] - ckpt.by_category["activations"]) <= 0.01 * ckpt.bytes


def test_the_simulated_run_is_replayed_exactly():
    """The simulated peak (with category factors on top) is the maximum of an independent
    replay of the simulated rows, and the per-category series the viewer draws add up to it."""
    an = _an(GROUNDTRUTH / "ft_base.pickle")
    r = what_if(an, 0, levers=["checkpointing", "half_batch"], scales={"activations": 0.7})
    tl = r.simulation.timeline
    n = tl.n_entries
    live = np.zeros((n + 1, len(CATEGORIES)), dtype=np.int64)
    for ai, fi, s, c in zip(tl.alloc_index, tl.free_index, tl.size, tl.category):
        live[0 if ai < 0 else ai + 1:(fi + 1) if fi >= 0 else n + 1, c] += s
    f = np.array([r.scales.get(c, 1.0) for c in CATEGORIES])
    total = scale_live(live, f).sum(axis=1)
    assert r.scaled.bytes == int(total.max())
    entries = np.arange(-1, len(an.devices[0].live.live_after))
    series = r.live_at_many(entries).sum(axis=1)
    assert series.max() <= r.scaled.bytes and series.max() >= 0.9 * r.scaled.bytes


def test_every_simulated_lever_has_bands_measured_per_family_and_none_for_unlike_runs():
    """Each simulated lever carries what benchmarks/whatif_accuracy.py --write-bands measured, per
    family of runs; a run gets a band only when it is like one of them (blocks, precision,
    adapters), else the nearest family in words."""
    from vramscope.classifiers.levers import LEVERS, Family
    for name in SIMULATED:
        lv = LEVERS[name]
        assert lv.measured, name
        for m in lv.measured:
            assert m.worst_under <= 0 <= m.worst_over and m.cases >= 1 and m.kind.count("/") == 2, (name, m)
        kinds = {m.kind for m in lv.measured}
        k = sorted(kinds)[0]
        fam = Family(*k.split("/")[:2], k.endswith("/lora"))
        band, note = lv.band(fam)
        like = [m for m in lv.measured if m.kind == k]
        assert band is not None and band.cases == sum(m.cases for m in like), name
        assert band.worst_under == pytest.approx(min(m.worst_under for m in like), abs=1e-6)
        assert "measured on runs like this one" in note
        band, note = lv.band(Family("rnn", "fp32", False))
        assert band is None and "not validated for this kind of run" in note and "nearest measured" in note


def test_levers_left_out_by_the_run_or_declined_by_the_structure():
    assert "already on" in levers_left_out(_an(DATA / "cuda_ckpt.pickle"), 0)["checkpointing"]
    assert levers_left_out(_an(DATA / "cuda_lora.pickle"), 0)["no_checkpointing"] == "the run is not checkpointed"
    an = _an(GROUNDTRUTH / "mlp_adamw.pickle")
    assert levers_left_out(an, 0)["no_checkpointing"] == "the run is not checkpointed"
    # an MLP has no repeated blocks: checkpointing is not applied, says why and makes no prediction
    r = what_if(an, 0, levers=["checkpointing"])
    (lv,) = r.levers
    assert not lv.applied and "no repeated blocks" in lv.why and lv.error_band is None and not r.prediction
    assert r.scaled == r.baseline and "not a prediction" in r.note


# -- how far the batch can grow ---------------------------------------------------------------------
def test_fit_batch_predicts_the_largest_batch_the_recorded_runs_confirm():
    """From the micro-batch 2 run: on 16 MiB the largest batch is 5 (the runs recorded at 5 and 6
    peak below and above it), and with checkpointing on 12.25 MiB it is 5 again (its recorded
    checkpointed runs at 5 and 6 bracket that)."""
    an = _an(DATA / "fit_b2.pickle")
    for gpu, lever, runs in (("16MiB", (), ("fit_b5", "fit_b6")),
                             ("12.25MiB", ("checkpointing",), ("fit_b5_ckpt", "fit_b6_ckpt"))):
        r = what_if(an, 0, levers=list(lever), gpu=gpu, fit="batch")
        row = r.fit[0]
        assert row.levers == lever and row.dimension == "batch"
        largest = math.floor(2 * row.max_factor)
        assert largest == 5, (gpu, lever, row)
        fits, too_big = (_peak(DATA / f"{n}.pickle") for n in runs)
        assert fits <= r.fits.gpu_bytes < too_big
        # the prediction itself is close to the recorded runs (no allocator overhead: a CPU profile)
        for b, n in zip((5, 6), runs):
            assert growth_peak(an, 0, "batch", b / 2, levers=lever) == pytest.approx(_peak(DATA / f"{n}.pickle"),
                                                                                     rel=0.03)


def test_fit_rows_alone_and_with_each_lever_that_applies():
    an = _an(DATA / "cuda_lora.pickle")                   # LoRA already, expandable segments on
    r = what_if(an, 0, gpu="0.25", fit="batch")
    names = [row.levers for row in r.fit]
    assert names[0] == () and ("checkpointing",) in names
    assert not {"lora", "expandable_segments", "no_checkpointing", "half_batch"} & {n for row in names for n in row}
    alone, ckpt = r.fit[0], r.fit[names.index(("checkpointing",))]
    assert ckpt.max_factor > alone.max_factor > 0
    for row in r.fit:                                      # the allocator's overhead of this run is counted
        assert row.fits_bytes == math.ceil(row.peak_bytes * r.fits.overhead_ratio)
        assert row.headroom_bytes == r.fits.gpu_bytes - row.fits_bytes >= 0
    seq = what_if(an, 0, gpu="0.25", fit="seq")
    assert "grow linearly" in seq.fit_note                 # sdpa: no scores in the snapshot


def test_fit_errors():
    an = _an(DATA / "fit_b2.pickle")
    with pytest.raises(WhatIfError, match="needs a GPU size"):
        what_if(an, 0, fit="batch")
    with pytest.raises(WhatIfError, match="unknown dimension"):
        what_if(an, 0, gpu=1, fit="width")
    with pytest.raises(WhatIfError, match="rank"):
        what_if(an, 0, levers=["lora"], lora_rank=0)


def test_whatif_json_levers_and_fit(capsys):
    from vramscope.cli import main
    code = main(["whatif", str(DATA / "cuda_lora.pickle"), "--lever", "checkpointing", "--lever", "adam8bit",
                 "--gpu", "0.3", "--fit", "batch", "--json"])
    doc = orjson.loads(capsys.readouterr().out)
    assert code == 0
    (d,) = doc["devices"]
    for lv in d["levers"]:
        assert set(lv) >= {"name", "assumption", "error_band", "simulated"}
    ck, a8 = d["levers"]
    assert ck["simulated"] and ck["applied"] and ck["scales"] == {} and not ck["estimate"]
    assert ck["error_band"] is None or set(ck["error_band"]) == {"mean", "worst_under", "worst_over", "worst",
                                                                 "cases", "families"}
    assert ck["band_note"]
    assert not a8["simulated"] and a8["estimate"] and a8["error_band"] is None and "optimizer" in a8["scales"]
    assert d["fit"] and all(set(f) >= {"levers", "dimension", "max_factor", "fits_bytes", "headroom_bytes"}
                            for f in d["fit"])
    assert d["fit"][0]["levers"] == ["checkpointing", "adam8bit"] and d["fit_note"]
    code = main(["whatif", str(DATA / "cuda_lora.pickle"), "--fit", "batch"])
    assert code == 2 and "--gpu" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["levers/dev/vit_sgd.base.pickle", "fit_b5_ckpt.pickle"])
def test_lora_keeps_the_adapter_branch_gradients_of_the_adapted_matrices(name, monkeypatch):
    """LoRA's simulated backward makes, beside each adapted matrix's gradient, the branch's own
    tokens x in tensor, which full fine-tuning does not: found among the run's gradients by the
    adapted sides' sizes. Without them (the sizes matching none) the peak would read lower."""
    from vramscope.classifiers import analyze
    from vramscope.classifiers.levers import lora
    from vramscope.parsers import open_snapshot

    def lora_peak():           # a fresh analysis each time (a lever's answer is kept with one)
        an = analyze(open_snapshot(str(DATA / name), use_cache=False), use_cache=False)
        return what_if(an, an.primary_device(), levers=["lora"], with_budget=False)
    with_branch = lora_peak()
    assert with_branch.prediction
    monkeypatch.setattr(lora, "isin", lambda element, test, invert=False: np.zeros(np.shape(element), dtype=bool))
    without = lora_peak()
    assert with_branch.scaled.bytes > without.scaled.bytes
