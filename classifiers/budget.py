"""What the napkin math expects, against what the snapshot measured (DESIGN.md §8).

    b = budget(an, device)                  # -> Budget (frozen): rows + the inferred facts
    b.to_json()                             # the "budget" list of `vramscope whatif --json`

From the snapshot alone we infer what sizes and lifetimes tell:
  * parameters: the `weights` tensors live at the peak (or at the end of the first
    iteration when the peak comes before training); trainable ones are those whose size
    matches a gradient's (same dtype, or gradients twice / half the size), else an
    optimizer state's; the rest are frozen;
  * the dtype, where sizes tell: gradients twice the weights (16-bit weights, fp32
    gradients), a weight size that is 2 (mod 4) bytes (16-bit) or odd (8-bit), 16-bit
    copies of most weights made in every forward (fp32 weights under autocast), 8-bit
    optimizer states a quarter / half of their parameter (fp32 / 16-bit parameters);
    otherwise fp32 is assumed and said so;
  * the optimizer, from the frames of its state's allocations (torch.optim, bitsandbytes)
    or the step's record_function annotation, and its measured bytes per parameter;
  * 4-bit quantized weights: persistent `quantization` tensors that pair up as packed
    weights (n/2 bytes for n parameters) with their absmax constants (n/64 fp32: 1/8 of
    the packed size; double quantization n/64 uint8: 1/32);
  * input tokens, when `inputs` tensors are visible: the largest one read as int64 ids.
Each category gets its measured bytes (at the peak and its maximum over the run), the
expectation from those facts with its formula in words, and a note with the likely reason
when they differ by more than 15%. Expectations are heuristics: they say so.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..common.units import fmt_bytes
from .categories import CATEGORIES
from .category_live import CategoryLive
from .evidence import E_GUESS
from .iterations import starts_ends
from .timeline import PHASE_NAMES

TOLERANCE = 0.15                 # relative difference above which a row is flagged
SMALL_TERM = 1 << 20             # parameters under this many bytes (or ...
SMALL_SHARE = 0.01               # ... this share of the peak) are a handful: no ratio against them
UNCOUNTED_TOLERANCE = 0.05       # guessed weights left out of the count above this share: no trainable share
GRAD_RATIOS = (1.0, 2.0, 0.5)    # gradient bytes / weight bytes of one parameter tensor
QUANT_RATIOS = (8, 16, 32, 64)   # packed 4-bit bytes / constant bytes of one tensor
ADAPTER_NUMEL_PAGED = 100_000    # bitsandbytes pages optimizer state of tensors this large or larger

_I = {c: i for i, c in enumerate(CATEGORIES)}
_P_FORWARD = PHASE_NAMES.index("forward")
_P_OPTIMIZER = PHASE_NAMES.index("optimizer")


@dataclass(frozen=True)
class BudgetRow:
    category: str           # a CATEGORIES name, or "total"
    measured: int           # live bytes at the peak
    measured_max: int       # highest live bytes over the run
    expected: int | None    # napkin-math bytes; None when the snapshot cannot tell
    formula: str            # the expectation in words, with the numbers used
    note: str               # "" when within 15%, else the likely reason

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BudgetFacts:
    """What the snapshot tells about the model and its training (bytes, counts)."""
    weight_bytes: int
    trainable_weight_bytes: int
    frozen_weight_bytes: int
    trainable_params: int
    frozen_params: int
    trainable_dtype_bytes: float        # bytes per trainable parameter (4.0 when assumed)
    frozen_dtype_bytes: float
    dtype_evidence: str                 # how the dtypes were found, or "assumed fp32"
    gradient_ratio: float | None        # gradient bytes / weight bytes of matched tensors
    gradient_bytes: int                 # gradients live at their maximum
    optimizer: str                      # "AdamW", "SGD", "bitsandbytes 8-bit", ..., "none seen"
    optimizer_evidence: str
    optimizer_bytes: int                # optimizer state at its maximum
    optimizer_bytes_per_param: float | None
    quantized_params: int
    quant_scheme: str                   # "" when no 4-bit weights were recognized
    quant_packed_bytes: int
    quant_constant_bytes: int
    input_tokens: int | None
    activation_bytes_per_token: float | None
    guessed_bytes: dict | None = None   # {category: bytes} at the reference moment that are guesses (weights: those not counted)
    counts_allowed: bool = True         # False: a state dump or no frames, so no parameter counts at all

    @property
    def trainable_fraction(self) -> float | None:
        """Trainable share of the parameters; None when it cannot be told (no parameters
        counted, or weights that are a guess were left out of the count)."""
        total = self.trainable_params + self.frozen_params + self.quantized_params
        left = (self.guessed_bytes or {}).get("weights", 0)
        if left > UNCOUNTED_TOLERANCE * (self.weight_bytes + left):
            return None
        return self.trainable_params / total if total else None

    def to_json(self) -> dict:
        d = asdict(self)
        d["trainable_fraction"] = self.trainable_fraction
        return d


@dataclass(frozen=True)
class Budget:
    device: int
    peak_bytes: int
    peak_index: int
    rows: tuple            # BudgetRow per category with bytes or an expectation, then "total"
    facts: BudgetFacts

    def row(self, category: str) -> BudgetRow | None:
        return next((r for r in self.rows if r.category == category), None)

    def to_json(self) -> list:
        return [r.to_json() for r in self.rows]


# -- inference helpers ---------------------------------------------------------------------
def _live_rows(da, index: int, cat: int, evidenced_only: bool = True) -> np.ndarray:
    """Rows of category `cat` live right after entry `index`; with `evidenced_only`, only
    those whose category has evidence (torch, stack, lifetime): counts never rest on guesses."""
    a = da.allocs
    live = (a.alloc_index <= index) & ((a.free_index < 0) | (a.free_index > index)) & (da.category == cat)
    if evidenced_only:
        live &= da.evidence < E_GUESS
    return np.flatnonzero(live)


def _guessed_at(da, index: int) -> dict:
    """{category: bytes} live right after entry `index` whose category is a guess."""
    a = da.allocs
    live = (a.alloc_index <= index) & ((a.free_index < 0) | (a.free_index > index)) & (da.evidence >= E_GUESS)
    b = np.bincount(da.category[live], weights=a.size[live].astype(np.float64), minlength=len(CATEGORIES))
    return {c: int(v) for c, v in zip(CATEGORIES, b) if v}


def _category_max_moment(da, cat: int) -> int:
    """The first entry where category `cat` reaches its highest live bytes (-1: start)."""
    a = da.allocs
    rows = np.flatnonzero(da.category == cat)
    if not len(rows):
        return -1
    ai, fi, sz = a.alloc_index[rows], a.free_index[rows], a.size[rows].astype(np.int64)
    start = int(sz[ai < 0].sum())
    ev = np.concatenate([ai[ai >= 0], fi[fi >= 0]]).astype(np.int64)
    dv = np.concatenate([sz[ai >= 0], -sz[fi >= 0]])
    if not len(ev):
        return -1
    order = np.argsort(ev, kind="stable")
    cum = np.cumsum(dv[order]) + start
    k = int(np.argmax(cum))
    return int(ev[order][k]) if cum[k] > start else -1


def _counts(sizes) -> dict:
    u, c = np.unique(np.asarray(sizes, dtype=np.int64), return_counts=True)
    return dict(zip(u.tolist(), c.tolist()))


def _match(w_counts: dict, other_counts: dict, ratio: float):
    """Tensors of `w_counts` with a partner of `ratio` times their size in `other_counts`:
    ({weight size: matched count}, matched weight bytes)."""
    out, total = {}, 0
    for s, n in w_counts.items():
        t = s * ratio
        if t != int(t):
            continue
        k = min(n, other_counts.get(int(t), 0))
        if k:
            out[s] = k
            total += k * s
    return out, total


def _stack_text(snap, stack_ids) -> str:
    parts = []
    for sid in np.unique(np.asarray(stack_ids, dtype=np.int64)).tolist()[:200]:
        if sid < 0:
            continue
        for fid in snap.stack(int(sid)).tolist():
            line = snap.strings[snap.frame_file[fid]] + ":" + snap.strings[snap.frame_name[fid]]
            if ".py" in line:        # Python frames (and the profiler's "file.py(N): name"), not C++ symbols
                parts.append(line)
    return "\n".join(parts).lower().replace("\\", "/")


def _optimizer_kind(an, da, opt_rows, recorded=None) -> tuple[str, str]:
    """(kind, evidence) from the recorder's metadata, else the state's allocation frames,
    else the step annotation."""
    text = _stack_text(an.snapshot, da.allocs.stack[opt_rows]) if len(opt_rows) else ""
    ann = " ".join(str(a.get("name", "")) for a in (an.snapshot.annotations or []) if isinstance(a, dict)).lower()
    cls = recorded.optimizer if recorded is not None and recorded.optimizer else ""
    for src, where in ((cls.lower(), f"the recorder's metadata ({cls})"), (text, "the optimizer state's frames"),
                       (ann, "the optimizer step's annotation")):
        if not src:
            continue
        if "bitsandbytes/optim" in src or "bitsandbytes.optim" in src or "8bit" in src:
            return ("bitsandbytes paged 8-bit" if "paged" in src else "bitsandbytes 8-bit"), where
        for key, name in (("adamw", "AdamW"), ("adam", "Adam"), ("sgd", "SGD"), ("lion", "Lion"),
                          ("adagrad", "Adagrad"), ("rmsprop", "RMSprop"), ("adafactor", "Adafactor")):
            if key in src:
                return name, where
    if len(opt_rows):
        return "unrecognized", "optimizer-state allocations whose frames name no known optimizer"
    return "none seen", "no optimizer-state allocations"


def _close(m, e) -> bool:
    return e is not None and e > 0 and abs(m - e) <= TOLERANCE * e


def _near(x, target) -> bool:
    return abs(x - target) <= TOLERANCE * target


def _dtype_name(b: float) -> str:
    return {4.0: "fp32", 2.0: "16-bit", 1.0: "8-bit", 0.5: "4-bit"}.get(float(b), f"{b:g} B")


def recorded_model(an, device: int):
    """The recorder's metadata (parsers/metadata.py) when it counts the model of `device`'s
    process: parameters given, the file's device (or its only device), and every parameter
    on the GPU when dumped (offloaded ones are not in this memory). None otherwise."""
    meta = an.snapshot.metadata
    if meta is None or meta.trainable is None or meta.frozen is None or meta.params_not_on_gpu:
        return None
    if (meta.device is not None and meta.device != device) or (meta.device is None and len(an.devices) > 1):
        return None
    return meta


def _recorded_counts(meta, four_bit: bool):
    """(trainable bytes, frozen bytes, trainable and frozen parameters, their bytes per
    parameter, the evidence in words, 4-bit packed uint8 elements) from the metadata. With
    4-bit weights found, frozen uint8 parameters are those packed weights: the
    quantization row counts them, not the frozen weights."""
    frozen = [p for p in meta.frozen if not (four_bit and p.dtype == "uint8")]
    packed = sum(p.count for p in meta.frozen if four_bit and p.dtype == "uint8")
    t_bytes, f_bytes = meta.trainable_bytes, sum(p.bytes for p in frozen)
    n_t, n_f = meta.trainable_params, sum(p.count for p in frozen)
    tb = t_bytes / n_t if n_t else 4.0
    fb = f_bytes / n_f if n_f else tb

    def said(counts):
        return " + ".join(f"{p.count:,} {p.dtype}" for p in counts) or "none"
    words = f"the recorder's metadata ({said(meta.trainable)} trainable; {said(frozen)} frozen)"
    return t_bytes, f_bytes, n_t, n_f, tb, fb, words, packed


# -- the budget -----------------------------------------------------------------------------
def budget(an, device: int, model: CategoryLive | None = None) -> Budget:
    """The napkin-math budget of one device (see the module docstring)."""
    da = an.devices[device]
    cl = model if model is not None else CategoryLive.build(da)
    a = da.allocs
    size = np.asarray(a.size, dtype=np.int64)
    base = cl.peak()
    peak_index = base.index
    at_peak = {c: int(v) for c, v in zip(cl.categories, cl.live_at(peak_index))}
    mx = cl.max_bytes
    measured = {c: at_peak.get(c, 0) for c in CATEGORIES}
    measured_max = {c: mx.get(c, 0) for c in CATEGORIES}

    # the moment whose weights are the model's: the peak, unless it comes before training
    tl = da.timeline
    ref = peak_index
    if da.iterations and tl is not None and tl.first_start >= 0 and peak_index < tl.first_start:
        ref = da.iterations[0].end_index
    # parameter counts rest on evidence: weights seen (torch, stack, lifetime), and weights that
    # are a guess (made before recording, no frames) only where a gradient seen matches them
    counts_allowed = da.run.recorded.value == "trace" and da.run.frames
    none = np.zeros(0, dtype=np.int64)
    w_all = _live_rows(da, ref, _I["weights"], evidenced_only=False) if counts_allowed else none
    copy = da.rule_names.index("weights.autocast_copy") if "weights.autocast_copy" in (da.rule_names or []) else -1
    w_all = w_all[np.asarray(da.rule)[w_all] != copy]          # autocast's copies are not parameters
    w_seen = w_all[da.evidence[w_all] < E_GUESS]
    w_counts = _counts(size[w_all])
    seen_counts = _counts(size[w_seen])
    guessed = _guessed_at(da, ref)

    # trainable: weights with a gradient partner (else an optimizer-state partner)
    g_rows = _live_rows(da, _category_max_moment(da, _I["gradients"]), _I["gradients"]) if counts_allowed else none
    g_counts = _counts(size[g_rows])
    gradient_bytes = int(size[g_rows].sum())
    o_rows_all = np.flatnonzero(da.category == _I["optimizer"])
    o_rows = _live_rows(da, _category_max_moment(da, _I["optimizer"]), _I["optimizer"])
    optimizer_bytes = int(size[o_rows].sum())
    recorded = recorded_model(an, device)
    kind, kind_evidence = _optimizer_kind(an, da, o_rows_all, recorded)

    best: tuple[dict, int, float | None] = ({}, 0, None)
    for r in GRAD_RATIOS:
        m, t = _match(w_counts, g_counts, r)
        if t * r > best[1] * (best[2] or 1):
            best = (m, t, r)
    trainable, t_bytes, g_ratio = best
    trainable_from = "gradients"
    o_counts = _counts(size[o_rows])
    if not t_bytes and optimizer_bytes:
        ratios = (0.25, 0.5) if kind.startswith("bitsandbytes") else (1.0, 2.0)
        for r in ratios:
            m, t = _match(w_counts, o_counts, r)
            if t > t_bytes:
                trainable, t_bytes = m, t
        trainable_from = "optimizer state"
    # frozen: the weights seen that no gradient (or state) matched; guessed ones are not counted
    frozen_counts = {sz: max(0, k - trainable.get(sz, 0)) for sz, k in seen_counts.items()}
    frozen_bytes = sum(sz * k for sz, k in frozen_counts.items())
    weight_bytes = t_bytes + frozen_bytes
    uncounted = int(size[w_all].sum()) - weight_bytes
    if uncounted > 0:
        guessed["weights"] = uncounted
    else:
        guessed.pop("weights", None)

    # dtypes, where sizes tell
    evidence = []
    tb = fb = None
    if g_ratio == 2.0 and t_bytes:
        tb = 2.0
        evidence.append("gradients are twice their weights: 16-bit weights with fp32 gradients")
    elif g_ratio == 0.5 and t_bytes:
        tb = 4.0
        evidence.append("gradients are half their weights: fp32 weights with 16-bit gradients")
    if kind.startswith("bitsandbytes") and t_bytes and tb is None:
        st = _match(trainable, o_counts, 0.25)[1]
        if st >= 0.5 * t_bytes:
            tb = 4.0
            evidence.append("8-bit optimizer states are a quarter of their parameters: fp32 parameters")
        elif _match(trainable, o_counts, 0.5)[1] >= 0.5 * t_bytes:
            tb = 2.0
            evidence.append("8-bit optimizer states are half their parameters: 16-bit parameters")
    t_sizes = np.array([s for s in trainable for _ in range(trainable[s])], dtype=np.int64)
    f_counts = frozen_counts
    f_sizes = np.array([s for s, k in f_counts.items() for _ in range(k)], dtype=np.int64)
    for label, sizes, cur in (("trainable", t_sizes, tb), ("frozen", f_sizes, fb)):
        if cur is not None or not len(sizes):
            continue
        big = sizes[sizes >= 64]
        if len(big) and (big % 2 == 1).any():
            val = 1.0
        elif len(big) and (big % 4 == 2).any():
            val = 2.0
        else:
            continue
        evidence.append(f"some {label} weight sizes are {'odd' if val == 1 else '2 (mod 4)'} bytes: "
                        f"{_dtype_name(val)} {label} weights")
        if label == "trainable":
            tb = val
        else:
            fb = val
    if (tb is None or fb is None) and weight_bytes:
        # fp32 weights under 16-bit autocast: a half-size copy of (almost) every weight
        # matrix in every forward. Power-of-two sizes make chance partners common (an
        # embedding twice the logits, an adapter twice its activation), so it takes most
        # of the matrices (>= 64 KiB; norms are not cast) by count and by bytes.
        ai = a.alloc_index
        ph = tl.phase if tl is not None else np.zeros(0, np.uint8)
        fwd = (ai >= 0) & (da.category != _I["weights"]) & (da.category != _I["inputs"])
        if len(ph):
            fwd &= ph[np.clip(ai, 0, len(ph) - 1)] == _P_FORWARD
        n_it = max(1, len(da.iterations))
        copies = {s: c // n_it for s, c in _counts(size[fwd]).items()}
        mats = {s: k for s, k in w_counts.items() if s >= 64 * 1024}
        hit, hit_bytes = _match(mats, copies, 0.5)
        n_mats = sum(mats.values())
        if n_mats >= 2 and sum(hit.values()) >= 0.75 * n_mats and hit_bytes >= 0.5 * weight_bytes:
            evidence.append("every forward makes a half-size copy of most weight matrices: fp32 weights under "
                            "16-bit autocast")
            tb = 4.0 if tb is None else tb
            fb = 4.0 if fb is None else fb
    assumed = [label for label, cur, nbytes in (("trainable", tb, t_bytes), ("frozen", fb, frozen_bytes))
               if cur is None and nbytes]
    tb = 4.0 if tb is None else tb
    fb = (4.0 if frozen_bytes else tb) if fb is None else fb
    if assumed:
        evidence.append(f"sizes do not tell the {' or '.join(assumed)} weights' dtype: fp32 assumed")
    n_train = int(round(t_bytes / tb))
    n_frozen = int(round(frozen_bytes / fb))

    # 4-bit quantized weights: packed tensors paired with their absmax constants
    # (packed 4-bit weights and their constants, paired by size: the pairing is the check)
    q_rows = _live_rows(da, ref, _I["quantization"], evidenced_only=False) if counts_allowed else none
    if len(q_rows) and da.iterations:
        starts, ends = starts_ends(da.iterations)
        inside = np.flatnonzero((starts <= ref) & (ref <= ends))
        if len(inside):     # persistent = live across the whole iteration (dequantization scratch is not)
            s0, s1 = int(starts[inside[0]]), int(ends[inside[0]])
            fi = a.free_index[q_rows]
            q_rows = q_rows[(a.alloc_index[q_rows] < s0) & ((fi < 0) | (fi > s1))]
    q_counts = _counts(size[q_rows])
    q_best: tuple[int, int] = (0, 1)
    for k in QUANT_RATIOS:
        t = _match(q_counts, q_counts, 1.0 / k)[1]
        if t > q_best[0]:
            q_best = (t, k)
    packed, k = q_best
    q_scheme, n_q, q_per_param, const_bytes = "", 0, 0.0, 0
    if packed and packed * (1 + 1 / k) >= 0.5 * int(size[q_rows].sum()):     # pairs are most of it
        n_q = 2 * packed
        const_bytes = packed // k
        q_per_param = 0.5 + 1.0 / (2 * k)
        if k == 8:
            q_scheme = "4-bit (NF4/FP4), one fp32 absmax per 64 weights"
        elif k == 32:
            q_scheme = "4-bit (NF4/FP4), double-quantized absmax (one uint8 per 64 weights + fp32 per 256 blocks)"
            q_per_param += 4.0 / (64 * 256)
        else:
            q_scheme = f"4-bit, constants 1/{k} of the packed weights"
    else:
        packed = 0

    size_ratio = g_ratio if t_bytes and trainable_from == "gradients" else None
    if recorded is not None:
        (t_bytes, frozen_bytes, n_train, n_frozen, tb, fb, words, n_packed) = _recorded_counts(recorded, bool(packed))
        weight_bytes = t_bytes + frozen_bytes
        evidence = [words]
        guessed.pop("weights", None)           # counted exactly, guessed or not
        if packed:
            n_q = 2 * n_packed or n_q

    # input tokens (largest `inputs` tensor read as int64 ids)
    in_rows = np.flatnonzero(da.category == _I["inputs"])
    tokens = None
    if len(in_rows):
        biggest = int(size[in_rows].max())
        if biggest >= 8 and biggest % 8 == 0:
            tokens = biggest // 8
    act_peak = measured["activations"]
    per_token = (act_peak / tokens) if tokens and act_peak else None

    opt_bpp = (optimizer_bytes / n_train) if n_train and optimizer_bytes else None
    facts = BudgetFacts(
        weight_bytes=weight_bytes, trainable_weight_bytes=int(t_bytes), frozen_weight_bytes=int(frozen_bytes),
        trainable_params=n_train, frozen_params=n_frozen, trainable_dtype_bytes=float(tb),
        frozen_dtype_bytes=float(fb), dtype_evidence="; ".join(evidence),
        gradient_ratio=size_ratio,
        gradient_bytes=gradient_bytes, optimizer=kind, optimizer_evidence=kind_evidence,
        optimizer_bytes=optimizer_bytes, optimizer_bytes_per_param=opt_bpp, quantized_params=int(n_q),
        quant_scheme=q_scheme, quant_packed_bytes=int(packed), quant_constant_bytes=int(const_bytes),
        input_tokens=tokens, activation_bytes_per_token=per_token, guessed_bytes=guessed,
        counts_allowed=counts_allowed)

    rows = []
    ctx = _Context(an, da, cl, peak_index, facts, trainable, trainable_from, q_per_param, recorded is not None)
    for c in CATEGORIES:
        exp, formula, note = ctx.expect(c, measured[c], measured_max[c])
        if measured_max[c] == 0 and not exp:
            continue
        rows.append(BudgetRow(c, measured[c], measured_max[c], exp, formula, note))
    rows.append(ctx.total(rows, base.bytes))
    return Budget(device, base.bytes, peak_index, tuple(rows), facts)


class _Context:
    """The per-category expectations and notes of one budget."""

    def __init__(self, an, da, cl, peak_index, facts, trainable, trainable_from, q_per_param, recorded=False):
        self.an, self.da, self.cl = an, da, cl
        self.recorded = recorded
        self.peak_index = peak_index
        self.peak_bytes = int(cl.peak().bytes)
        self.f = facts
        self.trainable = trainable
        self.trainable_from = trainable_from
        self.q_per_param = q_per_param
        self.exp = {}

    def expect(self, c, m, x):
        fn = getattr(self, "_" + c, None)
        exp, formula, note = fn(m, x) if fn else (None, _NO_NAPKIN.get(c, ""), "")
        if c == "unknown" and m > TOLERANCE * max(1, sum(self.cl.live_at(self.peak_index).tolist())):
            note = (f"{fmt_bytes(m)} at the peak is unclassified: the other rows understate what "
                    f"is live (rules: classifiers/rules.toml)")
        self.exp[c] = exp
        return exp, formula, note

    # weights
    def _weights(self, m, x):
        f = self.f
        if not f.counts_allowed:
            return None, ("no parameter counts: " + ("a state-only snapshot" if self.da.run.recorded.value != "trace"
                                                     else "no allocation carries frames") +
                          " shows sizes, not which tensors are parameters"), ""
        e = f.weight_bytes
        how = (f"counts and dtypes exact, from {f.dtype_evidence}" if self.recorded else
               f"trainable = weights with a matching {self.trainable_from}; dtype: {f.dtype_evidence or 'from sizes'}")
        formula = (f"parameters{'' if self.recorded else ' live at the peak'}: {f.trainable_params:,} trainable x "
                   f"{f.trainable_dtype_bytes:g} B + {f.frozen_params:,} frozen x {f.frozen_dtype_bytes:g} B ({how})")
        note = ""
        g = (f.guessed_bytes or {}).get("weights", 0)
        if g > 0:
            formula += (f"; {fmt_bytes(g)} of weights are a guess (live before recording began, no frames, no "
                        f"gradient of their size) and are not counted")
        if e < max(SMALL_TERM, SMALL_SHARE * max(1, self.peak_bytes)):
            # a handful of parameters (a latent optimised while the models are frozen): no ratio against them
            if x > (1 + TOLERANCE) * e:
                note = f"{fmt_bytes(x)} of weights against {fmt_bytes(e)} of parameters counted: " + self._why_more()
            return e, formula, note
        if x > (1 + TOLERANCE) * e:
            note = f"weights reach {fmt_bytes(x)}, {x / e:.2f}x the parameters counted at some moment: " + self._why_more()
        elif not _close(m, e):
            note = f"the weights at the peak differ from the model's ({fmt_bytes(m)} vs {fmt_bytes(e)})"
        return e, formula, note

    def _why_more(self) -> str:
        """Why more weights than parameters are live: what the trace shows first, then what it may be."""
        run = self.da.run
        seen = []
        if run.models_alive.value and run.models_alive.value > 1:
            seen.append(f"{run.models_alive.value} models are alive ({run.models_alive.why})")
        if run.model_held_twice.value:
            seen.append("the model is held twice (" + run.model_held_twice.why + ")")
        if run.autocast_copy_bytes:
            seen.append(f"autocast's 16-bit weight copies ({fmt_bytes(run.autocast_copy_bytes)} at the peak)")
        guessed = (self.f.guessed_bytes or {}).get("weights", 0)
        if guessed:
            seen.append(f"{fmt_bytes(guessed)} of weights that are a guess are not in the count")
        if seen:
            return "; ".join(seen)
        return "not explained by what the trace shows (a dtype cast or copy while loading, or a second model)"

    def _gradients(self, m, x):
        f = self.f
        e = f.trainable_weight_bytes
        formula = (f"one gradient per trainable parameter in the parameters' dtype: "
                   f"{f.trainable_params:,} x {f.trainable_dtype_bytes:g} B")
        if _close(m, e):
            return e, formula, ""
        if e == 0 and x == 0:
            return e, formula + " (no trainable parameters seen)", ""
        if e == 0:
            return e, formula, ("gradients but no weight tensor of a matching size: parameters created before "
                                "the trace under other shapes (flattened FSDP/DeepSpeed buffers), or misclassified")
        if x == 0:
            bw = self.da.run.backward.value
            if bw:
                return e, formula, ("no gradient allocation although a backward ran: gradients accumulated in place "
                                    "into tensors made before the trace (read there as another category), or freed "
                                    "as they were used (an optimizer step in backward)")
            if bw is False:
                return e, formula, "no gradients on the GPU: no backward in the trace"
            return e, formula, "no gradients seen; whether a backward ran cannot be told from this file"
        why = []
        matched = int(e * (f.gradient_ratio or 1.0)) if self.trainable_from == "gradients" else 0
        unmatched = f.gradient_bytes - matched
        if f.gradient_ratio == 2.0 and _near(x, 2 * e):
            why.append("gradients twice the weights: fp32 gradients of 16-bit weights")
        elif unmatched > TOLERANCE * e:
            why.append(f"{fmt_bytes(unmatched)} of gradients match no weight tensor's size: misclassified, "
                       f"or gradients of tensors that are not weights")
        elif not _close(x, e):
            r = x / e
            why.append(f"{r:.2f}x the trainable weights: " + (
                "gradient copies (accumulation or communication buckets)" if r > 1 else
                "gradients freed as they are used (optimizer in backward, fused step)"))
        if m < (1 - TOLERANCE) * x:
            why.append(f"{'none' if m == 0 else 'not all'} live at the peak ({self._ptype()}): gradients are "
                       f"built during backward and freed by zero_grad(set_to_none=True)")
        return e, formula, "; ".join(why)

    def _optimizer(self, m, x):
        f = self.f
        n, b = f.trainable_params, f.trainable_dtype_bytes
        kind = f.optimizer
        t_bytes = f.trainable_weight_bytes
        if kind.startswith("bitsandbytes"):
            tensors = [(s, k) for s, k in self.trainable.items()]
            if "paged" in kind:
                small = sum(k * s for s, k in tensors if s / b < ADAPTER_NUMEL_PAGED)
                e = int(round(small / b * (2 + 8 / 256)))
                formula = (f"{kind}: two uint8 states + fp32 absmax per 256 values (2.03 B) per trainable "
                           f"parameter, only for tensors under {ADAPTER_NUMEL_PAGED:,} elements (larger ones "
                           f"are paged in unified memory, outside the caching allocator)")
            else:
                e = int(round(n * (2 + 8 / 256)))
                formula = f"{kind}: two uint8 states + fp32 absmax per 256 values: {n:,} x 2.03 B"
        elif kind in ("SGD",):
            e = t_bytes
            formula = f"SGD with momentum: one buffer per trainable parameter: {n:,} x {b:g} B (0 without momentum)"
        elif kind in ("Lion", "Adagrad", "RMSprop"):
            e = t_bytes
            formula = f"{kind}: one state per trainable parameter: {n:,} x {b:g} B"
        elif kind == "Adafactor":
            return None, "Adafactor: factored second moments (rows + columns per matrix): shapes not in the snapshot", ""
        elif kind == "none seen" and not self.da.run.optimizer_step.value:
            return None, ("no optimizer seen (no step and no state in the trace): none expected, none assumed"), ""
        else:
            name = kind if kind in ("AdamW", "Adam") else (
                "AdamW assumed (a step ran, no optimizer state seen)" if kind == "none seen" else
                "AdamW assumed (" + kind + ")")
            e = 2 * t_bytes
            formula = (f"{name}: exp_avg + exp_avg_sq in the parameters' dtype: 2 x {n:,} x {b:g} B "
                       f"(= {2 * b:g} B per trainable parameter)")
        if _close(m, e) or (e == 0 and x == 0):
            return e, formula, ""
        if e == 0:
            return e, formula, "optimizer state but no parameter recognized as trainable"
        phase = self.da.timeline.phase if self.da.timeline is not None else np.zeros(0, np.uint8)
        stepped = bool((phase == _P_OPTIMIZER).any()) or any(
            "optimizer.step" in str(a.get("name", "")).lower() for a in (self.an.snapshot.annotations or [])
            if isinstance(a, dict))
        if x == 0:
            if not stepped:
                return e, formula, ("optimizer state 0: the optimizer step was not reached in the trace (no "
                                    "optimizer phase), or an 8-bit, paged or CPU-offloaded optimizer keeps it "
                                    "off the GPU's caching allocator")
            return e, formula, ("optimizer state 0 although a step ran: a paged (unified memory) or CPU-offloaded "
                                "optimizer, or SGD without momentum")
        if _close(x, e):
            o = np.flatnonzero(self.da.category == _I["optimizer"])
            first = self.da.allocs.alloc_index[o]
            first = int(first[first >= 0].min()) if (first >= 0).any() else -1
            if first > self.peak_index >= -1 and first >= 0:
                return e, formula, ("created lazily at the first optimizer step, after the peak: the first "
                                    "iteration's peak does not hold it, later iterations' do")
            return e, formula, "not all live at the peak"
        r = x / e
        for target, why in ((0.25, "about a quarter: an 8-bit optimizer"),
                            (0.5, "half: one state per parameter (SGD momentum, Lion) or 8-bit states of 16-bit weights"),
                            (1.5, "1.5x: AMSGrad's third moment (max_exp_avg_sq)"),
                            (2.0, "twice: fp32 moments of 16-bit parameters (mixed-precision optimizer)"),
                            (3.0, "3x: an fp32 master copy and two fp32 moments of 16-bit parameters")):
            if _near(r, target):
                return e, formula, why
        return e, formula, (f"{r:.2f}x the expectation: state partly offloaded or sharded, or trainable "
                            f"parameters not all recognized")

    def _quantization(self, m, x):
        f = self.f
        if not f.quantized_params:
            if x == 0:
                return 0, "no quantized weights", ""
            return None, ("quantization buffers that do not pair as 4-bit packed weights + absmax (int8 "
                          "LLM.int8 or GPTQ-style weights?): no expectation"), ""
        e = int(round(f.quantized_params * self.q_per_param))
        formula = (f"{f.quantized_params:,} quantized parameters (2 x the packed bytes) x {self.q_per_param:.4f} B: "
                   f"0.5 B packed + constants ({f.quant_scheme})")
        note = ""
        if not _close(m, e):
            if m > e:
                note = (f"{fmt_bytes(m - e)} more at the peak: dequantization scratch (a layer's weights "
                        f"dequantized to the compute dtype) or quantization state not paired")
            else:
                note = "less at the peak than the quantized weights: some quantized layers not live then"
        elif x > (1 + TOLERANCE) * e:
            note = (f"reaches {fmt_bytes(x)} at some moment: 16-bit copies of weights being quantized at load, "
                    f"or dequantization scratch")
        return e, formula, note

    def _activations(self, m, x):
        f = self.f
        formula = ("grow with micro-batch x sequence length (a transformer layer keeps about "
                   "(16.N_b + 2).s.b.h + (2.N_b + 1).a.s^2.b bytes without flash attention); the "
                   "snapshot does not give the architecture, so no expectation")
        if f.activation_bytes_per_token:
            formula += (f"; here {fmt_bytes(f.activation_bytes_per_token)} per input token at the peak "
                        f"({f.input_tokens:,} tokens: the largest input tensor read as int64 ids)")
        return None, formula, ""

    def total(self, rows, peak_bytes):
        ex = self.exp
        mx = {r.category: r.measured_max for r in rows}
        left = [c for c in ("weights", "optimizer", "gradients") if c in ex and ex[c] is None and mx.get(c, 0)]
        w = (ex.get("weights") or 0) + (ex.get("quantization") or 0)
        o = ex.get("optimizer") or 0
        g = (ex.get("gradients") or 0) + mx.get("autograd", 0)
        act = mx.get("activations", 0)
        inp = mx.get("inputs", 0)
        e = w + o + max(g, act) + inp
        formula = ("weights + quantized weights + optimizer + max(gradients + backward intermediates (measured "
                   "max), activations (measured max)) + inputs (measured max): "
                   f"{fmt_bytes(w)} + {fmt_bytes(o)} + max({fmt_bytes(g)}, {fmt_bytes(act)}) + {fmt_bytes(inp)}; "
                   "the allocator's cache comes on top (see fits)")
        if left:
            formula += f"; left out (no estimate from this file): {', '.join(left)}"
        note = ""
        if e and e < SMALL_SHARE * peak_bytes:
            note = (f"the napkin total covers little of the peak ({fmt_bytes(e)} of {fmt_bytes(peak_bytes)}): most "
                    f"of what is live has no napkin term in this file" + (f" ({', '.join(left)} left out)" if left
                                                                        else ""))
        elif not _close(peak_bytes, e) and e:
            note = (f"the peak ({self._ptype()}) is {peak_bytes / e:.2f}x the napkin total: it is not the sum of each "
                    f"term's maximum, but what is live together at one moment (temporaries, unknown, or "
                    f"terms that do not overlap)" + (f"; {', '.join(left)} left out of the total" if left else ""))
        return BudgetRow("total", peak_bytes, peak_bytes, e, formula, note)

    def _ptype(self):
        return self.da.peak_type(self.peak_index)


_NO_NAPKIN = {
    "autograd": "backward intermediates: the gradient flowing through the layer being back-propagated and its "
                "scratch (part of the max(gradients + backward, activations) term); no expectation",
    "inputs": "batches, labels and masks: micro-batch x sequence x their dtype; no expectation",
    "temporary": "short-lived forward and optimizer scratch (foreach temporaries); no expectation",
    "unknown": "allocations no rule classified; no expectation",
}

__all__ = ["Budget", "BudgetRow", "BudgetFacts", "budget", "recorded_model", "TOLERANCE"]
