"""Vectorized numpy helpers shared by the analysis and the viewer (no Python loop per item)."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt


def ragged(starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated `arange(s, s+l)` for every (start, length), and the owner of each.

    (`np.repeat` plus one cumulative offset: no Python loop over the ranges.)
    """
    lens = np.asarray(lens, dtype=np.int64)
    total = int(lens.sum())
    owner = np.repeat(np.arange(len(lens)), lens)
    if not total:
        return np.zeros(0, dtype=np.int64), owner
    seg_first = np.cumsum(lens) - lens
    pos = np.arange(total, dtype=np.int64)
    pos += np.repeat(np.asarray(starts, dtype=np.int64) - seg_first, lens)
    return pos, owner


def _offset(v: np.ndarray, lo: int, span: int) -> np.ndarray:
    """`v - lo` (each in [0, span)) as table indices: in v's own dtype where span fits it (an
    int32 column stays int32: no int64 copy of it, 27 MB of 3.4 million stack ids)."""
    if not lo:
        return v
    if span - 1 <= np.iinfo(v.dtype).max:
        return v - v.dtype.type(lo)
    return v.astype(np.intp) - lo


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` for integers of a narrow range (stack ids,
    codes): marked in a table the size of their range, numbered by one running count over it
    and looked up, three passes where np.unique sorts (3 million stack ids: 20 ms, not 65).
    np.unique itself where the range is wide against the count (or the values not integers)."""
    v = np.asarray(values)
    if v.ndim != 1 or not len(v) or v.dtype.kind not in "iu":
        return np.unique(v, return_inverse=True)
    lo, hi = int(v.min()), int(v.max())
    span = hi - lo + 1
    if span > max(1 << 16, 2 * len(v)) or hi > np.iinfo(np.intp).max:
        return np.unique(v, return_inverse=True)
    k = _offset(v, lo, span)
    present = np.zeros(span, dtype=bool)
    present[k] = True
    number = np.cumsum(present, dtype=np.intp)
    number -= 1
    return (np.flatnonzero(present) + lo).astype(v.dtype), number[k]


def unique(values: npt.ArrayLike) -> np.ndarray:
    """`np.unique(values)` (the distinct values, sorted) for integers without numpy's hash table:
    numpy 2.3 and later find the distinct values of a plain `np.unique` in a hash set, which
    takes 3 s for 3 million distinct addresses where one sort takes 0.17. Values of a range
    narrow against their count are marked in a table; others are sorted."""
    v = np.asarray(values).ravel()
    if not len(v) or v.dtype.kind not in "iu":
        return np.unique(v)
    lo, hi = int(v.min()), int(v.max())
    span = hi - lo + 1
    if span <= max(1 << 16, 2 * len(v)) and hi <= np.iinfo(np.intp).max:
        present = np.zeros(span, dtype=bool)
        present[_offset(v, lo, span)] = True
        return (np.flatnonzero(present) + lo).astype(v.dtype)
    s = np.sort(v)
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


_FEW = 8          # test values up to which `isin` compares with each, not searches


def isin(element: npt.ArrayLike, test: npt.ArrayLike, invert: bool = False) -> np.ndarray:
    """`np.isin(element, test, invert=invert)` for integers in time that grows with the larger
    side alone: the test values' distinct set (`unique`), then a table over their range where it
    is narrow, else `searchsorted`. numpy sorts both sides together where the range is wide, and
    finds the test side's distinct values in its hash set: 18 addresses looked up among 3 million
    took 2.8 s. A few test values (up to _FEW) are compared with one at a time, in the elements'
    own type (no wider copy of them). np.isin itself for any other kind of value."""
    e, t = np.asarray(element), np.asarray(test)
    if e.dtype.kind not in "iu" or t.dtype.kind not in "iu" or not e.size or not t.size:
        return np.isin(e, t, invert=invert)
    tu = unique(t.ravel())
    if len(tu) <= 8 * _FEW:
        # a few test values (categories, phases, rules, a weight's halves): compared in the
        # elements' own type, no copy of them in a wider one (a row's uint8 category made int64:
        # 35 MB at 4.4 million rows) and no table gathered through int64 positions; values
        # outside that type match none
        info = np.iinfo(e.dtype)
        vals = [v for v in tu.tolist() if info.min <= v <= info.max]
        if len(vals) <= _FEW:
            flat = e.ravel()
            out = np.zeros(len(flat), dtype=bool)
            for v in vals:
                out |= flat == e.dtype.type(v)
            if invert:
                np.logical_not(out, out=out)
            return out.reshape(e.shape)
    common = np.promote_types(e.dtype, t.dtype)
    if common.kind not in "iu":
        return np.isin(e, t, invert=invert)
    flat = e.ravel().astype(common, copy=False)
    tu = tu.astype(common, copy=False)         # (still sorted and distinct: a wider integer type)
    lo, hi = int(tu[0]), int(tu[-1])
    span = hi - lo + 1
    if span <= max(1 << 16, 2 * (len(flat) + len(tu))) and hi <= np.iinfo(np.intp).max:
        table = np.zeros(span, dtype=bool)
        table[tu.astype(np.intp) - lo] = True
        inside = (flat >= lo) & (flat <= hi)
        out = np.zeros(len(flat), dtype=bool)
        out[inside] = table[flat[inside].astype(np.intp) - lo]
    else:
        pos = np.searchsorted(tu, flat)
        np.minimum(pos, len(tu) - 1, out=pos)
        out = tu[pos] == flat
    if invert:
        np.logical_not(out, out=out)
    return out.reshape(e.shape)


def stable_order(key: np.ndarray, descending: bool = False) -> np.ndarray:
    """`np.argsort(key, kind="stable")` (of `-key` with `descending`: ties in their order) as
    int32 below 2^31 items, else int64, for integer keys. Where the key's range and the items'
    positions fit one int64 together (sizes under a TiB beside millions of rows), one sort of
    those composite values, which numpy sorts with SIMD, where the stable argsort of an int64 key
    is a timsort: 3.3 million allocation sizes in 0.08 s, not 0.25."""
    k = np.asarray(key)
    n = len(k)
    idx_t = np.int32 if n < (1 << 31) else np.int64
    if k.ndim != 1 or not n or k.dtype.kind not in "iu":
        return _argsort(k, descending).astype(idx_t)
    lo, hi = int(k.min()), int(k.max())
    pos_bits = max(1, (n - 1).bit_length())
    if (hi - lo).bit_length() + pos_bits > 63:
        return _argsort(k, descending).astype(idx_t)
    comp = np.subtract(hi, k, dtype=np.int64) if descending else np.subtract(k, lo, dtype=np.int64)
    comp <<= pos_bits
    comp |= np.arange(n, dtype=np.int64)
    comp.sort()
    comp &= (1 << pos_bits) - 1
    return comp.astype(idx_t)


def _argsort(k: np.ndarray, descending: bool) -> np.ndarray:
    """The stable argsort; descending without negating the key (which overflows at an integer
    type's ends): the ascending order of the reversed key, mapped back and reversed."""
    if not descending:
        return np.argsort(k, kind="stable")
    return (len(k) - 1 - np.argsort(k[::-1], kind="stable"))[::-1]


__all__ = ["ragged", "unique_inverse", "unique", "isin", "stable_order"]
