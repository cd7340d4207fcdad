"""The summary document: `vramscope summary --json`, the base of the report's analysis.json.

One function builds it (`summary_document`) from the typed results and the presentation
layer's words, so the two outputs can never differ; `summary_text` tells the same
document as the command line's text. Its shape (DESIGN.md §6) is spelled out as
TypedDicts below: scripts depend on it.

Per device: `allocations` counts the rows of `allocations --csv` (blocks live before the
trace included, `allocations_before_trace` of them); iterations are numbered from 1
everywhere (`peak.iteration`, `leaks[].iterations`, `iterations[].number`).
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ..classifiers.iterations import Iterations
from ..classifiers.results import Peak, to_plain
from ..common.jsonio import dumps, loads
from ..common.units import fmt_bytes
from ..present.stacks import Stacks
from ..present.words import (
    LEAK_CAUSE_WORDS,
    advice_text,
    before_trace_text,
    category_evidence_note,
    device_free_text,
    autocast_copies_text,
    evidence_text,
    guess_note,
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
)

if TYPE_CHECKING:
    from ..classifiers.analysis import Analysis

TOP_AT_PEAK = 10


class TopAllocationJSON(TypedDict):
    size: int
    category: str
    rule: str
    evidence: str
    alloc_index: int
    addr: int
    where: str
    stack: list[str]
    torch_tag: str                  # torch's own tag ('' none): profiler category, component type
    rules_category: str | None      # our rules' verdict where torch's tag decided another
    metadata: list[list[str]]       # [kind, text]: 'metadata', each 'note' (annotate), 'internal'


class MetadataGroupJSON(TypedDict):
    value: str
    allocations: int
    bytes: int
    peak_bytes: int


class MetadataJSON(TypedDict):
    """What the allocations' metadata says (classifiers/metadata.py), grouped: by each key
    its user_metadata or notes state (`step` of 'step=12' or {"step": 12}), and by the whole
    user_metadata text (`user_metadata`: component tracking's module names)."""
    keys: list[str]
    by: dict[str, list[MetadataGroupJSON]]


class HostJSON(TypedDict):
    """Pinned host memory (torch 2.14 record_pinned_host_memory): its own memory space."""
    entries: int
    allocations: int
    allocations_before_trace: int
    peak_bytes: int
    peak_index: int
    peak_time_us: int | None
    start_live_bytes: int
    end_live_bytes: int
    reserved_peak_bytes: int | None
    reserved_end_bytes: int
    segments: int
    skipped_actions: list[str]


class PeakDocJSON(TypedDict):
    """A peak as every document tells it (peak_document)."""
    bytes: int
    index: int
    time_us: int | None
    type: str
    type_words: str
    by_category: dict[str, int]
    iteration: int | None
    phase: str
    advice: list[dict[str, Any]]
    advice_words: list[str]
    by_evidence: dict[str, int]
    by_category_evidence: dict[str, dict[str, int]]
    advice_left_out: dict[str, str]


class PeakJSON(PeakDocJSON):
    top: list[TopAllocationJSON]


class LeakJSON(TypedDict):
    stack: int
    site: int
    stacks: list[int]
    by_category: dict[str, int]
    cause: str
    cause_words: str
    bytes_per_iteration: int
    iterations: list[int]
    total_bytes: int
    count: int
    category: str
    rule: str
    growth_per_iteration: int
    where: str
    frames: list[str]


class OomJSON(TypedDict):
    index: int
    time_us: int | None
    requested: int
    device_free: int | None
    allocated: int
    reserved: int | None
    fragmentation_bytes: int | None
    by_category: dict[str, int]
    phase: str
    expandable_segments: bool
    stack: int
    advice: list[dict[str, Any]]
    where: str
    diagnosis: str
    suggestion: str
    suggestions: list[str]
    needed_at_least_bytes: int          # what was live plus what the failed request asked for
    need: str                           # that, worded, where the trace ends in the OOM ('' elsewhere)


class StaleGradientsJSON(TypedDict):
    bytes: int
    count: int
    iterations: list[int]
    freed_first: int
    freed_last: int
    phases: list[str]
    live_at_peak: int
    free_stack: int
    where: str
    advice: str


class DeviceJSON(TypedDict):
    device: int
    entries: int
    allocations: int
    allocations_before_trace: int
    peak: PeakJSON
    start_live_bytes: int
    end_live_bytes: int
    reserved_peak_bytes: int | None
    reserved_unknown: str | None        # why reserved memory is unknown (None: known, or no allocator segments)
    end_by_category: dict[str, int]
    iterations: Sequence[dict[str, Any]]    # IterationRows: a dict per iteration, made when read
    leaks: list[LeakJSON]
    ooms: list[OomJSON]
    stale_gradients: StaleGradientsJSON | None
    run: dict[str, Any]                 # what the trace shows about the run: {fact: {value, evidence, why}}
    models: str                         # a second model alive, or the model held twice ('' when neither)
    autocast_copy_bytes: int            # of the weights at the peak, autocast's 16-bit copies
    leaks_note: str                     # what "no leak" means for this file
    evidence_note: str
    skipped_actions: list[str]          # actions the recording provably left out (skip_actions)
    metadata: MetadataJSON | None       # None: no allocation carries any
    private_pools: list[dict[str, Any]]  # classifiers.pools.PoolFootprint: memory_viz's pool envelopes


class SummaryJSON(TypedDict):
    file: str
    primary_device: int | None
    devices: list[DeviceJSON]
    host: HostJSON | None               # pinned host memory, never part of a device's peak


METADATA_KEYS = 5                       # keys grouped in the document
METADATA_VALUES = 30                    # values listed per key


def metadata_document(da) -> MetadataJSON | None:
    """The metadata groups of one device (see MetadataJSON), None when there is none."""
    md = da.metadata()
    if md is None or not md.any():
        return None
    keys = md.keys()
    by = {k: [to_plain(g) for g in da.group_by_metadata(k)[:METADATA_VALUES]] for k in keys[:METADATA_KEYS]}
    by["user_metadata"] = [to_plain(g) for g in da.group_by_metadata(None)[:METADATA_VALUES]]
    return {"keys": keys, "by": by}


def peak_document(peak: Peak, state_only: bool = False) -> PeakDocJSON:
    """A peak as every document tells it (summary, report, compare): its facts, the plain
    words for its type (`state_only`: a snapshot without a trace), and its advice worded."""
    return {**to_plain(peak), "type_words": peak_words(peak.type, state_only),  # type: ignore[typeddict-item]
            "advice_words": [advice_text(a, moment="at the peak") for a in peak.advice]}


def summary_document(an: Analysis, device: int | None = None, stacks: Stacks | None = None) -> SummaryJSON:
    """The JSON of `vramscope summary --json`: devices in `an.device_order()` (the one
    to look at first leads), or only `device`."""
    stacks = stacks or Stacks(an)
    devices: list[DeviceJSON] = []
    for dev in an.device_order():
        if device is not None and dev != device:
            continue
        da = an.devices[dev]
        s = da.summary()
        peak = s.peak
        top: list[TopAllocationJSON] = [
            {"size": a.size, "category": a.category, "rule": a.rule, "evidence": a.evidence,
             "alloc_index": a.alloc_index, "addr": a.addr,
             "where": stacks.where_of(a), "stack": stacks.short(a.stack, 6, a.forward_stack),
             "torch_tag": a.torch_tag, "rules_category": a.rules_category, "metadata": [list(m) for m in a.metadata]}
            for a in da.largest_live(peak.index, TOP_AT_PEAK)]
        peak_json: PeakJSON = {**peak_document(peak, da.state_only), "top": top}
        leaks: list[LeakJSON] = [{**to_plain(lk), "where": stacks.site(lk.site, lk.stack),  # type: ignore[typeddict-item]
                                  "frames": stacks.frames_text(lk.stack),
                                  "cause_words": LEAK_CAUSE_WORDS.get(lk.cause, lk.cause)} for lk in s.leaks]
        ooms: list[OomJSON] = []
        for o in s.ooms:
            words = [advice_text(a, o) for a in o.advice]
            ooms.append({**to_plain(o), "where": stacks.where(o.stack),  # type: ignore[typeddict-item]
                         "diagnosis": oom_diagnosis(o), "suggestion": words[0] if words else "",
                         "suggestions": words, "needed_at_least_bytes": o.allocated + o.requested,
                         "need": oom_need_text(o) if da.run.truncated_by_oom.value else ""})
        devices.append({
            "device": s.device, "entries": s.entries, "allocations": s.allocations,
            "allocations_before_trace": s.allocations_before_trace, "peak": peak_json,
            "start_live_bytes": s.start_live_bytes, "end_live_bytes": s.end_live_bytes,
            "reserved_peak_bytes": s.reserved_peak_bytes, "reserved_unknown": s.reserved_unknown,
            "end_by_category": s.end_by_category,
            "iterations": IterationRows(Iterations.of(s.iterations)), "leaks": leaks, "ooms": ooms,
            "stale_gradients": None if s.stale_gradients is None else {  # type: ignore[typeddict-item]
                **to_plain(s.stale_gradients), "where": stacks.where(s.stale_gradients.free_stack),
                "advice": stale_gradients_text(s.stale_gradients)},
            "run": da.run.to_json(),
            "models": models_text(da.run),
            "autocast_copy_bytes": da.run.autocast_copy_bytes,
            "leaks_note": leaks_none_text(da.run),
            "evidence_note": guess_note(peak.by_evidence, str(da.run.recorded.value), da.run.frames),
            "skipped_actions": list(s.skipped_actions), "metadata": metadata_document(da),
            "private_pools": [to_plain(p) for p in da.pool_footprints()],
        })
    return {"file": an.snapshot.path, "primary_device": an.primary_device(), "devices": devices,
            "host": None if an.host is None else to_plain(an.host)}


def _document_key(rules_path) -> str | None:
    """The analysis' cache key (our version, classifier and parser code, the rules) plus
    the code that words the document (this module and the presentation layer)."""
    from ..classifiers.cache import analysis_fingerprint
    return _document_key_of(analysis_fingerprint(rules_path))


def _document_key_of(fp: str | None) -> str | None:
    if fp is None:
        return None
    from .. import present
    blob = [fp.encode()]
    files = sorted(Path(present.__path__[0]).glob("*.py")) + [Path(__file__)]
    for f in files:
        try:
            blob += [f.name.encode(), f.read_bytes()]
        except OSError:
            blob.append(b"\0unreadable")
    data = b"\0".join(blob)
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}{len(data):x}"


def cached_summary_document(snap, rules_path=None) -> SummaryJSON:
    """`summary_document` for a whole snapshot, kept beside its cached columns: a reopen
    reads one small JSON file instead of the analysis."""
    from ..classifiers import analyze
    from ..classifiers.cache import analysis_fingerprint, load_iterations
    from ..parsers.cache import read_artifact, write_artifact
    fp = analysis_fingerprint(rules_path) if snap.cache_entry else None
    key = _document_key_of(fp)
    name = f"summary-{key}.json" if key else None
    if name:
        raw = read_artifact(snap, name)
        if raw:
            try:
                doc = loads(raw)
                if isinstance(doc, dict) and isinstance(doc.get("devices"), list):
                    doc["file"] = snap.path          # the cache is keyed by content, not by path
                    for d in doc["devices"]:
                        # the iterations: the cached analysis' (where it is gone, all is recomputed)
                        its = load_iterations(snap, fp, d["device"]) \
                            if fp is not None and d["iterations"] == _IN_ANALYSIS else None
                        if its is None:
                            raise ValueError("iterations not cached")
                        d["iterations"] = IterationRows(its)
                    return doc                        # type: ignore[return-value]
            except (ValueError, TypeError, KeyError):
                pass                                  # damaged: recompute and overwrite
    doc = summary_document(analyze(snap, rules_path=rules_path))
    if name:
        stored = {**doc, "devices": [{**d, "iterations": _IN_ANALYSIS} for d in doc["devices"]]}
        write_artifact(snap, name, dumps(stored))
    return doc


_IN_ANALYSIS = "in the analysis cache"    # a cached document's iterations: a million rows are not copied


def plain_document(doc: SummaryJSON) -> SummaryJSON:
    """The document with every device's iterations as a list of dicts (what the JSON holds),
    for a caller that keeps or writes it with anything but `common.jsonio`."""
    return {**doc, "devices": [{**d, "iterations": list(d["iterations"])} for d in doc["devices"]]}


class IterationRows(Sequence):
    """A summary document's `iterations`: the dict of each iteration (`to_plain` of an
    Iteration), made from the columns when it is read (`rows[k]`, a loop, JSON). A run of
    1.3 million short steps made 1.3 million dicts for a text that lists five of them, and
    a cached document of 400 MB; the cached document names the analysis cache's instead."""

    def __init__(self, its: Iterations):
        self.its = its

    def __len__(self) -> int:
        return len(self.its)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [to_plain(it) for it in self.its[k]]
        return to_plain(self.its[k])

    def __iter__(self):
        return iter(to_plain(self.its))

    def __eq__(self, other) -> bool:
        return list(self) == (list(other) if isinstance(other, (IterationRows, list, tuple)) else other)

    __hash__ = None  # type: ignore[assignment]

    def __plain__(self) -> list[dict]:
        """What JSON writes (common/jsonio.py): every iteration's dict."""
        return to_plain(self.its)

    def __plain_parts__(self, rows: int = 20_000):
        """The same, a part at a time (common/jsonio.py write_pretty)."""
        for a in range(0, len(self.its), rows):
            yield self.its.plain(a, min(a + rows, len(self.its)))

    def sources(self) -> list[str]:
        """Each iteration's `source`."""
        return self.its.source

    def peak_bytes(self) -> list[int]:
        return self.its.peak_bytes.tolist()


ITERATIONS_LISTED = 12                 # the text lists every iteration up to this many
ITERATIONS_FIRST = 3                   # ... and past it the first ones, the highest and the last


def shown_iterations(its: Sequence) -> list[int]:
    """Positions of the iterations the text lists, in order: all of a dozen; of more, the first
    three, the one with the highest peak (the first such) and the last. (A trace of 2,000 steps
    listed 2,000 lines, and the leaks and OOMs after them.)"""
    if len(its) <= ITERATIONS_LISTED:
        return list(range(len(its)))
    peaks = its.peak_bytes() if isinstance(its, IterationRows) else [it.get("peak_bytes") or 0 for it in its]
    top = max(range(len(its)), key=peaks.__getitem__)
    return sorted({*range(ITERATIONS_FIRST), top, len(its) - 1})


def summary_text(doc: SummaryJSON) -> str:
    """The command line's text for a summary document."""
    out = [os.path.basename(doc["file"])]
    devs = doc["devices"]
    if not devs:
        out.append("  no allocations recorded (empty snapshot)")
    if len(devs) > 1:
        out.append(device_overview_text(doc))
    for d in devs:
        pk = d["peak"]
        state_only = ((d.get("run") or {}).get("recorded") or {}).get("value") == "state_only"
        out.append(f"device {d['device']}: {d['entries']:,} trace entries, {d['allocations']:,} allocations"
                   + (f" ({d['allocations_before_trace']:,} live {before_trace_text(state_only)})"
                      if d["allocations_before_trace"] else ""))
        when = moment_text(pk["index"], state_only)
        if pk["iteration"] is not None:
            when += f" (iteration {pk['iteration']})"
        if run_words(d.get("run", {})):
            out.append(f"  run            {run_words(d['run'])}")
        out.append(f"  peak live      {fmt_bytes(pk['bytes'])} ({pk['bytes']:,} B) {when}, {pk['type_words']}")
        per_ev = pk.get("by_category_evidence", {})
        for cat, b in sorted(pk["by_category"].items(), key=lambda kv: -kv[1]):
            notes = [n for n in (category_evidence_note(per_ev.get(cat, {})),
                                 autocast_copies_text(d.get("autocast_copy_bytes", 0)) if cat == "weights" else "")
                     if n]
            out.append(f"    {cat:<13} {fmt_bytes(b):>11}" + (f"  ({'; '.join(notes)})" if notes else ""))
        if pk.get("by_evidence"):
            out.append(f"  how sure       {evidence_text(pk['by_evidence'])}")
        if d.get("evidence_note"):
            out.append(f"                 {d['evidence_note']}")
        for k, words in enumerate(pk["advice_words"][:3]):
            out.append(f"  {'worth trying' if k == 0 else '':<14} {words}")
        if not pk["advice_words"] and pk.get("advice_left_out") and not d.get("evidence_note"):
            reasons = list(dict.fromkeys(pk["advice_left_out"].values()))
            if len(reasons) == 1 and len(pk["advice_left_out"]) > 1:
                out.append(f"  advice         none: {reasons[0]}")
        out.append(f"  live at start  {fmt_bytes(d['start_live_bytes'])}, at end {fmt_bytes(d['end_live_bytes'])}")
        skipped = d.get("skipped_actions") or []
        if skipped:
            out.append(f"  not recorded   {', '.join(skipped)} (skip_actions): {skipped_words(skipped)}")
        if d["reserved_peak_bytes"] is None:
            why = d.get("reserved_unknown") or "profiler-converted snapshot: no allocator segments"
            out.append(f"  reserved peak  unknown ({why})")
        else:
            out.append(f"  reserved peak  {fmt_bytes(d['reserved_peak_bytes'])}")
        its = d["iterations"]
        note = iterations_note(its.sources() if isinstance(its, IterationRows) else (it["source"] for it in its))
        out.append(f"  iterations     {len(its):,}" + (f"  ({note})" if note else ""))
        shown = shown_iterations(its)
        width = max(3, *(len(str(its[k]["number"])) for k in shown)) if shown else 3
        for j, k in enumerate(shown):
            if j and k > shown[j - 1] + 1:
                out.append("    ...")
            it = its[k]
            out.append(f"    {it['number']:>{width}}  peak {fmt_bytes(it['peak_bytes']):>11}  "
                       f"{peak_words(it['peak_type'])}")
        if len(shown) < len(its):
            out.append(f"    ({len(shown)} of {len(its):,} shown: the first {ITERATIONS_FIRST}, the highest peak "
                       f"and the last; `summary --json` lists every one)")
        sg = d["stale_gradients"]
        if sg is not None:
            out.append(f"  STALE GRADIENTS {sg['advice']}")
        if d.get("models"):
            out.append(f"  MODELS         {d['models']}")
        if d["leaks"]:
            for lk in d["leaks"]:
                out.append(f"  LEAK           {fmt_bytes(lk['bytes_per_iteration'])}/iteration  {lk['where']}")
        else:
            out.append(f"  leaks          {d.get('leaks_note') or 'none found'}")
        for o in d["ooms"]:
            out.append(f"  OOM            requested {fmt_bytes(o['requested'])}, "
                       f"{device_free_text(o['requested'], o['device_free'])}")
            if o.get("need"):
                out.append(f"                 {o['need']}")
            if o["suggestion"]:
                out.append(f"                 next step: {o['suggestion']}")
        for p in (d.get("private_pools") or [])[:5]:
            out.append(f"  private pool   {tuple(p['pool'])} stream {p['stream']}: holds {fmt_bytes(p['envelope_bytes'])}"
                       f" at most (live peak {fmt_bytes(p['active_peak_bytes'])}, reserved peak "
                       f"{fmt_bytes(p['reserved_peak_bytes'])})")
        md = d.get("metadata")
        if md:
            texts = [g["value"] for g in md["by"]["user_metadata"] if g["value"]][:6]
            out.append(f"  metadata       keys {', '.join(md['keys'][:METADATA_KEYS])}" if md["keys"] else
                       f"  metadata       {', '.join(texts)}" + (", ..." if len(md["by"]["user_metadata"]) > 7 else ""))
    host = doc.get("host")
    if host:
        out.append(host_text(host))
    return "\n".join(out)


def host_text(h: HostJSON) -> str:
    """Pinned host memory as the command line tells it: apart from every device."""
    when = "at the start of its trace" if h["peak_index"] < 0 else f"at host entry {h['peak_index']:,}"
    res = "unknown" if h["reserved_peak_bytes"] is None else fmt_bytes(h["reserved_peak_bytes"])
    return "\n".join([
        f"pinned host memory (not part of any device's peak): {h['entries']:,} trace entries, "
        f"{h['allocations']:,} allocations",
        f"  peak live      {fmt_bytes(h['peak_bytes'])} ({h['peak_bytes']:,} B) {when}",
        f"  live at start  {fmt_bytes(h['start_live_bytes'])}, at end {fmt_bytes(h['end_live_bytes'])}",
        f"  reserved peak  {res} (pinned blocks held, cached ones included; {h['segments']} at the end)"])


def device_overview_text(doc: SummaryJSON) -> str:
    """One line per device (peak, reserved, OOMs), the one to look at first marked."""
    lines = ["devices (the one to look at first is marked *):"]
    for d in doc["devices"]:
        mark = "*" if d["device"] == doc["primary_device"] else " "
        res = "-" if d["reserved_peak_bytes"] is None else fmt_bytes(d["reserved_peak_bytes"])
        ooms = f", {len(d['ooms'])} OOM{'s' if len(d['ooms']) != 1 else ''}" if d["ooms"] else ""
        lines.append(f" {mark} cuda:{d['device']:<3} peak {fmt_bytes(d['peak']['bytes']):>11}, reserved peak "
                     f"{res:>11}{ooms}")
    return "\n".join(lines)


__all__ = ["IterationRows", "plain_document", "PeakDocJSON", "peak_document", "summary_document", "cached_summary_document", "summary_text",
           "device_overview_text", "host_text", "metadata_document", "SummaryJSON", "DeviceJSON", "HostJSON"]
