"""`vramscope whatif`: the budget, the levers, the scaled peak and how far the batch or the
sequence could grow, as JSON and as text.

The numbers come from classifiers/whatif.py (exact for the factors; the structural levers
simulated on the recorded timeline, each with its assumption and measured error band);
this module only assembles the document (DESIGN.md §6) and words it.
"""
from __future__ import annotations

from typing import Any

from ..classifiers import Analysis
from ..classifiers.budget import budget
from ..classifiers.category_live import CategoryLive
from ..classifiers.levers import TARGETS_DEFAULT
from ..classifiers.whatif import LEVERS, WhatIf, what_if
from ..classifiers.whatif import levers_left_out as _levers_left_out
from ..common.units import fmt_bytes
from ..present.words import moment_text, peak_words


def whatif_document(an: Analysis, scales: dict[str, float], levers: list[str], gpu, device: int | None,
                    fit: str | None = None, lora_rank: int = 8, lora_targets: str = TARGETS_DEFAULT) -> dict:
    """{"file", "devices": [per device what_if(...).to_json() and "recorded", what the file holds
    of it: "trace", "state_only" or "empty" (the run's fact)]}, the one to look at first leading."""
    devs = [device] if device is not None else an.device_order()
    out = []
    for d in devs:
        doc = what_if(an, d, scales, levers, gpu, fit=fit, lora_rank=lora_rank, lora_targets=lora_targets).to_json()
        run = getattr(an.devices[d], "run", None)
        doc["recorded"] = str(run.recorded.value) if run is not None else "empty"
        out.append(doc)
    return {"file": an.snapshot.path, "devices": out}


def levers_left_out(an: Analysis, device: int) -> dict[str, str]:
    """{lever: why it cannot apply to this run}: classifiers.levers.left_out, the one rule
    every surface's advice reads (classifiers.whatif.levers_left_out asks it lever by lever)."""
    return _levers_left_out(an, device)


def lever_peaks(an: Analysis, device: int, skip: dict[str, str] | None = None,
                bud=None, model: CategoryLive | None = None) -> list[tuple[str, str, WhatIf]]:
    """(name, title, result) of each named lever alone that can apply to this run (`skip`:
    levers_left_out, `bud`: the device's budget, `model`: its CategoryLive, when the caller
    has them): the peak each one gives."""
    bud = bud if bud is not None else budget(an, device)
    skip = skip if skip is not None else levers_left_out(an, device)
    model = model if model is not None else CategoryLive.build(an.devices[device])
    out = []
    for name, lv in LEVERS.items():
        if name in skip:
            continue
        r = what_if(an, device, levers=[name], budget=bud, model=model, with_budget=False)
        if r.prediction:
            out.append((name, lv.title, r))
    return out


def _moment(m: dict, state_only: bool = False) -> str:
    return f"{fmt_bytes(m['bytes'])} {moment_text(m['index'], state_only)}, {peak_words(m['type'], state_only)}"


def whatif_text(doc: dict[str, Any]) -> str:
    out = []
    for d in doc["devices"]:
        out.append(f"device {d['device']}")
        state_only = d.get("recorded") == "state_only"
        out.append(f"  measured peak  {_moment(d['baseline'], state_only)}")
        if d["scales"] or (d["levers"] and d.get("prediction", True)):
            factors = ", ".join([f"{c} x{f:g}" for c, f in d["scales"].items()] +
                                [lv["name"] for lv in d["levers"] if lv["applied"]])
            out.append(f"  scaled         {factors}")
            out.append(f"  scaled peak    {_moment(d['scaled'], state_only)} "
                       f"({fmt_bytes(d['scaled']['bytes'] - d['baseline']['bytes'])})")
            for c, b in sorted(d["scaled"]["by_category"].items(), key=lambda kv: -kv[1]):
                out.append(f"    {c:<13} {fmt_bytes(b):>11}")
        for lv in d["levers"]:
            if not lv["applied"]:
                out.append(f"  lever {lv['name']}: not applied: {lv['why']}")
                continue
            out.append(f"  lever {lv['name']}: {lv['assumption']}")
            out.append(f"    {_band_words(lv['error_band'], lv.get('band_note', ''), lv.get('estimate', False))}")
        if not d.get("prediction", True):
            out.append("  no prediction: a lever asked for does not apply to this run (above); the peak is the "
                       "recorded run's")
        out.append("  budget (napkin math against the measurement)")
        out.append(f"    {'category':<13} {'at peak':>11} {'max':>11} {'expected':>11}  note")
        for r in d["budget"]:
            exp = fmt_bytes(r["expected"]) if r["expected"] is not None else "-"
            out.append(f"    {r['category']:<13} {fmt_bytes(r['measured']):>11} {fmt_bytes(r['measured_max']):>11} "
                       f"{exp:>11}  {r['note']}")
        f = d["fits"]
        if f["gpu_bytes"] is not None:
            verdict = "fits" if f["fits"] else (
                f"short by {fmt_bytes(-f['headroom_bytes'])}" if f["fits"] is False else
                f"cannot tell: it needs at least {fmt_bytes(f['needed_bytes'])}, and the trace ends in the "
                f"out-of-memory error")
            room = f", {fmt_bytes(f['headroom_bytes'])} to spare" if f["fits"] else ""
            out.append(f"  on {fmt_bytes(f['gpu_bytes'])}: {verdict}{room}")
        out.append("  " + fits_on_words(f["cards"], d.get("prediction", True)))
        out.append(f"  ({f['note']})")
        out += _fit_lines(d)
        out.append(f"  {d['note']}")
    return "\n".join(out)


def fits_on_words(cards: list[dict], prediction: bool = True) -> str:
    """The common cards it fits on ('fits on       16 GB, 24 GB (tight)'); where the need is a
    floor (a trace an OOM cut short), the cards too small and that the rest cannot be told."""
    yes = [c["name"].split(" (")[0] + (" (tight)" if c.get("tight") else "") for c in cards if c["fits"]]
    if any(c["fits"] is None for c in cards):
        no = [c["name"].split(" (")[0] for c in cards if c["fits"] is False]
        return ("fits on        not known (the need is a lower bound: the trace ends in the out-of-memory error)"
                + (f"; too small: {', '.join(no)}" if no else ""))
    what = "fits on       " if prediction else "as recorded, fits on"
    return f"{what} {', '.join(yes) if yes else 'none of the common cards'}"


def band_words(band, note: str = "", estimate: bool = False) -> str:
    """The error band in words: signed (mean; worst too low, worst too high), or why there is none."""
    if estimate:
        return "an estimate: " + (note or "not measured against recorded runs")
    if band is None:
        return "error band: " + (note or "not measured (no recorded run with this lever pulled)")
    return (f"error band: mean {100 * band['mean']:+.2f}%, worst {100 * band['worst_under']:+.2f}% (too low) / "
            f"{100 * band['worst_over']:+.2f}% (too high) of the peak over {band['cases']} recorded runs; "
            + note)


_band_words = band_words


def fit_factor_words(f) -> str:
    """'x 2.41', 'nothing grows', 'does not fit'."""
    if f is None:
        return "nothing grows with it"
    if f <= 0:
        return "does not fit"
    return f"x {f:,.2f}"


def _fit_lines(d: dict) -> list[str]:
    if not d.get("fit"):
        return []
    dim = "micro-batch" if d["fit"][0]["dimension"] == "batch" else "sequence"
    out = [f"  how far the {dim} can grow on {fmt_bytes(d['fits']['gpu_bytes'])}",
           f"    {'levers':<34} {'largest multiple':>17} {'needs':>11} {'to spare':>11}"]
    for r in d["fit"]:
        name = " + ".join(r["levers"]) or "(as recorded)"
        if not r.get("applied", True):
            out.append(f"    {name:<34} {'not applied' if r['levers'] else 'no answer'}: {r['why']}")
            continue
        out.append(f"    {name:<34} {fit_factor_words(r['max_factor']):>17} {fmt_bytes(r['fits_bytes']):>11} "
                   f"{fmt_bytes(r['headroom_bytes']):>11}")
    out.append(f"    ({d['fit_note']})")
    return out


__all__ = ["whatif_document", "whatif_text", "lever_peaks", "levers_left_out", "fit_factor_words", "band_words"]
