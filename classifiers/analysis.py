"""The one query API behind the viewer and the command line.

    an = analyze(snap, progress=None, rules_path=None, rules=None, use_cache=True)   # -> Analysis
    da = an.devices[dev]                                  # -> DeviceAnalysis

`analyze` classifies every allocation (rules in classifiers/rules.toml, user rules from
`rules_path`, $VRAMSCOPE_RULES or ~/.config/vramscope/rules.toml|json; see rules.py),
finds iterations and phases, types the peaks, and reports leaks and OOMs.

DeviceAnalysis (one per device with data):
  device, live (parsers.LiveModel), allocs (parsers.Allocations: one row per allocation)
  category   uint8 per allocation row, index into CATEGORIES
  rule       int16 per allocation row, index into Analysis.rule_names (0 = "none": no rule)
  torch_category  uint8 per row into snap.category_names (torch's own category on
             profiler-converted files that carry one, 0 elsewhere) or None: a separate
             fact, never used to classify
  timeline   timeline.Timeline: `phase` (uint8 per trace entry, PHASE_NAMES), `segment`,
             `iteration` (int32 per entry, -1 outside iterations), `first_start`
  chain_root / chain_last  int32 per row: first / last version of the row's version-bump
             chain (profiler-converted files; row itself elsewhere)
  row_phase  uint8 per row: phase where its chain was allocated (PHASE_NAMES; "pre" for
             blocks live before the trace with no phase in their stack)
  iterations list of {index, start_index, end_index, start_us, end_us, micro_batches,
             phases: {inputs|forward|backward|optimizer|eval: [first, last entry]}
             ("eval": forwards no backward follows), peak_bytes, peak_index, peak_type;
             "from": "periodicity" when found from live memory alone (frameless traces)}
  peak       {bytes, index, time_us, type, by_category, iteration, phase, top: [largest live
             allocations: size, category, rule, alloc_index, addr, where, stack]}
  leaks      [{where, frames, stack, bytes_per_iteration, iterations, total_bytes, count,
             category, rule, growth_per_iteration}]
  ooms       [{index, time_us, requested, device_free, allocated, reserved,
             fragmentation_bytes, by_category, phase, suggestion, suggestions}]

Analysis: snapshot, devices, rule_names (index 0 "none"), rule_why (the rule's
explanation, same indexing), rules (the RuleSet used), facts (per-stack facts),
from_cache (the device results came from the snapshot's cache entry: its arrays are
read-only memory maps there; see classifiers/cache.py).
Peak types: PEAK_TYPES (DESIGN.md §4); phase names: PHASE_NAMES.

Helpers for the viewer (all vectorized):
  by_category_at(da, index) -> {category: live bytes} right after entry `index` (-1: start)
  live_by_category(da, indices) -> int64 [len(indices), len(CATEGORIES)]
  live_mask(allocs, index) -> bool per row
  top_allocations(an, da, index, n) -> list of dicts as in peak["top"]
  peak_type(an, da, index) -> DESIGN.md §4 type of a moment
  stack_strings(an, stack_id) / rule_info(an, rule_index) -> readable frames / rule id, why
  phase_ranges(da) -> [(start_index, end_index, phase name)] runs of equal phase
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..parsers import Allocations, LiveModel, Progress, Snapshot, allocations, live_model
from ..parsers.tables import A_ALLOC
from . import cache, findings
from .engine import SnapshotFacts, classify_device, stack_pass
from .rules import CATEGORIES, RuleSet, load_rules
from .timeline import PHASE_NAMES, Timeline

UNKNOWN = CATEGORIES.index("unknown")
PEAK_TYPES = findings.PEAK_TYPES


@dataclass
class DeviceAnalysis:
    device: int
    live: LiveModel
    allocs: Allocations
    category: np.ndarray                 # uint8 per allocation row, index into CATEGORIES
    rule: np.ndarray                     # int16 per allocation row, index into Analysis.rule_names
    iterations: list = field(default_factory=list)
    peak: dict = field(default_factory=dict)
    leaks: list = field(default_factory=list)
    ooms: list = field(default_factory=list)
    timeline: Timeline | None = None
    chain_root: np.ndarray | None = None
    chain_last: np.ndarray | None = None
    row_phase: np.ndarray | None = None
    torch_category: np.ndarray | None = None
    trace_action: np.ndarray | None = None
    trace_stack: np.ndarray | None = None
    oom_indices: np.ndarray | None = None


@dataclass
class Analysis:
    snapshot: Snapshot
    devices: dict
    rule_names: list
    rules: RuleSet | None = None
    facts: SnapshotFacts | None = None
    from_cache: bool = False             # the results were read from the snapshot's cache entry

    @property
    def rule_why(self) -> list:
        if self.rules is None:
            return [""] * len(self.rule_names)
        return ["no rule matched"] + [r.why for r in self.rules.rules]


def analyze(snap: Snapshot, progress: Progress | None = None, rules_path=None,
            rules: RuleSet | None = None, use_cache: bool = True) -> Analysis:
    """Classify and analyze every device of `snap` (see the module docstring).

    When `snap` came from the column cache (`snap.cache_entry`) and `use_cache` is true,
    the results are read from, or stored into, that cache entry (classifiers/cache.py),
    keyed by our code and the rules: identical to a fresh analysis, without its cost."""
    explicit = rules
    rules = rules or load_rules(rules_path)
    devs = list(snap.devices)
    if progress is not None:
        progress.start("Analyzing", max(1, len(devs)) + 1)
    facts = stack_pass(snap, rules)
    rule_names = ["none"] + [r.id for r in rules.rules]
    fp = None
    if use_cache and snap.cache_entry:
        fp = cache.analysis_fingerprint(rules_path, explicit)
    devices = cache.load(snap, fp, rule_names) if fp else None
    from_cache = devices is not None
    if devices is None:
        devices = {}
        for k, dev in enumerate(devs):
            if progress is not None:
                progress.update(k + 1)
            devices[dev] = _analyze_device(snap, dev, facts, rules, rule_names)
        if fp:
            cache.save(snap, fp, devices, rule_names)
    if progress is not None:
        progress.finish()
    return Analysis(snap, devices, rule_names, rules, facts, from_cache=from_cache)


def _analyze_device(snap, dev, facts, rules, rule_names) -> DeviceAnalysis:
    t = snap.trace(dev)
    live = live_model(snap, dev)
    allocs = allocations(snap, dev)
    tl, cl = classify_device(snap, t, allocs, live, facts, rules, dev)
    da = DeviceAnalysis(dev, live, allocs, cl.category, cl.rule, timeline=tl, chain_root=cl.root,
                        chain_last=cl.last, row_phase=cl.row_phase)
    da.trace_action = np.asarray(t.columns["action"])
    da.trace_stack = np.asarray(t.columns["stack"])
    da.oom_indices = findings.oom_indices(t)
    da.iterations = tl.iterations
    if "category" in t.columns:
        col = np.asarray(t.columns["category"])
        ai = allocs.alloc_index
        da.torch_category = np.where(ai >= 0, col[np.clip(ai, 0, max(len(col) - 1, 0))], 0).astype(np.uint8)
    findings.iteration_peaks(da, facts)
    tus = np.asarray(t.columns["time_us"])
    p = live.peak_index
    da.peak = {
        "bytes": int(live.peak_bytes), "index": int(p),
        "time_us": int(tus[p]) if p >= 0 and tus[p] >= 0 else None,
        "type": findings.peak_type(da, facts, p),
        "by_category": findings.by_category_at(da, p),
        "iteration": int(tl.iteration[p]) if p >= 0 and tl.iteration[p] >= 0 else None,
        "phase": PHASE_NAMES[int(tl.phase[p])] if p >= 0 else "pre",
        "top": findings.top_allocations(da, facts, rule_names, p, 10),
    }
    da.leaks = findings.find_leaks(da, facts, rule_names)
    da.ooms = findings.oom_reports(da, snap)
    return da


# -- helpers for the viewer and reports --------------------------------------------------
by_category_at = findings.by_category_at
live_by_category = findings.live_by_category
live_mask = findings.live_mask


def top_allocations(an: Analysis, da: DeviceAnalysis, index: int, n: int = 10) -> list:
    return findings.top_allocations(da, an.facts, an.rule_names, index, n)


def peak_type(an: Analysis, da: DeviceAnalysis, index: int) -> str:
    return findings.peak_type(da, an.facts, index)


def stack_strings(an: Analysis, stack_id: int, limit: int = 24) -> list:
    return findings.stack_strings(an.facts, stack_id, limit=limit)


def rule_info(an: Analysis, rule_index: int) -> dict:
    return {"id": an.rule_names[rule_index], "why": an.rule_why[rule_index]}


def phase_ranges(da: DeviceAnalysis) -> list:
    """[(start_index, end_index, phase name)] runs of equal phase over the trace."""
    ph = da.timeline.phase if da.timeline is not None else np.zeros(0, np.uint8)
    if not len(ph):
        return []
    change = np.flatnonzero(ph[1:] != ph[:-1]) + 1
    starts = np.r_[0, change]
    ends = np.r_[change - 1, len(ph) - 1]
    return [(int(s), int(e), PHASE_NAMES[int(ph[s])]) for s, e in zip(starts, ends)]


def summary_dict(an: Analysis, device: int | None = None) -> dict:
    """The JSON of `vramscope summary --json` (DESIGN.md §6)."""
    snap = an.snapshot
    out = []
    for dev, da in an.devices.items():
        if device is not None and dev != device:
            continue
        t = snap.trace(dev)
        peak = dict(da.peak)
        out.append({
            "device": dev,
            "entries": len(t),
            "allocations": int(np.count_nonzero(np.asarray(t.columns["action"]) == A_ALLOC)),
            "peak": peak,
            "start_live_bytes": int(da.live.start_bytes),
            "end_live_bytes": int(da.live.end_bytes),
            "reserved_peak_bytes": None if da.live.reserved_peak is None else int(da.live.reserved_peak),
            "end_by_category": findings.by_category_at(da, len(t) - 1),
            "iterations": da.iterations,
            "leaks": [{k: v for k, v in lk.items() if k != "stack"} for lk in da.leaks],
            "ooms": da.ooms,
        })
    return {"file": snap.path, "devices": out}


__all__ = ["CATEGORIES", "PEAK_TYPES", "PHASE_NAMES", "Analysis", "DeviceAnalysis", "analyze", "summary_dict",
           "by_category_at", "live_by_category", "live_mask", "top_allocations", "peak_type", "stack_strings",
           "rule_info", "phase_ranges", "load_rules", "UNKNOWN"]
