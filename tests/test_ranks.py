"""`vramscope ranks DIR`: a folder of per-rank snapshots (issue 23, DESIGN.md §6).

The folders are generated here (tests/ranks_data.py, torch's exact layout, nothing
committed): 8 ranks of a data-parallel job in torchtitan's layout, rank 5 holding twice
the activations, rank 3 running out of memory (its dump in `step_4_exit/`), and an
earlier step of two ranks that must be skipped.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

import ranks_data as rd
from vramscope.cli import main
from vramscope.parsers import Cancelled, Progress
from vramscope.services import rank_cache, rank_read
from vramscope.services.rank_files import choose, describe
from vramscope.services.ranks import OUTLIER_RULE, live_grid, outliers, ranks_document, read_ranks

RANK_KEYS = ["rank", "rank_source", "replica", "replica_rank", "file", "device", "peak", "reserved_peak_bytes", "ooms",
             "first_oom_time_us", "leaks"]
OVERVIEW_KEYS = ["ranks", "peak_max", "peak_median", "peak_min", "imbalance", "outliers", "first_oom"]


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def titan(tmp_path_factory) -> Path:
    folder = rd.torchtitan_folder(tmp_path_factory.mktemp("run"))
    (folder / "notes.txt").write_text("launched with 8 GPUs\n")
    (folder / "step_4" / ".hidden.pickle").write_bytes(b"\x80\x04junk")          # hidden: not a rank
    return folder


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def ranks_json(capsys, folder, *more) -> dict:
    code, out, err = run(capsys, "ranks", folder, "--json", *more)
    assert code == 0, err
    return orjson.loads(out)


# -- the 8-rank folder -----------------------------------------------------------------------
def test_every_rank_is_its_own_summary(capsys, titan):
    doc = ranks_json(capsys, titan, "--jobs", "1")
    assert list(doc) == ["folder", "ranks", "overview", "not_snapshots", "skipped", "internal_errors"]
    assert [r["rank"] for r in doc["ranks"]] == list(range(8))
    for r in doc["ranks"]:
        assert list(r) == RANK_KEYS
        assert list(r["peak"]) == ["bytes", "type", "by_category"]
        assert r["rank_source"] == "file name"
        assert r["device"] == r["rank"]               # cuda:rank on an 8-GPU node
        code, out, err = run(capsys, "summary", r["file"], "--json")
        assert code == 0, err
        s = orjson.loads(out)
        d = next(x for x in s["devices"] if x["device"] == r["device"])
        assert r["peak"] == {k: d["peak"][k] for k in ("bytes", "type", "by_category")}
        assert r["reserved_peak_bytes"] == d["reserved_peak_bytes"]
        assert r["ooms"] == d["ooms"] and r["leaks"] == d["leaks"]
        assert sum(r["peak"]["by_category"].values()) == r["peak"]["bytes"]


def test_the_first_oom_and_the_heavier_rank_are_named(capsys, titan):
    doc = ranks_json(capsys, titan)
    ov = doc["overview"]
    assert list(ov) == OVERVIEW_KEYS
    exit_file = titan / "step_4_exit" / "000003_step_4_exit.pickle"
    expected_time = rd.oom_time_us(pickle.loads(exit_file.read_bytes()))    # our own file: trusted
    assert ov["first_oom"] == {"rank": 3, "file": str(exit_file), "time_us": expected_time}
    assert doc["ranks"][3]["first_oom_time_us"] == expected_time and len(doc["ranks"][3]["ooms"]) == 1
    assert [r["rank"] for r in doc["ranks"] if r["ooms"]] == [3]
    assert ov["outliers"] == [5]
    peaks = [r["peak"]["bytes"] for r in doc["ranks"]]
    assert ov["peak_max"] == peaks[5] == max(peaks) and ov["peak_min"] == min(peaks) and ov["ranks"] == 8
    assert ov["peak_median"] == int(np.median(peaks))
    assert ov["imbalance"] == pytest.approx(peaks[5] / ov["peak_median"], abs=1e-4)
    # each rank's latest step, the exit dump over a regular one; the others skipped with the reason
    assert sorted(Path(r["file"]).parent.name for r in doc["ranks"]) == ["step_4"] * 7 + ["step_4_exit"]
    assert {(Path(s["file"]).parent.name, s["rank"]) for s in doc["skipped"]} == {("step_2", 0), ("step_2", 3)}
    assert "when the run failed" in next(s["reason"] for s in doc["skipped"] if s["rank"] == 3)
    assert doc["not_snapshots"] == [{"file": str(titan / "notes.txt"),
                                     "error": "not a pickle of protocol 2 or later (starts with b'laun')"}]


def test_text_names_the_first_oom_and_the_outlier(capsys, titan):
    code, out, err = run(capsys, "ranks", titan)
    assert code == 0, err
    lines = out.splitlines()
    rows = {ln.split()[0]: ln for ln in lines[2:10]}
    assert set(rows) == {str(k) for k in range(8)}
    assert rows["3"].endswith("first OOM; failure dump") and rows["5"].endswith("outlier (+24.1%)")
    assert "first OOM: rank 3, requesting" in out and "after the earliest trace began" in out
    assert "outliers: rank 5 (+" in out and OUTLIER_RULE in out
    assert f"not read: {titan / 'notes.txt'}: not a pickle" in out
    assert "skipped 2 files" in out
    assert err == ""


def test_two_processes_give_what_one_gives(capsys, titan, tmp_path, monkeypatch):
    one = ranks_json(capsys, titan, "--jobs", "1")
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "fresh"))      # the workers parse cold
    assert ranks_json(capsys, titan, "--jobs", "2") == one
    assert ranks_json(capsys, titan, "--jobs", "2") == one                   # and reopen the cache
    assert ranks_json(capsys, titan, "--no-cache", "--jobs", "2") == one
    assert not multiprocessing.active_children()


def test_a_dask_cluster_gives_what_one_process_gives(capsys, titan):
    distributed = pytest.importorskip("distributed")
    one = ranks_json(capsys, titan, "--jobs", "1")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
        assert ranks_json(capsys, titan, "--dask", cl.scheduler_address) == one


def test_a_second_run_opens_no_snapshot(titan, monkeypatch, tmp_path):
    """Each file's record (rank_cache.py) answers a second run; a file that changed, a
    damaged record, other code or --no-cache read the file again."""
    monkeypatch.setattr(rank_cache, "RACY_NS", 0)      # the files were written a moment ago
    first = read_ranks(str(titan), jobs=1)
    from vramscope.services import summary

    def boom(*a, **k):
        raise AssertionError("read again")
    real = rank_read.open_snapshot
    with monkeypatch.context() as m:
        for mod, name in ((rank_read, "live_envelope"), (summary, "summary_document")):
            m.setattr(mod, name, boom)
        # notes.txt is opened again (not a snapshot: nothing kept), no snapshot is
        m.setattr(rank_read, "open_snapshot", lambda p, **k: boom() if p.endswith(".pickle") else real(p, **k))
        again = read_ranks(str(titan), jobs=1)
        assert ranks_document(again) == ranks_document(first)
        res = read_ranks(str(titan), jobs=1, use_cache=False)        # every file read again (our bug: per rank)
        assert len(res.internal_errors) == 8 and not res.ranks
        assert all("internal error: AssertionError: read again" in n.error for n in res.internal_errors)
    records = sorted((tmp_path / "cache" / "ranks-v1").iterdir())
    assert len(records) == 8                             # the ranks read (not the skipped files)
    # a damaged record is a miss: the file is read again, the same
    records[0].write_bytes(records[0].read_bytes()[:-3] + b"xyz")
    calls = []
    monkeypatch.setattr(rank_read, "open_snapshot", lambda p, **k: (p.endswith(".pickle") and calls.append(p))
                        or real(p, **k))
    assert ranks_document(read_ranks(str(titan), jobs=1)) == ranks_document(first) and len(calls) == 1
    # a file written again (same content, new ctime) is read again
    f = titan / "step_4" / "000001_step_4.pickle"
    f.write_bytes(f.read_bytes())
    calls.clear()
    assert ranks_document(read_ranks(str(titan), jobs=1)) == ranks_document(first) and calls == [str(f)]


def test_a_record_from_elsewhere_is_checked(tmp_path):
    good = rank_read.to_record(rank_read.RankRead("x", None, 1, 8, 1, (1,), {"peak": {}}, rank_read.RankLive(
        "us", np.array([0, 5]), np.array([7]))))
    assert rank_read.from_record("x", good) is None                          # the summary lacks what ranks reads
    for bad in ({}, {"live": "x"}, {**good, "device": "1"}, {**good, "meta_rank": 1.5}):
        assert rank_read.from_record("x", bad) is None


def test_the_live_grid_keeps_every_peak(titan):
    res = read_ranks(str(titan), jobs=1)
    grid = live_grid(res, columns=300)
    assert grid.axis == "seconds" and grid.ranks == tuple(range(8)) and grid.values.shape == (8, 300)
    for i, r in enumerate(res.ranks):
        assert np.nanmax(grid.values[i]) == r.peak_bytes == int(r.live.high.max())
    (row, x), = grid.ooms
    assert row == 3 and grid.x0 <= x <= grid.x1
    start = min(int(r.live.edges[0]) for r in res.ranks)
    assert x == pytest.approx((res.ranks[3].first_oom_time_us - start) / 1e6)
    # the OOM rank stopped early: nothing recorded after its dump
    assert np.isnan(grid.values[3, -1]) and not np.isnan(grid.values[0, -1])


# -- ranks from names, metadata, order ---------------------------------------------------------
@pytest.mark.parametrize("relative, rank, step, exit_dump", [
    ("step_4/000003_step_4.pickle", 3, 4, False),
    ("step_4_exit/000003_step_4_exit.pickle", 3, 4, True),
    ("step_10/000012_step_10_exit.pickle", 12, 10, True),
    ("memory_snapshot/iteration_10/rank3_memory_snapshot.pickle", 3, 10, False),     # torchtitan before
    ("memory_snapshot/iteration_9_exit/rank3_memory_snapshot.pickle", 3, 9, True),
    ("memory.snapshot_rank-7.pickle", 7, None, False),                                # Megatron-LM
    ("memory.snapshot_oom_rank-1.pickle", 1, None, True),
    ("snapshot_oom_rank-12.pickle", 12, None, True),                                 # Megatron-Bridge
    ("mem_rank_2_step_6.pkl", 2, 6, False),
    ("snapshot.pickle", None, None, False),
    ("crankshaft5.pickle", None, None, False),
    ("zoom/snapshot.pickle", None, None, False),
])
def test_names_say_rank_step_and_failure(relative, rank, step, exit_dump):
    f = describe("/runs", relative)
    assert (f.rank, f.step, f.exit_dump) == (rank, step, exit_dump)
    assert f.path == "/runs/" + relative


def test_one_file_per_named_rank():
    files = [describe("d", p) for p in ("iteration_10/rank0_memory_snapshot.pickle",
                                        "iteration_20/rank0_memory_snapshot.pickle",
                                        "iteration_19_exit/rank0_memory_snapshot.pickle",
                                        "iteration_10/rank1_memory_snapshot.pickle",
                                        "iteration_20/rank1_memory_snapshot.pickle",
                                        "extra.pickle", "other.pickle")]
    kept, skipped = choose(files)
    assert [f.relative for f in kept] == ["iteration_19_exit/rank0_memory_snapshot.pickle",
                                          "iteration_20/rank1_memory_snapshot.pickle", "extra.pickle", "other.pickle"]
    assert sorted((s.rank, Path(s.path).parent.name) for s in skipped) == [
        (0, "iteration_10"), (0, "iteration_20"), (1, "iteration_10")]


def dist(rank, world=None) -> dict:
    """The recorder's metadata document, its `distributed` section (vramscope/recorder.py)."""
    return {"schema": 1, "distributed": {"rank": rank, **({"world_size": world} if world is not None else {})}}


def test_ranks_from_metadata_then_names_then_order(capsys, tmp_path):
    d = tmp_path / "job"
    rd.write(d / "a.pickle", rd.rank_object(0, metadata=dist(1, 4)))
    rd.write(d / "b.pickle", rd.rank_object(1, metadata=dist(0, 4)))
    rd.write(d / "snapshot_rank-9.pickle", rd.rank_object(2, metadata=dist(2, 4)))  # metadata wins
    for k, bad in enumerate((dist("3"), dist(-1), dist(True), dist(1 << 40), [3])):
        rd.write(d / f"z{k}.pickle", rd.rank_object(3, metadata=bad))      # untrusted: ignored, numbered in order
    doc = ranks_json(capsys, d)
    got = {Path(r["file"]).name: (r["rank"], r["rank_source"]) for r in doc["ranks"]}
    assert got == {"a.pickle": (1, "metadata"), "b.pickle": (0, "metadata"),
                   "snapshot_rank-9.pickle": (2, "metadata"),
                   "z0.pickle": (3, "order"), "z1.pickle": (4, "order"), "z2.pickle": (5, "order"),
                   "z3.pickle": (6, "order"), "z4.pickle": (7, "order")}
    code, out, _ = run(capsys, "ranks", d)
    assert "ranks 3, 4, 5, 6, 7 are guesses" in out and "rank guessed" in out
    assert "8 ranks of 4" in out.splitlines()[0]


def test_metadata_naming_one_rank_twice_keeps_the_preferred_file(capsys, tmp_path):
    d = tmp_path / "job"
    rd.write(d / "step_1" / "x.pickle", rd.rank_object(0, metadata=dist(0)))
    rd.write(d / "step_2" / "y.pickle", rd.rank_object(0, metadata=dist(0)))
    doc = ranks_json(capsys, d)
    assert [Path(r["file"]).parent.name for r in doc["ranks"]] == ["step_2"]
    assert [(Path(s["file"]).parent.name, s["rank"]) for s in doc["skipped"]] == [("step_1", 0)]


def test_oom_order_and_an_unknown_first(capsys, tmp_path):
    d = tmp_path / "run"
    cap = rd.normal_reserved_peak()
    objs = {r: rd.rank_object(r, oom_iteration={2: 1, 6: 3}.get(r), capacity=cap if r in (2, 6) else None)
            for r in range(4)}
    objs[6] = rd.rank_object(6, oom_iteration=3, capacity=cap)
    for r, obj in objs.items():
        rd.write(d / f"rank{r}.pickle", obj)
    doc = ranks_json(capsys, d)
    assert doc["overview"]["first_oom"]["rank"] == 2
    code, out, _ = run(capsys, "ranks", d)
    assert "first OOM: rank 2" in out and "then rank 6 (+" in out
    # without times, which rank ran out first is not known: no guess
    for e in objs[6]["device_traces"][6]:
        e.pop("time_us", None)
    rd.write(d / "rank6.pickle", objs[6])
    doc = ranks_json(capsys, d)
    assert doc["overview"]["first_oom"] is None
    assert [r["rank"] for r in doc["ranks"] if r["ooms"]] == [2, 6]
    code, out, _ = run(capsys, "ranks", d)
    assert "2 ranks ran out of memory (2, 6); which was first is unknown" in out
    grid = live_grid(read_ranks(str(d), jobs=1), 64)
    assert grid.axis == "fraction" and grid.x1 == 1.0


def test_outlier_rule():
    assert outliers({0: 100, 1: 100}) == ()                                   # two ranks cannot tell
    assert outliers({k: 100 for k in range(8)}) == ()
    assert outliers({**{k: 100 for k in range(7)}, 7: 104}) == ()            # within 5% of the median
    assert outliers({**{k: 100 for k in range(7)}, 7: 106}) == (7,)
    assert outliers({**{k: 100 for k in range(7)}, 7: 60}) == (7,)          # a light rank stands out too
    spread = {k: 1000 + 40 * k for k in range(8)}                             # a steady spread: MAD 80
    assert outliers(spread) == ()
    assert outliers({**spread, 8: 1140 + 5.2 * 80 + 20}) == (8,)
    # pipeline stages: two groups, none stands out
    assert outliers({k: 100 if k < 4 else 200 for k in range(8)}) == ()


# -- bad input, usage, interruption -------------------------------------------------------------
def test_usage_and_bad_input(capsys, tmp_path, titan):
    def one_line(code, err, want_code):
        assert code == want_code and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (code, err)
        return err
    code, _, err = run(capsys, "ranks", tmp_path / "nope")
    assert "no such folder" in one_line(code, err, 2)
    f = titan / "step_4" / "000000_step_4.pickle"
    code, _, err = run(capsys, "ranks", f)
    assert "is a file, not a folder" in one_line(code, err, 2)
    for bad in ("0", "-2", "two"):
        code, _, err = run(capsys, "ranks", titan, "--jobs", bad)
        assert "--jobs" in one_line(code, err, 2)
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "ranks", tmp_path / "empty")
    assert "no snapshot found (the folder has no files)" in one_line(code, err, 3)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.pickle").write_bytes(b"\x80\x04\x95" + b"\0" * 5)
    (junk / "b.txt").write_text("hello")
    code, out, err = run(capsys, "ranks", junk, "--json")
    assert code == 3 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 3 and lines[-1].endswith("no snapshot found (2 files could not be read)")
    assert "a.pickle: truncated" in lines[0] and "b.txt: not a pickle" in lines[1]


def test_dask_missing_is_one_line(capsys, titan, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)      # import distributed -> ImportError
    code, out, err = run(capsys, "ranks", titan, "--dask", "tcp://127.0.0.1:1")
    assert code == 2 and out == ""
    assert err.strip() == "vramscope ranks: error: --dask needs dask.distributed: pip install 'vramscope[dask]'"


@pytest.fixture
def bad_addresses(tmp_path):
    """Addresses that are no Dask scheduler, each with the words its one line must hold: an
    HTTP server's port (the dashboard's, a common mistake), a server that answers HTTP at
    once (a proxy), tls:// without Dask's TLS settings, a nonsense address, a closed port,
    another scheme, a name nobody knows. Nothing starts without Dask (its handshake needs
    msgpack, which comes with it)."""
    pytest.importorskip("distributed")
    import http.server
    import socket
    import threading
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(8)

    def answer_http():
        while True:
            try:
                c, _ = proxy.accept()
            except OSError:
                return
            c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            c.close()
    threading.Thread(target=answer_http, daemon=True).start()
    mute = socket.socket()                  # Dask's handshake, then nothing (a peer that is no scheduler)
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)

    def handshake_then_nothing():
        import struct

        import msgpack
        hello = msgpack.dumps({"compression": None, "python": [3, 11, 7], "pickle-protocol": 5})
        message = struct.pack("=QQ", 1, len(hello)) + hello
        held = []
        while True:
            try:
                c, _ = mute.accept()
            except OSError:
                return
            c.sendall(struct.pack("=Q", len(message)) + message)
            held.append(c)
    threading.Thread(target=handshake_then_nothing, daemon=True).start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    http_port, proxy_port = web.server_address[1], proxy.getsockname()[1]
    yield [(f"tcp://127.0.0.1:{http_port}", "sent no Dask handshake within 5 s (an HTTP port"),
           (f"127.0.0.1:{http_port}", "sent no Dask handshake"),
           (f"tcp://127.0.0.1:{proxy_port}", "it sent b'HTTP/1.1', not a Dask message"),
           ("tls://127.0.0.1:8786", "tls:// needs Dask's TLS settings"),
           ("nonsense", "expected a scheduler address such as tcp://HOST:8786"),
           (f"tcp://127.0.0.1:{closed_port}", "cannot connect: Connection refused"),
           (f"http://127.0.0.1:{http_port}", "the scheme http:// is not one vramscope connects with"),
           ("tcp://no-such-host.invalid:8786", "is not known"),
           (f"tcp://127.0.0.1:{mute.getsockname()[1]}", "sent Dask's handshake, then no answer to `identity`")]
    web.shutdown()
    proxy.close()
    mute.close()


def test_a_bad_dask_address_is_one_line_and_exit_2_within_15_s(titan, tmp_path, bad_addresses):
    """Before any work, every bad address: one line, exit 2, no traceback and no
    "Exception ignored" (the command line as a user runs it, stderr whole)."""
    pytest.importorskip("distributed")
    env = dict(os.environ, VRAMSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    for address, words in bad_addresses:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "vramscope", "ranks", str(titan), "--dask", address], env=env,
                           capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1, (address, p.stderr)
        assert p.stderr.startswith("vramscope ranks: error: ") and words in p.stderr, (address, p.stderr)
        assert took < 15, (address, took)
    assert not (tmp_path / "cache").exists()          # no file was read: the address came first


def test_dask_from_another_working_directory_with_a_relative_folder(tmp_path, monkeypatch):
    """The workers of a real cluster run elsewhere: a LocalCluster started from one folder
    (its workers' working directory), `ranks runs/mb --dask` run from another, where the
    relative folder is. The workers get absolute, resolved paths and read every rank; the
    result is the one `--jobs 1` gives, file names as given."""
    distributed = pytest.importorskip("distributed")
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    for r in range(3):
        rd.write(work / "runs" / "mb" / f"rank{r}.pickle", rd.rank_object(r, iterations=1))
    env = dict(os.environ, VRAMSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    monkeypatch.chdir(elsewhere)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cl, distributed.Client(cl) as client:
        assert set(client.run(os.getcwd).values()) == {str(elsewhere)}
        monkeypatch.chdir(work)
        worker = subprocess.run([sys.executable, "-m", "vramscope", "ranks", "runs/mb", "--dask",
                                 next(iter(client.scheduler_info()["workers"]))], env=env, capture_output=True,
                                text=True, timeout=60)
        assert worker.returncode == 2 and worker.stderr.endswith("it is a Dask worker's address, not the "
                                                                 "scheduler's\n"), worker.stderr
        one = subprocess.run([sys.executable, "-m", "vramscope", "ranks", "runs/mb", "--json", "--jobs", "1",
                              "--no-cache"], env=env, capture_output=True, text=True, timeout=120)
        dask = subprocess.run([sys.executable, "-m", "vramscope", "ranks", "runs/mb", "--json", "--no-cache",
                               "--dask", cl.scheduler_address], env=env, capture_output=True, text=True, timeout=120)
    assert (one.returncode, one.stderr) == (0, "")
    assert (dask.returncode, dask.stderr) == (0, ""), dask.stderr
    doc = orjson.loads(dask.stdout)
    assert doc == orjson.loads(one.stdout)
    assert [r["file"] for r in doc["ranks"]] == [f"runs/mb/rank{r}.pickle" for r in range(3)]
    assert doc["not_snapshots"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_on_dask(big, tmp_path):
    """Ctrl-C while a Dask cluster reads the ranks: `interrupted`, exit 130, nothing else on
    stderr (no log line of Dask's), the tasks cancelled."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cl, distributed.Client(cl) as client:
        p = subprocess.Popen([sys.executable, "-m", "vramscope", "ranks", str(big), "--no-cache", "--dask",
                              cl.scheduler_address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, env=dict(os.environ, VRAMSCOPE_CACHE_DIR=str(tmp_path / "c")))

        def tasks():
            return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        deadline = time.monotonic() + 60
        while tasks() == 0 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert (p.returncode, out, err.decode()) == (130, b"", "vramscope ranks: interrupted\n")
        deadline = time.monotonic() + 10
        while tasks() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tasks() == 0                                  # cancelled, not left running


@pytest.mark.parametrize("jobs", [1, 2])
def test_cancel_stops_the_work(titan, jobs):
    progress = Progress()
    progress.cancel()
    with pytest.raises(Cancelled):
        read_ranks(str(titan), jobs=jobs, progress=progress)
    seen = []

    def cancel_after_one(label, done, total):
        seen.append(done)
        if done >= 1:
            later.cancel()
    later = Progress(cancel_after_one, min_interval=0)
    with pytest.raises(Cancelled):
        read_ranks(str(titan), jobs=jobs, progress=later)
    assert max(seen) < 9
    assert not multiprocessing.active_children()


# Loaded into every process of a `ranks` run through PYTHONPATH: in a worker process (spawned
# with --multiprocessing-fork), reading a file whose name holds "poison" kills the worker as
# the kernel's OOM killer would (SIGKILL, no answer); with ONCE set, only the first time. In
# the parent, every read is slowed so that the workers, not the parent, take the first files.
KILLER = """
import os, signal, sys, time
worker = "--multiprocessing-fork" in sys.argv          # spawn replaces sys.argv with the parent's later
if worker or os.environ.get("VRAMSCOPE_TEST_PARENT_SLOW"):
    from vramscope.services import rank_read
    real = rank_read.open_snapshot
    def open_snapshot(path, **kw):
        if not worker:
            time.sleep(0.5)
        elif "poison" in path:
            once = os.environ.get("VRAMSCOPE_TEST_ONCE")
            if not once or not os.path.exists(once):
                if once:
                    open(once, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return real(path, **kw)
    rank_read.open_snapshot = open_snapshot
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a worker killed by SIGKILL")
@pytest.mark.parametrize("once", [False, True])
def test_a_worker_killed_is_an_internal_error_of_its_rank_alone(tmp_path, once):
    """A worker killed while reading (the OOM killer) breaks its pool: the files in flight are
    read again, each by a worker of its own. A file that kills that one too is an internal
    error of its rank (listed, exit 4), and every other rank is read and counted; a file
    whose worker died once (another file's fault, or a passing kill) is read the second time."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILLER)
    job = tmp_path / "job"
    rd.write(job / "a_poison.pickle", rd.rank_object(0, iterations=1))
    for r in range(1, 6):
        rd.write(job / f"rank{r}.pickle", rd.rank_object(r, iterations=1))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
               VRAMSCOPE_TEST_PARENT_SLOW="1", VRAMSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    if once:
        env["VRAMSCOPE_TEST_ONCE"] = str(tmp_path / "killed-once")
    p = subprocess.run([sys.executable, "-m", "vramscope", "ranks", str(job), "--json", "--jobs", "3"],
                       capture_output=True, text=True, env=env, timeout=120)
    doc = orjson.loads(p.stdout)
    poison = str(job / "a_poison.pickle")
    read = sorted(Path(r["file"]).name for r in doc["ranks"])
    if once:
        assert (tmp_path / "killed-once").exists(), "no worker read the poisoned file"
        assert (p.returncode, p.stderr, doc["internal_errors"]) == (0, "", [])
        assert read == ["a_poison.pickle"] + [f"rank{r}.pickle" for r in range(1, 6)]
        return
    assert p.returncode == 4, p.stderr
    assert doc["internal_errors"] == [{"file": poison, "error": rank_read.WORKER_DIED}]
    assert p.stderr == f"vramscope ranks: {poison}: {rank_read.WORKER_DIED}\n"
    assert read == [f"rank{r}.pickle" for r in range(1, 6)] and doc["overview"]["ranks"] == 5
    assert "please report it" in rank_read.WORKER_DIED


def _session_processes(sid: int) -> list[int]:
    """The processes still alive in session `sid` (Linux /proc)."""
    left = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                left.append(int(d))
    return left


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """24 ranks of 10^5 events (one file, linked 24 times): about 0.5 s each to parse here."""
    sys.path.insert(0, str(rd.DATA.parent.parent / "benchmarks"))
    try:
        import gen_snapshot
    finally:
        sys.path.pop(0)
    big = tmp_path_factory.mktemp("ctrl-c") / "big"
    big.mkdir()
    gen_snapshot.generate(str(big / "rank0.pickle"), 100_000, seed=1)
    for r in range(1, 24):
        os.link(big / "rank0.pickle", big / f"rank{r}.pickle")
    return big


def _ctrl_c(folder: Path, moment) -> tuple[int, bytes, str, list[int]]:
    """`ranks FOLDER --jobs 2` in a session of its own, Ctrl-C (SIGINT to the whole process
    group, as a terminal sends it) once `moment(pid)` says so; (exit code, stdout, stderr,
    the session's processes still alive 10 s later)."""
    for _attempt in range(5):
        # (a short moment, a worker between its start and its initializer, can pass unseen
        # between two looks on a loaded machine: then the run is made again)
        p = subprocess.Popen([sys.executable, "-m", "vramscope", "ranks", str(folder), "--no-cache", "--jobs", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 60
        while not moment(p.pid) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        if p.poll() is None:
            break
        p.communicate()
    assert p.poll() is None, "the run ended before the moment came, five times"
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while _session_processes(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return p.returncode, out, err.decode(), _session_processes(p.pid)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _workers(pid: int) -> list[int]:
    """The spawned worker processes of the session (not the resource tracker)."""
    return [q for q in _session_processes(pid) if q != pid and "--multiprocessing-fork" in _read(f"/proc/{q}/cmdline")]


def _sigint(q: int, field: str) -> bool:
    """Whether /proc/Q/status's mask `field` (SigIgn, SigCgt, SigBlk) holds SIGINT."""
    mask = next((ln.split()[1] for ln in _read(f"/proc/{q}/status").splitlines() if ln.startswith(field + ":")), "0")
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


def _ignores_ctrl_c(q: int) -> bool:
    return _sigint(q, "SigIgn")


MOMENTS = {
    # importing: numpy's extension is being loaded (vramscope.cli imports it before main runs)
    "importing": lambda pid: "_multiarray_umath" in _read(f"/proc/{pid}/maps"),
    # spawning: a worker's interpreter is up (it installed Python's Ctrl-C handler, so a Ctrl-C
    # it received would be a KeyboardInterrupt and a traceback) and it is still importing
    # (its initializer, which ignores Ctrl-C, has not run)
    "spawning": lambda pid: any(_sigint(q, "SigCgt") and not _ignores_ctrl_c(q) for q in _workers(pid)),
    # reading: the worker started (its initializer ran) and has been given files
    "reading": lambda pid: any(_ignores_ctrl_c(q) for q in _workers(pid)) and (time.sleep(1.0) or True),
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_at_any_moment_of_a_two_process_run(big, moment):
    """Ctrl-C while the command line imports, while a worker is being spawned (before its
    interpreter has imported anything of ours) and while the workers read: `interrupted`,
    exit 130, nothing else on stderr (no worker's traceback), no process left behind."""
    code, out, err, left = _ctrl_c(big, MOMENTS[moment])
    assert (code, out, err, left) == (130, b"", "vramscope ranks: interrupted\n", [])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_workers(big):
    """Ctrl-C in a terminal (SIGINT to the whole process group) while two workers parse:
    one line, exit 130, and no process left behind."""
    p = subprocess.Popen([sys.executable, "-m", "vramscope", "ranks", str(big), "--no-cache", "--jobs", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(2.0)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out, err.decode()) == (130, b"", "vramscope ranks: interrupted\n")
    deadline = time.monotonic() + 10
    while _session_processes(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_processes(p.pid) == []


def test_an_error_raised_while_a_ctrl_c_unwinds_is_the_ctrl_c(tmp_path, monkeypatch, capsys):
    """Cleaning up after a Ctrl-C can fail in turn, and that error replaces the interrupt: it
    said 'internal error' (exit 4, and a rank listed as one) where the user had pressed Ctrl-C."""
    from vramscope.cli import _main
    from vramscope.common.interrupts import came_from_interrupt
    from vramscope.services import rank_read

    def unwinding(*a, **k):
        try:
            raise KeyboardInterrupt
        finally:
            raise ValueError("I/O operation on closed file")    # what a writer thread's join raised
    with pytest.raises(ValueError) as got:
        unwinding()
    assert came_from_interrupt(got.value) and not came_from_interrupt(ValueError("a bug"))
    monkeypatch.setattr(rank_read, "_read_rank", unwinding)
    with pytest.raises(KeyboardInterrupt):
        rank_read.read_rank(str(tmp_path / "rank0.pickle"))
    from vramscope.cli import summary as summary_cli
    monkeypatch.setattr(summary_cli, "run", unwinding)
    assert _main(["summary", str(rd.DATA / "oom.pickle")]) == 130
    assert capsys.readouterr().err == "vramscope summary: interrupted\n"
