"""Moved to `vramscope.viewer.model.lod` (the viewer's Qt-free model); kept for the imports
of tests/test_report.py until they follow."""
from .model.lod import MinMaxPyramid, envelope  # noqa: F401
