"""Which file is which rank (issue 30): the rank and world size `vramscope.record` really
writes (`vramscope_metadata.distributed`), read by `ranks`, `vramscope.open(...).metadata`
and the viewer's rank overview alike; and a folder in each layout the frameworks write, with
the source that writes it:

* torchtitan today, torchtitan/tools/profiler.py: `step_{N:012d}/{R:06d}_step_{N}.pickle`,
  the OOM dump under `step_{N:012d}_exit/` with the same file name;
* torchtitan before, torchtitan/tools/profiling.py: `iteration_{N}/rank{R}_memory_snapshot.pickle`,
  `iteration_{N}_exit/`;
* torchft under torchtitan (torchtitan/train.py `leaf_folder = f"replica_{replica_id}"`): a
  `replica_{i}/` folder per replica group inside the step folder, each numbering its ranks from 0;
* Megatron-Bridge, megatron/bridge/training/utils/train_utils.py: `{base}_{R}{ext}` and
  `{base}_oom_rank-{R}{ext}` for any `memory_snapshot_path` `{base}{ext}`;
* Megatron-LM, pretrain_gpt.py's OOM observer: `oom_rank-{R}_{memory_snapshot_path}` (the
  regular `{memory_snapshot_path}` is the last rank's alone and names none); newer
  megatron/training/utils/utils.py: `{stem}_rank-{R}{suffix}`, `{stem}_oom_rank-{R}{suffix}`
  (`{stem}_oom_rank_{R}{suffix}` in one version).

Every snapshot here is a rank of tests/ranks_data.py (cuda:rank, its own peak), so a rank
read from the wrong file shows in its device.
"""
from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

import ranks_data as rd
import vramscope
from fake_torch import FakeCuda
from vramscope.cli import main
from vramscope.services.rank_files import describe, find_files
from vramscope.services.ranks import read_ranks


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def ranks_json(capsys, folder, *more) -> dict:
    code = main(["ranks", str(folder), "--json", "--jobs", "1", *more])
    out = capsys.readouterr()
    assert code == 0, out.err
    return orjson.loads(out.out)


def write_layout(root: Path, files: dict[str, int]) -> Path:
    """Each relative path a snapshot of the given rank (cuda:rank), as the framework writes it."""
    for rel, rank in files.items():
        rd.write(root / rel, rd.rank_object(rank, iterations=1))
    return root


def table(doc: dict) -> dict[str, tuple]:
    """{file under the folder: (rank, where the rank came from, replica, rank in the replica)}"""
    folder = doc["folder"]
    return {os.path.relpath(r["file"], folder): (r["rank"], r["rank_source"], r["replica"], r["replica_rank"])
            for r in doc["ranks"]}


def skipped(doc: dict) -> set[str]:
    return {os.path.relpath(s["file"], doc["folder"]) for s in doc["skipped"]}


# -- the recorder's own files ------------------------------------------------------------------
@pytest.fixture
def recorded(monkeypatch, tmp_path) -> Path:
    """Two ranks of an 8-GPU job, 5 and 2, recorded by `vramscope.record` itself (torch's
    CUDA calls faked as in tests/test_record.py), once in its layout and once under names
    that say nothing of the rank (so only the metadata can)."""
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    fake = FakeCuda.from_fixture("cuda_oom.pickle")
    fake.install(monkeypatch)
    job = tmp_path / "job"
    for rank, name in ((5, "a.pickle"), (2, "b.pickle")):
        fake.dist = (rank, 8)                       # torch.distributed initialised: rank of world 8
        with vramscope.record(job / "memory_snapshot", dump_on_exit=False) as rec:
            rec.step()
            rec.dump()
            rec.dump(job / "renamed" / name)
    return job


def test_ranks_read_the_rank_and_world_size_record_writes(capsys, recorded):
    doc = ranks_json(capsys, recorded / "memory_snapshot")
    assert table(doc) == {"step_000000000001/000002_step_1.pickle": (2, "metadata", None, None),
                          "step_000000000001/000005_step_1.pickle": (5, "metadata", None, None)}
    # names that say nothing: the metadata alone says which rank, and of how many
    doc = ranks_json(capsys, recorded / "renamed")
    assert table(doc) == {"a.pickle": (5, "metadata", None, None), "b.pickle": (2, "metadata", None, None)}
    code = main(["ranks", str(recorded / "renamed"), "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 0 and out.splitlines()[0].endswith(": 2 ranks of 8")
    assert "missing: 6 of 8 ranks have no snapshot here (0, 1, 3, 4, 6, 7)" in out and "guess" not in out
    # vramscope.open reads the same document
    m = vramscope.open(recorded / "renamed" / "a.pickle").metadata
    assert (m.rank, m.world_size, m.rank_source) == (5, 8, "torch.distributed")


def test_the_viewers_rank_overview_reads_the_same_ranks(qt, recorded):
    pytest.importorskip("PySide6")
    from vramscope.viewer.ranks_part import load_folder
    from vramscope.viewer.ranks_view import RanksView
    load = load_folder(str(recorded / "renamed"))
    assert [(r.rank, r.rank_source) for r in load.result.ranks] == [(2, "metadata"), (5, "metadata")]
    view = RanksView()
    qt.addWidget(view)
    view.set_result(load.result, load.grid)
    assert [view.table.topLevelItem(k).text(0) for k in range(view.table.topLevelItemCount())] == ["2", "5"]
    assert "of 8" in view.header.text()


def test_a_flat_rank_key_is_not_the_recorders(capsys, tmp_path):
    """Only the recorder's nested `distributed` section says the rank: a top-level `rank`
    (which no recorder writes) names nothing, and the files are numbered in order (a guess)."""
    rd.write(tmp_path / "j" / "x.pickle", rd.rank_object(3, metadata={"rank": 3, "world_size": 8}))
    assert table(ranks_json(capsys, tmp_path / "j")) == {"x.pickle": (0, "order", None, None)}


# -- every layout -------------------------------------------------------------------------------
LAYOUTS = {
    "torchtitan": (
        {"step_000000000010/000000_step_10.pickle": 0, "step_000000000010/000001_step_10.pickle": 1,
         "step_000000000020/000000_step_20.pickle": 0, "step_000000000020/000001_step_20.pickle": 1,
         "step_000000000019_exit/000001_step_19.pickle": 1, "step_000000000009/000000_step_9.pickle": 0},
        {"step_000000000020/000000_step_20.pickle": (0, "file name", None, None),
         "step_000000000019_exit/000001_step_19.pickle": (1, "file name", None, None)}),
    "torchtitan_before": (
        {"iteration_10/rank0_memory_snapshot.pickle": 0, "iteration_10/rank1_memory_snapshot.pickle": 1,
         "iteration_9_exit/rank1_memory_snapshot.pickle": 1, "iteration_20/rank0_memory_snapshot.pickle": 0},
        {"iteration_20/rank0_memory_snapshot.pickle": (0, "file name", None, None),
         "iteration_9_exit/rank1_memory_snapshot.pickle": (1, "file name", None, None)}),
    "torchft": (
        {"step_000000000004/replica_0/000000_step_4.pickle": 0, "step_000000000004/replica_0/000001_step_4.pickle": 1,
         "step_000000000004/replica_1/000000_step_4.pickle": 2, "step_000000000004/replica_1/000001_step_4.pickle": 3,
         "step_000000000002/replica_1/000001_step_2.pickle": 3},
        {"step_000000000004/replica_0/000000_step_4.pickle": (0, "file name", 0, 0),
         "step_000000000004/replica_0/000001_step_4.pickle": (1, "file name", 0, 1),
         "step_000000000004/replica_1/000000_step_4.pickle": (2, "file name", 1, 0),
         "step_000000000004/replica_1/000001_step_4.pickle": (3, "file name", 1, 1)}),
    "megatron_bridge": (
        {"mem_0.pickle": 0, "mem_1.pickle": 1, "mem_2.pickle": 2, "mem_oom_rank-1.pickle": 1},
        {"mem_0.pickle": (0, "file name", None, None), "mem_oom_rank-1.pickle": (1, "file name", None, None),
         "mem_2.pickle": (2, "file name", None, None)}),
    "megatron_bridge_oom_only": (
        {"runs/llama.snap_3.pkl": 3, "runs/llama.snap_oom_rank-6.pkl": 6},
        {"runs/llama.snap_3.pkl": (3, "file name", None, None),
         "runs/llama.snap_oom_rank-6.pkl": (6, "file name", None, None)}),
    "megatron_bridge_default": (
        {"snapshot_4.pickle": 4},
        {"snapshot_4.pickle": (4, "file name", None, None)}),
    "megatron_lm": (
        {"oom_rank-1_snapshot.pickle": 1, "oom_rank-3_snapshot.pickle": 3, "snapshot.pickle": 7},
        {"snapshot.pickle": (0, "order", None, None), "oom_rank-1_snapshot.pickle": (1, "file name", None, None),
         "oom_rank-3_snapshot.pickle": (3, "file name", None, None)}),
    "megatron_lm_path_with_a_folder": (
        {"oom_rank-2_runs/mem.pickle": 2},
        {"oom_rank-2_runs/mem.pickle": (2, "file name", None, None)}),
    "megatron_lm_newer": (
        {"memory.snapshot_rank-0.pickle": 0, "memory.snapshot_rank-5.pickle": 5,
         "memory.snapshot_oom_rank-5.pickle": 5},
        {"memory.snapshot_rank-0.pickle": (0, "file name", None, None),
         "memory.snapshot_oom_rank-5.pickle": (5, "file name", None, None)}),
    "megatron_lm_oom_rank_underscore": (
        {"snapshot_oom_rank_2.pickle": 2, "snapshot_rank-1.pickle": 1},
        {"snapshot_rank-1.pickle": (1, "file name", None, None),
         "snapshot_oom_rank_2.pickle": (2, "file name", None, None)}),
    "names_that_are_no_ranks": (
        {"llama_70.pickle": 1, "run_1700000000.pickle": 2},
        {"llama_70.pickle": (0, "order", None, None), "run_1700000000.pickle": (1, "order", None, None)}),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout(capsys, tmp_path, layout):
    files, expected = LAYOUTS[layout]
    folder = write_layout(tmp_path / layout, files)
    doc = ranks_json(capsys, folder)
    assert table(doc) == expected
    assert skipped(doc) == set(files) - set(expected)
    for r in doc["ranks"]:          # each rank is the file written for it (its own GPU)
        assert r["device"] == files[os.path.relpath(r["file"], doc["folder"])]
    assert doc["not_snapshots"] == [] and doc["internal_errors"] == []


def test_the_dump_at_the_failure_stands_for_its_rank(capsys, tmp_path):
    folder = write_layout(tmp_path / "t", LAYOUTS["torchtitan"][0])
    doc = ranks_json(capsys, folder)
    reasons = {os.path.relpath(s["file"], doc["folder"]): s["reason"] for s in doc["skipped"]}
    assert reasons["step_000000000020/000001_step_20.pickle"] == (
        "step_000000000019_exit/000001_step_19.pickle is read instead: the dump taken when the run failed")
    assert reasons["step_000000000010/000000_step_10.pickle"].endswith("a later step (20)")


def test_replica_groups_in_the_text_and_their_world(capsys, tmp_path):
    folder = tmp_path / "ft"
    for replica in (0, 1):
        for rank in (0, 1):
            rd.write(folder / "step_000000000004" / f"replica_{replica}" / f"{rank:06d}_step_4.pickle",
                     rd.rank_object(2 * replica + rank, iterations=1))
    assert main(["ranks", str(folder), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(": 4 ranks in 2 replica groups (0, 1)")
    assert "replica 1 rank 0" in out.splitlines()[4]


@pytest.mark.parametrize("relative, rank, step, exit_dump, replica", [
    ("step_000000000010/000003_step_10.pickle", 3, 10, False, None),
    ("step_000000000010_exit/000003_step_10.pickle", 3, 10, True, None),
    ("step_000000000010/replica_2/000003_step_10.pickle", 3, 10, False, 2),
    ("iteration_10_exit/replica_1/rank3_memory_snapshot.pickle", 3, 10, True, 1),
    ("oom_rank-3_snapshot.pickle", 3, None, True, None),
    ("oom_rank-3_runs/mem.pickle", 3, None, True, None),
    ("mem_oom_rank-4.pickle", 4, None, True, None),
    ("mem_oom_rank_4.pickle", 4, None, True, None),
    ("rank3/snapshot.pickle", 3, None, False, None),
    ("mem_4.pickle", None, None, False, None),              # alone, a {base}_{N} says nothing (find_files decides)
    ("snapshot_step_10.pickle", None, 10, False, None),
    ("rank99999999_x.pickle", None, None, False, None),     # 2^24 or more: no rank
])
def test_names(relative, rank, step, exit_dump, replica):
    f = describe("/runs", relative)
    assert (f.rank, f.step, f.exit_dump, f.replica) == (rank, step, exit_dump, replica)


def test_a_base_is_megatron_bridges_where_the_folder_shows_it(tmp_path):
    for name in ("mem_0.pickle", "mem_1.pickle", "lone_7.pickle", "x_oom_rank-2.pkl", "x_3.pkl", "snapshot_5.pickle",
                 "sub/mem_4.pickle", "step_12.pickle", "y_oom_rank_1.p", "y_9.p"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    got = {f.relative: f.rank for f in find_files(str(tmp_path))[0]}
    assert got == {"mem_0.pickle": 0, "mem_1.pickle": 1, "lone_7.pickle": None, "x_oom_rank-2.pkl": 2, "x_3.pkl": 3,
                   "snapshot_5.pickle": 5, "sub/mem_4.pickle": None, "step_12.pickle": None, "y_oom_rank_1.p": 1,
                   "y_9.p": 9}


def test_read_ranks_numbers_replica_groups_by_the_metadatas_world_size(tmp_path):
    """Two replica groups of 4 (world size 4 in each file's metadata), one rank each: ranks
    0 of group 0 and 2 of group 1 are job ranks 0 and 6."""
    folder = tmp_path / "ft"
    for replica, rank in ((0, 0), (1, 2)):
        meta = {"schema": 1, "distributed": {"rank": rank, "world_size": 4}}
        rd.write(folder / f"replica_{replica}" / "snap.pickle", rd.rank_object(rank, iterations=1, metadata=meta))
    res = read_ranks(str(folder), jobs=1)
    assert [(r.rank, r.replica, r.replica_rank, r.rank_source) for r in res.ranks] == [
        (0, 0, 0, "metadata"), (6, 1, 2, "metadata")]
    assert res.overview.world_size == 8 and res.overview.missing == (1, 2, 3, 4, 5, 7)
