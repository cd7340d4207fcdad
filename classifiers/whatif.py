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
from .categories import CATEGORIES
from .budget import Budget, BudgetFacts, budget as make_budget
from .category_live import CategoryLive


class WhatIfError(ValueError):
    """A bad scale, lever or GPU size (the command line exits 2 on it); one-line message."""


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
class Lever:
    name: str
    title: str
    scales: dict            # {category: factor}
    removes_overhead: bool  # drops the allocator's reserved-but-unallocated memory in `fits`
    assumption: str         # why these factors: the estimate, in words

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "scales": dict(self.scales),
                "removes_overhead": self.removes_overhead, "assumption": self.assumption}


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


# -- levers ------------------------------------------------------------------------------------
CHECKPOINT_FACTOR = 0.15     # (2L + 34) / (34L) for L = 12..32 layers, rounded up (see below)
LORA_TRAINABLE = 0.01        # LoRA's typical trainable share of the parameters
NF4_BYTES = 0.5 + 4 / 64     # packed 4-bit weight + fp32 absmax per 64
ADAM8BIT_BYTES = 2 + 8 / 256 # two uint8 states + fp32 absmax per 256 values


def _lever_half_batch(facts):
    return ({"activations": 0.5, "autograd": 0.5, "inputs": 0.5}, False,
            "halving the micro-batch halves what grows with it: saved activations, backward intermediates "
            "and the batch itself (keep the effective batch with 2x gradient accumulation); weights, "
            "gradients and optimizer state do not change; dequantization scratch and temporaries are "
            "left as they are")


def _lever_checkpointing(facts):
    return ({"activations": CHECKPOINT_FACTOR}, False,
            f"gradient checkpointing keeps each layer's input (about 2.s.b.h bytes of the ~34.s.b.h a "
            f"transformer layer saves) plus one layer's activations while it is recomputed: "
            f"(2L + 34) / (34L) = 0.09-0.14 for 12-32 layers, so activations x {CHECKPOINT_FACTOR}; the "
            f"logits and loss are not checkpointed (the estimate is optimistic where they dominate); "
            f"backward intermediates unchanged; about a third more compute")


def _lever_adam8bit(facts):
    bpp = facts.optimizer_bytes_per_param if facts is not None else None
    if bpp:
        f = min(1.0, ADAM8BIT_BYTES / bpp)
        why = f"{ADAM8BIT_BYTES:.2f} B per trainable parameter instead of the {bpp:.2f} B measured"
    else:
        f = 0.25
        why = f"{ADAM8BIT_BYTES:.2f} B per trainable parameter instead of AdamW's 8 B (fp32 moments)"
    return ({"optimizer": round(f, 6)}, False,
            f"an 8-bit optimizer (bitsandbytes AdamW8bit) keeps both moments in uint8 with an fp32 absmax "
            f"per 256 values: {why}, so optimizer state x {f:.3g}")


def _lever_paged(facts):
    return ({"optimizer": 0.0}, False,
            "a paged optimizer (bitsandbytes PagedAdamW/PagedAdamW8bit) keeps its state in CUDA unified "
            "memory, outside the caching allocator, which the driver moves to host RAM under memory "
            "pressure: counted as 0 on the GPU at the peak (optimistic: steps get slower while paging, and "
            "state of tensors under 100,000 elements stays on the GPU)")


def _lever_lora(facts):
    frac = facts.trainable_fraction if facts is not None and facts.trainable_fraction else None
    now = frac if frac else 1.0
    f = min(1.0, LORA_TRAINABLE / now)
    said = f"{now:.3%} trainable now" if frac else "full fine-tuning assumed now"
    return ({"gradients": round(f, 6), "optimizer": round(f, 6)}, False,
            f"LoRA trains about {LORA_TRAINABLE:.0%} of the parameters (rank 8-16 adapters on the attention "
            f"and MLP projections) with the base frozen: gradients and optimizer state x {f:.3g} ({said}); "
            f"the adapters' own weights (~1%) and their activations are ignored")


def _lever_4bit(facts):
    b = facts.frozen_dtype_bytes if facts is not None and facts.frozen_weight_bytes else \
        (facts.trainable_dtype_bytes if facts is not None else 4.0)
    src = (facts.dtype_evidence if facts is not None and facts.dtype_evidence else "fp32 assumed")
    f = min(1.0, NF4_BYTES / b)
    return ({"weights": round(f, 6)}, False,
            f"4-bit base weights (bitsandbytes NF4, QLoRA): {NF4_BYTES:.4f} B per parameter (0.5 B packed + an "
            f"fp32 absmax per 64) instead of {b:g} B ({src}), so weights x {f:.3g}; applies to the whole "
            f"weights category, so pair it with lora for a full fine-tune (4-bit weights cannot be trained); "
            f"one layer's dequantization scratch is ignored")


def _lever_expandable(facts):
    return ({}, True,
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True maps memory in small granules and grows "
            "segments instead of caching many fixed ones: the reserved-but-unallocated memory at the peak "
            "(fragmentation) is taken as gone; the allocated peak itself does not change")


LEVERS = {
    "half_batch": ("halve the micro-batch", _lever_half_batch),
    "checkpointing": ("gradient checkpointing", _lever_checkpointing),
    "adam8bit": ("8-bit optimizer", _lever_adam8bit),
    "paged_optimizer": ("paged optimizer", _lever_paged),
    "lora": ("LoRA instead of full fine-tuning", _lever_lora),
    "4bit": ("4-bit base weights", _lever_4bit),
    "expandable_segments": ("expandable_segments", _lever_expandable),
}


def lever(name: str, facts: BudgetFacts | None = None) -> Lever:
    """The named lever's factors for this run (some use the budget's facts)."""
    if name not in LEVERS:
        raise WhatIfError(f"unknown lever {name!r} (known: {', '.join(LEVERS)})")
    title, fn = LEVERS[name]
    scales, removes, why = fn(facts)
    return Lever(name, title, scales, removes, "estimate: " + why)


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
