"""A pickle reader for torch memory snapshots that cannot be exploited.

We never call `pickle.load`. The reader is four parts, each in its own module:

* interpreter.py: the general interpreter, an allow-list of opcodes with bounds
  (limits.py) on everything it builds; it refuses anything that imports or calls;
* fastpath.py: the vectorized fast path, which decodes runs of same-shape trace
  entries with numpy, thousands at a time;
* sink.py: where trace entries go, one row of numpy columns each (never a Python
  object per event), with every numeric field held to its range (numbers.py);
* values.py: bounded, flattened copies of values outside the snapshot's schema.

`read_pickle_stream` runs them over an open file and turns every way a hostile or
damaged file can fail into a `SnapshotError` with one line: a file is read, or refused.
"""
from __future__ import annotations

import struct
from typing import BinaryIO

from ..common.files import one_line
from .errors import CorruptError, LimitError, SnapshotError, TruncatedError
from .interpreter import Deframed, Interpreter
from .limits import MAX_NESTING, MAX_STACK, MAX_STRING  # noqa: F401  (re-exported)
from .progress import Progress
from .sink import TraceSink
from .tables import CacheWriteError


def read_pickle_stream(fh: BinaryIO, size: int, directory: str | None, progress: Progress | None = None,
                       fast: bool = True, source: tuple | None = None):
    """Run the reader over an open file (`size`: its length, for the bounds that grow with it).
    Returns (top-level object, sink, interpreter). `fast=False` takes the general interpreter
    for every entry (the fast path must give the same result; tests compare them).
    Raises `SnapshotError` for bad input, `CacheWriteError` when the column files in
    `directory` cannot be written. `source`: (path, stat) where `fh` is that plain file, which
    a helper process may then read in part (prefetch.py)."""
    sink = TraceSink(directory, size)
    reader = Interpreter(Deframed(fh), size, sink, progress, fast=fast, source=source)
    try:
        top = reader.run()
    except BaseException as e:
        sink.discard()
        raise _as_snapshot_error(e) from None
    finally:
        reader.stop_helper()
    return top, sink, reader


def _as_snapshot_error(e: BaseException) -> BaseException:
    """The one-line error a failure while reading untrusted bytes stands for (or `e` itself:
    cancellation, interruption, a cache that cannot be written)."""
    if isinstance(e, (SnapshotError, CacheWriteError)):
        return e
    if isinstance(e, (IndexError, struct.error)):
        return TruncatedError("file ends inside an opcode")
    if isinstance(e, RecursionError):
        return LimitError(f"nesting too deep (bound: {MAX_NESTING} levels)")
    if isinstance(e, MemoryError):
        return LimitError("the file asks for more memory than this machine has")
    if isinstance(e, OSError):
        return SnapshotError(f"cannot read: {one_line(e)}")
    if isinstance(e, (ValueError, TypeError, KeyError, AttributeError, OverflowError, UnicodeError)):
        # Untrusted bytes that slipped past the structural checks: still bad input.
        return CorruptError(f"malformed pickle ({type(e).__name__})")
    return e


__all__ = ["read_pickle_stream", "MAX_STACK", "MAX_STRING", "MAX_NESTING"]
