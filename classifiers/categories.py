"""The one category table (DESIGN.md §3): name, code, colour, stacking order, meaning.

The rules name categories from here, the classifier stores a category as its code
(the index in `CATEGORIES`, a uint8 per allocation: never reorder, only append),
and the viewer, the report and the command line take colours, the order in which
the timeline stacks them and the words that explain them from here too.

Colours are chosen to stay apart for the common colour-vision deficiencies (after
Okabe-Ito and Tableau 10) and ordered like the stack so that neighbouring bands
differ. The stack puts what stays for the whole run at the bottom and short-lived
memory on top, so the sawtooth of each step rides on a flat base.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Category:
    name: str
    color: str               # "#RRGGBB", readable on light and dark backgrounds
    stack_position: int      # 0 = the bottom band of the stacked timeline
    meaning: str             # one line for tooltips, legends and reports


_TABLE = (
    Category("weights", "#4E79A7", 0, "parameters and frozen base weights, LoRA adapters included"),
    Category("activations", "#59A14F", 5, "forward outputs saved for the backward pass"),
    Category("gradients", "#F28E2B", 3, ".grad tensors and their accumulation"),
    Category("optimizer", "#B07AA1", 2, "optimizer state: Adam moments, momentum, master weights"),
    Category("autograd", "#76B7B2", 6, "backward-pass intermediates that are neither gradients nor saved activations"),
    Category("quantization", "#9C755F", 1, "quantized weights, their absmax/statistics, dequantization scratch"),
    Category("inputs", "#EDC948", 4, "batches, labels, attention masks"),
    Category("temporary", "#FF9DA7", 7, "short-lived scratch of the forward pass or the optimizer step"),
    Category("unknown", "#A0A0A0", 8, "no rule recognised it"),
)

CATEGORY_TABLE: dict[str, Category] = {c.name: c for c in _TABLE}
CATEGORIES: tuple[str, ...] = tuple(c.name for c in _TABLE)     # code -> name
CATEGORY_CODE: dict[str, int] = {c: i for i, c in enumerate(CATEGORIES)}
STACK_ORDER: tuple[str, ...] = tuple(c.name for c in sorted(_TABLE, key=lambda c: c.stack_position))
UNKNOWN = CATEGORY_CODE["unknown"]


def category_color(name: str) -> str:
    return CATEGORY_TABLE[name].color if name in CATEGORY_TABLE else CATEGORY_TABLE["unknown"].color


__all__ = ["Category", "CATEGORY_TABLE", "CATEGORIES", "CATEGORY_CODE", "STACK_ORDER", "UNKNOWN", "category_color"]
