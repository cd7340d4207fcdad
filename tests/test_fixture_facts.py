"""The synthetic fixtures made for the OOM, stale-gradient, leak, multi-device and forward
frame features hold what their `expect` (tests/data/expected.json) says.

These tests read the pickles with `pickle.load` (our own trusted files) and the reference
figures of tests/data/make_fixtures.py, never vramscope's parser or classifier: they check
the facts put into the fixtures, so that the feature tests can rely on them. The recorded
runs' facts are test_groundtruth_facts.py's.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter

from helpers import DATA, live_curve, load_trusted, phase_of

sys.path.insert(0, str(DATA))
import make_fixtures  # noqa: E402

EXPECTED = json.loads((DATA / "expected.json").read_text())["fixtures"]
SYNTHETIC = ("oom_step3.pickle", "forward_frames_213.pickle", "stale_grads.pickle", "keep_loss.pickle",
             "multi_device_oom.pickle")


def _load(name):
    return load_trusted(DATA / name)


def _expect(name):
    return EXPECTED[name]["expect"]


def _names(entry):
    return [f["name"] for f in entry.get("frames", [])]


def _has_frame(entry, filename_end, name, line=None):
    return any(f["filename"].endswith(filename_end) and f["name"] == name and (line is None or f["line"] == line)
               for f in entry.get("frames", []))


def test_the_fixtures_are_small():
    sizes = {n: (DATA / n).stat().st_size for n in SYNTHETIC}
    assert all(s < make_fixtures.MAX_BYTES for s in sizes.values()), sizes
    assert sum(sizes.values()) < 1_000_000, sum(sizes.values())     # with the recorded runs' 3 MB: 4 MB


# -- oom_step3 ------------------------------------------------------------------------------
def test_oom_step3_two_healthy_steps_then_an_oom_at_the_start_of_backward():
    snap, want = _load("oom_step3.pickle"), _expect("oom_step3.pickle")
    trace = snap["device_traces"][0]
    ref = make_fixtures.reference(snap, 0)
    its = want["iteration_table"]
    assert want["iterations"] == len(its) == 3 and want["oom_iteration"] == 2
    # the iterations tile the trace
    assert its[0]["start_index"] == 0 and its[-1]["end_index"] == len(trace) - 1
    assert all(a["end_index"] + 1 == b["start_index"] for a, b in zip(its, its[1:]))
    assert [p["phase"] for p in its[0]["phases"]] == ["inputs", "forward", "backward", "optimizer"]
    assert [p["phase"] for p in its[2]["phases"]] == ["inputs", "forward", "backward"]
    # exactly one OOM, in the third iteration's backward, and the trace ends right after it
    assert [o["index"] for o in ref["ooms"]] == [want["oom"]["index"]]
    oom = ref["ooms"][0]
    assert oom["requested"] == want["oom"]["requested"] > oom["device_free"]
    assert phase_of(its[2], oom["index"]) == "backward"
    assert len(trace) - 1 - oom["index"] <= 2
    # each iteration's peak, recomputed from the reference replay
    curve = live_curve(trace, ref["start_bytes"])
    for it, pk in zip(its, want["iteration_peaks"]):
        allocs = [i for i in range(it["start_index"], it["end_index"] + 1) if trace[i]["action"] == "alloc"]
        top = max(curve[i] for i in allocs)
        assert pk["index"] == next(i for i in allocs if curve[i] == top)
        assert pk["bytes"] == top and pk["phase"] == phase_of(it, pk["index"]) == "backward"
    # healthy steps: the peak is the first autograd-thread allocation, right after the loss's
    # gradient made on the main thread by torch.autograd's _make_grads
    for pk in want["iteration_peaks"][:2]:
        assert pk["type"] == "backward_start"
        assert trace[pk["index"]]["frames"] == []
        before = next(e for e in reversed(trace[:pk["index"]]) if e["action"] == "alloc")
        assert _has_frame(before, "torch/autograd/__init__.py", "_make_grads")
    assert want["iteration_peaks"][2]["type"] == "oom"
    assert ref["peak_index"] == want["iteration_peaks"][2]["index"]
    # the phases are named by the stacks, as in real files
    for it in its:
        for p in it["phases"]:
            for e in trace[p["start_index"]:p["end_index"] + 1]:
                if e["action"] != "alloc":
                    continue
                if p["phase"] == "forward":
                    assert _has_frame(e, "torch/nn/modules/module.py", "_call_impl") or \
                        _has_frame(e, "torch/nn/functional.py", "cross_entropy")
                elif p["phase"] == "optimizer":
                    assert _has_frame(e, "torch/optim/optimizer.py", "wrapper")


# -- forward_frames_213 ---------------------------------------------------------------------
FF_LINE = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)\n    .+\n$')


def test_forward_frames_213_layout_and_forward_user_frames():
    snap, want = _load("forward_frames_213.pickle"), _expect("forward_frames_213.pickle")
    assert {"host_segments", "host_traces", "allocator_settings", "external_annotations"} <= set(snap)
    trace = snap["device_traces"][0]
    assert all(isinstance(e["pool_id"], tuple) and len(e["pool_id"]) == 2 for e in trace)
    carriers = [e for e in trace if "forward_frames" in e]
    assert {e["action"] for e in carriers} == {"alloc", "free_requested", "free_completed"}
    for e in trace:
        py = any(f["filename"].endswith(".py") for f in e.get("frames", []))
        if "forward_frames" in e:
            # the autograd thread: C++ frames only, a generated node's apply, the engine
            assert not py
            names = _names(e)
            assert names[0] == "torch::unwind::unwind()"
            assert any(n.startswith("torch::CapturedTraceback::gather") for n in names)
            assert any(n.startswith("torch::autograd::generated::") and "Backward0::apply(" in n for n in names)
            assert any("Engine::thread_main" in n for n in names)
            if e["action"] == "alloc":
                assert any(n.startswith("c10::cuda::CUDACachingAllocator::") and "::malloc(" in n for n in names)
                assert any(n.startswith("at::_ops::") and "::call(" in n for n in names)
            ff = e["forward_frames"]
            assert isinstance(ff, list) and ff and all(isinstance(s, str) and FF_LINE.match(s) for s in ff)
            assert FF_LINE.match(ff[0])["name"] == "<module>"        # outermost first
    # one context per free: free_requested and its free_completed share the list, allocs do not
    ids = Counter(id(e["forward_frames"]) for e in carriers)
    assert all(c == 2 for i, c in ids.items() if any(id(e["forward_frames"]) == i and e["action"] == "free_requested" for e in carriers))
    assert all(ids[id(e["forward_frames"])] == 1 for e in carriers if e["action"] == "alloc")
    # the recorded intent: each listed backward alloc's forward, and its user frame
    records = want["backward_allocs"]
    assert len(records) >= 4 and {r["node"] for r in records} >= {"MmBackward0", "GeluBackward0", "LogSoftmaxBackward0"}
    assert len({r["iteration"] for r in records}) == want["iterations"] == 2
    for r in records:
        e = trace[r["index"]]
        assert e["action"] == "alloc" and e["size"] == r["size"]
        assert any("generated::%s::apply(" % r["node"] in n for n in _names(e))
        frames = [FF_LINE.match(s) for s in e["forward_frames"]]
        innermost = frames[-1]
        assert "%s:%s:%s" % (innermost["file"], innermost["line"], innermost["name"]) == r["forward_innermost_frame"]
        user = next(m for m in reversed(frames) if "site-packages" not in m["file"])
        assert "%s:%s:%s" % (user["file"], user["line"], user["name"]) == r["forward_user_frame"]
    mm = [r for r in records if r["node"] == "MmBackward0"]
    assert {r["forward_user_frame"].rsplit("/", 1)[1] for r in mm} == {"model.py:21:forward", "model.py:22:forward",
                                                                      "model.py:23:forward"}
    assert any("at::_ops::mm::call(" in n for n in _names(trace[mm[0]["index"]]))


# -- stale_grads ----------------------------------------------------------------------------
def test_stale_grads_live_through_forward_and_are_freed_by_zero_grad():
    snap, want = _load("stale_grads.pickle"), _expect("stale_grads.pickle")
    trace = snap["device_traces"][0]
    ref = make_fixtures.reference(snap, 0)
    sg = want["stale_gradients"]
    sizes = want["param_sizes"]
    assert sg["bytes"] == sum(sizes) and sg["blocks_per_iteration"] == len(sizes)
    assert sg["live_through_phases"] == ["forward"]
    # blocks live before the trace began (backward replay from the end state)
    live = {}
    for s in snap["segments"]:
        for a, b in make_fixtures.iter_blocks(s):
            if b["state"] in make_fixtures.LIVE_STATES:
                live[a] = b["requested_size"]
    for e in reversed(trace):
        if e["action"] == "alloc":
            live.pop(e["addr"], None)
        elif e["action"] in ("free_completed", "free"):
            live[e["addr"]] = e["size"]
    assert sum(live.values()) == ref["start_bytes"] == want["not_leaks"]["pre_trace_bytes"]
    its = want["iteration_table"]
    assert len(its) == want["iterations"] == 3
    last_alloc = {}
    for k, (it, per) in enumerate(zip(its, sg["per_iteration"])):
        ph = {p["phase"]: p for p in it["phases"]}
        assert [p["phase"] for p in it["phases"]] == ["inputs", "forward", "zero_grad", "backward", "optimizer"]
        lo, hi = per["freed_index_range"]
        assert (lo, hi) == (ph["zero_grad"]["start_index"], ph["zero_grad"]["end_index"])
        frees = [e for e in trace[lo:hi + 1] if e["action"] == "free_completed"]
        assert sorted(e["size"] for e in frees) == sorted(sizes)
        for e in frees:
            assert e["frames"][0]["name"] == sg["freed_by"]["name"] == "zero_grad"
            assert e["frames"][0]["filename"] == sg["freed_by"]["filename"]
            assert _has_frame(e, "train.py", "train", 102)
            # live through the whole forward: allocated before it, not freed inside it
            assert not any(x["addr"] == e["addr"] and x["action"] in ("alloc", "free_completed")
                           for x in trace[ph["forward"]["start_index"]:lo])
        if per["allocated_before_trace"]:
            assert k == 0
            assert all(live.get(e["addr"]) == e["size"] for e in frees)
        else:
            a_lo, a_hi = per["allocated_index_range"]
            made = {last_alloc[e["addr"]] for e in frees}
            assert all(a_lo <= i <= a_hi and trace[i]["frames"] == [] for i in made)
            assert (a_lo, a_hi) == (its[k - 1]["phases"][3]["start_index"], its[k - 1]["phases"][3]["end_index"])
        for i in range(it["start_index"], it["end_index"] + 1):
            if trace[i]["action"] == "alloc":
                last_alloc[trace[i]["addr"]] = i
    # the peak is at the end of a forward, with the stale gradients still live
    pk = want["peak"]
    assert pk["index"] == ref["peak_index"]
    it = its[pk["iteration"]]
    assert phase_of(it, pk["index"]) == pk["phase"] == "forward"
    assert pk["index"] < sg["per_iteration"][pk["iteration"]]["freed_index_range"][0]
    assert pk["stale_gradient_bytes_live"] == sum(sizes)


# -- keep_loss ------------------------------------------------------------------------------
def test_keep_loss_grows_by_the_kept_graph_every_iteration():
    snap, want = _load("keep_loss.pickle"), _expect("keep_loss.pickle")
    trace = snap["device_traces"][0]
    ref = make_fixtures.reference(snap, 0)
    curve = live_curve(trace, ref["start_bytes"])
    (leak,) = want["leaks"]
    assert [curve[i] for i in want["iteration_end_index"]] == want["live_bytes_at_iteration_end"]
    ends = want["live_bytes_at_iteration_end"]
    assert {b - a for a, b in zip(ends, ends[1:])} == {leak["bytes_per_iteration"]}
    # allocations never freed, per iteration, optimizer state (adamw.py _init_group) aside
    last = {}
    for i, e in enumerate(trace):
        if e["action"] in ("alloc", "free_completed"):
            last[e["addr"]] = i
    kept = [i for i in last.values() if trace[i]["action"] == "alloc"
            and not _has_frame(trace[i], "torch/optim/adamw.py", "_init_group")]
    site = (leak["filename"], leak["line"], leak["name"])
    for it in want["iteration_table"]:
        mine = [i for i in kept if it["start_index"] <= i <= it["end_index"]]
        assert len(mine) == leak["blocks_per_iteration"]
        assert sum(trace[i]["size"] for i in mine) == leak["bytes_per_iteration"]
        for i in mine:
            assert site in [(f["filename"], f["line"], f["name"]) for f in trace[i]["frames"]]
        # the loss itself (4 bytes, cross_entropy) is one of them
        assert any(trace[i]["size"] == 4 and _has_frame(trace[i], "torch/nn/functional.py", "cross_entropy")
                   for i in mine)
    assert len(kept) == leak["blocks"] and sum(trace[i]["size"] for i in kept) == leak["bytes"]
    assert leak["categories"] == sorted(leak["bytes_by_category_per_iteration"]) == ["activations", "inputs"]
    assert sum(leak["bytes_by_category_per_iteration"].values()) == leak["bytes_per_iteration"]
    assert leak["retain_graph"] is True and leak["kept_by"]["line"] == 184


# -- multi_device_oom -----------------------------------------------------------------------
def test_multi_device_oom_device_one_ooms_device_zero_peaks():
    snap, want = _load("multi_device_oom.pickle"), _expect("multi_device_oom.pickle")
    assert len(snap["device_traces"]) == 3 and all(snap["device_traces"])
    refs = {r["device"]: r for r in make_fixtures.reference_all(snap)}
    assert sorted(refs) == want["devices"] == [0, 1, 2]
    assert {str(d): r["peak_bytes"] for d, r in refs.items()} == want["peaks"]
    assert {str(d): r["peak_index"] for d, r in refs.items()} == want["peak_index"]
    ooms = {d: r["ooms"] for d, r in refs.items() if r["ooms"]}
    assert list(ooms) == [want["oom_device"]] == [1]
    (oom,) = ooms[1]
    assert oom["index"] == want["oom"]["index"] and oom["requested"] == want["oom"]["requested"] > oom["device_free"]
    assert max(refs, key=lambda d: refs[d]["peak_bytes"]) == want["highest_peak_device"] == 0
    assert refs[0]["peak_bytes"] > max(refs[1]["peak_bytes"], refs[2]["peak_bytes"])
    # the OOM happened in device 1's forward (a replica's forward in a parallel_apply thread)
    tr1 = snap["device_traces"][1]
    assert _has_frame(tr1[oom["index"]], "torch/nn/parallel/parallel_apply.py", "_worker")
    # the devices' entries interleave in time (one process, threads per device)
    t = {d: [e["time_us"] for e in snap["device_traces"][d]] for d in range(3)}
    assert min(t[1]) < max(t[0]) and min(t[0]) < max(t[2])
