"""What holds the memory now, in words: a memory tree's labels, search, text and JSON.

The tree itself is the analysis' (classifiers/memtree.py: `memory_tree(da, index)`); here
each node gets what a user reads (the frame as present/stacks.py words it), and the tree
becomes the report's short text at the peak and a JSON document.

  node_label(tree, stacks, node)     'forward  (model.py:52)', 'aten::mm', '(no frames)'
  node_where(tree, stacks, node)     'path/model.py:52:forward': the full site, for tooltips
  search_tree(tree, stacks, text)    the nodes whose frame matches: a file ('model.py'), a
                                     function ('forward'), 'file.py:LINE' (that line exactly),
                                     an op ('aten::mm'); case-insensitive
  tree_lines(tree, stacks, ...)      the heaviest nodes as lines, chains of one node that
                                     holds all of its parent's bytes merged into one line
  tree_text(...), tree_document(...) the same as plain text (command line) and as JSON
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..classifiers.evidence import E_GUESS
from ..classifiers.memtree import NODE_KINDS, MemoryTree
from ..common.units import fmt_bytes
from .stacks import Stacks

# what a node that is not a frame stands for
KIND_LABELS = {"no_frames": "(no frames: allocated without a recorded stack)",
               "freed_stack": "(allocated before the trace; below: where it was freed)"}
KIND_WHY = {"no_frames": "these allocations carry no stack: made before history recording began, or recorded "
                         "without stacks",
            "freed_stack": "made before the trace began: torch recorded only the stack of their free, so the code "
                           "below freed them, it did not allocate them"}
_FILE_LINE = re.compile(r"^(.+):(\d+)$")


def node_label(tree: MemoryTree, stacks: Stacks, node: int) -> str:
    """What a tree row or an icicle box says of a node."""
    kind = NODE_KINDS[int(tree.kind[node])]
    if kind != "frame":
        return KIND_LABELS[kind]
    return stacks.frame(int(tree.frame[node])).label


def node_where(tree: MemoryTree, stacks: Stacks, node: int) -> str:
    """The node's full site ('path/file.py:12:function'), or why it is not a frame."""
    kind = NODE_KINDS[int(tree.kind[node])]
    if kind != "frame":
        return KIND_WHY[kind]
    return stacks.frame(int(tree.frame[node])).where


def search_tree(tree: MemoryTree, stacks: Stacks, text: str) -> np.ndarray:
    """The nodes in the tree whose frame matches `text` (see the module docstring), by id.
    Show them with their ancestors (`tree.path(node)`)."""
    q = text.strip().lower()
    if not q:
        return np.zeros(0, dtype=np.int64)
    m = _FILE_LINE.match(q)
    out = []
    for n in tree.walk():
        if NODE_KINDS[int(tree.kind[n])] != "frame":
            hit = q in node_label(tree, stacks, n).lower()
        else:
            fv = stacks.frame(int(tree.frame[n]))
            if m is not None and fv.line > 0:
                hit = fv.line == int(m.group(2)) and fv.file.lower().endswith(m.group(1))
            else:
                hit = q in fv.where.lower() or q in fv.label.lower()
        if hit:
            out.append(n)
    return np.asarray(sorted(out), dtype=np.int64)


@dataclass(frozen=True)
class TreeLine:
    """One line of a tree told briefly: one node, or a chain of nodes each holding all the
    bytes of the one before (`nodes`, outermost first)."""
    depth: int                      # indentation, in lines
    nodes: tuple[int, ...]
    labels: tuple[str, ...]
    bytes: int
    count: int
    share: float
    category: str                   # the category with most bytes
    guess_bytes: int                # of them, a guess (classifiers/evidence.py)


def tree_lines(tree: MemoryTree, stacks: Stacks, max_lines: int = 15, min_share: float = 0.02) -> list[TreeLine]:
    """The `max_lines` heaviest lines of the tree holding at least `min_share` of the live
    bytes, in tree order (a line is shown only under its parent's)."""
    floor = max(min_share * tree.total_bytes, 1)
    chains: list[tuple[int, list[int]]] = []        # (parent chain index, nodes)
    todo: list[tuple[int, int]] = [(-1, int(r)) for r in tree.roots[::-1]]
    while todo:
        up, n = todo.pop()
        if tree.bytes[n] < floor:
            continue
        nodes = [n]
        while True:
            kids = tree.children(nodes[-1])
            if len(kids) == 1 and tree.bytes[kids[0]] == tree.bytes[nodes[-1]]:
                nodes.append(int(kids[0]))
            else:
                break
        chains.append((up, nodes))
        me = len(chains) - 1
        todo += [(me, int(c)) for c in tree.children(nodes[-1])[::-1]]
    # the heaviest lines; bytes never grow going down, so keeping the top ones keeps parents
    keep = sorted(range(len(chains)), key=lambda k: (-int(tree.bytes[chains[k][1][0]]), k))[:max_lines]
    kept = set(keep)
    depth: dict[int, int] = {}
    out: list[TreeLine] = []
    for k, (up, nodes) in enumerate(chains):       # chains are in depth-first order
        if k not in kept or (up >= 0 and up not in kept):
            kept.discard(k)
            continue
        depth[k] = depth[up] + 1 if up >= 0 else 0
        head = nodes[0]
        out.append(TreeLine(depth[k], tuple(nodes), tuple(node_label(tree, stacks, n) for n in nodes),
                            int(tree.bytes[head]), int(tree.count[head]), tree.share(head), tree.category_of(head),
                            int(tree.by_evidence[head, E_GUESS])))
    return out


def guess_words(total: int, guessed: int) -> str:
    """'a guess' when every byte is one, '40% a guess' when some are, '' when none."""
    if guessed <= 0 or total <= 0:
        return ""
    return "a guess" if guessed >= total else f"{max(1, round(100 * guessed / total))}% a guess"


def line_text(line: TreeLine) -> str:
    """'58.0%  160.5 MiB  activations  one_run  (record_cuda.py:74) › forward  (peft_model.py:1007)'."""
    guess = guess_words(line.bytes, line.guess_bytes)
    guess = f" ({guess})" if guess else ""
    return f"{line.share:6.1%}  {fmt_bytes(line.bytes):>10}  {line.category}{guess}  " + " › ".join(line.labels)


def tree_text(tree: MemoryTree, stacks: Stacks, max_lines: int = 15, min_share: float = 0.02) -> str:
    """The tree as indented plain text, for a terminal."""
    lines = tree_lines(tree, stacks, max_lines, min_share)
    head = f"live {fmt_bytes(tree.total_bytes)} in {tree.total_count:,} allocations"
    return "\n".join([head] + ["  " * ln.depth + line_text(ln) for ln in lines])


def tree_document(tree: MemoryTree, stacks: Stacks, min_share: float = 0.005, max_nodes: int = 200) -> dict:
    """The tree as JSON: its heaviest `max_nodes` nodes holding at least `min_share` of the
    live bytes, depth first (each after its parent), with what an icicle needs (parent,
    bytes) and what a reader needs (label, site, categories, evidence)."""
    floor = max(min_share * tree.total_bytes, 1)
    order = tree.walk()
    heavy = sorted((n for n in order if tree.bytes[n] >= floor), key=lambda n: (-int(tree.bytes[n]), tree.depth[n]))
    chosen = set(heavy[:max_nodes])
    nodes = []
    for n in order:
        if n not in chosen or (tree.parent[n] >= 0 and int(tree.parent[n]) not in chosen):
            chosen.discard(n)
            continue
        nd = tree.node(n)
        nodes.append({"id": n, "parent": nd.parent, "depth": nd.depth, "kind": nd.kind,
                      "label": node_label(tree, stacks, n), "where": node_where(tree, stacks, n),
                      "bytes": nd.bytes, "count": nd.count, "share": round(nd.share, 6), "category": nd.category,
                      "by_category": nd.by_category, "by_evidence": nd.by_evidence, "guessed": nd.guessed})
    return {"index": tree.index, "live_bytes": tree.total_bytes, "allocations": tree.total_count,
            "min_share": min_share, "nodes_left_out": int(len(order) - len(nodes)), "nodes": nodes}


__all__ = ["KIND_LABELS", "KIND_WHY", "TreeLine", "node_label", "node_where", "search_tree", "tree_lines",
           "guess_words", "line_text", "tree_text", "tree_document"]
