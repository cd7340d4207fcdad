"""Classifier behaviour: rules as data, user overrides, fixtures' verdicts, ground-truth runs
(leaks, peak types, iterations) and the real snapshots in ../shared/snapshots (skipped
when absent). Accuracy against torch's categories is in test_accuracy.py, the golden
analyses of the tiny fixtures in test_classifiers_golden.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("VRAMSCOPE_CACHE_DIR", "")

from vramscope.classifiers import CATEGORIES, PEAK_TYPES, RulesError, analyze, load_rules  # noqa: E402
from vramscope.present.stacks import Stacks  # noqa: E402
from vramscope.present.words import advice_text  # noqa: E402
from vramscope.services.summary import summary_document  # noqa: E402
from vramscope.classifiers import rules as rules_mod  # noqa: E402
from vramscope.parsers import open_snapshot  # noqa: E402

from helpers import require  # noqa: E402

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
GT = TESTS / "groundtruth"
REAL = Path(__file__).resolve().parents[1].parent / "shared" / "snapshots"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/snapshots is absent")

_cache: dict = {}


def analysis(path):
    path = str(path)
    if path not in _cache:
        _cache[path] = analyze(open_snapshot(path, use_cache=False), rules=load_rules(use_user_rules=False))
    return _cache[path]


def data(name):
    return analysis(require(DATA / name))


def real(name):
    return analysis(require(REAL / name))


# -- rules as data ------------------------------------------------------------------------
def test_shipped_rules_load():
    rs = load_rules(use_user_rules=False)
    ids = [r.id for r in rs.rules]
    assert len(ids) == len(set(ids)) and len(ids) > 15
    assert {r.category for r in rs.rules} >= set(CATEGORIES) - {"unknown"}
    assert not (rules_mod.HERE / "rules.json").exists(), "rules.toml is the one copy of the shipped rules"


def test_every_allocation_records_the_rule_that_tagged_it():
    an = data("qlora_4bit.pickle")
    rs = an.rules
    for da in an.devices.values():
        assert da.rule.dtype == np.int16 and len(da.rule) == len(da.allocs) == len(da.category)
        assert da.rule.min() >= 0 and da.rule.max() < len(an.rule_names)
        expect = np.array([CATEGORIES.index("unknown")] + [CATEGORIES.index(r.category) for r in rs.rules])
        assert np.array_equal(expect[da.rule], da.category)
    assert an.rule_names[0] == "none" and an.rule_why[1]


def _write(tmp_path, text, name="rules.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_user_rules_extend_and_override(tmp_path):
    # a new marker and a rule placed before the shipped ones: the forward Linear outputs of the
    # protocol2 fixture become "inputs" with the user's rule id
    p = _write(tmp_path, """
[markers]
my_serving = [ { file = 'serve\\.py$', name = '^infer$' } ]

[[rule]]
id = "my.serving_outputs"
category = "inputs"
markers = ["my_serving"]
phase = ["forward"]
why = "request tensors of my server"
""")
    snap = open_snapshot(str(DATA / "protocol2.pickle"), use_cache=False)
    base = analyze(snap, rules=load_rules(use_user_rules=False))
    mine = analyze(snap, rules_path=p)
    assert "my.serving_outputs" in mine.rule_names and mine.rule_names[1] == "my.serving_outputs"
    da0, da1 = base.devices[0], mine.devices[0]
    hit = da1.rule == mine.rule_names.index("my.serving_outputs")
    assert hit.any()
    assert (da1.category[hit] == CATEGORIES.index("inputs")).all()
    assert (da0.category[hit] != CATEGORIES.index("inputs")).all()
    # replacing a shipped rule by id, and disabling another
    p2 = _write(tmp_path, """
disable = ["temporary.forward_scratch"]
[[rule]]
id = "activations.forward"
category = "temporary"
phase = ["forward"]
""", "r2.toml")
    rs = load_rules(rules_path=p2)
    ids = [r.id for r in rs.rules]
    assert "temporary.forward_scratch" not in ids and ids.count("activations.forward") == 1
    assert rs.rules[0].category == "temporary" and rs.rules[0].source == str(p2)
    an = analyze(snap, rules=rs)
    assert not (an.devices[0].category == CATEGORIES.index("activations")).any()


def test_user_rules_from_env_and_config_dir(tmp_path, monkeypatch):
    p = _write(tmp_path, '{"rule": [{"id": "env.rule", "category": "weights", "phase": ["forward"]}]}',
               "rules.json")
    monkeypatch.setenv("VRAMSCOPE_RULES", str(p))
    assert load_rules().rules[0].id == "env.rule"
    monkeypatch.delenv("VRAMSCOPE_RULES")
    cfg = tmp_path / "cfg" / "vramscope"
    cfg.mkdir(parents=True)
    (cfg / "rules.toml").write_text('[[rule]]\nid = "cfg.rule"\ncategory = "inputs"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert load_rules().rules[0].id == "cfg.rule"
    assert load_rules(use_user_rules=False).rules[0].id != "cfg.rule"


@pytest.mark.parametrize("text, message", [
    ('[[rule]]\nid = "x"\ncategory = "nonsense"\n', "category"),
    ('[[rule]]\nid = "x"\ncategory = "weights"\nmarkers = ["no_such_marker"]\n', "unknown marker"),
    ('[[rule]]\nid = "x"\ncategory = "weights"\ncolour = "red"\n', "unknown rule key"),
    ('[markers]\nm = [ { file = "(unclosed" } ]\n', "bad regex"),
    ('[[rule]]\nid = "x"\ncategory = "weights"\nfreed = ["sometimes"]\n', "unknown value"),
    ('this is not toml = = =\n', "not valid TOML"),
])
def test_bad_user_rules_are_one_clear_error(tmp_path, text, message):
    with pytest.raises(RulesError, match=message):
        load_rules(rules_path=_write(tmp_path, text))


def test_the_analysis_runs_without_qt():
    """Every module of the parsers, the classifiers, the presentation layer and the services
    imported, and a whole analysis run (the allocator's state and a what-if included), in a
    process where importing Qt fails: none of it needs Qt (`vramscope.classifiers` alone
    would prove nothing: its names load on first use)."""
    code = ("import importlib, pkgutil, sys\n"
            "class NoQt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('PySide6', 'PyQt5', 'PyQt6', 'pyqtgraph', 'shiboken6'):\n"
            "            raise ImportError('no Qt here: ' + name)\n"
            "sys.meta_path.insert(0, NoQt())\n"
            "import vramscope\n"
            "names = []\n"
            "for pkg in ('parsers', 'classifiers', 'present', 'services', 'common'):\n"
            "    m = importlib.import_module('vramscope.' + pkg)\n"
            "    names += [i.name for i in pkgutil.walk_packages(m.__path__, m.__name__ + '.')]\n"
            "for n in names:\n"
            "    importlib.import_module(n)\n"
            "from vramscope.classifiers import analyze\n"
            "from vramscope.classifiers.whatif import what_if\n"
            "from vramscope.parsers import open_snapshot\n"
            "an = analyze(open_snapshot(sys.argv[1], use_cache=False), use_cache=False)\n"
            "st = an.allocator(0).state_at(an.devices[0].peak.index)\n"
            "r = what_if(an, 0, levers=['half_batch'])\n"
            "print(len(names), len(st.segments), r.scaled.bytes < r.baseline.bytes)\n")
    r = subprocess.run([sys.executable, "-c", code, str(DATA / "oom.pickle")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    modules, segments, smaller = r.stdout.split()
    assert int(modules) > 40 and int(segments) > 0 and smaller == "True"


# -- query helpers --------------------------------------------------------------------------
def test_live_by_category_agrees_with_by_category_at_and_live_bytes():
    an = data("annotated_210.pickle")
    da = an.devices[0]
    idx = np.array([-1, 0, 10, 37, da.peak.index, len(da.live.live_after) - 1])
    table = da.live_by_category(idx)
    for row, i in zip(table, idx.tolist()):
        assert {c: int(v) for c, v in zip(CATEGORIES, row) if v} == da.by_category_at(i)
        assert int(row.sum()) == (da.live.start_bytes if i < 0 else int(da.live.live_after[i]))
    runs = da.phase_ranges()
    assert runs[0][0] == 0 and runs[-1][1] == len(da.live.live_after) - 1
    assert {r[2] for r in runs} >= {"forward", "backward", "optimizer"}
    from vramscope.classifiers.timeline import PHASE_NAMES
    for name in PHASE_NAMES:        # one phase's runs, found on their own, are those of all runs
        assert [tuple(r) for r in da.phase_runs(name).tolist()] == [(s, e) for s, e, n in runs if n == name]
    assert len(da.phase_runs("forward")) and da.phase_runs("no such phase").tolist() == []


@pytest.mark.parametrize("name", ["annotated_210.pickle", "oom.pickle", "cuda_full.pickle", "multi_device.pickle"])
def test_one_moment_by_its_live_rows_is_the_composition_at_it(name):
    """by_category_at before the composition is built (a summary's end state: the rows live
    then) says what the composition says once built, at every moment asked."""
    an = analyze(open_snapshot(str(require(DATA / name)), use_cache=False), use_cache=False)   # (fresh: its own)
    for da in an.devices.values():
        n = len(da.live.live_after)
        idx = sorted({-1, 0, n // 3, n // 2, max(da.peak.index, 0), n - 1})
        assert da._composition is None
        by_rows = [da.by_category_at(i) for i in idx]
        assert da._composition is None                 # nothing built for one moment
        comp = da.composition()
        assert by_rows == [comp.by_category(i) for i in idx]
        assert any(by_rows)


def test_the_composition_built_a_few_rows_at_a_time_is_the_one_built_at_once(monkeypatch):
    """Composition reads the rows a part at a time (its temporaries bounded on a big run): the
    codes, start and checkpoints, and so every moment, are those read in one part."""
    from vramscope.classifiers.liveset import Composition
    an = analyze(open_snapshot(str(require(DATA / "cuda_full.pickle")), use_cache=False), use_cache=False)
    da = an.devices[an.primary_device()]
    whole = Composition(da.category, da.allocs, da.n_entries)
    monkeypatch.setattr(Composition, "ROWS_AT_ONCE", 7)
    assert len(da.allocs) > 7 * 10
    parts = Composition(da.category, da.allocs, da.n_entries)
    assert np.array_equal(parts.codes, whole.codes) and np.array_equal(parts.start, whole.start)
    assert np.array_equal(parts.checkpoints, whole.checkpoints)
    idx = np.arange(-1, da.n_entries)
    assert np.array_equal(parts.at(idx), whole.at(idx))
    assert (whole.codes != whole.no_event).sum() == (np.asarray(da.allocs.alloc_index) >= 0).sum() + \
        (np.asarray(da.allocs.free_index) >= 0).sum()


def test_summary_json_keeps_the_cli_contract():
    an = data("oom.pickle")
    s = summary_document(an)
    d = s["devices"][0]
    for key in ("device", "entries", "allocations", "peak", "start_live_bytes", "end_live_bytes",
                "reserved_peak_bytes", "iterations", "leaks", "ooms"):
        assert key in d
    for key in ("bytes", "index", "time_us", "type", "by_category"):
        assert key in d["peak"]
    assert d["peak"]["type"] in PEAK_TYPES
    import orjson

    from vramscope.common.jsonio import dumps
    from vramscope.services.summary import plain_document
    # plain JSON types only, the iterations' rows once made plain (they are made when read)
    plain = orjson.dumps(plain_document(s), option=orjson.OPT_NON_STR_KEYS)
    assert plain == dumps(s) and orjson.loads(plain)["devices"][0]["iterations"] == list(d["iterations"])
    assert len(d["iterations"]) and all(type(it) is dict for it in d["iterations"])


def test_cli_allocations_csv(capsys):
    from vramscope.cli import main
    assert main(["allocations", str(DATA / "leak.pickle"), "--csv", "--no-cache"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "device,index,addr,size,alloc_us,free_us,category,rule,evidence"
    rows = [ln.split(",") for ln in lines[1:]]
    an = data("leak.pickle")
    assert len(rows) == len(an.devices[0].allocs)
    assert {r[6] for r in rows} <= set(CATEGORIES)
    assert {r[7] for r in rows} <= set(an.rule_names)
    assert sum(r[6] == "unknown" for r in rows) == 0


# -- fixtures: what they were built to show ---------------------------------------------------
def test_leak_fixture_flags_train_step_and_clean_loop_does_not():
    exp = json.loads((DATA / "expected.json").read_text())["fixtures"]
    lk = data("leak.pickle").devices[0]
    want = exp["leak.pickle"]["expect"]["leaks"][0]
    assert len(lk.leaks) == 1, lk.leaks
    leak = lk.leaks[0]
    an = data("leak.pickle")
    assert f"{want['filename']}:{want['line']}:{want['name']}" == Stacks(an).where(leak.stack)
    assert leak.bytes_per_iteration == want["bytes_per_iteration"]
    assert leak.count == want["blocks"] and leak.total_bytes == want["bytes"]
    clean = data("clean_loop.pickle").devices[0]
    assert clean.leaks == ()
    for name in ("leak.pickle", "clean_loop.pickle"):
        da = data(name).devices[0]
        e = exp[name]["expect"]
        assert [it.end_index for it in da.iterations] == e["iteration_end_index"]
        assert [int(da.live.live_after[it.end_index]) for it in da.iterations] == e["live_bytes_at_iteration_end"]


@pytest.mark.parametrize("name, hint", [("oom.pickle", "expandable_segments"), ("expandable.pickle", "simulated on this run")])
def test_oom_reports(name, hint):
    exp = json.loads((DATA / "expected.json").read_text())["fixtures"][name]
    da = data(name).devices[0]
    ref = exp["devices"][0]["ooms"] if isinstance(exp["devices"], list) else exp["devices"]["0"]["ooms"]
    assert len(da.ooms) == len(ref) == 1
    o, r = da.ooms[0], ref[0]
    assert (o.index, o.requested, o.device_free) == (r["index"], r["requested"], r["device_free"])
    assert o.fragmentation_bytes == r["fragmentation_bytes"]
    assert hint in advice_text(o.advice[0], o)
    assert sum(o.by_category.values()) == o.allocated
    assert "unknown" not in o.by_category
    assert da.peak.type == "oom"


def test_backward_thread_empty_frames_are_backward():
    """stacks='python': the autograd thread's allocations have no frames at all."""
    da = data("backward_thread.pickle").devices[0]
    a = da.allocs
    empty = (a.stack == 0) & (a.alloc_index >= 0)
    assert empty.sum() > 20
    cats = {CATEGORIES[c] for c in np.unique(da.category[empty])}
    assert cats <= {"gradients", "autograd"} and cats == {"gradients", "autograd"}
    assert len(da.iterations) == 2
    assert all(set(it.phases) >= {"forward", "backward", "optimizer"} for it in da.iterations)


def test_qlora_fixture_quantization_lora_and_paged_optimizer():
    an = data("qlora_4bit.pickle")
    da = an.devices[0]
    snap = an.snapshot

    def cats_where(pred):
        rows = [r for r in range(len(da.allocs)) if pred(snap.stack_frames_list(int(da.allocs.stack[r])))]
        return {CATEGORIES[da.category[r]] for r in rows}, rows

    q, rows = cats_where(lambda fr: any("bitsandbytes/functional.py" in f[0] and "quant" in f[2] for f in fr))
    assert rows and q == {"quantization"}
    o, rows = cats_where(lambda fr: any("bitsandbytes/optim" in f[0] for f in fr)
                         and not any("optimizer_update" in f[2] for f in fr))
    assert rows and o == {"optimizer"}
    assert da.peak.by_category.get("quantization", 0) > 100e6
    assert "unknown" not in da.peak.by_category


# -- ground truth runs (profiler-converted, torch 2.13) ----------------------------------------
GT_RUNS = sorted(p.name[:-len(".truth.json")] for p in GT.glob("*.truth.json"))


def _truth(run):
    return json.loads((GT / f"{run}.truth.json").read_text())


@pytest.mark.parametrize("run", GT_RUNS)
def test_groundtruth_iterations_peak_type_and_leaks(run):
    t = _truth(run)
    da = analysis(GT / f"{run}.pickle").devices[t["device"]]
    assert len(da.iterations) == t["iterations"]
    for ours, theirs in zip(da.iterations, t["iteration_table"]):
        tph = {p["phase"] for p in theirs["phases"]}
        assert set(ours.phases) - {"eval"} == tph
        assert abs(ours.start_index - theirs["start_index"]) <= 40
        if "micro_batches" in t:
            assert ours.micro_batches == t["micro_batches"]
    # the global peak's type matches the phase it happened in
    p = da.peak.index
    assert p == t["peak_index"]
    phase = next(ph["phase"] for it in t["iteration_table"] for ph in it["phases"]
                 if ph["start_index"] <= p <= ph["end_index"])
    allowed = {"forward": {"forward", "loss"}, "optimizer": {"optimizer_step"}, "inputs": {"other"},
               "backward": {"backward_start", "backward_top", "backward_bottom", "backward_end"}}[phase]
    assert da.peak.type in allowed, (phase, da.peak.type)
    # per iteration too
    for it, theirs in zip(da.iterations, t["iteration_table"]):
        k = it.peak_index
        ph = next((x["phase"] for x in theirs["phases"] if x["start_index"] <= k <= x["end_index"]), None)
        if ph is not None:
            assert it.peak_type in {"forward": {"forward", "loss"}, "optimizer": {"optimizer_step"},
                                       "inputs": {"other"}, "backward": {"backward_start", "backward_top",
                                       "backward_bottom", "backward_end"}}[ph]
    if t.get("expected_leak"):
        assert da.leaks, "the leak run must be flagged"
        big = da.leaks[0]
        frames = Stacks(analysis(GT / f"{run}.pickle")).frames_text(big.stack)
        assert any(t["leak"]["function"] in f for f in frames), frames
        assert big.iterations == tuple(range(1, t["iterations"] + 1))
        per_it = np.diff([int(da.live.live_after[it.end_index]) for it in da.iterations])
        assert sum(lk.bytes_per_iteration for lk in da.leaks) == int(np.median(per_it))
    else:
        assert da.leaks == (), da.leaks


@pytest.mark.parametrize("run", GT_RUNS)
def test_groundtruth_phases_entry_by_entry(run):
    """Our phase of every trace entry against the record_function markers of the recording
    (which never reach the snapshot): iteration starts exact, phases nearly everywhere."""
    from vramscope.classifiers.timeline import PHASE_CODE
    t = _truth(run)
    da = analysis(GT / f"{run}.pickle").devices[t["device"]]
    truth = np.full(len(da.timeline.phase), -1)
    for it in t["iteration_table"]:
        for ph in it["phases"]:
            truth[ph["start_index"]:ph["end_index"] + 1] = PHASE_CODE[ph["phase"]]
    marked = truth >= 0
    agree = float(np.mean(da.timeline.phase[marked] == truth[marked]))
    assert agree >= 0.99, f"{run}: phase agreement {agree:.3f}"
    assert [it.start_index for it in da.iterations] == [it["start_index"] for it in t["iteration_table"]]


def test_example_has_four_iterations_with_all_phases():
    """assets/example.pickle: 4 steps of fused AdamW, profiler-converted. The optimizer's
    in-place updates are written as version bumps that carry the *backward* stacks of the
    gradients they touch; they must not split or merge iterations."""
    an = analysis(TESTS.parent / "assets" / "example.pickle")
    its = an.devices[0].iterations
    assert len(its) == 4
    for it in its:
        assert set(it.phases) == {"inputs", "forward", "backward", "optimizer"}
        order = sorted(it.phases, key=lambda p: it.phases[p][0])
        assert order == ["inputs", "forward", "backward", "optimizer"], it.phases
        assert it.peak_type == "backward_start"


def test_profiler_category_decides_with_evidence_torch_and_our_verdict_kept():
    """A profiler-converted snapshot that keeps torch's `category`: torch's tag decides the
    category (evidence `torch`), our rules' own verdict stays beside it, identical to what
    they say on the same run without the tags."""
    from vramscope.classifiers.evidence import EVIDENCE
    from vramscope.classifiers.torch_tags import PROFILER_TO_CATEGORY
    an = analysis(require(GT / "transformer_adamw.with_category.pickle"))
    plain = analysis(GT / "transformer_adamw.pickle")
    da, db = an.devices[0], plain.devices[0]
    assert da.torch_category is not None and (da.torch_category > 0).any()
    assert db.torch_category is None and db.rules_category is None
    assert np.array_equal(da.rules_category, db.category), "our rules must not read torch's category"
    names = an.snapshot.category_names
    tagged = np.array([names[c] in PROFILER_TO_CATEGORY for c in da.torch_category])
    want = np.array([CATEGORIES.index(PROFILER_TO_CATEGORY[names[c]]) for c in da.torch_category[tagged]])
    assert np.array_equal(da.category[tagged], want)
    assert set(np.asarray(EVIDENCE)[da.evidence[tagged]]) == {"torch"}
    assert "torch" not in set(np.asarray(EVIDENCE)[db.evidence])
    # where the two disagree, the allocation says both
    differ = np.flatnonzero(tagged & (da.category != da.rules_category))
    assert len(differ), "the run has rows where torch and our rules disagree"
    row = da.allocation(int(differ[0]))
    assert row.rule == "torch.profiler_category" and row.rules_category == CATEGORIES[int(da.rules_category[differ[0]])]
    assert da.allocation(int(np.flatnonzero(tagged & (da.category == da.rules_category))[0])).rules_category is None


# -- real snapshots ------------------------------------------------------------------------------
REAL_FILES = sorted(p.name for p in REAL.glob("*.p*")) if REAL.is_dir() else []


@needs_real
@pytest.mark.parametrize("name", [n for n in REAL_FILES if not n.startswith("NOT_A_SNAPSHOT")])
def test_real_snapshot_unknown_below_5_percent_at_peak(name):
    an = real(name)
    for dev, da in an.devices.items():
        byc = da.peak.by_category
        total = sum(byc.values())
        if total == 0:
            continue
        # a state-only dump's blocks without frames are unknown (no frames): nothing tells what they are,
        # unless a size pattern does (weight + gradient + two moments, a cuBLAS workspace)
        a = da.allocs
        frameless = (a.alloc_index < 0) & (a.stack <= 0) & (da.run.recorded.value == "state_only")
        guessable = int(a.size[frameless & (da.category != CATEGORIES.index("unknown"))].sum())
        told = byc.get("unknown", 0) - int(a.size[frameless].sum()) + guessable
        assert told / total < 0.05, (dev, byc)
        assert da.peak.type in PEAK_TYPES


@needs_real
def test_real_fp32_adamw_full_step_optimizer_vs_weights():
    da = real("kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle").devices[0]
    byc = da.peak.by_category
    ratio = byc["optimizer"] / byc["weights"]
    print(f"\nkkaitlyn fullstep at peak: optimizer/weights = {ratio:.3f}, "
          f"gradients/weights = {byc['gradients'] / byc['weights']:.3f}")
    assert 1.6 <= ratio <= 2.4
    assert abs(byc["gradients"] / byc["weights"] - 1) < 0.05
    assert da.peak.type == "optimizer_step"
    fwd = real("kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_forward_mixed.pickle").devices[0]
    assert fwd.peak.type in ("forward", "loss")
    assert "optimizer" not in fwd.peak.by_category and "gradients" not in fwd.peak.by_category


@needs_real
def test_real_bitsandbytes_lora_quantization_and_adapters():
    """cranberrii: TinyLlama with bitsandbytes 4-bit weights (loaded before recording: no
    frames) + LoRA r=16 on q/v (fp32 adapters, also pre-trace). The packed weights
    (numel/2 B) and their absmax (numel/64*4 B) are quantization; adapters stay weights."""
    an = real("cranberrii+ftcourse__memory_snapshot.pickle")
    da = an.devices[0]
    a = da.allocs
    pre = a.alloc_index < 0
    hidden, inter, kv = 2048, 5632, 256
    packed = {inter * hidden // 2, hidden * hidden // 2, kv * hidden // 2}
    absmax = {inter * hidden // 64 * 4, hidden * hidden // 64 * 4, kv * hidden // 64 * 4}
    lora = {16 * hidden * 4, kv * 16 * 4}          # A (16 x 2048) and B of v_proj (256 x 16), fp32
    q = CATEGORIES.index("quantization")
    for sizes, want in ((packed, q), (absmax, q), (lora, CATEGORIES.index("weights"))):
        sel = pre & np.isin(a.size, list(sizes))
        assert sel.sum() >= 22, sizes
        assert (da.category[sel] == want).all(), (sizes, np.unique(da.category[sel]))
    # dequantization scratch in forward and backward is quantization too
    deq = np.array([any("dequantize_4bit" in f[2] for f in an.snapshot.stack_frames_list(int(s)))
                    for s in a.stack]) & (a.alloc_index >= 0)
    assert deq.any() and (da.category[deq] == q).all()
    byc = da.peak.by_category
    assert byc["quantization"] > 500e6 and byc["weights"] > 500e6


@needs_real
def test_real_state_only_snapshots_are_classified_from_block_frames():
    for name in ("Yiyi-philosophy+LLM-inference__1.3b_snapshot.pickle", "volcengine+verl__mem.pickle",
                 "Muduard+LayoutEditing__memory_snapshot.pkl"):
        an = real(name)
        for da in an.devices.values():
            assert len(da.live.live_after) <= 1 and da.iterations == ()
            framed = da.allocs.stack > 0
            assert (da.category[framed] != CATEGORIES.index("unknown")).mean() > 0.9
            # the blocks without frames: unknown (no frames), never a category guessed from nothing
            told = (da.category[~framed] != CATEGORIES.index("unknown")) & (da.evidence[~framed] < 3)
            assert not told.any()          # a size pattern's reading of them is a guess (evidence 3)
    verl = real("volcengine+verl__mem.pickle").devices[0]
    assert verl.peak.by_category["activations"] > 0.8 * verl.peak.bytes     # vLLM KV cache


@needs_real
def test_real_empty_snapshot_has_no_devices():
    an = real("SunnySood80+unsupervised_finetune_resnet50__dump_snapshot.pickle")
    assert an.devices == {} and summary_document(an)["devices"] == []


def _strip_frames(snap):
    """The snapshot as if recorded without stacks or annotations."""
    for t in snap.traces.values():
        t.columns["stack"] = np.full(len(t), -1, dtype=np.int32)
    snap.blocks["stack"] = np.full(len(snap.blocks["stack"]), -1, dtype=np.int32)
    snap.annotations = []
    return snap


@pytest.mark.parametrize("path, leaks", [(GT / "leak.pickle", 1), (GT / "retain_graph.pickle", 0),
                                         (DATA / "leak.pickle", 1), (DATA / "clean_loop.pickle", 0)])
def test_frameless_traces_fall_back_to_periodicity(path, leaks):
    an = analyze(_strip_frames(open_snapshot(str(require(path)), use_cache=False)),
                 rules=load_rules(use_user_rules=False))
    da = an.devices[0]
    assert len(da.leaks) == leaks
    if leaks:
        assert len(da.iterations) >= 4 and all(it.source == "periodicity" for it in da.iterations)
        assert Stacks(an).where(da.leaks[0].stack) == "(no frames)"


def test_fixture_iteration_counts_from_expected_json():
    exp = json.loads((DATA / "expected.json").read_text())["fixtures"]
    checked = 0
    for name, fx in exp.items():
        n = (fx.get("expect") or {}).get("iterations")
        if n is None:
            continue
        assert len(data(name).devices[0].iterations) == n, name
        checked += 1
    assert checked >= 2


# Fixtures made to expose a classifier weakness a later change is to fix: expected to stay
# below the bar until then (strict: a pass means the marker must go).
INTENT_KNOWN_BELOW: dict[str, str] = {
    "fx_frames.pickle": "an inference-only loop of three forwards through an FX GraphModule: one iteration is "
                        "found, so the later inputs read as activations and the outputs the caller frees as "
                        "temporaries (the classifier's reading of inference; the FX frames are read right)",
}
_FIXTURE_NAMES = sorted(json.loads((DATA / "expected.json").read_text())["fixtures"])


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=INTENT_KNOWN_BELOW[n], strict=True))
    if n in INTENT_KNOWN_BELOW else n for n in _FIXTURE_NAMES])
def test_fixture_generator_intent_accuracy(name):
    """Second ground truth: the category the fixture generator meant for every allocation
    (tests/data/make_fixtures.py keeps it per trace entry). Byte-weighted, traced allocs."""
    sys.path.insert(0, str(DATA))
    try:
        import make_fixtures as mf
        fixtures = dict(mf.FIXTURES)
    except (ImportError, AttributeError) as e:           # the generator changed shape
        pytest.skip(f"make_fixtures not usable here: {e}")
    finally:
        sys.path.remove(str(DATA))
    if name not in fixtures:
        pytest.skip(f"{name} is not generated by make_fixtures")
    lines = [""]
    sim = fixtures[name]()[0]
    an = data(name)
    for dev, d in getattr(sim, "devs", {}).items():
        if dev not in an.devices or not getattr(d, "cats", None):
            continue
        da = an.devices[dev]
        a = da.allocs
        rows = np.flatnonzero(a.alloc_index >= 0)
        want = [d.cats[i] for i in a.alloc_index[rows].tolist()]
        got = np.asarray(CATEGORIES, dtype=object)[da.category[rows]]
        sz = a.size[rows]
        keep = np.array([w not in (None, "unknown") for w in want], dtype=bool)
        if not keep.any():
            continue
        ok = np.array([w == g for w, g in zip(want, got)], dtype=bool) & keep
        acc = float(sz[ok].sum()) / float(sz[keep].sum())
        lines.append(f"{name:22s} device {dev}: {acc:.3f} of {int(sz[keep].sum()):,} B")
        assert acc >= 0.85, (name, dev, acc)
    print("\n".join(lines))


def test_peak_type_outside_the_trace_is_other():
    an = analysis(DATA / "clean_loop.pickle")
    da = an.devices[0]
    n = len(da.trace_action)
    assert da.peak_type(-1) == "other"
    assert da.peak_type(n) == "other"
    assert da.peak_type(da.peak.index) == da.peak.type != "other"
