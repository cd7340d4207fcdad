"""The recorded ground-truth runs made for the compare and custom-code features
(tests/groundtruth: ft_base, ft_checkpointing, ft_batch2x, custom_attention) hold what their
`<run>.truth.json` says, read with `pickle.load` (our own trusted files), never with
vramscope's parser or classifier: the feature tests rely on these facts.
"""
from __future__ import annotations

import json
import re

import pytest

from helpers import GROUNDTRUTH, live_curve, load_trusted, phase_of

FT_RUNS = ("ft_base", "ft_checkpointing", "ft_batch2x")
RECORDED = FT_RUNS + ("custom_attention",)


def _truth(run):
    return json.loads((GROUNDTRUTH / f"{run}.truth.json").read_text())


def test_the_runs_are_small():
    sizes = {run + suffix: (GROUNDTRUTH / (run + suffix)).stat().st_size
             for run in RECORDED for suffix in (".pickle", ".truth.json")}
    assert all(s < 500_000 for s in sizes.values()), sizes
    assert sum(sizes.values()) < 3_000_000, sum(sizes.values())     # with the synthetic ones' 1 MB: 4 MB


# -- ft_base / ft_checkpointing / ft_batch2x (compare) --------------------------------------
def _user_sites(trace):
    """file:function of the frames of this repository's script (the user's code)."""
    return {re.sub(r"\(\d+\)", "", f["name"]) for e in trace if e["action"] == "alloc"
            for f in e["frames"] if f["name"].startswith("record_runs.py(")}


def test_ft_runs_are_one_code_path_in_three_variants():
    truths = {r: _truth(r) for r in FT_RUNS}
    snaps = {r: load_trusted(GROUNDTRUTH / f"{r}.pickle") for r in FT_RUNS}
    mb = {r: t["micro_batch_size"] for r, t in truths.items()}
    assert mb == {"ft_base": 4, "ft_checkpointing": 4, "ft_batch2x": 8}
    assert {r: t["checkpointing"] for r, t in truths.items()} == {"ft_base": False, "ft_checkpointing": True,
                                                                  "ft_batch2x": False}
    for r, t in truths.items():
        c = t["compare"]
        assert c["group"] == "ft" and c["variant"] == r and c["runs"] == list(FT_RUNS)
        assert (c["micro_batch_size"], c["checkpointing"]) == (t["micro_batch_size"], t["checkpointing"])
    assert len({(t["trainable_params"], t["total_params"]) for t in truths.values()}) == 1
    assert 0 < truths["ft_base"]["trainable_params"] < truths["ft_base"]["total_params"]
    assert len({t["iterations"] for t in truths.values()}) == 1
    for r, t in truths.items():
        assert len(t["iteration_table"]) == t["iterations"]
        for it in t["iteration_table"]:
            assert [p["phase"] for p in it["phases"]] == ["inputs", "forward", "backward", "optimizer"]
    # the same user code sites in all three files
    sites = {r: _user_sites(s["device_traces"][0]) for r, s in snaps.items()}
    assert sites["ft_base"] == sites["ft_checkpointing"] == sites["ft_batch2x"]
    assert {"record_runs.py: train_ft", "record_runs.py: forward"} <= sites["ft_base"]
    # checkpointing goes through torch.utils.checkpoint; the others never do
    ck = {r: any("torch/utils/checkpoint.py" in f["name"] for e in s["device_traces"][0] for f in e["frames"])
          for r, s in snaps.items()}
    assert ck == {"ft_base": False, "ft_checkpointing": True, "ft_batch2x": False}


@pytest.mark.parametrize("run", RECORDED)
def test_peak_live_matches_the_trace(run):
    t = _truth(run)
    trace = load_trusted(GROUNDTRUTH / f"{run}.pickle")["device_traces"][t["device"]]
    rel = live_curve(trace, 0)
    pre = sum(t["preexisting_bytes_by_category"].values())
    for pk in [t["peak_live"]] + t["peak_live_per_iteration"]:
        assert trace[pk["index"]]["action"] == "alloc"
        assert pk["bytes"] == pre + rel[pk["index"]] == sum(pk["by_category"].values())
        it = t["iteration_table"][pk["iteration"]]
        assert phase_of(it, pk["index"]) == pk["phase"]
    assert t["peak_live"]["index"] == t["peak_index"]
    assert [p["bytes"] for p in t["peak_live_per_iteration"]] == \
        [b + pre for b in t["peak_live_bytes_relative_per_iteration"]]


def test_checkpointing_keeps_fewer_activation_bytes_at_the_peak():
    pk = {r: _truth(r)["peak_live"] for r in FT_RUNS}
    act = {r: p["by_category"]["activation"] for r, p in pk.items()}
    # the acceptance test of issue 15 relies on these (torch's categories)
    assert act["ft_checkpointing"] < act["ft_base"] / 3
    assert act["ft_batch2x"] > 1.8 * act["ft_base"]
    assert pk["ft_checkpointing"]["bytes"] < pk["ft_base"]["bytes"] < pk["ft_batch2x"]["bytes"]
    # activations matter at the peak: most of it without checkpointing
    assert act["ft_base"] > pk["ft_base"]["bytes"] / 2
    assert all(p["phase"] == "backward" for p in pk.values())


# -- custom_attention -----------------------------------------------------------------------
def test_custom_attention_has_no_modules_and_plain_tensor_parameters():
    t = _truth("custom_attention")
    trace = load_trusted(GROUNDTRUTH / "custom_attention.pickle")["device_traces"][0]
    names = {f["name"] for e in trace if e["action"] == "alloc" for f in e["frames"]}
    assert not any(n.startswith("nn.Module: ") for n in names)
    sites = _user_sites(trace)
    assert {"record_runs.py: my_softmax", "record_runs.py: my_attention", "record_runs.py: custom_forward",
            "record_runs.py: train_custom"} <= sites
    # the rest are the recording script's own frames
    functions = {s.split(": ")[1] for s in sites}
    assert set(t["custom_code"]["functions"]) == functions - {"<module>", "main", "record"}
    # every parameter is a plain tensor the optimizer updates: torch still calls them parameters
    assert t["preexisting_bytes_by_category"]["parameter"] == 4 * t["trainable_params"]
    assert t["trainable_params"] == t["total_params"]
    assert [p["phase"] for p in t["iteration_table"][0]["phases"]] == ["inputs", "forward", "backward", "optimizer"]
    assert t["iterations"] == len(t["iteration_table"]) == 3
