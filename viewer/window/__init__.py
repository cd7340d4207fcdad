"""The main window (main.py) and the parts it owns: loading and the worker's progress
(loading.py), the exports (exports.py), the notes' actions (notes.py), the comparison
(compare.py), the docks (docks.py), the status bar and the dialogs."""
from .main import MOUSE_HINTS, MainWindow

__all__ = ["MainWindow", "MOUSE_HINTS"]
