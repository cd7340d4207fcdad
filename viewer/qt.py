"""Qt for the viewer: PySide6 and pyqtgraph, and `survives` for overrides Qt calls while painting.

The PySide6 workaround (viewer/__init__.py) is in place before this module, or any other
module of the viewer, imports Qt: importing any `vramscope.viewer` module runs the package's
`__init__` first. Qt is imported nowhere outside `vramscope.viewer` (the import-linter
contracts in pyproject.toml say so), and not in its model package (`viewer/model/`).
"""
import sys


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
