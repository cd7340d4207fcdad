"""Checkpointing is not simulated for the advice where it could not be advised whatever its
simulation gives (`advice.bounded_out`): the bound it rests on (`checkpointing_bound`) is never
under what the simulation saves, on every trace we have where the lever applies, and the
advice is the same with the simulation left out as with it run."""
from __future__ import annotations

from pathlib import Path

import pytest

from vramscope.classifiers import advice as advice_module
from vramscope.classifiers import analyze
from vramscope.classifiers import structure as structure_module
from vramscope.classifiers.advice import bounded_out, checkpointing_bound, needs_blocks
from vramscope.classifiers.levers import LEVERS
from vramscope.classifiers.simulate import simulated_peak
from vramscope.parsers import open_snapshot

from helpers import DATA, REPO, needs_shared, real_snapshots

GROUNDTRUTH = REPO / "tests" / "groundtruth"
FILES = [DATA / n for n in ("fit_b2.pickle", "cuda_full.pickle", "cuda_lora.pickle", "oom_step3.pickle",
                            "backward_thread.pickle", "component_tracking.pickle", "qlora_4bit.pickle")] + \
    [GROUNDTRUTH / n for n in ("mlp_adamw.pickle", "transformer_adamw.pickle", "lora.pickle")]


def _analysis(path: Path, tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path))
    return analyze(open_snapshot(str(path), use_cache=False), use_cache=False)


def _check_bound(an) -> int:
    checked = 0
    for da in an.devices.values():
        if LEVERS["checkpointing"].why_not(da.run) is not None:
            continue
        peak, _at, applied = simulated_peak(da, ["checkpointing"])
        saves = max(0, int(da.peak.bytes) - int(peak)) if all(a.applied for a in applied) else 0
        bound = checkpointing_bound(da)
        assert bound is None or bound >= saves, (bound, saves)
        checked += 1
    return checked


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_bound_is_never_under_the_simulated_saving(path, tmp_path, monkeypatch):
    assert _check_bound(_analysis(path, tmp_path, monkeypatch)) >= 1


@needs_shared
def test_the_bound_on_every_shared_snapshot(tmp_path, monkeypatch):
    checked = sum(_check_bound(_analysis(path, tmp_path, monkeypatch)) for path in real_snapshots())
    assert checked >= 5


def _advice(da) -> tuple:
    return da.peak.advice, tuple(o.advice for o in da.ooms)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_advice_is_the_same_with_the_simulation_left_out(path, tmp_path, monkeypatch):
    """The advice (at the peak and at every OOM) with checkpointing left out where it is
    bounded out is the advice with it simulated everywhere. On a run whose peak holds almost
    none of the forward's tensors (a peak in the optimizer's step) it is left out, and the
    blocks are not found beside the analysis for it."""
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    an = _analysis(path, tmp_path, monkeypatch)
    da = an.devices[an.primary_device()]
    if path.name in ("backward_thread.pickle", "mlp_adamw.pickle"):
        assert LEVERS["checkpointing"].why_not(da.run) is None
        assert bounded_out(da, "checkpointing") and needs_blocks(da.run) and not needs_blocks(da.run, da)
        assert "checkpointing" not in advice_module.simulated_savings(da)
    left_out = _advice(da)

    monkeypatch.setattr(advice_module, "bounded_out", lambda da, name: False)
    again = _analysis(path, tmp_path / "again", monkeypatch)
    db = again.devices[again.primary_device()]
    if LEVERS["checkpointing"].why_not(db.run) is None:
        assert "checkpointing" in advice_module.simulated_savings(db)
    assert _advice(db) == left_out
