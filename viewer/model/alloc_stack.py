"""Every allocation as its own band, stacked as memory_viz's Active Memory Timeline does
(numpy only, no Qt).

At any moment the live allocations are stacked oldest at the bottom; when one is freed
everything above it moves down, and a new one goes on top. Nothing is precomputed per
(allocation, moment): the live set of any moment comes from a checkpoint plus at most one
block of events, and a view asks only for the moments its pixel columns show.

    st = AllocStack(alloc_index, free_index, size, key, n_entries)
    st.live_ranks(i)                  # ranks (stack order) live right after entry i
    cols = st.columns(indices, keep)  # every column's stack: ranks, cumulative tops
    st.raster(cols, ...)              # one image, a pixel row per device row

Ranks: allocation order (blocks from before the trace first, in row order), which is the
stack's order. `rank_row[rank]` is the allocation row (the table's, the analysis').

Checkpoints: every `block` entries, the ranks live at that moment followed by the ranks
allocated in the block (CSR). The live set after entry i is the checkpoint before it,
minus what was freed since, plus what was allocated since and is still live: ranks
allocated since are all younger, so the candidates are already in stack order and one
pass filters them. `block` adapts to the run (a power of two of at least 1.5 times the
mean live count), so the candidate lists hold about an int32 per entry (5.5 MB at 10^6
events) and a column costs O(live + block).

Rendering merges what is under a pixel: each column is the exact stack at the moment it
shows (the bucket's highest moment, as the category view's), and a band's edges are
rounded to device rows, so a band thinner than a row takes none, or one, of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...common.arrays import ragged

SHADES = 4            # neighbouring bands of one colour alternate between this many shades


@dataclass
class Columns:
    """The stacks of a set of moments (unique, ascending), flattened: for moment u, its
    ranks are ranks[start[u]:start[u+1]] bottom to top, and top[k] is the cumulative
    bytes at the top of ranks[k] (its bottom is top[k] - size)."""
    moments: np.ndarray      # int64 [U]
    start: np.ndarray        # int64 [U + 1]
    ranks: np.ndarray        # int64 [M]
    top: np.ndarray          # int64 [M]
    size: np.ndarray         # int64 [M]
    col: np.ndarray          # int64 [M]: the moment each belongs to

    def of(self, u: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = int(self.start[u]), int(self.start[u + 1])
        return self.ranks[a:b], self.top[a:b], self.size[a:b]

    def rank_at(self, u: int, y: float) -> int:
        """The rank whose band holds bytes y at moment u (-1: none)."""
        ranks, top, size = self.of(u)
        k = int(np.searchsorted(top, y, side="right"))
        if 0 <= k < len(top) and top[k] - size[k] <= y < top[k]:
            return int(ranks[k])
        return -1

    def band_of(self, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(moment positions u, bottoms, tops) where `rank` is in the stack."""
        hit = np.flatnonzero(self.ranks == rank)
        if not len(hit):
            z = np.zeros(0, dtype=np.int64)
            return z, z, z
        u = np.searchsorted(self.start, hit, side="right") - 1
        return u, self.top[hit] - self.size[hit], self.top[hit]


class AllocStack:
    """Allocations (or any intervals of entries: segments) stacked oldest at the bottom."""

    CHUNK = 64            # checkpoints built at a time (bounds the build's temporaries)

    def __init__(self, alloc_index, free_index, size, key, n_entries: int):
        n = int(n_entries)
        self.n = n
        # entries in 32 bits below 2^31 (half the memory and traffic of int64)
        ent_t = np.int32 if n < (1 << 31) - 1 else np.int64
        alloc = np.asarray(alloc_index)
        free = np.asarray(free_index)
        if len(alloc) > 1 and not bool(np.all(alloc[1:] >= alloc[:-1])):
            order = np.argsort(alloc, kind="stable")
            self.rank_row: np.ndarray | None = order
            alloc, free = alloc[order], free[order]
            size = np.asarray(size)[order]
            key = np.asarray(key)[order]
        else:
            self.rank_row = None
        self.alloc = alloc.astype(ent_t, copy=False)             # sorted: -1 first
        end = free.astype(ent_t)                                  # first entry it is not live after
        end[end < 0] = n
        np.minimum(end, n, out=end)
        self.end = end
        self._end_t = end
        self.size = np.asarray(size, dtype=np.int64)
        self.key = np.asarray(key, dtype=np.uint8)
        R = len(alloc)
        self.n_ranks = R
        idx_t = np.int32 if R < (1 << 31) else np.int64
        # checkpoint j: the state before entry j*block (after entry j*block - 1). Its
        # candidates: the ranks live then, followed by those allocated in its block (the
        # live set of any moment in the block is a subset, already in stack order)
        lived = int(end.sum(dtype=np.int64)) - int(np.maximum(self.alloc + 1, 0).sum(dtype=np.int64))
        mean_live = max(lived, 0) / max(n, 1)
        block = 256
        while block < 1.5 * mean_live and block < (1 << 16):
            block <<= 1
        self.block = block
        nb = n // block + 1
        j0 = (self.alloc.astype(np.int64) + block) // block      # first checkpoint each is live at
        j1 = np.where(end >= n, nb, np.minimum(end // block + 1, nb))
        # ranks allocated inside block j: a contiguous run [first_new[j], first_new[j+1])
        first_new = np.searchsorted(self.alloc, np.arange(nb + 1, dtype=np.int64) * block, side="left")
        self.first_new = first_new
        self.cp_count = np.zeros(nb, dtype=np.int64)
        parts = []
        # a chunk of checkpoints at a time: the ranks live at any of them (those allocated
        # before its end and freed after its start) carried from chunk to chunk
        active = np.zeros(0, dtype=np.int64)
        taken = 0                                                  # ranks with j0 below the chunk's end
        for ja in range(0, nb, self.CHUNK):
            jb = min(nb, ja + self.CHUNK)
            upto = int(np.searchsorted(j0, jb, side="left"))
            active = np.concatenate([active, np.arange(taken, upto, dtype=np.int64)])
            taken = upto
            active = active[j1[active] > ja]
            lo = np.maximum(j0[active], ja)
            cnt = np.minimum(j1[active], jb) - lo
            ok = cnt > 0
            local, owner = ragged(lo[ok] - ja, cnt[ok])
            cp_rank = active[ok][owner]
            self.cp_count[ja:jb] = np.bincount(local, minlength=jb - ja)
            newc = np.diff(first_new[ja:jb + 1])
            new_rank, _ = ragged(first_new[ja:jb], newc)
            new_local = np.repeat(np.arange(jb - ja), newc)
            # each checkpoint's live ranks, then its block's new ones (all younger)
            order = np.argsort(np.concatenate([local * 2, new_local * 2 + 1]), kind="stable")
            parts.append(np.concatenate([cp_rank, new_rank])[order].astype(idx_t))
        self.cand = np.concatenate(parts) if parts else np.zeros(0, dtype=idx_t)
        self.cand_start = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(self.cp_count + np.diff(first_new), out=self.cand_start[1:])
        self._colors: np.ndarray | None = None
        self._palette_key: bytes | None = None

    @property
    def nbytes(self) -> int:
        n = self.cand.nbytes + self.cand_start.nbytes + self.end.nbytes + self.cp_count.nbytes
        if self.rank_row is not None:
            n += self.rank_row.nbytes + self.alloc.nbytes + self.size.nbytes + self.key.nbytes
        return int(n)

    def row_of(self, rank: int) -> int:
        if rank < 0:
            return -1
        return int(self.rank_row[rank]) if self.rank_row is not None else int(rank)

    def rank_of(self, row: int) -> int:
        if row < 0:
            return -1
        if self.rank_row is None:
            return int(row)
        hit = np.flatnonzero(self.rank_row == row)
        return int(hit[0]) if len(hit) else -1

    # -- live sets ---------------------------------------------------------------------------
    def live_ranks(self, i: int) -> np.ndarray:
        """Ranks live right after entry i (-1: before the trace), bottom to top."""
        cols = self.columns(np.array([i]))
        return cols.ranks

    def columns(self, moments, keep: np.ndarray | None = None) -> Columns:
        """The stacks at `moments` (ascending entries, -1 allowed; duplicates are the
        caller's to remove). `keep`: bool per key (hidden categories drop out and the
        bands above them move down, as the category view's)."""
        i = np.asarray(moments, dtype=np.int64)
        U = len(i)
        state = np.clip(i + 1, 0, self.n)                        # entries applied
        j = state // self.block
        c0 = self.cand_start[j]
        # the checkpoint's live ranks, then only the new ones allocated by this moment
        # (the key in the column's own dtype: an int64 key would copy an int32 column per call)
        upto = np.searchsorted(self.alloc, state.astype(self.alloc.dtype), side="left")
        per = self.cp_count[j] + upto - self.first_new[j]
        pos, col = ragged(c0, per)
        ranks = self.cand[pos]
        live = self._end_t[ranks] > i.astype(self._end_t.dtype)[col]
        if keep is not None:
            live &= np.asarray(keep, dtype=bool)[self.key[ranks]]
        ranks, col = ranks[live].astype(np.int64), col[live]
        start = np.zeros(U + 1, dtype=np.int64)
        np.cumsum(np.bincount(col, minlength=U), out=start[1:])
        size = self.size[ranks]
        top = np.cumsum(size)
        counts = np.diff(start)
        ne = counts > 0
        base = np.zeros(U, dtype=np.int64)
        first = start[:-1][ne]
        base[ne] = top[first] - size[first]
        top -= np.repeat(base, counts)
        return Columns(i, start, ranks, top, size, col)

    # -- drawing ---------------------------------------------------------------------------
    def colors(self, palette: np.ndarray) -> np.ndarray:
        """uint32 per rank from `palette` [keys, SHADES] (cached for the same palette)."""
        pk = palette.tobytes()
        colors = self._colors
        if colors is None or self._palette_key != pk:
            colors = self._colors = palette[self.key, np.arange(self.n_ranks) % SHADES].astype(np.uint32)
            self._palette_key = pk
        return colors

    def raster(self, cols: Columns, palette: np.ndarray, y_bottom: float, bytes_per_row: float, rows: int,
               background: int = 0) -> np.ndarray:
        """uint32 ARGB pixels [len(cols.moments), rows]: one image row per moment, its
        pixels from the bottom edge up (`y_bottom` bytes there, `bytes_per_row` each):
        the caller draws it rotated (no transpose copy). `palette`: uint32 [keys, SHADES]."""
        U = len(cols.moments)
        H = int(rows)
        if H <= 0 or U == 0:
            return np.zeros((U, max(H, 0)), dtype=np.uint32)
        M = len(cols.ranks)
        # each band's top edge in rows above the bottom, rounded, clipped to the image
        edge = np.rint((cols.top - y_bottom) * (1.0 / bytes_per_row))
        np.clip(edge, 0, H, out=edge)
        edge = edge.astype(np.int64)
        lengths = np.empty(M + U, dtype=np.int64)
        colors = np.empty(M + U, dtype=np.uint32)
        slot = np.arange(M, dtype=np.int64)
        slot += cols.col                                         # band k of moment u -> k + u
        if M:
            d = np.empty(M, dtype=np.int64)
            d[0] = edge[0]
            np.subtract(edge[1:], edge[:-1], out=d[1:])
            firsts = cols.start[:-1][np.diff(cols.start) > 0]
            d[firsts] = edge[firsts]
            lengths[slot] = d
            colors[slot] = self.colors(palette)[cols.ranks]
        counts = np.diff(cols.start)
        last = np.zeros(U, dtype=np.int64)
        has = counts > 0
        last[has] = edge[cols.start[1:][has] - 1]
        fill = cols.start[1:] + np.arange(U)
        lengths[fill] = H - last
        colors[fill] = background
        return np.repeat(colors, lengths).reshape(U, H)
