"""Bounds on everything the reader builds from a file: no real snapshot comes near any of them.

A pickle is a program for a stack machine, and a few hundred bytes of it can describe
10**25 objects (a list of ten references to a list of ten references to ...) or a tuple
nested 200,000 deep whose hashing overflows the C stack. The reader therefore bounds:

* nesting of every kind: open MARKs and tuples inside tuples (tuples are hashed as dict
  keys and compared; lists and dicts never are, and every walk over them is iterative
  and depth-limited in `flatten`);
* the items on one level of the pickle stack;
* the memo: Python objects kept for later references (the fast path's own memo costs four
  bytes an entry and grows only with the file);
* what the file materializes: the objects the interpreter keeps (measured as Python's
  allocated blocks plus the items put into containers: a few bytes of pickle can build a
  dict, 70 bytes of memory), rows of segments, blocks and annotations (a list shared by
  reference counts once per reference: each becomes rows of its own) and values outside
  the snapshot's schema (flattened into bounded JSON values: see `values.py`);
* string and integer lengths.

A file beyond a bound is refused with a `LimitError` whose one line names the bound.
The bounds that grow with the file size allow what a legitimate file of that size can
hold (a memo slot or a row costs a pickle at least a few bytes).
"""
from __future__ import annotations

from .errors import LimitError

MAX_STRING = 16 << 20         # bytes in one string
MAX_LONG_BYTES = 1024         # bytes of one LONG4 integer
MAX_STACK = 100_000           # items on one level of the pickle stack (trace entries stream out)
MAX_NESTING = 100             # open MARKs, and tuples inside tuples (real files: < 10)
MEMO_FLOOR = 1 << 21          # Python objects in the memo, whatever the file size ...
MEMO_PER_BYTES = 8            # ... or one per this many bytes of file (real files: 13 or more)
ROWS_FLOOR = 1 << 20          # segment, block and annotation rows, whatever the file size ...
ROWS_PER_BYTES = 8            # ... plus one per this many bytes of file
OBJECTS_FLOOR = 8 << 20       # objects the interpreter keeps (Python's allocated blocks), whatever
OBJECTS_PER_BYTES = 2         # the file size, or one per this many bytes of file (real files: 6 or more)

# values outside the schema (unknown keys, allocator settings, annotations' fields)
FLAT_NODES_PER_VALUE = 1 << 16   # items in one flattened value; beyond: "<truncated>"
FLAT_NODES_TOTAL = 1 << 18       # items in all of them; beyond: dropped (and counted)
FLAT_DEPTH = 32                  # nesting kept; deeper: "<nested too deep>"
FLAT_STRING = 1 << 16            # characters kept of one string in such a value
FLAT_CHARS_TOTAL = 1 << 24       # characters in all of them


def memo_limit(file_size: int) -> int:
    return max(MEMO_FLOOR, file_size // MEMO_PER_BYTES)


def rows_limit(file_size: int) -> int:
    return ROWS_FLOOR + file_size // ROWS_PER_BYTES


def objects_limit(file_size: int) -> int:
    return max(OBJECTS_FLOOR, file_size // OBJECTS_PER_BYTES)


def objects_exceeded(limit: int) -> LimitError:
    return LimitError(f"the file builds more than {limit:,} objects, more than a snapshot of this size holds "
                      f"(bound: one per {OBJECTS_PER_BYTES} bytes of file, shared references counted as copies)")


def memo_exceeded(limit: int) -> LimitError:
    return LimitError(f"the pickle memo holds more than {limit:,} objects, more than a snapshot "
                      "of this size needs (bound: one per 8 bytes of file)")


def nesting_exceeded() -> LimitError:
    return LimitError(f"nesting deeper than {MAX_NESTING} levels (bound on nested tuples and MARKs)")


class RowBudget:
    """Counts the rows a snapshot materializes: segments, blocks and annotations, each
    shared reference counted as the copy it becomes."""

    def __init__(self, file_size: int):
        self.limit = rows_limit(file_size)
        self.used = 0

    def take(self, n: int, what: str) -> None:
        self.used += n
        if self.used > self.limit:
            raise LimitError(f"{what} add up to more than {self.limit:,} rows (shared lists counted once "
                             "per reference), more than a file of this size can hold")


__all__ = ["MAX_STRING", "MAX_LONG_BYTES", "MAX_STACK", "MAX_NESTING", "memo_limit", "rows_limit",
           "objects_limit", "memo_exceeded", "nesting_exceeded", "objects_exceeded", "RowBudget"]
