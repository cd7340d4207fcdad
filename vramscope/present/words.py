"""Plain words for the analysis' facts: peak types, levers, OOM diagnoses, findings.

Every surface (the viewer's findings and labels, the report, `vramscope summary`) takes
its sentences from here, so the same fact is never told two ways.
"""
from __future__ import annotations

from ..classifiers.results import (
    Advice,
    Finding,
    Iteration,
    Leak,
    Oom,
    Peak,
    StaleGradients,
)
from ..common.units import fmt_bytes

# DESIGN.md §4, after Salisbury's QLoRA study (labels A to I)
PEAK_TYPE_WORDS = {
    "quantization": "while quantizing weights at load",
    "model_load": "while loading the model",
    "forward": "at the end of the forward pass",
    "loss": "at the loss (logits and loss after the forward)",
    "backward_start": "at the start of backward",
    "backward_top": "in backward through the top layers",
    "backward_bottom": "in backward through the bottom layers (gradients built up)",
    "backward_end": "at the end of backward",
    "optimizer_step": "in the optimizer step",
    "oom": "right before an out-of-memory error",
    "other": "outside any pass the trace shows",
}

# The phase a peak of type "other" fell in, where the trace tells (the types name the others)
OTHER_PHASE_WORDS = {
    "inputs": "while the next batch was prepared",
    "unwind": "while an out-of-memory error unwound",
}

# What each lever asks the user to do (classifiers/levers.py names them and estimates them)
LEVER_WORDS = {
    "checkpointing": "gradient checkpointing (torch.utils.checkpoint on the model's repeated blocks)",
    "half_batch": "half the micro-batch, with twice the gradient accumulation steps",
    "adam8bit": "an 8-bit or paged optimizer (bitsandbytes AdamW8bit / PagedAdamW)",
    "paged_optimizer": "a paged optimizer (bitsandbytes PagedAdamW)",
    "lora": "LoRA adapters on a frozen base instead of training every weight",
    "4bit": "4-bit base weights (QLoRA: bitsandbytes NF4)",
    "expandable_segments": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
}


# The x axis of two runs compared on one axis (the viewer's Compare panel, the report's
# compare.png), longest first: a narrow plot takes the longest that fits
COMPARE_X_TITLES = {
    "seconds": ("seconds since each side's first iteration's start", "seconds since each side's iteration 1",
                "seconds since iteration 1"),
    "entries": ("trace entries since each side's first iteration's start", "entries since each side's iteration 1",
                "entries since iteration 1"),
    "iteration": ("iteration (each drawn one unit wide, ticks at their starts)", "iteration (each one unit wide)",
                  "iteration"),
}


def count_words(n: int, one: str, many: str) -> str:
    """'1 entry', '3,480 entries'."""
    return f"{n:,} {one if n == 1 else many}"


# A snapshot without a trace: no pass to place its peak in (its moment: moment_text's state)
STATE_ONLY_PEAK_WORDS = "no allocation traced"


def peak_words(peak_type: str, state_only: bool = False) -> str:
    """Where a peak falls, in words (its type's); `state_only`: a snapshot without a trace,
    where 'outside any pass the trace shows' would name a trace that is not there."""
    if state_only:
        return STATE_ONLY_PEAK_WORDS
    return PEAK_TYPE_WORDS.get(peak_type, peak_type.replace("_", " "))


def scaled_peak_words(peak_type: str, state_only: bool = False) -> str:
    """Where a what-if's peak falls, in words: the moment of the recorded run, which a scaled
    run need not share its fate with (a peak scaled down below the card did not run out of
    memory: 'right before an out-of-memory error' was the measured run's, not this one's)."""
    if peak_type == "oom" and not state_only:
        return "where the recorded run ran out of memory"
    return peak_words(peak_type, state_only)


def trainable_params_words(count: int, counted: bool = True) -> str:
    """The budget's trainable parameters: a count, or why there is none ('0' beside an AdamW
    optimizer read as a contradiction)."""
    if not counted:
        return "trainable parameters not counted (no frames, or a state dump)"
    if count <= 0:
        return "trainable parameters not counted (no weight with a gradient was seen)"
    return f"trainable parameters {count:,}"


def advice_text(advice: Advice, oom: Oom | None = None, moment: str = "at this moment") -> str:
    """One lever as a sentence, with what it would save: 'gradient checkpointing: up to
    1.60 GiB of activations at this moment'."""
    if advice.lever == "expandable_segments":
        if oom is not None and oom.fragmentation_bytes is not None:
            return (f"set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (fragmentation: "
                    f"{fmt_bytes(oom.fragmentation_bytes)} reserved but unallocated, more than the "
                    f"{fmt_bytes(oom.requested)} requested)")
        return "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    text = LEVER_WORDS.get(advice.lever, advice.lever.replace("_", " "))
    if advice.lever == "half_batch" and not advice.training:
        text = "run the batch in two halves (or shorter sequences, or smaller tiles)"
    if advice.lever == "checkpointing" and advice.target:
        count, _, name = advice.target.partition(" ")
        text = f"gradient checkpointing (torch.utils.checkpoint on each of the {count} {name} blocks)"
    if advice.saves_bytes:
        if advice.estimate:
            of = f" of {advice.category}" if advice.category else ""
            text += f": about {fmt_bytes(advice.saves_bytes)}{of} {moment} (an estimate)"
        elif advice.lower_bound:
            text += (f": the peak {fmt_bytes(advice.saves_bytes)} lower as far as the trace goes (simulated on this "
                     f"run, which ends in the out-of-memory error: what the step needed after it is not counted)")
        else:
            text += f": the peak {fmt_bytes(advice.saves_bytes)} lower (simulated on this run)"
    return text


# -- how sure: evidence (classifiers/evidence.py) ---------------------------------------------
# how to record what a snapshot could not show: history on before the model is built
RECORD_HINT = ("turn history on before the model is built: torch.cuda.memory._record_memory_history("
               "max_entries=1_000_000, stacks=\"python\"), then torch.cuda.memory._dump_snapshot(\"run.pickle\") "
               "(vramscope.record() does both)")
EVIDENCE_WORDS = {"torch": "torch's own tag", "stack": "its stack", "lifetime": "its lifetime",
                  "guess": "a guess", "none": "unknown"}


def evidence_words(evidence: str) -> str:
    """One allocation's evidence in a sentence (the Selection pane, tooltips)."""
    return {
        "torch": "torch's own tag decided it",
        "stack": "its own stack matched the rule",
        "lifetime": "when it was allocated and freed decided it (its stack said nothing)",
        "guess": "a guess: no frames to decide it (live before recording began, or made by C++ code a "
                 "Python-only stack does not show); record with history on before the model is built, with "
                 "stacks='all', to know",
        "none": "no rule recognised it",
    }.get(evidence, evidence)


def evidence_text(by_evidence: dict[str, int]) -> str:
    """'5.29 GiB from stacks, 12.0 MiB from lifetimes, 181.9 KiB a guess'."""
    said = {"torch": "torch's own tags", "stack": "from stacks", "lifetime": "from lifetimes",
            "guess": "a guess", "none": "unknown"}
    return ", ".join(f"{fmt_bytes(b)} {said.get(e, e)}" for e, b in by_evidence.items() if b)


def category_evidence_note(per_evidence: dict[str, int]) -> str:
    """What part of one category's bytes is a guess: '' (none), 'a guess', '1.20 GiB of it a guess'."""
    total = sum(per_evidence.values())
    guessed = per_evidence.get("guess", 0)
    if not guessed:
        return ""
    return "a guess" if guessed == total else f"{fmt_bytes(guessed)} of it a guess"


def category_bytes_text(category: str, nbytes: int, per_evidence: dict[str, int] | None = None,
                        guessed: int | None = None) -> str:
    """A category's bytes in a sentence, marked where they are a guess: 'weights 20.01 MiB
    (a guess)', 'optimizer 1.50 GiB (1.20 GiB of it a guess)', 'activations 3.2 GiB'.
    `per_evidence` (a peak's by_category_evidence entry) or `guessed` (bytes that are a guess)."""
    if guessed is not None:
        per_evidence = {"guess": int(guessed), "stack": max(0, int(nbytes) - int(guessed))}
    note = category_evidence_note(per_evidence or {})
    return f"{category} {fmt_bytes(nbytes)}" + (f" ({note})" if note else "")


def guessed_text(by_evidence: dict[str, int]) -> str:
    """'1.02 GiB a guess' (a moment's bytes whose category is a guess), '' when none is."""
    guessed = by_evidence.get("guess", 0)
    return f"{fmt_bytes(guessed)} a guess" if guessed else ""


GUESS_NOTE_SHARE = 0.1      # below this share of a moment guessed, the "how sure" line says enough


def guess_note(by_evidence: dict[str, int], recorded: str = "trace", frames: bool = True) -> str:
    """What a snapshot could not show and how to record it ('' when little is a guess)."""
    guessed = by_evidence.get("guess", 0)
    total = sum(by_evidence.values())
    if recorded == "state_only":
        return ("a state-only snapshot: it shows the blocks live at one moment (their sizes, segments, pools, "
                "fragmentation and, where recorded, stacks), not when each was made or freed, so it has no phases, "
                "iterations, leaks or advice. To record a trace, " + RECORD_HINT)
    if not frames:
        return ("no allocation carries frames: every category is a guess from sizes and timing, and no advice "
                "rests on it. To record stacks, " + RECORD_HINT)
    if guessed < GUESS_NOTE_SHARE * max(1, total):
        return ""
    return (f"{guessed / max(1, total):.0%} of it has no frames (live before recording began, or made by C++ code a "
            f"Python-only stack does not show): its categories are guesses, and no advice rests on them. To record "
            f"it, " + RECORD_HINT)


def oom_suggestions(oom: Oom) -> list[str]:
    return [advice_text(a, oom) for a in oom.advice]


def process_limit(requested: int, device_free: int | None) -> bool:
    """The card had more free than was asked for: a limit inside the process ran out
    (torch.cuda.set_per_process_memory_fraction, or a framework's cap), not the card."""
    return device_free is not None and requested > 0 and device_free >= requested


def device_free_text(requested: int, device_free: int | None) -> str:
    text = f"device free {fmt_bytes(device_free)}"
    if process_limit(requested, device_free):
        text += " (more than requested: a limit set in the process ran out, not the card)"
    return text


def oom_diagnosis(oom: Oom, guessed: dict[str, int] | None = None) -> str:
    """Why the request failed, in one sentence (DESIGN.md §5), and a second when the card
    itself still had room. `guessed`: the bytes per category live at the OOM whose category
    is a guess (DeviceAnalysis.guessed_by_category), said beside the largest share."""
    frag = oom.fragmentation_bytes
    limit = (f" The card still had {fmt_bytes(oom.device_free)} free: a memory limit set in the process "
             f"(torch.cuda.set_per_process_memory_fraction, or a framework's cap) is what ran out."
             if process_limit(oom.requested, oom.device_free) else "")
    if frag is not None and frag >= oom.requested > 0:
        text = (f"{fmt_bytes(frag)} was reserved by PyTorch but not allocated, more than the "
                f"{fmt_bytes(oom.requested)} requested: the cache is fragmented (no free block is big enough)")
        if oom.expandable_segments:
            text += ", although expandable segments are on"
        return text + "." + limit
    top = max(oom.by_category.items(), key=lambda kv: kv[1]) if oom.by_category else ("unknown", 0)
    share = top[1] / oom.allocated if oom.allocated else 0.0
    full = "the memory allowed" if limit else "the device"
    g = (guessed or {}).get(top[0], 0)
    sure = "" if not g else (", a guess" if g >= top[1] else f", {fmt_bytes(g)} of it a guess")
    # reserved memory unknown (no segments, or segment events that do not add up): whether the
    # cache could have held the request is not said
    cache = (f"; reserved-but-free memory ({fmt_bytes(frag)}) could not have held the request" if frag is not None
             else "; how much PyTorch had reserved but not allocated is unknown")
    return (f"Live tensors fill {full}: {fmt_bytes(oom.allocated)} allocated, the largest share "
            f"{top[0]} ({share:.0%}{sure}){cache}." + limit)


def autocast_copies_text(copy_bytes: int) -> str:
    """Of the weights at the peak, autocast's 16-bit copies ('' when none): the same kind in every
    surface's category table (weights: weight data in another dtype, not activations)."""
    return f"{fmt_bytes(copy_bytes)} of it autocast's 16-bit copies" if copy_bytes else ""


def oom_need_text(oom: Oom) -> str:
    """What the failed step needed at least: what was live plus what it asked for."""
    return (f"as recorded this does not fit: the step needed at least {fmt_bytes(oom.allocated + oom.requested)} "
            f"({fmt_bytes(oom.allocated)} live and {fmt_bytes(oom.requested)} more asked for), and the trace ends "
            f"there, so whatever it would have needed next is not in it")


_KIND_WORDS = {"training": "training", "forward_backward": "a backward without an optimizer step",
               "inference": "inference (forward passes, no grad)",
               "forward_with_grad": "forward passes with grad on and no backward"}


def run_words(run: dict) -> str:
    """`devices[].run` in one line: the kind of run and what is on, a guess marked, unknown said
    ('' for a file with no trace)."""
    def val(name):
        f = run.get(name) or {}
        return f.get("value"), f.get("evidence")

    def mark(text, ev):
        return text + (" (a guess)" if ev == "guess" else "")
    rec, _ = val("recorded")
    if rec != "trace":
        return "state only: what kind of run it was is unknown" if rec == "state_only" else ""
    kind, kev = val("kind")
    opt, oev = val("optimizer")
    head = mark(_KIND_WORDS.get(kind, "kind unknown (the trace cannot tell)"), kev)
    if kind == "training" and opt:
        head += f", {mark(str(opt), oev)} step"
    parts = [head]
    for name, on in (("checkpointing", "checkpointed"), ("autocast", "autocast"), ("adapters", "adapters")):
        v, ev = val(name)
        if v:
            parts.append(mark(on, ev))
        elif v is None and kind in ("training", "forward_backward") and name == "checkpointing":
            parts.append("checkpointing unknown")
    q, qev = val("quantized")
    if q:
        parts.append(mark(f"{q} weights" if q != "quantized" else "quantized weights", qev))
    oom, _ = val("oom")
    cut, _ = val("truncated_by_oom")
    if oom:
        parts.append("ends in an out-of-memory error" if cut else "an out-of-memory error")
    n, nev = val("models_alive")
    if n and n > 1:
        parts.append(mark(f"{n} models alive", nev))
    twice, tev = val("model_held_twice")
    if twice:
        parts.append(mark("a model held twice", tev))
    return "; ".join(parts)


def models_text(run) -> str:
    """A second model alive, or the model held twice, and the way out ('' when neither)."""
    n, twice = run.models_alive.value, run.model_held_twice.value
    if not ((n is not None and n > 1) or twice):
        return ""
    what = run.models_alive.why if n is not None and n > 1 else run.model_held_twice.why
    sure = " (a guess from the shapes)" if "guess" in (run.models_alive.evidence, run.model_held_twice.evidence) \
        and (run.models_alive.evidence == "guess" if n and n > 1 else run.model_held_twice.evidence == "guess") else ""
    return (f"{what}{sure}: drop what is no longer needed before the next model runs (del model, optimizer, and "
            f"any loss or output that keeps a graph; then gc.collect() and torch.cuda.empty_cache(); "
            f"torch._dynamo.reset() when compiled)")


def leaks_none_text(run) -> str:
    """What 'no leak found' means for this file."""
    if run.recorded.value != "trace":
        return "not checkable (no trace: a leak shows as growth from iteration to iteration)"
    return "none found"


def stale_gradients_text(sg: StaleGradients) -> str:
    """What the previous step's gradients cost, and the fix."""
    through = (" and ".join(sg.phases) + (" phases" if len(sg.phases) > 1 else " phase")) if sg.phases \
        else "the next step"
    until = "until zero_grad frees them" if sg.freed_last >= 0 else \
        "(never freed while the trace ran: zeroed in place by zero_grad(set_to_none=False), or kept; a trace cannot tell which)"
    at_peak = f"; {fmt_bytes(sg.live_at_peak)} of them at the peak" if sg.live_at_peak else ""
    return (f"{fmt_bytes(sg.bytes)} of the previous step's gradients ({sg.count:,} blocks) stay live through the "
            f"{through} {until}{at_peak}: call optimizer.zero_grad(set_to_none=True) right after "
            f"optimizer.step() (or before the forward) to free them before the next forward")


LEAK_CAUSE_WORDS = {
    "graph": "tensors kept with their autograd graph: a loss or an output kept without .detach() (or .item() "
             "for a number) keeps everything its graph saved; with backward(retain_graph=True) backward does not "
             "free the graph either",
    "container": "a tensor added to a list, dict or cache every iteration and never dropped (keep .detach() of "
                 "it, or .item() for a number, and drop what is no longer needed)",
}


def leak_text(leak: Leak, where: str) -> str:
    cats = ", ".join(f"{c} {fmt_bytes(b)}" for c, b in sorted(leak.by_category.items(), key=lambda kv: -kv[1]))
    return (f"{fmt_bytes(leak.bytes_per_iteration)} per iteration kept at {where} ({cats} in all, "
            f"{leak.count:,} allocations from {len(leak.stacks)} stack{'s' if len(leak.stacks) != 1 else ''}): "
            f"{LEAK_CAUSE_WORDS.get(leak.cause, leak.cause)}")


# The timeline stacked by segment: each band a segment of the caching allocator, coloured by
# its pool (one stream) or its stream (several); the hover box and the legend say it alike.
SEGMENT_BANDS_WORDS = "one band per allocator segment, neighbours in alternating shades"


# what a trace without an action means for what vramscope shows (classifiers/recording.py)
_SKIPPED_WORDS = {
    "free_requested": "frees are counted when completed, as always",
    "free_completed": "frees are counted when requested",
    "alloc": "every allocation it frees is counted as live before the trace began",
    "segment_alloc": "reserved memory over the trace is unknown",
    "segment_map": "reserved memory over the trace is unknown",
}


def skipped_words(actions) -> str:
    """What leaving these actions out of the recording does to the analysis, in a phrase."""
    said = []
    for a in actions:
        w = _SKIPPED_WORDS.get(a)
        if w and w not in said:
            said.append(w)
    return "; ".join(said) or "nothing vramscope reads is missing"


def torch_tag_words(torch_tag: str, rules_category: str | None) -> str:
    """torch's own tag of an allocation beside our rules' verdict, when they disagree:
    'torch: temp; our rules: gradients' ('' without a tag)."""
    if not torch_tag or torch_tag.lower() == "other":       # component tracking's 'says nothing'
        return ""
    return f"torch: {torch_tag}" + (f"; our rules: {rules_category}" if rules_category else "")


def host_space_words() -> str:
    """How pinned host memory is shown: beside the devices, never in their peaks."""
    return "pinned host memory (its own memory space: never part of a GPU's peak)"


def segment_pool_words(small: bool) -> str:
    """The caching allocator's pool of a segment (the small pool's segments are 2 MiB)."""
    return "small pool" if small else "large pool"


def segment_stream_words(stream: int) -> str:
    return f"stream {stream}"


# The allocator's figures, each under the one name that says what it measures
# (classifiers/allocator.py defines them): never "fragmentation" for a number.
RESERVED_UNALLOCATED_WHY = ("Reserved but unallocated: memory the caching allocator holds that no live allocation "
                            "asked for (its cache, and the rounding of blocks to 512 bytes).")


def reserved_unallocated_words(reserved: int | None, unallocated: int | None) -> str:
    """'5.90 GiB reserved but unallocated (10.7% of reserved)'."""
    if reserved is None or unallocated is None:
        return "reserved but unallocated unknown (no allocator segments)"
    share = f" ({unallocated / reserved:.1%} of reserved)" if reserved > 0 else ""
    return f"{fmt_bytes(unallocated)} reserved but unallocated{share}"


def largest_free_words(cached: int, largest_free: int, outside_share: float) -> str:
    """'largest free block 70.0 MiB, 98.8% of the 5.90 GiB cached outside it'."""
    if cached <= 0:
        return "nothing cached"
    return (f"largest free block {fmt_bytes(largest_free)}, {outside_share:.1%} of the {fmt_bytes(cached)} "
            f"cached outside it")


def freed_note() -> str:
    return "where it was freed (allocated before the trace began)"


def before_trace_text(state_only: bool = False, short: bool = False) -> str:
    """When a block live before any traced allocation was made: before the trace began, or, in a
    snapshot without a trace (`state_only`), before the snapshot was taken (there is no trace to
    begin). `short`: for a table cell."""
    if short:
        return "before snapshot" if state_only else "before trace"
    return "before the snapshot was taken" if state_only else "before the trace began"


def moment_text(index: int, state_only: bool = False) -> str:
    """When a moment was, in words: an entry, or the state before the first (`state_only`: a
    snapshot with no allocation in a trace, whose one moment is the state it recorded)."""
    if index >= 0:
        return f"at entry {index:,}"
    return "in the state the snapshot recorded" if state_only else "at the start of the trace"


# How the iterations were found, where it makes their count a guess (results.Iteration.source)
ITERATION_SOURCE_WORDS = {
    "forward_runs": ("a guess: forward passes told apart by the work between them; no backward or "
                     "optimizer step marks where an iteration ends, and one inference may make several"),
    "periodicity": "a guess: from how live memory repeats, as no phases were recorded",
}


def iterations_note(sources) -> str:
    """What makes a count of iterations a guess, from their sources ('' when a backward or an
    optimizer step ends each one, or there are none)."""
    return "; ".join(ITERATION_SOURCE_WORDS[s] for s in sorted(set(sources)) if s in ITERATION_SOURCE_WORDS)


def iteration_text(number: int | None) -> str:
    return "" if number is None else f"iteration {number}"


def error_text(e: BaseException) -> str:
    """An exception as one line for a terminal or a message box (never a traceback)."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return " ".join(str(e).split()) or type(e).__name__


BUG_REPORT = "a bug in vramscope: please report it, with the traceback VRAMSCOPE_DEBUG=1 prints"


def internal_error_text(e: BaseException) -> str:
    """An internal error (a bug of ours, never the input's fault) as one line that asks for a
    bug report: the command line's exit 4, a rank `ranks` could not read."""
    return f"internal error: {type(e).__name__}: {error_text(e)} ({BUG_REPORT})"


# -- comparisons ----------------------------------------------------------------------------
def signed_bytes(n: int) -> str:
    """A change in bytes: '+1.50 MiB', '-512 B', '0 B'."""
    return ("+" if n > 0 else "") + fmt_bytes(n)


def comparison_headline(dc) -> str:
    """What changed between two recordings of one device (classifiers.compare.DeviceComparison),
    in one sentence: the peak, then the categories that moved most."""
    a, b, d = dc.a.peak.bytes, dc.b.peak.bytes, dc.peak_delta
    if d == 0:
        change = "unchanged"
    else:
        change = f"{fmt_bytes(abs(d))} {'lower' if d < 0 else 'higher'}" + (f" ({d / a:+.1%})" if a else "")
    text = f"peak from {fmt_bytes(a)} to {fmt_bytes(b)}, {change}"
    moved = sorted((kv for kv in dc.by_category_delta.items() if kv[1]), key=lambda kv: (-abs(kv[1]), kv[0]))[:3]
    if moved:
        text += "; at the two peaks " + ", ".join(f"{c} {signed_bytes(v)}" for c, v in moved)
    return text


# -- devices and leaks in the viewer ----------------------------------------------------------
def device_first_reason(has_oom: bool) -> str:
    """Why a device is the one to look at first (Analysis.primary_device)."""
    return ("look here first: it ran out of memory" if has_oom else
            "look here first: the highest peak (no device ran out of memory)")


def device_card_text(device: int, peak_bytes: int, reserved_peak: int | None, ooms: int) -> str:
    """One device in a few words: 'cuda:1  peak 1.61 GiB · reserved 1.80 GiB · 1 OOM'."""
    text = f"cuda:{device}  peak {fmt_bytes(peak_bytes)}"
    if reserved_peak is not None:
        text += f" · reserved {fmt_bytes(reserved_peak)}"
    if ooms:
        text += f" · {ooms} OOM{'s' if ooms != 1 else ''}"
    return text


def host_card_text(peak_bytes: int, reserved_peak: int | None) -> str:
    """Pinned host memory in a few words, beside the devices: 'host (pinned)  peak 64.00 MiB'."""
    text = f"host (pinned)  peak {fmt_bytes(peak_bytes)}"
    if reserved_peak is not None:
        text += f" · reserved {fmt_bytes(reserved_peak)}"
    return text


def leak_rows_text(count: int, site: str) -> str:
    """What the allocations table shows while a leak's allocations are selected."""
    return f"Showing the {count:,} allocation{'s' if count != 1 else ''} of the leak at {site}"


def site_rows_text(count: int, site: str, moment: str) -> str:
    """What the allocations table shows while a compared code site's allocations are chosen."""
    return f"Showing the {count:,} allocation{'s' if count != 1 else ''} of {site} live at {moment}"


# -- findings -------------------------------------------------------------------------------
def finding_title(f: Finding, where: str = "", state_only: bool = False) -> str:
    s = f.subject
    if isinstance(s, Peak):
        return f"Peak {fmt_bytes(s.bytes)} · {peak_words(s.type, state_only)}"
    if isinstance(s, Oom):
        return f"OOM at entry {s.index:,}: {fmt_bytes(s.requested)} requested"
    if isinstance(s, StaleGradients):
        return f"Stale gradients {fmt_bytes(s.bytes)} · previous step's, freed late"
    if isinstance(s, Leak):
        return f"Leak {fmt_bytes(s.bytes_per_iteration)}/iteration · {s.category}"
    if isinstance(s, Iteration):
        return f"Iteration {s.number} peak {fmt_bytes(s.peak_bytes)} · {peak_words(s.peak_type)}"
    return f.kind


def finding_detail(f: Finding, where: str = "", state_only: bool = False) -> str:
    s = f.subject
    if isinstance(s, Peak):
        when = moment_text(s.index, state_only)
        if s.iteration is not None:
            when += f", {iteration_text(s.iteration)}"
        if s.type == "other" and s.phase in OTHER_PHASE_WORDS:     # (any other type names its phase)
            when += f", {OTHER_PHASE_WORDS[s.phase]}"
        top = sorted(s.by_category.items(), key=lambda kv: -kv[1])[:3]
        text = f"highest live memory {when}" + (": " + ", ".join(
            category_bytes_text(k, v, s.by_category_evidence.get(k)) for k, v in top) if top else "")
        if s.advice:
            text += f" — worth trying: {advice_text(s.advice[0], moment='at the peak')}"
        return text
    if isinstance(s, Oom):
        detail = device_free_text(s.requested, s.device_free)      # the title says what was requested
        if s.advice:
            detail += f" — next step: {advice_text(s.advice[0], s)}"
        return detail
    if isinstance(s, StaleGradients):
        return stale_gradients_text(s)
    if isinstance(s, Leak):
        return leak_text(s, where)
    if isinstance(s, Iteration):
        return f"entries {s.start_index:,}–{s.end_index:,}"
    return ""


__all__ = ["RECORD_HINT", "EVIDENCE_WORDS", "evidence_words", "evidence_text", "category_evidence_note", "guess_note",
           "category_bytes_text", "guessed_text",
           "PEAK_TYPE_WORDS", "OTHER_PHASE_WORDS", "LEVER_WORDS", "COMPARE_X_TITLES", "count_words", "peak_words",
           "scaled_peak_words",
           "trainable_params_words", "advice_text", "oom_suggestions", "oom_diagnosis",
           "process_limit", "device_free_text",
           "freed_note", "stale_gradients_text", "leak_text", "LEAK_CAUSE_WORDS", "error_text", "internal_error_text",
           "BUG_REPORT", "signed_bytes",
           "comparison_headline", "moment_text", "device_first_reason", "device_card_text", "leak_rows_text",
           "site_rows_text", "ITERATION_SOURCE_WORDS", "iterations_note", "iteration_text", "finding_title",
           "finding_detail", "SEGMENT_BANDS_WORDS",
           "segment_pool_words", "segment_stream_words", "skipped_words", "torch_tag_words", "host_space_words", "host_card_text",
           "RESERVED_UNALLOCATED_WHY", "reserved_unallocated_words", "largest_free_words"]
