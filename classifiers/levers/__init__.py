"""The named levers (DESIGN.md §8): one object per lever, one file each.

    lever = LEVERS["checkpointing"]              # base.Lever
    lever.why_not(run)                           # why it cannot apply to this run (None: it can)
    left_out("lora", run)                        # the same, by name: the one rule every surface reads

Simulated on the recorded timeline (simulate.py rewrites the run, each lever's `apply` says
how): checkpointing.py, no_checkpointing.py, half_batch.py, lora.py. Estimates, factors on one
category (estimates.py): the 8-bit and paged optimizers, 4-bit weights, expandable segments.
A lever's saving, wherever it is shown (advice, OOM findings, the report, the viewer, whatif),
is its simulated peak difference; an estimate's is labelled as one.
"""
from __future__ import annotations

from .base import Applied, Band, Family, Lever, LeverError, Measured, Pulled, band_for
from .checkpointing import Checkpointing
from .common import GUESSED_TOO_MUCH, evidence_why_not, training_why_not
from .estimates import Adam8bit, ExpandableSegments, FourBit, PagedOptimizer
from .half_batch import HalfBatch
from .lora import LORA_RANK, TARGETS_DEFAULT, Lora, parse_targets
from .no_checkpointing import NoCheckpointing

LEVERS: dict[str, Lever] = {lv.name: lv for lv in (HalfBatch(), Checkpointing(), NoCheckpointing(), Adam8bit(),
                                                    PagedOptimizer(), Lora(), FourBit(), ExpandableSegments())}
SIMULATED = tuple(n for n, lv in LEVERS.items() if lv.simulated)
TRAINING_LEVERS = frozenset(n for n, lv in LEVERS.items() if lv.training)


def get(name: str) -> Lever:
    lv = LEVERS.get(name)
    if lv is None:
        raise LeverError(f"unknown lever {name!r} (known: {', '.join(LEVERS)})")
    return lv


def left_out(name: str, run=None, expandable: bool = False) -> str | None:
    """Why lever `name` cannot apply to this run (None: it can), from the run's facts
    (results.RunFacts): the one rule behind every surface's advice."""
    return get(name).why_not(run, expandable)


def pulled(name: str, facts=None, applied: Applied | None = None, family: Family | None = None) -> Pulled:
    """What lever `name` is on this run: a simulated lever with what its simulation did
    (`applied`), an estimate with its factors from the budget's `facts`."""
    lv = get(name)
    if lv.simulated:
        ok = applied is not None and applied.applied
        band, note = lv.band(family) if ok else (None, "")
        return Pulled(lv.name, lv.title, True, ok, "" if ok else (applied.assumption if applied else "not simulated"),
                      ("simulated on the recorded timeline: " + applied.assumption) if ok and applied else "",
                      error_band=band, band_note=note)
    scales, removes, assumption = lv.factors(facts)
    return Pulled(lv.name, lv.title, False, True, "", assumption, scales, removes,
                  band_note="an estimate from bytes per parameter, not measured against recorded runs")


def describe(name: str, facts=None, family: Family | None = None) -> Pulled:
    """Lever `name` as a list of levers shows it before it is pulled: what it does and, for a
    simulated one, its band for runs like this one."""
    lv = get(name)
    if lv.simulated:
        band, note = lv.band(family)
        return Pulled(lv.name, lv.title, True, True, "", lv.summary, error_band=band, band_note=note)
    return pulled(name, facts)


__all__ = ["describe", "LEVERS", "SIMULATED", "TRAINING_LEVERS", "GUESSED_TOO_MUCH", "LORA_RANK", "TARGETS_DEFAULT", "Applied",
           "Band", "Family", "Lever", "LeverError", "Measured", "Pulled", "band_for", "get", "left_out", "pulled",
           "parse_targets", "evidence_why_not", "training_why_not"]
