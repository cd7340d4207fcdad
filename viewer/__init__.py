"""The desktop viewer (PySide6 + pyqtgraph): the only package of vramscope that imports Qt.

`qt` is imported first: it applies the PySide6 workaround before anything else of ours
touches Qt.
"""
from . import qt  # noqa: F401
