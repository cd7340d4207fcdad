"""The timeline: live memory over a whole run at any zoom (widget.py), what is under the
pointer (pointer.py), the three ways to stack it and the what-if overlay (stacking.py),
and the plot items that draw precomputed columns fast (items.py)."""
from .widget import TimelineWidget

__all__ = ["TimelineWidget"]
