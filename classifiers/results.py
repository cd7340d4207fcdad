"""What the analysis answers, as frozen dataclasses: the one vocabulary of every surface.

The viewer, the report, the command line and `--json` read these and nothing else:
no dict with guessed keys anywhere. They hold facts (bytes, trace indices, stack ids,
category and lever names); how a fact is worded (a stack's user frame, units, advice
sentences, plain words for a peak type) is the presentation layer's job
(`vramscope.present`), so a number is computed once and told one way.

Conventions shared by every class here:
  * a trace `index` is a position in `device_traces[device]`; -1 means the state
    before the trace began (blocks live before it, or the start as the peak);
  * iterations are numbered from 1 (`Iteration.number`), and every reference to an
    iteration (`Peak.iteration`, `Leak.iterations`) uses that number;
  * `by_category` maps category names to live bytes, non-zero entries only.

`to_plain` turns any of them into JSON-ready data; `from_plain` checks and rebuilds
one from such data (the analysis cache: a damaged or foreign manifest raises
ValueError rather than building a wrong result).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any


@dataclass(frozen=True)
class Advice:
    """One lever a user can pull, with what it would save where that is known."""
    lever: str                      # see vramscope.present.words.LEVER_WORDS
    category: str | None = None     # the category it acts on
    saves_bytes: int | None = None  # an estimate at the moment the advice is about
    evidence: str = "stack"         # the weakest evidence of the bytes it saves (never "guess" alone)
    target: str = ""                # what it acts on, where the run names it (checkpointing: the repeated blocks)
    estimate: bool = False          # a factor's estimate, not a simulation of the recorded run
    training: bool = True           # the run trains (the batch lever is worded for training, else for inference)
    lower_bound: bool = False       # simulated on a trace that ends in an OOM: the rest of the step is not in it


@dataclass(frozen=True)
class Peak:
    """The moment of highest live memory (DESIGN.md §4)."""
    bytes: int
    index: int                      # the alloc that reached it; -1: the start state is the peak
    time_us: int | None
    type: str                       # one of PEAK_TYPES
    by_category: dict[str, int]
    iteration: int | None           # Iteration.number, None outside iterations
    phase: str                      # PHASE_NAMES of the entry ("pre" for the start state)
    advice: tuple[Advice, ...] = ()  # the levers worth pulling here, most saving first
    by_evidence: dict[str, int] = field(default_factory=dict)   # live bytes per evidence level
    by_category_evidence: dict[str, dict[str, int]] = field(default_factory=dict)  # {category: {evidence: bytes}}
    advice_left_out: dict[str, str] = field(default_factory=dict)  # {lever: why it cannot apply to this run}


@dataclass(frozen=True)
class Iteration:
    """One training step: from its forward (and the input preparation before it) to
    the end of its optimizer step (or its backward, without an optimizer)."""
    number: int                     # 1, 2, ...
    start_index: int
    end_index: int                  # inclusive
    start_us: int | None
    end_us: int | None
    phases: dict[str, tuple[int, int]]     # inputs|forward|backward|optimizer|eval -> (first, last)
    micro_batches: int
    # how its bounds were found: "phases" (a backward or an optimizer step ends it, from stacks or
    # annotations); a guess otherwise: "forward_runs" (forward runs told apart by the work between
    # them, nothing marking an iteration's end), "periodicity" (live memory's repetition alone)
    source: str = "phases"
    peak_bytes: int = 0
    peak_index: int = -1
    peak_type: str = "other"


@dataclass(frozen=True)
class Region:
    """A record_function region of the snapshot's `external_annotations` (torch 2.5+)."""
    name: str
    start_us: int
    end_us: int | None              # None: never closed in the snapshot
    phase: str                      # the phase its name maps to (rules.toml [annotations]), "" none
    start_item: int                 # position of its START in the snapshot's annotation list


@dataclass(frozen=True)
class Leak:
    """One cause of growing memory: allocations kept iteration after iteration by one site.

    Allocations from several stacks are one leak when they are kept in the same iterations
    and their stacks share a frame of the user's code (a loop that keeps each step's loss
    keeps everything its graph saved, from many forward ops, all under one line); `site`
    is the innermost such shared frame, the line to look at."""
    stack: int                      # the stack with the most kept bytes
    site: int                       # frame id of the site that keeps them (-1: no user frame)
    stacks: tuple[int, ...]         # every stack whose allocations are kept
    bytes_per_iteration: int        # median over the iterations it leaks in
    iterations: tuple[int, ...]     # Iteration.number of each iteration it leaked in
    total_bytes: int
    count: int                      # allocations kept
    category: str                   # the category holding most of them
    by_category: dict[str, int]     # kept bytes per category, in all
    rule: str
    cause: str                      # "graph": kept with their autograd graph; "container": kept by a list or cache
    growth_per_iteration: int       # of live memory at iteration ends, all causes together


@dataclass(frozen=True)
class StaleGradients:
    """The previous step's gradients live while the next step's forward runs (a
    `zero_grad()` that comes after the forward, none before it, or gradients zeroed in
    place): memory the forward pays for although the backward will replace them."""
    bytes: int                      # the largest set, at the start of a forward
    count: int                      # its blocks: about one per trainable parameter
    iterations: tuple[int, ...]     # Iteration.number of every iteration that starts with some
    freed_first: int                # trace index of the first free of that set (-1: never freed)
    freed_last: int                 # ... and of the last
    phases: tuple[str, ...]         # the phases of that iteration they stay live through, in order
    live_at_peak: int               # of them, live at the peak
    free_stack: int                 # the stack of the last free (the zero_grad call), -1: none


@dataclass(frozen=True)
class Oom:
    """A failed allocation (an `oom` trace entry) and what was live when it failed (DESIGN.md §5)."""
    index: int
    time_us: int | None
    requested: int
    device_free: int | None
    allocated: int                  # live bytes when it failed
    reserved: int | None            # None: no allocator segments (profiler-converted)
    fragmentation_bytes: int | None  # reserved but unallocated
    by_category: dict[str, int]
    phase: str
    expandable_segments: bool       # the allocator had expandable segments on
    stack: int                      # the failed request's stack (-1: none)
    advice: tuple[Advice, ...]      # most promising first
    by_evidence: dict[str, int] = field(default_factory=dict)   # live bytes per evidence level


@dataclass(frozen=True)
class Allocation:
    """One row of `vramscope allocations --csv` (blocks live before the trace included)."""
    row: int
    size: int
    addr: int
    alloc_index: int                # -1: live before the trace began
    free_index: int                 # -1: never freed (live at the end)
    alloc_us: int                   # -1: unknown
    free_us: int
    category: str
    rule: str
    stack: int
    forward_stack: int = -1         # torch 2.13: the forward stack of a backward allocation
    evidence: str = "none"          # what the category rests on: torch|stack|lifetime|guess|none (evidence.py)
    rules_category: str | None = None   # our rules' verdict where torch's own tag decided another
    torch_tag: str = ""             # torch's own tag as the file names it (profiler category, component type)
    module: str = ""                # the module it was allocated in (component tracking), '' unknown
    metadata: tuple[tuple[str, str], ...] = ()  # (kind, text): 'metadata', each 'note' (annotate), 'internal'


@dataclass(frozen=True)
class Finding:
    """Something worth going to, in the order the viewer lists them (peak, OOMs, leaks,
    iteration peaks)."""
    kind: str                       # "peak" | "oom" | "stale_gradients" | "leak" | "iteration_peak"
    index: int                      # the trace entry it is about (-1: the start state)
    subject: Peak | Oom | StaleGradients | Leak | Iteration


@dataclass(frozen=True)
class Fact:
    """One fact of the run with what it rests on (classifiers/runfacts.py). `value` None: the
    trace cannot tell (unknown), which nothing downstream may treat as true."""
    value: bool | int | str | None
    evidence: str = "none"          # torch | stack | lifetime | guess | none
    why: str = ""                   # what it rests on, in words

    def to_json(self) -> dict:
        return {"value": self.value, "evidence": self.evidence, "why": self.why}


RUN_FACTS = ("recorded", "kind", "backward", "optimizer_step", "optimizer", "oom", "truncated_by_oom",
             "checkpointing", "autocast", "adapters", "quantized", "models_alive", "model_held_twice",
             "live_before_recording_bytes")


@dataclass(frozen=True)
class RunFacts:
    """What the trace shows about the run, each fact with its evidence (classifiers/runfacts.py):
    the record every answer reads (phases, peak types, advice, budget, levers, fits). The facts
    of `devices[].run` (RUN_FACTS), then what the levers and the budget read besides."""
    recorded: Fact = Fact("empty", "torch")     # "trace" | "state_only" | "empty"
    kind: Fact = Fact(None)         # "training" | "forward_backward" | "inference" | "forward_with_grad" | None
    backward: Fact = Fact(None)
    optimizer_step: Fact = Fact(None)
    optimizer: Fact = Fact(None)    # the optimizer's class name
    oom: Fact = Fact(None)
    truncated_by_oom: Fact = Fact(None)
    checkpointing: Fact = Fact(None)
    autocast: Fact = Fact(None)
    adapters: Fact = Fact(None)
    quantized: Fact = Fact(None)    # "4-bit" | "8-bit" | "quantized" | False
    models_alive: Fact = Fact(None)
    model_held_twice: Fact = Fact(None)
    live_before_recording_bytes: Fact = Fact(0, "torch")
    frames: bool = False            # some allocation carries frames
    forward_seen: bool = False
    model_kind: str = ""            # "transformer" | "cnn" | "mlp" | "": what the forward's blocks are made of
    pretrained_load: bool = False   # a pretrained model or checkpoint loaded, by its frames
    frozen_weights: bool = False    # weights seen (not guessed) that no gradient matches, in a run with a backward
    trainable_share: float | None = None   # of the weights seen, the bytes a gradient matches (None: no gradients made)
    moments_pattern: bool = False   # a state-only dump's frameless blocks come in fours (weight, gradient, 2 moments)
    autocast_copy_bytes: int = 0    # autocast's 16-bit weight copies live at the peak
    peak_evidenced_bytes: int = 0   # live at the peak with evidence torch, stack or lifetime

    @property
    def state_only(self) -> bool:
        """A snapshot without a trace: its one moment is the state it recorded."""
        return self.recorded.value == "state_only"
    peak_guessed_bytes: int = 0     # live at the peak that are a guess (or unknown)

    @property
    def guessed_share(self) -> float:
        total = self.peak_evidenced_bytes + self.peak_guessed_bytes
        return self.peak_guessed_bytes / total if total else 0.0

    @property
    def trains(self) -> bool:
        """A backward and an optimizer step both ran in the trace: training levers can apply."""
        return bool(self.backward.value) and bool(self.optimizer_step.value)

    @property
    def fine_tuning(self) -> bool:
        """A pretrained model is loaded, frozen weights are seen, or adapters train on a base:
        LoRA and 4-bit weights can apply."""
        return self.pretrained_load or self.frozen_weights or bool(self.adapters.value)

    def to_json(self) -> dict:
        """`devices[].run` of `summary --json` (DESIGN.md §6)."""
        return {name: getattr(self, name).to_json() for name in RUN_FACTS}


@dataclass(frozen=True)
class DeviceSummary:
    """The per-device facts of `vramscope summary` (its JSON adds the worded parts)."""
    device: int
    entries: int                    # trace entries
    allocations: int                # rows of `allocations --csv`
    allocations_before_trace: int   # of those, blocks live before the trace began
    peak: Peak
    start_live_bytes: int
    end_live_bytes: int
    reserved_peak_bytes: int | None
    end_by_category: dict[str, int]
    iterations: Sequence[Iteration]          # iterations.Iterations: columns, an Iteration per row read
    leaks: tuple[Leak, ...]
    ooms: tuple[Oom, ...]
    stale_gradients: StaleGradients | None = None
    skipped_actions: tuple[str, ...] = ()   # left out by the recording (skip_actions), as the trace proves
    reserved_unknown: str | None = None     # why reserved memory is unknown (DeviceAnalysis.reserved_unknown_why)


@dataclass(frozen=True)
class HostMemory:
    """Pinned host memory (torch 2.14 `record_pinned_host_memory`): its own memory space
    beside the devices, never part of a GPU's peak. Indices are positions in `host_traces`."""
    entries: int
    allocations: int
    allocations_before_trace: int
    peak_bytes: int                 # the sum of live pinned blocks (power-of-two rounded sizes)
    peak_index: int                 # -1: the start state is the peak
    peak_time_us: int | None
    start_live_bytes: int
    end_live_bytes: int
    reserved_peak_bytes: int | None  # pinned memory the host allocator held (cached blocks included)
    reserved_end_bytes: int
    segments: int
    skipped_actions: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetadataGroup:
    """Allocations whose metadata (user_metadata, annotations) gives one value to a key
    (`DeviceAnalysis.group_by_metadata`): a user who stamps `step=12` groups by `step`."""
    value: str                      # '' for the allocations without the key
    allocations: int
    bytes: int                      # allocated, in all
    peak_bytes: int                 # of them, live at the peak


# -- plain data -----------------------------------------------------------------------------
_SCALARS = frozenset((int, float, str, bool, type(None)))
_FIELD_NAMES: dict[type, Any] = {}   # per class: its dataclass fields' names, None if not one
_UNSEEN = object()


def to_plain(obj: Any) -> Any:
    """JSON-ready data: dataclasses become dicts (field order kept), tuples lists. (By exact
    type first, each class's fields looked up once: a summary at 10^7 events converts 126,000
    values.)"""
    t = type(obj)
    if t in _SCALARS:
        return obj
    # (a scalar inside is taken as it is, without a call: most values are)
    if t is list or t is tuple:
        return [v if type(v) in _SCALARS else to_plain(v) for v in obj]
    if t is dict:
        return {k: v if type(v) in _SCALARS else to_plain(v) for k, v in obj.items()}
    if t is Iteration:
        return _iteration_plain(obj)
    names = _FIELD_NAMES.get(t, _UNSEEN)
    if names is _UNSEEN:
        names = tuple(f.name for f in dataclasses.fields(t)) if dataclasses.is_dataclass(t) else None
        _FIELD_NAMES[t] = names
    if names is not None:
        return _dataclass_plain(obj, names)
    plain = getattr(t, "__plain__", None)        # a result held as columns (iterations.Iterations)
    if plain is not None:
        return plain(obj)
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def _dataclass_plain(obj: Any, names: tuple) -> dict:
    out = {}
    for n in names:
        v = getattr(obj, n)
        out[n] = v if type(v) in _SCALARS else to_plain(v)
    return out


_ITERATION_FIELDS = tuple(f.name for f in dataclasses.fields(Iteration))


def _iteration_plain(it: Iteration) -> dict:
    """`_dataclass_plain` of an Iteration, the one result listed by the hundred thousand (a trace
    of short forward passes): its fields copied at once, its phases' bounds made lists; a third
    of the time (0.48 -> 0.16 s for 170,000)."""
    out = it.__dict__.copy()
    if tuple(out) != _ITERATION_FIELDS:       # (something else kept on it: field by field)
        return _dataclass_plain(it, _ITERATION_FIELDS)
    out["phases"] = {k: list(v) for k, v in it.phases.items()}
    return out


def from_plain(cls: Any, data: Any) -> Any:
    """Rebuild a `cls` (a dataclass here, or a tuple, union, ... of them) from `to_plain` data,
    checking every field's type: `msgspec.convert`, strict (no str for a number, no bool for
    an int); a mismatch raises msgspec.ValidationError, a ValueError naming the field.
    (Imported here: `vramscope summary` on a cached file never rebuilds a result.)"""
    import msgspec
    return msgspec.convert(data, type=cls, strict=True)


__all__ = ["Peak", "Iteration", "Region", "StaleGradients", "Leak", "Advice", "Oom", "Allocation", "Finding", "DeviceSummary", "RunFacts", "Fact", "RUN_FACTS",
           "HostMemory", "MetadataGroup",
           "to_plain", "from_plain", "field"]
