"""`vramscope compare A B`: two recordings of one run, before and after a change.

`compare_analyses` sets two analyses side by side (classifiers/compare.py) with the code
sites keyed by the presentation layer (`Stacks.site_key`: path tail and function, so the
same code checked out in two places matches); `compare_document` is the JSON of
`compare --json` (DESIGN.md §6; its shape is spelled out as TypedDicts below: scripts
depend on it), and `compare_text` tells the same document as the command line's text.

Per device: each side's peak exactly as `summary` reports it (without its `top` list:
the sites take its place), the deltas B - A (total and by category, each at its side's
own peak), the iterations' peaks side by side, and every code site live at either peak
with its bytes on each side; each side's sites add up to its peak.
"""
from __future__ import annotations

import os
from typing import Any, TypedDict

import numpy as np

from ..classifiers import Analysis, to_plain
from ..classifiers.compare import Comparison, DeviceComparison, compare, compare_side, compare_sides
from ..common.units import fmt_bytes
from ..present.stacks import Stacks, site_where
from ..present.words import comparison_headline, moment_text, signed_bytes
from .summary import PeakDocJSON, peak_document

SITES_IN_TEXT = 20
LINES_IN_TEXT = 4
ITERATIONS_AT_EACH_END = 5


ComparePeakJSON = PeakDocJSON          # the peak as summary tells it, without its `top` list


class OriginJSON(TypedDict):
    index: int
    time_us: int | None


class CompareSideJSON(TypedDict):
    entries: int
    peak: ComparePeakJSON
    iterations: list[dict[str, Any]]
    origin: OriginJSON
    state_only: bool


class DeltaJSON(TypedDict):
    peak_bytes: int
    by_category: dict[str, int]


class IterationPeaksJSON(TypedDict):
    number: int
    a_bytes: int | None
    b_bytes: int | None
    delta: int | None
    a_type: str | None
    b_type: str | None


class SiteJSON(TypedDict):
    where: str
    a_bytes: int
    b_bytes: int
    delta: int
    a_count: int
    b_count: int
    lines: list[dict[str, int]]


class CompareDeviceJSON(TypedDict):
    device: int
    headline: str
    a: CompareSideJSON
    b: CompareSideJSON
    delta: DeltaJSON
    iterations: list[IterationPeaksJSON]
    sites: list[SiteJSON]


class CompareJSON(TypedDict):
    a: str
    b: str
    devices: list[CompareDeviceJSON]
    only_a: list[int]
    only_b: list[int]
    notes: list[str]


def compare_analyses(an_a: Analysis, an_b: Analysis, device: int | None = None) -> Comparison:
    """The two analyses compared device by device (classifiers.compare.compare); raises
    CompareError (bad input) when they have no device in common or one has no data."""
    return compare(an_a, an_b, Stacks(an_a).site_key, Stacks(an_b).site_key, device,
                   a_name=f"A ({an_a.snapshot.path})", b_name=f"B ({an_b.snapshot.path})")


def compare_devices(an_a: Analysis, dev_a: int, an_b: Analysis, dev_b: int) -> Comparison:
    """One device of A against one device of B whatever their numbers: two ranks of one job,
    each on its own GPU (the comparison is filed under A's device)."""
    sides = []
    for an, dev in ((an_a, dev_a), (an_b, dev_b)):
        cols = an.snapshot.trace(dev).columns
        sides.append(compare_side(an.devices[dev], Stacks(an).site_key,
                                  np.asarray(cols["time_us"]) if "time_us" in cols else None))
    return Comparison(devices=(compare_sides(*sides),), only_a=(), only_b=())


def _side_json(side) -> CompareSideJSON:
    peak: ComparePeakJSON = peak_document(side.peak, side.state_only)
    return {"entries": side.entries, "peak": peak, "iterations": to_plain(side.iterations),
            "origin": {"index": side.origin_index, "time_us": side.origin_us}, "state_only": side.state_only}


def device_json(dc: DeviceComparison) -> CompareDeviceJSON:
    sites: list[SiteJSON] = [
        {"where": site_where(s.file, s.function), "a_bytes": s.a_bytes, "b_bytes": s.b_bytes, "delta": s.delta,
         "a_count": s.a_count, "b_count": s.b_count, "lines": to_plain(s.lines)}
        for s in dc.sites]
    return {"device": dc.device, "headline": comparison_headline(dc), "a": _side_json(dc.a), "b": _side_json(dc.b),
            "delta": {"peak_bytes": dc.peak_delta, "by_category": dict(dc.by_category_delta)},
            "iterations": to_plain(dc.iterations), "sites": sites}


def comparison_notes(cmp: Comparison, a_path: str, b_path: str) -> list[str]:
    """What a reader must know to read the numbers right: devices left out, state-only sides."""
    notes = []
    for devs, name in ((cmp.only_a, f"A ({os.path.basename(a_path)})"), (cmp.only_b, f"B ({os.path.basename(b_path)})")):
        for d in devs:
            notes.append(f"device {d} has data only in {name}: not compared")
    for dc in cmp.devices:
        if dc.a.device != dc.b.device:
            notes.append(f"A's device {dc.a.device} against B's device {dc.b.device} (no device in common)")
        for side, name in ((dc.a, "A"), (dc.b, "B")):
            if side.entries == 0:
                notes.append(f"device {dc.device}: {name} has no trace (a state-only snapshot): its peak is the "
                             f"memory live when the snapshot was taken, with no iterations")
    return notes


def compare_document(cmp: Comparison, a_path: str, b_path: str) -> CompareJSON:
    """The JSON of `vramscope compare A B --json`."""
    return {"a": a_path, "b": b_path, "devices": [device_json(dc) for dc in cmp.devices],
            "only_a": list(cmp.only_a), "only_b": list(cmp.only_b), "notes": comparison_notes(cmp, a_path, b_path)}


# -- text -------------------------------------------------------------------------------------
def _opt(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def _row(label: str, a: str, b: str, d: str, indent: int = 4) -> str:
    return f"{' ' * indent}{label:<{20 - indent}} {a:>11}  {b:>11}  {d:>11}"


def compare_text(doc: CompareJSON, sites: int = SITES_IN_TEXT) -> str:
    """The command line's text for a comparison document: a side-by-side table per device,
    the biggest site changes first."""
    out = [f"A  {doc['a']}", f"B  {doc['b']}"]
    for d in doc["devices"]:
        a, b = d["a"], d["b"]
        out += ["", f"device {d['device']}: {d['headline']}", _row("", "A", "B", "B - A", 2)]
        out.append(_row("peak live", fmt_bytes(a["peak"]["bytes"]), fmt_bytes(b["peak"]["bytes"]),
                        signed_bytes(d["delta"]["peak_bytes"]), 2))
        ca, cb = a["peak"]["by_category"], b["peak"]["by_category"]
        for cat, delta in sorted(d["delta"]["by_category"].items(),
                                 key=lambda kv: (-max(ca.get(kv[0], 0), cb.get(kv[0], 0)), kv[0])):
            out.append(_row(cat, fmt_bytes(ca.get(cat, 0)), fmt_bytes(cb.get(cat, 0)), signed_bytes(delta)))
        for name, side in (("A", a), ("B", b)):
            pk = side["peak"]
            when = moment_text(pk["index"], bool(side.get("state_only"))) + (f" (iteration {pk['iteration']})" if pk["iteration"] is not None else "")
            out.append(f"  {name} peak {when}, {pk['type_words']}")
        its = d["iterations"]
        if its:
            out.append(f"  iteration peaks ({len(a['iterations'])} iterations in A, {len(b['iterations'])} in B)")
            # hundreds of steps say no more than their first and last few
            cut = len(its) > 2 * ITERATIONS_AT_EACH_END + 1
            shown = its[:ITERATIONS_AT_EACH_END] + its[-ITERATIONS_AT_EACH_END:] if cut else its
            for k, it in enumerate(shown):
                if cut and k == ITERATIONS_AT_EACH_END:
                    out.append(f"    ... {len(its) - len(shown)} more (--json lists every iteration)")
                out.append(_row(str(it["number"]), _opt(it["a_bytes"]), _opt(it["b_bytes"]),
                                "-" if it["delta"] is None else signed_bytes(it["delta"])))
        else:
            out.append("  iteration peaks  none found on either side")
        out.append("  code sites live at the peaks, largest change first")
        for s in d["sites"][:sites]:
            out.append(_row("", fmt_bytes(s["a_bytes"]), fmt_bytes(s["b_bytes"]), signed_bytes(s["delta"]))
                       + f"  {s['where']}")
            # a function name alone can stand for several functions (every module's
            # `forward`): its lines say which moved
            moved = [ln for ln in s["lines"] if ln["delta"] and ln["line"]]
            if len(s["lines"]) > 1:
                for ln in moved[:LINES_IN_TEXT]:
                    out.append(_row("", fmt_bytes(ln["a_bytes"]), fmt_bytes(ln["b_bytes"]), signed_bytes(ln["delta"]))
                               + f"    line {ln['line']}")
        rest = d["sites"][sites:]
        if rest:
            out.append(f"    ... {len(rest)} more sites, {signed_bytes(sum(s['delta'] for s in rest))} together "
                       f"(--json lists every site)")
    for note in doc["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


__all__ = ["compare_analyses", "compare_document", "compare_text", "device_json", "comparison_notes",
           "CompareJSON", "CompareDeviceJSON", "SiteJSON", "SITES_IN_TEXT"]
