"""The report's Markdown: the analysis told for an issue tracker.

Everything quoted from the snapshot or the user (file and frame names, the allocator
config, notes) goes through `present.markup`: code spans sized to their content, no raw
HTML, no line break that could start a block. Numbers and words come from the same
typed results and presentation layer as `vramscope summary` and the viewer.
"""
from __future__ import annotations

import os
from datetime import datetime, timezone

from ..classifiers import CATEGORIES, Analysis
from ..classifiers.memtree import memory_tree
from ..classifiers.ooms import expandable_segments_on
from ..common.jsonio import safe_text
from ..common.units import fmt_bytes
from ..present.markup import md_code, md_text
from ..present.memtree import guess_words, tree_lines
from ..present.stacks import Stacks
from ..present.words import (
    EVIDENCE_WORDS,
    LEAK_CAUSE_WORDS,
    advice_text,
    before_trace_text,
    category_evidence_note,
    device_free_text,
    guess_note,
    host_space_words,
    autocast_copies_text,
    iterations_note,
    leaks_none_text,
    moment_text,
    models_text,
    run_words,
    oom_diagnosis,
    oom_need_text,
    peak_words,
    skipped_words,
    stale_gradients_text,
    torch_tag_words,
)
from .report_whatif import LeverTable, whatif_section


def iterations_note_md(iterations) -> str:
    """' (a guess: ...)' after a count of iterations where how they were found makes it one."""
    note = iterations_note(it.source for it in iterations)
    return f" ({md_text(note)})" if note else ""


MD_LIMIT = 20_000
STACK_FRAMES = 4
DEFAULT_LIMITS = {"allocs": 10, "frames": STACK_FRAMES, "leaks": 10, "ooms": 5, "annotations": 50, "note": 500,
                  "iterations": 30, "whatif": 1, "tree": 15}
# each step gives up some detail until the report fits MD_LIMIT
SHRINK_STEPS: tuple[dict[str, int], ...] = ({}, {"note": 200}, {"annotations": 20, "allocs": 8, "iterations": 12}, {"frames": 3, "leaks": 5},
                {"allocs": 5, "annotations": 10, "note": 120, "ooms": 3, "iterations": 6, "tree": 8},
                {"allocs": 3, "leaks": 3, "ooms": 2, "annotations": 5, "note": 80, "iterations": 3, "whatif": 0,
                 "tree": 4})


def largest_groups(da, index: int, k: int = 10) -> list[list[int]]:
    """The allocations live right after `index`, grouped by (category, stack, size) -- ten
    identical 172 MiB activations of one layer say more as one line -- and by module where
    torch's component tracking names it (one line of a Linear runs in every layer), the `k`
    groups with the most bytes, each a list of rows (biggest group first)."""
    import numpy as np

    from ..classifiers.compare import row_modules
    a = da.allocs
    live = np.flatnonzero(da.live_mask(index))
    if not len(live):
        return []
    order = live[np.argsort(-a.size[live], kind="stable")]
    mods = row_modules(da, order).tolist()
    groups: dict = {}
    for r, m in zip(order.tolist(), mods):
        groups.setdefault((int(da.category[r]), int(a.stack[r]), int(a.size[r]), m), []).append(r)
    ordered = sorted(groups.values(), key=lambda rows: (-int(a.size[rows[0]]) * len(rows), rows[0]))
    return ordered[:k]


def markdown(an: Analysis, devs: list[int], stacks: Stacks, notes: list[dict], note_warnings: list[str],
             limits: dict, png_names: dict[int, str], version: str, whatif: dict[int, LeverTable]) -> str:
    snap = an.snapshot
    name = os.path.basename(snap.path)
    L = [f"# vramscope report: {md_code(name)}", ""]
    try:
        size = fmt_bytes(os.path.getsize(snap.path)) + " "
    except OSError:
        size = ""
    L.append(f"Snapshot {size}({snap.layout or 'dict'} layout), devices "
             f"{', '.join(map(str, devs)) or 'none'}; report by vramscope {version}, "
             f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.")
    if snap.layout == "profiler":
        L.append("Converted from a torch profiler trace: no allocator segments, so reserved memory and "
                 "fragmentation are unknown.")
    settings = snap.allocator_settings if isinstance(snap.allocator_settings, dict) else None
    if settings:
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF") or ""
        L.append(f"Allocator: {md_code('PYTORCH_CUDA_ALLOC_CONF=' + str(conf))}, expandable segments "
                 f"{'on' if expandable_segments_on(settings) else 'off'}.")
    L.append("")
    if len(devs) > 1:
        L += _device_overview(an, devs)
    for dev in devs:
        L += _device_section(an, dev, stacks, limits, png_names.get(dev), whatif[dev])
    L += _host_section(an)
    L += _notes_section(notes, note_warnings, limits)
    return "\n".join(L)


def peak_tree_section(da, stacks: Stacks, max_lines: int) -> list[str]:
    """What holds the memory at the peak: the heaviest code paths (classifiers/memtree.py)."""
    if max_lines <= 0 or da.peak.bytes <= 0:
        return []
    lines = tree_lines(memory_tree(da, da.peak.index), stacks, max_lines)
    if not lines:
        return []
    L = ["### What holds the memory at the peak", "",
         "Live bytes by code path, your code outermost, down to the op that allocated: the heaviest "
         "paths, each at least 2% of the peak.", ""]
    for ln in lines:
        guess = guess_words(ln.bytes, ln.guess_bytes)
        L.append(f"{'  ' * ln.depth}- **{fmt_bytes(ln.bytes)}** ({ln.share:.1%}) {ln.category}"
                 f"{', ' + guess if guess else ''}: " + " › ".join(md_code(t) for t in ln.labels))
    return L + [""]


def _host_section(an: Analysis) -> list[str]:
    h = an.host
    if h is None:
        return []
    when = "at the start of its trace" if h.peak_index < 0 else f"at host entry {h.peak_index:,}"
    res = fmt_bytes(h.reserved_peak_bytes) if h.reserved_peak_bytes is not None else "unknown"
    return ["## Pinned host memory", "",
            f"Recorded with `record_pinned_host_memory=True`: {host_space_words()}.", "",
            "| | |", "|---|---|",
            f"| Trace entries | {h.entries:,} |",
            f"| Allocations | {h.allocations:,} |",
            f"| Peak live | **{fmt_bytes(h.peak_bytes)}** {when} |",
            f"| Live at start / end | {fmt_bytes(h.start_live_bytes)} / {fmt_bytes(h.end_live_bytes)} |",
            f"| Reserved peak | {res} (pinned blocks held, cached ones included) |", ""]


def _device_overview(an: Analysis, devs: list[int]) -> list[str]:
    first = an.primary_device()
    L = ["## Devices", "", "| Device | Peak live | Reserved peak | OOMs |", "|---|---:|---:|---:|"]
    for dev in devs:
        da = an.devices[dev]
        res = fmt_bytes(da.live.reserved_peak) if da.live.reserved_peak is not None else "unknown"
        mark = " (look here first)" if dev == first else ""
        L.append(f"| cuda:{dev}{mark} | {fmt_bytes(da.peak.bytes)} | {res} | {len(da.ooms)} |")
    return L + [""]


def _device_section(an: Analysis, dev: int, stacks: Stacks, limits: dict, png: str | None,
                    whatif: LeverTable) -> list[str]:
    da = an.devices[dev]
    s = da.summary()
    pk = s.peak
    L = [f"## Device {dev}", ""]
    if png:
        L += [f"![device {dev}: live memory by category]({png})", ""]
    state_only = da.state_only
    when = moment_text(pk.index, state_only)
    if pk.iteration is not None:
        when += f" (iteration {pk.iteration})"
    before = f" ({s.allocations_before_trace:,} live {before_trace_text(state_only)})" \
        if s.allocations_before_trace else ""
    L += ["| | |", "|---|---|",
          *([f"| Run | {md_text(run_words(da.run.to_json()))} |"] if run_words(da.run.to_json()) else []),
          f"| Trace entries | {s.entries:,} |",
          f"| Allocations | {s.allocations:,}{before} |",
          f"| Peak live | **{fmt_bytes(pk.bytes)}** {when}, {peak_words(pk.type, state_only)} ({md_code(pk.type)}) |",
          f"| Live at start / end | {fmt_bytes(s.start_live_bytes)} / {fmt_bytes(s.end_live_bytes)} |",
          f"| Reserved peak | {fmt_bytes(s.reserved_peak_bytes) if s.reserved_peak_bytes is not None else 'unknown'}"
          f"{f' ({md_text(s.reserved_unknown)})' if s.reserved_peak_bytes is None and s.reserved_unknown else ''} |",
          *([f"| Not recorded | {', '.join(s.skipped_actions)} (skip_actions): {skipped_words(s.skipped_actions)} |"]
            if s.skipped_actions else []),
          f"| Iterations | {len(s.iterations)}{iterations_note_md(s.iterations)} |",
          f"| Leaks | {len(s.leaks) or leaks_none_text(da.run)} |",
          f"| OOMs | {len(s.ooms) or 'none'} |", ""]

    total = sum(pk.by_category.values()) or 1
    L += ["### Live memory at the peak, by category", "",
          "| Category | Bytes | Share | How sure |", "|---|---:|---:|---|"]
    for c, b in sorted(pk.by_category.items(), key=lambda kv: -kv[1]):
        per = pk.by_category_evidence.get(c, {})
        sure = ", ".join(f"{EVIDENCE_WORDS.get(e, e)} {fmt_bytes(v)}" for e, v in per.items()) if len(per) > 1 \
            else EVIDENCE_WORDS.get(next(iter(per), ""), "")
        if c == "weights" and da.run.autocast_copy_bytes:
            sure += f" ({autocast_copies_text(da.run.autocast_copy_bytes)})"
        L.append(f"| {c} | {fmt_bytes(b)} | {b / total:.1%} | {sure} |")
    L.append("")
    note = guess_note(pk.by_evidence, str(da.run.recorded.value), da.run.frames)
    if note:
        L += [md_text(note), ""]
    if pk.advice:
        L.append("Worth trying, by what each would save at the peak (estimates; see What would fit):")
        L.append("")
        L += [f"- {advice_text(a, moment='at the peak')}" for a in pk.advice]
        L.append("")

    if s.iterations:
        L += ["### Iterations", "", "| # | Entries | Peak | Type |", "|---:|---|---:|---|"]
        for it in s.iterations[:limits["iterations"]]:
            L.append(f"| {it.number} | {it.start_index:,}-{it.end_index:,} | {fmt_bytes(it.peak_bytes)} | "
                     f"{peak_words(it.peak_type)} |")
        if len(s.iterations) > limits["iterations"]:
            L.append(f"| ... | {len(s.iterations) - limits['iterations']} more (see analysis.json) | | |")
        L.append("")

    L += peak_tree_section(da, stacks, limits["tree"])

    groups = largest_groups(da, pk.index, limits["allocs"])
    if groups:
        L += ["### Largest allocations live at the peak", "",
              "Grouped when they share category, stack and size; stacks show your code first.", ""]
        for k, rows in enumerate(groups, 1):
            a0 = da.allocation(rows[0])
            allocs = [da.allocation(r) for r in rows] if len(rows) > 1 else [a0]
            ai = [a.alloc_index for a in allocs]
            fi = [a.free_index for a in allocs]
            if len(rows) == 1:
                born = f"live {before_trace_text(state_only)}" if ai[0] < 0 else f"allocated at entry {ai[0]:,}"
                if ai[0] < 0 and fi[0] >= 0 and da.frees_record_their_own_stack():
                    born += " (the stack is where it was freed)"
                dies = "never freed" if fi[0] < 0 else f"freed at entry {fi[0]:,}"
                size = f"**{fmt_bytes(a0.size)}**"
            else:
                born = (f"allocated at entries {min(ai):,}-{max(ai):,}" if min(ai) >= 0
                        else f"some live {before_trace_text(state_only)}")
                dies = "never freed" if max(fi) < 0 else ("some freed later" if min(fi) < 0 else "freed later")
                size = f"**{fmt_bytes(a0.size * len(rows))}** ({len(rows)} x {fmt_bytes(a0.size)})"
            sure = "" if a0.evidence in ("stack", "torch") else f", {EVIDENCE_WORDS.get(a0.evidence, a0.evidence)}"
            tag = torch_tag_words(a0.torch_tag, a0.rules_category)
            L.append(f"{k}. {size} {a0.category} (rule {md_code(a0.rule)}{sure}{', ' + md_text(tag) if tag else ''}), "
                     f"{born}, {dies}" + (f", in module {md_code(a0.module)}" if a0.module else ""))
            for fr in stacks.short(a0.stack, limits["frames"], a0.forward_stack):
                L.append(f"    - {md_code(fr)}")
            for kind, text in a0.metadata[:3]:
                if not (kind == "metadata" and text == a0.module):      # the module, said above
                    L.append(f"    - {kind}: {md_code(text[:200])}")
        L.append("")

    if s.stale_gradients is not None:
        sg = s.stale_gradients
        L += ["### Stale gradients", "", stale_gradients_text(sg) + "."]
        if sg.freed_last >= 0:
            L.append(f"Freed at entries {sg.freed_first:,}-{sg.freed_last:,} from {md_code(stacks.where(sg.free_stack))}.")
        L.append("")

    models = models_text(da.run)
    if models:
        L += ["### Models alive", "", models[:1].upper() + models[1:] + ".", ""]
    L += ["### Leaks", ""]
    if not s.leaks:
        L.append("None found (live memory does not grow from iteration to iteration)." if da.run.recorded.value == "trace"
                 else leaks_none_text(da.run)[:1].upper() + leaks_none_text(da.run)[1:] + ".")
    for lk in s.leaks[:limits["leaks"]]:
        cats = ", ".join(f"{c} {fmt_bytes(b)}" for c, b in sorted(lk.by_category.items(), key=lambda kv: -kv[1]))
        L.append(f"- **{fmt_bytes(lk.bytes_per_iteration)}/iteration** kept at {md_code(stacks.site(lk.site, lk.stack))}"
                 f" in iterations {', '.join(map(str, lk.iterations))} ({cats} in all, {lk.count:,} allocations): "
                 f"{LEAK_CAUSE_WORDS.get(lk.cause, lk.cause)}.")
        for fr in stacks.short(lk.stack, limits["frames"]):
            L.append(f"    - {md_code(fr)}")
    if len(s.leaks) > limits["leaks"]:
        L.append(f"- ... and {len(s.leaks) - limits['leaks']} more (see analysis.json)")
    L.append("")

    if s.ooms:
        L += ["### Out of memory", ""]
    for k, o in enumerate(s.ooms[:limits["ooms"]], 1):
        frag = fmt_bytes(o.fragmentation_bytes) if o.fragmentation_bytes is not None else "unknown"
        L.append(f"**OOM {k}** at entry {o.index:,}: requested **{fmt_bytes(o.requested)}**, "
                 f"{device_free_text(o.requested, o.device_free)}, allocated {fmt_bytes(o.allocated)}, reserved "
                 f"{fmt_bytes(o.reserved) if o.reserved is not None else 'unknown'}, reserved but unallocated {frag}.")
        L.append("")
        # what is a guess there (the analysis' guessed bytes at the OOM): said beside its bytes
        g = da.guessed_by_category([o.index])
        guessed = {c: int(v) for c, v in zip(CATEGORIES, g[0]) if v} if g is not None else {}
        if o.by_category:
            L += ["| Category | Live at the OOM | How sure |", "|---|---:|---|"]
            for c, b in sorted(o.by_category.items(), key=lambda kv: -kv[1]):
                g_c = min(guessed.get(c, 0), b)
                sure = category_evidence_note({"guess": g_c, "stack": b - g_c}) or "recorded"
                L.append(f"| {c} | {fmt_bytes(b)} | {sure} |")
            L.append("")
        # our own words (no text from the snapshot): no escaping needed
        L.append(f"- **Diagnosis**: {oom_diagnosis(o, guessed)}")
        if da.run.truncated_by_oom.value:
            L.append(f"- **Needed**: {oom_need_text(o)}")
        if o.advice:
            L.append(f"- **Next step**: {advice_text(o.advice[0], o)}")
            for a in o.advice[1:]:
                L.append(f"- Also: {advice_text(a, o)}")
        st = stacks.short(o.stack, limits["frames"])
        if st:
            L.append("- Requested from:")
            L += [f"    - {md_code(fr)}" for fr in st]
        L.append("")
    if len(s.ooms) > limits["ooms"]:
        L += [f"... and {len(s.ooms) - limits['ooms']} more OOMs (see analysis.json)", ""]
    if limits["whatif"]:
        L += whatif_section(whatif)
    return L


def _notes_section(notes: list[dict], warnings: list[str], limits: dict) -> list[str]:
    L = ["## Annotations", ""]
    if not notes:
        L.append("None.")
    else:
        L += ["| # | Where | Note |", "|---|---|---|"]
        for k, d in enumerate(notes[:limits["annotations"]], 1):
            note = str(d.get("note", ""))
            if len(note) > limits["note"]:
                note = note[:limits["note"]] + "..."
            L.append(f"| {k} | {md_text(d.get('where', d.get('kind', '')))} | {md_text(note)} |")
        if len(notes) > limits["annotations"]:
            L += ["", f"... and {len(notes) - limits['annotations']} more annotations (see analysis.json)"]
    for w in warnings:
        L += ["", f"Note: {md_text(w)}"]
    L.append("")
    return L


def fit_markdown(build) -> str:
    """`build(limits)` with less and less detail until it fits MD_LIMIT bytes, then cut."""
    limits = dict(DEFAULT_LIMITS)
    text = ""
    for shrink in SHRINK_STEPS:
        limits.update(shrink)
        text = safe_text(build(limits))         # lone surrogates from a snapshot as \udXXXX
        if len(text.encode()) <= MD_LIMIT:
            return text
    cut = "\n\n... (report truncated to stay under 20 KB; analysis.json has everything)\n"
    data = text.encode()[:MD_LIMIT - len(cut.encode()) - 4].decode("utf-8", "ignore")
    return data[:data.rfind("\n")] + cut


__all__ = ["markdown", "fit_markdown", "largest_groups", "MD_LIMIT", "STACK_FRAMES"]
