"""Turn a parsed snapshot into answers: categories, iterations, peaks, leaks, OOMs.

No Qt here, ever: the viewer and the command line both call `analyze`.
"""
from .analysis import CATEGORIES, Analysis, DeviceAnalysis, analyze, summary_dict

__all__ = ["CATEGORIES", "Analysis", "DeviceAnalysis", "analyze", "summary_dict"]
