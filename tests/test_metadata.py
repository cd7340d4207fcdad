"""The recorder's metadata document: read safely (every field checked, bad values dropped,
never fatal), kept through the cache, and used by the budget and the levers (exact
parameter counts and dtypes, said to come from the recorder's metadata)."""
from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vramscope
from vramscope.classifiers import analyze
from vramscope.classifiers.budget import budget
from vramscope.parsers import METADATA_KEY, open_snapshot, read_metadata

from helpers import DATA

GOOD = {
    "schema": 1, "writer": "vramscope 0.1.0", "torch": "2.13.0+cu128", "cuda": "12.8",
    "device": {"index": 0, "name": "NVIDIA H100 80GB HBM3", "total_memory": 85_520_809_984},
    "distributed": {"rank": 3, "world_size": 8, "local_rank": 3, "source": "torch.distributed"},
    "allocator": {"conf": "expandable_segments:True", "backend": "native"},
    "parameters": {"trainable": {"float32": {"count": 32_768, "bytes": 131_072}},
                   "frozen": {"float32": {"count": 5_261_568, "bytes": 21_046_272}},
                   "not_on_gpu": {"count": 0, "bytes": 0}},
    "optimizer": {"class": "torch.optim.adamw.AdamW", "state_dtype": "float32", "state_bytes": 262_144},
    "batch": {"micro_batch": 8, "seq_len": 256},
    "dump": {"step": 4, "reason": "step", "time_us": 1_767_225_600_000_000},
    "recording": {"stacks": "python", "context": "all", "max_entries": 100_000},
}


def with_metadata(tmp_path, doc, fixture="cuda_lora.pickle", name="m.pickle") -> str:
    with open(DATA / fixture, "rb") as fh:
        snap = pickle.load(fh)      # our own committed file
    snap[METADATA_KEY] = doc
    out = tmp_path / name
    out.write_bytes(pickle.dumps(snap, protocol=4))
    return str(out)


def test_a_good_document_reads_whole():
    m = read_metadata(GOOD)
    assert m.dropped == ()
    assert (m.rank, m.world_size, m.local_rank, m.rank_source) == (3, 8, 3, "torch.distributed")
    assert (m.trainable_params, m.frozen_params, m.trainable_bytes, m.frozen_bytes) == (32_768, 5_261_568, 131_072,
                                                                                        21_046_272)
    assert (m.optimizer, m.optimizer_state_dtype, m.micro_batch, m.seq_len, m.step) == (
        "torch.optim.adamw.AdamW", "float32", 8, 256, 4)
    assert read_metadata(None) is None and read_metadata([GOOD]) is None and read_metadata({}).dropped == ()


def test_the_oom_observers_arguments_by_torchs_names_and_the_old_key():
    """c10's OutOfMemoryObserver(device, allocated, device_total, device_free): files written
    before the rename stored the third as `device_allocated`, read as `device_total`."""
    oom = {"device": 0, "requested": 3 << 30, "device_total": 80 << 30, "device_free": 12 << 20}
    m = read_metadata({**GOOD, "oom": oom})
    assert (m.oom.device, m.oom.requested, m.oom.device_total, m.oom.device_free) == (0, 3 << 30, 80 << 30, 12 << 20)
    old = {k if k != "device_total" else "device_allocated": v for k, v in oom.items()}
    assert read_metadata({**GOOD, "oom": old}).oom == m.oom
    assert read_metadata({**GOOD, "oom": {**oom, "device_total": -1}}).dropped == ("oom.device_total",)


@pytest.mark.parametrize("patch, dropped", [
    ({"schema": True}, ["schema"]),                                       # a bool is not a number
    ({"device": {"index": -1, "name": "x\x1b[31m", "total_memory": 0}},
     ["device.index", "device.name", "device.total_memory"]),            # negative, a terminal escape, zero
    ({"distributed": {"rank": 9, "world_size": 8}}, ["distributed.rank", "distributed.world_size"]),
    ({"distributed": "rank 0"}, ["distributed"]),
    ({"torch": "2.13; rm -rf /", "cuda": 12.8}, ["torch", "cuda"]),
    ({"parameters": {"trainable": {"float32": {"count": -5, "bytes": 4}}, "frozen": {"Robert'); DROP": {}}}},
     ["parameters.trainable.float32.count", "parameters.frozen.Robert'); DROP"]),
    ({"parameters": {"trainable": [1, 2]}}, ["parameters.trainable"]),
    ({"optimizer": {"class": "a b", "state_dtype": "float32\n"}}, ["optimizer.class", "optimizer.state_dtype"]),
    ({"batch": {"micro_batch": 0, "seq_len": 2.5}}, ["batch.micro_batch", "batch.seq_len"]),
    ({"dump": {"step": 1 << 70, "reason": "because"}}, ["dump.step", "dump.reason"]),
    ({"writer": "x" * 10_000}, ["writer"]),
])
def test_bad_values_are_dropped_and_named(patch, dropped):
    m = read_metadata({**GOOD, **patch})
    assert sorted(m.dropped) == sorted(dropped)
    good = read_metadata(GOOD)
    sections = {"gpu_name": "device", "rank": "distributed", "trainable": "parameters", "optimizer": "optimizer",
                "micro_batch": "batch", "step": "dump", "torch_version": "torch", "writer": "writer"}
    for name, section in sections.items():      # what was not touched is kept
        if section not in patch:
            assert getattr(m, name) == getattr(good, name) is not None, name


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                         max_size=4), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(GOOD) + ["x"]), json_values, max_size=8))
def test_any_document_reads_without_raising(doc):
    m = read_metadata(doc)
    assert m is not None
    for name in ("rank", "world_size", "micro_batch", "step", "gpu_total_memory"):
        v = getattr(m, name)
        assert v is None or (type(v) is int and v >= 0)


def test_the_metadata_survives_the_cache_and_reaches_vramscope_open(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    path = with_metadata(tmp_path, GOOD)
    first = open_snapshot(path)
    again = open_snapshot(path)
    assert not first.from_cache and again.from_cache
    assert again.metadata == first.metadata == read_metadata(GOOD)
    assert vramscope.open(path).metadata == read_metadata(GOOD)
    assert open_snapshot(str(DATA / "cuda_lora.pickle"), use_cache=False).metadata is None


def test_the_budget_takes_exact_counts_and_dtypes_from_the_metadata(tmp_path):
    """cuda_lora: a LoRA run whose parameters record_cuda.py counted (cuda_runs.json). From sizes
    alone the frozen count is 64 off (a buffer the size of a weight) and the optimizer reads as
    Adam (AdamW's frames go through adam.py); the metadata gives both exactly."""
    runs = {r["run"]: r for r in json.loads((DATA / "cuda_runs.json").read_text())["runs"]}
    lora = runs["lora"]
    trainable, frozen = lora["trainable_parameters"], lora["base_parameters"]
    doc = {**GOOD, "parameters": {"trainable": {"float32": {"count": trainable, "bytes": 4 * trainable}},
                                  "frozen": {"float32": {"count": frozen, "bytes": 4 * frozen}},
                                  "not_on_gpu": {"count": 0, "bytes": 0}}}
    plain = budget(analyze(open_snapshot(str(DATA / "cuda_lora.pickle"), use_cache=False), use_cache=False), 0)
    an = analyze(open_snapshot(with_metadata(tmp_path, doc), use_cache=False), use_cache=False)
    b = budget(an, 0)
    f = b.facts
    assert plain.facts.frozen_params != frozen and plain.facts.optimizer == "Adam"
    assert (f.trainable_params, f.frozen_params) == (trainable, frozen)
    assert (f.trainable_dtype_bytes, f.frozen_dtype_bytes) == (4.0, 4.0)
    assert f.weight_bytes == 4 * (trainable + frozen)
    assert "the recorder's metadata" in f.dtype_evidence and "32,768 float32 trainable" in f.dtype_evidence
    assert f.optimizer == "AdamW" and f.optimizer_evidence == "the recorder's metadata (torch.optim.adamw.AdamW)"
    assert f.optimizer_bytes_per_param == pytest.approx(8.0)
    assert "the recorder's metadata" in b.row("weights").formula
    assert b.row("weights").expected == 4 * (trainable + frozen)
    assert b.row("optimizer").expected == 2 * 4 * trainable and b.row("optimizer").note == ""
    # the share the levers read (BudgetFacts.trainable_fraction) is the exact one
    assert f.trainable_fraction == trainable / (trainable + frozen)


@pytest.mark.parametrize("change, why", [
    ({"device": {"index": 1}}, "another device's process"),
    ({"parameters": {"trainable": {"float32": {"count": 1, "bytes": 4}}, "frozen": {},
                     "not_on_gpu": {"count": 1, "bytes": 4}}}, "parameters off the GPU"),
    ({"parameters": {"frozen": {}}}, "no trainable counts"),
])
def test_the_budget_ignores_metadata_that_does_not_describe_this_memory(tmp_path, change, why):
    an = analyze(open_snapshot(with_metadata(tmp_path, {**GOOD, **change}), use_cache=False), use_cache=False)
    f = budget(an, 0).facts
    assert "recorder" not in f.dtype_evidence, why
