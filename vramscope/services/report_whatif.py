"""The report's "What would fit" section: the napkin-math budget against the measurement,
the peak each named lever would give (simulated on the recorded timeline, or exact for its
factors; classifiers/whatif.py), and how far the micro-batch could grow on a card.

`lever_table` works it out once per device (one per-category live model, one budget, for
the baseline, every lever and the fit); report.md and analysis.json both read that."""
from __future__ import annotations

from dataclasses import dataclass

from ..classifiers import Analysis
from ..classifiers.category_live import CategoryLive
from ..classifiers.levers import LEVERS
from ..classifiers.whatif import COMMON_CARDS, CUDA_CONTEXT, WhatIf, what_if
from ..common.units import GiB, fmt_bytes
from ..present.markup import md_text
from ..present.words import peak_words
from .whatif import fit_factor_words, lever_peaks, levers_left_out


@dataclass(frozen=True)
class LeverTable:
    """One device's what-if for the report: the measured run with its budget and fits
    (`base`), the levers that cannot apply and why, the peak each other lever gives, and how
    far the micro-batch could grow on a card (`fit`)."""
    base: WhatIf
    left_out: dict[str, str]
    levers: list[tuple[str, str, WhatIf]]       # (name, title, result)
    fit: WhatIf | None
    state_only: bool = False                    # a snapshot without a trace (the run's fact)


def _card(base: WhatIf) -> int:
    """The card the report sizes the batch for: the smallest common one the run fits on as
    recorded, else the largest."""
    fits = [c.bytes for c in base.fits.cards if c.fits is not False]
    return fits[0] if fits else int(COMMON_CARDS[-1][1] * GiB) - CUDA_CONTEXT


def lever_table(an: Analysis, device: int) -> LeverTable:
    model = CategoryLive.build(an.devices[device])
    base = what_if(an, device, model=model)
    left_out = levers_left_out(an, device)
    fit = what_if(an, device, model=model, budget=base.budget, gpu=f"{_card(base)}B", fit="batch", with_budget=False)
    peaks = lever_peaks(an, device, left_out, base.budget, model=model)
    # a lever the run's structure does not support (its simulation declined) is left out too, saying why
    for name in LEVERS:
        if name not in left_out and name not in {n for n, _t, _r in peaks}:
            r = what_if(an, device, levers=[name], budget=base.budget, model=model, with_budget=False)
            left_out[name] = r.levers[0].why or "no prediction"
    return LeverTable(base, left_out, peaks, fit, state_only=an.devices[device].state_only)


def whatif_section(t: LeverTable) -> list[str]:
    L = ["### What would fit", "",
         "The napkin-math budget (DESIGN.md §8) against what was measured:", "",
         "| Category | At the peak | Max over the run | Expected | Note |", "|---|---:|---:|---:|---|"]
    for r in t.base.budget.rows if t.base.budget is not None else ():
        exp = fmt_bytes(r.expected) if r.expected is not None else "-"
        L.append(f"| {r.category} | {fmt_bytes(r.measured)} | {fmt_bytes(r.measured_max)} | {exp} | {md_text(r.note)} |")
    L += ["", "The peak with each lever alone (`vramscope whatif FILE --lever NAME` says what each assumes; "
              "simulated levers on the recorded timeline, with the error measured against recorded runs):", "",
          "| Lever | Peak | Change | Moment | Fits on | Error (mean / worst low to high) |", "|---|---:|---:|---|---|---|"]
    for name, title, r in t.levers:
        d = r.scaled.bytes - r.baseline.bytes
        cards = [c.name.split(" (")[0] for c in r.fits.cards if c.fits]
        if any(c.fits is None for c in r.fits.cards):
            cards = [f"not known (needs at least {fmt_bytes(r.fits.needed_bytes)})"]
        band = r.levers[0].error_band
        err = (f"{100 * band.mean:+.1f}% / {100 * band.worst_under:+.1f}% to {100 * band.worst_over:+.1f}%"
               if band is not None else ("estimate" if r.levers[0].estimate else "not validated for this run"))
        L.append(f"| {title} (`{name}`) | {fmt_bytes(r.scaled.bytes)} | {fmt_bytes(d) if d else 'none'} | "
                 f"{peak_words(r.scaled.type, t.state_only)} | {cards[0] if cards else 'none of the common cards'} | {err} |")
    if t.left_out:
        L += ["", "Left out: " + "; ".join(f"`{n}` ({why})" for n, why in t.left_out.items()) + "."]
    fit = t.fit
    if fit is not None and fit.fit and fit.fits.gpu_bytes is not None:
        L += ["", f"How far the micro-batch could grow on {fmt_bytes(fit.fits.gpu_bytes)} (`vramscope whatif FILE "
                  f"--gpu {fit.fits.gpu_bytes // GiB} --fit batch`):", "",
              "| Levers | Largest micro-batch multiple | Needs | To spare |", "|---|---:|---:|---:|"]
        for row in fit.fit:
            name = ' + '.join(f'`{n}`' for n in row.levers) or 'as recorded'
            if not row.applied:              # declined: why, never a number
                L.append(f"| {name} | {'not applied' if row.levers else 'no answer'}: {md_text(row.why)} | - | - |")
                continue
            L.append(f"| {name} | {fit_factor_words(row.max_factor)} | {fmt_bytes(row.fits_bytes)} | "
                     f"{fmt_bytes(row.headroom_bytes)} |")
        L += ["", md_text(fit.fit_note[:1].upper() + fit.fit_note[1:]) + "."]
    L.append("")
    return L


def whatif_json(t: LeverTable) -> dict:
    fit = t.fit
    return {"budget": t.base.to_json()["budget"], "fits": t.base.fits.to_json(),
            "levers": [{"name": n, "title": title, "assumption": r.levers[0].assumption, "scaled": r.scaled.to_json(),
                        "needed_bytes": r.fits.needed_bytes,
                        "error_band": r.levers[0].error_band.to_json() if r.levers[0].error_band else None}
                       for n, title, r in t.levers],
            "levers_left_out": t.left_out,
            "fit": [f.to_json() for f in fit.fit] if fit is not None else [],
            "fit_gpu_bytes": fit.fits.gpu_bytes if fit is not None else None,
            "fit_note": fit.fit_note if fit is not None else ""}


__all__ = ["LeverTable", "lever_table", "whatif_section", "whatif_json"]
