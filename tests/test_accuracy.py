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

Run `pytest -s tests/test_accuracy.py` to see per-run and per-category numbers, and the
same figures with the two profiler-compatibility rules (`torch_profiler.*`, which follow
torch's own tagging of single-tensor Adam's sqrt/denominator on profiler-converted
snapshots) switched off.
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
    assert acc >= THRESHOLD, f"{run}: accuracy {acc:.4f} < {THRESHOLD}"


@pytest.mark.skipif(not RUNS, reason="no ground-truth runs in tests/groundtruth")
def test_accuracy_summary_and_without_profiler_compat(tmp_path):
    """Prints the table for all runs, and the same with the torch_profiler.* rules
    disabled through a user rules file (what a purely semantic classification gets)."""
    off = tmp_path / "rules.toml"
    off.write_text('disable = ["torch_profiler.adam_sqrt", "torch_profiler.adam_denom"]\n')
    semantic = load_rules(rules_path=off)        # the shipped rules minus the two
    assert not any(r.id.startswith("torch_profiler.") for r in semantic.rules)
    lines = ["", f"{'run':18s} {'accuracy':>9s} {'no-compat':>9s}   per category"]
    per_cat = defaultdict(lambda: [0, 0])
    for run in RUNS:
        acc, per, _ = accuracy(run)
        acc2, _, _ = accuracy(run, rules=semantic)
        for c, (g, t) in per.items():
            per_cat[c][0] += g
            per_cat[c][1] += t
        lines.append(f"{run:18s} {acc:9.4f} {acc2:9.4f}   {_fmt(per)}")
    lines.append("all runs, per category: " + _fmt({k: tuple(v) for k, v in per_cat.items()}))
    print("\n".join(lines))
    assert all(t > 0 for _, t in per_cat.values())
