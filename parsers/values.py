"""Values the reader hands around, and bounded copies of values outside the snapshot's schema.

Fields the snapshot format does not define (unknown keys of trace entries and of the top
level, the allocator settings, annotations' fields) are kept, as plain JSON values, so that
nothing a future torch adds is lost. A pickle can make such a value enormous through
shared references (10**25 items in a few hundred bytes) or deep, so `Flattener` walks it
iteratively with bounds (limits.py): items per value ("<truncated>" beyond), depth ("<nested
too deep>" beyond), string lengths, and a total for the whole file, beyond which further
values are dropped and counted instead of kept. A shared reference is counted as the copy
it becomes. Schema fields that should be text but are not (a frame's filename) become a
short placeholder, never the `str()` of an arbitrary object.
"""
from __future__ import annotations

import math

from . import limits

TRUNCATED = "<truncated>"
TOO_DEEP = "<nested too deep>"


class StackRef:
    """A frames list the fast path decoded, when the interpreter meets it again. Unhashable,
    like the list it stands for (a pickle that uses it as a dict key is refused alike)."""
    __slots__ = ("sid",)
    __hash__ = None  # type: ignore[assignment]  # unhashable, like the list it stands for

    def __init__(self, sid: int):
        self.sid = sid


class Dropped:
    """Marks a value not kept because the file's total for such values was spent."""


DROPPED = Dropped()


def as_text(v, missing: str = "??") -> str:
    """A frame's filename or name: the string as given, a number's digits, else a placeholder."""
    t = type(v)
    if t is str:
        return v
    if v is None:
        return missing
    if t is bool or (t is float and math.isfinite(v)):
        return str(v)
    if t is int:
        return str(v) if v.bit_length() <= 64 else f"<int of {v.bit_length()} bits>"
    return f"<{'frames' if t is StackRef else t.__name__}>"


def _int_value(v: int):
    if -(1 << 63) <= v < (1 << 64):
        return v
    return f"<int of {v.bit_length()} bits>"


class Flattener:
    """Bounded JSON copies of arbitrary reader values; one per file (the totals are per file)."""

    def __init__(self):
        self.nodes_left = limits.FLAT_NODES_TOTAL
        self.chars_left = limits.FLAT_CHARS_TOTAL
        self.dropped = 0

    def _string(self, s: str) -> str:
        if len(s) > limits.FLAT_STRING:
            s = s[:limits.FLAT_STRING] + TRUNCATED
        if len(s) > self.chars_left:
            s = TRUNCATED
        self.chars_left -= len(s)
        return s

    def key(self, k, i: int) -> str:
        """A dict key as a JSON object key (`i`: its position, for keys that are not scalars)."""
        t = type(k)
        if t is str:
            return self._string(k)
        if k is None or t is bool or t is int or t is float:
            return str(_int_value(k)) if t is int else str(k)
        return f"<{t.__name__} key {i}>"

    def _flat_dict(self, d: dict) -> dict | None:
        """The common case (an annotation, the allocator settings): a dict of string keys
        and scalar values, copied in one pass; None when it holds anything else."""
        out = {}
        string = self._string
        for k, x in d.items():
            if type(k) is not str:
                return None
            t = type(x)
            if t is str:
                x = string(x)
            elif t is int:
                if not -(1 << 63) <= x < (1 << 64):
                    return None
            elif not (x is None or t is bool or (t is float and math.isfinite(x))):
                return None
            out[string(k)] = x
        return out

    def value(self, v):
        """A JSON-able copy of `v`, or DROPPED when the file's total is spent."""
        if self.nodes_left <= 0:
            self.dropped += 1
            return DROPPED
        budget = min(self.nodes_left, limits.FLAT_NODES_PER_VALUE)
        t = type(v)
        if t is dict and len(v) < budget:
            flat = self._flat_dict(v)
            if flat is not None:
                self.nodes_left -= len(v) + 1
                return flat
        root = [TRUNCATED]
        work = [(v, root, 0, 0)]
        used = 0
        while work and used < budget:
            x, parent, key, depth = work.pop()
            used += 1
            t = type(x)
            if x is None or t is bool:
                parent[key] = x
            elif t is int:
                parent[key] = _int_value(x)
            elif t is float:
                parent[key] = x if math.isfinite(x) else None
            elif t is str:
                parent[key] = self._string(x)
            elif t is StackRef:
                parent[key] = {"stack": x.sid}
            elif isinstance(x, (list, tuple)):
                if depth >= limits.FLAT_DEPTH:
                    parent[key] = TOO_DEEP
                    continue
                n = min(len(x), budget - used)
                child = [TRUNCATED] * n
                if n < len(x):
                    child.append(TRUNCATED)
                parent[key] = child
                for i in range(n - 1, -1, -1):
                    work.append((x[i], child, i, depth + 1))
            elif isinstance(x, dict):
                if depth >= limits.FLAT_DEPTH:
                    parent[key] = TOO_DEEP
                    continue
                child = {}
                parent[key] = child
                room = budget - used
                for i, (k, val) in enumerate(x.items()):
                    if i >= room:
                        child[TRUNCATED] = TRUNCATED
                        break
                    ks = self.key(k, i)
                    child[ks] = TRUNCATED
                    work.append((val, child, ks, depth + 1))
            else:
                parent[key] = f"<{t.__name__}>"
        self.nodes_left -= max(used, 1)
        return root[0]


__all__ = ["StackRef", "Flattener", "DROPPED", "as_text", "TRUNCATED", "TOO_DEEP"]
