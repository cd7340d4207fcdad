"""Every allocation (or segment) as its own band: the stacks against a plain replay of the
trace, on real snapshots and fixtures (no Qt)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vramscope.classifiers import analyze
from vramscope.parsers import open_snapshot
from vramscope.viewer.model.alloc_stack import SHADES, AllocStack
from vramscope.viewer.model import DeviceData

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "snapshots"
FILES = [REPO / "assets" / "example.pickle", REPO / "tests" / "data" / "oom.pickle",
         REPO / "tests" / "data" / "expandable.pickle", REPO / "tests" / "data" / "multi_device_oom.pickle",
         REPO / "tests" / "data" / "qlora_4bit.pickle",
         SHARED / "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle",
         SHARED / "volcengine+verl__mem.pickle"]


def devices():
    for path in FILES:
        if not path.exists():
            assert SHARED in path.parents, f"the committed file {path} is missing"
            continue
        snap = open_snapshot(str(path), use_cache=False)
        an = analyze(snap, use_cache=False)
        for dev in an.devices:
            yield path.name, DeviceData(snap, an, dev)


@pytest.fixture(scope="module")
def data():
    out = list(devices())
    assert len(out) >= 5
    return out


def replay_live(d: DeviceData, i: int) -> np.ndarray:
    """Rows live right after entry i, oldest allocation first (a plain scan of every row)."""
    rows = np.flatnonzero((d.alloc_index <= i) & ((d.free_index < 0) | (d.free_index > i)))
    return rows[np.lexsort((rows, d.alloc_index[rows]))]


def moments(d: DeviceData, k: int = 40) -> list[int]:
    rng = np.random.default_rng(7)
    if d.n == 0:
        return [-1]
    picks = {-1, 0, d.n - 1, max(d.peak_index, 0)} | set(rng.integers(0, d.n, k).tolist())
    return sorted(picks)


def test_each_moment_is_its_live_allocations_oldest_first(data):
    for name, d in data:
        st = d.alloc_stack()
        ms = moments(d)
        cols = st.columns(np.array(ms))
        for u, i in enumerate(ms):
            ranks, top, size = cols.of(u)
            rows = np.array([st.row_of(int(r)) for r in ranks], dtype=np.int64)
            assert np.array_equal(rows, replay_live(d, i)), (name, i)
            assert np.array_equal(top, np.cumsum(np.asarray(d.allocs.size)[rows]))
            assert (int(top[-1]) if len(top) else 0) == d.live_at(i) or d.n == 0, (name, i)


def test_hidden_categories_drop_out_and_the_rest_moves_down(data):
    for name, d in data:
        st = d.alloc_stack()
        present = np.flatnonzero(d.cat_present)
        if len(present) < 2:
            continue
        keep = d.stack_keep(present[::2])             # (a category's guessed rows have a key of their own)
        ms = moments(d, 15)
        cols = st.columns(np.array(ms), keep)
        comp = d.composition(ms)
        for u, i in enumerate(ms):
            _, top, _ = cols.of(u)
            want = comp[u][present[::2]].sum()
            assert (float(top[-1]) if len(top) else 0.0) == pytest.approx(want), (name, i)


def test_segments_add_up_to_reserved_memory(data):
    for name, d in data:
        st = d.segments.stack()
        if st is None:
            continue
        ms = moments(d)
        cols = st.columns(np.array(ms))
        for u, i in enumerate(ms):
            _, top, _ = cols.of(u)
            assert (int(top[-1]) if len(top) else 0) == d.reserved_at(i), (name, i)
            # each live segment holds exactly the allocations inside its address range
            ranks, _, _ = cols.of(u)
            segs = [st.row_of(int(r)) for r in ranks]
            inside = sum(d.segments.allocated_in(s, i) for s in segs)
            assert inside == d.live_at(i) or name == "expandable.pickle", (name, i)


def test_the_picture_is_the_stack_rounded_to_rows():
    snap = open_snapshot(str(FILES[0]), use_cache=False)
    an = analyze(snap, use_cache=False)
    d = DeviceData(snap, an, 0)
    st = d.alloc_stack()
    i = d.peak_index
    cols = st.columns(np.array([i - 5, i]))
    palette = (np.arange(256 * SHADES, dtype=np.uint32).reshape(256, SHADES) + 1) | 0xFF000000
    per_row = d.peak_bytes / 300
    px = st.raster(cols, palette, 0.0, per_row, 400, background=0)
    assert px.shape == (2, 400)
    for u in range(2):
        ranks, top, size = cols.of(u)
        column = px[u]
        painted = int(np.count_nonzero(column))
        assert painted == int(np.rint(top[-1] / per_row))            # the stack's height, rounded
        # every allocation of at least two rows shows with its own colour at its place
        colors = st.colors(palette)
        for r, t, s in zip(ranks, top, size):
            if s >= 2 * per_row:
                mid = int((t - s / 2) / per_row)
                assert column[mid] == colors[r]


def test_offset_in_category_is_the_older_allocations_of_its_category(data):
    for name, d in data:
        if d.n == 0:
            continue
        rng = np.random.default_rng(3)
        for row in rng.choice(d.n_rows, size=min(25, d.n_rows), replace=False).tolist():
            a, f = int(d.alloc_index[row]), int(d.free_index[row])
            first = max(a, 0)
            last = f - 1 if f >= 0 else d.n - 1
            if last < first:
                continue
            ms = np.unique(np.linspace(first, last, 6).astype(np.int64))
            got = d.offset_in_category(row, ms)
            for i, off in zip(ms.tolist(), got.tolist()):
                live = replay_live(d, i)
                below = live[:np.flatnonzero(live == row)[0]]
                below = below[d.category[below] == d.category[row]]
                assert off == int(np.asarray(d.allocs.size)[below].sum()), (name, row, i)


def test_checkpoints_stay_small(data):
    for name, d in data:
        st = d.alloc_stack()
        # about an int32 per entry, or less (memory of the lazily built per-allocation view)
        assert st.cand.nbytes <= 8 * max(d.n, 1) + 4 * d.n_rows + 4096, name


def test_allocstack_with_unsorted_rows():
    rng = np.random.default_rng(0)
    n = 2000
    a = np.sort(rng.integers(-1, n, 600))
    life = rng.integers(1, 300, 600)
    f = np.where(rng.random(600) < 0.2, -1, np.minimum(a + life, n - 1))
    f[a < 0] = np.where(rng.random(int((a < 0).sum())) < 0.5, -1, 10)
    perm = rng.permutation(600)
    size = rng.integers(1, 1000, 600)
    key = rng.integers(0, 3, 600)
    st = AllocStack(a[perm], f[perm], size[perm], key[perm], n)
    assert st.rank_row is not None
    for i in (-1, 0, 5, 500, 1999):
        live = [st.row_of(int(r)) for r in st.live_ranks(i)]
        want = [int(p) for p in np.argsort(a[perm], kind="stable")
                if a[perm][p] <= i and (f[perm][p] < 0 or f[perm][p] > i)]
        assert live == want
