"""`vramscope report FILE -o DIR`: Markdown + PNG timeline + JSON for a bug report.

Sized for an issue tracker: report.md at most 20 KB (lists are cut, with a note
saying so), timeline.png at most 300 KB, analysis.json is `summary_dict` plus the
annotations. `redact_paths` keeps only file basenames everywhere (Markdown and
JSON), for users who must not leak their home or cluster layout.

The PNG is rendered offscreen with pyqtgraph (no display needed): the live
memory stacked by category, drawn from a per-pixel envelope (DESIGN.md §7:
each pixel column shows the moment of highest live memory inside it, so a
peak can never fall between two pixels), with the peak, the OOMs and the
user's annotations marked.
"""
from __future__ import annotations

import os
import re
from datetime import datetime, timezone

import numpy as np
import orjson

from .common.atomic import atomic_write

MD_LIMIT = 20_000
PNG_LIMIT = 300_000
STACK_FRAMES = 4

# The viewer's palette (viewer/theme.py), copied so a report needs nothing from the viewer.
CATEGORY_COLORS = {
    "weights": "#4E79A7", "quantization": "#9C755F", "optimizer": "#B07AA1", "gradients": "#F28E2B",
    "inputs": "#EDC948", "activations": "#59A14F", "autograd": "#76B7B2", "temporary": "#FF9DA7",
    "unknown": "#A0A0A0",
}
# bottom to top: what stays for the whole run first, scratch last
STACK_ORDER = ("weights", "quantization", "optimizer", "gradients", "inputs", "activations", "autograd",
               "temporary", "unknown")
PEAK_COLOR, OOM_COLOR, ANNOTATION_COLOR = "#D62728", "#D62728", "#4E79A7"

SUGGESTIONS = {
    "fragmentation": "set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so freed blocks can be reused "
                     "for bigger requests",
    "fragmentation_expandable": "expandable segments are already on: lower peak usage instead (smaller "
                                "micro-batch with gradient accumulation, gradient checkpointing)",
    "activations": "use gradient checkpointing, or a smaller micro-batch with gradient accumulation",
    "weights": "load the weights in 4-bit/8-bit (bitsandbytes, torchao) or train LoRA adapters on a frozen, "
               "quantized base",
    "quantization": "check dequantization scratch: a smaller micro-batch, or a kernel that dequantizes in tiles",
    "optimizer": "use an 8-bit or paged optimizer (bitsandbytes AdamW8bit / PagedAdamW), or fewer trainable "
                 "parameters (LoRA)",
    "gradients": "train fewer parameters (LoRA), or free gradients earlier (`zero_grad(set_to_none=True)`)",
    "autograd": "use a smaller micro-batch with gradient accumulation, or gradient checkpointing",
    "temporary": "use a smaller micro-batch; look for large temporaries in the OOM's stack",
    "inputs": "use a smaller batch or shorter sequences, with gradient accumulation",
    "unknown": "use a smaller micro-batch with gradient accumulation, then gradient checkpointing",
}


# -- formatting ---------------------------------------------------------------------

from .common.units import fmt_bytes  # noqa: E402


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


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


# -- stacks --------------------------------------------------------------------------

_PROFILER_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<name>.*)$")
_LIBRARY = ("site-packages", "dist-packages", "/lib/python", "\\lib\\python", "<frozen", "/torch/", "\\torch\\")


_PLUMBING = {"_call_impl", "_wrapped_call_impl", "apply", "decorate_context", "wrapper", "inner"}


def _frame_parts(filename: str, line: int, name: str) -> tuple[str, int, str, bool]:
    """(file, line, function, is_user_code)."""
    if filename in ("none", "") and line == 0:           # profiler-converted: 'path/file.py(12): f'
        m = _PROFILER_FRAME.match(name)
        if m:
            filename, line, name = m.group("file"), int(m.group("line")), m.group("name")
        else:
            return filename, 0, name, False                 # '<built-in method ...>', 'nn.Module: X'
    if filename in ("??", "") or line == 0 or not filename.endswith(".py"):
        return filename, line, name, False                  # C++ frames
    return filename, line, name, not any(s in filename for s in _LIBRARY)


def short_stack(snap, sid: int, n: int = STACK_FRAMES, redact_paths: bool = False) -> list[str]:
    """A few frames, the user's own code first (innermost first), then the innermost
    library frames that were the actual caller of the allocator."""
    if sid is None or sid < 0:
        return []
    frames = [_frame_parts(*f) for f in snap.stack_frames_list(int(sid))]
    user = [f for f in frames if f[3]]
    if len(user) > 1:          # the script's top level says nothing when there is more
        user = [f for f in user if f[2] != "<module>"] or user
    lib = [f for f in frames if not f[3] and not (f[0] in ("??", "") and f[1] == 0 and not f[2])]
    lib_py = [f for f in lib if f[0].endswith(".py")] or lib
    # nn.Module / autograd.Function dispatch frames repeat on every stack and say nothing
    lib_py = [f for f in lib_py if f[2] not in _PLUMBING] or lib_py
    chosen = user[:max(1, n - 1)] if user else []
    chosen += lib_py[:n - len(chosen)]
    out = []
    for file, line, name, is_user in chosen:
        file = os.path.basename(file) if redact_paths else _tidy_path(file)
        loc = f"{file}:{line}" if line else file
        out.append(f"{loc} {name}".strip() if loc not in ("none", "") else name)
    return out


def _tidy_path(path: str) -> str:
    """Library paths are long and say little: keep them from the package on."""
    for marker in ("site-packages/", "dist-packages/"):
        k = path.find(marker)
        if k >= 0:
            return path[k + len(marker):]
    return path


# -- figures ---------------------------------------------------------------------------

def _frees_have_own_frames(da) -> bool:
    """Whether free entries carry the stack of the free, not of the allocation (torch's
    CUDA traces by default): then a block allocated before the trace and freed in it only
    has the stack of its free."""
    tl = getattr(da, "timeline", None)
    return tl is not None and not tl.frees_carry_alloc_frames


def _cat_names():
    from .classifiers import CATEGORIES
    return CATEGORIES


def largest_groups(da, index: int, k: int = 10) -> list[list[int]]:
    """The allocations live right after `index`, grouped by (category, stack, size) -- ten
    identical 172 MiB activations of one layer say more as one line -- the `k` groups
    with the most bytes, each a list of rows (biggest group first)."""
    a = da.allocs
    live = np.flatnonzero((a.alloc_index <= index) & ((a.free_index < 0) | (a.free_index > index)))
    if not len(live):
        return []
    groups = {}
    for r in live[np.argsort(-a.size[live], kind="stable")].tolist():
        groups.setdefault((int(da.category[r]), int(a.stack[r]), int(a.size[r])), []).append(r)
    ordered = sorted(groups.values(), key=lambda rows: (-int(a.size[rows[0]]) * len(rows), rows[0]))
    return ordered[:k]


def largest_at(da, index: int, k: int = 10) -> list[int]:
    """Rows of the `k` largest allocations live right after entry `index` (-1: at the start)."""
    a = da.allocs
    live = np.flatnonzero((a.alloc_index <= index) & ((a.free_index < 0) | (a.free_index > index)))
    if not len(live):
        return []
    top = live[np.argsort(-a.size[live], kind="stable")[:k]]
    return top.tolist()


def _oom_figures(an, dev, oom: dict) -> dict:
    """Live, reserved, fragmentation and the suggested next step at one OOM (DESIGN.md §5),
    taking the classifier's figures where it has them."""
    da = an.devices[dev]
    i = int(oom.get("index", -1))
    lm = da.live
    live = oom.get("allocated", oom.get("live_bytes"))
    if live is None:
        live = lm.live_before(i + 1) if i >= 0 else lm.start_bytes
    reserved = oom.get("reserved", oom.get("reserved_bytes"))
    if reserved is None and lm.reserved_after is not None and i >= 0:
        reserved = int(lm.reserved_after[i])
    frag = oom.get("fragmentation_bytes")
    if frag is None and reserved is not None:
        frag = max(0, int(reserved) - int(live))
    by_cat = oom.get("by_category") or {}
    requested = int(oom.get("requested", 0))
    settings = an.snapshot.allocator_settings or {}
    expandable = bool(settings.get("expandable_segments")) or "expandable_segments:True" in str(
        settings.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    top_cat = max(by_cat.items(), key=lambda kv: kv[1])[0] if by_cat else "unknown"
    if frag is not None and frag >= requested > 0:
        key = "fragmentation_expandable" if expandable else "fragmentation"
        diagnosis = (f"{fmt_bytes(frag)} was reserved by PyTorch but not allocated, more than the "
                     f"{fmt_bytes(requested)} requested: the cache is fragmented (no free block is big enough).")
    else:
        key = top_cat if top_cat in SUGGESTIONS else "unknown"
        share = (by_cat.get(top_cat, 0) / live) if live else 0
        diagnosis = (f"Live tensors fill the device: {fmt_bytes(live)} allocated, the largest share "
                     f"{top_cat} ({share:.0%}); reserved-but-free memory "
                     f"({fmt_bytes(frag) if frag is not None else 'unknown'}) could not have held the request.")
    return {
        "index": i, "requested": requested, "device_free": oom.get("device_free"),
        "live": int(live), "reserved": reserved, "fragmentation": frag, "by_category": by_cat,
        "expandable_segments": expandable,
        "diagnosis": oom.get("diagnosis") or diagnosis,
        "suggestion": oom.get("suggestion") or SUGGESTIONS[key],
    }


def _annotation_dicts(annotations, snap_path: str):
    """Annotation objects/dicts from a store, a list, or (None) the snapshot's sidecar."""
    warnings = []
    if annotations is None:
        from .annotations import load_annotations
        try:
            annotations, _, warnings = load_annotations(snap_path)
        except Exception as e:       # a report never fails because of the notes
            annotations, warnings = [], [f"annotations not read: {e}"]
    out = []
    for a in annotations:
        d = a.to_dict() if hasattr(a, "to_dict") else dict(a)
        if "where" not in d and hasattr(a, "where"):
            d["where"] = a.where()
        out.append(d)
    return out, warnings


# -- Markdown ---------------------------------------------------------------------------

def _markdown(an, devs, anns, ann_warnings, redact_paths, limits, png_name) -> str:
    snap = an.snapshot
    cats = _cat_names()
    name = os.path.basename(snap.path)
    L = [f"# vramscope report: `{name}`", ""]
    try:
        size = os.path.getsize(snap.path)
    except OSError:
        size = None
    from . import __version__
    L.append(f"Snapshot {fmt_bytes(size) if size is not None else ''} ({snap.layout or 'dict'} layout), "
             f"devices {', '.join(map(str, devs)) or 'none'}; report by vramscope {__version__}, "
             f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.")
    if snap.layout == "profiler":
        L.append("Converted from a torch profiler trace: no allocator segments, so reserved memory and "
                 "fragmentation are unknown.")
    if snap.allocator_settings:
        conf = snap.allocator_settings.get("PYTORCH_CUDA_ALLOC_CONF")
        exp = snap.allocator_settings.get("expandable_segments")
        L.append(f"Allocator: `PYTORCH_CUDA_ALLOC_CONF={conf or ''}`, expandable_segments={exp}.")
    L.append("")
    if png_name:
        L += [f"![live memory by category]({png_name})", ""]
    for dev in devs:
        da = an.devices[dev]
        lm = da.live
        pk = da.peak or {}
        n = lm.n_events
        L.append(f"## Device {dev}")
        L.append("")
        L.append("| | |")
        L.append("|---|---|")
        L.append(f"| Trace entries | {n:,} |")
        L.append(f"| Allocations | {len(da.allocs):,} |")
        pidx = pk.get("index", lm.peak_index)
        when = "at the start of the trace" if pidx is None or pidx < 0 else f"at entry {pidx:,}"
        L.append(f"| Peak live | **{fmt_bytes(pk.get('bytes', lm.peak_bytes))}** {when}, type "
                 f"`{pk.get('type', 'other')}` |")
        L.append(f"| Live at start / end | {fmt_bytes(lm.start_bytes)} / {fmt_bytes(lm.end_bytes)} |")
        L.append(f"| Reserved peak | {fmt_bytes(lm.reserved_peak) if lm.reserved_peak is not None else 'unknown'} |")
        L.append(f"| Iterations | {len(da.iterations or [])} |")
        L.append(f"| Leaks | {len(da.leaks or []) or 'none found'} |")
        L.append(f"| OOMs | {len(da.ooms or []) or 'none'} |")
        L.append("")

        by_cat = pk.get("by_category") or {}
        total = sum(by_cat.values()) or 1
        L.append("### Live memory at the peak, by category")
        L.append("")
        L.append("| Category | Bytes | Share |")
        L.append("|---|---:|---:|")
        for c, b in sorted(by_cat.items(), key=lambda kv: -kv[1]):
            L.append(f"| {c} | {fmt_bytes(b)} | {b / total:.1%} |")
        L.append("")

        groups = largest_groups(da, pidx if pidx is not None else -1, limits["allocs"])
        if groups:
            a = da.allocs
            L.append("### Largest allocations live at the peak")
            L.append("")
            L.append("Grouped when they share category, stack and size; stacks show your code first.")
            L.append("")
            for k, rows in enumerate(groups, 1):
                r = rows[0]
                ai = [int(a.alloc_index[x]) for x in rows]
                fi = [int(a.free_index[x]) for x in rows]
                if len(rows) == 1:
                    born = "live before the trace began" if ai[0] < 0 else f"allocated at entry {ai[0]:,}"
                    if ai[0] < 0 and fi[0] >= 0 and _frees_have_own_frames(da):
                        born += " (the stack is where it was freed)"
                    dies = "never freed" if fi[0] < 0 else f"freed at entry {fi[0]:,}"
                    size = f"**{fmt_bytes(a.size[r])}**"
                else:
                    born = (f"allocated at entries {min(ai):,}-{max(ai):,}" if min(ai) >= 0
                            else "some live before the trace began")
                    dies = "never freed" if max(fi) < 0 else ("some freed later" if min(fi) < 0 else "freed later")
                    size = f"**{fmt_bytes(a.size[r] * len(rows))}** ({len(rows)} x {fmt_bytes(a.size[r])})"
                rule = an.rule_names[int(da.rule[r])] if len(an.rule_names) > int(da.rule[r]) else "?"
                L.append(f"{k}. {size} {cats[int(da.category[r])]} (rule `{rule}`), {born}, {dies}")
                for fr in short_stack(snap, int(a.stack[r]), limits["frames"], redact_paths):
                    L.append(f"    - `{fr}`")
            L.append("")

        L.append("### Leaks")
        L.append("")
        leaks = da.leaks or []
        if not leaks:
            L.append("None found (live memory does not grow from iteration to iteration).")
        for lk in leaks[:limits["leaks"]]:
            per = lk.get("bytes_per_iteration")
            tot = lk.get("bytes", lk.get("total_bytes"))
            head = f"- **{fmt_bytes(per)}/iteration**" if per is not None else f"- **{fmt_bytes(tot)}**"
            if tot is not None and per is not None:
                head += f", {fmt_bytes(tot)} in all"
            if lk.get("category"):
                head += f", {lk['category']}"
            if lk.get("where"):
                head += f": {lk['where']}"
            L.append(head)
            if isinstance(lk.get("stack"), int):
                for fr in short_stack(snap, lk["stack"], limits["frames"], redact_paths):
                    L.append(f"    - `{fr}`")
            elif lk.get("frames"):
                for fr in lk["frames"][:limits["frames"]]:
                    L.append(f"    - `{fr}`")
        if len(leaks) > limits["leaks"]:
            L.append(f"- ... and {len(leaks) - limits['leaks']} more (see analysis.json)")
        L.append("")

        ooms = da.ooms or []
        if ooms:
            L.append("### Out of memory")
            L.append("")
        tcols = snap.trace(dev).columns
        for k, oom in enumerate(ooms[:limits["ooms"]], 1):
            f = _oom_figures(an, dev, oom)
            L.append(f"**OOM {k}** at entry {f['index']:,}: requested **{fmt_bytes(f['requested'])}**, "
                     f"device free {fmt_bytes(f['device_free'])}, allocated {fmt_bytes(f['live'])}, "
                     f"reserved {fmt_bytes(f['reserved']) if f['reserved'] is not None else 'unknown'}, "
                     f"reserved but unallocated {fmt_bytes(f['fragmentation']) if f['fragmentation'] is not None else 'unknown'}.")
            L.append("")
            if f["by_category"]:
                L.append("| Category | Live at the OOM |")
                L.append("|---|---:|")
                for c, b in sorted(f["by_category"].items(), key=lambda kv: -kv[1]):
                    L.append(f"| {c} | {fmt_bytes(b)} |")
                L.append("")
            L.append(f"- **Diagnosis**: {f['diagnosis']}")
            L.append(f"- **Next step**: {f['suggestion']}")
            if 0 <= f["index"] < len(tcols["stack"]):
                st = short_stack(snap, int(tcols["stack"][f["index"]]), limits["frames"], redact_paths)
                if st:
                    L.append("- Requested from:")
                    L += [f"    - `{fr}`" for fr in st]
            L.append("")
        if len(ooms) > limits["ooms"]:
            L.append(f"... and {len(ooms) - limits['ooms']} more OOMs (see analysis.json)")
            L.append("")

    L.append("## Annotations")
    L.append("")
    if not anns:
        L.append("None.")
    else:
        L.append("| # | Where | Note |")
        L.append("|---|---|---|")
        for k, d in enumerate(anns[:limits["annotations"]], 1):
            note = d.get("note", "")
            if len(note) > limits["note"]:
                note = note[:limits["note"]] + "..."
            L.append(f"| {k} | {_md_escape(d.get('where', d.get('kind', '')))} | {_md_escape(note)} |")
        if len(anns) > limits["annotations"]:
            L.append("")
            L.append(f"... and {len(anns) - limits['annotations']} more annotations (see analysis.json)")
    for w in ann_warnings:
        L.append("")
        L.append(f"Note: {w}")
    L.append("")
    text = "\n".join(L)
    return redact(text) if redact_paths else text


def _fit_markdown(build) -> str:
    limits = {"allocs": 10, "frames": STACK_FRAMES, "leaks": 10, "ooms": 5, "annotations": 50, "note": 500}
    for shrink in ({}, {"note": 200}, {"annotations": 20, "allocs": 8}, {"frames": 3, "leaks": 5},
                   {"allocs": 5, "annotations": 10, "note": 120, "ooms": 3}, {"allocs": 3, "leaks": 3, "ooms": 2,
                                                                          "annotations": 5, "note": 80}):
        limits.update(shrink)
        text = build(limits)
        if len(text.encode()) <= MD_LIMIT:
            return text
    cut = "\n\n... (report truncated to stay under 20 KB; analysis.json has everything)\n"
    data = text.encode()[:MD_LIMIT - len(cut.encode()) - 4].decode("utf-8", "ignore")
    return data[:data.rfind("\n")] + cut


# -- the PNG timeline ----------------------------------------------------------------------

def _ensure_offscreen() -> None:
    if os.environ.get("QT_QPA_PLATFORM"):
        return
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and os.name != "nt" \
            and not _is_macos():
        os.environ["QT_QPA_PLATFORM"] = "offscreen"


def _is_macos() -> bool:
    import sys
    return sys.platform == "darwin"


def envelope(x: np.ndarray, live: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel bucket of x: the entry with the highest live bytes, and the lowest live bytes.

    Returns (indices of the max entry per non-empty bucket, min live per bucket)."""
    n = len(live)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lo, hi = float(x[0]), float(x[-1])
    edges = np.linspace(lo, hi, buckets + 1)
    starts = np.unique(np.searchsorted(x, edges[:-1], side="left"))
    starts = starts[starts < n]
    bmax = np.maximum.reduceat(live, starts)
    bmin = np.minimum.reduceat(live, starts)
    lens = np.diff(np.append(starts, n))
    hit = np.flatnonzero(live == np.repeat(bmax, lens))
    first_hit = hit[np.searchsorted(hit, starts, side="left")]
    return first_hit.astype(np.int64), bmin


def render_timeline(an, dev: int, path: str, annotations=(), width: int = 1200, height: int = 520) -> str:
    """Draw the live memory of one device stacked by category into a PNG, offscreen."""
    _ensure_offscreen()
    import pyqtgraph as pg
    from PySide6 import QtCore, QtGui, QtWidgets

    from .export import category_live_at, category_series
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])  # noqa: F841 (keeps Qt alive)
    cats = _cat_names()
    snap = an.snapshot
    da = an.devices[dev]
    lm = da.live
    n = lm.n_events
    tus = np.asarray(snap.trace(dev).columns["time_us"])
    has_time = n > 1 and bool((tus >= 0).all()) and bool((np.diff(tus) >= 0).all()) and tus[-1] > tus[0]
    if has_time:
        # When nearly all entries crowd into a sliver of the time range (a long idle gap, a slow
        # data loader), a time axis hides the interesting part: fall back to entry numbers.
        counts = np.histogram(tus, bins=100)[0]
        if np.sort(counts)[-10:].sum() > 0.85 * n:
            has_time = False
    if has_time:
        x_all = (tus - tus[0]) / 1e6
        x_label = "time since the first entry (s)"
    else:
        x_all = np.arange(n, dtype=np.float64)
        x_label = "trace entry" + (" (time stamps are too uneven to plot against)" if n > 1 and (tus >= 0).all()
                                   else "")

    peak = max(lm.peak_bytes, 1)
    unit, scale = next(((u, s) for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
                        if peak >= s), ("B", 1))

    plot_px = width - 110
    idx, bmin = envelope(x_all, np.asarray(lm.live_after), plot_px)
    # the start state, then each pixel's highest moment
    xs = np.concatenate([[x_all[0] if n else 0.0], x_all[idx]]) if n else np.array([0.0, 1.0])
    idx_all = np.concatenate([[-1], idx]) if n else np.array([-1, -1])
    series = category_series(da, len(cats))
    per_cat = category_live_at(series, idx_all).astype(np.float64) / scale      # (P, K)
    total = per_cat.sum(axis=1)

    pw = pg.GraphicsLayoutWidget()
    pw.setBackground("w")
    pw.resize(width, height)
    title = pw.addLabel("", row=0, col=0)
    legend_label = pw.addLabel("", row=1, col=0)
    pi = pw.addPlot(row=2, col=0)
    title_peak = f"peak {fmt_bytes(lm.peak_bytes)}"
    if da.peak.get("type") and da.peak.get("type") != "other":
        title_peak += f" ({da.peak['type']})"
    for side in ("left", "bottom"):
        ax = pi.getAxis(side)
        ax.setPen(pg.mkPen("#444"))
        ax.setTextPen(pg.mkPen("#222"))
    pi.setLabel("left", f"live memory ({unit})", color="#222")
    pi.setLabel("bottom", x_label, color="#222")
    pi.showGrid(x=False, y=True, alpha=0.25)
    pi.setMenuEnabled(False)
    pi.hideButtons()

    # The legend rides in the title (coloured squares): a legend box inside the plot would
    # cover the curve or the annotation labels.
    order = [cats.index(c) for c in STACK_ORDER if c in cats] + [k for k, c in enumerate(cats) if c not in STACK_ORDER]
    present = [k for k in order if per_cat[:, k].max() > 0]
    keys = []
    base = np.zeros(len(xs))
    # the baseline needs a (transparent) pen too: with pen=None pyqtgraph builds no curve
    # path and FillBetweenItem draws nothing for the lowest category
    prev = pg.PlotDataItem(xs, base, pen=pg.mkPen(QtGui.QColor(0, 0, 0, 0)))
    pi.addItem(prev)
    for k in present:
        top = base + per_cat[:, k]
        col = QtGui.QColor(CATEGORY_COLORS.get(cats[k], "#A0A0A0"))
        # an invisible edge (FillBetweenItem needs a curve path; a visible 1 px edge makes
        # tiny categories look like noise on top of big ones)
        cur = pg.PlotDataItem(xs, top, pen=pg.mkPen(QtGui.QColor(0, 0, 0, 0)))
        pi.addItem(cur)
        fill = pg.FillBetweenItem(prev, cur, brush=pg.mkBrush(col))
        pi.addItem(fill)
        keys.append(f"<span style='color:{col.name()}'>&#9632;</span>&nbsp;{cats[k]}&nbsp;"
                    f"{fmt_bytes(per_cat[:, k].max() * scale).replace(' ', '&nbsp;')}")
        prev, base = cur, top
    legend_rows = [" &nbsp; ".join(keys[i:i + 5]) for i in range(0, len(keys), 5)]
    title.setText(f"{_html(os.path.basename(snap.path))}, device {dev}: live memory by category, {title_peak}",
                  color="#222", size="11pt")
    legend_label.setText(f"{'<br>'.join(legend_rows)} &nbsp;<span style='color:#777'>(max of each)</span>",
                         color="#222", size="9pt")
    pi.plot(xs, total, pen=pg.mkPen("#222", width=1.2))
    if n and len(bmin):
        # the low side of each pixel's envelope: bursts shorter than a pixel show as the gap
        low = np.concatenate([[lm.start_bytes], bmin]) / scale
        pi.plot(xs, low, pen=pg.mkPen("#555", width=1, style=QtCore.Qt.PenStyle.DotLine))

    y_top = float(total.max()) if len(total) else 1.0
    # room above the curve for the legend and labels
    pi.setYRange(0, max(y_top, 1e-9) * 1.25, padding=0)
    x_lo, x_hi = (float(xs[0]), float(xs[-1])) if len(xs) else (0.0, 1.0)
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    pi.setXRange(x_lo, x_hi, padding=0.01)

    def x_of(i):
        if i is None or i < 0 or not n:
            return x_lo
        return float(x_all[min(int(i), n - 1)])

    label_y = [y_top * 1.21, y_top * 1.145, y_top * 1.08]
    slot = [0]

    def label(x, text, color):
        # right of the mark, or left of it in the right third so it is not cut at the edge
        anchor = (1, 0.5) if x > x_lo + 0.66 * (x_hi - x_lo) else (0, 0.5)
        t = pg.TextItem(text, color=color, anchor=anchor, fill=pg.mkBrush(255, 255, 255, 200))
        t.setPos(x, label_y[slot[0] % len(label_y)])
        slot[0] += 1
        pi.addItem(t)

    # annotations: shaded ranges / dashed lines, numbered like the Markdown table
    for k, d in enumerate(list(annotations)[:12], 1):
        if d.get("device") not in (None, dev):
            continue
        note = d.get("note", "") or d.get("kind", "")
        text = f"[{k}] {note[:32]}{'...' if len(note) > 32 else ''}"
        col = QtGui.QColor(ANNOTATION_COLOR)
        if d.get("kind") == "range":
            a0, a1 = d.get("start_index"), d.get("end_index")
            if a0 is not None and a1 is not None:
                r0, r1 = x_of(a0), x_of(a1)
            elif d.get("start_us") is not None and has_time:
                r0, r1 = (d["start_us"] - tus[0]) / 1e6, (d["end_us"] - tus[0]) / 1e6
            else:
                continue
            fillc = QtGui.QColor(col)
            fillc.setAlpha(45)
            reg = pg.LinearRegionItem((r0, r1), movable=False, brush=pg.mkBrush(fillc),
                                      pen=pg.mkPen(col, width=1))
            reg.setZValue(-10)
            pi.addItem(reg)
            label(r0, text, col)
        else:
            i = d.get("index") if d.get("kind") == "peak" else d.get("alloc_index")
            xv = x_of(i if i is not None else lm.peak_index)
            pi.addItem(pg.InfiniteLine(xv, angle=90, pen=pg.mkPen(col, width=1.5,
                                                                  style=QtCore.Qt.PenStyle.DashLine)))
            label(xv, text, col)

    # the peak and the OOMs
    px = x_of(lm.peak_index)
    pi.addItem(pg.InfiniteLine(px, angle=90, pen=pg.mkPen(PEAK_COLOR, width=1.5)))
    pk_label = pg.TextItem(f"peak {fmt_bytes(lm.peak_bytes)}", color=PEAK_COLOR, anchor=(1.0, 1.0),
                           fill=pg.mkBrush(255, 255, 255, 200))
    pk_label.setPos(px, y_top * 1.03)
    pi.addItem(pk_label)
    for oom in (da.ooms or [])[:10]:
        ox = x_of(oom.get("index"))
        pi.addItem(pg.InfiniteLine(ox, angle=90, pen=pg.mkPen(OOM_COLOR, width=2,
                                                              style=QtCore.Qt.PenStyle.DashLine)))
        t = pg.TextItem(f"OOM: {fmt_bytes(oom.get('requested'))} requested", color=OOM_COLOR,
                        anchor=(1.0, 0.0), fill=pg.mkBrush(255, 255, 255, 220))
        t.setPos(ox, y_top * 0.96)
        pi.addItem(t)

    img = _grab(pw, app)
    pw.close()
    pw.deleteLater()
    if not img.save(path, "PNG"):
        raise OSError(f"could not write {path}")
    if os.path.getsize(path) > PNG_LIMIT:      # never expected at this size; keep the promise anyway
        img = img.convertToFormat(QtGui.QImage.Format.Format_Indexed8, QtCore.Qt.ImageConversionFlag.ThresholdDither)
        img.save(path, "PNG", 9)
    return path


def _grab(pw, app):
    """Render the widget into an image of its own size at 1 device pixel per pixel: never
    mapped on a real screen (Export Report from the viewer must not flash a window) and
    the same PNG on a HiDPI display as offscreen."""
    from PySide6 import QtCore, QtGui
    pw.setAttribute(QtCore.Qt.WidgetAttribute.WA_DontShowOnScreen, True)
    pw.show()
    app.processEvents()
    img = QtGui.QImage(pw.size(), QtGui.QImage.Format.Format_RGB32)
    img.setDevicePixelRatio(1.0)
    img.fill(QtGui.QColor("white"))
    painter = QtGui.QPainter(img)
    try:
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing, True)
        pw.render(painter)
    finally:
        painter.end()
    pw.hide()
    return img


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _LegendSwatch(color):
    import pyqtgraph as pg
    return pg.BarGraphItem(x=[0], height=[1], width=1, brush=pg.mkBrush(color), pen=pg.mkPen(color))


# -- entry point --------------------------------------------------------------------------------

def write_report(analysis, out_dir: str, device: int | None = None, redact_paths: bool = False,
                 annotations=None, png: bool = True) -> list[str]:
    """Write report.md, timeline.png (one per device when there are several) and
    analysis.json into `out_dir`; returns the written paths."""
    from .classifiers import summary_dict
    os.makedirs(out_dir, exist_ok=True)
    snap = analysis.snapshot
    devs = [d for d in analysis.devices if device is None or d == device]
    anns, ann_warnings = _annotation_dicts(annotations, snap.path)
    if redact_paths:
        anns = _redact_obj(anns)
    written = []

    png_names = {}
    if png:
        for dev in devs:
            name = "timeline.png" if len(devs) == 1 or dev == devs[0] else f"timeline-device{dev}.png"
            p = os.path.join(out_dir, name)
            render_timeline(analysis, dev, p, [a for a in anns if a.get("device") in (None, dev)])
            png_names[dev] = name
            written.append(p)

    first_png = png_names.get(devs[0]) if devs else None
    md = _fit_markdown(lambda limits: _markdown(analysis, devs, anns, ann_warnings, redact_paths, limits,
                                                first_png))
    if len(png_names) > 1:       # the other devices' images at the end
        extra = "".join(f"\n![device {d}]({n})\n" for d, n in list(png_names.items())[1:])
        if len((md + extra).encode()) <= MD_LIMIT:
            md += extra
    md_path = os.path.join(out_dir, "report.md")
    atomic_write(md_path, md.encode("utf-8"))
    written.insert(0, md_path)

    summary = summary_dict(analysis, device)
    for d in summary["devices"]:
        dev = d["device"]
        da = analysis.devices[dev]
        a = da.allocs
        cats = _cat_names()
        pidx = d["peak"].get("index", da.live.peak_index)
        d["largest_at_peak"] = [
            {"size": int(a.size[r]), "category": cats[int(da.category[r])], "alloc_index": int(a.alloc_index[r]),
             "free_index": int(a.free_index[r]), "addr": int(a.addr[r]),
             "stack": short_stack(snap, int(a.stack[r]), STACK_FRAMES, redact_paths)}
            for r in largest_at(da, pidx if pidx is not None else -1, 20)]
        d["oom_reports"] = [_oom_figures(analysis, dev, o) for o in (d.get("ooms") or [])]
    summary["annotations"] = anns
    if ann_warnings:
        summary["annotation_warnings"] = ann_warnings
    if redact_paths:
        summary = _redact_obj(summary)
        summary["file"] = os.path.basename(snap.path)
    js_path = os.path.join(out_dir, "analysis.json")
    atomic_write(js_path, orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
                                       | orjson.OPT_SERIALIZE_NUMPY, default=_json_default))
    written.insert(1, js_path)
    return written


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    return str(o)
