"""Turn a parsed snapshot into answers: categories, iterations, peaks, leaks, OOMs.

No Qt here, ever: the viewer and the command line both call `analyze`. The rules are
data (classifiers/rules.toml; users extend or override them, see rules.py).
"""
from .analysis import (CATEGORIES, PEAK_TYPES, PHASE_NAMES, Analysis, DeviceAnalysis, analyze, by_category_at,
                       live_by_category, live_mask, phase_ranges, peak_type, rule_info, stack_strings,
                       summary_dict, top_allocations)
from .rules import RulesError, load_rules

__all__ = ["CATEGORIES", "PEAK_TYPES", "PHASE_NAMES", "Analysis", "DeviceAnalysis", "analyze", "summary_dict",
           "by_category_at", "live_by_category", "live_mask", "top_allocations", "peak_type", "stack_strings",
           "rule_info", "phase_ranges", "load_rules", "RulesError"]
