"""The one query API behind the viewer, the command line and the reports.

    an = analyze(snap, progress=None, rules_path=None, rules=None, use_cache=True)   # -> Analysis
    da = an.devices[dev]                                                           # -> DeviceAnalysis

`analyze` classifies every allocation (rules in classifiers/rules.toml, user rules from
`rules_path`, $VRAMSCOPE_RULES or ~/.config/vramscope/rules.toml|json; see rules.py),
finds iterations and phases, types the peaks, and reports leaks and OOMs. Results are
the frozen dataclasses of `results.py`; the large per-allocation and per-entry facts are
numpy columns:

DeviceAnalysis (one per device with data):
  live       parsers.LiveModel (live bytes after every entry, the peak, reserved memory)
  allocs     parsers.Allocations: one row per allocation, the rows of `allocations --csv`
             (blocks live before the trace began included, alloc_index -1)
  category   uint8 per row, index into CATEGORIES;  rule  int16 per row, into rule_names
  evidence   uint8 per row, index into evidence.EVIDENCE: what the category rests on
  rules_category  uint8 per row: our rules' own verdict (differs from `category` only
             where torch's own tag decided it; torch_tags.py)
  torch_category  uint8 per row into snap.category_names (torch's own category on
             profiler-converted files that carry one, 0 elsewhere) or None
  torch_component uint8 per row into snap.component_names (component tracking's tag,
             torch main; 0 untagged) or None (torch_tags.py decides what either tag decides)
  timeline   timeline.Timeline: `phase` (uint8 per entry, PHASE_NAMES), `segment`,
             `iteration` (int32 per entry: Iteration.number - 1, -1 outside), `first_start`
  chain_root / chain_last  first / last version of each row's version-bump chain
  row_phase  uint8 per row: phase where its chain was allocated
  peak (Peak), iterations (Iteration...), leaks (Leak...), ooms (Oom...)
and the queries every surface uses (by_category_at, live_by_category, largest_live,
allocation, peak_type, phase_ranges, findings, summary, ...), documented on each method.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ..parsers import (
    Allocations,
    LiveModel,
    Progress,
    Snapshot,
    allocations,
    live_model,
)
from . import cache
from .carried import apply_carried
from .categories import CATEGORIES
from .evidence import E_GUESS, EVIDENCE, bytes_by_evidence
from .engine import SnapshotFacts, classify_device, stack_pass, timeline_of
from .leaks import find_leaks, leak_rows
from .metadata import RowMetadata, group_rows, row_metadata
from .pools import PoolFootprint, pool_footprints
from .liveset import AllocOrder, CategorySeries, Composition, by_category_evidence_at, largest_of, live_mask
from .levers import left_out
from ..common.clock import StageClock, stage
from ..common.later import Later, after_unless_leaving, in_order
from .advice import ADVICE_LEVERS, advise
from .ooms import evidence_totals, expandable_segments_on, oom_indices, oom_reports
from .runfacts import run_facts
from .peaks import PEAK_TYPES, peak_type, with_peaks
from .recording import host_memory, skipped_actions
from .results import (
    Allocation,
    DeviceSummary,
    Finding,
    HostMemory,
    Iteration,
    Leak,
    MetadataGroup,
    Oom,
    Peak,
    RunFacts,
    StaleGradients,
)
from .rules import RuleSet, load_rules
from . import structure as structure_module
from .stale import stale_gradients
from .timeline import PHASE_NAMES, Timeline, guess_frees_carry_alloc_frames
from .torch_tags import TORCH_RULES, combine, component_rows, component_tags, profiler_tags

if TYPE_CHECKING:       # imported where used: a cached `vramscope summary` never needs the allocator
    from .allocator import AllocatorHistory

NO_PEAK = Peak(bytes=0, index=-1, time_us=None, type="other", by_category={}, iteration=None, phase="pre")


@dataclass(eq=False)
class DeviceAnalysis:
    device: int
    live: LiveModel
    allocs: Allocations
    category: np.ndarray                 # uint8 per allocation row, index into CATEGORIES
    rule: np.ndarray                     # int16 per allocation row, index into rule_names
    timeline: Timeline
    chain_root: np.ndarray
    chain_last: np.ndarray
    row_phase: np.ndarray
    trace_action: np.ndarray
    trace_stack: np.ndarray
    oom_indices: np.ndarray
    evidence: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    rules_category: np.ndarray | None = None
    torch_category: np.ndarray | None = None
    torch_component: np.ndarray | None = None
    iterations: Sequence[Iteration] = ()  # Iterations (columns) once analyzed
    peak: Peak = NO_PEAK                 # filled by analyze()
    leaks: tuple[Leak, ...] = ()
    ooms: tuple[Oom, ...] = ()
    stale_gradients: StaleGradients | None = None
    run: RunFacts = field(default_factory=RunFacts)
    # set by `analyze` (not cached): what the queries below need from the whole analysis
    facts: SnapshotFacts | None = field(default=None, repr=False)
    rule_names: list[str] = field(default_factory=list, repr=False)
    trace_forward_stack: np.ndarray | None = field(default=None, repr=False)
    skipped_actions: tuple[str, ...] = ()   # left out by the recording (recording.skipped_actions)
    snapshot: Snapshot | None = field(default=None, repr=False)
    _metadata: RowMetadata | None = field(default=None, repr=False)
    _free_order: tuple | None = field(default=None, repr=False)
    _composition: Composition | None = field(default=None, repr=False)
    _guessed: Composition | bool | None = field(default=None, repr=False)
    _reserved_adds_up: bool | None = field(default=None, repr=False)
    _alloc_order: AllocOrder | None = field(default=None, repr=False)

    # -- what is live ----------------------------------------------------------------------
    @property
    def n_entries(self) -> int:
        return len(self.trace_action)

    def live_mask(self, index: int) -> np.ndarray:
        """bool per row: live right after entry `index` (-1: before the trace)."""
        return live_mask(self.allocs, index)

    def reserved_unallocated_at(self, index: int) -> int | None:
        """Reserved but unallocated bytes right after entry `index` (classifiers.allocator);
        None without allocator segments."""
        from .allocator import reserved_unallocated
        if self.reserved_unknown():
            return None
        allocated = self.live.live_after[index] if 0 <= index < len(self.live.live_after) else self.live.start_bytes
        return reserved_unallocated(self.live.reserved_at(index), int(allocated))

    def composition(self) -> Composition:
        """Live bytes per category at any entry (liveset.Composition: the one implementation
        every surface reads), built on first use, once per device."""
        if self._composition is None:
            self._composition = Composition(self.category, self.allocs, self.n_entries)
        return self._composition

    def guessed_composition(self) -> Composition | None:
        """Like `composition`, of the rows whose category is a guess (evidence guess or none)
        only: what a surface draws as "a guess" (the last code, len(CATEGORIES), holds the
        rest); None when no row is a guess. Built on first use."""
        if self._guessed is None:
            guessed = self.evidence >= E_GUESS
            if not guessed.any():
                self._guessed = False
            else:
                codes = np.where(guessed, self.category, len(CATEGORIES)).astype(np.uint8)
                # the same rows' events: the entry -> row codes are shared with `composition`'s
                self._guessed = Composition(codes, self.allocs, self.n_entries, len(CATEGORIES) + 1,
                                            codes=self.composition().codes)
        return self._guessed if isinstance(self._guessed, Composition) else None

    def guessed_by_category(self, indices, dtype=np.int64) -> np.ndarray | None:
        """[len(indices), len(CATEGORIES)]: live bytes per category that are a guess, after
        each entry (-1: the start); None when nothing is a guess."""
        g = self.guessed_composition()
        return None if g is None else g.at(indices, dtype)[:, :len(CATEGORIES)]

    def by_category_at(self, index: int) -> dict[str, int]:
        """Live bytes per category right after entry `index` (-1: at the start), non-zero only:
        the composition's where it is built (the viewer's, for many moments at once), else
        summed over the rows live then (one moment, one pass: a `summary` reads the end's,
        without building the composition of every moment, 0.3 s at 10^7 events)."""
        if self._composition is not None:
            return self._composition.by_category(index)
        per = by_category_evidence_at(self.category, self.evidence, self.allocs, index)
        totals = {c: sum(e.values()) for c, e in per.items()}
        return {c: b for c, b in totals.items() if b}

    def category_series(self) -> list[CategorySeries]:
        """Per category code: its live bytes over the trace, as the entries where it changes."""
        return self.composition().series()

    def live_by_category(self, indices, dtype=np.int64) -> np.ndarray:
        """[len(indices), len(CATEGORIES)] (int64; float64 for drawing): live bytes per
        category after each entry (-1: the start state)."""
        return self.composition().at(indices, dtype)

    def alloc_order(self) -> AllocOrder:
        """The rows in allocation order (liveset.AllocOrder), computed once."""
        if self._alloc_order is None:
            self._alloc_order = AllocOrder(self.allocs)
        return self._alloc_order

    def live_rows(self, index: int) -> np.ndarray:
        """Rows live right after entry `index` (-1: before the trace), in allocation order."""
        return self.alloc_order().live_rows(index)

    def largest_live_rows(self, index: int, n: int = 10, category: int | None = None) -> np.ndarray:
        """Rows of the `n` largest allocations live right after entry `index` (optionally of
        one category code), biggest first (ties: the earlier row first)."""
        rows = self.live_rows(index)
        if category is not None:
            rows = rows[self.category[rows] == category]
        return largest_of(self.allocs, rows, n)

    def largest_live(self, index: int, n: int = 10) -> list[Allocation]:
        """The `n` largest allocations live right after entry `index`, biggest first."""
        return [self.allocation(int(r)) for r in self.largest_live_rows(index, n)]

    def allocation(self, row: int) -> Allocation:
        a = self.allocs
        ai = int(a.alloc_index[row])
        md = self.metadata()
        a_us, f_us = a.times_of(row)
        return Allocation(row=int(row), size=int(a.size[row]), addr=int(a.addr[row]), alloc_index=ai,
                          free_index=int(a.free_index[row]), alloc_us=a_us, free_us=f_us, category=CATEGORIES[int(self.category[row])],
                          rule=self.rule_name(int(self.rule[row])), stack=int(a.stack[row]),
                          forward_stack=self.forward_stack_of(ai), evidence=EVIDENCE[int(self.evidence[row])],
                          rules_category=self.rules_category_of(row), torch_tag=self.torch_tag_of(row),
                          module=self.module_of(row), metadata=tuple(md.texts(row)) if md is not None else ())

    def torch_tag_of(self, row: int) -> str:
        """torch's own tag of `row` as the file names it: the profiler's category, or component
        tracking's type ('' none)."""
        snap = self.snapshot
        for col, names in ((self.torch_category, snap.category_names if snap else []),
                           (self.torch_component, snap.component_names if snap else [])):
            if col is not None and 0 <= row < len(col) and 0 < int(col[row]) < len(names):
                return str(names[int(col[row])])
        return ""

    # -- metadata -------------------------------------------------------------------------
    def metadata(self) -> RowMetadata | None:
        """user_metadata, notes (annotate) and internal tags per row (metadata.py), computed
        once; None without the snapshot."""
        if self._metadata is None and self.snapshot is not None:
            self._metadata = row_metadata(self.snapshot, self.device, self.allocs)
        return self._metadata

    def module_of(self, row: int) -> str:
        """The module a row was allocated in, where torch's component tracking names it (it
        sets user_metadata to the module's qualified name; 'optimizer' inside optimizer.step()):
        '' elsewhere, and in files without component tags."""
        md = self.metadata()
        if self.torch_component is None or md is None or not 0 <= row < len(md.user) or md.user[row] < 0:
            return ""
        return md.strings[int(md.user[row])]

    def pool_footprints(self) -> tuple[PoolFootprint, ...]:
        """Private memory pools per (pool, stream): memory_viz's envelopes, as numbers
        (pools.py); () without any or without the snapshot."""
        return pool_footprints(self.snapshot, self) if self.snapshot is not None else ()

    def group_by_metadata(self, key: str | None = None) -> list[MetadataGroup]:
        """Allocations grouped by what their metadata says for `key` (`step` of 'step=12' or
        of {"step": 12}); `key` None groups by the whole user_metadata text. Each group's
        allocations, bytes allocated and bytes live at the peak, most bytes first; the
        allocations without the key last (value '')."""
        md = self.metadata()
        if md is None:
            return []
        values, names = md.values(key)
        return group_rows(values, names, np.asarray(self.allocs.size), self.live_mask(self.peak.index))

    def rules_category_of(self, row: int) -> str | None:
        """Our rules' category for `row` where torch's own tag decided another, else None."""
        rc = self.rules_category
        if rc is None or row < 0 or row >= len(rc) or rc[row] == self.category[row]:
            return None
        return CATEGORIES[int(rc[row])]

    def by_category_evidence_at(self, index: int) -> dict[str, dict[str, int]]:
        """{category: {evidence: live bytes}} right after entry `index` (-1: at the start)."""
        return by_category_evidence_at(self.category, self.evidence, self.allocs, index)

    def by_evidence_at(self, index: int) -> dict[str, int]:
        """Live bytes per evidence level right after entry `index` (-1: at the start)."""
        return bytes_by_evidence(self.evidence, self.allocs.size, np.flatnonzero(self.live_mask(index)))

    def rule_name(self, code: int) -> str:
        return self.rule_names[code] if 0 <= code < len(self.rule_names) else "none"

    def forward_stack_of(self, index: int) -> int:
        """torch 2.13: the forward stack recorded with the entry (a backward allocation's
        forward op), -1 where there is none."""
        f = self.trace_forward_stack
        if f is None or index < 0 or index >= len(f):
            return -1
        return int(f[index])

    @property
    def state_only(self) -> bool:
        """A snapshot without a trace (its run's fact, RunFacts.state_only): what every surface
        reads to place its peak and date its blocks."""
        run = getattr(self, "run", None)
        return bool(run is not None and run.state_only)

    def frees_record_their_own_stack(self) -> bool:
        """Whether free entries carry the stack of the free, not of the allocation (torch's
        CUDA traces by default): then a block allocated before the trace and freed in it
        only has the stack of its free."""
        return not self.timeline.frees_carry_alloc_frames

    # -- moments --------------------------------------------------------------------------
    def peak_type(self, index: int) -> str:
        """DESIGN.md §4 type of the moment right after entry `index`."""
        return peak_type(self, self.facts, index)

    def phase_at(self, index: int) -> str:
        ph = self.timeline.phase
        return PHASE_NAMES[int(ph[index])] if 0 <= index < len(ph) else "pre"

    def iteration_at(self, index: int) -> Iteration | None:
        k = self.timeline.iteration_of(index) if 0 <= index < len(self.timeline.phase) else -1
        return self.iterations[k] if 0 <= k < len(self.iterations) else None

    def _phase_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(first entry, last entry) of each run of equal phase over the trace, in order."""
        ph = self.timeline.phase
        change = np.flatnonzero(ph[1:] != ph[:-1]) + 1
        return np.r_[0, change], np.r_[change - 1, len(ph) - 1]

    def phase_ranges(self) -> list[tuple[int, int, str]]:
        """[(start_index, end_index, phase name)] runs of equal phase over the trace."""
        ph = self.timeline.phase
        if not len(ph):
            return []
        starts, ends = self._phase_bounds()
        return [(int(s), int(e), PHASE_NAMES[int(ph[s])]) for s, e in zip(starts, ends)]

    def phase_runs(self, name: str) -> np.ndarray:
        """int64 [n, 2]: (start_index, end_index) of the runs of phase `name`, in order:
        `phase_ranges`' of that name, found without a tuple for every run of every phase (a run
        of short steps has a million forward runs, 185 MB as tuples)."""
        ph = self.timeline.phase
        if not len(ph) or name not in PHASE_NAMES:
            return np.zeros((0, 2), dtype=np.int64)
        starts, ends = self._phase_bounds()
        mine = ph[starts] == PHASE_NAMES.index(name)
        return np.stack([starts[mine], ends[mine]], axis=1).astype(np.int64, copy=False)

    def free_order(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows sorted by free index, their free indices), computed once (on a big run, on
        the live model's thread while the rows are classified)."""
        if self._free_order is None:
            self._free_order = free_order_of(self.allocs)
        return self._free_order

    # -- findings ---------------------------------------------------------------------------
    def leak_rows(self, leak: Leak) -> np.ndarray:
        return leak_rows(self, leak)

    def findings(self, iteration_peaks: bool = True) -> list[Finding]:
        """Peak, OOMs, leaks, then each iteration's peak: the order the viewer lists them
        (without `iteration_peaks`: the rest alone; `iteration_finding(k)` makes the k-th)."""
        out = [Finding("peak", self.peak.index, self.peak)]
        out += [Finding("oom", o.index, o) for o in self.ooms]
        if self.stale_gradients is not None:
            sg = self.stale_gradients
            out.append(Finding("stale_gradients", sg.freed_last if sg.freed_last >= 0 else self.peak.index, sg))
        for lk in self.leaks:
            rows = self.leak_rows(lk)
            out.append(Finding("leak", int(self.allocs.alloc_index[rows[-1]]) if len(rows) else -1, lk))
        if iteration_peaks:
            out += [Finding("iteration_peak", it.peak_index, it) for it in self.iterations]
        return out

    def iteration_finding(self, k: int) -> Finding:
        """The finding of iteration k's peak (k from 0), as `findings()` lists it."""
        it = self.iterations[k]
        return Finding("iteration_peak", it.peak_index, it)

    def summary(self) -> DeviceSummary:
        n = self.n_entries
        return DeviceSummary(
            device=self.device, entries=n, allocations=len(self.allocs),
            allocations_before_trace=int(np.count_nonzero(self.allocs.alloc_index < 0)),
            peak=self.peak, start_live_bytes=int(self.live.start_bytes), end_live_bytes=int(self.live.end_bytes),
            reserved_peak_bytes=None if self.live.reserved_peak is None or self.reserved_unknown()
            else int(self.live.reserved_peak),
            end_by_category=self.by_category_at(n - 1), iterations=self.iterations, leaks=self.leaks,
            ooms=self.ooms, stale_gradients=self.stale_gradients, skipped_actions=self.skipped_actions,
            reserved_unknown=self.reserved_unknown_why())

    def reserved_unknown(self) -> bool:
        """Reserved memory over the trace is unknown (`reserved_unknown_why`)."""
        return self.reserved_unknown_why() is not None

    def reserved_known(self) -> bool:
        """The allocator's segments over the trace are known: the snapshot has segments, and
        reserved memory is not unknown (what the allocator's history and the reserved line read)."""
        return self.live is not None and self.live.reserved_start is not None and not self.reserved_unknown()

    def reserved_unknown_why(self) -> str | None:
        """Why reserved memory over the trace is unknown, or None where it is known (or the
        snapshot has no allocator segments: LiveModel.reserved_start None). It is found from the
        segments the snapshot holds at its end, back through the trace's segment events: unknown
        where those events were not recorded, or where they do not add up to those segments
        (less than nothing reserved at some moment: a trace replayed over another state, or
        events lost). (Less reserved than live is not taken for that: the rows live before the
        trace are partly inferred from the end state, and a synthetic trace had 512 MiB of them
        before its first segment.)"""
        if any(a.startswith("segment_") for a in self.skipped_actions):
            return "its segment events were not recorded"
        lm = self.live
        if lm is None or lm.reserved_start is None:
            return None
        if self._reserved_adds_up is None:
            v = np.asarray(lm.reserved_change_value)
            self._reserved_adds_up = bool(lm.reserved_start >= 0 and not (len(v) and int(v.min()) < 0))
        if not self._reserved_adds_up:
            return "the trace's segment events do not add up to the segments the snapshot holds"
        return None


@dataclass(eq=False)
class Analysis:
    snapshot: Snapshot
    devices: dict[int, DeviceAnalysis]
    rule_names: list[str]
    rules: RuleSet | None = None
    facts: SnapshotFacts | None = None
    from_cache: bool = False             # the results were read from the snapshot's cache entry
    host: HostMemory | None = None       # pinned host memory (2.14): its own space, never a GPU's
    _allocators: dict[int, AllocatorHistory] = field(default_factory=dict, repr=False)

    def allocator(self, device: int, made: AllocatorHistory | None = None) -> AllocatorHistory:
        """The caching allocator of `device` over the trace (classifiers/allocator.py): its
        segments and blocks at any entry, built on first use (`made`: one already built for
        this device's analysis, beside it: kept unless there is one already)."""
        if made is not None and made.da is self.devices.get(device):
            self._allocators.setdefault(device, made)
        if device not in self._allocators:
            from .allocator import AllocatorHistory
            self._allocators[device] = AllocatorHistory(self.snapshot, self.devices[device])
        return self._allocators[device]

    @property
    def rule_why(self) -> list[str]:
        if self.rules is None:
            return [""] * len(self.rule_names)
        return ["no rule matched"] + [r.why for r in self.rules.rules] + list(TORCH_RULES.values())

    def primary_device(self) -> int | None:
        """The device to look at first: one that ran out of memory, else the highest peak
        (ties: the lower device number); None without devices."""
        if not self.devices:
            return None

        def key(dev):
            da = self.devices[dev]
            return (0 if da.ooms else 1, -da.peak.bytes, dev)
        return min(self.devices, key=key)

    def device_order(self) -> list[int]:
        """The primary device first, then the others by number."""
        first = self.primary_device()
        return ([first] if first is not None else []) + sorted(d for d in self.devices if d != first)


_TIMELINE_BESIDE_ENTRIES = 500_000     # trace entries from which the timeline is built beside the pairing


def free_order_of(allocs) -> tuple[np.ndarray, np.ndarray]:
    """(rows sorted by free index, stable, their free indices): DeviceAnalysis.free_order."""
    fi = allocs.free_index
    order = np.argsort(fi, kind="stable")
    if len(order) < 2**31 - 1:
        order = order.astype(np.int32)       # (kept with the analysis: half of int64's 31 MB at 10^7 events)
    return order, fi[order]


def analyze(snap: Snapshot, progress: Progress | None = None, rules_path=None,
            rules: RuleSet | None = None, use_cache: bool = True, clock: StageClock | None = None,
            beside: Callable[[DeviceAnalysis], object] | None = None) -> Analysis:
    """Classify and analyze every device of `snap` (see the module docstring).

    When `snap` came from the column cache (`snap.cache_entry`) and `use_cache` is true,
    the results are read from, or stored into, that cache entry (classifiers/cache.py),
    keyed by our code and the rules: identical to a fresh analysis, without its cost.

    `beside(da)`: called once for each device analyzed here (not read from the cache) as soon
    as its rows are classified (their categories, rules and evidence, the live bytes, the
    iterations' bounds: none of which a later stage changes), before its peaks, run facts,
    leaks and levers: for a caller to start work of its own on them, on a thread, while the
    analysis goes on (the viewer's model of the device: viewer/model/device.py)."""
    explicit = rules
    rules = rules or load_rules(rules_path)
    devs = list(snap.devices)
    if progress is not None:
        progress.start("Analyzing", max(1, len(devs)) + 1)
    with stage(clock, "stacks"):
        facts = stack_pass(snap, rules)
    rule_names = ["none"] + [r.id for r in rules.rules] + list(TORCH_RULES)
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
            devices[dev] = _analyze_device(snap, dev, facts, rules, rule_names, clock, beside, fp)
        if fp:
            # a big analysis is written on a thread while the caller goes on (cache.save_later)
            if sum(len(da.allocs) for da in devices.values()) >= structure_module.BACKGROUND_ROWS:
                cache.save_later(snap, fp, devices, rule_names)
            else:
                cache.save(snap, fp, devices, rule_names)
    else:
        for da in devices.values():
            _attach(da, snap, facts, rule_names)
    if progress is not None:
        progress.finish()
    return Analysis(snap, devices, rule_names, rules, facts, from_cache=from_cache, host=host_memory(snap))


def _attach(da: DeviceAnalysis, snap: Snapshot, facts: SnapshotFacts, rule_names: list,
            skipped: Later[tuple[str, ...]] | None = None) -> None:
    da.facts = facts
    da.rule_names = rule_names
    da.snapshot = snap
    cols = snap.trace(da.device).columns
    da.trace_forward_stack = np.asarray(cols["forward_stack"]) if "forward_stack" in cols else None
    da.skipped_actions = skipped.get() if skipped is not None else skipped_actions(snap, da.device)


def _analyze_device(snap, dev, facts, rules, rule_names, clock: StageClock | None = None,
                    beside: Callable[[DeviceAnalysis], object] | None = None,
                    fp: str | None = None) -> DeviceAnalysis:
    t = snap.trace(dev)
    # live bytes after each entry: on a thread beside classify on a big run (classify asks
    # for them only where the phases come from memory's periodicity), once the rows are paired
    # (the live bytes read the rows' sizes, and of the trace's column only the segments' events:
    # its pages are let go once the rows are paired, below)
    rows: list[Allocations] = []
    find_live = Later(lambda: live_model(snap, dev, rows=rows[0]))

    def live_after():
        return find_live.get().live_after
    # the timeline (phases, iterations) on a thread beside the pairing of the rows, on a big run
    # (it reads them only for whether frees carry their allocation's frames: guessed from the
    # trace's first entries, and built again in classify where the rows say otherwise)
    begun = None
    # what the recording left out reads the trace alone: found beside the pairing too, after the
    # timeline (2 CPUs, 10^7 events: 0.14 s off the main thread where the trace has no segment
    # events and the allocations' addresses are read again), else beside classify (below)
    find_skipped: Later[tuple[str, ...]] | None = None
    if len(t) >= _TIMELINE_BESIDE_ENTRIES and not facts.profiler_like:
        guess = guess_frees_carry_alloc_frames(t)
        if guess is not None:
            begun = Later(lambda: timeline_of(snap, t, None, live_after, facts, rules, dev, guess))
            find_skipped = Later(lambda: skipped_actions(snap, dev))
            in_order([begun, find_skipped], name="vramscope-timeline")
    with stage(clock, "allocations"):
        try:
            allocs = allocations(snap, dev)
        except BaseException as e:       # the timeline's thread may be waiting for the live bytes
            find_live.give_up(e)
            raise
        rows.append(allocs)
        # each column of the trace is let go (DeviceTrace.release) once the stages that read it
        # whole are done: read again from then on only here and there (an OOM's request, a
        # segment event's size, a moment's time), its pages would stay in the highest memory of
        # every stage after (the sizes: 76 MB of a torch 2.0 trace of 10^7 entries, in the
        # live bytes' and classify's highest, until the live bytes read the rows' own)
        t.release(("addr", "size"))
        # ... and the rows in free order the iterations' peak types read, after the live bytes
        find_free_order = Later(lambda: free_order_of(allocs))
        big = len(allocs) >= structure_module.BACKGROUND_ROWS
        if big:
            jobs: list[Later] = [find_live, find_free_order]
            if find_skipped is None:
                find_skipped = Later(lambda: skipped_actions(snap, dev))
                jobs.append(find_skipped)
            in_order(jobs, name="vramscope-live")
        else:
            find_live.run()
    with stage(clock, "classify"):
        tl, cl = classify_device(snap, t, allocs, live_after, facts, rules, dev, begun)
        live = find_live.get()
        t.release(("size", "stream"))
    torch_category = None
    rules_category = None
    if "category" in t.columns:
        col = np.asarray(t.columns["category"])
        ai = allocs.alloc_index
        torch_category = np.where(ai >= 0, col[np.clip(ai, 0, max(len(col) - 1, 0))], 0).astype(np.uint8)
        tag, precise = profiler_tags(torch_category, snap.category_names)
        rules_category = combine(cl.category, cl.rule, cl.evidence, tag, precise,
                                 rule_names.index("torch.profiler_category"))
    torch_component = component_rows(snap, dev, allocs)
    if torch_component is not None:
        tag, precise = component_tags(torch_component, snap.component_names)
        ours = combine(cl.category, cl.rule, cl.evidence, tag, precise, rule_names.index("torch.component"))
        rules_category = ours if rules_category is None else rules_category
    apply_carried(snap, dev, allocs, cl.category, cl.rule, cl.evidence, rule_names)
    da = DeviceAnalysis(dev, live, allocs, cl.category, cl.rule, timeline=tl, chain_root=cl.root,
                        chain_last=cl.last, row_phase=cl.row_phase, trace_action=np.asarray(t.columns["action"]),
                        trace_stack=np.asarray(t.columns["stack"]), oom_indices=oom_indices(t),
                        evidence=cl.evidence, rules_category=rules_category, torch_category=torch_category,
                        torch_component=torch_component)
    _attach(da, snap, facts, rule_names, find_skipped)
    if big:
        da._free_order = find_free_order.get()
    da.iterations = tl.iterations                 # numbered (Iterations); each one's own peak below
    # the arrays the cache keeps are final here: written on a thread beside the stages that
    # follow (on a big run after the blocks' structure, on its thread: see below)
    save_arrays = cache.arrays_job(snap, fp, dev, da) if big and fp else None
    if beside is not None:
        beside(da)
    with stage(clock, "peaks"):
        tus = np.asarray(t.columns["time_us"])
        p = live.peak_index
        it = da.iteration_at(p)
        by_ev = by_category_evidence_at(da.category, da.evidence, da.allocs, p)
        da.peak = Peak(bytes=int(live.peak_bytes), index=int(p),
                       time_us=int(tus[p]) if p >= 0 and tus[p] >= 0 else None,
                       type=da.peak_type(p), by_category={c: sum(e.values()) for c, e in by_ev.items()},
                       iteration=it.number if it is not None else None, phase=da.phase_at(p),
                       by_evidence=evidence_totals(by_ev))
    # the blocks' structure (what the levers simulate on) on a thread, beside what follows, the
    # run's facts first (it reads them at one place, waiting for them there: structure.py
    # `_run_facts`). The live bytes per category, which the summary reads, stay for after the
    # levers: built beside them they held 70-100 MB more at the highest memory of a cold summary
    find_run: Later[RunFacts] = Later(lambda: run_facts(da, facts))
    find_structure = structure_module.later(da, run=find_run)
    if find_structure is not None:
        # the cache's arrays after the structure (beside the main thread's simulation of the
        # levers that wait for it): written beside the structure instead, they took a core
        # from what the run's end waits for. Or once the command is leaving, where nothing
        # asked for the structure (no lever applied to the advice): the exit does not wait for
        # it (0.3-0.5 s after a 10^6-entry inference trace's summary was written)
        in_order([find_structure], name="vramscope-structure", daemon=True)
        if save_arrays is not None:
            in_order([after_unless_leaving(find_structure), save_arrays], name="vramscope-analysis-cache-arrays",
                     daemon=False)
    elif save_arrays is not None:
        in_order([save_arrays], name="vramscope-analysis-cache-arrays", daemon=False)
    with stage(clock, "run facts"):
        find_run.run()
        da.run = find_run.get()
    t.release(("time_us",))           # (see the "addr" column's release above)
    with stage(clock, "peaks"):
        da.iterations = tl.iterations = with_peaks(da, facts, tl.iterations)
    with stage(clock, "leaks"):
        da.leaks = find_leaks(da, rule_names)
    with stage(clock, "stale gradients"):
        da.stale_gradients = stale_gradients(da)
    expandable = expandable_segments_on(snap.allocator_settings)
    with stage(clock, "advice"):
        da.peak = replace(da.peak, by_category_evidence=by_ev,
                          advice=advise(da, by_ev, int(live.peak_bytes), expandable=expandable),
                          advice_left_out={n: why for n in ADVICE_LEVERS
                                           if (why := left_out(n, da.run, expandable)) is not None})
    with stage(clock, "ooms"):
        da.ooms = oom_reports(da, snap)
    return da


__all__ = ["CATEGORIES", "PEAK_TYPES", "PHASE_NAMES", "Analysis", "DeviceAnalysis", "analyze"]
