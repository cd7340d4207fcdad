"""`vramscope whatif`: the budget, the levers and the scaled peak, as JSON and as text.

The numbers come from classifiers/whatif.py (exact for the factors; levers are stated
estimates); this module only assembles the document (DESIGN.md §6) and words it.
"""
from __future__ import annotations

from typing import Any

from ..classifiers import Analysis
from ..classifiers.budget import budget
from ..classifiers.category_live import CategoryLive
from ..classifiers.levers import left_out
from ..classifiers.ooms import expandable_segments_on, trains
from ..classifiers.whatif import LEVERS, WhatIf, what_if
from ..common.units import fmt_bytes
from ..present.words import peak_words


def whatif_document(an: Analysis, scales: dict[str, float], levers: list[str], gpu, device: int | None) -> dict:
    """{"file", "devices": [per device what_if(...).to_json()]}, the one to look at first leading."""
    devs = [device] if device is not None else an.device_order()
    return {"file": an.snapshot.path, "devices": [what_if(an, d, scales, levers, gpu).to_json() for d in devs]}


def levers_left_out(an: Analysis, device: int, facts=None) -> dict[str, str]:
    """{lever: why it cannot apply to this run} (classifiers.levers.left_out); `facts`: the
    device's budget facts when the caller has them."""
    da = an.devices[device]
    facts = facts if facts is not None else budget(an, device).facts
    training = trains(da)
    expandable = expandable_segments_on(an.snapshot.allocator_settings)
    out = {}
    for name in LEVERS:
        why = left_out(name, facts, training=training, expandable=expandable)
        if why is not None:
            out[name] = why
    return out


def lever_peaks(an: Analysis, device: int, skip: dict[str, str] | None = None,
                model: CategoryLive | None = None) -> list[tuple[str, str, WhatIf]]:
    """(name, title, result) of each named lever alone that can apply to this run (`skip`:
    levers_left_out, `model`: the device's CategoryLive, when the caller has them): the peak
    each one gives."""
    skip = skip if skip is not None else levers_left_out(an, device)
    model = model if model is not None else CategoryLive.build(an.devices[device])
    return [(name, title, what_if(an, device, levers=[name], model=model, with_budget=False))
            for name, (title, _) in LEVERS.items() if name not in skip]


def _moment(m: dict) -> str:
    where = "at the start of the trace" if m["index"] < 0 else f"at entry {m['index']:,}"
    return f"{fmt_bytes(m['bytes'])} {where}, {peak_words(m['type'])}"


def whatif_text(doc: dict[str, Any]) -> str:
    out = []
    for d in doc["devices"]:
        out.append(f"device {d['device']}")
        out.append(f"  measured peak  {_moment(d['baseline'])}")
        if d["scales"]:
            factors = ", ".join(f"{c} x{f:g}" for c, f in d["scales"].items())
            out.append(f"  scaled         {factors}")
            out.append(f"  scaled peak    {_moment(d['scaled'])} "
                       f"({fmt_bytes(d['scaled']['bytes'] - d['baseline']['bytes'])})")
            for c, b in sorted(d["scaled"]["by_category"].items(), key=lambda kv: -kv[1]):
                out.append(f"    {c:<13} {fmt_bytes(b):>11}")
        for lv in d["levers"]:
            out.append(f"  lever {lv['name']}: {lv['assumption']}")
        out.append("  budget (napkin math against the measurement)")
        out.append(f"    {'category':<13} {'at peak':>11} {'max':>11} {'expected':>11}  note")
        for r in d["budget"]:
            exp = fmt_bytes(r["expected"]) if r["expected"] is not None else "-"
            out.append(f"    {r['category']:<13} {fmt_bytes(r['measured']):>11} {fmt_bytes(r['measured_max']):>11} "
                       f"{exp:>11}  {r['note']}")
        f = d["fits"]
        if f["gpu_bytes"] is not None:
            verdict = "fits" if f["fits"] else f"short by {fmt_bytes(-f['headroom_bytes'])}"
            room = f", {fmt_bytes(f['headroom_bytes'])} to spare" if f["fits"] else ""
            out.append(f"  on {fmt_bytes(f['gpu_bytes'])}: {verdict}{room}")
        cards = [c["name"].split(" (")[0] for c in f["cards"] if c["fits"]]
        out.append(f"  fits on        {', '.join(cards) if cards else 'none of the common cards'}")
        out.append(f"  ({f['note']})")
        out.append(f"  {d['note']}")
    return "\n".join(out)


__all__ = ["whatif_document", "whatif_text", "lever_peaks", "levers_left_out"]
