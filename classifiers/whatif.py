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
from .levers import LEVERS, SIMULATED, Lever, LeverError, left_out, lever, simulated_lever
from .simulate import LORA_RANK, Simulation, simulate
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
    bytes: int
    fits: bool
    headroom_bytes: int     # card minus what is needed (negative: short by that much)

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "fits": self.fits, "headroom_bytes": self.headroom_bytes}


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

    def to_json(self) -> dict:
        return {"allocated_bytes": self.allocated_bytes, "overhead_ratio": self.overhead_ratio,
                "overhead_bytes": self.overhead_bytes, "needed_bytes": self.needed_bytes,
                "gpu_bytes": self.gpu_bytes, "fits": self.fits, "headroom_bytes": self.headroom_bytes,
                "cards": [c.to_json() for c in self.cards], "note": self.note}


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

    def to_json(self) -> dict:
        return {"levers": list(self.levers), "dimension": self.dimension, "max_factor": self.max_factor,
                "fits_bytes": self.fits_bytes, "headroom_bytes": self.headroom_bytes, "peak_bytes": self.peak_bytes}


@dataclass(frozen=True)
class WhatIf:
    device: int
    baseline: PeakMoment
    scaled: PeakMoment
    scales: dict                    # {category: combined factor}, factors other than 1 only
    levers: tuple                   # Lever (simulated ones say what the simulation assumed)
    budget: Budget | None
    fits: Fits
    note: str                       # exact for the factors; what the levers rest on
    fit: tuple = ()                 # FitResult per lever combination (with `fit=`)
    fit_note: str = ""              # what the growth assumes (which tensors grow, how)
    simulation: Simulation | None = field(default=None, compare=False, repr=False)
    model: CategoryLive | None = field(default=None, compare=False, repr=False)

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


COMMON_CARDS = (("16 GiB (V100-16GB, T4, RTX 4080)", 16), ("24 GiB (RTX 3090/4090, A10G, L4)", 24),
                ("40 GiB (A100-40GB)", 40), ("48 GiB (A6000, L40S, A40)", 48),
                ("80 GiB (A100-80GB, H100)", 80), ("141 GiB (H200)", 141))


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


def simulation(da, names, facts=None, lora_rank: int = LORA_RANK, plain: bool = False) -> Simulation | None:
    """The run with the simulated levers among `names` pulled (None: none of them; with
    `plain`, the recorded run as a Simulation), made once per device, lever set and rank."""
    sim_names = tuple(n for n in SIMULATED if n in names)
    if not sim_names and not plain:
        return None
    cache = _SIMS.setdefault(da, {})
    key = (sim_names, lora_rank if "lora" in sim_names else None)
    if key not in cache:
        cache[key] = simulate(da, sim_names, facts, lora_rank)
    return cache[key]


def levers_left_out(an, device: int, facts=None) -> dict[str, str]:
    """{lever: why it cannot apply to this run}: levers.left_out, the one rule every surface
    reads (it knows the run's profile: training, a pretrained model, quantized weights,
    adapters, the repeated blocks and whether they are checkpointed). `facts` is accepted
    for callers that have the budget; the rule does not need it."""
    from .ooms import expandable_segments_on
    profile = an.devices[device].profile
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
            fit_each: bool = True) -> WhatIf:
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
    sim = simulation(da, names, facts, lora_rank)
    applied = {a.name: a for a in sim.applied} if sim is not None else {}
    lv = tuple(simulated_lever(n, applied[n].assumption) if n in applied else lever(n, facts) for n in names)
    factors = _factors(lv, checked)

    base = cl.peak()
    scaled = (sim.peak(factors) if sim is not None else cl.peak(factors)) if (factors or sim is not None) else base
    baseline = PeakMoment(base.bytes, base.index, da.peak_type(base.index), base.by_category)
    scaled_m = baseline if scaled is base else \
        PeakMoment(scaled.bytes, scaled.index, da.peak_type(scaled.index), scaled.by_category)
    removes = any(x.removes_overhead for x in lv)
    fits = fits_on(da, base.bytes, base.index, scaled.bytes, gpu_bytes, removes)
    note = ("exact for these factors: the peak of the recorded run with each category's live bytes "
            "scaled at every moment (per category, rounded to whole bytes)")
    if sim is not None:
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
                                      fit_each)
    return WhatIf(device, baseline, scaled_m, factors, lv, bud, fits, note, fit_rows, fit_note, sim, cl)


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
                facts=None, lora_rank: int = LORA_RANK) -> int:
    """The peak (allocated bytes) with the micro-batch ("batch") or the sequence ("seq") grown
    `factor` times, `levers` pulled and categories scaled: what `fit` searches over."""
    da = an.devices[device]
    if facts is None and any(n in ("lora", "no_checkpointing", "adam8bit", "4bit") for n in levers):
        facts = make_budget(an, device).facts
    g = _growth(da, tuple(levers), dict(scales or {}), facts, lora_rank)
    return int(math.ceil(_grown(g, dimension, factor).max()))


def _growth(da, names, scales, facts, lora_rank):
    """(A, B, C): live bytes after every event of the run with `names` pulled and the factor
    levers' and explicit scales applied to the sizes, of what does not grow, grows linearly
    and grows with the square of the sequence (structure.Structure.batch / .seq2)."""
    lv = tuple(lever(n, facts) for n in names if n not in SIMULATED)
    factors = _factors(lv, scales)
    sim = simulation(da, names, facts, lora_rank, plain=True)
    assert sim is not None
    f = np.array([factors.get(c, 1.0) for c in CATEGORIES], dtype=np.float64)
    return sim.timeline.growth(f if factors else None)


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


def _fit_all(an, device, da, names, checked, facts, lora_rank, dimension, gpu_bytes, base, each=True):
    """FitResult for the levers asked for, then (`each`) with each other lever that applies added."""
    skip = levers_left_out(an, device, facts) if each else {}
    combos = [tuple(names)]
    combos += [tuple(names) + (n,) for n in LEVERS if each and n not in names and n not in skip
               and not (n == "no_checkpointing" and "checkpointing" in names)
               and not (n == "half_batch" and dimension == "batch")]
    out = []
    for combo in combos:
        g = _growth(da, combo, checked, facts, lora_rank)
        removes = any(lever(n, facts).removes_overhead for n in combo)
        ratio = fits_on(da, base.bytes, base.index, base.bytes, None, removes).overhead_ratio or 1.0
        f = _max_factor(g, dimension, gpu_bytes / ratio)
        peak = int(math.ceil(_grown(g, dimension, 1.0 if f is None else f).max()))
        need = int(math.ceil(peak * ratio))
        out.append(FitResult(combo, dimension, None if f is None else round(f, 4), need, gpu_bytes - need, peak))
    st = structure(da)
    ratio = fits_on(da, base.bytes, base.index, base.bytes).overhead_ratio
    fit_note = (f"{'micro-batch' if dimension == 'batch' else 'sequence'} multiples of the recorded run: what grows "
                f"with the batch (activations, backward intermediates, inputs, forward and recompute scratch; not "
                f"weights, gradients, optimizer state, library workspaces) is scaled by the factor"
                + ("" if dimension == "batch" else f"; {st.notes[-1]}")
                + (f"; with this run's allocator overhead (reserved {ratio:.3f}x allocated at its peak)" if ratio
                   else "; no allocator overhead counted (the file has no allocator segments)"))
    return tuple(out), fit_note


def fits_on(da, base_bytes: int, base_index: int, scaled_bytes: int, gpu_bytes: int | None = None,
            remove_overhead: bool = False) -> Fits:
    """Whether `scaled_bytes` of allocated memory, plus the allocator's overhead at this
    run's peak (reserved over allocated there, assumed to scale with the peak), fit on
    `gpu_bytes` and on each common card."""
    reserved = da.live.reserved_at(base_index) if da.live is not None else None
    if remove_overhead:
        ratio = 1.0
        how = "no allocator overhead (expandable_segments)"
    elif reserved is None or base_bytes <= 0:
        ratio = None
        how = "allocator overhead unknown (no allocator segments in this file): none counted"
    else:
        ratio = max(1.0, reserved / base_bytes)
        how = (f"allocator overhead {ratio:.3f}x: reserved {fmt_bytes(reserved)} over allocated "
               f"{fmt_bytes(base_bytes)} at this run's peak")
    needed = int(math.ceil(scaled_bytes * (ratio or 1.0)))
    overhead = needed - scaled_bytes
    cards = tuple(CardFit(name, gib * GiB, needed <= gib * GiB, gib * GiB - needed) for name, gib in COMMON_CARDS)
    note = (f"needs {fmt_bytes(needed)}: the peak {fmt_bytes(scaled_bytes)} plus {how}; the CUDA context "
            f"(typically 0.3-0.6 GiB) and other processes are not in the snapshot and not counted")
    return Fits(scaled_bytes, ratio, overhead, needed, gpu_bytes,
                None if gpu_bytes is None else needed <= gpu_bytes,
                None if gpu_bytes is None else gpu_bytes - needed, cards, note)


__all__ = ["WhatIf", "WhatIfError", "PeakMoment", "Lever", "Fits", "CardFit", "FitResult", "LEVERS", "COMMON_CARDS",
           "FIT_DIMENSIONS", "what_if", "lever", "fits_on", "parse_scale", "parse_gpu_size", "growth_peak",
           "levers_left_out", "simulation"]
