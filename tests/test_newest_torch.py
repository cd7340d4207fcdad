"""Issue 25: what the newest torch writes (2.14 and main), read and shown by every verb.

One synthetic fixture per new field, in torch's layout (tests/data/make_fixtures.py says
where each layout comes from; docs/format.md field by field): component tracking, dict
user_metadata with annotate entries and internal_metadata, pinned host memory, FX source
mapping, a trace recorded with skip_actions. Each goes through every verb with no traceback,
and each verb is asserted to show what the field means. Independent references read the
trusted pickles with `pickle.load`, never our parser.
"""
from __future__ import annotations

import csv
import io
import pickle

import numpy as np
import orjson
import pytest

from vramscope.classifiers.analysis import analyze
from vramscope.classifiers.categories import CATEGORIES
from vramscope.classifiers.torch_tags import COMPONENT_TO_CATEGORY, PRECISE_COMPONENTS
from vramscope.cli import main
from vramscope.parsers import open_snapshot
from vramscope.parsers.cache import read_snapshot
from vramscope.parsers.tables import HOST_DEVICE
from vramscope.present.stacks import Stacks

from helpers import DATA, SHARED, load_trusted

EXPECTED = orjson.loads((DATA / "expected.json").read_bytes())["fixtures"]
NEW = ("component_tracking.pickle", "metadata_annotate.pickle", "host_pinned.pickle", "fx_frames.pickle",
       "skip_actions.pickle")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")


def run(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Traceback" not in out.err
    return out.out


def every_verb(capsys, tmp_path, path) -> dict:
    """Every verb on one file: {verb: its output} (report: the folder)."""
    p = str(path)
    out = {"summary": run(capsys, "summary", p),
           "json": orjson.loads(run(capsys, "summary", p, "--json")),
           "csv": list(csv.DictReader(io.StringIO(run(capsys, "allocations", p, "--csv", "--extra")))),
           "whatif": orjson.loads(run(capsys, "whatif", p, "--json", "--lever", "checkpointing")),
           "compare": orjson.loads(run(capsys, "compare", p, p, "--json"))}
    run(capsys, "report", p, "-o", tmp_path / "report")
    out["report"] = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    out["analysis"] = orjson.loads((tmp_path / "report" / "analysis.json").read_bytes())
    run(capsys, "export", p, "--around-peak", "-o", tmp_path / "t.pickle")
    run(capsys, "export", p, "--perfetto", "-o", tmp_path / "t.json")
    run(capsys, "view", p, "--screenshot", tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000
    return out


def analysis(name):
    return analyze(open_snapshot(str(DATA / name)))


def replay_peak(entries: list, live_end: dict, frees=("free_completed", "free")) -> tuple[int, int]:
    """(peak, start) of live bytes: the end state replayed backwards, then forwards (the
    reference of make_fixtures.py, with `frees` the actions that end an allocation)."""
    live = dict(live_end)
    for e in reversed(entries):
        if e["action"] == "alloc":
            live.pop(e["addr"], None)
        elif e["action"] in frees:
            live[e["addr"]] = e["size"]
    cur = peak = start = sum(live.values())
    for e in entries:
        if e["action"] == "alloc":
            cur += e["size"]
            peak = max(peak, cur)
        elif e["action"] in frees:
            cur -= e["size"]
    return peak, start


def live_blocks(segments, device) -> dict:
    return {b["address"]: b["requested_size"] for s in segments if s["device"] == device for b in s["blocks"]
            if b["state"] in ("active_allocated", "active_pending_free")}


# -- the parser: both halves agree on the new fields -------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_fast_path_and_interpreter_read_the_same(name):
    a, b = read_snapshot(str(DATA / name)), read_snapshot(str(DATA / name), fast=False)
    assert sorted(a.traces) == sorted(b.traces) and a.component_names == b.component_names
    for d in a.traces:
        ca, cb = a.traces[d].columns, b.traces[d].columns
        assert sorted(ca) == sorted(cb)
        for k in ca:
            if k in ("stack", "forward_stack"):      # interned in another order: compare the frames
                assert [a.stack_frames_list(int(s)) for s in ca[k]] == [b.stack_frames_list(int(s)) for s in cb[k]]
            elif k in ("user_metadata", "internal_metadata", "compile_context"):
                assert [a.strings[i] if i >= 0 else None for i in ca[k].tolist()] == \
                       [b.strings[i] if i >= 0 else None for i in cb[k].tolist()]
            else:
                assert np.array_equal(ca[k], cb[k]), (d, k)


# -- component tracking -------------------------------------------------------------------------
def test_component_tracking_through_every_verb(capsys, tmp_path):
    out = every_verb(capsys, tmp_path, DATA / "component_tracking.pickle")
    rows = out["csv"]
    # torch's precise tags decide, with evidence `torch`; our rules' verdict kept beside
    rope = [r for r in rows if r["torch_tag"] == "buffer"]
    assert len(rope) == 1 and rope[0]["category"] == "weights" and rope[0]["rule"] == "torch.component"
    assert rope[0]["evidence"] == "torch" and rope[0]["rules_category"] == "activations"
    params = [r for r in rows if r["torch_tag"] == "parameter"]
    assert params and all(r["category"] == "weights" and r["evidence"] == "torch" for r in params)
    grads = [r for r in rows if r["torch_tag"] == "gradient"]
    assert grads and all(r["category"] == "gradients" and r["evidence"] == "torch" for r in grads)
    # a coarse tag never overrides a verdict our rules rest on evidence for: 'temp' (inside a
    # module's backward) on gradients stays gradients; 'optimizer_state' on AdamW's scratch stays temporary
    assert any(r["torch_tag"] == "temp" and r["category"] == "gradients" and r["evidence"] != "torch" for r in rows)
    assert any(r["torch_tag"] == "optimizer_state" and r["category"] == "temporary" for r in rows)
    # the module is part of 'where': summary, report, compare sites
    top = out["json"]["devices"][0]["peak"]["top"]
    assert any(t["where"].endswith(" in lm_head") for t in top)
    assert "in module `lm_head`" in out["report"] and "torch: parameter" in out["report"]
    sites = [s["where"] for s in out["compare"]["devices"][0]["sites"]]
    assert any(w.endswith(" in layers.0") for w in sites) and any(w.endswith(" in layers.1") for w in sites)
    md = out["json"]["devices"][0]["metadata"]["by"]["user_metadata"]
    assert {g["value"] for g in md} >= {"embed", "layers.0", "layers.1", "lm_head", "optimizer"}


def test_classifier_accuracy_against_component_tags():
    """Our rules' verdict (`rules_category`) against torch's component tags, byte-weighted
    over every tagged allocation: all tags, and the precise (by-pointer) ones alone."""
    an = analysis("component_tracking.pickle")
    da = an.devices[0]
    names = an.snapshot.component_names
    tag = np.asarray([CATEGORIES.index(COMPONENT_TO_CATEGORY[n.lower()]) if n.lower() in COMPONENT_TO_CATEGORY
                      else -1 for n in names])[da.torch_component]
    precise = np.isin(np.asarray(names, dtype=object)[da.torch_component], list(PRECISE_COMPONENTS))
    size = da.allocs.size.astype(np.float64)
    ours = da.rules_category

    def agreement(rows):
        return float(size[rows & (ours == tag)].sum() / size[rows].sum())
    everything, exact = agreement(tag >= 0), agreement((tag >= 0) & precise)
    print(f"\ncomponent_tracking: our rules agree with torch's component tags on {everything:.3f} of the "
          f"tagged bytes, on {exact:.3f} of those it tags by pointer")
    assert exact >= 0.98            # the by-pointer tags: the rotary buffer is the one disagreement
    assert 0.70 <= everything < 0.95    # coarse tags call AdamW's scratch optimizer state, grads 'temp'


def test_selection_pane_shows_torch_tag_beside_our_rules(qt):
    from viewer_helpers import new_window, open_and_wait
    w = new_window(qt)
    d = open_and_wait(qt, w, str(DATA / "component_tracking.pickle"))
    names = d.snap.component_names
    row = int(np.flatnonzero(np.asarray(names, dtype=object)[d.da.torch_component] == "buffer")[0])
    w.stack_panel.set_data(d)
    w.stack_panel.set_row(row)
    text = w.stack_panel.header.text()
    assert "torch: buffer; our rules: activations" in text and "torch.component" in text


# -- user_metadata as a dict, annotate, internal_metadata -------------------------------------
def test_metadata_and_annotations_through_every_verb(capsys, tmp_path):
    want = EXPECTED["metadata_annotate.pickle"]["expect"]
    out = every_verb(capsys, tmp_path, DATA / "metadata_annotate.pickle")
    md = out["json"]["devices"][0]["metadata"]
    assert md["keys"][:2] == ["phase", "step"] or set(md["keys"][:2]) == {"phase", "step"}
    steps = {g["value"]: g for g in md["by"]["step"]}
    assert set(steps) >= {"12", "13", "14"}
    noted = [r for r in out["csv"] if r["notes"]]
    assert len(noted) == 3 and all(r["notes"] == "kept for the eval logger" for r in noted)
    assert {int(r["index"]) for r in noted} < set(range(min(want["annotate_indices"])))  \
        or all(int(r["index"]) < i for r, i in zip(sorted(noted, key=lambda r: int(r["index"])),
                                                  want["annotate_indices"]))
    assert any(r["metadata"] == '{"step":12,"phase":"forward"}' for r in out["csv"])
    assert any(r["metadata"] == "eval" for r in out["csv"])
    assert "metadata       keys phase, step" in out["summary"] or "keys step, phase" in out["summary"]
    assert "note: `kept for the eval logger`" in out["report"]


def test_metadata_groups_and_search_in_the_analysis_api():
    da = analysis("metadata_annotate.pickle").devices[0]
    groups = {g.value: g for g in da.group_by_metadata("step")}
    assert set(groups) == {"12", "13", "14", ""}
    assert sum(g.allocations for g in groups.values()) == len(da.allocs)
    assert sum(g.bytes for g in groups.values()) == int(da.allocs.size.sum())
    assert sum(g.peak_bytes for g in groups.values()) == da.peak.bytes
    md = da.metadata()
    assert int(md.matching("eval logger").sum()) == 3
    assert int(md.matching("mallocwithaddress").sum()) == 1          # internal_metadata, searchable too
    row = int(np.flatnonzero(md.matching("eval logger"))[-1])
    a = da.allocation(row)
    assert ("note", "kept for the eval logger") in a.metadata and a.free_index == -1


def test_table_search_finds_metadata():
    from vramscope.viewer.model import DeviceData
    from vramscope.viewer.model.rows import RowView
    an = analysis("metadata_annotate.pickle")
    view = RowView(DeviceData(an.snapshot, an, 0))
    view.set_filter(text="eval logger")
    assert len(view.rows) == 3
    view.set_filter(text='"step":13')
    assert len(view.rows) == int(an.devices[0].metadata().matching('"step":13').sum()) > 10


# -- pinned host memory ---------------------------------------------------------------------------
def test_host_memory_apart_from_the_gpu_peak(capsys, tmp_path):
    want = EXPECTED["host_pinned.pickle"]
    out = every_verb(capsys, tmp_path, DATA / "host_pinned.pickle")
    obj = load_trusted(DATA / "host_pinned.pickle")
    host = out["json"]["host"]
    peak, start = replay_peak(obj["host_traces"], live_blocks(obj["host_segments"], -1))
    assert host["peak_bytes"] == peak == want["expect"]["host_peak_bytes"]
    assert host["end_live_bytes"] == want["expect"]["host_end_bytes"] and host["entries"] == len(obj["host_traces"])
    dev = out["json"]["devices"]
    assert [d["device"] for d in dev] == [0]                   # the host is no device
    assert dev[0]["peak"]["bytes"] == want["devices"][0]["peak_bytes"]    # and none of its bytes
    assert "pinned host memory (not part of any device's peak)" in out["summary"]
    assert "## Pinned host memory" in out["report"] and out["analysis"]["host"] == host
    snap = open_snapshot(str(DATA / "host_pinned.pickle"))
    assert snap.devices == [0] and snap.has_host and len(snap.trace(HOST_DEVICE)) == len(obj["host_traces"])


def test_device_strip_shows_host_memory_as_its_own_card(qt):
    from viewer_helpers import new_window, open_and_wait
    w = new_window(qt)
    open_and_wait(qt, w, str(DATA / "host_pinned.pickle"))
    strip = w.device_strip
    assert strip.isVisible() and strip.host is not None
    assert strip.host.text().startswith("host (pinned)  peak 64.00 MiB")
    assert list(strip.buttons) == [0]


# -- FX source mapping --------------------------------------------------------------------------
def test_fx_frames_name_the_original_source_line(capsys, tmp_path):
    want = EXPECTED["fx_frames.pickle"]["expect"]
    out = every_verb(capsys, tmp_path, DATA / "fx_frames.pickle")
    wheres = [t["where"] for t in out["json"]["devices"][0]["peak"]["top"]]
    assert any(w.startswith(want["original_user_frames"]["linear"][0] + ":24:forward") for w in wheres)
    assert "net.py:24 forward" in out["report"] and "fx_generated" not in out["json"]["devices"][0]["peak"]["top"][0]["where"]
    an = analysis("fx_frames.pickle")
    st, da = Stacks(an), an.devices[0]
    for r in range(len(da.allocs)):
        a = da.allocation(r)
        frames = st.view_of(da, a).frames
        gen = [k for k, f in enumerate(frames) if want["generated_file"] in f.file]
        if not gen:
            continue
        # the original user frame first, the generated one right behind it, with its node
        user = next(k for k, f in enumerate(frames) if f.role == "user")
        assert user < gen[0] and frames[user].file.endswith("net.py")
        assert frames[gen[0]].note.startswith("FX ") and frames[gen[0]].role == "library"
        assert st.where_of(a).split(":")[0].endswith("net.py")


# -- skip_actions ---------------------------------------------------------------------------------
def test_skip_actions_trace_reads_right_and_says_what_was_skipped(capsys, tmp_path):
    out = every_verb(capsys, tmp_path, DATA / "skip_actions.pickle")
    obj = load_trusted(DATA / "skip_actions.pickle")
    peak, start = replay_peak(obj["device_traces"][0], live_blocks(obj["segments"], 0))
    d = out["json"]["devices"][0]
    assert d["peak"]["bytes"] == peak and d["start_live_bytes"] == start
    assert d["skipped_actions"] == ["free_requested", "segment_alloc", "segment_free"]
    assert d["reserved_peak_bytes"] is None
    assert "not recorded   free_requested, segment_alloc, segment_free (skip_actions)" in out["summary"]
    assert "| Not recorded |" in out["report"]


def test_a_trace_without_free_completed_counts_frees_when_requested(capsys, tmp_path):
    obj = load_trusted(DATA / "clean_loop.pickle")
    obj["device_traces"][0] = [e for e in obj["device_traces"][0] if e["action"] != "free_completed"]
    path = tmp_path / "no_free_completed.pickle"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    doc = orjson.loads(run(capsys, "summary", path, "--json"))
    d = doc["devices"][0]
    peak, start = replay_peak(obj["device_traces"][0], live_blocks(obj["segments"], 0), frees=("free_requested",))
    assert d["peak"]["bytes"] == peak == EXPECTED["clean_loop.pickle"]["devices"][0]["peak_bytes"]
    assert d["skipped_actions"] == ["free_completed"] and d["leaks"] == []


def test_no_action_is_reported_skipped_in_files_that_skip_none():
    names = [n for n in EXPECTED if n != "skip_actions.pickle"]
    real = sorted(SHARED.glob("*.p*kl*")) if SHARED.is_dir() else []
    for path in [DATA / n for n in names] + [p for p in real if not p.name.startswith("NOT_A_SNAPSHOT")]:
        an = analyze(open_snapshot(str(path)))
        assert all(not da.skipped_actions for da in an.devices.values()), path.name


# -- untrusted values: dropped or kept, never fatal ---------------------------------------------------
def _snapshot(**over) -> dict:
    frame = {"name": "f", "filename": "/u/a.py", "line": 3}
    seg = {"device": 0, "address": 1 << 40, "total_size": 2 << 20, "allocated_size": 0, "active_size": 0,
           "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": [], "blocks": [{"address": 1 << 40, "size": 2 << 20,
                                                             "requested_size": 0, "state": "inactive",
                                                             "frames": []}]}
    trace = [{"action": "alloc", "addr": 1 << 40, "size": 4096, "stream": 0, "time_us": 1, "frames": [frame]},
             {"action": "annotate", "addr": 1 << 40, "size": 4096, "stream": 0, "time_us": 2,
              "user_metadata": "ok", "frames": [frame]},
             {"action": "annotate", "addr": 12345, "size": 1, "stream": 0, "time_us": 3, "user_metadata": "nowhere"},
             {"action": "free_requested", "addr": 1 << 40, "size": 4096, "stream": 0, "time_us": 4},
             {"action": "free_completed", "addr": 1 << 40, "size": 4096, "stream": 0, "time_us": 5}]
    snap = {"segments": [seg], "device_traces": [trace], "host_segments": [], "host_traces": []}
    for k, v in over.items():
        if k.startswith("entry_"):
            trace[0][k[6:]] = v
        elif k.startswith("frame_"):
            frame[k[6:]] = v
        else:
            snap[k] = v
    return snap


@pytest.mark.parametrize("over", [
    {"entry_component_type": 3}, {"entry_component_type": ["parameter"]}, {"entry_component_type": "PARAMETER"},
    {"entry_internal_metadata": {"a": 1}}, {"entry_user_metadata": {"step": 1}}, {"entry_user_metadata": "{bad json"},
    {"frame_fx_node_op": 7}, {"frame_fx_original_trace": (1, 2.5)}, {"frame_fx_original_trace": "x" * 300_000},
    {"frame_fx_original_trace": 'File "/u/m.py", line 99999999999, in f\n'},
    {"frame_fx_node_name": "n", "frame_fx_original_trace": '  File "/u/m.py", line 7, in fwd\n' * 500},
    {"host_traces": "not a list"}, {"host_traces": [{"action": "alloc", "addr": 1 << 41, "size": "big"}]},
    {"host_segments": [{"device": -1, "address": 4096, "total_size": 4096, "blocks": []}]},
])
def test_untrusted_new_fields_are_kept_or_dropped_never_fatal(capsys, tmp_path, over):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(**over), protocol=4))
    doc = orjson.loads(run(capsys, "summary", path, "--json"))
    assert doc["devices"][0]["peak"]["bytes"] == 4096
    run(capsys, "allocations", path, "--csv")
    snap = open_snapshot(str(path))
    for fx in snap.frame_fx.values():
        assert len(fx[4]) <= 64 and all(len(snap.strings[s]) <= 1 << 16 for s in fx[:4] if s >= 0)


@pytest.mark.parametrize("over", [{"host_segments": ["x"]}, {"host_traces": [{"action": "alloc", "addr": -5}]},
                                  {"host_traces": ["junk"]}])
def test_what_a_device_would_refuse_the_host_refuses_alike(capsys, tmp_path, over):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(**over), protocol=4))
    code = main(["summary", str(path)])
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "device -1" not in err


# -- memory_viz's private pool envelopes, as numbers ------------------------------------------------
def test_private_pool_footprint_is_the_larger_of_live_and_reserved(capsys):
    obj = load_trusted(DATA / "annotated_210.pickle")
    doc = orjson.loads(run(capsys, "summary", DATA / "annotated_210.pickle", "--json"))
    (pool,) = doc["devices"][0]["private_pools"]
    segs = [s for s in obj["segments"] if s["segment_pool_id"] == (0, 1)]
    trace = obj["device_traces"][0]
    graph = [e for e in trace if e["action"] == "alloc" and e["pool_id"] == (0, 1)]
    assert pool["pool"] == [0, 1] and pool["allocations"] == len(graph) == 4
    assert pool["active_peak_bytes"] == sum(e["size"] for e in graph)      # none freed before the last
    assert pool["reserved_end_bytes"] == sum(s["total_size"] for s in segs) == pool["reserved_peak_bytes"]
    assert pool["envelope_bytes"] == max(pool["active_peak_bytes"], pool["reserved_peak_bytes"])


def test_a_trimmed_export_keeps_the_new_fields(capsys, tmp_path):
    for name in ("fx_frames.pickle", "component_tracking.pickle", "metadata_annotate.pickle"):
        out = tmp_path / f"t_{name}"
        run(capsys, "export", DATA / name, "--around-peak", "-o", out)
        obj = load_trusted(out)
        entries = obj["device_traces"][0]
        frames = [f for e in entries for f in e.get("frames", [])]
        if name == "fx_frames.pickle":
            assert any(f.get("fx_original_trace", "").count("net.py") for f in frames)
        elif name == "component_tracking.pickle":
            assert {e.get("component_type") for e in entries} >= {"activation", "temp"}
        else:
            assert any(e["action"] == "annotate" and e["user_metadata"] == "kept for the eval logger"
                       for e in entries) or any(e.get("user_metadata", "").startswith('{"step"') for e in entries)


@pytest.mark.parametrize("timeline_beside", [True, False])
def test_skipped_actions_found_beside_the_pairing_are_those_found_alone(monkeypatch, timeline_beside):
    """On a big run what the recording left out is found on a thread (the timeline's, after it,
    else the live bytes'), beside the main thread's stages: the same answer as found alone."""
    import threading

    from vramscope.classifiers import analysis as analysis_module
    from vramscope.classifiers import recording
    from vramscope.classifiers import structure as structure_module
    monkeypatch.setattr(analysis_module, "_TIMELINE_BESIDE_ENTRIES", 0 if timeline_beside else 1 << 40)
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    where: list[str] = []

    def found(snap, dev):
        where.append(threading.current_thread().name)
        return recording.skipped_actions(snap, dev)
    monkeypatch.setattr(analysis_module, "skipped_actions", found)
    snap = open_snapshot(str(DATA / "skip_actions.pickle"))
    an = analyze(snap, use_cache=False)
    assert an.devices[0].skipped_actions == recording.skipped_actions(snap, 0) == \
        ("free_requested", "segment_alloc", "segment_free")
    assert where == ["vramscope-timeline" if timeline_beside else "vramscope-live"]
