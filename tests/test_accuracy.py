"""Byte-weighted accuracy of the classifier against torch's own categories.

Ground truth: tests/groundtruth/<run>.pickle (real CPU training loops recorded by torch's
memory profiler and converted with `_profile_to_snapshot`, `category` removed from every
entry) and <run>.truth.json (torch's category of every trace entry).

    accuracy = sum(size of alloc entries where our category == torch's, mapped)
               / sum(size of alloc entries torch gave a category)

Mapping: parameter->weights, optimizer_state->optimizer, gradient->gradients,
activation->activations, autograd_detail->autograd, input->inputs, temporary->temporary.
Entries torch tagged `unknown` (or null) are EXCLUDED from the denominator: there is
nothing to compare them with. Version bumps (an in-place update written as free + alloc)
are alloc entries and count like any other.

Run `pytest -s tests/test_accuracy.py` to see per-run and per-category numbers.

Known disagreement: in single-tensor Adam, torch's memory profiler tags
`exp_avg_sq.sqrt()` as a *parameter* and the denominator as an *activation* (a side
effect of its data-flow tracking). DESIGN.md §3 calls both short-lived optimizer
scratch, so vramscope says `temporary` and does not copy torch here; on the plain-MLP
runs those buffers are about a quarter of the compared bytes, 5-8% on the others.
Four runs miss the 0.90 target (mlp_adamw, retain_graph 0.76; checkpointing 0.889;
bf16_autocast 0.895): they keep a floor that catches regressions, and a strict xfail
marks the target they miss.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("VRAMSCOPE_CACHE_DIR", "")

from vramscope.classifiers import CATEGORIES, analyze, load_rules  # noqa: E402
from vramscope.parsers import open_snapshot  # noqa: E402

GT = Path(__file__).resolve().parent / "groundtruth"
RUNS = sorted(p.name[:-len(".truth.json")] for p in GT.glob("*.truth.json"))
TORCH_TO_OURS = {"parameter": "weights", "optimizer_state": "optimizer", "gradient": "gradients",
                 "activation": "activations", "autograd_detail": "autograd", "input": "inputs",
                 "temporary": "temporary"}
THRESHOLD = 0.90
# Runs under the 0.90 target, with floors just below what they measure (so regressions
# still fail). Their largest confusions are torch's labels of Adam's sqrt/denominator
# scratch (see above); checkpointing adds recomputed forwards torch calls temporary.
KNOWN_DISAGREEMENT = {"mlp_adamw": 0.75, "retain_graph": 0.75, "checkpointing": 0.88, "bf16_autocast": 0.885}


def accuracy(run: str, rules=None):
    """-> (accuracy, {category: (correct bytes, total bytes)}, confusion {(truth, ours): bytes})."""
    snap = open_snapshot(str(GT / f"{run}.pickle"), use_cache=False)
    truth = json.loads((GT / f"{run}.truth.json").read_text())
    dev = truth["device"]
    an = analyze(snap, rules=rules or load_rules(use_user_rules=False))   # never the user's own rules
    da = an.devices[dev]
    cats = truth["categories"]
    assert len(cats) == len(snap.trace(dev)), "truth and snapshot disagree on the number of entries"
    a = da.allocs
    rows = np.flatnonzero(a.alloc_index >= 0)
    ours = np.asarray(CATEGORIES, dtype=object)[da.category[rows]]
    theirs = [cats[i] for i in a.alloc_index[rows].tolist()]
    sizes = a.size[rows].tolist()
    per = defaultdict(lambda: [0, 0])
    conf = defaultdict(int)
    for t, o, z in zip(theirs, ours, sizes):
        if t is None or t == "unknown":
            continue
        m = TORCH_TO_OURS[t]
        per[m][1] += z
        if m == o:
            per[m][0] += z
        else:
            conf[(m, o)] += z
    good = sum(v[0] for v in per.values())
    total = sum(v[1] for v in per.values())
    n_alloc_entries = sum(1 for c in cats if c is not None)
    assert len(rows) == n_alloc_entries, "every alloc entry must be one allocation row"
    return good / total, {k: tuple(v) for k, v in per.items()}, dict(conf)


def _fmt(per):
    return "  ".join(f"{c}={g / t:.3f}" for c, (g, t) in sorted(per.items()))


@pytest.mark.skipif(not RUNS, reason="no ground-truth runs in tests/groundtruth")
@pytest.mark.parametrize("run", RUNS)
def test_accuracy_per_run(run):
    acc, per, conf = accuracy(run)
    total = sum(t for _, t in per.values())
    worst = sorted(conf.items(), key=lambda kv: -kv[1])[:3]
    print(f"\n{run:18s} accuracy {acc:.4f}  ({total:,} B compared)\n    per category: {_fmt(per)}")
    if worst:
        print("    largest confusions (torch -> ours): "
              + ", ".join(f"{t}->{o} {b / total:.1%}" for (t, o), b in worst))
    floor = KNOWN_DISAGREEMENT.get(run, THRESHOLD)
    assert acc >= floor, f"{run}: accuracy {acc:.4f} < {floor}"


@pytest.mark.xfail(strict=True, reason="torch tags Adam's sqrt/denominator scratch parameter/activation; "
                                       "DESIGN §3 says temporary (see the module docstring)")
@pytest.mark.parametrize("run", sorted(KNOWN_DISAGREEMENT))
def test_known_disagreement_runs_reach_the_target(run):
    acc, _, _ = accuracy(run)
    assert acc >= THRESHOLD


@pytest.mark.skipif(not RUNS, reason="no ground-truth runs in tests/groundtruth")
def test_accuracy_summary():
    """Prints the table for all runs and all categories together."""
    assert not any(r.id.startswith("torch_profiler.") for r in load_rules(use_user_rules=False).rules)
    lines = ["", f"{'run':18s} {'accuracy':>9s}   per category"]
    per_cat = defaultdict(lambda: [0, 0])
    for run in RUNS:
        acc, per, _ = accuracy(run)
        for c, (g, t) in per.items():
            per_cat[c][0] += g
            per_cat[c][1] += t
        lines.append(f"{run:18s} {acc:9.4f}   {_fmt(per)}")
    lines.append("all runs, per category: " + _fmt({k: tuple(v) for k, v in per_cat.items()}))
    print("\n".join(lines))
    assert all(t > 0 for _, t in per_cat.values())
