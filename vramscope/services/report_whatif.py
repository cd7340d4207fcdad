"""The report's "What would fit" section: the napkin-math budget against the measurement,
and the peak each named lever would give (exact for its factors; the factors are the
stated estimates of classifiers/whatif.py).

`lever_table` works it out once per device (one per-category live model, one budget, for
the baseline and every lever); report.md and analysis.json both read that."""
from __future__ import annotations

from dataclasses import dataclass

from ..classifiers import Analysis
from ..classifiers.category_live import CategoryLive
from ..classifiers.whatif import WhatIf, what_if
from ..common.units import fmt_bytes
from ..present.markup import md_text
from ..present.words import peak_words
from .whatif import lever_peaks, levers_left_out


@dataclass(frozen=True)
class LeverTable:
    """One device's what-if for the report: the measured run with its budget and fits
    (`base`), the levers that cannot apply and why, and the peak each other lever gives."""
    base: WhatIf
    left_out: dict[str, str]
    levers: list[tuple[str, str, WhatIf]]       # (name, title, result)


def lever_table(an: Analysis, device: int) -> LeverTable:
    model = CategoryLive.build(an.devices[device])
    base = what_if(an, device, model=model)
    left_out = levers_left_out(an, device, base.budget.facts if base.budget is not None else None)
    return LeverTable(base, left_out, lever_peaks(an, device, left_out, model=model))


def whatif_section(t: LeverTable) -> list[str]:
    L = ["### What would fit", "",
         "The napkin-math budget (DESIGN.md §8) against what was measured:", "",
         "| Category | At the peak | Max over the run | Expected | Note |", "|---|---:|---:|---:|---|"]
    for r in t.base.budget.rows if t.base.budget is not None else ():
        exp = fmt_bytes(r.expected) if r.expected is not None else "-"
        L.append(f"| {r.category} | {fmt_bytes(r.measured)} | {fmt_bytes(r.measured_max)} | {exp} | {md_text(r.note)} |")
    L += ["", "The peak with each lever alone (`vramscope whatif FILE --lever NAME` says how each is estimated):", "",
          "| Lever | Peak | Change | Moment | Fits on |", "|---|---:|---:|---|---|"]
    for name, title, r in t.levers:
        d = r.scaled.bytes - r.baseline.bytes
        cards = [c.name.split(" (")[0] for c in r.fits.cards if c.fits]
        L.append(f"| {title} (`{name}`) | {fmt_bytes(r.scaled.bytes)} | {fmt_bytes(d) if d else 'none'} | "
                 f"{peak_words(r.scaled.type)} | {cards[0] if cards else 'none of the common cards'} |")
    if t.left_out:
        L += ["", "Left out: " + "; ".join(f"`{n}` ({why})" for n, why in t.left_out.items()) + "."]
    L.append("")
    return L


def whatif_json(t: LeverTable) -> dict:
    return {"budget": t.base.to_json()["budget"], "fits": t.base.fits.to_json(),
            "levers": [{"name": n, "title": title, "assumption": r.levers[0].assumption, "scaled": r.scaled.to_json(),
                        "needed_bytes": r.fits.needed_bytes} for n, title, r in t.levers],
            "levers_left_out": t.left_out}


__all__ = ["LeverTable", "lever_table", "whatif_section", "whatif_json"]
