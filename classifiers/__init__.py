"""Turn a parsed snapshot into answers: categories, iterations, peaks, leaks, OOMs.

No Qt here, ever, and nothing from above this layer: the services, the viewer and the
command line all call `analyze` and read its typed results (results.py). The rules are
data (classifiers/rules.toml; users extend or override them, see rules.py).
"""
from .analysis import Analysis, DeviceAnalysis, analyze
from .categories import CATEGORIES, CATEGORY_TABLE, STACK_ORDER, category_color
from .peaks import PEAK_TYPES
from .results import (
                      Advice,
                      Allocation,
                      DeviceSummary,
                      Finding,
                      Iteration,
                      Leak,
                      Oom,
                      Peak,
                      Region,
                      from_plain,
                      to_plain,
)
from .rules import RulesError, load_rules
from .timeline import PHASE_NAMES, annotation_regions

__all__ = ["Analysis", "DeviceAnalysis", "analyze", "CATEGORIES", "CATEGORY_TABLE", "STACK_ORDER", "category_color",
           "PEAK_TYPES", "PHASE_NAMES", "Advice", "Allocation", "DeviceSummary", "Finding", "Iteration", "Leak", "Oom",
           "Peak", "Region", "from_plain", "to_plain", "RulesError", "load_rules", "annotation_regions"]
