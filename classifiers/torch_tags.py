"""torch's own tags for an allocation, combined with our rules (evidence `torch`).

A snapshot converted from torch's memory profiler (`_profile_to_snapshot`) carries a
`category` on every alloc entry, decided by torch from the autograd graph, tensor by
tensor. That is evidence of its own kind, stronger than a stack: where torch tagged an
allocation, its tag decides the category (rule `torch.profiler_category`), and our rules'
verdict stays beside it (`rules_category`) so that every surface can show both where they
disagree. Where the two agree, the rule that fired is kept and the evidence becomes `torch`.

A tag is `precise` when torch decided it for this very tensor; a coarse tag (one given to
everything allocated inside a region, e.g. "inside optimizer.step()") only overrides a
verdict of ours that is a guess or none.

torch's memory component tracking (torch main: `torch.accelerator.memory.component_tracking`,
torch/cuda/memory_component_tracker.py, pytorch #182387/#182388) is the second source (rule
`torch.component`). Its global hooks stamp every allocation with the thread's current
component type: ACTIVATION inside any module's forward, TEMP inside a module's backward,
OPTIMIZER_STATE inside `optimizer.step()`, OTHER between modules; those are coarse (a
temporary inside a forward is an "activation" to it). PARAMETER, BUFFER and GRADIENT are
given by pointer (`_tag_block` on the parameter, the buffer, the `.grad` after accumulation):
precise. A row's tag is its block's in the snapshot's segments where it is live at the end
(the tag after any re-tagging), else the stamp on its alloc entry (`component_rows`).
"""
from __future__ import annotations

import numpy as np

from ..parsers.tables import LIVE_BLOCK_STATES
from .categories import CATEGORY_CODE
from .evidence import E_GUESS, E_TORCH

# torch's profiler categories (torch.profiler._memory_profiler.Category) in our taxonomy
PROFILER_TO_CATEGORY = {"parameter": "weights", "optimizer_state": "optimizer", "gradient": "gradients",
                        "activation": "activations", "autograd_detail": "autograd", "input": "inputs",
                        "temporary": "temporary"}

# component tracking's types (lower-case, as `memory_stats()` names them) in our taxonomy;
# OTHER says nothing of what the memory is
COMPONENT_TO_CATEGORY = {"parameter": "weights", "buffer": "weights", "gradient": "gradients",
                         "optimizer_state": "optimizer", "activation": "activations", "temp": "autograd"}
PRECISE_COMPONENTS = frozenset(("parameter", "buffer", "gradient"))     # tagged by pointer

# synthetic rule ids for a verdict taken from torch's tag, after the rules' own ids
TORCH_RULES = {
    "torch.profiler_category": "torch's memory profiler tagged this tensor (the snapshot's own `category`, "
                               "decided from the autograd graph)",
    "torch.component": "torch's memory component tracking tagged this allocation (its component type: "
                       "parameters, buffers and gradients by pointer, everything else by where it was made)",
}


def profiler_tags(torch_category: np.ndarray, category_names: list) -> tuple[np.ndarray, np.ndarray]:
    """(our category code per row or -1, precise per row) from the per-row profiler category
    (codes into `category_names`; 0 = none). Every profiler tag but `unknown` is precise."""
    lut = np.full(max(1, len(category_names)), -1, dtype=np.int16)
    for code, name in enumerate(category_names):
        ours = PROFILER_TO_CATEGORY.get(name)
        if ours is not None:
            lut[code] = CATEGORY_CODE[ours]
    tag = lut[np.minimum(torch_category, len(lut) - 1)]
    return tag, tag >= 0


def component_tags(component: np.ndarray, component_names: list) -> tuple[np.ndarray, np.ndarray]:
    """(our category code per row or -1, precise per row) from the per-row component code
    (into `component_names`, 0 = none; names compared case-insensitively)."""
    lut = np.full(max(1, len(component_names)), -1, dtype=np.int16)
    exact = np.zeros(len(lut), dtype=bool)
    for code, name in enumerate(component_names):
        key = str(name).lower()
        ours = COMPONENT_TO_CATEGORY.get(key)
        if ours is not None:
            lut[code] = CATEGORY_CODE[ours]
            exact[code] = key in PRECISE_COMPONENTS
    idx = np.minimum(component, len(lut) - 1)
    return lut[idx], exact[idx]


def component_rows(snap, device: int, allocs) -> np.ndarray | None:
    """uint8 per allocation row: its component code (into snap.component_names, 0 none), or
    None when the device's trace and blocks carry none. A block live at the end gives its
    tag (re-tagged by pointer); otherwise the alloc entry's stamp."""
    col = snap.trace(device).columns.get("component")
    blk = snap.device_blocks(device)
    bcomp = blk["component"]
    if col is None and not bcomp.any():
        return None
    ai = allocs.alloc_index
    out = np.zeros(len(ai), dtype=np.uint8)
    if col is not None and len(col):
        col = np.asarray(col)
        ok = ai >= 0
        out[ok] = col[ai[ok]]
    tagged = np.isin(blk["state"], LIVE_BLOCK_STATES) & (bcomp > 0)
    if tagged.any():
        baddr, bc = blk["address"][tagged], bcomp[tagged]
        order = np.argsort(baddr, kind="stable")
        baddr, bc = baddr[order], bc[order]
        live = np.flatnonzero(allocs.free_index < 0)
        pos = np.searchsorted(baddr, allocs.addr[live])
        hit = (pos < len(baddr)) & (baddr[np.minimum(pos, len(baddr) - 1)] == allocs.addr[live])
        out[live[hit]] = bc[pos[hit]]
    return out


def combine(category: np.ndarray, rule: np.ndarray, evidence: np.ndarray, tag: np.ndarray,
            precise: np.ndarray, torch_rule: int) -> np.ndarray:
    """Take torch's tag where it decides (see the module docstring), in place; returns the
    rules' own category per row (a copy made before)."""
    rules_category = category.copy()
    tagged = tag >= 0
    agree = tagged & (tag == category)
    evidence[agree] = E_TORCH
    take = tagged & ~agree & (precise | (evidence >= E_GUESS))
    category[take] = tag[take].astype(category.dtype)
    rule[take] = torch_rule
    evidence[take] = E_TORCH
    return rules_category


__all__ = ["PROFILER_TO_CATEGORY", "COMPONENT_TO_CATEGORY", "PRECISE_COMPONENTS", "TORCH_RULES", "profiler_tags",
           "component_tags", "component_rows", "combine"]
