"""The report's "What would fit" section: the napkin-math budget against the measurement,
and the peak each named lever would give (exact for its factors; the factors are the
stated estimates of classifiers/whatif.py)."""
from __future__ import annotations

from ..classifiers import Analysis
from ..classifiers.whatif import what_if
from ..common.units import fmt_bytes
from ..present.markup import md_text
from ..present.words import peak_words
from .whatif import lever_peaks, levers_left_out


def whatif_section(an: Analysis, device: int) -> list[str]:
    base = what_if(an, device)
    L = ["### What would fit", "",
         "The napkin-math budget (DESIGN.md §8) against what was measured:", "",
         "| Category | At the peak | Max over the run | Expected | Note |", "|---|---:|---:|---:|---|"]
    for r in base.budget.rows if base.budget is not None else ():
        exp = fmt_bytes(r.expected) if r.expected is not None else "-"
        L.append(f"| {r.category} | {fmt_bytes(r.measured)} | {fmt_bytes(r.measured_max)} | {exp} | {md_text(r.note)} |")
    L += ["", "The peak with each lever alone (`vramscope whatif FILE --lever NAME` says how each is estimated):", "",
          "| Lever | Peak | Change | Moment | Fits on |", "|---|---:|---:|---|---|"]
    skipped = levers_left_out(an, device)
    for name, title, r in lever_peaks(an, device, skipped):
        d = r.scaled.bytes - r.baseline.bytes
        cards = [c.name.split(" (")[0] for c in r.fits.cards if c.fits]
        L.append(f"| {title} (`{name}`) | {fmt_bytes(r.scaled.bytes)} | {fmt_bytes(d) if d else 'none'} | "
                 f"{peak_words(r.scaled.type)} | {cards[0] if cards else 'none of the common cards'} |")
    if skipped:
        L += ["", "Left out: " + "; ".join(f"`{n}` ({why})" for n, why in skipped.items()) + "."]
    L.append("")
    return L


def whatif_json(an: Analysis, device: int) -> dict:
    base = what_if(an, device)
    skipped = levers_left_out(an, device)
    return {"budget": base.to_json()["budget"], "fits": base.fits.to_json(),
            "levers": [{"name": n, "title": t, "assumption": r.levers[0].assumption, "scaled": r.scaled.to_json(),
                        "needed_bytes": r.fits.needed_bytes} for n, t, r in lever_peaks(an, device, skipped)],
            "levers_left_out": skipped}


__all__ = ["whatif_section", "whatif_json"]
