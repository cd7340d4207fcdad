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
"""
from __future__ import annotations

import numpy as np

from .categories import CATEGORY_CODE
from .evidence import E_GUESS, E_TORCH

# torch's profiler categories (torch.profiler._memory_profiler.Category) in our taxonomy
PROFILER_TO_CATEGORY = {"parameter": "weights", "optimizer_state": "optimizer", "gradient": "gradients",
                        "activation": "activations", "autograd_detail": "autograd", "input": "inputs",
                        "temporary": "temporary"}

# synthetic rule ids for a verdict taken from torch's tag, after the rules' own ids
TORCH_RULES = {
    "torch.profiler_category": "torch's memory profiler tagged this tensor (the snapshot's own `category`, "
                               "decided from the autograd graph)",
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


__all__ = ["PROFILER_TO_CATEGORY", "TORCH_RULES", "profiler_tags", "combine"]
