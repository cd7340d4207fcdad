"""`vramscope.record` with torch's CUDA memory calls replaced by a recorder of calls
(tests/fake_torch.py): the order of the calls, the OOM path, the files it writes.

These run without torch (a fake `torch` module is put in sys.modules), as CI runs them;
`_snapshot()` returns a real CUDA snapshot (tests/data/cuda_oom.pickle), so the files are
checked against the same file read directly. torch's own memory_viz reads them where
torch is installed.
"""
from __future__ import annotations

import os
import pickle
import pickletools
import sys
import warnings

import pytest

import vramscope
from vramscope import recorder
from vramscope.parsers import open_snapshot

from fake_torch import BF16, F32, U8, FakeAdamW, FakeCuda, FakeModel, FakeOutOfMemoryError, FakeTensor
from helpers import DATA

# The opcodes memory_viz's JavaScript unpickler knows (torch/utils/viz/MemoryViz.js, `unpickle`):
# a file with any other opcode, or of protocol 5, shows a blank page there.
MEMORY_VIZ_OPCODES = {
    "PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MARK", "STOP",
    "EMPTY_DICT", "SETITEM", "SETITEMS", "DICT", "EMPTY_LIST", "APPEND", "APPENDS", "LIST", "EMPTY_TUPLE",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SHORT_BINUNICODE", "BINUNICODE", "BININT", "BININT1", "BININT2",
    "LONG1", "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE",
}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    f = FakeCuda.from_fixture("cuda_oom.pickle")
    f.install(monkeypatch)
    return f


def model_and_optimizer():
    model = FakeModel(FakeTensor(32_768, F32, requires_grad=True), FakeTensor(5_000_000, BF16),
                      FakeTensor(200_000, U8))
    return model, FakeAdamW(model)


def relfiles(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


# -- the order of calls ---------------------------------------------------------------------------
def test_history_before_the_model_observer_after_recording_dumps_every_n_and_stops(fake, tmp_path):
    out = tmp_path / "memory_snapshot"
    with vramscope.record(out, every=2) as rec:
        fake.mark("model built")
        model, opt = model_and_optimizer()
        rec.watch(model, opt, micro_batch=8, seq_len=256)
        for _ in range(5):
            opt.step()
            rec.step()
    assert fake.names() == ["history", "attach", "mark:model built", "snapshot", "snapshot", "snapshot", "history"]
    start, stop = fake.calls[0][1], fake.calls[-1][1]
    assert start == {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 100_000}
    assert stop["enabled"] is None
    # steps 2 and 4, then the last step (5) at exit
    assert relfiles(out) == ["step_000000000002/000000_step_2.pickle", "step_000000000004/000000_step_4.pickle",
                             "step_000000000005/000000_step_5.pickle"]
    assert [os.path.relpath(f, out) for f in rec.files] == relfiles(out)
    assert [open_snapshot(f, use_cache=False).metadata.reason for f in rec.files] == ["step", "step", "exit"]


def test_no_exit_dump_when_the_last_step_was_dumped_or_when_turned_off(fake, tmp_path):
    with vramscope.record(tmp_path / "a", every=2) as rec:
        rec.step()
        rec.step()
    assert relfiles(tmp_path / "a") == ["step_000000000002/000000_step_2.pickle"]
    with vramscope.record(tmp_path / "b", dump_on_exit=False) as rec:
        rec.step()
    assert not (tmp_path / "b").exists() and rec.files == []


def test_oom_dumps_from_the_observer_before_the_error_unwinds(fake, tmp_path):
    out = tmp_path / "snap"
    fake.watch_dir = str(out)
    with pytest.raises(FakeOutOfMemoryError):
        with vramscope.record(out, every=10) as rec:
            model, opt = model_and_optimizer()
            rec.watch(model, opt)
            rec.step()
            rec.step()
            fake.oom(requested=3 << 30)
    # the file was complete when the allocator raised; the exit did not dump it again
    assert fake.files_at_oom == ["step_000000000002_exit/000000_step_2.pickle"]
    assert fake.names() == ["history", "attach", "oom", "snapshot", "raise", "history"]
    meta = open_snapshot(rec.files[0], use_cache=False).metadata
    assert meta.reason == "oom" and meta.step == 2
    assert meta.oom.requested == 3 << 30 and meta.oom.device == 0 and meta.oom.device_free == 12 << 20
    assert meta.oom.device_total == 80 << 30            # the observer's third argument, named as torch names it
    with open(rec.files[0], "rb") as fh:
        assert set(pickle.load(fh)["vramscope_metadata"]["oom"]) == {"device", "requested", "device_total",
                                                                      "device_free"}   # our own file


def test_one_oom_snapshot_per_step_and_the_run_goes_on(fake, tmp_path):
    """A loop that catches the OOM and retries smaller (a batch-size finder) gets one file
    per step, not one per attempt."""
    with vramscope.record(tmp_path, dump_on_exit=False) as rec:
        for _ in range(3):
            with pytest.raises(FakeOutOfMemoryError):
                fake.oom()
        rec.step()
        with pytest.raises(FakeOutOfMemoryError):
            fake.oom()
    assert relfiles(tmp_path) == ["step_000000000000_exit/000000_step_0.pickle", "step_000000000001_exit/000000_step_1.pickle"]


def test_without_an_oom_observer_the_exit_dumps_the_oom(fake, tmp_path, monkeypatch):
    monkeypatch.delattr(sys.modules["torch"]._C, "_cuda_attach_out_of_memory_observer")
    with pytest.warns(RuntimeWarning, match="no OOM observer"):
        with pytest.raises(FakeOutOfMemoryError):
            with vramscope.record(tmp_path) as rec:
                rec.step()
                fake.oom()
    assert fake.names() == ["history", "oom", "raise", "snapshot", "history"]
    assert relfiles(tmp_path) == ["step_000000000001_exit/000000_step_1.pickle"]
    assert open_snapshot(rec.files[0], use_cache=False).metadata.reason == "oom"


def test_another_exception_stops_recording_without_a_dump(fake, tmp_path):
    with pytest.raises(KeyError):
        with vramscope.record(tmp_path):
            raise KeyError("not memory")
    assert fake.names() == ["history", "attach", "history"] and not relfiles(tmp_path)


def test_the_observer_is_attached_once_per_process(fake, tmp_path):
    for k in range(3):
        with vramscope.record(tmp_path / str(k), dump_on_exit=False):
            pass
    assert fake.names().count("attach") == 1
    with pytest.raises(FakeOutOfMemoryError):       # and it serves the recorder of the moment
        with vramscope.record(tmp_path / "last") as rec:
            fake.oom()
    assert len(rec.files) == 1 and "last" in rec.files[0]


def test_decorator_with_and_without_arguments(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    @vramscope.record(tmp_path / "dec", dump_on_exit=False)
    def train():
        fake.mark("body")

    @vramscope.record
    def bare():
        fake.mark("bare")

    train()
    bare()
    assert fake.names() == ["history", "attach", "mark:body", "history", "history", "mark:bare", "snapshot",
                            "history"]
    assert relfiles(tmp_path / "memory_snapshot") == ["step_000000000000/000000_step_0.pickle"]


def test_a_second_recorder_takes_over_with_a_warning(fake, tmp_path):
    first = vramscope.record(tmp_path / "1", dump_on_exit=False).start()
    with pytest.warns(RuntimeWarning, match="another recorder"):
        second = vramscope.record(tmp_path / "2", dump_on_exit=False).start()
    assert not first.recording and second.recording
    second.stop()
    assert fake.names() == ["history", "attach", "history", "history", "history"]


def test_without_cuda_nothing_is_recorded_and_the_run_goes_on(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules["torch"].cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="CUDA is not available"):
        with vramscope.record(tmp_path, every=1) as rec:
            assert rec.step() is None and rec.dump() is None
    assert fake.calls == [] and not relfiles(tmp_path)


def test_the_warning_points_at_the_users_line(fake, tmp_path, monkeypatch):
    """`with`, the decorator and start(): the no-CUDA warning names this file and the line
    that started recording (warnings.warn's stacklevel past vramscope and contextlib)."""
    monkeypatch.setattr(sys.modules["torch"].cuda, "is_available", lambda: False)
    here = sys._getframe().f_code.co_filename

    def warned(run) -> tuple[str, int]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = run()
        [w] = [w for w in caught if "CUDA is not available" in str(w.message)]
        return (w.filename, w.lineno), (here, line)

    def with_block():
        with vramscope.record(tmp_path):
            return sys._getframe().f_lineno - 1

    @vramscope.record(tmp_path)
    def decorated():
        pass

    def decorator():
        decorated()
        return sys._getframe().f_lineno - 1

    def start():
        vramscope.Recorder(tmp_path).start()
        return sys._getframe().f_lineno - 1
    for run in (with_block, decorator, start):
        got, want = warned(run)
        assert got == want, run.__name__


def test_bounded_defaults_and_bad_options():
    rec = vramscope.record()
    assert (rec.stacks, rec.max_entries, rec.out_dir) == ("python", 100_000, "memory_snapshot")
    for bad in ({"max_entries": None}, {"max_entries": 0}, {"stacks": "cpp"}, {"every": 0}):
        with pytest.raises(ValueError):
            vramscope.record("x", **bad)


# -- the files -----------------------------------------------------------------------------------
def test_files_are_protocol_4_memory_viz_opcodes_with_the_metadata_and_open_in_vramscope(fake, tmp_path):
    with vramscope.record(tmp_path, every=1) as rec:
        model, opt = model_and_optimizer()
        rec.watch(model, opt, micro_batch=8, seq_len=256)
        opt.step()
        rec.step()
    path = rec.files[0]
    raw = open(path, "rb").read()
    assert raw[:2] == b"\x80\x04"
    assert {op.name for op, _, _ in pickletools.genops(raw)} <= MEMORY_VIZ_OPCODES
    doc = pickle.loads(raw)
    assert list(doc)[-1] == "vramscope_metadata"      # after torch's keys: readers find those first
    original = vramscope.open(DATA / "cuda_oom.pickle", use_cache=False)
    written = vramscope.open(path, use_cache=False)
    # the same analysis, but for what the metadata makes exact: the run's profile (its
    # parameter counts: frozen weights seen, the trainable share) and the levers it rules out
    def same(doc):
        return [{**d, "run": None, "peak": {**d["peak"], "advice_left_out": None, "advice": None},
                 "ooms": [{**o, "advice": None, "suggestion": None, "suggestions": None} for o in d["ooms"]]}
                for d in doc["devices"]]
    assert same(written.summary()) == same(original.summary())
    assert written.analysis.devices[0].run.trainable_share == pytest.approx(32_768 / 5_232_768)
    m = written.metadata
    assert (m.schema, m.writer, m.torch_version, m.cuda_version) == (1, f"vramscope {vramscope.__version__}",
                                                                    "2.13.0+fake", "12.8")
    assert (m.device, m.gpu_name, m.gpu_total_memory) == (0, "NVIDIA H100 80GB HBM3", 85_520_809_984)
    assert (m.rank, m.world_size, m.rank_source, m.allocator_backend) == (0, 1, "single process", "native")
    assert m.trainable_params == 32_768 and m.trainable_bytes == 4 * 32_768
    assert [(p.dtype, p.count, p.bytes) for p in m.frozen] == [("bfloat16", 5_000_000, 10_000_000),
                                                               ("uint8", 200_000, 200_000)]
    assert (m.optimizer, m.optimizer_state_dtype, m.optimizer_state_bytes) == (
        "torch.optim.adamw.AdamW", "float32", 2 * 4 * 32_768)        # Adam's scalar `step` left out
    assert (m.micro_batch, m.seq_len, m.step, m.reason) == (8, 256, 1, "step")
    assert (m.stacks, m.context, m.max_entries, m.params_not_on_gpu, m.dropped) == ("python", "all", 100_000, 0, ())


def test_writes_are_atomic(fake, tmp_path, monkeypatch):
    """A dump that fails halfway leaves neither a partial file nor a temporary one."""
    with vramscope.record(tmp_path, dump_on_exit=False) as rec:
        monkeypatch.setattr(fake, "snapshot_dict", {**fake.snapshot_dict, "bad": lambda: None})
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            rec.dump()
        with pytest.warns(RuntimeWarning, match="snapshot at the OOM was not written"):   # never into the allocator
            with pytest.raises(FakeOutOfMemoryError):
                fake.oom()
    assert relfiles(tmp_path) == []
    assert fake.names()[-3:] == ["snapshot", "raise", "history"]


def test_file_names_per_rank(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    with vramscope.record(tmp_path, dump_on_exit=False) as rec:
        rec.dump()
        fake.dist = (5, 16)                       # torch.distributed initialised after recording began
        rec.step()
        rec.dump()
    assert relfiles(tmp_path) == ["step_000000000000/000003_step_0.pickle", "step_000000000001/000005_step_1.pickle"]
    env, dist = (open_snapshot(f, use_cache=False).metadata for f in rec.files)
    assert (env.rank, env.world_size, env.local_rank, env.rank_source) == (3, 8, 3, "env RANK")
    assert (dist.rank, dist.world_size, dist.rank_source) == (5, 16, "torch.distributed")
    assert rec.path_for(7, exit=True, rank=12) == os.path.join(str(tmp_path), "step_000000000007_exit",
                                                               "000012_step_7.pickle")


def test_the_layout_is_torchtitans_exactly(fake, tmp_path):
    """torchtitan/tools/profiler.py: MEMORY_STEP_DIR = "step_{step:012d}", MEMORY_EXIT_DIR =
    "step_{step:012d}_exit", MEMORY_FILE = "{rank:06d}_step_{step}.pickle" (the OOM dump keeps
    the file name); the padded folders sort in step order (step_10 after step_9)."""
    with vramscope.record(tmp_path, every=1, dump_on_exit=False) as rec:
        for _ in range(10):
            rec.step()
        with pytest.raises(FakeOutOfMemoryError):
            fake.oom()
    folders = sorted(os.listdir(tmp_path))
    assert folders == [f"step_{n:012d}" for n in range(1, 11)] + ["step_000000000010_exit"]
    assert [os.path.relpath(f, tmp_path) for f in rec.files[-2:]] == [
        "step_000000000010/000000_step_10.pickle", "step_000000000010_exit/000000_step_10.pickle"]
    titan = {"MEMORY_STEP_DIR": "step_{step:012d}", "MEMORY_EXIT_DIR": "step_{step:012d}_exit",
             "MEMORY_FILE": "{rank:06d}_step_{step}.pickle"}
    for step, exit_dump in ((3, False), (10, True)):
        folder = titan["MEMORY_EXIT_DIR" if exit_dump else "MEMORY_STEP_DIR"].format(step=step)
        assert rec.path_for(step, exit=exit_dump, rank=2) == os.path.join(
            str(tmp_path), folder, titan["MEMORY_FILE"].format(rank=2, step=step))


def test_an_explicit_path_and_the_allocator_settings(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with vramscope.record(tmp_path / "unused", dump_on_exit=False) as rec:
        p = rec.dump(tmp_path / "here.pickle")
    assert p == str(tmp_path / "here.pickle") and relfiles(tmp_path) == ["here.pickle"]
    assert open_snapshot(p, use_cache=False).metadata.allocator_conf == "expandable_segments:True"


def test_metadata_collection_never_breaks_the_run(fake, tmp_path):
    class Broken:
        def parameters(self):
            raise RuntimeError("a model that cannot list its parameters")
    with vramscope.record(tmp_path, dump_on_exit=False) as rec:
        rec.watch(Broken(), object())
        path = rec.dump()
    m = open_snapshot(path, use_cache=False).metadata
    assert m.trainable is None and m.optimizer == "builtins.object" and m.step == 0


def test_torch_memory_viz_reads_what_record_writes(fake, tmp_path):
    with vramscope.record(tmp_path, dump_on_exit=False) as rec:
        model, opt = model_and_optimizer()
        rec.watch(model, opt)
        path = rec.dump()
    sys.modules.pop("torch")        # the real torch from here on, if it is installed
    viz = pytest.importorskip("torch.cuda._memory_viz")
    with open(path, "rb") as fh:
        data = pickle.load(fh)      # our own file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for plot in (viz.segment_plot, viz.trace_plot):
            html = plot(data)
            assert "<html" in html.lower() and len(html) > 100_000     # the snapshot embedded
        assert "Active Memory Timeline" in viz.trace_plot(data)
        # their flame graphs as folded lines (the default would download flamegraph.pl)
        folded = {"format_flamegraph": lambda lines, *a, **k: lines}
        assert viz.memory(data, **folded).count("\n") > 10 and viz.segments(data, **folded).count("\n") > 10
        assert "Summary of segments" in viz.segsum(data)
