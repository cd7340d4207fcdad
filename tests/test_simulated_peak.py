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


@pytest.mark.parametrize("part", [None, 1, 7, 1000])
@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_the_shortcut_is_the_simulated_runs_peak(path, part, monkeypatch):
    """(`part`: where only sizes change, the differences are summed this many entries at a
    time, in int32: the same answer across the parts' bounds)"""
    if part is not None:
        from vramscope.classifiers import simulate as simulate_module
        monkeypatch.setattr(simulate_module, "_PEAK_PART", part)
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


def test_sizes_only_sums_in_int32_and_large_rows_in_int64(monkeypatch):
    """The half batch changes sizes only: its differences are added up in int32 (half the
    memory per entry) where every row is under 2^30 bytes, in int64 otherwise; both give the
    peak the simulated run gives."""
    import numpy as np
    from vramscope.classifiers import simulate as simulate_module
    an = analyze(open_snapshot(str(RUNS[0]), use_cache=False))
    da = an.devices[an.primary_device()]
    want = simulate(da, ["half_batch"]).peak()
    real = np.zeros
    for limit, dtype in ((1 << 30, np.int32), (int(da.allocs.size.max()), np.int64)):
        seen = []

        def zeros(shape, dtype=float, *a, **kw):
            if shape == len(da.live.live_after) + 1:
                seen.append(np.dtype(dtype))
            return real(shape, dtype, *a, **kw)
        monkeypatch.setattr(simulate_module, "_INT32_ROWS", limit)
        monkeypatch.setattr(simulate_module.np, "zeros", zeros)
        b, e, _ = simulated_peak(da, ["half_batch"])
        monkeypatch.setattr(simulate_module.np, "zeros", real)
        assert seen == [np.dtype(dtype)]
        assert (b, e) == (want.bytes, want.index)
