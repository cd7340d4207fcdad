"""Diagnoses an engineer can act on (issue 13): each iteration's own peak type, stale
gradients named with their fix, one leak per cause, advice ranked by what it saves,
the user's code in every stack."""
from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from helpers import DATA, GROUNDTRUTH, require
from vramscope.classifiers import analyze, load_rules
from vramscope.classifiers.levers import pulled
from vramscope.parsers import open_snapshot

from vramscope.cli import main
from vramscope.present.stacks import Stacks

EXPECT = json.loads((DATA / "expected.json").read_text())["fixtures"]


def analysis(path):
    return analyze(open_snapshot(str(require(path)), use_cache=False), rules=load_rules(use_user_rules=False))


def test_only_the_iteration_that_ran_out_is_typed_oom():
    an = analysis(DATA / "oom_step3.pickle")
    da = an.devices[0]
    want = EXPECT["oom_step3.pickle"]["expect"]
    assert len(da.iterations) == want["iterations"]
    for it, exp in zip(da.iterations, want["iteration_peaks"]):
        assert it.peak_index == exp["index"] and it.peak_bytes == exp["bytes"]
        assert it.peak_type == exp["type"], (it.number, it.peak_type, exp)
    assert [it.peak_type for it in da.iterations].count("oom") == 1
    assert da.iterations[want["oom_iteration"]].peak_type == "oom"


@pytest.mark.parametrize("run", ["transformer_adamw", "lora", "sgd_accum", "checkpointing", "bf16_autocast",
                                 "ft_base", "ft_batch2x"])
def test_each_iteration_types_its_own_peak_by_the_recorded_phases(run):
    """Per iteration, its peak's type names the phase the recording's markers put it in."""
    truth = json.loads((GROUNDTRUTH / f"{run}.truth.json").read_text())
    da = analysis(GROUNDTRUTH / f"{run}.pickle").devices[truth["device"]]
    allowed = {"forward": {"forward", "loss"}, "optimizer": {"optimizer_step"}, "inputs": {"other"},
               "backward": {"backward_start", "backward_top", "backward_bottom", "backward_end"}}
    checked = 0
    for it, theirs in zip(da.iterations, truth["iteration_table"]):
        ph = next((x["phase"] for x in theirs["phases"] if x["start_index"] <= it.peak_index <= x["end_index"]), None)
        if ph is not None:
            assert it.peak_type in allowed[ph], (run, it.number, ph, it.peak_type)
            checked += 1
    assert checked >= 1


def test_stale_gradients_are_gradients_and_named_with_the_fix(capsys, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    path = DATA / "stale_grads.pickle"
    an = analysis(path)
    da = an.devices[0]
    want = EXPECT["stale_grads.pickle"]["expect"]["stale_gradients"]
    a = da.allocs
    pre = (a.alloc_index < 0) & (a.free_index >= 0)
    assert pre.sum() == want["blocks_per_iteration"]
    assert set(an.rule_names[r] for r in da.rule[pre]) == {"gradients.previous_step"}
    sg = da.stale_gradients
    assert sg is not None and sg.bytes == want["bytes"] and sg.count == want["blocks_per_iteration"]
    assert "forward" in sg.phases and sg.live_at_peak == want["bytes"]
    assert sg.iterations == (1, 2, 3)
    # at the peak the previous step's gradients are gradients, not scratch
    assert da.peak.by_category["gradients"] >= want["bytes"] and "temporary" not in da.peak.by_category
    assert main(["summary", str(path), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)["devices"][0]["stale_gradients"]
    assert doc["bytes"] == want["bytes"] and "zero_grad(set_to_none=True)" in doc["advice"]
    assert doc["where"] == want["freed_by"]["user_frame"]
    assert main(["summary", str(path)]) == 0
    text = capsys.readouterr().out
    assert "STALE GRADIENTS" in text and "zero_grad(set_to_none=True)" in text and "1018.1 MiB" in text


def test_no_stale_gradients_where_zero_grad_comes_first():
    for run in ("transformer_adamw", "sgd_accum", "mlp_adamw"):
        assert analysis(GROUNDTRUTH / f"{run}.pickle").devices[0].stale_gradients is None, run


def test_one_leak_per_cause_with_its_categories_and_cause():
    an = analysis(DATA / "keep_loss.pickle")
    da = an.devices[0]
    want = EXPECT["keep_loss.pickle"]["expect"]["leaks"][0]
    assert len(da.leaks) == 1, [(Stacks(an).where(lk.stack), lk.bytes_per_iteration) for lk in da.leaks]
    lk = da.leaks[0]
    assert Stacks(an).site(lk.site, lk.stack) == f"{want['filename']}:{want['line']}:{want['name']}"
    assert set(lk.by_category) == set(want["categories"])
    assert lk.total_bytes == want["bytes"] and lk.count == want["blocks"]
    assert lk.bytes_per_iteration == want["bytes_per_iteration"]
    assert lk.cause == "graph"
    # selecting the leak selects all its allocations
    rows = da.leak_rows(lk)
    assert len(rows) == want["blocks"] and int(da.allocs.size[rows].sum()) == want["bytes"]


def test_a_single_kept_tensor_is_a_container_leak():
    an = analysis(DATA / "leak.pickle")
    (lk,) = an.devices[0].leaks
    assert lk.cause == "container" and len(lk.stacks) == 1


def test_advice_is_ranked_by_what_it_saves_and_only_what_matters():
    an = analysis(DATA / "oom.pickle")
    da = an.devices[0]
    o = da.ooms[0]
    # fragmentation above the request: expandable segments first
    assert o.advice[0].lever == "expandable_segments" and o.advice[0].saves_bytes == o.fragmentation_bytes
    rest = o.advice[1:]
    saves = [a.saves_bytes for a in rest]
    assert saves == sorted(saves, reverse=True)
    # a simulated lever's saving is its simulated peak difference (what `whatif --lever` gives); an
    # estimate's is its factors on the evidenced bytes live at the OOM, and says it is an estimate
    from vramscope.classifiers.whatif import what_if
    for a in rest:
        lv = pulled(a.lever)
        if a.estimate:
            assert not lv.simulated and a.saves_bytes <= int(sum(o.by_category.get(c, 0) * (1 - f)
                                                                 for c, f in lv.scales.items()))
        else:
            r = what_if(an, 0, levers=[a.lever])
            assert a.saves_bytes == r.baseline.bytes - r.scaled.bytes
        assert a.saves_bytes >= 0.05 * o.allocated
    # weights are 6% of live memory here: 4-bit weights are not advised
    assert o.by_category["weights"] < 0.1 * o.allocated
    assert "4bit" not in {a.lever for a in o.advice}
    assert da.peak.advice and da.peak.advice[0].lever == "checkpointing"


def test_advice_on_the_adamw_full_step_points_at_the_optimizer_and_fits_training_from_scratch():
    """A Transformer LM trained from scratch (CS336): its weights were made before recording
    (a guess: no frames), no pretrained model is loaded, so neither LoRA nor 4-bit weights
    are advised; the optimizer state (made in the trace, by torch/optim frames) is."""
    from helpers import SHARED
    path = SHARED / "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle"
    da = analysis(path).devices[0]
    levers = [a.lever for a in da.peak.advice]
    assert levers[0] == "adam8bit" and "checkpointing" not in levers
    assert "lora" not in levers and "4bit" not in levers
    assert da.peak.advice[0].evidence == "stack"
    assert "no pretrained model loaded" in da.peak.advice_left_out["lora"]
    assert "no frozen weights" in da.peak.advice_left_out["4bit"]


def test_backward_allocations_show_their_forward_user_frame():
    """torch 2.13 `forward_frames`: a backward allocation with only C++ frames is named by
    the user frame of the forward op that made its autograd node."""
    an = analysis(DATA / "forward_frames_213.pickle")
    da = an.devices[0]
    st = Stacks(an)
    want = EXPECT["forward_frames_213.pickle"]["expect"]
    cases = want["backward_allocs"]
    assert len(cases) >= 10
    for case in cases:
        i = case["index"]
        row = int(np.flatnonzero(da.allocs.alloc_index == i)[0])
        a = da.allocation(row)
        assert st.where_of(a) == case["forward_user_frame"], (i, st.where_of(a), case)
        view = st.view_of(da, a)
        assert view.from_forward and view.frames[0].role in ("user", "library")


def test_autograd_nodes_of_older_files_are_matched_to_their_forward_op():
    """Before torch 2.13 a backward allocation only names its autograd node; where the file
    shows the op behind the node run from one user frame, that frame is named too."""
    from helpers import SHARED
    an = analysis(SHARED / "cranberrii+ftcourse__memory_snapshot.pickle")
    st = Stacks(an)
    da = an.devices[0]
    names = {st.where_of(a) for a in da.largest_live(da.peak.index, 10)}
    assert "LogSoftmaxBackward0 (autograd) of /tmp/ipykernel_114/3105878423.py:21:<module>" in names
    assert "NllLossBackward0 (autograd) of /tmp/ipykernel_114/3105878423.py:21:<module>" in names
    # never a guess: a node whose op ran from several user frames keeps its bare name
    sf = an.facts.stacks
    for s in range(sf.n_stacks):
        f = int(sf.forward_user_frame[s])
        if f >= 0:
            assert sf.user_frame[s] < 0 and sf.table.role[f] == 0
