"""What if a category's memory were bigger or smaller? The peak over the whole run,
recomputed exactly, the levers a user can pull, and whether it fits a GPU (DESIGN.md §8).

    r = what_if(an, device, scales={"activations": 0.5}, levers=["adam8bit"], gpu="24")
    r.scaled.bytes, r.scaled.index, r.scaled.type, r.scaled.by_category
    r.to_json()     # one device of `vramscope whatif --json`

The scaled peak is the maximum over the recorded trace of sum_c round(f_c * live_c(t))
(round: float64 product, then round half to even; see category_live.py): exact for the
factors. A lever is an estimate of the factors a change would bring (stated with it);
the moment of the peak moves between types (§4) as the terms change, which napkin math
alone misses. The models behind it (CategoryLive, Budget) are built once per device and
can be passed back in (the viewer keeps them while the user moves sliders).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..common.units import GiB, fmt_bytes, parse_size
from .budget import Budget
from .budget import budget as make_budget
from .categories import CATEGORIES
from .category_live import CategoryLive
from .levers import LEVERS, Lever, LeverError, lever

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
class WhatIf:
    device: int
    baseline: PeakMoment
    scaled: PeakMoment
    scales: dict                    # {category: combined factor}, factors other than 1 only
    levers: tuple                   # Lever
    budget: Budget | None
    fits: Fits
    note: str                       # exact for the factors; the levers are estimates

    def to_json(self) -> dict:
        """The per-device object of `vramscope whatif --json` (DESIGN.md §6), plus
        `levers` (each with its assumption), `facts` (what the budget inferred) and `note`."""
        return {"device": self.device, "baseline": self.baseline.to_json(), "scaled": self.scaled.to_json(),
                "scales": dict(self.scales),
                "budget": self.budget.to_json() if self.budget is not None else [],
                "fits": self.fits.to_json(),
                "levers": [lv.to_json() for lv in self.levers],
                "facts": self.budget.facts.to_json() if self.budget is not None else None,
                "note": self.note}


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
    """'24' (GiB), '24GiB', '24G', '80GB' (GPU memory is sold in binary units), '24576MiB' -> bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
        if not math.isfinite(value) or value <= 0:
            raise WhatIfError(f"GPU size must be positive, not {text!r}")
        return int(value * GiB)
    s = str(text).strip()
    try:
        value = float(s)
    except ValueError:
        b = parse_size(s)
    else:
        if not math.isfinite(value) or value <= 0:
            raise WhatIfError(f"GPU size must be positive, not {text!r}")
        return int(value * GiB)
    if not b or b <= 0:
        raise WhatIfError(f"GPU size {text!r}: expected e.g. 24, 24GiB or 80GB")
    return int(b)


# -- the computation ----------------------------------------------------------------------------
def what_if(an, device: int, scales: dict | None = None, levers=(), gpu=None,
            model: CategoryLive | None = None, budget: Budget | None = None,
            with_budget: bool = True) -> WhatIf:
    """Scale categories (explicit `scales` and named `levers`, multiplied together) and
    recompute the peak of `device` over the whole run; the budget and the fits too.
    Raises WhatIfError (a ValueError) for an unknown category, lever or device, a factor
    below 0 (or not finite) and an unreadable GPU size."""
    if device not in an.devices:
        raise WhatIfError(f"no device {device} in this snapshot (devices: {', '.join(map(str, an.devices)) or 'none'})")
    checked = dict(_check_scale(k, v) for k, v in (scales or {}).items())
    gpu_bytes = parse_gpu_size(gpu) if gpu is not None else None
    names = [levers] if isinstance(levers, str) else list(levers)
    for n in names:
        if n not in LEVERS:
            raise WhatIfError(f"unknown lever {n!r} (known: {', '.join(LEVERS)})")
    da = an.devices[device]
    cl = model if model is not None else CategoryLive.build(da)
    bud = budget if budget is not None else (make_budget(an, device, model=cl) if with_budget else None)
    facts = bud.facts if bud is not None else None
    lv = tuple(lever(n, facts) for n in names)

    combined = {c: 1.0 for c in CATEGORIES}
    for lever_ in lv:
        for c, f in lever_.scales.items():
            combined[c] *= f
    for c, f in checked.items():
        combined[c] *= f
    factors = {c: f for c, f in combined.items() if f != 1.0}

    base = cl.peak()
    scaled = cl.peak(factors) if factors else base
    baseline = PeakMoment(base.bytes, base.index, da.peak_type(base.index), base.by_category)
    scaled_m = baseline if scaled is base else \
        PeakMoment(scaled.bytes, scaled.index, da.peak_type(scaled.index), scaled.by_category)
    removes = any(x.removes_overhead for x in lv)
    fits = fits_on(da, base.bytes, base.index, scaled.bytes, gpu_bytes, removes)
    note = ("exact for these factors: the peak of the recorded run with each category's live bytes "
            "scaled at every moment (per category, rounded to whole bytes)")
    if lv:
        note += ("; the levers' factors are estimates of what each change would do, stated with each "
                 "lever, not measurements")
    return WhatIf(device, baseline, scaled_m, factors, lv, bud, fits, note)


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


__all__ = ["WhatIf", "WhatIfError", "PeakMoment", "Lever", "Fits", "CardFit", "LEVERS", "COMMON_CARDS",
           "what_if", "lever", "fits_on", "parse_scale", "parse_gpu_size"]
