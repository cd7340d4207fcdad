"""The desktop viewer (PySide6 + pyqtgraph): the only package of vramscope that imports Qt.

Its model (`viewer/model/`) imports no Qt (an import-linter contract says so), and neither
does this `__init__`: `import vramscope.viewer.model` works without a display or PySide6.
What it does is the PySide6 workaround below, before any module of the viewer can import
Qt (importing one runs this first): the window, the report's PNG renderer, a test.
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
    references from None. (No Qt is imported to do it.)
    """
    if sys.version_info >= (3, 12):
        return
    import ctypes
    for obj in (None, True, False):
        refcnt = ctypes.c_ssize_t.from_address(id(obj))   # ob_refcnt: an object's first field
        if refcnt.value < (1 << 40):
            refcnt.value += 1 << 40


_immortalize_singletons()
