"""The advice's shortcut to a simulated peak (Rewrite.total_peak: the recorded live bytes plus
the running difference the rewrite makes, no event ordered again) equals the peak of the
simulated run built event by event (simulate(...).peak()), bytes and the entry it happens at,
for every simulated lever and pair of levers on runs where they change the peak."""
from __future__ import annotations

import pytest

from helpers import DATA, GROUNDTRUTH
from vramscope.classifiers import analyze
from vramscope.classifiers.budget import budget
from vramscope.classifiers.simulate import simulate, simulated_peak
from vramscope.parsers import open_snapshot

DEV = DATA / "levers" / "dev"
RUNS = [DEV / "llama_tied.base.pickle", DEV / "vit_sgd.ckpt.pickle", DEV / "gpt2_bf16.base.pickle",
        DATA / "cuda_lora.pickle", GROUNDTRUTH / "ft_checkpointing.pickle",
        DATA / "levers" / "cpu" / "cnn_bn.base.pickle"]
COMBOS = [("half_batch",), ("checkpointing",), ("no_checkpointing",), ("lora",), ("checkpointing", "half_batch"),
          ("lora", "half_batch")]


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_the_shortcut_is_the_simulated_runs_peak(path):
    an = analyze(open_snapshot(str(path), use_cache=False))
    da = an.devices[an.primary_device()]
    facts = budget(an, an.primary_device()).facts           # what the LoRA lever reads
    changed = 0
    for names in COMBOS:
        b, e, _applied = simulated_peak(da, names, facts)
        sim = simulate(da, names, facts).peak()
        assert (b, e) == (sim.bytes, sim.index), names
        changed += b != da.peak.bytes
    assert changed >= 2            # the levers did something on this run: the comparison means something
