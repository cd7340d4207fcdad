"""What was written on an allocation besides its stack, searchable and groupable.

Three sources (docs/format.md says which torch wrote each, and how):
  user_metadata      the string the thread had set with `_set_memory_metadata` when the entry
                     was made (torch 2.10+, pytorch #165490); a dict is stored as compact JSON
                     (torch main, #193432). Component tracking (torch main) sets it to the
                     module's qualified name, 'optimizer' inside optimizer.step(), '' between.
  annotate entries   `_annotate_tensor` / `_annotate_memory(ptr, md)` (torch 2.14, #190575):
                     notes attached later to a live allocation: `addr` its base address, the
                     note in `user_metadata`. Every note made while the allocation was live
                     belongs to it, in order.
  internal_metadata  the allocator's own tag (torch main, #193432), e.g. 'mallocWithAddress'.

A row's metadata is its alloc entry's user_metadata and internal_metadata plus its notes.
Keys and values: a JSON object gives its items; any other text gives its `key=value` (or
`key:value`) tokens, separated by commas, semicolons or white space; the whole text is
always searchable. Every distinct string is parsed and matched once, never per row.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from ..common.arrays import unique_inverse
from ..parsers.tables import A_ANNOTATE
from .results import MetadataGroup

PARSE_MAX = 1 << 16                  # characters of one string parsed into key/values
_TOKEN = re.compile(r"([^\s,;=:{}]+)\s*[=:]\s*([^\s,;]+)")


def pairs(text: str) -> dict[str, str]:
    """The key/values a metadata string states (see the module docstring)."""
    text = text[:PARSE_MAX]
    s = text.strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            return {str(k): v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
                    for k, v in obj.items()}
    return {k: v for k, v in _TOKEN.findall(text)}


@dataclass(eq=False)
class RowMetadata:
    """Per allocation row: string ids (into snap.strings, -1 none) of its user_metadata and
    internal_metadata, and its notes (annotate entries)."""
    strings: list
    user: np.ndarray                 # int32 per row
    internal: np.ndarray             # int32 per row
    notes: dict                      # row -> ((entry index, note string id), ...), in trace order

    def __post_init__(self):
        self._pairs: dict[int, dict[str, str]] = {}

    def texts(self, row: int) -> list[tuple[str, str]]:
        """[(kind, text)] of a row: 'metadata', then each 'note', then 'internal'."""
        out = []
        if 0 <= row < len(self.user) and self.user[row] >= 0:
            out.append(("metadata", self.strings[int(self.user[row])]))
        out += [("note", self.strings[sid]) for _, sid in self.notes.get(int(row), ())]
        if 0 <= row < len(self.internal) and self.internal[row] >= 0:
            out.append(("internal", self.strings[int(self.internal[row])]))
        return out

    def any(self) -> bool:
        return bool((self.user >= 0).any() or (self.internal >= 0).any() or self.notes)

    def matching(self, query: str) -> np.ndarray:
        """bool per row: its metadata, a note or its internal tag contains `query`
        (case-insensitive); every distinct string tested once."""
        q = query.lower()
        out = np.zeros(len(self.user), dtype=bool)
        for col in (self.user, self.internal):
            ids = np.unique(col[col >= 0])
            hit = ids[np.fromiter((q in self.strings[i].lower() for i in ids.tolist()), dtype=bool, count=len(ids))]
            if len(hit):
                out |= np.isin(col, hit)
        for row, notes in self.notes.items():
            if any(q in self.strings[sid].lower() for _, sid in notes):
                out[row] = True
        return out

    def _pairs_of(self, sid: int) -> dict[str, str]:
        got = self._pairs.get(sid)
        if got is None:
            got = self._pairs[sid] = pairs(self.strings[sid]) if sid >= 0 else {}
        return got

    def row_pairs(self, row: int) -> dict[str, str]:
        """The key/values of a row: its metadata's, then each note's (a later value wins)."""
        out = dict(self._pairs_of(int(self.user[row])))
        for _, sid in self.notes.get(int(row), ()):
            out.update(self._pairs_of(sid))
        return out

    def values(self, key: str | None) -> tuple[np.ndarray, list[str]]:
        """(value code per row, the values): what each row says for `key` ('' none); `key`
        None: the row's whole user_metadata text. Per distinct string, then per noted row."""
        user = self.user
        ids, inv = unique_inverse(user)         # (string ids: a table, not np.unique's sort of every row)
        names: list[str] = [""]
        codes: dict[str, int] = {"": 0}

        def code(v: str) -> int:
            c = codes.get(v)
            if c is None:
                c = codes[v] = len(names)
                names.append(v)
            return c
        if key is None:
            per = [code(self.strings[i]) if i >= 0 else 0 for i in ids.tolist()]
        else:
            per = [code(self._pairs_of(i).get(key, "")) for i in ids.tolist()]
        out = np.asarray(per, dtype=np.int64)[inv.reshape(-1)] if len(user) else np.zeros(0, dtype=np.int64)
        if key is not None:
            for row in self.notes:
                out[row] = code(self.row_pairs(row).get(key, ""))
        return out, names

    def keys(self) -> list[str]:
        """Every key some row's metadata states, most rows first."""
        count: dict[str, int] = {}
        ids, inv = unique_inverse(self.user[self.user >= 0])
        n = np.bincount(inv.reshape(-1), minlength=len(ids))
        for sid, k in zip(ids.tolist(), n.tolist()):
            for key in self._pairs_of(sid):
                count[key] = count.get(key, 0) + k
        for notes in self.notes.values():
            for _, sid in notes:
                for key in self._pairs_of(sid):
                    count[key] = count.get(key, 0) + 1
        return sorted(count, key=lambda k: (-count[k], k))


def row_metadata(snap, device: int, allocs) -> RowMetadata:
    """The metadata of every allocation row of one device (see the module docstring)."""
    cols = snap.trace(device).columns
    ai = allocs.alloc_index
    ok = ai >= 0
    strings = snap.strings
    empty = _empty_string_id(strings)

    def per_row(name: str) -> np.ndarray:
        out = np.full(len(ai), -1, dtype=np.int32)
        col = cols.get(name)
        if col is not None and len(col):
            out[ok] = np.asarray(col)[ai[ok]]
            if empty >= 0:
                out[out == empty] = -1
        return out
    notes: dict[int, list] = {}
    action = np.asarray(cols["action"])
    ann = np.flatnonzero(action == A_ANNOTATE)
    um = cols.get("user_metadata")
    if len(ann) and um is not None:
        addr = np.asarray(allocs.addr)
        order = np.lexsort((ai, addr))
        s_addr, s_ai, s_fi = addr[order], ai[order], np.asarray(allocs.free_index)[order]
        t_addr = np.asarray(cols["addr"])
        for i in ann.tolist():
            sid = int(um[i])
            if sid < 0 or sid == empty:
                continue
            lo, hi = np.searchsorted(s_addr, t_addr[i], "left"), np.searchsorted(s_addr, t_addr[i], "right")
            for k in range(hi - 1, lo - 1, -1):          # the latest allocation there made before it
                if s_ai[k] <= i and (s_fi[k] < 0 or s_fi[k] > i):
                    notes.setdefault(int(order[k]), []).append((i, sid))
                    break
    return RowMetadata(strings, per_row("user_metadata"), per_row("internal_metadata"),
                       {r: tuple(v) for r, v in notes.items()})


def _empty_string_id(strings: list) -> int:
    """The id of '' in the snapshot's strings (-1: none): empty metadata means none."""
    try:
        return strings.index("")
    except ValueError:
        return -1


def group_rows(values: np.ndarray, names: list[str], size: np.ndarray, at_peak: np.ndarray) -> list[MetadataGroup]:
    """Allocations, bytes and bytes live at the peak per value, most bytes first ('' last)."""
    if not len(values):
        return []
    k = len(names)
    count = np.bincount(values, minlength=k)
    nbytes = np.bincount(values, weights=size.astype(np.float64), minlength=k)
    peak = np.bincount(values[at_peak], weights=size[at_peak].astype(np.float64), minlength=k)
    out = [MetadataGroup(value=names[c], allocations=int(count[c]), bytes=int(nbytes[c]), peak_bytes=int(peak[c]))
           for c in range(k) if count[c]]
    out.sort(key=lambda g: (g.value == "", -g.bytes, g.value))
    return out


__all__ = ["pairs", "RowMetadata", "row_metadata", "group_rows"]
