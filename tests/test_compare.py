"""`vramscope compare A B` (issue 15): two recordings of one fine-tuning run, before and after a change.

The `ft_*` ground-truth runs are one LoRA fine-tuning code path recorded three ways
(tests/groundtruth/README.md): as is, with activation checkpointing, and with the
micro-batch doubled. Their truth files give each peak's bytes and torch's own
categories at it, against which the comparison's figures are checked.
"""
from __future__ import annotations

import json
import pickle
import re
import shutil

import numpy as np
import pytest

from helpers import DATA, GROUNDTRUTH, REPO, load_trusted, needs_shared, shared
from vramscope.classifiers import analyze
from vramscope.classifiers.compare import (CompareError, SiteBytes, _pair_keys, _tails_agree, naming_stacks,
                                           paired_devices, site_changes, sites_at)
from vramscope.cli import main
from vramscope.parsers import open_snapshot
from vramscope.present.stacks import Stacks
from vramscope.services.compare import compare_analyses, compare_document, compare_text
from vramscope.services.summary import plain_document, summary_document

BASE, CKPT, BATCH2X = (str(GROUNDTRUTH / f"{n}.pickle") for n in ("ft_base", "ft_checkpointing", "ft_batch2x"))


@pytest.fixture(autouse=True)
def _no_user_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "compare-cache"))


def truth(path: str) -> dict:
    return json.loads(open(path.replace(".pickle", ".truth.json")).read())


def an_of(path: str):
    return analyze(open_snapshot(path))


def doc_of(a: str, b: str, device=None) -> dict:
    cmp = compare_analyses(an_of(a), an_of(b), device)
    return json.loads(json.dumps(compare_document(cmp, a, b)))


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def site_table(doc: dict) -> list[tuple]:
    return [(d["device"], s["where"], s["a_bytes"], s["b_bytes"], s["delta"]) for d in doc["devices"] for s in d["sites"]]


# -- the ft_* runs ------------------------------------------------------------------------------
@pytest.mark.parametrize("b", [CKPT, BATCH2X], ids=["checkpointing", "batch2x"])
def test_each_side_is_its_own_summary_and_the_deltas_are_exact(b):
    an_a, an_b = an_of(BASE), an_of(b)
    doc = json.loads(json.dumps(compare_document(compare_analyses(an_a, an_b), BASE, b)))
    assert doc["a"] == BASE and doc["b"] == b
    assert [d["device"] for d in doc["devices"]] == [0]
    d = doc["devices"][0]
    sums = {}
    for side, an, path in (("a", an_a, BASE), ("b", an_b, b)):
        summ = json.loads(json.dumps(plain_document(summary_document(an))))["devices"][0]
        peak = d[side]["peak"]
        # the summary's peak, field for field (its `top` list aside: the sites stand for it)
        assert peak == {k: v for k, v in summ["peak"].items() if k != "top"}
        assert d[side]["iterations"] == summ["iterations"]
        # and torch's own replay of the trace (the ground truth's peak)
        assert peak["bytes"] == truth(path)["peak_live"]["bytes"]
        assert peak["index"] == truth(path)["peak_live"]["index"]
        assert sum(peak["by_category"].values()) == peak["bytes"]
        sums[side] = summ["peak"]
    assert d["delta"]["peak_bytes"] == truth(b)["peak_live"]["bytes"] - truth(BASE)["peak_live"]["bytes"]
    cats = set(sums["a"]["by_category"]) | set(sums["b"]["by_category"])
    assert d["delta"]["by_category"] == {c: sums["b"]["by_category"].get(c, 0) - sums["a"]["by_category"].get(c, 0)
                                         for c in cats}
    assert sum(d["delta"]["by_category"].values()) == d["delta"]["peak_bytes"]
    # the iterations' peaks side by side
    assert [(it["number"], it["a_bytes"], it["b_bytes"]) for it in d["iterations"]] == [
        (k + 1, ia["peak_bytes"], ib["peak_bytes"]) for k, (ia, ib) in
        enumerate(zip(d["a"]["iterations"], d["b"]["iterations"]))]
    assert len(d["iterations"]) == truth(b)["iterations"] == 2
    assert all(it["delta"] == it["b_bytes"] - it["a_bytes"] for it in d["iterations"])


@pytest.mark.parametrize("b", [CKPT, BATCH2X], ids=["checkpointing", "batch2x"])
def test_sites_add_up_to_both_peaks(b):
    d = doc_of(BASE, b)["devices"][0]
    sites = d["sites"]
    assert sum(s["a_bytes"] for s in sites) == d["a"]["peak"]["bytes"]
    assert sum(s["b_bytes"] for s in sites) == d["b"]["peak"]["bytes"]
    assert sum(s["delta"] for s in sites) == d["delta"]["peak_bytes"]
    for s in sites:
        assert s["delta"] == s["b_bytes"] - s["a_bytes"]
        assert sum(ln["a_bytes"] for ln in s["lines"]) == s["a_bytes"]
        assert sum(ln["b_bytes"] for ln in s["lines"]) == s["b_bytes"]
    # largest change first, every site once
    assert [abs(s["delta"]) for s in sites] == sorted((abs(s["delta"]) for s in sites), reverse=True)
    assert len({s["where"] for s in sites}) == len(sites)
    # the run's own code names the sites: the same user frames on both sides (README: one code path)
    assert {s["where"] for s in sites if s["a_bytes"] and s["b_bytes"]} >= {"record_runs.py:forward",
                                                                            "record_runs.py:train_ft"}


def test_checkpointing_shows_as_fewer_activation_bytes_at_the_peak():
    d = doc_of(BASE, CKPT)["devices"][0]
    t_a, t_b = truth(BASE)["peak_live"]["by_category"], truth(CKPT)["peak_live"]["by_category"]
    assert t_b["activation"] < t_a["activation"]                 # torch's own categories say so
    assert d["delta"]["peak_bytes"] < 0
    act = d["delta"]["by_category"]["activations"]
    assert act < 0 and act == min(d["delta"]["by_category"].values())      # the biggest drop of all
    assert d["b"]["peak"]["by_category"]["activations"] < 0.25 * d["a"]["peak"]["by_category"]["activations"]
    # the recompute happens in backward: B's peak moves there and its autograd bytes grow
    assert d["delta"]["by_category"]["autograd"] > 0
    # the model's forward code keeps fewer bytes alive at the peak
    fwd = next(s for s in d["sites"] if s["where"] == "record_runs.py:forward")
    assert fwd["delta"] < 0 and fwd is d["sites"][0]


def test_doubling_the_micro_batch_doubles_the_activations():
    d = doc_of(BASE, BATCH2X)["devices"][0]
    a, b = d["a"]["peak"]["by_category"], d["b"]["peak"]["by_category"]
    ratio = b["activations"] / a["activations"]
    t = truth(BATCH2X)["peak_live"]["by_category"]["activation"] / truth(BASE)["peak_live"]["by_category"]["activation"]
    assert 1.9 < ratio < 2.1 and 1.9 < t < 2.1
    assert d["delta"]["by_category"]["weights"] == 0 and d["delta"]["by_category"]["optimizer"] == 0
    assert d["delta"]["peak_bytes"] > 0


def test_same_file_twice_changes_nothing():
    d = doc_of(BASE, BASE)["devices"][0]
    assert d["delta"]["peak_bytes"] == 0 and not any(d["delta"]["by_category"].values())
    assert all(s["delta"] == 0 for s in d["sites"]) and "unchanged" in d["headline"]


# -- paths that differ ------------------------------------------------------------------------
_PROF = re.compile(r"^(.*)\((\d+)\): (.*)$")


def rewrite_paths(src: str, dst, user_prefix: str, venv_prefix: str, moved=None) -> str:
    """A copy of a snapshot whose frames say the files lived elsewhere: torch under a
    virtual environment's site-packages, the user's script under `user_prefix` (or each
    path as `moved(path)` says)."""
    obj = load_trusted(src)
    seen: set[int] = set()

    def prefixed(path: str) -> str:
        return venv_prefix + path if path.startswith("torch/") else user_prefix + path
    moved = moved or prefixed

    def fix(frames):
        for fr in frames or ():
            if id(fr) in seen:
                continue
            seen.add(id(fr))
            if fr.get("filename") == "none":
                m = _PROF.match(fr["name"])
                if m and m.group(1).endswith(".py"):
                    fr["name"] = f"{moved(m.group(1))}({m.group(2)}): {m.group(3)}"
            elif str(fr.get("filename", "")).endswith(".py"):
                fr["filename"] = moved(fr["filename"].lstrip("/"))
    for trace in obj["device_traces"]:
        for e in trace:
            fix(e.get("frames"))
    for seg in obj["segments"]:
        for blk in seg.get("blocks", ()):
            fix(blk.get("frames"))
    with open(dst, "wb") as fh:
        pickle.dump(obj, fh, protocol=4)
    return str(dst)


def test_the_same_files_from_other_folders_and_other_paths_give_the_same_site_table(tmp_path):
    reference = doc_of(BASE, CKPT)
    table = site_table(reference)
    # copies in two differently named folders
    one, two = tmp_path / "run-2024-one", tmp_path / "elsewhere" / "second copy"
    for folder in (one, two):
        folder.mkdir(parents=True)
    a1, b2 = str(shutil.copy(BASE, one / "before.pickle")), str(shutil.copy(CKPT, two / "after.pickle"))
    assert site_table(doc_of(a1, b2)) == table
    # B recorded on another machine: every frame's path moved
    b_moved = rewrite_paths(CKPT, tmp_path / "b_moved.pickle", "/home/alice/proj/tests/groundtruth/",
                            "/home/alice/venvs/ft/lib/python3.11/site-packages/")
    assert "alice" in open(b_moved, "rb").read().decode("latin-1")
    assert site_table(doc_of(BASE, b_moved)) == table
    # both moved, to two different places (two machines, two virtual environments): the same
    # table as both moved alike
    a_bob = rewrite_paths(BASE, tmp_path / "a_bob.pickle", "/srv/bob/checkout/tests/groundtruth/",
                          "/opt/conda/envs/x/lib/python3.12/site-packages/")
    b_alice = rewrite_paths(CKPT, tmp_path / "b_alice.pickle", "/home/alice/proj/tests/groundtruth/",
                            "/home/alice/venvs/ft/lib/python3.11/site-packages/")
    a_alice = rewrite_paths(BASE, tmp_path / "a_alice.pickle", "/home/alice/proj/tests/groundtruth/",
                            "/home/alice/venvs/ft/lib/python3.11/site-packages/")
    moved_table = site_table(doc_of(a_bob, b_alice))
    assert moved_table == site_table(doc_of(a_alice, b_alice))
    assert [row[2:] for row in moved_table] == [row[2:] for row in table]
    assert {row[1] for row in moved_table} >= {"groundtruth/record_runs.py:forward"}


def test_tail_matching_is_by_whole_components_and_unique():
    assert _tails_agree("record_runs.py", "groundtruth/record_runs.py")
    assert not _tails_agree("runs.py", "groundtruth/record_runs.py")
    assert not _tails_agree("a/model.py", "b/model.py")
    # two candidates for one key: left apart rather than guessed
    pairs = _pair_keys([("model.py", "forward")], [("a/model.py", "forward"), ("b/model.py", "forward")])
    assert pairs == {}
    pairs = _pair_keys([("model.py", "forward"), ("x.py", "f")], [("a/model.py", "forward"), ("x.py", "f")])
    assert pairs == {("model.py", "forward"): ("a/model.py", "forward"), ("x.py", "f"): ("x.py", "f")}
    a = (SiteBytes("model.py", "forward", 10, 1, ((5, 10),), (1,)),)
    b = (SiteBytes("a/model.py", "forward", 4, 1, ((5, 4),), (7,)), SiteBytes("", "(no frames)", 3, 1, ((0, 3),), (-1,)))
    ch = site_changes(a, b)
    assert [(c.file, c.function, c.a_bytes, c.b_bytes, c.delta) for c in ch] == [
        ("model.py", "forward", 10, 4, -6), ("", "(no frames)", 0, 3, 3)]
    assert ch[0].a_stacks == (1,) and ch[0].b_stacks == (7,)


# -- the command line ---------------------------------------------------------------------------
def test_cli_text_and_json(capsys):
    code, out, err = cli(capsys, "compare", BASE, CKPT)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"A  {BASE}" and lines[1] == f"B  {CKPT}"
    assert "device 0: peak from 13.28 MiB to 9.24 MiB, 4.04 MiB lower" in out
    assert re.search(r"peak live\s+13\.28 MiB\s+9\.24 MiB\s+-4\.04 MiB", out)
    assert re.search(r"activations\s+9\.08 MiB\s+1\.50 MiB\s+-7\.58 MiB", out)
    site_rows = [ln for ln in lines if ln.rstrip().endswith(("record_runs.py:forward", "record_runs.py:train_ft"))]
    assert site_rows[0].endswith("record_runs.py:forward")          # the biggest change first
    code, out, err = cli(capsys, "compare", BASE, CKPT, "--json", "--device", "0")
    doc = json.loads(out)
    assert code == 0 and set(doc) >= {"a", "b", "devices"}
    d = doc["devices"][0]
    assert set(d) >= {"device", "a", "b", "delta", "sites"} and set(d["delta"]) == {"peak_bytes", "by_category"}
    assert set(d["sites"][0]) >= {"where", "a_bytes", "b_bytes", "delta"}
    assert doc == doc_of(BASE, CKPT)
    assert compare_text(doc) + "\n" == cli(capsys, "compare", BASE, CKPT)[1]


def _write(path, obj) -> str:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=4)
    return str(path)


def _one_line_error(capsys, code_wanted, *argv) -> str:
    code, out, err = cli(capsys, *argv)
    assert code == code_wanted, err
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("vramscope compare: ")
    return err


def test_bad_input_is_one_line_and_exit_3(capsys, tmp_path):
    not_a_snapshot = _write(tmp_path / "weights.pickle", {"state_dict": [1, 2, 3]})
    err = _one_line_error(capsys, 3, "compare", BASE, not_a_snapshot)
    assert not_a_snapshot in err
    empty = _write(tmp_path / "empty.pickle", {"segments": [], "device_traces": [[], []]})
    err = _one_line_error(capsys, 3, "compare", empty, BASE)
    assert "A (" in err and "empty" in err and "nothing to compare" in err
    # the same run recorded on device 1 only: no device in common
    obj = load_trusted(BASE)
    obj["device_traces"] = [[], obj["device_traces"][0]]
    for seg in obj["segments"]:
        seg["device"] = 1
    dev1 = _write(tmp_path / "dev1.pickle", obj)
    err = _one_line_error(capsys, 3, "compare", BASE, dev1)
    assert "no device in common" in err and "device 0" in err and "device 1" in err
    err = _one_line_error(capsys, 3, "compare", BASE, dev1, "--device", "1")
    assert "A (" in err and "no data on device 1" in err
    # a device neither file has: a usage error, as in every verb
    _one_line_error(capsys, 2, "compare", BASE, dev1, "--device", "7")
    _one_line_error(capsys, 3, "compare", BASE, str(tmp_path / "missing.pickle"))


def test_a_state_only_side_is_compared_with_a_note(capsys, tmp_path):
    obj = load_trusted(BASE)
    obj["device_traces"] = [[]]
    state = _write(tmp_path / "state.pickle", obj)
    code, out, err = cli(capsys, "compare", BASE, state, "--json")
    assert code == 0, err
    doc = json.loads(out)
    d = doc["devices"][0]
    assert d["b"]["entries"] == 0 and d["b"]["iterations"] == [] and d["b"]["origin"]["index"] == -1
    assert sum(s["b_bytes"] for s in d["sites"]) == d["b"]["peak"]["bytes"] > 0
    assert any("state-only" in n for n in doc["notes"])
    code, out, err = cli(capsys, "compare", BASE, state)
    assert code == 0 and "note: device 0: B has no trace (a state-only snapshot)" in out


def test_devices_in_one_file_only_are_named():
    assert paired_devices([0, 1], [0]) == ([0], (1,), ())
    with pytest.raises(CompareError, match="no device in common"):
        paired_devices([1], [0])
    with pytest.raises(CompareError, match="B: no allocations"):
        paired_devices([0], [])


# -- the report ---------------------------------------------------------------------------------
def test_report_with_compare(capsys, tmp_path):
    out = tmp_path / "rep"
    code, printed, err = cli(capsys, "report", BASE, "--compare", CKPT, "-o", str(out))
    assert code == 0, err
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert len(md.encode()) <= 20_000
    section = md.split("## Comparison: A = `ft_base.pickle`, B = `ft_checkpointing.pickle`", 1)[1]
    assert "![device 0: live memory of A and B, aligned at the first iteration](compare.png)" in section
    assert "| **Peak live** | **13.28 MiB** | **9.24 MiB** | **-4.04 MiB** |" in section
    assert "| activations | 9.08 MiB | 1.50 MiB | -7.58 MiB |" in section
    assert "| `record_runs.py:forward` |" in section
    js = json.loads((out / "analysis.json").read_text())
    assert js["compare"] == doc_of(BASE, CKPT)
    # redacted: file names only
    code, printed, err = cli(capsys, "report", BASE, "--compare", CKPT, "-o", str(tmp_path / "red"), "--redact-paths")
    js = json.loads((tmp_path / "red" / "analysis.json").read_text())
    assert code == 0 and js["compare"]["a"] == "ft_base.pickle" and js["compare"]["b"] == "ft_checkpointing.pickle"
    # a mismatch is refused before anything is written
    obj = load_trusted(BASE)
    obj["device_traces"] = [[], obj["device_traces"][0]]
    for seg in obj["segments"]:
        seg["device"] = 1
    dev1 = _write(tmp_path / "dev1.pickle", obj)
    code, printed, err = cli(capsys, "report", BASE, "--compare", dev1, "-o", str(tmp_path / "none"))
    assert code == 3 and "no device in common" in err and not (tmp_path / "none" / "report.md").exists()


def test_report_section_escapes_what_the_snapshot_says(capsys, tmp_path):
    """A file name with Markdown in it stays inside its code span and its table cell."""
    hostile = rewrite_paths(CKPT, tmp_path / "hostile.pickle", "", "",
                            moved=lambda p: p.replace("record_runs.py", "we|rd`<img src=x>.py"))
    code, printed, err = cli(capsys, "report", BASE, "--compare", hostile, "-o", str(tmp_path / "rep"))
    assert code == 0, err
    md = (tmp_path / "rep" / "report.md").read_text()
    rows = [ln for ln in md.split("| Code site (live at the peaks) |", 1)[1].splitlines()[2:] if ln.startswith("|")]
    assert any("<img src=x>" in r for r in rows)                  # quoted, inside a code span
    for r in rows:
        cells = re.split(r"(?<!\\)\|", r)
        assert len(cells) == 6, r                                 # 4 cells: no '|' escaped its cell


# -- real snapshots ---------------------------------------------------------------------------
@needs_shared
def test_real_fullstep_against_forward_only():
    """Two real recordings from one repository (absolute paths, stacks with C++ frames): the
    full fp32 training step against the bf16 forward."""
    a = shared("kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle")
    b = shared("kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_forward_mixed.pickle")
    d = doc_of(a, b)["devices"][0]
    assert d["a"]["peak"]["bytes"] == 54802667524 and d["b"]["peak"]["bytes"] == 23873313792
    assert sum(s["a_bytes"] for s in d["sites"]) == d["a"]["peak"]["bytes"]
    assert sum(s["b_bytes"] for s in d["sites"]) == d["b"]["peak"]["bytes"]
    assert d["delta"]["peak_bytes"] == 23873313792 - 54802667524
    assert not any(s["where"].startswith("/") for s in d["sites"])   # path tails, never absolute paths


# -- the grouping is the report's --------------------------------------------------------------
@pytest.mark.parametrize("path", [DATA / "forward_frames_213.pickle", DATA / "multi_device.pickle",
                                  GROUNDTRUTH / "ft_checkpointing.pickle", REPO / "assets" / "example.pickle"],
                         ids=lambda p: p.name)
def test_sites_name_allocations_as_the_report_does(path):
    """The vectorized naming (classifiers.compare.naming_stacks) picks, row for row, the stack
    `Stacks.where_of` names an allocation by (its forward stack for a C++-only backward
    allocation, torch 2.13), and `sites_at` groups the live bytes by `Stacks.site_key` of it."""
    an = an_of(str(path))
    st = Stacks(an)
    used_forward = 0
    for dev, da in an.devices.items():
        rows = np.arange(len(da.allocs))
        naming = naming_stacks(da, rows)
        for r, n in zip(rows.tolist(), naming.tolist()):
            a = da.allocation(r)
            assert st.where(n) == st.where_of(a), (dev, r)
            used_forward += n != a.stack
        live = np.flatnonzero(da.live_mask(da.peak.index))
        expected: dict = {}
        for r in live.tolist():
            key = st.site_key(int(naming[r]))
            expected[key] = expected.get(key, 0) + int(da.allocs.size[r])
        got = sites_at(da, da.peak.index, st.site_key)
        assert {(s.file, s.function): s.bytes for s in got} == expected
        assert sum(s.bytes for s in got) == da.peak.bytes
        assert [s.bytes for s in got] == sorted((s.bytes for s in got), reverse=True)
    # torch 2.13's forward_frames name C++-only backward allocations by their forward's user code
    assert (used_forward > 0) == (path.name == "forward_frames_213.pickle")


def test_forward_stack_names_a_cpp_only_row_when_it_holds_user_code():
    """The rule of Stacks._naming_stack, on made-up columns: a row whose own stack has no user
    frame is named by its entry's forward stack when that one has one, else by its own."""
    from types import SimpleNamespace as NS
    user_frame = np.array([-1, 7, -1, 3])           # stacks 1 and 3 hold user code
    da = NS(allocs=NS(stack=np.array([0, 1, 2, 0, -1]), alloc_index=np.array([0, 1, 2, -1, 3])),
            trace_forward_stack=np.array([3, 3, 0, 1], dtype=np.int32),
            facts=NS(stacks=NS(user_frame=user_frame)))
    assert naming_stacks(da, np.arange(5)).tolist() == [3, 1, 2, 0, 1]
    da.trace_forward_stack = None
    assert naming_stacks(da, np.arange(5)).tolist() == [0, 1, 2, 0, -1]
