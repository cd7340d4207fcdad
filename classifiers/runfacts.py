"""What the trace shows about the run, each fact with its evidence: the record every answer reads.

    run = run_facts(da, sfacts)        # -> results.RunFacts (one per device, cached with the analysis)
    run.backward.value                 # True / False / None (the trace cannot tell)
    run.to_json()                      # `devices[].run` of `summary --json` (DESIGN.md §6)

Before a category, a phase, a peak type, a piece of advice, a budget or a lever says anything,
this establishes what kind of run the trace is: what was recorded (a trace, the state only,
nothing), the phases that really ran (a backward needs autograd's frames, a backward
annotation or gradients made on the autograd thread, never frees alone: freeing a graph's
nodes is not a backward; classifiers/timeline.py), whether an optimizer step ran and which
optimizer, training / a backward without a step / inference / a forward with grad and no
backward, an OOM and whether the trace ends in it, checkpointing, autocast, adapters,
quantized weights, how many models are alive and whether one is held twice, and what was
live before recording began. A fact the trace cannot decide is None (unknown), and says why;
nothing downstream treats unknown as true.

Evidence, as for categories (DESIGN.md §3): `torch` (what torch wrote: the file's layout, an
`oom` entry, a record_function annotation, the recorder's metadata), `stack` (frames),
`lifetime` (when tensors were made and freed), `guess` (sizes alone), `none` (unknown).
"""
from __future__ import annotations

import numpy as np

from ..common.arrays import isin, unique
from ..parsers.tables import A_ALLOC, A_OOM
from .categories import CATEGORY_CODE
from .evidence import E_GUESS
from .results import Fact, RunFacts
from .stacks import is_library_file
from .timeline import P_BACKWARD, P_FORWARD, P_OPTIMIZER, P_UNWIND

GRAD_RATIOS = (1.0, 2.0, 0.5)        # gradient bytes / weight bytes of one parameter tensor
GRAD_MODE_SHARE = 0.15               # of a forward's allocations, this share alive at its end: grad enabled
NO_GRAD_SHARE = 0.9                  # of the forward allocations under @no_grad frames: inference
_W, _G, _O, _Q = (CATEGORY_CODE[c] for c in ("weights", "gradients", "optimizer", "quantization"))

# torch.optim's files (and bitsandbytes') -> the optimizer's class
_OPTIM_FILES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "adagrad": "Adagrad", "rmsprop": "RMSprop",
                "adadelta": "Adadelta", "adamax": "Adamax", "nadam": "NAdam", "radam": "RAdam", "lbfgs": "LBFGS",
                "asgd": "ASGD", "rprop": "Rprop", "sparse_adam": "SparseAdam", "adafactor": "Adafactor",
                "muon": "Muon", "lion": "Lion"}
_CUBLAS_WORKSPACES = (8_519_680, 4_325_376, 33_554_432, 33_685_504, 1_048_576 * 4)


def _fact(value, evidence: str, why: str) -> Fact:
    return Fact(value, evidence if value is not None else "none", why)


def _counts(sizes) -> dict[int, int]:
    u, c = np.unique(np.asarray(sizes, dtype=np.int64), return_counts=True)
    return dict(zip(u.tolist(), c.tolist()))


def _matched_bytes(w: dict[int, int], g: dict[int, int], ratio: float) -> int:
    total = 0
    for s, n in w.items():
        t = s * ratio
        if t == int(t):
            total += min(n, g.get(int(t), 0)) * s
    return total


class _Ctx:
    """What several facts read: the device's columns, its stacks' markers, its phases."""

    def __init__(self, da, sfacts):
        self.da, self.sf = da, sfacts
        a = da.allocs
        # the rows' entries and stacks as the allocations hold them (int32 below 2^31): read only
        # here, compared and used as indices, never shifted or summed (no int64 copies: 80 MB at
        # 10^7 events, made while the blocks' structure is found beside)
        self.ai = np.asarray(a.alloc_index)
        self.fi = np.asarray(a.free_index)
        self.size = np.asarray(a.size, dtype=np.int64)
        self.stack = np.asarray(a.stack)
        self.action = np.asarray(da.trace_action)
        self.tstack = np.asarray(da.trace_stack)           # stack ids: int32 at most, as the trace has them
        self.phase = da.timeline.phase
        self.n_allocs = int(np.count_nonzero(self.action == A_ALLOC))
        lengths = sfacts.stacks.lengths if sfacts is not None else None
        self.row_frames = (lengths[np.maximum(self.stack, 0)] > 0) & (self.stack > 0) if lengths is not None and \
            len(self.stack) else np.zeros(len(self.stack), dtype=bool)
        self.frames = bool(self.row_frames.any())
        self.trace_frames = bool((self.row_frames & (self.ai >= 0)).any())
        self.evidenced = da.evidence < E_GUESS
        # the stacks any entry (or any row) uses: a marker anywhere is one look over the stacks
        n_st = len(sfacts.stacks.lengths) if sfacts is not None else 0
        self.used_entries = np.zeros(n_st, dtype=bool)
        self.used = np.zeros(n_st, dtype=bool)
        if n_st:
            t = self.tstack[(self.tstack > 0) & (self.tstack < n_st)]
            r = self.stack[(self.stack > 0) & (self.stack < n_st)]
            self.used_entries[t] = True
            self.used[r] = True
            self.used |= self.used_entries
        self.adapters = bool(self.marked("adapters", self.stack).any()) if sfacts is not None else False
        self.meta = getattr(sfacts.stacks.snap, "metadata", None) if sfacts is not None else None
        if self.meta is not None and self.meta.device not in (None, da.device):
            self.meta = None

    def marked(self, name: str, stacks) -> np.ndarray:
        """bool per stack id of `stacks`: it has marker `name`."""
        has = self.sf.has_marker.get(name) if self.sf is not None else None
        st = np.asarray(stacks)
        if st.dtype.kind not in "iu":
            st = st.astype(np.int64)
        if has is None or not len(st):
            return np.zeros(len(st), dtype=bool)
        # (in the stacks' own dtype: int64 copies of a row's stacks were 63 MB at 10^7 events)
        return (st > 0) & has[np.clip(st, 0, len(has) - 1)]

    def any_marked(self, name: str, entries_only: bool = False) -> bool:
        has = self.sf.has_marker.get(name) if self.sf is not None else None
        if has is None:
            return False
        used = self.used_entries if entries_only else self.used
        k = min(len(has), len(used))
        return bool((has[:k] & used[:k]).any())


# -- the facts -------------------------------------------------------------------------------------
def _recorded(c: _Ctx) -> Fact:
    if c.n_allocs:
        return _fact("trace", "torch", f"the trace holds {c.n_allocs:,} allocations")
    if len(c.size):
        return _fact("state_only", "torch", "no allocation in a trace: the blocks live when it was dumped, and "
                                           "nothing of how the run got there")
    return _fact("empty", "torch", "no allocation at all")


def _phase_fact(c: _Ctx, code: int, what: str, annotation_words: str) -> Fact:
    if c.n_allocs == 0:
        return _fact(None, "none", f"no trace: whether {what} ran cannot be seen")
    ph = c.phase == code
    if ph.any():
        st = c.tstack[ph]
        marker = {P_BACKWARD: "backward", P_OPTIMIZER: "optimizer"}[code]
        if c.marked(marker, st).any():
            return _fact(True, "stack", f"{what}'s frames in the trace")
        if annotation_words and _annotated(c, annotation_words):
            return _fact(True, "torch", f"a record_function annotation of {what}")
        return _fact(True, "lifetime", f"allocations without frames on the autograd thread right after the "
                                       f"forward (stacks='python' records none for it)" if code == P_BACKWARD
                     else f"{what} inferred from the phases around it")
    if annotation_words and _annotated(c, annotation_words):
        return _fact(True, "torch", f"a record_function annotation of {what} (it allocated nothing)")
    if not c.trace_frames:
        return _fact(None, "none", f"no allocation carries frames: whether {what} ran cannot be told")
    return _fact(False, "stack", f"the trace has frames and none of them {what}'s")


def _manual_update(c: _Ctx) -> bool:
    """A loop over the parameters outside the model and any optimizer, one tensor the size of each
    weight every step (rules weights.parameter_update / temporary.parameter_sized): a hand-written
    update (zeroth-order methods, manual SGD)."""
    names = c.da.rule_names or []
    codes = [names.index(n) for n in ("weights.parameter_update", "temporary.parameter_sized") if n in names]
    return bool(codes) and bool(np.isin(np.asarray(c.da.rule), codes).any())


def _annotated(c: _Ctx, words: str) -> bool:
    """A record_function region of this device whose name holds `words` (optimizer.step: torch's
    own `Optimizer.step#AdamW.step`; backward: a user's 'backward' region)."""
    snap = c.sf.stacks.snap if c.sf is not None else None
    anns = getattr(snap, "annotations", None) or ()
    dev = c.da.device
    for a in anns:
        if not isinstance(a, dict) or a.get("device") not in (None, dev):
            continue
        name = str(a.get("name", "")).lower()
        if words == "backward" and name in ("backward", "bwd", "backward_pass"):
            return True
        if words != "backward" and words in name:
            return True
    return False


def _optimizer(c: _Ctx, step: Fact) -> Fact:
    if c.meta is not None and getattr(c.meta, "optimizer", None):
        return _fact(str(c.meta.optimizer), "torch", "the recorder's metadata names it")
    snap = c.sf.stacks.snap if c.sf is not None else None
    for a in (getattr(snap, "annotations", None) or ()):
        name = str(a.get("name", "")) if isinstance(a, dict) else ""
        cls = name[len("Optimizer.step#"):].split(".")[0] if name.startswith("Optimizer.step#") else ""
        if cls.isidentifier() and len(cls) <= 64 and "." in name[len("Optimizer.step#"):]:
            # an identifier only: the name is the file's (untrusted) text, printed on every surface
            return _fact(cls, "torch", f"the optimizer step's annotation (Optimizer.step#{cls}.step)")
    if c.sf is not None:
        opt_stacks = unique(np.concatenate([c.tstack[c.phase == P_OPTIMIZER], c.stack[c.da.category == _O]]))
        name = _optimizer_from_frames(c, opt_stacks[opt_stacks > 0])
        if name:
            return _fact(name, "stack", f"the optimizer's frames ({name})")
    if step.value:
        return _fact(None, "none", "an optimizer step ran, but its frames name no optimizer vramscope knows")
    return _fact(None, "none", "no optimizer step or state seen")


def _optimizer_from_frames(c: _Ctx, stacks) -> str:
    snap = c.sf.stacks.snap
    t = c.sf.stacks.table
    seen: dict[str, int] = {}
    for sid in stacks[:200].tolist():
        for f in c.sf.stacks.frame_ids(int(sid)).tolist():
            file = t.files[t.file_ids[f]]
            if "bitsandbytes/optim" in file:
                nm = "bitsandbytes 8-bit (paged)" if "paged" in t.names[t.name_ids[f]].lower() else "bitsandbytes 8-bit"
                seen[nm] = seen.get(nm, 0) + 1
                continue
            if "torch/optim/" not in file:
                continue
            stem = file.rsplit("/", 1)[-1].removesuffix(".py").lstrip("_")
            if stem in _OPTIM_FILES:
                seen[_OPTIM_FILES[stem]] = seen.get(_OPTIM_FILES[stem], 0) + 1
    del snap
    return max(seen, key=lambda k: seen[k]) if seen else ""


def _oom(c: _Ctx) -> tuple[Fact, Fact]:
    if c.n_allocs == 0:
        why = "no trace: an out-of-memory error is an entry of the trace"
        return _fact(None, "none", why), _fact(None, "none", why)
    ooms = np.flatnonzero(c.action == A_OOM)
    if not len(ooms):
        return (_fact(False, "torch", "no out-of-memory entry in the trace"),
                _fact(False, "torch", "no out-of-memory entry in the trace"))
    n = len(c.action)
    last = int(ooms[-1])
    truncated = bool(last == n - 1 or (n and c.phase[-1] == P_UNWIND))
    return (_fact(True, "torch", f"{len(ooms)} out-of-memory entr{'y' if len(ooms) == 1 else 'ies'} in the trace"),
            _fact(truncated, "torch", "the trace ends in the out-of-memory error and its unwinding: what the failed "
                                      "step would have done next is not in it" if truncated else
                  "the program went on after the out-of-memory error"))


def _checkpointing(c: _Ctx, backward: Fact) -> Fact:
    if not c.frames:
        return _fact(None, "none", "no frames: activation checkpointing shows only in them")
    if c.any_marked("checkpointing"):
        return _fact(True, "stack", "torch.utils.checkpoint's frames in the trace")
    if backward.value is False and c.n_allocs:
        return _fact(False, "stack", "no backward and no torch.utils.checkpoint frames")
    return _fact(False, "stack", "no torch.utils.checkpoint frames in the stacks")


def _adapters(c: _Ctx) -> Fact:
    if c.meta is not None and getattr(c.meta, "adapters", None):
        return _fact(True, "torch", "the recorder's metadata")
    if not c.frames:
        return _fact(None, "none", "no frames: adapters show only in them")
    if c.any_marked("adapters"):
        return _fact(True, "stack", "LoRA/PEFT frames in the stacks")
    return _fact(False, "stack", "no LoRA/PEFT frames in the stacks")


def _quantized(c: _Ctx) -> Fact:
    if c.any_marked("quant_4bit"):
        return _fact("4-bit", "stack", "4-bit quantization frames (bitsandbytes Linear4bit, dequantize_4bit)")
    if c.any_marked("quant_8bit"):
        return _fact("8-bit", "stack", "8-bit quantization frames (bitsandbytes Int8)")
    if np.any(c.evidenced & (c.da.category == _Q) & (c.fi < 0)):
        return _fact("quantized", "stack", "quantized weights made by a quantization library")
    if not c.frames:
        return _fact(None, "none", "no frames: quantization shows only in them")
    return _fact(False, "stack", "no quantization library's frames")


def _grad_mode(c: _Ctx) -> tuple[bool | None, str, str]:
    """(grad enabled in the forward passes, evidence, why) for a trace without a backward."""
    if c.any_marked("graph_release"):
        return True, "stack", "autograd graphs were let go of (their nodes deleted with saved tensors)"
    fwd = np.flatnonzero((c.ai >= 0) & (c.phase[np.clip(c.ai, 0, max(len(c.phase) - 1, 0))] == P_FORWARD)) \
        if len(c.phase) else np.zeros(0, dtype=np.int64)
    if not len(fwd):
        return None, "none", "no forward pass"
    under = c.marked("no_grad", c.stack[fwd])
    if under.mean() >= NO_GRAD_SHARE:
        return False, "stack", "the forward passes run under @torch.no_grad / @torch.inference_mode"
    # alive at the end of each forward pass: saved for a backward (grad on) or freed as the next
    # op consumed them (no_grad)
    shares = []
    # each forward run's rows by a search of the forward rows' entries (ascending in row order;
    # sorted once where not), not a pass over all of them per run: a trace of thousands of
    # forward runs of a few allocations each (none of them enough to tell) made it quadratic
    at = c.ai[fwd]
    if len(at) > 1 and not bool(np.all(at[1:] >= at[:-1])):
        o = np.argsort(at, kind="stable")
        fwd, at = fwd[o], at[o]
    runs = c.da.phase_runs("forward")
    # (the runs' bounds in the entries' own type: numpy casts `at` whole to a wider one)
    lo = np.searchsorted(at, runs[:, 0].astype(at.dtype, copy=False), side="left")
    hi = np.searchsorted(at, runs[:, 1].astype(at.dtype, copy=False), side="right")
    for k in np.flatnonzero(hi - lo >= 4)[:8].tolist():       # the first 8 runs of 4 rows or more
        f = c.fi[fwd[lo[k]:hi[k]]]
        shares.append(float(np.mean((f < 0) | (f > runs[k, 1]))))
    if not shares:
        return None, "none", "too few forward allocations to tell"
    share = float(np.median(shares))
    if share >= GRAD_MODE_SHARE:
        return True, "lifetime", (f"{share:.0%} of a forward's allocations outlive it (saved for a backward): "
                                  f"grad enabled")
    return False, "lifetime", (f"{share:.0%} of a forward's allocations outlive it: each op's output freed as "
                               f"the next consumed it, as under no_grad")


def _kind(c: _Ctx, recorded: Fact, backward: Fact, step: Fact, moments: bool) -> Fact:
    if recorded.value != "trace":
        if moments:
            return _fact("training", "guess", "no trace, but blocks sized like weights, gradients and Adam's two "
                                              "moments beside each other")
        return _fact(None, "none", "no trace: what the run did cannot be seen")
    if backward.value and step.value:
        return _fact("training", min(backward.evidence, step.evidence, key=_EV.index),
                     "a backward and an optimizer step ran")
    if backward.value and step.value is None:
        return _fact("training", "guess", "a backward ran, and an optimizer's zero_grad: its step is not seen")
    if backward.value:
        return _fact("forward_backward", backward.evidence, "a backward ran and no optimizer step")
    if backward.value is False and step.value:
        return _fact("training", step.evidence, "forward passes and parameter updates without a backward "
                                                "(zeroth-order training)")
    if backward.value is None:
        return _fact(None, "none", backward.why)
    grad, ev, why = _grad_mode(c)
    if grad is None:
        return _fact(None, "none", why)
    if grad:
        return _fact("forward_with_grad", ev, "forward passes with grad enabled and no backward: " + why)
    return _fact("inference", ev, "forward passes only: " + why)


_EV = ("torch", "stack", "lifetime", "guess", "none")


def _autocast(c: _Ctx) -> tuple[Fact, np.ndarray]:
    """(the fact, bool per row: a 16-bit copy of a weight made by autocast: rule weights.autocast_copy)."""
    names = c.da.rule_names or []
    code = names.index("weights.autocast_copy") if "weights.autocast_copy" in names else -1
    rows = np.asarray(c.da.rule) == code if code >= 0 else np.zeros(len(c.size), dtype=bool)
    if c.n_allocs == 0:
        return _fact(None, "none", "no trace: autocast's copies are made in the forward"), rows
    if rows.any():
        n = int(rows.sum())
        if c.marked("autocast_cast", c.stack[rows]).any():
            return _fact(True, "stack", f"autocast's casts (at::autocast) made {n} 16-bit copies of weights in the "
                                        f"forward"), rows
        return _fact(True, "lifetime", f"the forward makes {n} half-size copies of weight matrices, each inside the "
                                       f"op that reads it: fp32 weights cast to 16 bits (autocast)"), rows
    w = c.size[(c.da.category == _W) & (c.size >= 64 * 1024)]
    if not bool((c.phase == P_FORWARD).any()):
        return _fact(None, "none", "no forward pass: autocast shows in its copies of the weights"), rows
    if len(w) < 2:
        return _fact(None, "none", "too few weight matrices seen to tell autocast's copies from activations"), rows
    return _fact(False, "lifetime", "the forward makes no half-size copy of the weight matrices"), rows


def _moments_pattern(c: _Ctx) -> bool:
    """Frameless blocks in fours of a size: a weight, its gradient and Adam's two moments."""
    cnt = _counts(c.size[(c.ai < 0) & ~c.row_frames & (c.size >= 1 << 20)])
    if not cnt:
        return False
    fours = sum(s * n for s, n in cnt.items() if n % 4 == 0)
    return fours >= 0.8 * sum(s * n for s, n in cnt.items())


def _models(c: _Ctx) -> tuple[Fact, Fact]:
    """(models alive, a model held twice): families of weight shapes built by different calls."""
    cat = c.da.category
    names = c.da.rule_names or []
    copy = names.index("weights.autocast_copy") if "weights.autocast_copy" in names else -1
    # the model's weights: kept (never freed, or alive at the peak), not autocast's copies
    keep = (c.fi < 0) | c.da.live_mask(c.da.peak.index)
    w = np.flatnonzero((cat == _W) & (c.size >= 4096) & keep & (np.asarray(c.da.rule) != copy))
    if not len(w):
        why = "no weights seen"
        return _fact(None, "none", why), _fact(None, "none", why)
    framed = w[c.row_frames[w]]
    families: dict = {}
    sure: dict = {}             # family -> whether any of its rows is a weight by evidence, not a guess
    if len(framed) and c.sf is not None:
        sites = _build_sites(c, c.stack[framed])
        for r, s in zip(framed.tolist(), sites):
            families.setdefault(s, []).append(int(c.size[r]))
            sure[s] = sure.get(s, False) or bool(c.evidenced[r])
    # frameless weights (made before recording): one family, or two where a set of them has
    # gradients and another, of other shapes, has none (a model trained before, alive beside one
    # that only runs forward; not adapters on a frozen base)
    rest = w[~isin(w, framed)]
    framed_sizes = set(c.size[framed].tolist())
    split_ev = "guess"
    if len(rest) and not (set(c.size[rest].tolist()) & framed_sizes):
        g_sizes = set(c.size[cat == _G].tolist())
        with_g = rest[isin(c.size[rest], list(g_sizes))] if g_sizes else rest[:0]
        without = rest[~isin(rest, with_g)]
        a, b = set(c.size[with_g].tolist()), set(c.size[without].tolist())
        big = c.size[rest].sum()
        if (len(with_g) and len(without) and not (a & b) and not c.adapters
                and min(c.size[with_g].sum(), c.size[without].sum()) >= 0.1 * big and len(b) >= 4):
            families[("grads",)] = c.size[with_g].tolist()
            families[("nograds",)] = c.size[without].tolist()
        else:
            families[("pre",)] = c.size[rest].tolist()
    elif len(rest):
        families[("pre",)] = c.size[rest].tolist()
    if not len(framed) and c.n_allocs == 0:
        why = "a state-only dump's weights without frames: which model each belongs to cannot be told"
        return _fact(None, "none", why), _fact(None, "none", why)
    total = float(c.size[w].sum())
    big_f = {k: v for k, v in families.items() if sum(v) >= 0.05 * total}
    shapes = [tuple(sorted(v)) for v in big_f.values()]
    distinct = sorted(set(shapes), key=shapes.index)
    twice = len(distinct) < len(shapes)
    held_ev = "stack"
    # a second family of the same shapes whose tensors are weights only by a guess (made in an
    # __init__ that is not torch.nn's, or by code outside the model): per-parameter state (an
    # estimator's or a hand-written optimizer's buffers, one beside each weight) reads the same
    # as a copy of the model; which one it is, the frames do not say
    per_shape: dict = {}
    for k, sh in zip(big_f, shapes):
        per_shape.setdefault(sh, []).append(sure.get(k, True))
    guessed_copy = twice and not any(sum(v) >= 2 for v in per_shape.values() if len(v) >= 2)
    if not twice and len(distinct) == 1:
        cnt = _counts(distinct[0])
        # a model has some shape once (an embedding, a final norm: an odd count); held twice, none
        if len(cnt) >= 5 and sum(cnt.values()) >= 64 and all(n % 2 == 0 for n in cnt.values()):
            twice, held_ev = True, "guess"
    ev = "stack" if len(framed) and not len(rest) else split_ev
    n = len(distinct)
    if not n:
        return _fact(None, "none", "weights too small to tell"), _fact(None, "none", "")
    flat = names.index("gradients.buffer") if "gradients.buffer" in names else -1
    flat_bytes = int(c.size[np.asarray(c.da.rule) == flat].sum()) if flat >= 0 else 0
    if n == 1 and flat_bytes:
        # Megatron's, DeepSpeed's or FSDP's flat buffers hold parameters of models whose shapes are
        # not seen tensor by tensor: one family seen says nothing about the others
        why = (f"one family of weight shapes seen, but {_fmt(flat_bytes)} of flat parameter/gradient buffers "
               f"(Megatron, DeepSpeed, FSDP) hold models whose weights cannot be told apart by shape")
        return _fact(None, "none", why), _fact(None, "none", why)
    words = {1: "one family of weight shapes", 2: "two families of weight shapes, built by different calls"}
    if ("grads",) in big_f:
        words[2] = ("two families of weight shapes: one with gradients, one of other shapes without (a model "
                    "trained before, alive beside the one running now)")
    sizes = sorted((int(sum(v)) for v in big_f.values()), reverse=True)
    words = {k: v + " (" + " + ".join(_fmt(b) for b in sizes) + " of weights)" for k, v in words.items()}
    models = _fact(n, ev, words.get(n, f"{n} families of weight shapes, built by different calls ("
                                       + " + ".join(_fmt(b) for b in sizes) + " of weights)"))
    if twice and guessed_copy:
        why = ("two calls built the same weight shapes, one of them outside torch.nn (its tensors weights only "
               "by a guess): the model held twice (a copy, EMA), or a buffer beside each parameter (an "
               "estimator's or a hand-written optimizer's state); the frames do not say which")
    elif twice:
        why = ("every weight shape comes an even number of times, the embeddings and final norms too: the "
               "model's parameters are held twice (a copy, EMA, or a second load)" if held_ev == "guess" else
               "two calls built the same weight shapes: the model is held twice (a copy, EMA, a reference model)")
    else:
        why = "no family of weight shapes appears twice"
    held = _fact(None, "none", why) if guessed_copy else _fact(twice, held_ev if twice else ev, why)
    return models, held


def _fmt(b: int) -> str:
    from ..common.units import fmt_bytes
    return fmt_bytes(int(b))


def _build_sites(c: _Ctx, stacks) -> list:
    """Per stack: the user's frames (file, line) from the outermost in, up to the first frame of a
    library: the call that built the tensor."""
    t = c.sf.stacks.table
    out = []
    cache: dict = {}
    for sid in stacks.tolist():
        s = cache.get(sid)
        if s is None:
            fr = c.sf.stacks.frame_ids(int(sid))[::-1]
            if c.sf.stacks.outer_first[sid]:
                fr = fr[::-1]
            site = []
            for f in fr.tolist():
                file = t.files[t.file_ids[f]]
                if not file.endswith(".py") and "(" not in file:
                    continue
                if is_library_file(file):
                    break
                site.append((file, int(t.line[f])))
            s = cache[sid] = tuple(site[:-1]) if len(site) > 1 else tuple(site)
        out.append(s)
    return out


def _trainable(c: _Ctx, backward: Fact):
    """(trainable share of the weights seen, frozen weights seen)."""
    cat = c.da.category
    names = c.da.rule_names or []
    copy = names.index("weights.autocast_copy") if "weights.autocast_copy" in names else -1
    w_rows = np.flatnonzero(c.evidenced & (cat == _W) & (np.asarray(c.da.rule) != copy))
    g_rows = np.flatnonzero(cat == _G)
    w_bytes = int(c.size[w_rows].sum())
    share = None
    trainable = 0
    if g_rows.size and w_bytes:
        wc, gc = _counts(c.size[w_rows]), _counts(c.size[g_rows])
        trainable = max(_matched_bytes(wc, gc, r) for r in GRAD_RATIOS)
        share = trainable / w_bytes
    frozen = bool(w_bytes) and bool(backward.value) and trainable < 0.5 * w_bytes
    meta = c.meta
    if meta is not None and meta.trainable is not None and meta.frozen is not None and not meta.params_not_on_gpu:
        n_t, n_f = meta.trainable_params or 0, meta.frozen_params or 0
        if n_t + n_f:
            share = n_t / (n_t + n_f)
            frozen = n_f > 0
    elif not backward.value:
        share = None            # a trainable share is only observed where gradients were made
    return share, frozen


def _model_kind(c: _Ctx) -> str:
    """'transformer' (attention in the forward), 'cnn' (convolutions), 'mlp' (neither), '' (no
    forward with frames): which measured families a lever's band may speak for."""
    ph = c.phase
    if not len(ph):
        return ""
    fwd = (c.ai >= 0) & c.row_frames
    fwd &= ph[np.clip(c.ai, 0, len(ph) - 1)] == P_FORWARD
    if not fwd.any():
        return ""
    st = c.stack[fwd]
    b = c.size[fwd].astype(np.float64)
    att = float(b[c.marked("attention_op", st)].sum())
    conv = float(b[c.marked("conv_op", st)].sum())
    if att == 0 and conv == 0:
        return "mlp"
    return "transformer" if att >= conv else "cnn"


def run_facts(da, sfacts) -> RunFacts:
    c = _Ctx(da, sfacts)
    recorded = _recorded(c)
    backward = _phase_fact(c, P_BACKWARD, "a backward", "backward")
    step = _phase_fact(c, P_OPTIMIZER, "an optimizer step", "optimizer.step")
    if step.value is False and _manual_update(c):
        step = _fact(True, "lifetime", "no optimizer, but one tensor the size of each weight made outside the model "
                                       "every step: the parameters updated by hand (zeroth-order, or a manual SGD)")
    elif step.value is False and c.any_marked("zero_grad", entries_only=True):
        step = _fact(None, "none", "an optimizer's zero_grad ran, but no step allocated anything (plain SGD updates "
                                   "in place): whether a step ran cannot be seen")
    optimizer = _optimizer(c, step)
    oom, truncated = _oom(c)
    moments = recorded.value == "state_only" and _moments_pattern(c)
    kind = _kind(c, recorded, backward, step, moments)
    autocast, copies = _autocast(c)
    models, held = _models(c)
    pre = int(c.size[c.ai < 0].sum())
    live_before = _fact(pre, "torch", "blocks live when the trace began (no allocation of theirs in it)"
                        if recorded.value == "trace" else "no trace: every block was live before it")
    share, frozen = _trainable(c, backward)
    peak_live = da.live_mask(da.peak.index) if len(c.size) else np.zeros(0, dtype=bool)
    return RunFacts(
        recorded=recorded, kind=kind, backward=backward, optimizer_step=step, optimizer=optimizer, oom=oom,
        truncated_by_oom=truncated, checkpointing=_checkpointing(c, backward), autocast=autocast,
        adapters=_adapters(c), quantized=_quantized(c), models_alive=models, model_held_twice=held,
        live_before_recording_bytes=live_before,
        frames=c.frames, forward_seen=bool((c.phase == P_FORWARD).any()), model_kind=_model_kind(c),
        pretrained_load=bool(c.marked("pretrained_load", c.stack).any()), frozen_weights=frozen,
        trainable_share=share, moments_pattern=moments,
        autocast_copy_bytes=int(c.size[copies & peak_live].sum()),
        peak_evidenced_bytes=int(c.size[peak_live & c.evidenced].sum()),
        peak_guessed_bytes=int(c.size[peak_live & ~c.evidenced].sum()))


def autocast_copy_rows(da, sfacts) -> np.ndarray:
    """bool per row: a 16-bit copy of a weight that autocast made in a forward."""
    return _autocast(_Ctx(da, sfacts))[1]


def cublas_workspace_size(size: int) -> bool:
    """A size cuBLAS allocates its workspace in (per handle and stream: CUBLAS_WORKSPACE_CONFIG
    :4096:2:16:8 before Hopper, :4096:8 (32 MiB) on Hopper)."""
    return int(size) in _CUBLAS_WORKSPACES


__all__ = ["run_facts", "autocast_copy_rows", "cublas_workspace_size"]
