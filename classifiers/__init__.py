"""Turn a parsed snapshot into answers: categories, iterations, peaks, leaks, OOMs.

No Qt here, ever, and nothing from above this layer: the services, the viewer and the
command line all call `analyze` and read its typed results (results.py). The rules are
data (classifiers/rules.toml; users extend or override them, see rules.py).

The names below are imported on first use (PEP 562): `vramscope summary` on a cached
file reads its summary document without ever loading the classifier.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "Analysis": "analysis", "DeviceAnalysis": "analysis", "analyze": "analysis",
    "CATEGORIES": "categories", "CATEGORY_TABLE": "categories", "STACK_ORDER": "categories",
    "category_color": "categories", "PEAK_TYPES": "peaks", "PHASE_NAMES": "timeline",
    "annotation_regions": "timeline", "RulesError": "rules", "load_rules": "rules",
    **{n: "results" for n in ("Advice", "Allocation", "DeviceSummary", "Finding", "Iteration", "Leak", "Oom", "Peak",
                              "Region", "StaleGradients", "from_plain", "to_plain")},
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:   # for type checkers and readers: the same names, imported eagerly
    from .analysis import Analysis, DeviceAnalysis, analyze  # noqa: F401
    from .categories import CATEGORIES, CATEGORY_TABLE, STACK_ORDER, category_color  # noqa: F401
    from .peaks import PEAK_TYPES  # noqa: F401
    from .results import (  # noqa: F401
        Advice,
        Allocation,
        DeviceSummary,
        Finding,
        Iteration,
        Leak,
        Oom,
        Peak,
        Region,
        StaleGradients,
        from_plain,
        to_plain,
    )
    from .rules import RulesError, load_rules  # noqa: F401
    from .timeline import PHASE_NAMES, annotation_regions  # noqa: F401
