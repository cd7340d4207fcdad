"""The report's comparison section (`vramscope report A --compare B -o DIR`).

The same comparison as `vramscope compare A B` (services/compare.py): Markdown for
report.md, escaped through `present.markup` like the rest of the report, and a PNG per
device of both timelines on one axis, drawn by the viewer's code
(`vramscope.viewer.compare_png.render_compare`), passed in as a callable as the report's
own timeline is.
"""
from __future__ import annotations

import os
from typing import Callable

from ..classifiers import Analysis
from ..classifiers.compare import Comparison, DeviceComparison
from ..common.units import fmt_bytes
from ..present.markup import md_code, md_text
from ..present.stacks import site_where
from ..present.words import comparison_headline, moment_text, peak_words, signed_bytes
from .compare import comparison_notes

# (analysis A, analysis B, the device's comparison, path) -> anything; writes the PNG
RenderComparePng = Callable[[Analysis, Analysis, DeviceComparison, str], object]


def write_compare_pngs(an_a: Analysis, an_b: Analysis, cmp: Comparison, out_dir: str,
                       render: RenderComparePng) -> dict[int, str]:
    """One PNG per compared device into `out_dir`: {device: file name}."""
    names: dict[int, str] = {}
    for dc in cmp.devices:
        name = "compare.png" if len(cmp.devices) == 1 else f"compare-device{dc.device}.png"
        render(an_a, an_b, dc, os.path.join(out_dir, name))
        names[dc.device] = name
    return names


def _opt(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def _when(side) -> str:
    pk = side.peak
    it = f" (iteration {pk.iteration})" if pk.iteration is not None else ""
    return f"{moment_text(pk.index, side.state_only)}{it}, {peak_words(pk.type, side.state_only)}"


def compare_markdown(cmp: Comparison, a_path: str, b_path: str, limits: dict, png_names: dict[int, str]) -> str:
    """The comparison section of report.md ('' for no comparison)."""
    a_name, b_name = os.path.basename(a_path), os.path.basename(b_path)
    L = [f"## Comparison: A = {md_code(a_name)}, B = {md_code(b_name)}", "",
         "Each side at its own peak; code sites are matched by path tail and function (the same code "
         "recorded from two checkouts matches).", ""]
    n_sites = max(3, 2 * limits.get("allocs", 10))
    for dc in cmp.devices:
        L += [f"### Device {dc.device}: A against B", ""]
        png = png_names.get(dc.device)
        if png:
            L += [f"![device {dc.device}: live memory of A and B, aligned at the first iteration]({png})", ""]
        L += [md_text(comparison_headline(dc)) + ".", ""]
        L += ["| | A | B | B - A |", "|---|---:|---:|---:|",
              f"| **Peak live** | **{fmt_bytes(dc.a.peak.bytes)}** | **{fmt_bytes(dc.b.peak.bytes)}** | "
              f"**{signed_bytes(dc.peak_delta)}** |"]
        ca, cb = dc.a.peak.by_category, dc.b.peak.by_category
        for cat, delta in sorted(dc.by_category_delta.items(), key=lambda kv: (-max(ca.get(kv[0], 0),
                                                                                    cb.get(kv[0], 0)), kv[0])):
            L.append(f"| {cat} | {fmt_bytes(ca.get(cat, 0))} | {fmt_bytes(cb.get(cat, 0))} | {signed_bytes(delta)} |")
        L += ["", f"- A peaks {_when(dc.a)}.", f"- B peaks {_when(dc.b)}.", ""]
        if dc.iterations:
            its = dc.iterations[:limits.get("iterations", 30)]
            L += ["| Iteration | Peak A | Peak B | B - A |", "|---:|---:|---:|---:|"]
            for it in its:
                L.append(f"| {it.number} | {_opt(it.a_bytes)} | {_opt(it.b_bytes)} | "
                         f"{'-' if it.delta is None else signed_bytes(it.delta)} |")
            if len(dc.iterations) > len(its):
                L.append(f"| ... | {len(dc.iterations) - len(its)} more (see analysis.json) | | |")
            L.append("")
        L += ["| Code site (live at the peaks) | A | B | B - A |", "|---|---:|---:|---:|"]
        for s in dc.sites[:n_sites]:
            L.append(f"| {md_code(site_where(s.file, s.function), in_table=True)} | {fmt_bytes(s.a_bytes)} | "
                     f"{fmt_bytes(s.b_bytes)} | {signed_bytes(s.delta)} |")
        rest = dc.sites[n_sites:]
        if rest:
            L.append(f"| ... {len(rest)} more sites (see analysis.json) | | | "
                     f"{signed_bytes(sum(s.delta for s in rest))} |")
        L.append("")
    for note in comparison_notes(cmp, a_path, b_path):
        L += [f"Note: {md_text(note)}", ""]
    return "\n".join(L)


__all__ = ["compare_markdown", "write_compare_pngs", "RenderComparePng"]
