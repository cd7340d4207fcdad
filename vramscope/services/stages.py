"""Every analysis stage of one snapshot, timed: what benchmarks/bench_stages.py reports against
`pickle.load`, and what tests/test_linear.py holds to grow no faster than the trace.

    clock = run_stages(path)            # -> StageClock: wall and CPU seconds per stage

The stages, in the order a user meets them: parse (the columns, cold), then the analysis a
cold `summary` runs (stacks, allocations, classify (phases included), peaks, run facts, advice
(the simulated levers that apply, the blocks' structure with them), leaks, ooms, stale
gradients), the summary document; then what runs on demand: the structure (blocks) where
advice did not need it, each simulated lever (what_if), the fit, the budget, the memory tree
at the peak, a comparison with itself, and the report's documents.
"""
from __future__ import annotations

import os
import tempfile

from ..common.clock import StageClock, stage

COLD = ("parse", "stacks", "allocations", "classify", "peaks", "run facts", "advice", "leaks", "ooms",
        "stale gradients", "summary document")
ON_DEMAND = ("structure", "lever half_batch", "lever checkpointing", "lever no_checkpointing", "lever lora",
             "fit batch", "budget", "memory tree", "compare", "report")


def run_stages(path: str, on_demand: bool = True, clock: StageClock | None = None) -> StageClock:
    """Run every stage on the snapshot at `path` with an empty cache; their times on `clock`."""
    from ..classifiers import analyze
    from ..classifiers.budget import budget
    from ..classifiers.memtree import memory_tree
    from ..classifiers.structure import structure
    from ..classifiers.whatif import what_if
    from ..parsers import open_snapshot
    from .compare import compare_analyses
    from .report import write_report
    from .summary import summary_document
    clock = clock if clock is not None else StageClock()
    with tempfile.TemporaryDirectory() as cache:
        old = os.environ.get("VRAMSCOPE_CACHE_DIR")
        os.environ["VRAMSCOPE_CACHE_DIR"] = cache
        try:
            with stage(clock, "parse"):
                snap = open_snapshot(path)
            an = analyze(snap, clock=clock, use_cache=False)
            with stage(clock, "summary document"):
                summary_document(an)
            if not on_demand or not an.devices:
                return clock
            dev = an.primary_device()
            assert dev is not None
            da = an.devices[dev]
            from ..classifiers import structure as structure_module
            structure_module._CACHE.pop(da, None)         # found again on its own (advice may have found it)
            with stage(clock, "structure"):
                structure(da)
            for lever in ("half_batch", "checkpointing", "no_checkpointing", "lora"):
                with stage(clock, f"lever {lever}"):
                    what_if(an, dev, levers=[lever], with_budget=False)
            with stage(clock, "fit batch"):
                what_if(an, dev, gpu="80", fit="batch", with_budget=False)
            with stage(clock, "budget"):
                budget(an, dev)
            with stage(clock, "memory tree"):
                memory_tree(da, da.peak.index)
            with stage(clock, "compare"):
                compare_analyses(an, an, dev)
            with stage(clock, "report"), tempfile.TemporaryDirectory() as out:
                write_report(an, out)
        finally:
            if old is None:
                os.environ.pop("VRAMSCOPE_CACHE_DIR", None)
            else:
                os.environ["VRAMSCOPE_CACHE_DIR"] = old
    return clock


__all__ = ["run_stages", "COLD", "ON_DEMAND"]
