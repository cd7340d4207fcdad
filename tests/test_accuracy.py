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

The optimizer: on CUDA tensors `torch.optim.AdamW` (and SGD) default to the foreach
implementation, on CPU tensors to a single-tensor loop. The suite is recorded on the CPU
but stands for GPU training, so its runs ask for foreach (record_runs.py `adamw()`).
Torch's profiler leaves foreach scratch (`_foreach_sqrt`) `unknown`, so it is not
compared here; `test_foreach_scratch_is_temporary` checks it separately.

`mlp_adamw_single_tensor` keeps the CPU default. There torch tags `exp_avg_sq.sqrt()` a
*parameter* and the denominator an *activation* (a side effect of its data-flow
tracking); DESIGN.md §3 calls both short-lived optimizer scratch and vramscope says
`temporary`. That run is not part of the target: its test checks that this scratch is
the only disagreement (about a quarter of its bytes).
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
THRESHOLD = 0.97      # the issue asks for 0.90 on every run, next target 0.97; all clear 0.97
# Runs outside the target, with why (see the module docstring).
ORACLE_DISAGREEMENT = {"mlp_adamw_single_tensor": "torch tags single-tensor Adam's sqrt/denominator "
                                                  "scratch parameter/activation"}
SUITE = [r for r in RUNS if r not in ORACLE_DISAGREEMENT]
# Runs recorded to expose a classifier weakness that a later change is to fix: expected to
# stay below the threshold until then (strict: a pass means the marker must go).
KNOWN_BELOW_THRESHOLD = {
    "custom_attention": ("issue 13: hand-written softmax. Torch tags the scratch that the "
                         "backward of its division and amax makes and frees inside one node "
                         "(DivBackward0 div/neg, AmaxBackward0 eq/.to/sum/div: score-sized "
                         "512 KiB tensors, 14.9% of the compared bytes) `temporary`; vramscope "
                         "says `autograd`"),
}

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


def _report(run, acc, per, conf):
    total = sum(t for _, t in per.values())
    worst = sorted(conf.items(), key=lambda kv: -kv[1])[:3]
    print(f"\n{run:18s} accuracy {acc:.4f}  ({total:,} B compared)\n    per category: {_fmt(per)}")
    if worst:
        print("    largest confusions (torch -> ours): "
              + ", ".join(f"{t}->{o} {b / total:.1%}" for (t, o), b in worst))


def test_the_suite_has_every_required_run():
    required = {"mlp_adamw", "transformer_adamw", "lora", "checkpointing", "sgd_accum", "bf16_autocast",
                "leak", "retain_graph"}
    assert required <= set(SUITE), f"missing ground-truth runs: {sorted(required - set(SUITE))}"


@pytest.mark.parametrize("run", [
    pytest.param(r, marks=pytest.mark.xfail(reason=KNOWN_BELOW_THRESHOLD[r], strict=True))
    if r in KNOWN_BELOW_THRESHOLD else r for r in SUITE])
def test_accuracy_per_run(run):
    acc, per, conf = accuracy(run)
    _report(run, acc, per, conf)
    assert acc >= THRESHOLD, f"{run}: accuracy {acc:.4f} < {THRESHOLD}"


def test_single_tensor_adam_scratch_is_the_only_disagreement():
    run = "mlp_adamw_single_tensor"
    acc, per, conf = accuracy(run)
    _report(run, acc, per, conf)
    total = sum(t for _, t in per.values())
    scratch = conf.get(("activations", "temporary"), 0) + conf.get(("weights", "temporary"), 0)
    # the documented disagreement is large on this MLP ...
    assert scratch / total > 0.15
    # ... and everything else agrees
    assert (acc * total + scratch) / total >= 0.995, f"other confusions: {conf}"
    truth = json.loads((GT / f"{run}.truth.json").read_text())
    snap = open_snapshot(str(GT / f"{run}.pickle"), use_cache=False)
    an = analyze(snap, rules=load_rules(use_user_rules=False))
    da = an.devices[truth["device"]]
    a = da.allocs
    # every byte of it is ours `temporary` by the optimizer-scratch rule, under the sqrt/division
    for r in np.flatnonzero(a.alloc_index >= 0):
        t = truth["categories"][a.alloc_index[r]]
        ours = CATEGORIES[da.category[r]]
        if t in ("parameter", "activation") and ours == "temporary":
            assert an.rule_names[da.rule[r]] == "optimizer.scratch"
            names = [f[2] for f in snap.stack_frames_list(int(a.stack[r]))]
            assert any("_single_tensor_adam" in n for n in names), names


@pytest.mark.parametrize("run", ["mlp_adamw", "transformer_adamw", "bf16_autocast"])
def test_foreach_scratch_is_temporary(run):
    """Torch leaves `_foreach_sqrt` outputs `unknown`; DESIGN §3 says optimizer scratch."""
    truth = json.loads((GT / f"{run}.truth.json").read_text())
    snap = open_snapshot(str(GT / f"{run}.pickle"), use_cache=False)
    an = analyze(snap, rules=load_rules(use_user_rules=False))
    da = an.devices[truth["device"]]
    a = da.allocs
    found = 0
    for r in np.flatnonzero(a.alloc_index >= 0):
        names = [f[2] for f in snap.stack_frames_list(int(a.stack[r]))]
        if names and "_foreach_sqrt" in names[0]:
            assert truth["categories"][a.alloc_index[r]] == "unknown"
            assert CATEGORIES[da.category[r]] == "temporary"
            assert an.rule_names[da.rule[r]] == "optimizer.scratch"
            found += int(a.size[r])
    assert found > 1 << 20


def test_accuracy_summary():
    """Prints the table for all runs and all categories together."""
    assert not any(r.id.startswith("torch_profiler.") for r in load_rules(use_user_rules=False).rules)
    lines = ["", f"{'run':24s} {'accuracy':>9s}   per category"]
    per_cat = defaultdict(lambda: [0, 0])
    for run in SUITE:
        acc, per, _ = accuracy(run)
        for c, (g, t) in per.items():
            per_cat[c][0] += g
            per_cat[c][1] += t
        lines.append(f"{run:24s} {acc:9.4f}   {_fmt(per)}")
    lines.append("suite, per category: " + _fmt({k: tuple(v) for k, v in per_cat.items()}))
    print("\n".join(lines))
    assert all(t > 0 for _, t in per_cat.values())
