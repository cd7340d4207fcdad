"""What holds the memory at a moment: the live bytes as a tree by code path.

    tree = memory_tree(da, index)          # -> MemoryTree, right after entry `index` (-1: the start)
    tree.roots, tree.children(node), tree.node(node), tree.rows(node), tree.path(node)

A node is one frame of the code that allocated (the user's frames outermost, down to the
op that allocated), and holds every live allocation whose stack passes through it: its
bytes, how many allocations, its share of the live total, its bytes per category (for
colouring) and per evidence level (a node made only of guessed bytes is `guessed`).

The path of a stack (`stack_path`) is read from its outermost frame of the user's code
inward, keeping the user's and libraries' Python frames, profiler modules, autograd nodes
and the op it was called for (C++ ops: the first the Python code called and the innermost
one, the allocating op); what launched the program (runpy, threads, IPython; LAUNCH_PATH),
dispatch plumbing (`_call_impl`), the interpreter's own C++ frames and the allocator's are
dropped, and a frame repeated in a row (recursion, `call` then `redispatch` of one op) is
one node. Two kinds of node are not a frame (`NODE_KINDS`):
  no_frames     allocations recorded without frames (made before history was on)
  freed_stack   allocations made before the trace whose only stack is where they were
                freed (torch's CUDA traces): the tree under it is the free's code, not the
                allocation's
and a backward allocation with no code of the user's whose entry recorded its forward
stack (torch 2.13) sits under that forward code, its autograd node below it.

Speed: stacks are few and rows many. Each row's group (its stack, with the forward stack
and the freed-before-the-trace flag where they apply) and each group's path are computed
once per device (`tree_index`, memoized); a moment is then a few `bincount`s over the live
rows and over the (node, group) pairs. Node ids are the same at every moment of a device,
so a tree view can keep what is expanded while the moment moves.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import numpy as np

from .categories import CATEGORIES
from .evidence import E_GUESS, EVIDENCE
from .stacks import (
    KIND_BUILTIN,
    LAUNCH_PATH,
    PLUMBING_FUNCTIONS,
    ROLE_AUTOGRAD,
    ROLE_LIBRARY,
    ROLE_MODULE,
    ROLE_OP,
    ROLE_USER,
    StackFacts,
)

NODE_FRAME, NODE_NO_FRAMES, NODE_FREED_STACK = range(3)
NODE_KINDS = ("frame", "no_frames", "freed_stack")
_KEEP_ROLES = (ROLE_USER, ROLE_LIBRARY, ROLE_MODULE, ROLE_AUTOGRAD, ROLE_OP)
_ATEN_OP = re.compile(r"at::_ops::(\w+)::(?:call|redispatch)")
_THP_OP = re.compile(r"torch::autograd::THPVariable_(\w+)\(")
# a path element: a frame id (>= 0), or one of these (the node kinds that are not a frame)
_NO_FRAMES_KEY, _FREED_KEY = -1, -2


# -- the path of a stack ----------------------------------------------------------------
class _Paths:
    """Per stack: its path as node keys, outermost first (memoized; one per snapshot)."""

    def __init__(self, facts: StackFacts):
        self.facts = facts
        t = facts.table
        self._cache: dict[int, tuple[int, ...]] = {}
        self._op_frames: dict[str, int] = {}
        # launch code and plumbing, decided once per unique file / function name
        launch_file = np.fromiter((LAUNCH_PATH.search(f) is not None for f in t.files), dtype=bool,
                                  count=len(t.files))
        plumbing = np.fromiter((n in PLUMBING_FUNCTIONS for n in t.names), dtype=bool, count=len(t.names))
        role = t.role
        keep = np.isin(role, _KEEP_ROLES)
        if len(role):
            launch = launch_file[t.file_ids] if len(t.files) else np.zeros(len(role), dtype=bool)
            keep &= ~(np.isin(role, (ROLE_USER, ROLE_LIBRARY)) & launch)
            keep &= ~((role == ROLE_LIBRARY) & plumbing[t.name_ids])
        self.keep = keep
        self.role = role

    def _op_name(self, f: int) -> str:
        t = self.facts.table
        name = t.names[t.name_ids[f]]
        m = _ATEN_OP.search(name) or _THP_OP.search(name)
        return m.group(1) if m else name

    def _op_key(self, f: int) -> int:
        """Frames that name one op are one node, keyed by the first frame seen for it
        (`at::_ops::mm::call` then `::redispatch`; `THPVariable_mm`)."""
        if self.facts.table.kind[f] == KIND_BUILTIN:
            return f
        return self._op_frames.setdefault(self._op_name(f), f)

    def path(self, sid: int) -> tuple[int, ...]:
        p = self._cache.get(sid)
        if p is None:
            p = self._cache[sid] = self._path(sid)
        return p

    def _path(self, sid: int) -> tuple[int, ...]:
        facts = self.facts
        inner_first = facts.frame_ids(sid)
        if not len(inner_first):
            return (_NO_FRAMES_KEY,)
        role = self.role
        kept = [f for f in inner_first[::-1].tolist() if self.keep[f]]     # outermost first
        users = [k for k, f in enumerate(kept) if role[f] == ROLE_USER]
        if users:
            kept = kept[users[0]:]
        # after the innermost Python frame: the op the Python code called and the innermost
        # one (the allocating op); the ops between say how torch dispatched it
        py = [k for k, f in enumerate(kept) if role[f] in (ROLE_USER, ROLE_LIBRARY)]
        cut = py[-1] + 1 if py else 0
        tail = kept[cut:]
        ops = [k for k, f in enumerate(tail) if role[f] == ROLE_OP]
        drop = set(ops[1:-1])
        if len(ops) > 1 and self._op_name(tail[ops[-1]]).startswith(self._op_name(tail[ops[0]]) + "_"):
            drop.add(ops[-1])           # one op and its overload: 'add', then 'add_Tensor'
        tail = [f for k, f in enumerate(tail) if k not in drop]
        keys: list[int] = []
        for f in kept[:cut] + tail:
            k = self._op_key(f) if role[f] == ROLE_OP else f
            if not keys or keys[-1] != k:
                keys.append(k)
        if not keys:                    # only C++ internals: the frame that names the stack
            best = int(facts.best_frame[sid])
            return (best,) if best >= 0 else (_NO_FRAMES_KEY,)
        return tuple(keys)


_PATHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # StackFacts -> _Paths


def _paths(facts: StackFacts) -> _Paths:
    p = _PATHS.get(facts)
    if p is None:
        p = _PATHS[facts] = _Paths(facts)
    return p


def stack_path(facts: StackFacts, sid: int) -> tuple[int, ...]:
    """The frames of stack `sid` a memory tree walks through, outermost first (frame ids;
    (-1,): the stack has no frames). What is kept: the module docstring."""
    return _paths(facts).path(int(sid))


# -- the per-device index: rows -> groups -> paths -> nodes ----------------------------------
@dataclass(frozen=True, eq=False)
class TreeIndex:
    """What every moment of one device shares (built once, `tree_index`)."""
    row_group: np.ndarray    # int32 per allocation row: its group (one path)
    n_groups: int
    parent: np.ndarray       # int32 per node, -1 for a root
    depth: np.ndarray        # int32 per node, 0 for a root
    frame: np.ndarray        # int64 per node: the frame it stands for, -1 for the other kinds
    kind: np.ndarray         # uint8 per node: NODE_FRAME | NODE_NO_FRAMES | NODE_FREED_STACK
    pair_node: np.ndarray    # int32: every node on every group's path ...
    pair_group: np.ndarray   # int32: ... and that group

    @property
    def n_nodes(self) -> int:
        return len(self.parent)


_INDEX: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # DeviceAnalysis -> TreeIndex


def tree_index(da) -> TreeIndex:
    """The memory tree's index of one device (memoized per DeviceAnalysis)."""
    ix = _INDEX.get(da)
    if ix is None:
        ix = _INDEX[da] = _build_index(da)
    return ix


def _row_keys(da, facts: StackFacts) -> tuple[np.ndarray, list[tuple[int, int, bool]]]:
    """(group per row, (stack, forward stack, freed-stack flag) per group)."""
    a = da.allocs
    n_st = facts.n_stacks
    stack = np.asarray(a.stack, dtype=np.int64)
    own = np.where((stack >= 0) & (stack < n_st), stack, -1)
    fwd = np.full(len(own), -1, dtype=np.int64)
    tfs = da.trace_forward_stack
    ai = np.asarray(a.alloc_index)
    if tfs is not None and len(tfs) and n_st:
        has = ai >= 0
        fwd[has] = np.asarray(tfs)[ai[has]]
        has_user = facts.user_frame >= 0
        ok = (fwd >= 0) & (fwd < n_st)
        ok &= ~((own >= 0) & has_user[np.maximum(own, 0)]) & has_user[np.clip(fwd, 0, n_st - 1)]
        fwd[~ok] = -1
    freed = np.zeros(len(own), dtype=bool)
    if da.frees_record_their_own_stack() and n_st:
        # (a row without frames is one of those, whatever freed it)
        framed = (own >= 0) & (facts.lengths[np.maximum(own, 0)] > 0)
        freed = (ai < 0) & (np.asarray(a.free_index) >= 0) & framed
    special = (fwd >= 0) | freed
    # the common rows (their own stack only): a lookup table over stack ids, no sort
    present = np.bincount(own[~special] + 1, minlength=n_st + 1) > 0
    plain = np.flatnonzero(present)
    remap = np.full(n_st + 1, -1, dtype=np.int64)
    remap[plain] = np.arange(len(plain))
    group = np.empty(len(own), dtype=np.int32)
    group[~special] = remap[own[~special] + 1]
    groups = [(int(s) - 1, -1, False) for s in plain.tolist()]
    if special.any():
        sp = np.flatnonzero(special)
        key = ((own[sp] + 1) * (n_st + 1) + (fwd[sp] + 1)) * 2 + freed[sp]
        uk, inv = np.unique(key, return_inverse=True)
        group[sp] = len(groups) + inv
        for k in uk.tolist():
            fl, rest = bool(k % 2), k // 2
            groups.append((rest // (n_st + 1) - 1, rest % (n_st + 1) - 1, fl))
    return group, groups


def _build_index(da) -> TreeIndex:
    facts = da.facts.stacks
    row_group, groups = _row_keys(da, facts)
    paths = _paths(facts)
    nodes: dict[tuple[int, int], int] = {}
    parent: list[int] = []
    depth: list[int] = []
    frame: list[int] = []
    kind: list[int] = []
    pair_node: list[int] = []
    pair_group: list[int] = []
    for g, (own, fwd, freed) in enumerate(groups):
        keys = paths.path(own)
        if fwd >= 0:                    # a backward allocation under the forward code that made it
            keys = paths.path(fwd) + (keys if keys != (_NO_FRAMES_KEY,) else ())
        if freed:
            keys = (_FREED_KEY,) + keys
        up = -1
        for k in keys:
            node = nodes.get((up, k))
            if node is None:
                node = nodes[(up, k)] = len(parent)
                parent.append(up)
                depth.append(depth[up] + 1 if up >= 0 else 0)
                frame.append(k if k >= 0 else -1)
                kind.append(NODE_FRAME if k >= 0 else NODE_NO_FRAMES if k == _NO_FRAMES_KEY else NODE_FREED_STACK)
            pair_node.append(node)
            pair_group.append(g)
            up = node
    return TreeIndex(row_group, len(groups), np.asarray(parent, dtype=np.int32), np.asarray(depth, dtype=np.int32),
                     np.asarray(frame, dtype=np.int64), np.asarray(kind, dtype=np.uint8),
                     np.asarray(pair_node, dtype=np.int32), np.asarray(pair_group, dtype=np.int32))


# -- a moment -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeNode:
    """One node of a memory tree, as plain values."""
    id: int
    parent: int                     # -1: a root
    depth: int
    kind: str                       # NODE_KINDS: frame | no_frames | freed_stack
    frame: int                      # the frame id it stands for (-1 for the other kinds)
    bytes: int
    count: int                      # live allocations under it
    share: float                    # of the live total
    category: str                   # the category holding most of its bytes (its colour)
    by_category: dict[str, int]     # non-zero only, most bytes first
    by_evidence: dict[str, int]     # non-zero only, strongest first
    guessed: bool                   # every byte under it is a guess


@dataclass(frozen=True, eq=False)
class MemoryTree:
    """The live bytes right after entry `index` as a tree by code path (`memory_tree`).

    Node ids come from the device's `TreeIndex` and are the same at every moment; a node
    with nothing live under it now is not in the tree (`bytes[n] == 0`, never a child)."""
    index: int
    total_bytes: int
    total_count: int
    parent: np.ndarray              # int32 per node (all of the index's nodes)
    depth: np.ndarray
    frame: np.ndarray
    kind: np.ndarray
    bytes: np.ndarray               # int64 per node: live bytes under it
    count: np.ndarray               # int64 per node: live allocations under it
    by_category: np.ndarray         # int64 [node, CATEGORIES]
    by_evidence: np.ndarray         # int64 [node, EVIDENCE]
    live_rows: np.ndarray           # the allocation rows live at `index`
    live_group: np.ndarray          # their groups
    _index: TreeIndex
    _order: np.ndarray              # the nodes in the tree, by parent, then most bytes first
    _order_parent: np.ndarray
    _sizes: np.ndarray              # the size of every allocation row

    def __len__(self) -> int:
        return len(self._order)

    @property
    def roots(self) -> np.ndarray:
        return self.children(-1)

    def children(self, node: int) -> np.ndarray:
        """The nodes under `node` (-1: the roots), most bytes first."""
        lo, hi = np.searchsorted(self._order_parent, [node, node + 1])
        return self._order[lo:hi]

    def in_tree(self, node: int) -> bool:
        return 0 <= node < len(self.count) and self.count[node] > 0

    def share(self, node: int) -> float:
        return float(self.bytes[node]) / self.total_bytes if self.total_bytes else 0.0

    def category_of(self, node: int) -> str:
        """The category with the most bytes under `node` (its colour)."""
        return CATEGORIES[int(np.argmax(self.by_category[node]))]

    def guessed(self, node: int) -> bool:
        """Every byte under `node` is a guess (evidence.E_GUESS)."""
        b = int(self.bytes[node])
        return b > 0 and int(self.by_evidence[node, E_GUESS]) == b

    def node(self, node: int) -> TreeNode:
        cats = self.by_category[node]
        evs = self.by_evidence[node]
        by_cat = {CATEGORIES[c]: int(cats[c]) for c in np.argsort(-cats, kind="stable").tolist() if cats[c]}
        return TreeNode(id=int(node), parent=int(self.parent[node]), depth=int(self.depth[node]),
                        kind=NODE_KINDS[int(self.kind[node])], frame=int(self.frame[node]),
                        bytes=int(self.bytes[node]), count=int(self.count[node]), share=self.share(node),
                        category=self.category_of(node), by_category=by_cat,
                        by_evidence={e: int(v) for e, v in zip(EVIDENCE, evs.tolist()) if v},
                        guessed=self.guessed(node))

    def path(self, node: int) -> list[int]:
        """The nodes from the root down to `node`."""
        out = []
        while node >= 0:
            out.append(int(node))
            node = int(self.parent[node])
        return out[::-1]

    def rows(self, node: int) -> np.ndarray:
        """The allocation rows live at this moment under `node` (double-click: the
        allocations), biggest first; -1: every live row."""
        rows = self.live_rows
        if node >= 0:
            ix = self._index
            sel = np.zeros(ix.n_groups, dtype=bool)
            sel[ix.pair_group[ix.pair_node == node]] = True
            rows = rows[sel[self.live_group]]
        size = np.asarray(self._sizes)[rows]
        return rows[np.argsort(-size, kind="stable")]

    def walk(self, min_share: float = 0.0, max_depth: int | None = None) -> list[int]:
        """The nodes depth first, most bytes first at every level, leaving out those under
        `min_share` of the live total (and what is under them) and below `max_depth`."""
        out: list[int] = []
        floor = min_share * self.total_bytes
        todo = [int(n) for n in self.roots[::-1]]
        while todo:
            n = todo.pop()
            if self.count[n] <= 0 or self.bytes[n] < floor:
                continue
            out.append(n)
            if max_depth is None or self.depth[n] < max_depth:
                todo += [int(c) for c in self.children(n)[::-1]]
        return out


def memory_tree(da, index: int) -> MemoryTree:
    """The live allocations right after entry `index` (-1: before the trace) of one device
    (a DeviceAnalysis) as a tree by code path; see the module docstring."""
    ix = tree_index(da)
    a = da.allocs
    live = np.flatnonzero(da.live_mask(index))
    g = ix.row_group[live].astype(np.int64)
    size = a.size[live].astype(np.float64)
    G, C, E, N = ix.n_groups, len(CATEGORIES), len(EVIDENCE), ix.n_nodes
    g_bytes = np.bincount(g, weights=size, minlength=G)
    g_count = np.bincount(g, minlength=G).astype(np.float64)
    g_cat = np.bincount(g * C + da.category[live], weights=size, minlength=G * C).reshape(G, C)
    g_ev = np.bincount(g * E + da.evidence[live], weights=size, minlength=G * E).reshape(G, E)
    pn, pg = ix.pair_node, ix.pair_group

    def per_node(w):
        return np.rint(np.bincount(pn, weights=w[pg], minlength=N)).astype(np.int64)
    nb, nc = per_node(g_bytes), per_node(g_count)
    ncat = np.stack([per_node(g_cat[:, c]) for c in range(C)], axis=1) if N else np.zeros((0, C), np.int64)
    nev = np.stack([per_node(g_ev[:, e]) for e in range(E)], axis=1) if N else np.zeros((0, E), np.int64)
    alive = np.flatnonzero(nc > 0)
    order = alive[np.lexsort((alive, -nb[alive], ix.parent[alive]))]
    return MemoryTree(int(index), int(a.size[live].sum()), len(live), ix.parent, ix.depth, ix.frame, ix.kind,
                      nb, nc, ncat, nev, live, g.astype(np.int32), ix, order, ix.parent[order], a.size)


# -- an icicle: the tree as boxes ---------------------------------------------------------
@dataclass(frozen=True)
class IcicleBox:
    """One node as a box of an icicle chart: `x0`..`x1` in shares of the live total (0..1),
    row `depth` (0: the roots)."""
    node: int
    depth: int
    x0: float
    x1: float


def icicle(tree: MemoryTree, min_share: float = 0.002, max_depth: int | None = None) -> list[IcicleBox]:
    """The tree laid out left to right, most bytes first at every level; nodes narrower
    than `min_share` of the live total are left out with what is under them (the report's
    picture of the peak, the viewer's icicle)."""
    total = float(tree.total_bytes)
    if total <= 0:
        return []
    out: list[IcicleBox] = []
    todo = [(-1, 0.0)]
    while todo:
        node, x = todo.pop()
        for c in tree.children(node).tolist():
            w = float(tree.bytes[c]) / total
            if w < min_share:
                break                   # children are sorted: the rest are narrower
            d = int(tree.depth[c])
            out.append(IcicleBox(c, d, x, x + w))
            if max_depth is None or d < max_depth:
                todo.append((c, x))
            x += w
    return out


__all__ = ["NODE_KINDS", "MemoryTree", "TreeNode", "TreeIndex", "IcicleBox", "memory_tree", "tree_index",
           "stack_path", "icicle"]
