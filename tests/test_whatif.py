"""What-if: the scaled peak against an independent replay of the trace, the levers, the fits.

The replay here is a plain loop over the trace columns: `alloc` adds its size to the
category of the allocation it starts, `free_completed` / `free` subtract the block at that
address; blocks live before the trace start the per-category sums. The scaled total after
each entry is sum over categories of Python's round(live * factor) (the rounding of
classifiers/category_live.py: float64 product, round half to even), and the peak is the
first entry that beats everything before it, -1 when nothing beats the start.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import orjson
import pytest

from helpers import DATA, GROUNDTRUTH, SHARED, needs_shared
from vramscope.classifiers import CATEGORIES, analyze
from vramscope.classifiers.category_live import BLOCK, CategoryLive, scale_live, scaled_series
from vramscope.classifiers.liveset import Composition
from vramscope.classifiers.levers import pulled as lever
from vramscope.classifiers.whatif import (COMMON_CARDS, CUDA_CONTEXT, LEVERS, WhatIfError, parse_gpu_size, parse_scale,
                                          what_if)
from vramscope.common.units import GiB
from vramscope.parsers import open_snapshot
from vramscope.parsers.tables import A_ALLOC, A_FREE, A_FREE_COMPLETED

LOCAL = sorted(GROUNDTRUTH.glob("*.pickle")) + sorted(DATA.glob("*.pickle"))
REAL = sorted(p for p in (list(SHARED.glob("*.pickle")) + list(SHARED.glob("*.pkl")))
              if not p.name.startswith("NOT_A_SNAPSHOT")) if SHARED.is_dir() else []
FULLSTEP = "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle"
_analyses: dict = {}


def _an(path):
    path = str(path)
    if path not in _analyses:
        _analyses[path] = analyze(open_snapshot(path, use_cache=False), use_cache=False)
    return _analyses[path]


def replay(an, dev, factors: dict):
    """(peak bytes, peak index, {category: scaled bytes there}) by a plain loop over the trace."""
    da = an.devices[dev]
    t = an.snapshot.trace(dev)
    action = np.asarray(t.columns["action"]).tolist()
    addr = np.asarray(t.columns["addr"]).tolist()
    size = np.asarray(t.columns["size"]).tolist()
    a = da.allocs
    cat_of_alloc = {int(i): CATEGORIES[int(c)] for i, c in zip(a.alloc_index.tolist(), da.category.tolist()) if i >= 0}
    live_blocks = {}
    live = {c: 0 for c in CATEGORIES}
    for i, ad, sz, c in zip(a.alloc_index.tolist(), a.addr.tolist(), a.size.tolist(), da.category.tolist()):
        if i < 0:
            live_blocks[ad] = (sz, CATEGORIES[c])
            live[CATEGORIES[c]] += sz
    f = {c: float(factors.get(c, 1.0)) for c in CATEGORIES}

    def total():
        return sum(round(live[c] * f[c]) for c in CATEGORIES)

    best, best_i, best_live = total(), -1, dict(live)
    for i, (act, ad, sz) in enumerate(zip(action, addr, size)):
        if act == A_ALLOC:
            c = cat_of_alloc[i]
            live_blocks[ad] = (sz, c)
            live[c] += sz
        elif act in (A_FREE_COMPLETED, A_FREE):
            s, c = live_blocks.pop(ad)
            live[c] -= s
        else:
            continue
        v = total()
        if v > best:
            best, best_i, best_live = v, i, dict(live)
    by = {c: round(best_live[c] * f[c]) for c in CATEGORIES if round(best_live[c] * f[c])}
    return best, best_i, by


def _factor_sets(categories):
    """Unscaled; non-integer factors (rounding matters); zeros, ties and integers."""
    rng = np.random.default_rng(len(categories))
    mixed = {c: float(x) for c, x in zip(categories, rng.choice([0.0, 0.37, 1.0, 2.0, 0.5, 1.61], len(categories)))}
    return [{}, {c: 0.3 + 0.17 * k for k, c in enumerate(categories)}, mixed, {"activations": 0.1, "autograd": 0.0}]


def _check_file(path):
    an = _an(path)
    for dev, da in an.devices.items():
        cl = CategoryLive.build(da)
        for factors in _factor_sets(cl.categories):
            b, i, by = replay(an, dev, factors)
            got = cl.peak(factors)
            assert (got.bytes, got.index, got.by_category) == (b, i, by), (path, dev, factors)
        base = cl.peak()
        assert (base.bytes, base.index) == (da.live.peak_bytes, da.live.peak_index)


@pytest.mark.parametrize("path", LOCAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_scaled_peak_equals_replay_local(path):
    _check_file(path)


@needs_shared
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name[:48])
def test_scaled_peak_equals_replay_real(path):
    _check_file(path)


def test_unscaled_what_if_is_the_summary_peak():
    an = _an(DATA / "qlora_4bit.pickle")
    da = an.devices[0]
    r = what_if(an, 0)
    assert r.baseline == r.scaled
    assert (r.baseline.bytes, r.baseline.index) == (da.live.peak_bytes, da.live.peak_index)
    # da.peak is a dict today and a frozen dataclass with the same field names soon
    peak = (lambda k: da.peak[k]) if isinstance(da.peak, dict) else (lambda k: getattr(da.peak, k))
    assert r.baseline.by_category == peak("by_category")
    assert r.baseline.type == peak("type")
    assert r.scales == {}


def test_peak_moves_from_backward_to_optimizer_step():
    """transformer_adamw peaks at the start of backward (activations + the loss gradient);
    with a tenth of the activations, the replay's peak is in the optimizer step."""
    an = _an(GROUNDTRUTH / "transformer_adamw.pickle")
    da = an.devices[0]
    r = what_if(an, 0, scales={"activations": 0.1})
    assert r.baseline.type.startswith("backward")
    b, i, by = replay(an, 0, {"activations": 0.1})
    assert (r.scaled.bytes, r.scaled.index, r.scaled.by_category) == (b, i, by)
    assert r.scaled.index != r.baseline.index
    assert r.scaled.type == da.peak_type(i) == "optimizer_step"
    assert r.scaled.by_category.get("activations", 0) <= r.baseline.by_category["activations"] * 0.1 + 1
    assert r.scaled.by_category.get("optimizer", 0) > 0
    assert r.scales == {"activations": 0.1}


def test_zero_everything_is_the_start_state():
    an = _an(DATA / "clean_loop.pickle")
    r = what_if(an, 0, scales={c: 0 for c in CATEGORIES}, with_budget=False)
    assert (r.scaled.bytes, r.scaled.index, r.scaled.type, r.scaled.by_category) == (0, -1, "other", {})


def test_scaling_up_a_category_that_is_absent_changes_nothing():
    an = _an(GROUNDTRUTH / "mlp_adamw.pickle")
    assert "quantization" not in CategoryLive.build(an.devices[0]).categories
    r = what_if(an, 0, scales={"quantization": 3.0}, with_budget=False)
    assert (r.scaled.bytes, r.scaled.index) == (r.baseline.bytes, r.baseline.index)


# -- a synthetic trace with many blocks: the pruning must never lose the first maximum ------------
def _fake_device(rng, n_rows, n_cats, repeat_iterations=False):
    """Random alloc/free rows (some live before the trace, some never freed) as a
    DeviceAnalysis stand-in: only allocs, category, live.live_after and composition() are read."""
    events = []
    rows = []
    for _ in range(int(rng.integers(0, 4))):      # live before the trace; freed in it or not
        rows.append([-1, -1, int(rng.integers(1, 1 << 20)), int(rng.integers(0, n_cats))])
    live = list(range(len(rows)))
    pattern = [int(x) for x in rng.integers(1, 1 << 16, size=40)]
    k = 0
    while len(rows) < n_rows:
        if live and (rng.random() < 0.45 or len(live) > 60):
            r = live.pop(int(rng.integers(0, len(live))))
            rows[r][1] = len(events)
            events.append(r)
        else:
            sz = pattern[k % len(pattern)] if repeat_iterations else int(rng.integers(1, 1 << 24))
            k += 1
            rows.append([len(events), -1, sz, int(rng.integers(0, n_cats)) if not repeat_iterations
                         else (k % n_cats)])
            live.append(len(rows) - 1)
            events.append(len(rows) - 1)
    arr = np.array(rows, dtype=np.int64)
    allocs = SimpleNamespace(alloc_index=arr[:, 0].astype(np.int32), free_index=arr[:, 1].astype(np.int32),
                             size=arr[:, 2], addr=np.arange(len(arr)))
    category = arr[:, 3].astype(np.uint8)
    da = SimpleNamespace(allocs=allocs, category=category,
                         live=SimpleNamespace(live_after=np.zeros(len(events), np.int64)),
                         composition=lambda: Composition(category, allocs, len(events)))
    return da, len(events)


def _brute(da, n_entries, f):
    C = len(CATEGORIES)
    a = da.allocs
    live = np.zeros(C, dtype=np.int64)
    for ai, s, c in zip(a.alloc_index, a.size, da.category):
        if ai < 0:
            live[c] += s
    delta = np.zeros((n_entries, C), dtype=np.int64)
    for ai, fi, s, c in zip(a.alloc_index, a.free_index, a.size, da.category):
        if ai >= 0:
            delta[ai, c] += s
        if fi >= 0:
            delta[fi, c] -= s
    series = np.vstack([live, live + np.cumsum(delta, axis=0)])
    full = np.ones(C)
    for k, c in enumerate(CATEGORIES):
        full[k] = f.get(c, 1.0)
    tot = scale_live(series, full).sum(axis=1)
    j = int(np.argmax(tot))
    return int(tot[j]), (j - 1 if tot[j] > tot[0] else -1)


@pytest.mark.parametrize("seed", range(12))
def test_pruned_peak_equals_brute_force_on_random_traces(seed):
    rng = np.random.default_rng(seed)
    da, n = _fake_device(rng, n_rows=int(rng.integers(2, 12)) * BLOCK, n_cats=int(rng.integers(1, 10)),
                         repeat_iterations=seed % 3 == 0)
    cl = CategoryLive.build(da)
    assert cl.n_events == n and len(cl.block_max) >= 2
    for trial in range(36):
        kind = trial % 3
        if kind == 0:       # anything
            f = {c: float(rng.choice([0.0, 1.0, 0.5, 2.0, 0.999, rng.random() * 3])) for c in cl.categories}
        elif kind == 1:     # one slider moved (the bounds' tight case)
            f = {str(rng.choice(cl.categories)): float(rng.choice([0.0, 0.25, 1.5, 2.0, rng.random() * 3]))}
        else:               # whole factors: no rounding slack at all, exact ties are common
            f = {c: float(rng.integers(0, 3)) for c in cl.categories}
        got = cl.peak(f)
        assert (got.bytes, got.index) == _brute(da, n, f), (seed, trial, f)


def test_live_at_many_and_scaled_series_match_the_replay_at_sample_points():
    an = _an(GROUNDTRUTH / "checkpointing.pickle")
    da = an.devices[0]
    cl = CategoryLive.build(da)
    n = len(da.live.live_after)
    idx = np.r_[-1, np.linspace(0, n - 1, 300).astype(np.int64)]
    got = cl.live_at_many(idx)
    assert got.shape == (len(idx), len(cl.categories))
    assert np.array_equal(got.sum(axis=1), np.r_[da.live.start_bytes, da.live.live_after[idx[1:]]])
    # the lead's per-category query agrees, column for column
    ref = da.live_by_category(idx)
    for k, c in enumerate(cl.categories):
        assert np.array_equal(got[:, k], ref[:, CATEGORIES.index(c)])
    f = cl.factors({"activations": 0.5, "autograd": 0.25})
    scaled, total, j = scaled_series(got, f)
    assert np.array_equal(total, scale_live(got, f).sum(axis=1)) and j == int(np.argmax(total))
    assert total[j] <= cl.peak(f).bytes      # samples never exceed the exact peak


# -- levers ---------------------------------------------------------------------------------------
def test_every_lever_states_its_assumption():
    """Simulated levers say what the simulation assumed, factor levers are stated estimates."""
    an = _an(DATA / "qlora_4bit.pickle")
    r = what_if(an, 0, levers=list(LEVERS))
    assert [lv.name for lv in r.levers] == list(LEVERS)
    for lv in r.levers:
        if lv.simulated and not lv.applied:      # the run does not support it: why, and no prediction
            assert lv.why and lv.assumption == "" and lv.error_band is None and not r.prediction, lv.name
        elif lv.simulated:
            assert lv.assumption.startswith("simulated on the recorded timeline: ") and lv.scales == {}, lv.name
        else:
            assert lv.assumption.startswith("estimate: ") and len(lv.assumption) > 80, lv.name
        assert all(c in CATEGORIES and 0 <= f <= 1 for c, f in lv.scales.items()), lv
    assert {lv.name for lv in r.levers if lv.simulated} == {"checkpointing", "no_checkpointing", "half_batch", "lora"}
    assert "not a prediction" in r.note and "no_checkpointing was not applied" in r.note


def test_factor_levers_combine_with_explicit_scales():
    an = _an(GROUNDTRUTH / "transformer_adamw.pickle")
    r = what_if(an, 0, levers=["adam8bit"], scales={"activations": 0.5})
    f = lever("adam8bit", r.budget.facts).scales["optimizer"]
    assert r.scales == {"activations": 0.5, "optimizer": f}
    b, i, _ = replay(an, 0, r.scales)
    assert (r.scaled.bytes, r.scaled.index) == (b, i)
    # a simulated lever adds no factor: the explicit ones apply exactly to the simulated run
    s = what_if(an, 0, levers=["half_batch"], scales={"optimizer": 0.5})
    assert s.scales == {"optimizer": 0.5} and s.simulation is not None
    assert s.scaled.bytes == s.simulation.peak({"optimizer": 0.5}).bytes < r.baseline.bytes


def test_optimizer_levers_use_the_measured_bytes_per_parameter():
    an = _an(GROUNDTRUTH / "mlp_adamw.pickle")
    r = what_if(an, 0, levers=["adam8bit", "lora"])
    facts = r.budget.facts
    assert facts.optimizer_bytes_per_param == pytest.approx(8.0, rel=0.01)
    assert r.levers[0].scales["optimizer"] == pytest.approx(2.03125 / facts.optimizer_bytes_per_param, rel=1e-4)
    # LoRA is simulated, never a factor: no scales of its own
    assert lever("lora", facts).scales == {} and lever("lora", facts).simulated
    # what-if: an MLP has no repeated blocks to put adapters on, so the simulation declines, and the
    # answer is not a prediction (the recorded run's peak, said so)
    assert r.levers[1].simulated and not r.levers[1].applied
    assert "no weight matrices repeated by the blocks" in r.levers[1].why
    assert not r.prediction and r.scaled.bytes == r.baseline.bytes and "not a prediction" in r.note
    # a LoRA run: its adapters' frames are in the trace, so the lever is left out, saying why
    from vramscope.services.whatif import levers_left_out
    assert "adapters are already there" in levers_left_out(_an(GROUNDTRUTH / "lora.pickle"), 0)["lora"]


def test_expandable_segments_removes_the_allocator_overhead():
    an = _an(DATA / "oom.pickle")
    da = an.devices[0]
    plain = what_if(an, 0, gpu="11GiB")
    exp = what_if(an, 0, levers=["expandable_segments"], gpu="11GiB")
    reserved = da.live.reserved_at(da.live.peak_index)
    assert plain.fits.overhead_ratio == pytest.approx(reserved / da.live.peak_bytes)
    assert plain.fits.needed_bytes == math.ceil(da.live.peak_bytes * (reserved / da.live.peak_bytes))
    assert plain.fits.overhead_bytes == plain.fits.needed_bytes - da.live.peak_bytes > 0
    # without the allocator's overhead the run still needs what its failed request asked for on top
    # of what was live (the OOM): at least that, whatever the peak
    o = da.ooms[0]
    assert exp.fits.overhead_bytes == 0 and exp.fits.needed_bytes == max(da.live.peak_bytes, o.allocated + o.requested)
    assert "failed request" in exp.fits.note
    assert exp.scaled == plain.scaled          # the allocated peak does not move


# -- fits -------------------------------------------------------------------------------------------
def test_fits_on_cards_and_a_given_size():
    an = _an(DATA / "qlora_4bit.pickle")
    r = what_if(an, 0, gpu=1.2)
    f = r.fits
    assert f.gpu_bytes == int(1.2 * GiB) and f.allocated_bytes == r.scaled.bytes
    assert f.fits == (f.needed_bytes <= f.gpu_bytes) and f.headroom_bytes == f.gpu_bytes - f.needed_bytes
    # each card as torch reports it (an "80 GB" H100: 79.1 GiB), less the CUDA context
    assert [c.bytes for c in f.cards] == [int(g * GiB) - CUDA_CONTEXT for _, g in COMMON_CARDS]
    assert [g for _, g in COMMON_CARDS] == [14.75, 22.0, 39.4, 44.4, 79.1, 139.7]
    assert all(c.fits and c.headroom_bytes == c.bytes - f.needed_bytes for c in f.cards)
    small = what_if(an, 0, gpu="1GiB")
    assert small.fits.fits is False and small.fits.headroom_bytes < 0
    assert "CUDA context" in f.note


def test_fits_without_allocator_segments_says_overhead_unknown():
    an = _an(GROUNDTRUTH / "lora.pickle")          # profiler-converted: no segments
    f = what_if(an, 0, gpu=16).fits
    assert f.overhead_ratio is None and f.overhead_bytes == 0 and "unknown" in f.note


@needs_shared
def test_fullstep_fits_on_an_80_gib_card_not_on_48():
    an = _an(SHARED / FULLSTEP)
    r = what_if(an, 0)
    fits = {c.name.split()[0]: c.fits for c in r.fits.cards}
    assert fits["80"] and not fits["48"]
    # an 8-bit optimizer brings the 51 GiB step under 48 GiB with the allocator's cache
    r8 = what_if(an, 0, levers=["adam8bit"])
    assert r8.scaled.bytes < r.scaled.bytes - 15 * GiB
    assert {c.name.split()[0]: c.fits for c in r8.fits.cards}["48"]


# -- errors and JSON ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    ({"scales": {"activation": 0.5}}, "unknown category 'activation'"),
    ({"scales": {"activations": -0.5}}, ">= 0"),
    ({"scales": {"activations": float("nan")}}, "finite"),
    ({"scales": {"activations": "half"}}, "not a number"),
    ({"levers": ["bigger_gpu"]}, "unknown lever 'bigger_gpu'"),
    ({"gpu": "lots"}, "GPU size"),
    ({"gpu": -3}, "must be more than 0"),
    ({"gpu": "0GB"}, "must be more than 0"),
])
def test_bad_input_raises_a_one_line_value_error(kwargs, words):
    an = _an(GROUNDTRUTH / "mlp_adamw.pickle")
    with pytest.raises(WhatIfError) as e:
        what_if(an, 0, **kwargs)
    assert isinstance(e.value, ValueError)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_unknown_device_raises():
    with pytest.raises(WhatIfError, match="no device 7"):
        what_if(_an(GROUNDTRUTH / "mlp_adamw.pickle"), 7)


def test_parse_scale_and_gpu_size():
    assert parse_scale("activations=0.5") == ("activations", 0.5)
    assert parse_scale(" optimizer = 0 ") == ("optimizer", 0.0)
    for bad in ("activations", "activations=-1", "nope=1", "activations=x"):
        with pytest.raises(WhatIfError):
            parse_scale(bad)
    assert parse_gpu_size("24") == parse_gpu_size("24GiB") == parse_gpu_size("24G") == 24 * GiB
    assert parse_gpu_size("24GB") == 24 * 10 ** 9                  # GB = 10^9 bytes, for every verb
    assert parse_gpu_size("24576MiB") == 24 * GiB and parse_gpu_size(80) == 80 * GiB
    with pytest.raises(WhatIfError):
        lever("more_memory")


def test_json_has_the_designed_shape():
    an = _an(DATA / "qlora_4bit.pickle")
    j = orjson.loads(orjson.dumps(what_if(an, 0, scales={"activations": 0.5}, levers=["paged_optimizer"],
                                          gpu="24").to_json()))
    assert {"device", "baseline", "scaled", "scales", "budget", "fits"} <= set(j)
    for k in ("baseline", "scaled"):
        assert set(j[k]) == {"bytes", "index", "type", "by_category"}
        assert sum(j[k]["by_category"].values()) == j[k]["bytes"]
    assert j["scales"] == {"activations": 0.5, "optimizer": 0.0}
    assert j["budget"] and all(set(row) == {"category", "measured", "measured_max", "expected", "formula", "note"}
                               for row in j["budget"])
    assert j["fits"]["gpu_bytes"] == 24 * GiB and isinstance(j["fits"]["fits"], bool)
    assert j["levers"][0]["name"] == "paged_optimizer" and j["levers"][0]["assumption"].startswith("estimate")


def test_a_trace_an_oom_cut_short_never_fits_a_card_it_might_not():
    """The need of a run that ends in its OOM is a floor (what was live plus the failed request):
    a card it exceeds is too small, a larger one cannot be said to fit, and how far the batch
    could grow is not answered, with levers or without."""
    an = _an(DATA / "facts" / "oom_first_forward.run.pickle")
    need = max(o.allocated + o.requested for o in an.devices[0].ooms)
    r = what_if(an, 0, gpu=f"{need // 2}B")
    assert r.fits.fits is False and r.fits.needed_bytes >= need
    assert all(c.fits is None for c in r.fits.cards)          # every common card is larger than the floor
    r = what_if(an, 0, levers=["half_batch"], gpu="16")
    assert r.lower_bound and r.fits.fits is None and all(c.fits is None for c in r.fits.cards)
    r = what_if(an, 0, gpu="16", fit="batch")
    assert len(r.fit) == 1 and not r.fit[0].applied and "out-of-memory" in r.fit[0].why


def test_a_batch_growth_the_run_cannot_show_is_not_answered_with_levers_either():
    """cuDNN's workspace does not follow the batch: no multiple, as recorded or with a lever."""
    an = _an(DATA / "levers" / "dev" / "cnn_bn.base.pickle")
    r = what_if(an, 0, gpu="16", fit="batch")
    assert r.fit and all(not row.applied for row in r.fit) and "cuDNN" in r.fit[0].why
