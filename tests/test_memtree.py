"""What holds the memory now: the live bytes as a tree by code path (classifiers/memtree.py,
vramscope/present/memtree.py), on the real CUDA runs, the real snapshots in ../shared and the
fixtures, checked against what the allocation rows and the raw frames say."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("VRAMSCOPE_CACHE_DIR", "")

from vramscope.classifiers import CATEGORIES  # noqa: E402
from vramscope.classifiers.evidence import E_GUESS  # noqa: E402
from vramscope.classifiers.memtree import NODE_KINDS, icicle, memory_tree, stack_path, tree_index  # noqa: E402
from vramscope.classifiers.stacks import LAUNCH_PATH, PLUMBING_FUNCTIONS, is_library_file  # noqa: E402
from vramscope.present.memtree import (  # noqa: E402
    node_label,
    search_tree,
    tree_document,
    tree_lines,
    tree_text,
)
from vramscope.present.stacks import Stacks  # noqa: E402
from vramscope.services.report import write_report  # noqa: E402

from helpers import DATA, GROUNDTRUTH, analysis_of, real_snapshots  # noqa: E402

CUDA = sorted(DATA.glob("cuda_*.pickle"))
FILES = CUDA + sorted(GROUNDTRUTH.glob("*.pickle"))[:4] + [
    DATA / n for n in ("adamw_after_step1.pickle", "forward_frames_213.pickle", "fx_frames.pickle",
                       "multi_device_oom.pickle", "state_only_noframes.pickle", "torch20_history.pickle")]
FILES += real_snapshots()


def moments(da, k=4):
    """The peak, the start, the end and a few entries between."""
    n = da.n_entries
    rng = np.random.default_rng(0)
    extra = rng.integers(0, n, size=k).tolist() if n else []
    return sorted({da.peak.index, -1, n - 1, *extra})


def live_bytes(da, index):
    return int(da.live.start_bytes) if index < 0 else int(da.live.live_after[index])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_live_byte_is_in_the_tree_once_with_its_category_and_evidence(path):
    an = analysis_of(path)
    for da in an.devices.values():
        for index in moments(da):
            tree = memory_tree(da, index)
            roots = tree.roots
            assert tree.total_bytes == live_bytes(da, index)
            assert int(tree.bytes[roots].sum()) == tree.total_bytes
            assert int(tree.count[roots].sum()) == tree.total_count == int(da.live_mask(index).sum())
            # per category and evidence: the rows' own, summed over the roots
            cats = tree.by_category[roots].sum(axis=0)
            assert {CATEGORIES[c]: int(v) for c, v in enumerate(cats) if v} == da.by_category_at(index)
            assert (tree.by_category.sum(axis=1) == tree.bytes).all()
            assert (tree.by_evidence.sum(axis=1) == tree.bytes).all()
            for n in tree.walk():
                kids = tree.children(n)
                assert int(tree.bytes[kids].sum()) <= int(tree.bytes[n])
                assert all(tree.bytes[kids[:-1]] >= tree.bytes[kids[1:]])      # most bytes first
                assert (tree.parent[kids] == n).all()


@pytest.mark.parametrize("path", CUDA[:3] + [DATA / "adamw_after_step1.pickle", DATA / "forward_frames_213.pickle"],
                         ids=lambda p: p.name)
def test_a_nodes_allocations_are_the_live_rows_through_it_and_its_guess_is_theirs(path):
    an = analysis_of(path)
    da = an.devices[an.primary_device()]
    tree = memory_tree(da, da.peak.index)
    size = da.allocs.size
    seen = set()
    for n in tree.walk():
        rows = tree.rows(n)
        assert int(size[rows].sum()) == int(tree.bytes[n]) and len(rows) == int(tree.count[n])
        assert all(size[rows[:-1]] >= size[rows[1:]])                      # biggest first
        assert da.live_mask(da.peak.index)[rows].all()
        guessed = bool((da.evidence[rows] == E_GUESS).all())
        assert tree.guessed(n) == guessed == tree.node(n).guessed
        if not len(tree.children(n)):
            seen.update(rows.tolist())
    assert len(tree.rows(-1)) == tree.total_count
    # the leaves share out every live row
    assert seen == set(np.flatnonzero(da.live_mask(da.peak.index)).tolist())


def test_the_h100_lora_run_reads_from_the_users_script_down_to_the_op():
    an = analysis_of(DATA / "cuda_lora.pickle")
    da = an.devices[0]
    st = Stacks(an)
    tree = memory_tree(da, da.peak.index)
    t = da.facts.stacks.table
    for n in tree.walk():
        if NODE_KINDS[tree.kind[n]] != "frame":
            continue
        f = int(tree.frame[n])
        file, name = t.files[t.file_ids[f]], t.names[t.name_ids[f]]
        assert not LAUNCH_PATH.search(file)
        assert not (is_library_file(file) and name in PLUMBING_FUNCTIONS)
        assert st.frame(f).role in ("user", "library", "module", "autograd", "op")
    top = tree.roots[0]
    assert node_label(tree, st, top).startswith("<module>  (record_cuda.py:")
    # the roots are the script's top level and autograd's own thread (no Python frames)
    assert {st.frame(int(tree.frame[r])).role for r in tree.roots} <= {"user", "autograd"}
    # a leaf under the model's code is the op that allocated, under the model's Python frames
    ops = [n for n in tree.walk() if not len(tree.children(n)) and st.frame(int(tree.frame[n])).role == "op"]
    assert ops
    for n in ops:
        roles = [st.frame(int(tree.frame[p])).role for p in tree.path(n)]
        assert roles[-1] == "op" and ("user" in roles or "autograd" in roles)
    # the ops the Python code called and the one that allocated, not the dispatch between
    bmm = [n for n in tree.walk() if node_label(tree, st, n) == "aten::bmm"]
    assert bmm and node_label(tree, st, int(tree.parent[bmm[0]])) == "aten::matmul"


def test_each_stacks_path_starts_at_its_outermost_user_frame_read_from_the_raw_frames():
    """An independent reading of the raw (file, line, name) frames, outermost first."""
    for path in (DATA / "cuda_lora.pickle", DATA / "adamw_after_step1.pickle", DATA / "cuda_compiled.pickle"):
        an = analysis_of(path)
        snap = an.snapshot
        facts = an.facts.stacks
        for sid in range(snap.n_stacks):
            raw = snap.stack_frames_list(sid)[::-1]
            user = [(f, ln, nm) for f, ln, nm in raw if f.endswith(".py") and not is_library_file(f)
                    and not LAUNCH_PATH.search(f)]
            p = stack_path(facts, sid)
            if user:
                assert snap.frame(p[0]) == user[0], (path.name, sid)
            if not raw:
                assert p == (-1,)


def test_frameless_allocations_get_one_node_that_says_so_and_guessed_bytes_show():
    an = analysis_of(DATA / "forward_frames_213.pickle")
    da = an.devices[0]
    st = Stacks(an)
    tree = memory_tree(da, da.peak.index)
    live = np.flatnonzero(da.live_mask(da.peak.index))
    frameless = [r for r in live if len(an.snapshot.stack(int(da.allocs.stack[r]))) == 0]
    nodes = [n for n in tree.roots if NODE_KINDS[tree.kind[n]] == "no_frames"]
    assert len(nodes) == 1
    assert sorted(tree.rows(nodes[0]).tolist()) == sorted(frameless)
    assert "no frames" in node_label(tree, st, nodes[0])
    # the weights made before recording: every byte a guess, and the text says so
    assert tree.guessed(nodes[0])
    lines = tree_lines(tree, st)
    line = next(ln for ln in lines if ln.nodes[0] == nodes[0])
    assert "(a guess)" in tree_text(tree, st).splitlines()[lines.index(line) + 1]


def test_a_backward_allocation_sits_under_the_forward_code_that_made_it():
    """torch 2.13 records the forward stack of a backward entry (forward_frames)."""
    an = analysis_of(DATA / "forward_frames_213.pickle")
    da = an.devices[0]
    st = Stacks(an)
    tree = memory_tree(da, da.peak.index)
    mm = [n for n in tree.walk() if node_label(tree, st, n) == "MmBackward0 (autograd)"]
    assert mm
    for n in mm:
        above = [st.frame(int(tree.frame[p])) for p in tree.path(n)[:-1]]
        assert any(fv.role == "user" and fv.file.endswith("model.py") for fv in above)


def test_blocks_from_before_the_trace_that_only_have_their_frees_stack_say_so():
    an = analysis_of(DATA / "cuda_wrapped.pickle")
    da = an.devices[0]
    assert da.frees_record_their_own_stack()
    a = da.allocs
    freed = np.flatnonzero((a.alloc_index < 0) & (a.free_index >= 0))
    assert len(freed)
    tree = memory_tree(da, -1)
    nodes = [n for n in tree.roots if NODE_KINDS[tree.kind[n]] == "freed_stack"]
    assert len(nodes) == 1
    assert sorted(tree.rows(nodes[0]).tolist()) == sorted(freed.tolist())
    assert "before the trace" in node_label(tree, Stacks(an), nodes[0])


def test_node_ids_stay_the_same_from_one_moment_to_the_next():
    an = analysis_of(DATA / "cuda_full.pickle")
    da = an.devices[0]
    a, b = memory_tree(da, da.peak.index), memory_tree(da, da.iterations[1].peak_index)
    both = [n for n in a.walk() if b.in_tree(n)]
    assert len(both) > 10
    for n in both:
        assert a.path(n) == b.path(n) and a.frame[n] == b.frame[n]
    assert tree_index(da) is tree_index(da)          # built once per device


def test_search_finds_a_file_a_function_an_exact_line_and_an_op():
    an = analysis_of(DATA / "cuda_lora.pickle")
    da = an.devices[0]
    st = Stacks(an)
    tree = memory_tree(da, da.peak.index)
    hits = search_tree(tree, st, "modeling_llama.py:322")
    assert len(hits) == 1 and st.frame(int(tree.frame[hits[0]])).line == 322
    assert not len(search_tree(tree, st, "modeling_llama.py:32"))      # a line is a line, not a prefix
    by_file = search_tree(tree, st, "MODELING_LLAMA.PY")
    assert len(by_file) > 5 and all("modeling_llama.py" in st.frame(int(tree.frame[n])).file for n in by_file)
    fn = search_tree(tree, st, "fixed_cross_entropy")
    assert [st.frame(int(tree.frame[n])).function for n in fn] == ["fixed_cross_entropy"]
    ops = search_tree(tree, st, "aten::mm")
    assert ops.size and all(node_label(tree, st, n).startswith("aten::mm") for n in ops)
    assert not len(search_tree(tree, st, "  ")) and not len(search_tree(tree, st, "no_such_code_here"))


def test_text_json_and_icicle_keep_parents_before_children():
    an = analysis_of(DATA / "cuda_lora.pickle")
    da = an.devices[0]
    st = Stacks(an)
    tree = memory_tree(da, da.peak.index)
    text = tree_text(tree, st, max_lines=6)
    assert len(text.splitlines()) == 7 and "record_cuda.py:125" in text.splitlines()[1]
    doc = tree_document(tree, st, max_nodes=40)
    json.dumps(doc)
    ids = [d["id"] for d in doc["nodes"]]
    assert len(ids) == 40 and doc["live_bytes"] == da.peak.bytes
    for d in doc["nodes"]:
        assert d["parent"] == -1 or d["parent"] in ids[:ids.index(d["id"])]
        assert sum(d["by_category"].values()) == d["bytes"] == sum(d["by_evidence"].values())
    boxes = icicle(tree, min_share=0.01)
    where = {b.node: b for b in boxes}
    assert sum(b.x1 - b.x0 for b in boxes if b.depth == 0) <= 1.0 + 1e-9
    assert {b.node for b in boxes if b.depth == 0} == {int(r) for r in tree.roots if tree.share(int(r)) >= 0.01}
    for b in boxes:
        assert b.x1 - b.x0 >= 0.01
        up = int(tree.parent[b.node])
        if up >= 0:
            assert where[up].x0 - 1e-12 <= b.x0 < b.x1 <= where[up].x1 + 1e-12 and b.depth == where[up].depth + 1


def test_the_report_names_what_holds_the_memory_at_the_peak(tmp_path):
    an = analysis_of(DATA / "cuda_lora.pickle")
    write_report(an, str(tmp_path / "r"))
    md = (tmp_path / "r" / "report.md").read_text()
    assert "### What holds the memory at the peak" in md
    sec = md.split("### What holds the memory at the peak")[1].split("###")[0]
    assert "`<module>  (record_cuda.py:125)` › `main  (record_cuda.py:101)`" in sec
    doc = json.loads((tmp_path / "r" / "analysis.json").read_text())
    tree = doc["devices"][0]["peak_tree"]
    assert tree["live_bytes"] == doc["devices"][0]["peak"]["bytes"] and tree["nodes"]
    # redacted: basenames only, in the tree too
    write_report(an, str(tmp_path / "s"), redact_paths=True)
    assert "/work/" not in (tmp_path / "s" / "analysis.json").read_text()
