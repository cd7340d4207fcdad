"""How sure an answer is: every category carries its evidence, and no answer rests on a guess.

The cases real snapshots from public runs got wrong, rebuilt in torch's layout
(tests/data/evidence_fixtures.py), and the real CUDA runs in tests/data; then, on every real
snapshot in ../shared/snapshots and every fixture, the bytes at the peak that no frame and no
free explain, computed independently from the pickle, are guesses, and no lever rests on them.
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

os.environ.setdefault("VRAMSCOPE_CACHE_DIR", "")

from vramscope.classifiers import CATEGORIES, analyze  # noqa: E402
from vramscope.classifiers.budget import budget  # noqa: E402
from vramscope.classifiers.evidence import EVIDENCE  # noqa: E402
from vramscope.classifiers.levers import GUESSED_TOO_MUCH, TRAINING_LEVERS  # noqa: E402
from vramscope.parsers import open_snapshot  # noqa: E402
from vramscope.services.compare import compare_analyses  # noqa: E402
from vramscope.services.summary import summary_document, summary_text  # noqa: E402
from vramscope.services.whatif import levers_left_out  # noqa: E402

from helpers import DATA, GROUNDTRUTH, NOT_A_SNAPSHOT, REPO, SHARED  # noqa: E402

EXPECT = __import__("json").loads((DATA / "expected.json").read_text())["fixtures"]


def an_of(path):
    return analyze(open_snapshot(str(path), use_cache=False))


def rows_where(an, da, pred):
    """Allocation rows whose stack's frames satisfy `pred` (a list of (file, line, name))."""
    snap = an.snapshot
    cache = {}
    out = []
    for r, sid in enumerate(da.allocs.stack.tolist()):
        if sid not in cache:
            cache[sid] = pred(snap.stack_frames_list(sid)) if sid >= 0 else False
        if cache[sid]:
            out.append(r)
    return np.asarray(out, dtype=np.int64)


def evidence_of(da, rows):
    return {EVIDENCE[int(e)] for e in da.evidence[rows]}


def category_of(da, rows):
    return {CATEGORIES[int(c)] for c in da.category[rows]}


# -- a state-only dump with no frames ------------------------------------------------------------
def test_a_state_only_dump_without_frames_says_what_it_knows_and_advises_nothing():
    an = an_of(DATA / "state_only_noframes.pickle")
    da = an.devices[0]
    want = EXPECT["state_only_noframes.pickle"]["expect"]
    assert len(da.allocs) >= want["blocks"] and da.peak.bytes == want["bytes"]
    # frameless blocks of a state-only dump: unknown (no frames), or a guess where a size pattern tells
    assert evidence_of(da, np.arange(len(da.allocs))) <= {"guess", "none"}
    assert set(da.peak.by_evidence) <= {"guess", "none"} and sum(da.peak.by_evidence.values()) == da.peak.bytes
    assert da.run.recorded.value == "state_only" and not da.run.frames
    # no advice, and every lever but the allocator's setting says why
    assert da.peak.advice == ()
    assert set(da.peak.advice_left_out) == {"checkpointing", "half_batch", "adam8bit", "lora", "4bit"}
    assert all("state-only" in why for why in da.peak.advice_left_out.values())
    assert set(levers_left_out(an, 0)) >= {"checkpointing", "half_batch", "adam8bit", "paged_optimizer", "lora", "4bit"}
    # no parameter counts
    f = budget(an, 0).facts
    assert (f.trainable_params, f.frozen_params, f.weight_bytes) == (0, 0, 0) and not f.counts_allowed
    assert "no parameter counts" in budget(an, 0).row("weights").formula
    # the summary says what is known, what is not, and the calls that record it
    doc = summary_document(an)
    dev = doc["devices"][0]
    assert "state-only" in dev["evidence_note"] and "_record_memory_history" in dev["evidence_note"]
    text = summary_text(doc)
    assert "unknown" in text and "worth trying" not in text and "_record_memory_history" in text


# -- optimizer state from before the recording ---------------------------------------------------
def test_optimizer_state_from_before_the_recording_is_a_guessed_optimizer_not_weights():
    late, early = an_of(DATA / "adamw_after_step1.pickle"), an_of(DATA / "adamw_from_start.pickle")
    dl, de = late.devices[0], early.devices[0]
    want = EXPECT["adamw_after_step1.pickle"]["expect"]
    # the same run, recorded from the start: every category by its stack or its lifetime
    assert dl.peak.bytes == de.peak.bytes
    assert dl.peak.by_category == de.peak.by_category
    assert de.peak.by_category["optimizer"] == 2 * want["param_bytes"]
    assert de.peak.by_category_evidence["optimizer"] == {"stack": 2 * want["param_bytes"]}
    # recorded after its first step: the moments and the weights are guesses, said so
    assert dl.peak.by_category_evidence["optimizer"] == {"guess": 2 * want["param_bytes"]}
    assert dl.peak.by_category_evidence["weights"] == {"guess": want["param_bytes"]}
    pre = dl.allocs.alloc_index < 0
    rules = {dl.rule_name(int(r)) for r in dl.rule[pre & (dl.category == CATEGORIES.index("optimizer"))]}
    assert rules == {"optimizer.preexisting_moments"}
    # the budget counts the parameters from the gradients it saw, and invents no frozen ones
    f = budget(late, 0).facts
    assert f.trainable_params == want["params"] and f.frozen_params == 0
    assert budget(late, 0).row("optimizer").expected == 2 * want["param_bytes"]
    # no advice rests on the guessed state: the 8-bit optimizer is advised only where it was seen
    assert "adam8bit" not in {a.lever for a in dl.peak.advice}
    assert "adam8bit" in {a.lever for a in de.peak.advice}
    # and comparing the two recordings finds nothing moved between categories
    dc = compare_analyses(early, late).devices[0]
    assert dc.peak_delta == 0 and not any(dc.by_category_delta.values())


# -- churn is not a leak -------------------------------------------------------------------------
def test_allocate_then_free_churn_at_one_site_is_not_a_leak():
    an = an_of(DATA / "validation_churn.pickle")
    da = an.devices[0]
    want = EXPECT["validation_churn.pickle"]["expect"]
    assert len(da.iterations) == want["iterations"]
    assert da.leaks == ()
    # what made it look like one: the site's allocations outlive their iteration ...
    site = rows_where(an, da, lambda fr: any(f[0] == want["site"][0] and f[1] == want["site"][1] for f in fr))
    kept = site[[da.allocs.free_index[r] > da.iterations[min(da.timeline.iteration_of(int(da.allocs.alloc_index[r])) + 1,
                                                               len(da.iterations) - 1)].end_index for r in site]]
    assert len(kept) >= 4
    # ... but every one of them is freed, and live memory at iteration ends goes up and down
    assert (da.allocs.free_index[site] >= 0).all()
    ends = [int(da.live.live_after[it.end_index]) for it in da.iterations]
    assert any(b < a for a, b in zip(ends, ends[1:]))


# -- perturbation buffers and a model copy are not inputs -------------------------------------------
def test_perturbation_buffers_and_a_model_copy_are_not_inputs():
    an = an_of(DATA / "zeroth_order.pickle")
    da = an.devices[0]
    want = EXPECT["zeroth_order.pickle"]["expect"]
    copy = rows_where(an, da, lambda fr: any(f[2] == "__deepcopy__" for f in fr))
    assert len(copy) == want["tensors"]
    assert category_of(da, copy) == {"weights"} and evidence_of(da, copy) == {"stack"}
    perturb = rows_where(an, da, lambda fr: any(f[2] in ("zo_perturb_parameters", "zo_update") for f in fr))
    assert len(perturb) and "inputs" not in category_of(da, perturb)
    assert category_of(da, perturb) == {"weights", "temporary"}
    # only the batch is an input, and no advice to halve the micro-batch rests on the rest
    inputs = da.category == CATEGORIES.index("inputs")
    assert set(da.allocs.size[inputs].tolist()) == {want["batch_bytes"]}
    assert da.peak.by_category.get("inputs", 0) <= want["batch_bytes"]
    assert all(a.category != "inputs" for a in da.peak.advice)


# -- a forward-only loop has no backward ------------------------------------------------------------
def test_a_forward_only_loop_has_no_backward_and_one_iteration_per_step():
    an = an_of(DATA / "forward_only_loop.pickle")
    da = an.devices[0]
    assert "backward" not in {name for _, _, name in da.phase_ranges()}
    assert len(da.iterations) == EXPECT["forward_only_loop.pickle"]["expect"]["iterations"]
    assert da.leaks == ()
    assert not da.run.trains
    advised = {a.lever for a in da.peak.advice}
    assert not advised & TRAINING_LEVERS
    # a toy Linear built in the script: not a pretrained model, so no 4-bit weights either
    assert "4bit" not in advised and "frozen base" in da.peak.advice_left_out["4bit"]


# -- an activation's gradient is not a parameter's (enable_input_require_grads) ---------------------
def test_an_activations_gradient_is_autograd_and_the_budget_sees_only_the_adapters():
    an = an_of(DATA / "cuda_ckpt.pickle")
    da = an.devices[0]
    mul = rows_where(an, da, lambda fr: any("MulBackward0::apply" in f[2] for f in fr))
    # the embedding output made a leaf by enable_input_require_grads: its gradient, one per step,
    # kept past the backward and freed by the script (not zero_grad): never a parameter's
    act = np.flatnonzero(np.array([da.rule_name(int(r)) == "autograd.activation_gradient" for r in da.rule]))
    assert len(act) == 4 and set(act) <= set(mul) and set(da.allocs.size[act].tolist()) == {2 * 1024 * 1024}
    assert evidence_of(da, act) == {"stack"}
    assert "gradients" not in category_of(da, mul)
    f = budget(an, 0).facts
    run = next(r for r in __import__("json").loads((DATA / "cuda_runs.json").read_text())["runs"] if r["run"] == "ckpt")
    trainable = run["trainable_parameters"]
    assert f.trainable_params == trainable
    assert f.trainable_fraction == pytest.approx(trainable / (trainable + run["base_parameters"]), rel=0.02)
    opt = budget(an, 0).row("optimizer")
    assert opt.note == "" and opt.expected == pytest.approx(opt.measured_max, rel=0.15)


# -- 4-bit weights are never advised to a run whose weights are quantized ------------------------
QUANTIZED = [DATA / "qlora_4bit.pickle"] + ([SHARED / "cranberrii+ftcourse__memory_snapshot.pickle"]
                                            if SHARED.is_dir() else [])


@pytest.mark.parametrize("path", QUANTIZED, ids=[p.name for p in QUANTIZED])
def test_a_quantized_run_is_never_advised_4bit_weights(path):
    an = an_of(path)
    for da in an.devices.values():
        assert da.run.quantized.value == "4-bit"
        assert "already quantized" in da.peak.advice_left_out["4bit"]
        assert "4bit" not in {a.lever for a in da.peak.advice}
        assert all("4bit" not in {a.lever for a in o.advice} for o in da.ooms)


def test_a_quantizing_load_keeps_its_staging_copies_out_of_temporary():
    """The 16-bit weight a QLoRA load quantizes and frees is the weight in transit (or the
    quantizer's), never loading scratch."""
    an = an_of(DATA / "qlora_4bit.pickle")
    da = an.devices[0]
    t = an.snapshot.trace(0)
    stack = np.asarray(t.columns["stack"])
    freed = da.allocs.free_index >= 0
    by_quant = np.zeros(len(da.allocs), dtype=bool)
    for r in np.flatnonzero(freed & (da.allocs.alloc_index >= 0)):
        fr = an.snapshot.stack_frames_list(int(stack[da.allocs.free_index[r]]))
        by_quant[r] = any(f[2] == "_quantize" for f in fr)
    assert by_quant.sum() >= 10
    assert category_of(da, np.flatnonzero(by_quant)) <= {"weights", "quantization"}


# -- everywhere: bytes nothing explains are guesses, and no advice rests on them -----------------
EVERY = sorted(p for p in DATA.glob("*.pickle")) + sorted(GROUNDTRUTH.glob("*.pickle")) + \
    [REPO / "assets" / "example.pickle"] + \
    (sorted(p for p in SHARED.glob("*.p*kl*") if p.name != NOT_A_SNAPSHOT) if SHARED.is_dir() else [])


def frameless_kept_at_peak(path) -> dict[int, set[tuple[int, int]]]:
    """Independently of the parser (trusted files, pickle.load): per device, the (address,
    alloc index) of every block live at the end whose allocation has no frames, that was
    allocated at or before the reference peak (the last alloc entry of its address; -1 when
    it was live before the trace)."""
    from helpers import reference_peaks  # noqa: F401  (the same trusted reading)
    with open(path, "rb") as f:
        obj = pickle.load(f)
    segs = obj["segments"] if isinstance(obj, dict) else obj
    traces = obj.get("device_traces", []) if isinstance(obj, dict) else []
    out: dict[int, set] = {}
    for s in segs:
        dev = s["device"]
        trace = traces[dev] if dev < len(traces) else []
        last_alloc = {}
        for i, e in enumerate(trace):
            if e.get("action") == "alloc":
                last_alloc[e["addr"]] = i
        cursor = s["address"]
        for b in s["blocks"]:
            a = b.get("address", cursor)
            cursor = a + b["size"]
            if b["state"] not in ("active_allocated", "active_pending_free"):
                continue
            i = last_alloc.get(a, -1)
            frames = trace[i].get("frames") if i >= 0 else (b.get("frames") if "history" not in b else
                                                            (b["history"][0].get("frames") if b["history"] else None))
            if not frames:
                out.setdefault(dev, set()).add((a, i))
    return out


@pytest.mark.parametrize("path", EVERY, ids=[p.name for p in EVERY])
def test_bytes_no_frame_explains_are_guesses_and_carry_no_advice(path):
    an = an_of(path)
    expected = frameless_kept_at_peak(path)
    for dev, da in an.devices.items():
        a = da.allocs
        peak = da.peak.index
        rows = {(int(ad), int(ai)): r for r, (ad, ai) in enumerate(zip(a.addr.tolist(), a.alloc_index.tolist()))
                if a.free_index[r] < 0}
        kept = [rows[k] for k in expected.get(dev, ()) if k in rows and k[1] <= peak]
        assert len(kept) == len([k for k in expected.get(dev, ()) if k[1] <= peak])
        assert evidence_of(da, np.asarray(kept, dtype=np.int64)) <= {"guess", "none"}, path.name
        frameless = int(a.size[np.asarray(kept, dtype=np.int64)].sum()) if kept else 0
        assert sum(da.peak.by_evidence.values()) == da.peak.bytes
        assert da.peak.by_evidence.get("guess", 0) + da.peak.by_evidence.get("none", 0) >= frameless
        if da.peak.bytes and frameless >= GUESSED_TOO_MUCH * da.peak.bytes:
            assert da.peak.advice == () and all(o.advice == () for o in da.ooms), path.name


@pytest.mark.parametrize("path", EVERY, ids=[p.name for p in EVERY])
def test_no_lever_left_out_is_advised_anywhere(path):
    """One rule decides which levers apply (levers.left_out): the peak's and every OOM's advice,
    what-if and the report all read it, so none of them advises a lever it leaves out."""
    an = an_of(path)
    for dev, da in an.devices.items():
        out = levers_left_out(an, dev)
        assert not {a.lever for a in da.peak.advice} & set(out), (path.name, dev)
        for o in da.ooms:
            assert not {a.lever for a in o.advice} & set(out), (path.name, dev, o.index)
        assert set(da.peak.advice_left_out.items()) <= set(out.items())
        for a in da.peak.advice:
            assert a.evidence in ("torch", "stack", "lifetime")


# -- a trimmed export keeps every category it had ----------------------------------------------
TRIMMED = [DATA / "cuda_ckpt.pickle", DATA / "qlora_4bit.pickle", DATA / "adamw_after_step1.pickle",
           GROUNDTRUTH / "transformer_adamw.pickle"] + \
    ([SHARED / "cranberrii+ftcourse__memory_snapshot.pickle"] if SHARED.is_dir() else [])


@pytest.mark.parametrize("path", TRIMMED, ids=[p.name for p in TRIMMED])
def test_a_trimmed_export_keeps_every_category_rule_and_evidence(path, tmp_path):
    from vramscope.services.export import export_trimmed
    full = an_of(path)
    dev = full.primary_device()
    info = export_trimmed(full.snapshot, str(tmp_path / "t.pickle"), dev, around_peak=400, analysis=full)
    part = an_of(tmp_path / "t.pickle")
    df, dp = full.devices[dev], part.devices[dev]
    assert dp.peak.bytes == df.peak.bytes and dp.peak.by_category == df.peak.by_category
    key = {(int(a), int(i)): r for r, (a, i) in enumerate(zip(df.allocs.addr.tolist(), df.allocs.alloc_index.tolist()))}
    for r, (a, i) in enumerate(zip(dp.allocs.addr.tolist(), dp.allocs.alloc_index.tolist())):
        if i >= 0:
            f = key[(a, i + info["start"])]
        else:            # from before the window: the allocation live at the address when it began
            f = next(rr for (aa, ii), rr in key.items() if aa == a and ii < info["start"]
                     and (df.allocs.free_index[rr] < 0 or df.allocs.free_index[rr] >= info["start"]))
        assert (dp.category[r], dp.rule_name(int(dp.rule[r])), dp.evidence[r]) == \
            (df.category[f], df.rule_name(int(df.rule[f])), df.evidence[f]), (path.name, r)
