"""What if a category's memory were bigger or smaller, a lever pulled, the batch or the
sequence grown? The peak over the whole run, recomputed, and whether it fits a GPU
(DESIGN.md §8). The one entry point every surface reads.

    r = what_if(an, device, scales={"activations": 0.5}, levers=["checkpointing"], gpu="24", fit="batch")
    r.scaled.bytes, r.scaled.index, r.scaled.type, r.scaled.by_category
    r.live_at_many(entries)     # per-category live bytes of the run as simulated and scaled
    r.fit                       # FitResult per lever combination: how far the batch can grow
    r.to_json()                 # one device of `vramscope whatif --json`

The scaled peak is the maximum over the trace of sum_c round(f_c * live_c(t)) (round:
float64 product, then round half to even; see category_live.py): exact for the factors.
The structural levers (levers.SIMULATED) are simulated on the recorded timeline from the
run's structure (simulate.py: rows moved, split, recomputed, resized), and the factors
then apply to the simulated run exactly; each lever states what it assumed and the error
band measured against runs recorded with it. The moment of the peak moves between types
(§4) as the terms change, which napkin math alone misses. The models behind it
(CategoryLive, Budget, simulations) are built once per device and reused.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..common.units import GiB, fmt_bytes, parse_byte_size
from .budget import Budget
from .budget import budget as make_budget
from .categories import CATEGORIES
from .category_live import CategoryLive, scale_live
from .levers import (LEVERS, LORA_RANK, SIMULATED, TARGETS_DEFAULT, Family, LeverError, Measured, Pulled, left_out,
                     pulled)
from .simulate import Simulation, simulate
from .structure import structure

# a bad scale, lever or GPU size (the command line exits 2 on it); one-line message
WhatIfError = LeverError


# -- results ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PeakMoment:
    bytes: int
    index: int              # trace entry of the peak; -1: the state before the trace
    type: str               # DESIGN.md §4
    by_category: dict       # {category: bytes live there}, non-zero only

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "index": self.index, "type": self.type, "by_category": dict(self.by_category)}


@dataclass(frozen=True)
class CardFit:
    name: str
    bytes: int              # what the card gives the allocator: torch's total, less the CUDA context
    fits: bool | None       # None: the need is a floor (a trace an OOM cut short) below this card: cannot tell
    headroom_bytes: int     # card minus what is needed (negative: short by that much)
    tight: bool = False     # fits with under 3% to spare

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "fits": self.fits, "headroom_bytes": self.headroom_bytes,
                "tight": self.tight}


@dataclass(frozen=True)
class Fits:
    allocated_bytes: int            # the (scaled) peak of allocated memory
    overhead_ratio: float | None    # reserved / allocated at this run's peak (None: unknown)
    overhead_bytes: int             # the allocator's cache on top of the scaled peak
    needed_bytes: int
    gpu_bytes: int | None           # the size asked about (None: none asked)
    fits: bool | None
    headroom_bytes: int | None
    cards: tuple = field(default_factory=tuple)   # CardFit per common card
    note: str = ""
    tight: bool = False             # fits on the GPU asked about with under 3% to spare

    def to_json(self) -> dict:
        return {"allocated_bytes": self.allocated_bytes, "overhead_ratio": self.overhead_ratio,
                "overhead_bytes": self.overhead_bytes, "needed_bytes": self.needed_bytes,
                "gpu_bytes": self.gpu_bytes, "fits": self.fits, "headroom_bytes": self.headroom_bytes,
                "cards": [c.to_json() for c in self.cards], "note": self.note, "tight": self.tight}


@dataclass(frozen=True)
class FitResult:
    """How far the micro-batch (or the sequence) could grow on the GPU asked about, with
    `levers` pulled: the largest multiple of the recorded one whose peak, plus this run's
    allocator overhead, fits."""
    levers: tuple                   # lever names ((): the run as recorded)
    dimension: str                  # "batch" | "seq"
    max_factor: float | None        # None: nothing in the run grows with the dimension
    fits_bytes: int                 # what is needed at max_factor (the peak plus the overhead)
    headroom_bytes: int             # the GPU minus fits_bytes
    peak_bytes: int                 # the peak at max_factor (allocated)
    applied: bool = True            # False: a simulated lever of the combination was not applied (no prediction)
    why: str = ""

    def to_json(self) -> dict:
        return {"levers": list(self.levers), "dimension": self.dimension, "max_factor": self.max_factor,
                "fits_bytes": self.fits_bytes, "headroom_bytes": self.headroom_bytes, "peak_bytes": self.peak_bytes,
                "applied": self.applied, "why": self.why}


@dataclass(frozen=True)
class WhatIf:
    device: int
    baseline: PeakMoment
    scaled: PeakMoment
    scales: dict                    # {category: combined factor}, factors other than 1 only
    levers: tuple                   # levers.Pulled per lever asked for (applied or why not, assumption, band)
    budget: Budget | None
    fits: Fits
    note: str                       # exact for the factors; what the levers rest on
    fit: tuple = ()                 # FitResult per lever combination (with `fit=`)
    fit_note: str = ""              # what the growth assumes (which tensors grow, how)
    simulation: Simulation | None = field(default=None, compare=False, repr=False)
    model: CategoryLive | None = field(default=None, compare=False, repr=False)
    prediction: bool = True         # False: a lever asked for was not applied; `scaled` is the run as recorded
    lower_bound: bool = False       # the trace ends in an out-of-memory error: the prediction is a lower bound

    def live_at_many(self, entries) -> np.ndarray:
        """int64 [K, len(CATEGORIES)]: live bytes per category right after each recorded trace
        entry (-1: the start) in the run as simulated by the levers and scaled by `scales`,
        CATEGORIES order: what a timeline of this what-if draws."""
        if self.simulation is not None:
            return self.simulation.live_at_many(entries, self.scales)
        cl = self.model
        assert cl is not None
        live = scale_live(cl.live_at_many(entries), cl.factors(self.scales))
        out = np.zeros((len(live), len(CATEGORIES)), dtype=np.int64)
        for k, c in enumerate(cl.categories):
            out[:, CATEGORIES.index(c)] = live[:, k]
        return out

    def to_json(self) -> dict:
        """The per-device object of `vramscope whatif --json` (DESIGN.md §6), plus
        `levers` (each with its assumption and error band), `facts` (what the budget
        inferred), `note`, and with a fit asked for, `fit` and `fit_note`."""
        d = {"device": self.device, "baseline": self.baseline.to_json(), "scaled": self.scaled.to_json(),
             "scales": dict(self.scales),
             "budget": self.budget.to_json() if self.budget is not None else [],
             "fits": self.fits.to_json(),
             "levers": [lv.to_json() for lv in self.levers],
             "facts": self.budget.facts.to_json() if self.budget is not None else None,
             "prediction": self.prediction, "lower_bound": self.lower_bound,
             "note": self.note}
        if self.fit:
            d["fit"] = [f.to_json() for f in self.fit]
            d["fit_note"] = self.fit_note
        return d


# -- input checks -------------------------------------------------------------------------------
def parse_scale(text: str) -> tuple[str, float]:
    """'activations=0.5' -> ('activations', 0.5) (the CLI's --scale)."""
    name, sep, value = text.partition("=")
    if not sep:
        raise WhatIfError(f"--scale {text!r}: expected CATEGORY=FACTOR, e.g. activations=0.5")
    return _check_scale(name.strip(), value.strip())


def _check_scale(name, value) -> tuple[str, float]:
    if name not in CATEGORIES:
        raise WhatIfError(f"unknown category {name!r} (known: {', '.join(CATEGORIES)})")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise WhatIfError(f"factor for {name} is not a number: {value!r}") from None
    if not math.isfinite(f) or f < 0:
        raise WhatIfError(f"factor for {name} must be a finite number >= 0, not {value!r}")
    return name, f


# Common cards by their class, with the memory torch reports for them (torch.cuda.get_device_properties
# .total_memory: an "80 GB" H100 gives 79.2 GiB, a "16 GB" T4 14.7 GiB; the smallest of a class).
COMMON_CARDS = (("16 GB (T4, V100-16GB, RTX 4080)", 14.75), ("24 GB (A10G, L4, RTX 3090/4090)", 22.0),
                ("40 GB (A100-40GB)", 39.4), ("48 GB (L40S, A6000, A40)", 44.4),
                ("80 GB (A100-80GB, H100)", 79.1), ("141 GB (H200)", 139.7))
CUDA_CONTEXT = int(0.5 * GiB)   # the CUDA context and libraries' handles: outside the caching allocator
TIGHT = 0.03                    # headroom under this share of the card: "tight"


def parse_gpu_size(text) -> int:
    """'24' (GiB), '24GiB', '24G', '24576MiB', '80GB' (10^9 bytes: GB = 10^9 for every verb)
    -> bytes (common/units.py parse_byte_size); WhatIfError for anything else."""
    try:
        return parse_byte_size(text, "GPU size")
    except ValueError as e:
        raise WhatIfError(str(e)) from None


# -- the computation ----------------------------------------------------------------------------
FIT_DIMENSIONS = ("batch", "seq")
_SIMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def simulation(da, names, facts=None, lora_rank: int = LORA_RANK, plain: bool = False,
               lora_targets: str = TARGETS_DEFAULT) -> Simulation | None:
    """The run with the simulated levers among `names` pulled (None: none of them; with
    `plain`, the recorded run as a Simulation), made once per device, lever set, rank and targets."""
    sim_names = tuple(n for n in SIMULATED if n in names)
    if not sim_names and not plain:
        return None
    cache = _SIMS.setdefault(da, {})
    key = (sim_names, (lora_rank, lora_targets) if "lora" in sim_names else None)
    if key not in cache:
        cache[key] = simulate(da, sim_names, facts, lora_rank, lora_targets=lora_targets)
    return cache[key]


def run_family(da) -> Family | None:
    """What the run is, as a lever's measured bands care (levers.base.Family): its blocks'
    kind, precision and adapters, from its facts."""
    run = getattr(da, "run", None)
    if run is None or not run.model_kind:
        return None
    return Family(run.model_kind, "autocast" if run.autocast.value else "fp32", bool(run.adapters.value))


def levers_left_out(an, device: int, facts=None) -> dict[str, str]:
    """{lever: why it cannot apply to this run}: levers.left_out, the one rule every surface
    reads (it knows the run's profile: training, a pretrained model, quantized weights,
    adapters, the repeated blocks and whether they are checkpointed). `facts` is accepted
    for callers that have the budget; the rule does not need it."""
    from .ooms import expandable_segments_on
    profile = an.devices[device].run
    expandable = expandable_segments_on(an.snapshot.allocator_settings)
    out = {}
    for name in LEVERS:
        why = left_out(name, profile, expandable=expandable)
        if why is not None:
            out[name] = why
    return out


def what_if(an, device: int, scales: dict | None = None, levers=(), gpu=None,
            model: CategoryLive | None = None, budget: Budget | None = None,
            with_budget: bool = True, fit: str | None = None, lora_rank: int = LORA_RANK,
            fit_each: bool = True, lora_targets: str = TARGETS_DEFAULT) -> WhatIf:
    """Pull `levers` (simulated on the timeline or as factors), scale categories (explicit
    `scales` times the factor levers') and recompute the peak of `device` over the whole run;
    the budget and the fits too; with `fit` ("batch" or "seq", needs `gpu`), how far that
    dimension could grow, with `levers` alone and (`fit_each`) with each other lever that
    applies added.
    Raises WhatIfError (a ValueError) for an unknown category, lever, dimension or device, a
    factor below 0 (or not finite), a rank below 1 and an unreadable GPU size."""
    if device not in an.devices:
        raise WhatIfError(f"no device {device} in this snapshot (devices: {', '.join(map(str, an.devices)) or 'none'})")
    checked = dict(_check_scale(k, v) for k, v in (scales or {}).items())
    gpu_bytes = parse_gpu_size(gpu) if gpu is not None else None
    names = [levers] if isinstance(levers, str) else list(levers)
    for n in names:
        if n not in LEVERS:
            raise WhatIfError(f"unknown lever {n!r} (known: {', '.join(LEVERS)})")
    if fit is not None and fit not in FIT_DIMENSIONS:
        raise WhatIfError(f"unknown dimension to fit {fit!r} (known: {', '.join(FIT_DIMENSIONS)})")
    if fit is not None and gpu_bytes is None:
        raise WhatIfError("fitting the batch or sequence needs a GPU size (--gpu)")
    if not isinstance(lora_rank, int) or isinstance(lora_rank, bool) or lora_rank < 1:
        raise WhatIfError(f"LoRA rank must be a whole number >= 1, not {lora_rank!r}")
    da = an.devices[device]
    cl = model if model is not None else CategoryLive.build(da)
    needs_facts = with_budget or any(n in ("lora", "no_checkpointing", "adam8bit", "4bit") for n in names) \
        or fit is not None
    bud = budget if budget is not None else (make_budget(an, device, model=cl) if needs_facts else None)
    facts = bud.facts if bud is not None else None
    sim = simulation(da, names, facts, lora_rank, lora_targets=lora_targets)
    applied = {a.name: a for a in sim.applied} if sim is not None else {}
    family = run_family(da)
    lv = tuple(pulled(n, facts, applied.get(n), family) for n in names)
    refused = [p for p in lv if not p.applied]
    lower = bool(da.run.truncated_by_oom.value) and any(p.applied for p in lv)
    if lower:
        lv = tuple(p if not p.applied else _lower_bound(p) for p in lv)
    factors = _factors(lv, checked)

    base = cl.peak()
    if refused:
        sim = None             # no prediction: the run as recorded, with the factors asked for
        factors = _factors((), checked)
    scaled = (sim.peak(factors) if sim is not None else cl.peak(factors)) if (factors or sim is not None) else base
    baseline = PeakMoment(base.bytes, base.index, da.peak_type(base.index), base.by_category)
    scaled_m = baseline if scaled is base else \
        PeakMoment(scaled.bytes, scaled.index, da.peak_type(scaled.index), scaled.by_category)
    removes = any(x.removes_overhead for x in lv)
    # a run that ran out of memory needed at least what was live plus what it asked for; as
    # recorded (or with levers that were not applied) that is a floor, not a guess
    need_oom = max((o.allocated + o.requested for o in da.ooms), default=0) if scaled is base or refused else 0
    fits = fits_on(da, base.bytes, base.index, scaled.bytes, gpu_bytes, removes, at_least=need_oom,
                   floor=bool(da.run.truncated_by_oom.value))
    note = ("exact for these factors: the peak of the recorded run with each category's live bytes "
            "scaled at every moment (per category, rounded to whole bytes)")
    if refused:
        note = ("not a prediction: " + "; ".join(f"{p.name} was not applied ({p.why})" for p in refused)
                + "; the peak shown is the recorded run's" + (" with the factors asked for" if factors else ""))
    elif sim is not None:
        note = ("the peak of the recorded run with " + ", ".join(applied) + " simulated on its timeline (from "
                "its own structure: blocks, saved activations, recompute windows) and each category's live "
                "bytes scaled at every moment; each lever says what it assumed and how far its predictions "
                "were from recorded runs")
    elif lv:
        note += ("; the levers' factors are estimates of what each change would do, stated with each "
                 "lever, not measurements")
    fit_rows: tuple = ()
    fit_note = ""
    if fit is not None:
        fit_rows, fit_note = _fit_all(an, device, da, names, checked, facts, lora_rank, fit, gpu_bytes, base,
                                      fit_each, lora_targets)
    if lower and not refused:
        note += ("; the trace ends in an out-of-memory error, so the run's rest is not in it: the peak is a lower "
                 "bound")
    return WhatIf(device, baseline, scaled_m, factors, lv, bud, fits, note, fit_rows, fit_note, sim, cl,
                  prediction=not refused, lower_bound=lower)


def _lower_bound(p: Pulled) -> Pulled:
    from dataclasses import replace
    return replace(p, assumption=p.assumption + "; a lower bound: the trace ends in an out-of-memory error, and "
                                                 "what the failed step would have done next is not in it")


def _factors(lv, checked) -> dict:
    combined = {c: 1.0 for c in CATEGORIES}
    for lever_ in lv:
        for c, f in lever_.scales.items():
            combined[c] *= f
    for c, f in checked.items():
        combined[c] *= f
    return {c: f for c, f in combined.items() if f != 1.0}


# -- how far the batch or the sequence can grow -------------------------------------------------
def growth_peak(an, device: int, dimension: str, factor: float, levers=(), scales: dict | None = None,
                facts=None, lora_rank: int = LORA_RANK, lora_targets: str = TARGETS_DEFAULT) -> int | None:
    """The peak (allocated bytes) with the micro-batch ("batch") or the sequence ("seq") grown
    `factor` times, `levers` pulled and categories scaled: what `fit` searches over. None where
    the growth model declines (a convolution library's workspace it cannot scale, or a lever the
    run does not support)."""
    da = an.devices[device]
    from .common_words import library_scratch_words
    if library_scratch_words(da) or (dimension == "seq" and structure(da).seq_refusal):
        return None
    if facts is None and any(n in ("lora", "no_checkpointing", "adam8bit", "4bit") for n in levers):
        facts = make_budget(an, device).facts
    g, refused = _growth(da, tuple(levers), dict(scales or {}), facts, lora_rank, lora_targets)
    if refused:
        return None
    return int(math.ceil(_grown(g, dimension, factor).max()))


def _growth(da, names, scales, facts, lora_rank, lora_targets=TARGETS_DEFAULT):
    """((A, B, C), the simulated levers not applied): live bytes after every event of the run
    with `names` pulled and the factor levers' and explicit scales applied to the sizes, of what
    does not grow, grows linearly and grows with the square of the sequence
    (structure.Structure.batch / .seq2)."""
    lv = tuple(pulled(n, facts) for n in names if n not in SIMULATED)
    factors = _factors(lv, scales)
    sim = simulation(da, names, facts, lora_rank, plain=True, lora_targets=lora_targets)
    assert sim is not None
    refused = tuple(a for a in sim.applied if not a.applied)
    f = np.array([factors.get(c, 1.0) for c in CATEGORIES], dtype=np.float64)
    return sim.timeline.growth(f if factors else None), refused


def _grown(g, dimension: str, f: float) -> np.ndarray:
    a, b, c = g
    if dimension == "batch":
        return a + f * (b + c).astype(np.float64)
    return a + f * b.astype(np.float64) + (f * f) * c.astype(np.float64)


def _max_factor(g, dimension: str, budget_bytes: float) -> float | None:
    """The largest factor whose peak stays within `budget_bytes` (1e-4 relative), None when
    nothing grows; 0.0 when even what does not grow exceeds it."""
    a, b, c = g
    if not (b.any() or c.any()):
        return None
    if a.max() > budget_bytes:
        return 0.0
    lo, hi = 0.0, 1.0
    while _grown(g, dimension, hi).max() <= budget_bytes:
        lo, hi = hi, hi * 2
        if hi > 1e9:
            return lo
    while hi - lo > 1e-4 * hi:
        mid = (lo + hi) / 2
        if _grown(g, dimension, mid).max() <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo


# the growth model's own error (benchmarks/whatif_accuracy.py: 'fit batch x2' and 'fit seq x2',
# the predicted peak of the run recorded with twice the batch or the sequence)
FIT_MEASURED: dict[str, tuple] = {"batch": (
        Measured("bert_dropout, CPU dev", "transformer/fp32/full", 1.036e-05, 0, 1.341e-05, 2),
        Measured("bert_dropout, H100 dev", "transformer/fp32/full", 0.00267, 0, 0.005333, 2),
        Measured("cnn_bn, CPU dev", "cnn/fp32/full", 4.437e-05, 0, 5.883e-05, 2),
        Measured("cnn_bn, H100 dev", "cnn/fp32/full", 0.009672, 0, 0.009672, 1),
        Measured("gpt2_bf16, CPU dev", "transformer/autocast/full", 0.005875, 0, 0.01169, 2),
        Measured("gpt2_bf16, H100 dev", "transformer/autocast/full", 0.009905, 0, 0.01466, 2),
        Measured("llama_tied, CPU dev", "transformer/fp32/full", 0.0003691, 0, 0.0004781, 2),
        Measured("llama_tied, H100 dev", "transformer/fp32/full", 0.0002056, 0, 0.0002416, 2),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/full", 0.002844, 0, 0.01363, 24),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/lora", 0.002614, 0, 0.008045, 24),
        Measured("vit_sgd, CPU dev", "transformer/fp32/full", 1.384e-07, 0, 1.796e-07, 2),
        Measured("vit_sgd, H100 dev", "transformer/fp32/full", 0.003363, -0.0005756, 0.007301, 2),
    ), "seq": (
        Measured("bert_dropout, CPU dev", "transformer/fp32/full", 2.043e-07, 0, 2.043e-07, 1),
        Measured("bert_dropout, H100 dev", "transformer/fp32/full", -0.01341, -0.01341, 0, 1),
        Measured("gpt2_bf16, H100 dev", "transformer/autocast/full", 0.005148, 0, 0.005148, 1),
        Measured("llama_tied, H100 dev", "transformer/fp32/full", 4.141e-08, 0, 4.141e-08, 1),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/full", -0.001899, -0.005296, 0, 16),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/lora", -0.001627, -0.00705, 0.001046, 16),
    )}


def fit_band(dimension: str, family: Family | None):
    """(the growth model's error band for runs like this one or None, in words)."""
    from .levers import band_for
    return band_for(FIT_MEASURED.get(dimension, ()), family)


def _fit_all(an, device, da, names, checked, facts, lora_rank, dimension, gpu_bytes, base, each=True,
             lora_targets=TARGETS_DEFAULT):
    """FitResult for the levers asked for, then (`each`) with each other lever that applies added."""
    skip = levers_left_out(an, device, facts) if each else {}
    combos = [tuple(names)]
    combos += [tuple(names) + (n,) for n in LEVERS if each and n not in names and n not in skip
               and not (n == "no_checkpointing" and "checkpointing" in names)
               and not (n == "half_batch" and dimension == "batch")]
    out = []
    band, band_note = fit_band(dimension, run_family(da))
    from .common_words import library_scratch_words
    scratch = library_scratch_words(da) or (structure(da).seq_refusal if dimension == "seq" else "")
    if da.run.truncated_by_oom.value:
        need = max((o.allocated + o.requested for o in da.ooms), default=base.bytes)
        scratch = (f"the trace ends in an out-of-memory error (the step needed at least {fmt_bytes(need)}), and what "
                   f"the run uses after it is not in the trace: how far it can grow cannot be told; record a run that "
                   f"completes (a smaller batch, or with a lever pulled) and ask again")
    if scratch:
        combos = combos[:1]                 # what makes the growth unknown holds with any lever pulled
    for combo in combos:
        if scratch and combo == tuple(names):
            out.append(FitResult(combo, dimension, None, 0, 0, 0, applied=False, why=scratch))
            continue
        g, refused = _growth(da, combo, checked, facts, lora_rank, lora_targets)
        if refused:
            if combo != tuple(names):
                continue            # a lever the run does not support: no row rather than the run as recorded
            out.append(FitResult(combo, dimension, None, 0, 0, 0, applied=False,
                                 why="; ".join(f"{a.name}: {a.assumption}" for a in refused)))
            continue
        removes = any(pulled(n, facts).removes_overhead for n in combo if n not in SIMULATED)
        ratio = fits_on(da, base.bytes, base.index, base.bytes, None, removes).overhead_ratio or 1.0
        f = _max_factor(g, dimension, gpu_bytes / ratio)
        peak = int(math.ceil(_grown(g, dimension, 1.0 if f is None else f).max()))
        need = int(math.ceil(peak * ratio))
        out.append(FitResult(combo, dimension, None if f is None else round(f, 4), need, gpu_bytes - need, peak))
    st = structure(da) if dimension == "seq" else None
    ratio = fits_on(da, base.bytes, base.index, base.bytes).overhead_ratio
    headroom = ""
    if band is not None and band.worst_under < 0:
        headroom = (f"; the growth model has predicted up to {100 * -band.worst_under:.1f}% too low on runs like this "
                    f"one: leave that much headroom")
    fit_note = (f"{'micro-batch' if dimension == 'batch' else 'sequence'} multiples of the recorded run: what grows "
                f"with the batch (activations, backward intermediates, inputs, forward and recompute scratch; not "
                f"weights, autocast's weight copies, gradients, optimizer state, library workspaces) is scaled by "
                f"the factor"
                + ("" if st is None else f"; {st.notes[-1]}")
                + (f"; with this run's allocator overhead (reserved {ratio:.3f}x allocated at its peak)" if ratio
                   else "; no allocator overhead counted (the file has no allocator segments)")
                + f"; error band: {band_note}" + headroom)
    return tuple(out), fit_note


def fits_on(da, base_bytes: int, base_index: int, scaled_bytes: int, gpu_bytes: int | None = None,
            remove_overhead: bool = False, at_least: int = 0, floor: bool = False) -> Fits:
    """Whether `scaled_bytes` of allocated memory, plus the allocator's overhead at this
    run's peak (reserved over allocated there, assumed to scale with the peak), fit on
    `gpu_bytes` and on each common card as torch reports it, less the CUDA context (about
    0.5 GiB, not in the snapshot); `at_least`: what the run is known to need whatever the
    peak (a failed request on top of what was live when it failed). `floor`: the trace ends in
    an out-of-memory error, so what is needed is a lower bound: a card it exceeds is too small,
    a larger one cannot be said to fit (None)."""
    why = da.reserved_unknown_why() if da.live is not None else None
    reserved = da.live.reserved_at(base_index) if da.live is not None and why is None else None
    if remove_overhead:
        ratio = 1.0
        how = "no allocator overhead (expandable_segments)"
    elif reserved is None or base_bytes <= 0:
        ratio = None
        how = f"allocator overhead unknown ({why or 'no allocator segments in this file'}): none counted"
    else:
        ratio = max(1.0, reserved / base_bytes)
        how = (f"allocator overhead {ratio:.3f}x: reserved {fmt_bytes(reserved)} over allocated "
               f"{fmt_bytes(base_bytes)} at this run's peak")
    overhead = int(math.ceil(scaled_bytes * (ratio or 1.0))) - scaled_bytes
    needed = max(scaled_bytes + overhead, int(at_least))

    def verdict(room: int) -> bool | None:
        return False if needed > room else (None if floor else True)
    cards = []
    for name, gib in COMMON_CARDS:
        room = int(gib * GiB) - CUDA_CONTEXT
        ok = verdict(room)
        cards.append(CardFit(name, room, ok, room - needed, bool(ok) and room - needed < TIGHT * room))
    note = (f"needs {'at least ' if floor else ''}{fmt_bytes(needed)}: the peak {fmt_bytes(scaled_bytes)} plus {how}"
            + (f"; at least {fmt_bytes(at_least)}: what the failed request asked for on top of what was live"
               if at_least and at_least >= scaled_bytes * (ratio or 1.0) else "")
            + ("; the trace ends in an out-of-memory error, so what the run needs after it is not known: a card "
               "with more room cannot be said to fit" if floor else "")
            + f"; each card as torch reports it, less {fmt_bytes(CUDA_CONTEXT)} for the CUDA context (not in the "
              f"snapshot); other processes are not counted")
    fits = None if gpu_bytes is None else verdict(gpu_bytes)
    return Fits(scaled_bytes, ratio, overhead, needed, gpu_bytes, fits,
                None if gpu_bytes is None else gpu_bytes - needed, tuple(cards), note,
                tight=bool(gpu_bytes is not None and fits and gpu_bytes - needed < TIGHT * gpu_bytes))


__all__ = ["WhatIf", "WhatIfError", "PeakMoment", "Fits", "CardFit", "FitResult", "LEVERS", "COMMON_CARDS",
           "FIT_DIMENSIONS", "what_if", "fits_on", "parse_scale", "parse_gpu_size", "growth_peak",
           "levers_left_out", "simulation", "run_family", "fit_band", "FIT_MEASURED", "CUDA_CONTEXT"]
