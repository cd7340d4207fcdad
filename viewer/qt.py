"""The one door to Qt: the PySide6 workaround, then PySide6 and pyqtgraph.

`vramscope.viewer` imports this module first (viewer/__init__.py), so the workaround is
in place before any code of ours touches Qt, whatever module of the viewer is imported
first (the window, the report's PNG renderer, a test). Qt is imported nowhere else in
vramscope: the import-linter contract in pyproject.toml says so.
"""
import sys


def _immortalize_singletons():
    """Work around PySide6 6.12's reference counting on Python < 3.12.

    Its bindings hand back `None`, `True` and `False` without taking a new
    reference (every void method, every `Signal.emit()`), which is harmless on
    Python 3.12+, where those objects are immortal, and fatal on 3.11: each call
    takes one reference away, and after a few thousand (a few seconds of mouse
    movement over pyqtgraph) the interpreter aborts with "none_dealloc:
    deallocating None" or "bool_dealloc". We give the three singletons what 3.12
    gives them: a reference count too large to ever reach zero. Measured with
    PySide6 6.12.0 / Python 3.11.7: 100 `QWidget.setVisible` calls took 100
    references from None.
    """
    if sys.version_info >= (3, 12):
        return
    import ctypes
    for obj in (None, True, False):
        refcnt = ctypes.c_ssize_t.from_address(id(obj))   # ob_refcnt: an object's first field
        if refcnt.value < (1 << 40):
            refcnt.value += 1 << 40


_immortalize_singletons()


def survives(default=None):
    """For a Python override that Qt calls while painting (an item's `paint`, `boundingRect`,
    an axis's `tickSpacing`): an exception is printed once per function and `default` returned.

    With PySide6 6.12, an exception that escapes a QGraphicsItem override called from inside
    pyqtgraph's own Python `paintEvent` kills the process (shiboken segfaults while storing
    the error: found with a timeline squeezed to zero height). One bad frame must not end the
    user's session."""
    import functools
    import traceback

    def wrap(fn):
        reported = []

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception:
                if not reported:
                    reported.append(True)
                    sys.stderr.write(f"vramscope: {fn.__qualname__} failed (drawing goes on; please report it):\n")
                    traceback.print_exc()
                return default() if callable(default) else default
        return guarded
    return wrap

import pyqtgraph as pg  # noqa: E402
from PySide6 import QtCore, QtGui, QtWidgets  # noqa: E402

__all__ = ["QtCore", "QtGui", "QtWidgets", "pg", "survives"]
