"""The viewer's model: what the windows show, as numpy queries over the analysis (no Qt here).

An import-linter contract in pyproject.toml keeps this package free of Qt (tests/test_layers.py
runs it), so everything in it can be used, and tested, without a display:

  device.py       DeviceData: one device's x axis, envelopes, allocations and findings
  lod.py          MinMaxPyramid: exact per-pixel envelopes (DESIGN.md §7)
  alloc_stack.py  every allocation (or segment) as a band: the stacked views
  rows.py         RowView: the allocations table's sort, filter and frame search
  notes.py        where the user's notes sit on the trace
  compare.py      two recordings on one x axis (the Compare panel)
  whatif.py       the What-if panel's questions to `classifiers.whatif.what_if`
  load.py         open, analyze and model a snapshot (the worker runs it)
"""
from .device import DeviceData, Envelope, FindingView, when_text

__all__ = ["DeviceData", "Envelope", "FindingView", "when_text"]
