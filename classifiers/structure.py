"""The run's structure, read from its stacks and lifetimes (DESIGN.md §8): the repeated
blocks (layers) of each forward pass, which saved activations belong to which block, the
block inputs and outputs, the tensors outside the blocks (embeddings, logits, loss), the
recompute windows of a checkpointed run, and what grows with the micro-batch or with the
square of the sequence. The levers (simulate.py) rewrite the recorded timeline from it.

    st = structure(da)            # -> Structure (computed once per DeviceAnalysis)
    b = blocks(da)                # -> Blocks | None: .name ("Block", "modeling_llama.py:forward"), .count
    st.calls                      # BlockCall per block call of every forward pass, in time order

How blocks are found. Every allocation of a forward pass has a call path (its Python and
nn.Module frames, outermost first). A node of the tree of call paths is a block frame when
each forward pass calls it two or more times in a row, every call allocating alike (bytes
within 35% of the median call for most calls), and the calls cover a large share of the
forward's bytes; the node covering most bytes wins (the outermost one on a tie). One call
ends where another starts: a profiler module frame names a new instance (`nn.Module:
Block_3`), the frame's current line goes back to an earlier line (CUDA stacks record the
executing line: a new call starts the function again), or an allocation outside the node
comes between. Frames are matched on file and function (and the profiler's def line),
never on the executing line.

Roles of the rows of a block call (window: its first allocation to the next allocation
after its last one; the frees in between are the call's own, as its function returns):
  scratch   freed inside the window
  saved     freed in a backward phase (saved for backward, or kept for it)
  carried   freed later in the forward, or outside training phases
  output    the last allocation of the window that outlives it (the next block's input)
A checkpointed run's recompute windows are the runs of backward allocations made under
torch.utils.checkpoint's recompute frames and the block frame (recompute_saved: outlives
its window; recompute_scratch: freed inside it).
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..common.arrays import isin, unique, unique_inverse
from ..common.later import Later
from ..common.units import fmt_bytes as _fmt_bytes

from .categories import CATEGORIES
from .stacks import KIND_BUILTIN, KIND_CPP, KIND_MODULE, KIND_PYTHON
from .timeline import P_BACKWARD, P_FORWARD, P_INPUTS, P_UNWIND

# row roles
R_OTHER, R_SCRATCH, R_SAVED, R_CARRIED, R_OUTPUT, R_OUTSIDE_SAVED, R_RECOMPUTE_SAVED, R_RECOMPUTE_SCRATCH = range(8)
ROLE_NAMES = ("other", "scratch", "saved", "carried", "output", "outside_saved", "recompute_saved",
              "recompute_scratch")

MIN_SHARE = 0.25        # a block frame's calls cover at least this share of the forward's bytes
ALIKE = 0.35            # a call allocates within this fraction of the median call's bytes ...
ALIKE_SHARE = 0.75      # ... for at least this share of the calls
TINY = 1024             # an allocation this small outside a block's frame does not end its call
_CAT = {c: i for i, c in enumerate(CATEGORIES)}
_BATCH_CATEGORIES = np.array([_CAT[c] for c in ("activations", "autograd", "inputs", "temporary")])
_RECOMPUTE = re.compile(r"(^|/)torch/utils/checkpoint\.py$")
_RECOMPUTE_FN = re.compile(r"^(unpack_hook|recompute_fn|unpack|backward|_checkpoint_hook|pack_hook)$")
_SOFTMAX = re.compile(r"(^|_)softmax$")
_ATTENTION_FN = re.compile(r"(attention|attn|scaled_dot_product|sdpa)", re.I)


@dataclass(frozen=True)
class Blocks:
    """The repeated blocks (layers) of the model, as the stacks show them."""
    name: str               # what names a block: its module class ("Block") or "file.py:function"
    frame: str              # the frame whose calls are the blocks ("record_runs.py:140:forward")
    count: int              # blocks per forward pass
    passes: int             # forward passes they were found in
    checkpointed: bool      # their activations are recomputed during backward (torch.utils.checkpoint)

    def to_json(self) -> dict:
        return {"name": self.name, "frame": self.frame, "count": self.count, "passes": self.passes,
                "checkpointed": self.checkpointed}


@dataclass(frozen=True, eq=False)
class BlockCall:
    """One call of a block: in a forward pass, or its recompute during backward."""
    block: int              # position in the pass (0 = first in the forward)
    forward_pass: int       # index of the forward pass (0-based, in time order)
    first: int              # trace entry of its first allocation
    last: int               # trace entry of its last allocation
    end: int                # the last entry before the next allocation (frees up to here: its own)
    rows: np.ndarray        # allocation rows it made, in allocation order


@dataclass(eq=False)
class Structure:
    blocks: Blocks | None
    calls: tuple            # BlockCall per block call of every forward pass, in time order
    recomputes: tuple       # BlockCall per recompute window (checkpointed runs), in time order
    role: np.ndarray        # uint8 per row: R_*
    call_of: np.ndarray     # int32 per row: index into `calls` of the call that made it (-1: none)
    inputs: np.ndarray      # int64 per call: the row of the call's input (-1 unknown)
    outputs: np.ndarray     # int64 per call: the row of the call's output (-1 none)
    passes: np.ndarray      # int64 [n, 2]: (first entry, last entry) of each forward pass (a run of
                            # short steps has a million: 185 MB as tuples)
    batch: np.ndarray       # bool per row: grows with the micro-batch
    seq2: np.ndarray        # bool per row: grows with the square of the sequence (attention scores)
    output_bytes: int | None    # a block's output (the residual stream between blocks): the median call's
    tokens: int | None      # tokens per micro-batch: an int64 input tensor / 8 dividing output_bytes
    hidden_bytes: int | None    # bytes per token of a block's output (output_bytes / tokens)
    notes: tuple = field(default_factory=tuple)    # what the structure rests on, in words
    function: np.ndarray | None = None  # int32 per row: id of the innermost Python function that made it (-1)
    seq_refusal: str = ""   # why growing the sequence cannot be predicted on this run ('' when it can)

    @property
    def checkpointed(self) -> bool:
        return self.blocks is not None and self.blocks.checkpointed


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_PENDING: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # da -> Later being run
_RUN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()       # da -> its run facts' Later
BACKGROUND_ROWS = 200_000      # allocations from which finding the structure on a thread pays


def later(da, run: Later | None = None) -> Later | None:
    """The structure of `da` as a job for a thread (common.later), for `structure(da)` to take
    (waiting for it if need be): on a big run, once its rows are classified and its peak found;
    `run`: the job finding the run's facts meanwhile (on the caller's thread), which the structure
    waits for where it reads them (`_run_facts`). What it finds is what `structure(da)` would
    find. None on a small run, or one found or being found already."""
    if da in _CACHE or da in _PENDING or len(da.allocs) < BACKGROUND_ROWS:
        return None
    if run is not None:
        _RUN[da] = run
    job: Later = Later(lambda: _in_background(da))
    _PENDING[da] = job
    return job


class _NotWanted(Exception):
    """The structure being found on a thread is not wanted (`_in_background`)."""


def _in_background(da) -> "Structure | None":
    """`_build(da)` on the thread, begun before the run's facts are known; given up once they
    are (after the stacks' paths, before the search for the blocks) where no lever the advice
    simulates needs the blocks (checkpointing, LoRA: the half batch reads only what grows with
    the batch): None, found nowhere, and `structure(da)` builds it where it is asked for
    (`whatif`, the viewer's What-if panel). A 10^7-entry forward-only trace's structure, found
    beside its `summary` for nothing, held 600 MB and two cores for 5 s."""
    try:
        return _build(da, background=True)
    except _NotWanted:
        _PENDING.pop(da, None)
        _RUN.pop(da, None)
        return None


def _wanted(da) -> bool:
    """Whether the advice will simulate a lever on the blocks of `da` (waiting for its run's facts)."""
    from .advice import needs_blocks
    return needs_blocks(_run_known(da), da)


def _run_known(da):
    """The run's facts, waited for where they are being found beside (not taken: `_run_facts`
    takes them), else the device's own. On the structure's thread `da.run` may not be set yet:
    a trace that ends in an OOM read as not ending in one gave its last forward's tensors
    another role, and the advice on checkpointing came and went from run to run."""
    job = _RUN.get(da)
    return job.get() if job is not None else getattr(da, "run", None)


def _run_facts(da):
    """The run's facts: those being found beside (waited for), else the device's own."""
    job = _RUN.pop(da, None)
    if job is not None:
        return job.get()
    return getattr(da, "run", None)


def structure(da) -> Structure:
    """The structure of one device's run (computed once per DeviceAnalysis)."""
    st = _CACHE.get(da)
    if st is None:
        pending = _PENDING.pop(da, None)
        st = pending.get() if pending is not None else None
        if st is None:                  # (none begun, or the thread found it was not wanted)
            st = _build(da)
        _CACHE[da] = st
    return st


def being_found(da) -> bool:
    """Whether a job for a thread is (to be) finding the structure of `da` (`later`)."""
    return da in _PENDING


def growth_structure(da, wait: bool = True) -> Structure:
    """What grows with the batch, without the blocks: all the half-batch lever needs. The whole
    structure when it was already found, or (`wait`) is being found: one answer per device; not
    waiting, the same rows that grow with the batch, found here."""
    st = _CACHE.get(da)
    if st is not None:
        return st
    job = _PENDING.get(da) if wait else None
    if job is not None:
        st = job.get()                  # None: the thread found it was not wanted
        if st is not None:
            _CACHE[da] = st
            _PENDING.pop(da, None)
            return st
    a = da.allocs
    n = len(a.size)
    size = np.asarray(a.size, dtype=np.int64)
    ai = np.asarray(a.alloc_index)
    ph = da.timeline.phase if da.timeline is not None else np.zeros(0, np.uint8)
    alloc_phase = np.full(n, 255, dtype=np.uint8)
    ok = (ai >= 0) & (ai < len(ph))
    alloc_phase[ok] = ph[ai[ok]]
    batch, note = _batch_rows(da, size, ai, alloc_phase)
    z = np.zeros(0, dtype=np.int64)
    return Structure(None, (), (), np.zeros(n, dtype=np.uint8), np.full(n, -1, dtype=np.int32), z, z,
                     _forward_passes(da), batch, np.zeros(n, dtype=bool), None, None, None,
                     tuple(x for x in (note,) if x))


WORKSPACE_SHARE = 0.05     # library scratch this share of the peak or more: the batch levers decline


def library_scratch(da) -> int:
    """The largest scratch a library allocates and frees inside one op in a convolutional run:
    cuDNN's workspace (no Python frames, 8 MiB or more, nothing else allocated while it lives).
    cuDNN picks its algorithms, and their workspace, by the shapes: it does not follow the
    batch (a run at twice the batch may pick one needing ten times the workspace), so a run
    where it is large against the peak cannot be scaled."""
    run = getattr(da, "run", None)
    if run is None or run.model_kind != "cnn" or not len(da.allocs.size):
        return 0
    a = da.allocs
    ai, fi, size = a.alloc_index, a.free_index, a.size
    frameless = a.stack <= 0
    if da.facts is not None:
        frameless = frameless | (da.facts.stacks.lengths[np.maximum(a.stack, 0)] == 0)
    cand = np.flatnonzero(frameless & (size >= 8 << 20) & (ai >= 0) & (fi >= 0))
    if not len(cand):
        return 0
    # nothing else allocated while it lived: no alloc entry between its alloc and its free
    act = np.asarray(da.trace_action)
    from ..parsers.tables import A_ALLOC
    cum = np.cumsum(act == A_ALLOC)
    alone = cum[fi[cand]] - cum[ai[cand]] == 0
    return int(size[cand[alone]].max()) if alone.any() else 0


def blocks(da) -> Blocks | None:
    """The repeated blocks of the run (None: no repeated block found in the stacks)."""
    return structure(da).blocks


# -- call paths -----------------------------------------------------------------------------------
class _Paths:
    """Per stack: its Python and module frames outermost first, as (key, line, instance)."""

    def __init__(self, da):
        sf = da.facts.stacks
        self.sf = sf
        snap = sf.snap
        t = sf.table
        raw_files = snap.frame_file
        strings = snap.strings
        prof = np.fromiter((strings[int(f)] == "none" for f in raw_files), dtype=bool, count=len(raw_files))
        self.keys: dict = {}
        self.key_text: list = []
        self.inst_ids: dict = {}
        n = len(t.kind)
        fkey = np.full(n, -1, dtype=np.int64)
        finst = np.full(n, -1, dtype=np.int64)
        fline = np.where(prof, 0, t.line).astype(np.int64)      # profiler lines are def lines: identity
        for f in np.flatnonzero((t.kind == KIND_PYTHON) | (t.kind == KIND_MODULE)).tolist():
            file, name = t.files[t.file_ids[f]], t.names[t.name_ids[f]]
            if t.kind[f] == KIND_MODULE:
                k = ("module", name)
                inst = strings[int(snap.frame_name[f])]
                finst[f] = self.inst_ids.setdefault(inst, len(self.inst_ids))
            else:
                k = (file, name, int(t.line[f]) if prof[f] else 0)
            fkey[f] = self._key(k)
        self.fkey, self.finst, self.fline = fkey, finst, fline
        self.recompute_frame = np.zeros(n, dtype=bool)
        for f in np.flatnonzero(t.kind == KIND_PYTHON).tolist():
            if _RECOMPUTE.search(t.files[t.file_ids[f]]) and _RECOMPUTE_FN.match(t.names[t.name_ids[f]]):
                self.recompute_frame[f] = True
        self.softmax_frame = np.zeros(n, dtype=bool)
        for f in np.flatnonzero((t.kind == KIND_PYTHON) | (t.kind == KIND_BUILTIN) | (t.kind == KIND_CPP)).tolist():
            nm = t.names[t.name_ids[f]]
            if t.kind[f] == KIND_CPP:
                if "softmax" in nm and ("at::_softmax" in nm or "at::native::softmax" in nm or "_ops::_softmax" in nm):
                    self.softmax_frame[f] = True
            elif _SOFTMAX.search(nm):
                self.softmax_frame[f] = True
        self._cache: dict = {}

    def _key(self, k) -> int:
        i = self.keys.get(k)
        if i is None:
            i = self.keys[k] = len(self.key_text)
            file, name = k[0], k[1]
            if file == "module":
                self.key_text.append(name)
            else:
                base = file.rsplit("/", 1)[-1]
                self.key_text.append(f"{base}:{k[2]}:{name}" if k[2] else f"{base}:{name}")
        return i

    def path(self, sid: int):
        """(keys, lines, instances, recompute position or -1) outermost first, Python and module
        frames only; the recompute position is the index of the innermost recompute frame."""
        p = self._cache.get(sid)
        if p is None:
            if sid < 0:
                p = ((), (), (), -1, False)
            else:
                fr = self.sf.snap.stack(int(sid))[::-1]          # outermost first
                if self.sf.outer_first[sid]:
                    fr = fr[::-1]
                k = self.fkey[fr]
                keep = k >= 0
                frk = fr[keep]
                rec = np.flatnonzero(self.recompute_frame[frk])
                p = (tuple(k[keep].tolist()), tuple(self.fline[frk].tolist()), tuple(self.finst[frk].tolist()),
                     int(rec[-1]) if len(rec) else -1, bool(self.softmax_frame[fr].any()))
            self._cache[sid] = p
        return p

    def node_arrays(self, sids, depth: int, node_path: tuple):
        """Per stack of `sids`: (under the node, signature id of the call it is in, call site
        id, the node frame's line). A call's signature is its call site (the outer frames'
        lines) and the module instances down to the node: a new one, or the node's line going
        back, starts another call."""
        n = len(sids)
        under = np.zeros(n, dtype=bool)
        sig = np.zeros(n, dtype=np.int64)
        site = np.zeros(n, dtype=np.int64)
        line = np.zeros(n, dtype=np.int64)
        ids: dict = {}
        sites: dict = {}
        for i, sid in enumerate(sids.tolist()):
            keys, lines, inst, _rec, _sm = self.path(int(sid))
            if len(keys) > depth and keys[:depth + 1] == node_path:
                under[i] = True
                sig[i] = ids.setdefault((lines[:depth], inst[:depth + 1]), len(ids))
                site[i] = sites.setdefault(lines[:depth], len(sites))
                line[i] = lines[depth]
        return under, sig, site, line


# -- finding the blocks ---------------------------------------------------------------------------
def _forward_passes(da) -> np.ndarray:
    """int64 [n, 2]: (first entry, last entry) of each forward pass, in order."""
    return da.phase_runs("forward")


def _call_bounds(paths, rows_stack, depth, node_path, tiny=None, group=None):
    """Split the rows (in allocation order; their stacks in `rows_stack`) that run under the
    node at `depth` (prefix `node_path`) into calls: (the positions into the rows of every row
    under the node, each call's [start, end) into those), or None where there is none. Bounds
    into one array, not an array a call (np.split's Python loop was 3.7 s of a 10^7-entry trace
    of 975,000 calls). A call ends where a row outside the node comes between, the call's signature changes or the
    node frame's line goes back. Only the calls from the most common call site are the
    blocks' (a model's embedding, final norm and head can share the blocks' frame, `forward`
    of the same file, called from other lines)."""
    if not len(rows_stack):
        return None
    u, inv = unique_inverse(rows_stack)
    under_u, sig_u, site_u, line_u = paths.node_arrays(u, depth, node_path)
    under = under_u[inv]
    if tiny is not None:
        # a tiny allocation outside the node (BatchNorm's step counter, an RNG state, a scalar) does
        # not end a call: positions are counted over the rows that matter
        keep = under | ~tiny
        idx = np.flatnonzero(keep)
        pos_k = np.flatnonzero(under[idx])
        if not len(pos_k):
            return None
        sig, site, line = sig_u[inv][idx[pos_k]], site_u[inv][idx[pos_k]], line_u[inv][idx[pos_k]]
        if group is not None:           # another forward pass is another call
            sig = sig * (int(group.max()) + 1) + group[idx[pos_k]]
        starts = _call_starts(pos_k, sig, line)
        pos = idx[pos_k]
    else:
        pos = np.flatnonzero(under)
        if not len(pos):
            return None
        sig, site, line = sig_u[inv][pos], site_u[inv][pos], line_u[inv][pos]
        if group is not None:
            sig = sig * (int(group.max()) + 1) + group[pos]
        starts = _call_starts(pos, sig, line)
    sites = site[starts]
    main = np.flatnonzero(sites == np.bincount(sites).argmax())
    bounds = np.append(starts, len(pos))            # (starts[0] is 0)
    return pos, bounds[main], bounds[main + 1]


LINE_SLACK = 2      # a call's line may step back this far inside one call (a multi-line call expression)


def _call_starts(pos, sig, line) -> np.ndarray:
    """Where calls start, over rows in order (`pos` their positions, `sig` their call signature,
    `line` the node frame's line): a row not right after the last, another signature, or the
    node's line going back. Back by LINE_SLACK lines or less is one call still (Python reports
    the line of each part of a call written over several lines: GPT-NeoX's
    `self.attention(self.input_layernorm(x), ...)` over two lines runs line 261 before 260),
    unless it is back at the line the call began on (a short block called again)."""
    n = len(pos)
    back = np.zeros(n, dtype=np.int64)
    brk = np.ones(n, dtype=bool)
    if n > 1:
        back[1:] = line[:-1] - line[1:]
        brk[1:] = (pos[1:] != pos[:-1] + 1) | (sig[1:] != sig[:-1]) | (back[1:] > LINE_SLACK)
    first_line = line[np.flatnonzero(brk)][np.cumsum(brk) - 1]
    brk |= (back > 0) & (line == first_line)
    return np.flatnonzero(brk)


def _alike(byte_counts) -> bool:
    """The calls allocate alike: most within ALIKE of the median call, or, stage by stage (a
    ResNet's stages of different widths), runs of two or more calls alike each, the first call
    of a stage (its downsampling block) free to differ."""
    b = np.asarray(byte_counts, dtype=np.float64)
    if len(b) < 2:
        return False
    med = float(np.median(b))
    if med <= 0:
        return False
    if float(np.mean(np.abs(b - med) <= ALIKE * med)) >= ALIKE_SHARE:
        return True
    return _alike_in_stages(b)


def _alike_in_stages(b: np.ndarray) -> bool:
    """Stages: maximal runs of consecutive calls within ALIKE of each other, a lone call before a
    run taken as that stage's first; every stage two calls or more, at most four stages."""
    stages, k = 0, 0
    n = len(b)
    while k < n:
        j = k + 1
        while j < n and abs(b[j] - b[j - 1]) <= ALIKE * max(b[j], b[j - 1]):
            j += 1
        run = j - k
        if run == 1:
            # a lone call: the first of the next stage, when a run follows
            j2 = j + 1
            while j2 < n and abs(b[j2] - b[j2 - 1]) <= ALIKE * max(b[j2], b[j2 - 1]):
                j2 += 1
            if j >= n or j2 - j < 2:
                return False
            j = j2
        stages += 1
        k = j
    return 1 < stages <= 4 or (stages == 1 and n >= 2)


class _PassRows:
    """Each forward pass's allocation rows, in allocation order: `order[lo[k]:hi[k]]` (the
    passes are disjoint and in order). Kept as bounds, not a view per pass: a run of short
    steps has a million passes, 160 MB of views. `order` None: the rows are in allocation order
    already, row k the k-th (no int64 per row: 31 MB at 10^7 events)."""

    def __init__(self, order: np.ndarray | None, lo: np.ndarray, hi: np.ndarray, n: int = 0):
        self.order, self.lo, self.hi = order, lo, hi
        self.n = n if order is None else len(order)

    def __len__(self) -> int:
        return len(self.lo)

    def __getitem__(self, k: int) -> np.ndarray:
        if self.order is None:
            return np.arange(int(self.lo[k]), int(self.hi[k]))
        return self.order[self.lo[k]:self.hi[k]]

    def lens(self) -> np.ndarray:
        return (self.hi - self.lo).astype(np.int64)

    def all(self) -> np.ndarray:
        """Every pass's rows, pass after pass (what concatenating them gives)."""
        if not len(self.lo):
            return np.zeros(0, dtype=np.int64)
        edge = np.zeros(self.n + 1, dtype=np.int32)
        np.add.at(edge, self.lo, 1)
        np.add.at(edge, self.hi, -1)
        np.cumsum(edge, out=edge)
        inside = edge[:-1] > 0
        return np.flatnonzero(inside) if self.order is None else self.order[inside]


def _find_block_node(da, paths, passes):
    """(depth, node path) of the block frame, or None."""
    a = da.allocs
    ai = np.asarray(a.alloc_index)
    size = np.asarray(a.size, dtype=np.int64)
    # the rows are in allocation order already (those from before the trace, -1, first): no
    # sort and no copies of the entries then (int64 copies of them were 92 MB at 10^7 events,
    # at the highest memory of the viewer's open)
    order: np.ndarray | None = None
    if len(ai) > 1 and bool((ai[1:] < ai[:-1]).any()):
        order = np.argsort(ai, kind="stable")
        ai_sorted = ai[order]
    else:
        ai_sorted = ai
    # (searched in the entries' own dtype: other keys would make numpy cast the whole array)
    p0, p1 = passes[:, 0].astype(ai_sorted.dtype), (passes[:, 1] + 1).astype(ai_sorted.dtype)
    pass_rows = _PassRows(order, np.searchsorted(ai_sorted, p0), np.searchsorted(ai_sorted, p1), len(ai))
    # bytes per tree node over every forward pass (per stack first: a few thousand stacks)
    rows = pass_rows.all()
    st = np.asarray(a.stack)[rows]
    u, inv = unique_inverse(st)
    b = np.bincount(inv, weights=size[rows].astype(np.float64)) if len(rows) else np.zeros(0)
    total = float(b.sum())
    node_bytes: dict = {}
    for sid, nb in zip(u.tolist(), b.tolist()):
        keys = paths.path(int(sid))[0]
        for d in range(len(keys)):
            node_bytes[keys[:d + 1]] = node_bytes.get(keys[:d + 1], 0.0) + nb
    if total <= 0:
        return None, pass_rows
    cands = sorted((p for p, b in node_bytes.items() if b >= MIN_SHARE * total),
                   key=lambda p: (-node_bytes[p], len(p)))
    stacks = np.asarray(a.stack)
    some = np.flatnonzero(pass_rows.lens() > 0)
    # detect on up to four passes spread over the run (the first may be unusual: lazy state)
    if len(some) > 4:
        some = some[np.linspace(0, len(some) - 1, 4).astype(int)]
    sample = [pass_rows[k] for k in some.tolist()]
    best = None
    for p in cands:
        d = len(p) - 1
        counts, ok = [], True
        for rows in sample:
            got = _call_bounds(paths, stacks[rows], d, p, size[rows] <= TINY)
            if got is None or not len(got[1]):
                # a pass that never runs through this node (the model called from elsewhere: an
                # evaluation loop's forward) says nothing of how often the node repeats
                continue
            pos, a, b = got
            counts.append(len(a))
            # each call's bytes: a running sum over the rows under the node, at its bounds
            run = np.concatenate(([0], np.cumsum(size[rows[pos]])))
            if len(a) < 2 or np.median(b - a) < 3 or not _alike(run[b] - run[a]):
                ok = False
                break
        if not ok or len(counts) < min(2, len(sample)) or len(set(counts)) != 1:
            continue
        cover = node_bytes[p]
        if best is None or cover > best[0] * 1.02:
            best = (cover, d, p)
    if best is None:
        return None, pass_rows
    return (best[1], best[2]), pass_rows


def _block_function(paths, stacks, calls, node_path) -> int:
    """The innermost frame every allocation of every block call has under the block node: the
    block's own function (under a profiler's `nn.Module: X` node, X's forward), which its
    recompute calls again (checkpointing may call the function without the module frame)."""
    common = None
    for sid in unique(np.concatenate([stacks[c.rows] for c in calls])).tolist():
        keys = paths.path(int(sid))[0]
        if common is None:
            common = keys
        else:
            n = 0
            while n < min(len(common), len(keys)) and common[n] == keys[n]:
                n += 1
            common = common[:n]
    return (common or node_path)[max(len(node_path), len(common or ())) - 1]


def _block_name(paths, node_path) -> tuple[str, str]:
    text = [paths.key_text[k] for k in node_path]
    frame = text[-1]
    for k, t in zip(reversed(node_path), reversed(text)):
        key = next(kk for kk, v in paths.keys.items() if v == k)
        if key[0] == "module":
            return t, frame
    return frame, frame


# -- the structure ---------------------------------------------------------------------------------
def _call_roles(calls, fi, free_phase, role, call_of, outputs) -> None:
    """Each call's rows: scratch (freed before the call ends), saved for backward (freed in a
    backward, or in the unwinding of an OOM: held to the end of the failed step, as a backward
    would), else carried; the last row made in the call and not freed in it is its output.
    All calls at once (the calls' rows are disjoint: they split the forward passes' rows)."""
    if not calls:
        return
    lens = np.fromiter((len(c.rows) for c in calls), dtype=np.int64, count=len(calls))
    rows = np.concatenate([c.rows for c in calls]).astype(np.int64, copy=False)
    cid = np.repeat(np.arange(len(calls), dtype=np.int64), lens)
    ends = np.fromiter((c.end for c in calls), dtype=np.int64, count=len(calls))
    call_of[rows] = cid
    f = fi[rows]
    inside = (f >= 0) & (f <= ends[cid])
    fp = free_phase[rows]
    saved = ~inside & ((fp == P_BACKWARD) | (fp == P_UNWIND))
    role[rows] = np.where(inside, R_SCRATCH, np.where(saved, R_SAVED, R_CARRIED))
    out = np.flatnonzero(~inside)
    if len(out):
        oc = cid[out]
        last = np.ones(len(out), dtype=bool)
        last[:-1] = oc[:-1] != oc[1:]
        outputs[oc[last]] = rows[out[last]]
        role[rows[out[last]]] = R_OUTPUT


def _build(da, background: bool = False) -> Structure:
    a = da.allocs
    n = len(a.size)
    size = np.asarray(a.size, dtype=np.int64)
    # the entries as the allocations hold them (int32 below 2^31 entries): no copies
    ai = np.asarray(a.alloc_index)
    fi = np.asarray(a.free_index)
    stacks = np.asarray(a.stack)
    ph = da.timeline.phase if da.timeline is not None else np.zeros(0, np.uint8)
    n_entries = len(ph)
    role = np.zeros(n, dtype=np.uint8)
    call_of = np.full(n, -1, dtype=np.int32)
    notes: list[str] = []

    def phase_of(idx):
        idx = np.asarray(idx)
        out = np.full(len(idx), 255, dtype=np.uint8)
        ok = (idx >= 0) & (idx < n_entries)
        out[ok] = ph[idx[ok]]
        return out

    free_phase = phase_of(fi)
    alloc_phase = phase_of(ai)
    passes = _forward_passes(da)
    found, pass_rows = None, _PassRows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    paths = None
    if da.facts is not None and len(passes):
        paths = _Paths(da)
    # (the stacks' paths made beside the run's facts, which are known by now or soon)
    if background and not _wanted(da):
        raise _NotWanted
    run = _run_known(da)
    if len(passes) and run is not None and run.truncated_by_oom.value:
        # the trace ends in an OOM inside its last forward: what that forward made and never freed
        # was held to the end of the failed step (freed by its unwinding, or not recorded at all)
        s0, e0 = passes[-1].tolist()
        free_phase[(fi < 0) & (ai >= s0) & (ai <= e0)] = P_UNWIND
    if paths is not None:
        found, pass_rows = _find_block_node(da, paths, passes)
    calls: list[BlockCall] = []
    recomputes: list[BlockCall] = []
    blk = None
    inputs = np.zeros(0, dtype=np.int64)
    outputs = np.zeros(0, dtype=np.int64)
    # the entries that allocate, in order (the rows are in allocation order already: no sort then)
    alloc_entries = ai[ai >= 0]
    if len(alloc_entries) > 1 and bool((alloc_entries[1:] < alloc_entries[:-1]).any()):
        alloc_entries = np.sort(alloc_entries)

    def ends_of(lasts: np.ndarray) -> np.ndarray:
        """The last entry before the next allocation after each of `lasts` (int64). (Searched in
        the array's own dtype: other keys would make numpy cast the whole array on every call.)"""
        k = np.searchsorted(alloc_entries, lasts.astype(alloc_entries.dtype), side="right")
        inside = k < len(alloc_entries)
        nxt = alloc_entries[np.minimum(k, len(alloc_entries) - 1)] if len(alloc_entries) else 0
        return np.where(inside, np.asarray(nxt, dtype=np.int64) - 1, np.maximum(n_entries - 1, lasts))

    def end_of(last: int) -> int:
        return int(ends_of(np.array([last], dtype=np.int64))[0])

    if found is not None:
        depth, node_path = found
        # every pass at once (the stacks' paths looked up once, not once per pass), a pass's calls apart
        lens = pass_rows.lens()
        all_rows = pass_rows.all()
        group = np.repeat(np.arange(len(pass_rows), dtype=np.int64), lens)
        got = _call_bounds(paths, stacks[all_rows], depth, node_path, size[all_rows] <= TINY, group) \
            if len(all_rows) else None
        pos, a_, b_ = got if got is not None else (np.zeros(0, dtype=np.int64),) * 3
        # every call's pass, place in its pass, first and last entry and end at once
        head_pos, tail_pos = pos[a_], pos[b_ - 1]
        heads, tails, p_of = all_rows[head_pos], all_rows[tail_pos], group[head_pos]
        by_p = np.argsort(p_of, kind="stable")
        place = np.empty(len(p_of), dtype=np.int64)
        place[by_p] = np.arange(len(p_of)) - np.searchsorted(p_of[by_p], p_of[by_p], side="left")
        first_e = ai[heads].astype(np.int64)
        last_e = ai[tails].astype(np.int64)
        ends = ends_of(last_e)
        call_rows = all_rows[pos]           # each call's rows a slice of these (one gather, not one a call)
        for x, y, b, p, f, la, e in zip(a_.tolist(), b_.tolist(), place.tolist(), p_of.tolist(), first_e.tolist(),
                                        last_e.tolist(), ends.tolist()):
            calls.append(BlockCall(b, p, f, la, e, call_rows[x:y]))
        per_pass = np.bincount(p_of, minlength=len(pass_rows)).astype(np.int64)
        counts = per_pass[per_pass > 0].tolist()      # the passes that run through the blocks
        name, frame = _block_name(paths, node_path)
        count = int(np.bincount(counts).argmax()) if counts else 0
        recomputes = _recompute_windows(da, paths, _block_function(paths, stacks, calls, node_path), ai, stacks,
                                        alloc_phase, end_of)
        blk = Blocks(name=name, frame=frame, count=count, passes=len(counts), checkpointed=bool(recomputes))
        inputs = np.full(len(calls), -1, dtype=np.int64)
        outputs = np.full(len(calls), -1, dtype=np.int64)
        _call_roles(calls, fi, free_phase, role, call_of, outputs)
        first_input = _FirstInputs(ai, fi, size)
        # a call's input is the output of the call before it in its pass; the first call's, looked for
        # (one a pass: not a loop over every call)
        after = np.zeros(len(calls), dtype=bool)
        after[1:] = (place[1:] > 0) & (p_of[1:] == p_of[:-1])
        inputs[1:][after[1:]] = outputs[:-1][after[1:]]
        firsts = np.flatnonzero((place == 0) & (outputs >= 0))
        inputs[firsts] = first_input.many(first_e[firsts], size[outputs[firsts]], passes[p_of[firsts], 0])
        for w in recomputes:
            r = w.rows
            inside = (fi[r] >= 0) & (fi[r] <= w.end)
            role[r] = np.where(inside, R_RECOMPUTE_SCRATCH, R_RECOMPUTE_SAVED)
        notes.append(f"{count} {name} blocks per forward pass (the calls of {frame}), found in "
                     f"{len(counts)} forward pass{'es' if len(counts) != 1 else ''}"
                     + ("; recomputed during backward (activation checkpointing)" if recomputes else ""))
    else:
        notes.append("no repeated block (layer) found in the stacks" if paths is not None else
                     "no forward pass with frames: no blocks")
    # tensors outside the blocks, saved for backward: embeddings, final norm, logits, loss
    # the entries inside a forward pass (a mark per entry, not an int64 per row: this ran at the
    # highest memory of a cold `summary`). The passes are disjoint: a mark is 0 or 1
    fwd_entry = np.zeros(n_entries + 1, dtype=np.int8)
    s_, e_ = passes[:, 0], passes[:, 1]
    ok = (s_ >= 0) & (s_ <= e_) & (e_ < n_entries)
    np.add.at(fwd_entry, s_[ok], 1)
    np.add.at(fwd_entry, e_[ok] + 1, -1)
    np.cumsum(fwd_entry, out=fwd_entry)
    in_fwd = (ai >= 0) & (fwd_entry[np.clip(ai, 0, n_entries)] > 0)
    del fwd_entry
    outside = in_fwd & (call_of < 0) & np.isin(free_phase, (P_BACKWARD, P_UNWIND)) & (role == R_OTHER)
    role[outside] = R_OUTSIDE_SAVED

    o = outputs[outputs >= 0] if len(outputs) else outputs
    out_bytes = int(np.median(size[o])) if len(o) else None
    tokens = _tokens(da, size, ai, out_bytes)
    hidden = out_bytes // tokens if out_bytes and tokens and out_bytes % tokens == 0 else None
    batch, wshape_note = _batch_rows(da, size, ai, alloc_phase)
    if wshape_note:
        notes.append(wshape_note)
    seq2, seq_note = _seq2_rows(da, paths, calls, recomputes, size, ai, fi, stacks, batch, alloc_phase)
    refusal = ""
    if seq_note.startswith("REFUSE: "):
        refusal = seq_note = seq_note[len("REFUSE: "):]
    notes.append(seq_note)
    function = _functions(paths, stacks) if paths is not None else None
    return Structure(blk, tuple(calls), tuple(recomputes), role, call_of, inputs, outputs, passes, batch,
                     seq2, out_bytes, tokens, hidden, tuple(notes), function, refusal)


def _functions(paths, stacks) -> np.ndarray:
    """int32 per row: the innermost Python function (file and function; a profiler frame's def
    line too) of its stack, -1 where it has none."""
    fid = np.full(paths.sf.n_stacks + 1, -1, dtype=np.int32)
    for sid in unique(stacks[stacks >= 0]).tolist():
        keys = paths.path(int(sid))[0]
        py = [k for k in keys if paths.key_text[k].count(":")]
        if py:
            fid[sid] = py[-1]
    return fid[np.where(stacks >= 0, stacks, paths.sf.n_stacks)]


class _FirstInputs:
    """The input of a pass's first block: the last allocation of the pass before it, of the
    size of the block's output, still live when the block starts. The rows of each size are
    sorted by allocation once; a call looks back from its first entry (a binary search, then
    the few rows of that size still being walked back over), never over every row."""

    def __init__(self, ai, fi, size):
        self.ai, self.fi, self.size = ai, fi, size
        self._by_size: dict = {}

    def _of_size(self, out_size: int) -> tuple[np.ndarray, np.ndarray]:
        got = self._by_size.get(out_size)
        if got is None:
            rows = np.flatnonzero((self.size == out_size) & (self.ai >= 0))
            rows = rows[np.argsort(self.ai[rows], kind="stable")]
            got = self._by_size[out_size] = (rows, self.ai[rows].astype(np.int64))
        return got

    def many(self, first: np.ndarray, out_size: np.ndarray, pass_start: np.ndarray) -> np.ndarray:
        """`__call__` for many calls at once (int64 rows, -1 none): for each output size, every
        call's binary searches in one, then the walks back a step at a time over the calls still
        walking (most find their input at the first step). 55,659 passes: 0.30 -> 0.02 s."""
        first = np.asarray(first, dtype=np.int64)
        pass_start = np.asarray(pass_start, dtype=np.int64)
        out_size = np.asarray(out_size, dtype=np.int64)
        out = np.full(len(first), -1, dtype=np.int64)
        for s in unique(out_size).tolist():
            sel = np.flatnonzero(out_size == s)
            rows, ai_rows = self._of_size(int(s))
            lo = np.searchsorted(ai_rows, pass_start[sel], side="left")
            k = np.searchsorted(ai_rows, first[sel], side="left") - 1
            walking = np.flatnonzero(k >= lo)           # (indices into sel)
            while len(walking):
                r = rows[k[walking]]
                f = self.fi[r]
                hit = (f < 0) | (f > first[sel[walking]])
                out[sel[walking[hit]]] = r[hit]
                walking = walking[~hit]
                k[walking] -= 1
                walking = walking[k[walking] >= lo[walking]]
        return out

    def __call__(self, call, out_size: int, pass_start: int) -> int:
        """One call's input (the reference `many` must equal)."""
        rows, ai_rows = self._of_size(out_size)
        lo = int(np.searchsorted(ai_rows, pass_start, side="left"))
        k = int(np.searchsorted(ai_rows, call.first, side="left")) - 1
        while k >= lo:
            f = int(self.fi[rows[k]])
            if f < 0 or f > call.first:
                return int(rows[k])
            k -= 1
        return -1


def _recompute_windows(da, paths, block_key, ai, stacks, alloc_phase, end_of) -> list:
    """The recomputes of the blocks (checkpointing): runs of backward allocations whose stacks
    hold a torch.utils.checkpoint recompute frame with the block frame inside it. A run ends
    where another backward allocation comes between, the block's module instance changes or
    its frame's line goes back; the recomputes of a backward go from the last block to the
    first."""
    bw = np.flatnonzero((alloc_phase == P_BACKWARD) & (ai >= 0))
    has = da.facts.has_marker.get("recompute")
    if not len(bw) or has is None:
        return []
    bw = bw[np.argsort(ai[bw], kind="stable")]
    st = stacks[bw]
    cand = (st >= 0) & has[np.maximum(st, 0)]
    if not cand.any():
        return []
    pos = np.flatnonzero(cand)
    u, inv = unique_inverse(st[pos])
    ok_u = np.zeros(len(u), dtype=bool)
    sig_u = np.zeros(len(u), dtype=np.int64)
    line_u = np.zeros(len(u), dtype=np.int64)
    ids: dict = {}
    for i, sid in enumerate(u.tolist()):
        keys, lines, inst, rec, _sm = paths.path(int(sid))
        if rec < 0 or block_key not in keys[rec:]:
            continue
        d = keys.index(block_key, rec)
        ok_u[i] = True
        sig_u[i] = ids.setdefault(inst[rec:d + 1], len(ids))
        line_u[i] = lines[d]
    keep = ok_u[inv]
    pos, sig, line = pos[keep], sig_u[inv][keep], line_u[inv][keep]
    if not len(pos):
        return []
    starts = _forward_passes(da)[:, 0]
    windows = [bw[p] for p in np.split(pos, _call_starts(pos, sig, line)[1:])]
    pass_of = [int(np.searchsorted(starts, ai[w[0]], side="right")) - 1 for w in windows]
    left: dict = {}
    for p in pass_of:
        left[p] = left.get(p, 0) + 1
    out = []
    for p, w in zip(pass_of, windows):
        left[p] -= 1
        out.append(BlockCall(left[p], p, int(ai[w[0]]), int(ai[w[-1]]), end_of(int(ai[w[-1]])), w))
    return out


def _tokens(da, size, ai, out_bytes: int | None) -> int | None:
    """Tokens per micro-batch: an int64 `inputs` tensor's size / 8 (token ids, labels), the
    most common one that divides a block's output (tokens x width); None when none does."""
    rows = np.flatnonzero((da.category == _CAT["inputs"]) & (ai >= 0))
    s = size[rows]
    s = s[(s >= 8) & (s % 8 == 0)]
    if not len(s):
        return None
    u, c = np.unique(s // 8, return_counts=True)
    if out_bytes:
        fit = out_bytes % u == 0
        if not fit.any():
            return None
        u, c = u[fit], c[fit]
    return int(u[c == c.max()].max())


def _batch_rows(da, size, ai, alloc_phase) -> tuple[np.ndarray, str]:
    """bool per row: grows with the micro-batch. Activations, backward intermediates, inputs and
    temporaries made in the inputs, forward or backward phases of the trace; not weights,
    gradients, optimizer state, library workspaces (cuBLAS), optimizer scratch, what was live
    before the trace, nor autocast's 16-bit copies of weights (category weights, rule
    weights.autocast_copy)."""
    cat = np.asarray(da.category)
    batch = isin(cat, _BATCH_CATEGORIES) & (ai >= 0) & isin(alloc_phase, (P_INPUTS, P_FORWARD, P_BACKWARD))
    names = da.rule_names
    if names:
        ws = [i for i, nm in enumerate(names) if nm in ("temporary.library_workspace", "temporary.compile_autotune",
                                                         "temporary.workspace_size")]
        if ws:
            batch &= ~isin(np.asarray(da.rule), ws)
    note = ""
    if names and "weights.autocast_copy" in names and np.any(np.asarray(da.rule) == names.index("weights.autocast_copy")):
        note = "autocast's 16-bit copies of the weight matrices (weights) do not grow with the batch"
    return batch, note


def _seq2_rows(da, paths, calls, recomputes, size, ai, fi, stacks, batch, alloc_phase) -> tuple[np.ndarray, str]:
    """bool per row: grows with the square of the sequence: attention scores. In the blocks'
    forward (and recompute) calls: the softmax's output and the tensors of its size made by the
    function that calls the softmax (scores, scaled and masked scores). In backward: tensors of
    that size; where a tensor that grows linearly has that size too (heads x sequence = MLP
    width), a backward tensor of the size counts as scores when the next saved tensor of the
    size to be freed is a score (gradients are made while what they read is consumed)."""
    seq2 = np.zeros(len(size), dtype=bool)
    if paths is None or not calls:
        return seq2, "no blocks: everything that grows with the sequence is taken to grow linearly"
    rows = np.concatenate([c.rows for c in tuple(calls) + tuple(recomputes)])
    u, inv = unique_inverse(stacks[rows])
    sm_sizes, sm_fn = set(), set()
    sm_u = np.array([paths.path(int(sid))[4] for sid in u.tolist()], dtype=bool)
    sm_rows = rows[sm_u[inv]]
    sm_sizes.update(unique(size[sm_rows]).tolist())
    for sid in unique(stacks[sm_rows]).tolist():      # the caller depends on the stack alone
        caller = [k for k in paths.path(int(sid))[0] if not paths.key_text[k].endswith("softmax")]
        if caller:
            sm_fn.add(caller[-1])
    if not sm_sizes and da.facts is not None and da.facts.profiler_like and (run := _run_facts(da)) is not None \
            and run.model_kind == "transformer":
        return seq2, ("REFUSE: attention in a fused call (scaled_dot_product_attention) on the CPU, whose math path "
                      "makes the scores inside it where its frames cannot show them: whether they grow with the "
                      "square of the sequence cannot be told from this trace, so no prediction is made")
    if not sm_sizes:
        # a fused attention kernel makes no scores, but a mask or bias of their shape (batch x heads x
        # sequence x sequence: T5's position bias added to the mask) can be made around it: larger
        # than the blocks' hidden state, in the attention's own frames, and growing with the square
        sizes = size[rows]
        vals, counts = np.unique(sizes, return_counts=True)
        hidden = int(vals[np.argmax(counts)]) if len(vals) else 0
        att_u = np.array([any(_ATTENTION_FN.search(paths.key_text[k]) for k in paths.path(int(sid))[0][-2:])
                          for sid in u.tolist()], dtype=bool)
        big = att_u[inv] & (sizes > 1.5 * hidden) & batch[rows]
        if hidden and big.any():
            per_call = float(sizes[big].sum()) / max(1, len(calls) + len(recomputes))
            return seq2, ("REFUSE: the fused attention call is given a mask or bias of the attention scores' shape "
                          f"({_fmt_bytes(per_call)} per block, {float(sizes[big].max()) / hidden:.1f}x the "
                          "hidden state): it grows with the square of the sequence, and which of its dimensions "
                          "are the sequence cannot be told from the sizes alone, so no prediction is made; record "
                          "the run at the sequence you want to know")
        return seq2, ("no attention scores (softmax) in the blocks (a fused attention kernel): everything that "
                      "grows with the sequence is taken to grow linearly")
    fam = np.array(sorted(sm_sizes), dtype=np.int64)
    in_fam = isin(size, fam) & batch
    # made by the function that calls the softmax (or right under it)
    by_caller_u = np.array([any(k in sm_fn for k in paths.path(int(sid))[0][-3:]) for sid in u.tolist()],
                           dtype=bool)
    scores = in_fam[rows] & by_caller_u[inv]
    seq2[rows[scores]] = True
    linear_sizes = set(unique(size[rows[~scores]]).tolist())
    in_calls = np.zeros(len(size), dtype=bool)
    in_calls[rows] = True
    later = in_fam & ~in_calls & (alloc_phase == P_BACKWARD)
    clash = np.array(sorted(set(fam.tolist()) & linear_sizes), dtype=np.int64)
    ambiguous = later & isin(size, clash)
    seq2 |= later & ~ambiguous
    note = ("attention scores (the softmax's output and the tensors of its size its caller makes, and their "
            "gradients) grow with the square of the sequence, everything else that grows with it linearly")
    if ambiguous.any():
        kept = np.flatnonzero(in_calls & isin(size, clash) & (fi >= 0) & (fi > ai))
        order = np.argsort(fi[kept], kind="stable")
        frees, is_s2 = fi[kept][order], seq2[kept][order]
        amb = np.flatnonzero(ambiguous)
        nxt = np.searchsorted(frees, ai[amb], side="right")
        ok = nxt < len(frees)
        seq2[amb[ok]] = is_s2[nxt[ok]]
        note += ("; a backward tensor of the scores' size that a linear tensor also has counts as a score when "
                 "the next saved tensor of that size to be freed is one")
    return seq2, note


__all__ = ["Blocks", "BlockCall", "Structure", "structure", "blocks", "ROLE_NAMES", "R_OTHER", "R_SCRATCH",
           "R_SAVED", "R_CARRIED", "R_OUTPUT", "R_OUTSIDE_SAVED", "R_RECOMPUTE_SAVED", "R_RECOMPUTE_SCRATCH"]
