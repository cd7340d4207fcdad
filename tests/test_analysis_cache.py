"""The analysis cached beside the snapshot's columns (classifiers/cache.py): a reopen reads
it instead of analysing again, gives exactly what a fresh analysis gives, and anything
stale or damaged is recomputed, never trusted and never fatal."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

import vramscope
from vramscope.classifiers import CATEGORIES, analyze, load_rules
from vramscope.classifiers import cache as acache
from vramscope.parsers import open_snapshot
from vramscope.parsers.cache import artifact_names

REPO = Path(__file__).resolve().parents[1]
FILES = {
    "example": REPO / "assets" / "example.pickle",
    "oom": REPO / "tests" / "data" / "oom.pickle",
    "multi_device": REPO / "tests" / "data" / "multi_device.pickle",
    "groundtruth_leak": REPO / "tests" / "groundtruth" / "leak.pickle",
    "groundtruth_profiler": REPO / "tests" / "groundtruth" / "transformer_adamw.with_category.pickle",
}
ARRAYS = ("category", "rule", "chain_root", "chain_last", "row_phase", "torch_category", "trace_action",
          "trace_stack", "oom_indices")
ALLOC_COLS = ("alloc_index", "free_index", "addr", "size", "stack", "alloc_us", "free_us")
LIVE_SCALARS = ("device", "n_events", "start_bytes", "end_bytes", "peak_bytes", "peak_index", "reserved_start",
                "reserved_end", "reserved_peak")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(d))
    # no user rules from this machine's environment or config
    monkeypatch.delenv("VRAMSCOPE_RULES", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return d


def _same_array(a, b, what):
    if a is None or b is None:
        assert a is None and b is None, what
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, f"{what}: {a.dtype} != {b.dtype}"
    assert np.array_equal(a, b), what


def assert_same_analysis(got, want):
    """Every result of `analyze`, array by array and finding by finding."""
    assert got.rule_names == want.rule_names
    assert got.rule_why == want.rule_why
    assert list(got.devices) == list(want.devices)
    for dev, w in want.devices.items():
        g = got.devices[dev]
        assert g.device == w.device
        for k in ARRAYS:
            _same_array(getattr(g, k), getattr(w, k), f"device {dev} {k}")
        for k in ALLOC_COLS:
            _same_array(getattr(g.allocs, k), getattr(w.allocs, k), f"device {dev} allocs.{k}")
        for k in LIVE_SCALARS:
            assert getattr(g.live, k) == getattr(w.live, k), f"device {dev} live.{k}"
        for k in ("live_after", "reserved_change_index", "reserved_change_value", "reserved_after"):
            _same_array(getattr(g.live, k), getattr(w.live, k), f"device {dev} live.{k}")
        for k in ("phase", "seg_start"):
            _same_array(getattr(g.timeline, k), getattr(w.timeline, k), f"device {dev} timeline.{k}")
        for k in ("segment_ids", "iteration_ids"):
            _same_array(getattr(g.timeline, k)(), getattr(w.timeline, k)(), f"device {dev} timeline.{k}")
        assert g.timeline.first_start == w.timeline.first_start
        assert g.timeline.frees_carry_alloc_frames == w.timeline.frees_carry_alloc_frames
        assert g.timeline.iterations == w.timeline.iterations
        assert g.iterations == w.iterations
        assert g.peak == w.peak
        assert g.leaks == w.leaks
        assert g.ooms == w.ooms


def fresh(path, **kw):
    return analyze(open_snapshot(str(path), use_cache=False), **kw)


@pytest.mark.parametrize("name", sorted(FILES))
def test_cached_reopen_equals_a_fresh_analysis(cache_dir, name):
    path = FILES[name]
    want = fresh(path)
    assert not want.from_cache
    first = analyze(open_snapshot(str(path)))            # parses, analyses, stores
    assert not first.from_cache
    assert_same_analysis(first, want)
    snap = open_snapshot(str(path))
    assert snap.from_cache
    again = analyze(snap)
    assert again.from_cache
    assert_same_analysis(again, want)
    # the big arrays are memory maps of the cache entry, not copies
    da = next(iter(again.devices.values()))
    if len(da.allocs):
        assert isinstance(da.allocs.size, np.memmap) and isinstance(da.category, np.memmap)
    # the queries the viewer and reports make still answer the same
    for dev, dw in want.devices.items():
        dg = again.devices[dev]
        n = len(dw.trace_action)
        for i in sorted({-1, 0, dw.peak.index, n - 1} & set(range(-1, n))):
            assert dg.by_category_at(i) == dw.by_category_at(i)
            assert dg.peak_type(i) == dw.peak_type(i)
            assert dg.largest_live(i, 5) == dw.largest_live(i, 5)


def test_the_viewer_model_from_a_cached_analysis_is_the_same(cache_dir):
    import vramscope.viewer  # noqa: F401  (before PySide6)
    from vramscope.viewer.model.load import load
    path = str(FILES["example"])
    cold = load(path)
    warm = load(path)
    assert warm.analysis.from_cache and not cold.analysis.from_cache
    a, b = cold.data, warm.data
    assert [(f.kind, f.title, f.detail, f.index, f.zoom, f.row) for f in a.findings] == \
           [(f.kind, f.title, f.detail, f.index, f.zoom, f.row) for f in b.findings]
    assert np.array_equal(a.da.composition().checkpoints, b.da.composition().checkpoints)
    assert np.array_equal(a.da.composition().codes, b.da.composition().codes)
    assert np.array_equal(a.rows_by_size, b.rows_by_size)
    x0, x1 = a.x_range
    ea, eb = a.envelope(x0, x1, 300), b.envelope(x0, x1, 300)
    assert np.array_equal(ea.col_comp, eb.col_comp) and np.array_equal(ea.live_y, eb.live_y)


# -- what the key depends on ------------------------------------------------------------------
def _rules_file(tmp_path, category: str) -> Path:
    p = tmp_path / "rules.toml"
    p.write_text(f'[[rule]]\nid = "test.everything"\ncategory = "{category}"\nwhy = "a test"\n')
    return p


def _ours(da):
    """The rules' own verdict (the example keeps torch's profiler tags, which decide `category`)."""
    return da.rules_category if da.rules_category is not None else da.category


def test_a_changed_rules_file_invalidates(cache_dir, tmp_path):
    path = str(FILES["example"])
    open_snapshot(path)
    # same rule id, same file length: only the content tells the two apart
    p = _rules_file(tmp_path, "weights")
    a = analyze(open_snapshot(path), rules_path=str(p))
    assert not a.from_cache
    assert (_ours(a.devices[0]) == CATEGORIES.index("weights")).all()
    assert analyze(open_snapshot(path), rules_path=str(p)).from_cache
    p.write_text(p.read_text().replace('"weights"', '"unknown"'))
    b = analyze(open_snapshot(path), rules_path=str(p))
    assert not b.from_cache
    assert (_ours(b.devices[0]) == CATEGORIES.index("unknown")).all()
    assert_same_analysis(b, fresh(path, rules_path=str(p)))
    c = analyze(open_snapshot(path), rules_path=str(p))
    assert c.from_cache
    assert_same_analysis(c, b)
    # the shipped rules alone: their own key, not the user's results
    d = analyze(open_snapshot(path))
    assert not d.from_cache
    assert_same_analysis(d, fresh(path))


def test_user_rules_from_the_environment_are_part_of_the_key(cache_dir, tmp_path, monkeypatch):
    path = str(FILES["oom"])
    base = analyze(open_snapshot(path))
    monkeypatch.setenv("VRAMSCOPE_RULES", str(_rules_file(tmp_path, "inputs")))
    mine = analyze(open_snapshot(path))
    assert not mine.from_cache
    assert (mine.devices[0].category == CATEGORIES.index("inputs")).all()
    monkeypatch.delenv("VRAMSCOPE_RULES")
    again = analyze(open_snapshot(path))
    assert again.from_cache                    # the previous key's analysis is kept too
    assert_same_analysis(again, base)


def test_an_explicit_ruleset_is_keyed_by_its_content(cache_dir):
    path = str(FILES["example"])
    rs = load_rules(use_user_rules=False)
    a = analyze(open_snapshot(path), rules=rs)
    assert not a.from_cache
    assert analyze(open_snapshot(path), rules=load_rules(use_user_rules=False)).from_cache
    # drop the rule that took the most rows: a different RuleSet, a different key
    da = a.devices[0]
    top = a.rule_names[int(np.bincount(da.rule).argmax())]
    rs2 = load_rules(use_user_rules=False)
    rs2.rules = [r for r in rs2.rules if r.id != top]
    b = analyze(open_snapshot(path), rules=rs2)
    assert not b.from_cache
    assert_same_analysis(b, fresh(path, rules=rs2))
    # same ids, one category changed in place
    rs3 = load_rules(use_user_rules=False)
    import dataclasses
    rs3.rules = [dataclasses.replace(r, category="unknown") if r.id == top else r for r in rs3.rules]
    c = analyze(open_snapshot(path), rules=rs3)
    assert not c.from_cache
    assert_same_analysis(c, fresh(path, rules=rs3))


def test_a_new_version_or_changed_classifier_code_invalidates(cache_dir, monkeypatch, tmp_path):
    path = str(FILES["example"])
    analyze(open_snapshot(path))
    assert analyze(open_snapshot(path)).from_cache
    monkeypatch.setattr(vramscope, "__version__", "999.0")
    assert not analyze(open_snapshot(path)).from_cache
    assert analyze(open_snapshot(path)).from_cache
    fp = acache.analysis_fingerprint()
    code = acache._code_files()
    assert any(f.name == "engine.py" for f in code) and any(f.name == "live.py" for f in code)
    assert any(f.name == "rules.toml" for f in code)
    # a classifier source file that reads differently: another key
    extra = tmp_path / "engine.py"
    extra.write_text("# changed\n")
    monkeypatch.setattr(acache, "_code_files", lambda: [extra if f.name == "engine.py" else f for f in code])
    assert acache.analysis_fingerprint() != fp
    assert not analyze(open_snapshot(path)).from_cache


def test_the_summary_command_uses_the_same_key(cache_dir, tmp_path):
    from vramscope import cli
    path = str(FILES["oom"])
    assert cli.main(["summary", path, "--json"]) == 0
    snap = open_snapshot(path)
    from vramscope.services.summary import _document_key
    fp = acache.analysis_fingerprint()
    names = artifact_names(snap)
    assert f"summary-{_document_key(None)}.json" in names and f"an-{fp}.json" in names


def test_old_analyses_are_dropped(cache_dir, tmp_path, monkeypatch):
    path = str(FILES["example"])
    keys = []
    for v in ("1", "2", "3"):
        monkeypatch.setattr(vramscope, "__version__", v)
        analyze(open_snapshot(path))
        keys.append(acache.analysis_fingerprint())
    names = artifact_names(open_snapshot(path))
    held = {acache._key_of(n) for n in names if n.startswith("an-")}
    assert held == set(keys[1:])
    assert not any(n.startswith("an-" + keys[0]) for n in names)


# -- damage ---------------------------------------------------------------------------------
def _entry(path) -> Path:
    return Path(open_snapshot(str(path)).cache_entry)


def _damage_cases():
    def truncate_npy(entry, fp):
        f = entry / f"art-an-{fp}-d0-live_after.npy"
        f.write_bytes(f.read_bytes()[:-16])

    def truncate_small_npy(entry, fp):
        f = entry / f"art-an-{fp}-d0-category.npy"
        f.write_bytes(f.read_bytes()[:100])

    def bad_codes(entry, fp):                # right size, impossible values
        f = entry / f"art-an-{fp}-d0-category.npy"
        b = bytearray(f.read_bytes())
        b[-1] = 250
        f.write_bytes(bytes(b))

    def garbage_header(entry, fp):
        f = entry / f"art-an-{fp}-d0-alloc_index.npy"
        f.write_bytes(b"garbage" + f.read_bytes()[7:])

    def missing_npy(entry, fp):
        (entry / f"art-an-{fp}-d0-free_index.npy").unlink()

    def garbage_json(entry, fp):
        (entry / f"art-an-{fp}.json").write_bytes(b"{not json")

    def wrong_json(entry, fp):                # valid JSON that does not fit the arrays
        f = entry / f"art-an-{fp}.json"
        man = orjson.loads(f.read_bytes())
        man["devices"]["0"]["rows"] += 1
        f.write_bytes(orjson.dumps(man))

    def json_list(entry, fp):
        (entry / f"art-an-{fp}.json").write_bytes(b"[1, 2, 3]")

    def empty_json(entry, fp):
        (entry / f"art-an-{fp}.json").write_bytes(b"")

    def runs_out_of_order(entry, fp):         # the runs' first entries must ascend from 0
        f = entry / f"art-an-{fp}-d0-seg_start.npy"
        a = np.load(f)
        assert len(a) > 2
        a[1], a[2] = a[2], a[1]
        np.save(f, a)

    def iterations_overlap(entry, fp):        # an entry in two iterations
        f = entry / f"art-an-{fp}-d0-it-end.npy"
        a = np.load(f)
        assert len(a) > 1
        a[0] = np.load(entry / f"art-an-{fp}-d0-it-start.npy")[1]
        np.save(f, a)

    def iterations_miscounted(entry, fp):     # the manifest counts one iteration fewer
        f = entry / f"art-an-{fp}.json"
        man = orjson.loads(f.read_bytes())
        man["devices"]["0"]["iterations"]["names"]["n"] -= 1
        f.write_bytes(orjson.dumps(man))

    def iterations_unnamed(entry, fp):        # a source's name that is not a str
        f = entry / f"art-an-{fp}.json"
        man = orjson.loads(f.read_bytes())
        man["devices"]["0"]["iterations"]["names"]["source"] = [1]
        f.write_bytes(orjson.dumps(man))

    return [truncate_npy, truncate_small_npy, bad_codes, garbage_header, missing_npy, garbage_json, wrong_json,
            json_list, empty_json, runs_out_of_order, iterations_overlap, iterations_miscounted, iterations_unnamed]


@pytest.mark.parametrize("damage", _damage_cases(), ids=lambda f: f.__name__)
def test_a_damaged_artifact_is_recomputed(cache_dir, damage):
    path = FILES["oom"]
    want = fresh(path)
    analyze(open_snapshot(str(path)))
    fp = acache.analysis_fingerprint()
    damage(_entry(path), fp)
    got = analyze(open_snapshot(str(path)))
    assert not got.from_cache
    assert_same_analysis(got, want)
    again = analyze(open_snapshot(str(path)))      # and stored again, whole
    assert again.from_cache
    assert_same_analysis(again, want)


def test_a_write_that_fails_halfway_leaves_no_analysis(cache_dir, monkeypatch):
    path = str(FILES["example"])
    open_snapshot(path)
    from vramscope.parsers import cache as pcache
    real = pcache.write_artifact_array
    calls = []

    def flaky(snap, name, arr):
        calls.append(name)
        return real(snap, name, arr) if len(calls) < 5 else False
    monkeypatch.setattr(acache, "write_artifact_array", flaky)
    a = analyze(open_snapshot(path))
    assert not a.from_cache and len(calls) == 5
    assert not any(n.endswith(".json") and n.startswith("an-") for n in artifact_names(open_snapshot(path)))
    monkeypatch.setattr(acache, "write_artifact_array", real)
    assert not analyze(open_snapshot(path)).from_cache
    assert analyze(open_snapshot(path)).from_cache


# -- no cache --------------------------------------------------------------------------------
def test_without_a_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    path = str(FILES["multi_device"])
    snap = open_snapshot(path)
    assert snap.cache_entry is None
    a = analyze(snap)
    b = analyze(open_snapshot(path))
    assert not a.from_cache and not b.from_cache
    assert_same_analysis(a, b)


def test_use_cache_false_neither_reads_nor_writes(cache_dir):
    path = str(FILES["example"])
    snap = open_snapshot(path)
    a = analyze(snap, use_cache=False)
    assert not a.from_cache
    assert not [n for n in artifact_names(snap) if n.startswith("an-")]
    analyze(snap)
    assert not analyze(open_snapshot(path), use_cache=False).from_cache
    assert analyze(open_snapshot(path)).from_cache


def test_an_unwritable_cache_entry_still_analyses(cache_dir):
    path = str(FILES["oom"])
    want = fresh(path)
    snap = open_snapshot(path)
    snap = open_snapshot(path)                         # mapped from the entry
    shutil.rmtree(snap.cache_entry)                    # the columns stay mapped; writes now fail
    got = analyze(snap)
    assert not got.from_cache
    assert_same_analysis(got, want)
    assert not os.path.exists(snap.cache_entry)


def test_a_cache_entry_that_is_a_file_still_analyses(cache_dir, tmp_path):
    path = str(FILES["oom"])
    snap = open_snapshot(path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"x")
    snap.cache_entry = str(blocker)
    got = analyze(snap)
    assert not got.from_cache
    assert_same_analysis(got, fresh(path))


def test_typed_results_rebuild_exactly_and_refuse_wrong_types():
    """`from_plain` (what the cache reads its results with) gives back exactly what
    `to_plain` wrote, and refuses a field of the wrong type with an error naming it."""
    from vramscope.classifiers.results import Iteration, Leak, Oom, Peak, StaleGradients, from_plain, to_plain
    an = analyze(open_snapshot(str(FILES["oom"]), use_cache=False), use_cache=False)
    da = an.devices[an.primary_device()]
    assert da.ooms and da.iterations
    for tp, value in ((Peak, da.peak), (tuple[Iteration, ...], da.iterations), (tuple[Oom, ...], da.ooms),
                      (tuple[Leak, ...], da.leaks), (StaleGradients | None, da.stale_gradients)):
        assert from_plain(tp, orjson.loads(orjson.dumps(to_plain(value)))) == value
    plain = to_plain(da.peak)
    for field, bad in (("bytes", "5"), ("bytes", True), ("index", 1.5), ("by_category", [1]), ("type", None)):
        with pytest.raises(ValueError, match=field):
            from_plain(Peak, {**plain, field: bad})
    with pytest.raises(ValueError, match="advice"):
        from_plain(Peak, {**plain, "advice": [{"lever": 3}]})
    with pytest.raises(ValueError):
        from_plain(Peak, {k: v for k, v in plain.items() if k != "phase"})


def test_a_big_analysis_is_stored_on_a_thread_and_read_back_the_same(cache_dir, monkeypatch):
    # (big: every analysis, here) the caller goes on while the arrays are written; the next
    # read waits for the writing, and finds exactly what a fresh analysis gives
    from vramscope.classifiers import cache as analysis_cache
    from vramscope.classifiers import structure as structure_module
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    started = []
    save_later = analysis_cache.save_later

    def recording(*a):
        save_later(*a)
        started.append(list(analysis_cache._SAVING))
    monkeypatch.setattr(analysis_cache, "save_later", recording)
    path = FILES[sorted(FILES)[0]]
    want = fresh(path)
    first = analyze(open_snapshot(str(path)))
    assert not first.from_cache and len(started) == 1 and len(started[0]) == 1
    again = analyze(open_snapshot(str(path)))
    assert again.from_cache and not analysis_cache._SAVING       # waited for, then read
    assert_same_analysis(again, want)


def test_a_big_analysis_writes_its_arrays_while_it_goes_on(cache_dir, monkeypatch):
    """On a big run each device's arrays (final once its rows are classified) are written on
    a thread of their own once its blocks' structure is found (or the command is leaving),
    beside the simulations of the levers that waited for it: the save after the analysis writes each array no more, only the
    manifest; read back, the analysis is a fresh one's. Where that early writing failed, the
    save writes the arrays itself, and the analysis is stored whole."""
    import threading
    from vramscope.classifiers import cache as analysis_cache
    from vramscope.classifiers import structure as structure_module
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    real = analysis_cache.write_artifact_array
    writes: list = []
    saving: list = []

    def counted(snap, name, arr):
        writes.append((name, threading.current_thread().name, len(saving)))
        return real(snap, name, arr)
    monkeypatch.setattr(analysis_cache, "write_artifact_array", counted)
    save_later = analysis_cache.save_later
    monkeypatch.setattr(analysis_cache, "save_later", lambda *a: saving.append(1) or save_later(*a))
    path = FILES["multi_device"]
    want = fresh(path)
    first = analyze(open_snapshot(str(path)))
    analysis_cache.wait_saved()
    assert not first.from_cache and len(first.devices) >= 2
    names = [n for n, _, _ in writes]
    assert len(names) == len(set(names)) and len(names) >= 2 * 5          # each array once, every device's
    # the rows' arrays early; the iterations' (their peaks are found last) by the save
    assert {th for n, th, _ in writes if "-it-" not in n} == {"vramscope-analysis-cache-arrays"}
    assert {th for n, th, _ in writes if "-it-" in n} == {"vramscope-analysis-cache"}
    again = analyze(open_snapshot(str(path)))
    assert again.from_cache
    assert_same_analysis(again, want)

    # the early writing fails: written again by the save, stored whole
    import shutil
    shutil.rmtree(_entry(path))
    writes.clear()
    fails = {"left": 1}

    def failing_once(snap, name, arr):
        on_early = threading.current_thread().name == "vramscope-analysis-cache-arrays"
        if on_early and fails["left"]:
            fails["left"] -= 1
            return False
        writes.append(name)
        return real(snap, name, arr)
    monkeypatch.setattr(analysis_cache, "write_artifact_array", failing_once)
    second = analyze(open_snapshot(str(path)))
    analysis_cache.wait_saved()
    assert not second.from_cache and not fails["left"]
    third = analyze(open_snapshot(str(path)))
    assert third.from_cache
    assert_same_analysis(third, want)


def test_an_iteration_is_plain_as_any_dataclass():
    """to_plain's own conversion of an Iteration (listed by the hundred thousand) is the generic
    one of its fields, in their order, a tuple field made a list."""
    import dataclasses

    from vramscope.classifiers.results import Iteration, _dataclass_plain, to_plain
    names = tuple(f.name for f in dataclasses.fields(Iteration))
    its = [Iteration(1, 0, 9, None, None, {}, 1),
           Iteration(2, 10, 99, 5, 70, {"forward": (10, 40), "backward": (41, 90)}, 2, source="forward_runs",
                     peak_bytes=1 << 40, peak_index=37, peak_type="forward")]
    for it in its:
        plain = to_plain(it)
        assert plain == _dataclass_plain(it, names) and tuple(plain) == names
        assert plain["phases"] == {k: list(v) for k, v in it.phases.items()}
    assert to_plain(its) == [_dataclass_plain(it, names) for it in its]


def test_the_cached_summary_reads_its_iterations_from_the_analysis(cache_dir, capsys):
    """The cached summary document names the analysis cache's iterations instead of copying
    them (a million rows at 10^7 entries); read back, `--json` is the fresh one's. With those
    arrays gone (pruned, damaged), the document is recomputed, never printed without them."""
    from vramscope import cli
    path = str(FILES["example"])

    def printed() -> bytes:
        assert cli.main(["summary", path, "--json"]) == 0
        return capsys.readouterr().out.encode()
    first = printed()
    assert len(orjson.loads(first)["devices"][0]["iterations"]) > 1
    entry = _entry(FILES["example"])
    stored = [f for f in entry.iterdir() if f.name.startswith("art-summary-")]
    assert len(stored) == 1 and b'"iterations":"in the analysis cache"' in stored[0].read_bytes()
    assert printed() == first                     # read back
    gone = list(entry.glob("*-it-start.npy*"))
    assert gone
    for f in gone:
        f.unlink()
    assert acache.load_iterations(open_snapshot(path), acache.analysis_fingerprint(), 0) is None
    assert printed() == first                     # recomputed
    assert acache.load_iterations(open_snapshot(path), acache.analysis_fingerprint(), 0) is not None
