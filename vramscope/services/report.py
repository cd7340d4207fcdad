"""`vramscope report FILE -o DIR`: Markdown + PNG timeline + JSON for a bug report.

Sized for an issue tracker: report.md at most 20 KB (lists are cut, with a note
saying so), timeline.png at most 300 KB, and analysis.json is the summary document
(`vramscope summary --json`, the same for the same file) plus the report's additions
(the user's notes, the 20 largest allocations at each peak, and what holds the memory at
each peak as a tree by code path: `peak_tree`, present/memtree.py's `tree_document`).
`redact_paths` keeps only file basenames everywhere (Markdown and JSON), for users who
must not leak their home or cluster layout.

The PNG is drawn by the viewer's code (Qt lives only there): the caller passes
`render_png(analysis, device, path, notes)`, e.g. `vramscope.viewer.report_png.render_timeline`;
without one the report has no image.

With `compare_with` (a second analysis, B: `vramscope report A --compare B`), report.md
ends with the comparison section, analysis.json gains `compare` (the `compare --json`
document) and `render_compare_png` draws both timelines (services/report_compare.py).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable

from .. import __version__
from ..classifiers import Analysis
from ..classifiers.memtree import memory_tree
from ..common.atomic import atomic_write
from ..parsers import Progress
from ..present.memtree import tree_document
from ..present.stacks import Stacks
from .annotations import Annotation, load_annotations
from .report_compare import RenderComparePng, compare_markdown, write_compare_pngs
from .report_markdown import MD_LIMIT, STACK_FRAMES, fit_markdown, markdown
from .report_whatif import lever_table, whatif_json
from .reporters import JsonReporter, MarkdownReporter
from .summary import summary_document

PNG_LIMIT = 300_000
LARGEST_IN_JSON = 20

RenderPng = Callable[[Analysis, int, str, list], object]
REPORT_MD: MarkdownReporter[str] = MarkdownReporter(str)    # report.md: the Markdown fit_markdown made
ANALYSIS_JSON = JsonReporter()                              # analysis.json: the summary document, added to

# a path: at least one separator and a file-ish last part (an extension), or an absolute path
_PATH_RE = re.compile(r"(?:[A-Za-z]:)?(?:[\\/]|\b)(?:[\w.@+~-]+[\\/])+([\w@+~-][\w.@+~-]*)")


def redact(text: str) -> str:
    """Keep basenames of paths: '/home/me/proj/train.py(12): f' -> 'train.py(12): f'.
    Unit ratios such as 'MiB/iteration' are not paths (no extension, not absolute)."""
    def sub(m):
        whole, base = m.group(0), m.group(1)
        if whole.startswith(("/", "\\", "~")) or re.match(r"[A-Za-z]:", whole) or "." in base:
            return base
        return whole
    return _PATH_RE.sub(sub, text)


def _redact_obj(obj):
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: _redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_redact_obj(v) for v in obj]
    return obj


def _notes(annotations, snap_path: str, redact_paths: bool) -> tuple[list[Annotation], list[str]]:
    """The notes from a store, a list, or (None) the snapshot's sidecar."""
    warnings: list[str] = []
    if annotations is None:
        try:
            annotations, _, warnings = load_annotations(snap_path)
        except Exception as e:       # a report never fails because of the notes
            annotations, warnings = [], [f"annotations not read: {e}"]
    notes = list(annotations)
    if redact_paths:
        notes = [dataclasses.replace(a, note=redact(a.note)) for a in notes]
    return notes, list(warnings)


def _note_dict(a: Annotation) -> dict:
    return {**a.to_dict(), "where": a.where()}


def write_report(analysis: Analysis, out_dir: str, device: int | None = None, redact_paths: bool = False,
                 annotations=None, render_png: RenderPng | None = None, compare_with: Analysis | None = None,
                 render_compare_png: RenderComparePng | None = None, progress: Progress | None = None) -> list[str]:
    """Write report.md, analysis.json and (with `render_png`) one timeline PNG per device
    into `out_dir` (created when missing), each atomically; returns the written paths,
    report.md and analysis.json first. Raises OSError when the folder cannot be written,
    CompareError (before writing anything) when `compare_with` cannot be compared, and
    `Cancelled` when `progress` is cancelled (checked before each file is written)."""
    from .compare import compare_analyses, compare_document
    cmp = compare_analyses(analysis, compare_with, device) if compare_with is not None else None
    os.makedirs(out_dir, exist_ok=True)
    snap = analysis.snapshot
    devs = [d for d in analysis.device_order() if device is None or d == device]
    notes, note_warnings = _notes(annotations, snap.path, redact_paths)
    note_dicts = [_note_dict(a) for a in notes]
    stacks = Stacks(analysis, redact_paths=redact_paths)

    pngs: list[str] = []
    png_names: dict[int, str] = {}
    if render_png is not None:
        for dev in devs:
            name = "timeline.png" if len(devs) == 1 else f"timeline-device{dev}.png"
            p = os.path.join(out_dir, name)
            render_png(analysis, dev, p, [a for a in notes if a.device in (None, dev)])
            png_names[dev] = name
            pngs.append(p)

    cmp_pngs: dict[int, str] = {}
    if cmp is not None and compare_with is not None and render_compare_png is not None:
        cmp_pngs = write_compare_pngs(analysis, compare_with, cmp, out_dir, render_compare_png)
        pngs += [os.path.join(out_dir, n) for n in cmp_pngs.values()]

    whatif = {dev: lever_table(analysis, dev) for dev in devs}     # once per device, for both documents
    md = fit_markdown(lambda limits: markdown(analysis, devs, stacks, note_dicts, note_warnings, limits, png_names,
                                              __version__, whatif)
                      + (compare_markdown(cmp, snap.path, compare_with.snapshot.path, limits, cmp_pngs)
                         if cmp is not None and compare_with is not None else ""))
    if redact_paths:
        md = redact(md)
    md_path = os.path.join(out_dir, "report.md")
    if progress is not None:
        progress.check()
    atomic_write(md_path, lambda fh: REPORT_MD.render(md, fh))

    base = summary_document(analysis, device, stacks)

    def largest_at_peak(d) -> list[dict]:
        da = analysis.devices[d["device"]]
        return [{"size": a.size, "category": a.category, "rule": a.rule, "alloc_index": a.alloc_index,
                 "free_index": a.free_index, "addr": a.addr, "where": stacks.where_of(a),
                 "stack": stacks.short(a.stack, STACK_FRAMES, a.forward_stack)}
                for a in da.largest_live(d["peak"]["index"], LARGEST_IN_JSON)]
    # the summary document, added to and never changed
    doc: dict[str, Any] = {**base, "devices": [{**d, "largest_at_peak": largest_at_peak(d),
                                                "peak_tree": tree_document(memory_tree(analysis.devices[d["device"]],
                                                                                       d["peak"]["index"]), stacks),
                                                "whatif": whatif_json(whatif[d["device"]])} for d in base["devices"]],
                           "annotations": note_dicts}
    if note_warnings:
        doc["annotation_warnings"] = note_warnings
    if cmp is not None and compare_with is not None:
        doc["compare"] = compare_document(cmp, snap.path, compare_with.snapshot.path)
    if redact_paths:
        doc = _redact_obj(doc)
        doc["file"] = os.path.basename(snap.path)
        if "compare" in doc:
            doc["compare"].update(a=os.path.basename(doc["compare"]["a"]), b=os.path.basename(doc["compare"]["b"]))
    js_path = os.path.join(out_dir, "analysis.json")
    if progress is not None:
        progress.check()
    atomic_write(js_path, lambda fh: ANALYSIS_JSON.render(doc, fh))
    return [md_path, js_path] + pngs


__all__ = ["write_report", "redact", "MD_LIMIT", "PNG_LIMIT", "RenderPng"]
