"""The report's "What would fit" section: the napkin-math budget against the measurement,
the peak each named lever would give (simulated on the recorded timeline, or exact for its
factors; classifiers/whatif.py), and how far the micro-batch could grow on a card."""
from __future__ import annotations

from ..classifiers import Analysis
from ..classifiers.whatif import COMMON_CARDS, what_if
from ..common.units import GiB, fmt_bytes
from ..present.markup import md_text
from ..present.words import peak_words
from .whatif import fit_factor_words, lever_peaks, levers_left_out


def whatif_section(an: Analysis, device: int) -> list[str]:
    base = what_if(an, device)
    L = ["### What would fit", "",
         "The napkin-math budget (DESIGN.md §8) against what was measured:", "",
         "| Category | At the peak | Max over the run | Expected | Note |", "|---|---:|---:|---:|---|"]
    for r in base.budget.rows if base.budget is not None else ():
        exp = fmt_bytes(r.expected) if r.expected is not None else "-"
        L.append(f"| {r.category} | {fmt_bytes(r.measured)} | {fmt_bytes(r.measured_max)} | {exp} | {md_text(r.note)} |")
    L += ["", "The peak with each lever alone (`vramscope whatif FILE --lever NAME` says what each assumes; "
              "simulated levers on the recorded timeline, with the error measured against recorded runs):", "",
          "| Lever | Peak | Change | Moment | Fits on | Error (mean / worst) |", "|---|---:|---:|---|---|---|"]
    skipped = levers_left_out(an, device)
    for name, title, r in lever_peaks(an, device, skipped, base.budget):
        d = r.scaled.bytes - r.baseline.bytes
        cards = [c.name.split(" (")[0] for c in r.fits.cards if c.fits]
        band = r.levers[0].error_band
        err = f"{100 * band.mean:.1f}% / {100 * band.worst:.1f}%" if band is not None else "not measured"
        L.append(f"| {title} (`{name}`) | {fmt_bytes(r.scaled.bytes)} | {fmt_bytes(d) if d else 'none'} | "
                 f"{peak_words(r.scaled.type)} | {cards[0] if cards else 'none of the common cards'} | {err} |")
    if skipped:
        L += ["", "Left out: " + "; ".join(f"`{n}` ({why})" for n, why in skipped.items()) + "."]
    fit = _fit(an, device, base)
    if fit is not None and fit.fit:
        L += ["", f"How far the micro-batch could grow on {fmt_bytes(fit.fits.gpu_bytes)} (`vramscope whatif FILE "
                  f"--gpu {fit.fits.gpu_bytes // GiB} --fit batch`):", "",
              "| Levers | Largest micro-batch multiple | Needs | To spare |", "|---|---:|---:|---:|"]
        for row in fit.fit:
            L.append(f"| {' + '.join(f'`{n}`' for n in row.levers) or 'as recorded'} | "
                     f"{fit_factor_words(row.max_factor)} | {fmt_bytes(row.fits_bytes)} | "
                     f"{fmt_bytes(row.headroom_bytes)} |")
        L += ["", md_text(fit.fit_note[:1].upper() + fit.fit_note[1:]) + "."]
    L.append("")
    return L


def _card(base) -> int:
    """The card the report sizes the batch for: the smallest common one the run fits on as
    recorded, else the largest."""
    fits = [c.bytes for c in base.fits.cards if c.fits]
    return fits[0] if fits else COMMON_CARDS[-1][1] * GiB


def _fit(an: Analysis, device: int, base):
    return what_if(an, device, budget=base.budget, gpu=f"{_card(base)}B", fit="batch", with_budget=False)


def whatif_json(an: Analysis, device: int) -> dict:
    base = what_if(an, device)
    skipped = levers_left_out(an, device)
    fit = _fit(an, device, base)
    return {"budget": base.to_json()["budget"], "fits": base.fits.to_json(),
            "levers": [{"name": n, "title": t, "assumption": r.levers[0].assumption, "scaled": r.scaled.to_json(),
                        "needed_bytes": r.fits.needed_bytes,
                        "error_band": r.levers[0].error_band.to_json() if r.levers[0].error_band else None}
                       for n, t, r in lever_peaks(an, device, skipped, base.budget)],
            "levers_left_out": skipped,
            "fit": [f.to_json() for f in fit.fit], "fit_gpu_bytes": fit.fits.gpu_bytes, "fit_note": fit.fit_note}


__all__ = ["whatif_section", "whatif_json"]
