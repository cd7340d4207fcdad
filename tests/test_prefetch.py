"""The helper process (parsers/prefetch.py): a big file read with a helper decoding its later
part reads exactly as it reads without one (columns, stacks and their order, strings), the
helper takes a real share of the entries, and wherever it stops, fails or is let go, the reader
reads on alone to the same result. Deframed.skip and CrcReader.skip step over bytes as reading
them would."""
from __future__ import annotations

import io
import pickle
import random
import sys
import zlib

import numpy as np
import pytest

from helpers import DATA
from test_fastpath_lists import KEYS_TORCH, _entries
from vramscope.common.files import CrcReader
from vramscope.parsers import prefetch
from vramscope.parsers.cache import read_snapshot
from vramscope.parsers.interpreter import Deframed

sys.path.insert(0, str(DATA))
import fuzzing  # noqa: E402
import hostile  # noqa: E402

BENCH = str(DATA.parent.parent / "benchmarks")


@pytest.fixture
def with_helper(monkeypatch):
    """Helpers for files of any size; what each one took, recorded as it is let go."""
    monkeypatch.setenv("VRAMSCOPE_PARSE_HELPER_MIN", "0")
    monkeypatch.delenv("VRAMSCOPE_PARSE_HELPER", raising=False)
    monkeypatch.setattr(prefetch, "_cpus", lambda: 2)
    monkeypatch.delenv("VRAMSCOPE_PARSE_HELPERS", raising=False)
    taken: list[int] = []
    close = prefetch.Helper.close

    def recording(self):
        if not self.closed_once:
            self.closed_once = True
            taken.append(self.taken)
        close(self)
    monkeypatch.setattr(prefetch.Helper, "closed_once", False, raising=False)
    monkeypatch.setattr(prefetch.Helper, "close", recording)
    return taken


def _without_helper(path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_PARSE_HELPER", "0")
    try:
        return read_snapshot(str(path))
    finally:
        monkeypatch.delenv("VRAMSCOPE_PARSE_HELPER")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    sys.path.insert(0, BENCH)
    import gen_snapshot
    p = tmp_path_factory.mktemp("gen") / "gen.pickle"
    gen_snapshot.generate(str(p), 60_000, seed=3)
    return p


def test_a_generated_file_reads_the_same_with_a_helper(generated, with_helper, monkeypatch):
    helped = read_snapshot(str(generated))
    assert with_helper and with_helper[0] > 20_000, with_helper     # the helper did a real share
    alone = _without_helper(generated, monkeypatch)
    assert fuzzing.snapshot_signature(helped) == fuzzing.snapshot_signature(alone)
    # the same stack ids, in the same order: nothing downstream can tell the two apart
    assert helped.n_stacks == alone.n_stacks
    assert all(helped.stack_frames_list(s) == alone.stack_frames_list(s) for s in range(helped.n_stacks))
    for d, t in alone.traces.items():
        for col, arr in t.columns.items():
            assert (helped.traces[d].columns[col] == arr).all(), col


def test_three_helpers_read_their_parts_and_the_file_reads_the_same(generated, with_helper, monkeypatch):
    monkeypatch.setattr(prefetch, "_cpus", lambda: 8)
    helped = read_snapshot(str(generated))
    assert len(with_helper) == prefetch.MAX_HELPERS == 3
    assert all(t > 5_000 for t in with_helper), with_helper         # each did a part
    assert sum(with_helper) > 40_000
    alone = _without_helper(generated, monkeypatch)
    assert fuzzing.snapshot_signature(helped) == fuzzing.snapshot_signature(alone)
    assert all(helped.stack_frames_list(s) == alone.stack_frames_list(s) for s in range(helped.n_stacks))


def test_entries_the_helper_cannot_take_are_read_by_the_reader(tmp_path, with_helper, monkeypatch):
    # a new frame dict inside a list every 40 entries all along: each such entry needs the
    # interpreter (the helper has no memo), so the helper's part is full of gaps the reader fills
    entries = _entries(40_000, KEYS_TORCH, seed=5)
    path = tmp_path / "gaps.pickle"
    path.write_bytes(pickle.dumps(hostile._snapshot_with(entries), protocol=4))
    helped = read_snapshot(str(path))
    assert with_helper and with_helper[0] > 5_000, with_helper
    alone = _without_helper(path, monkeypatch)
    slow = read_snapshot(str(path), fast=False)
    assert fuzzing.snapshot_signature(helped) == fuzzing.snapshot_signature(alone) == fuzzing.snapshot_signature(slow)


def test_a_helper_that_fails_leaves_the_reader_to_read_on(generated, with_helper, monkeypatch):
    # the helper dies at once (a bad argument): the reader waits for nothing and reads it all
    real_start = prefetch.Helper.start.__func__

    def broken(cls, file_path, st, target, stop, fast):
        return real_start(cls, file_path + ".missing", st, target, stop, fast)
    monkeypatch.setattr(prefetch.Helper, "start", classmethod(broken))
    helped = read_snapshot(str(generated))
    assert with_helper == [0]
    assert fuzzing.snapshot_signature(helped) == fuzzing.snapshot_signature(_without_helper(generated, monkeypatch))


def test_a_helper_let_go_half_way_leaves_the_rest_to_the_reader(generated, with_helper, monkeypatch):
    # the helper's batches stop coming after a few (it is killed): the reader takes those and
    # reads the rest alone
    real_read = prefetch.Helper._try_read

    def few(self):
        if getattr(self, "seen", 0) >= 3:
            self.proc.kill()
            self.proc.wait()
            self.close()
            return None
        got = real_read(self)
        self.seen = getattr(self, "seen", 0) + (got is not None)
        return got
    monkeypatch.setattr(prefetch.Helper, "_try_read", few)
    helped = read_snapshot(str(generated))
    assert with_helper and 0 < with_helper[0] < 40_000, with_helper
    assert fuzzing.snapshot_signature(helped) == fuzzing.snapshot_signature(_without_helper(generated, monkeypatch))


def test_a_batch_the_reader_never_lands_on_is_dropped():
    h = prefetch.Helper.__new__(prefetch.Helper)
    h.target, h.done, h.queue = 100, True, []
    h.queue = [prefetch.Batch(s, 1, {"end": [s + 10]}, b"", [], ()) for s in (100, 150, 200)]
    assert h.take(50) is None and len(h.queue) == 3          # before the helper's part: untouched
    assert h.take(120) is None                               # 100 passed without landing on it
    assert [b.start for b in h.queue] == [150, 200]
    assert h.next_start(120) == 150
    assert h.take(150).start == 150
    assert h.take(200).start == 200 and h.take(300) is None


def test_helpers_where_they_can_pay_one_a_cpu(monkeypatch):
    monkeypatch.delenv("VRAMSCOPE_PARSE_HELPER_MIN", raising=False)
    monkeypatch.delenv("VRAMSCOPE_PARSE_HELPERS", raising=False)
    monkeypatch.setattr(prefetch, "_cpus", lambda: 2)
    assert prefetch.helpers_for(prefetch.MIN_BYTES) == 1 and prefetch.helpers_for(prefetch.MIN_BYTES - 1) == 0
    monkeypatch.setattr(prefetch, "_cpus", lambda: 1)
    assert prefetch.helpers_for(1 << 40) == 0
    monkeypatch.setattr(prefetch, "_cpus", lambda: 3)
    assert prefetch.helpers_for(1 << 40) == 2
    monkeypatch.setattr(prefetch, "_cpus", lambda: 64)
    assert prefetch.helpers_for(1 << 40) == prefetch.MAX_HELPERS
    assert prefetch.main_share(1) > prefetch.main_share(3) > 0
    monkeypatch.setenv("VRAMSCOPE_PARSE_HELPERS", "1")
    assert prefetch.helpers_for(1 << 40) == 1
    monkeypatch.setenv("VRAMSCOPE_PARSE_HELPER", "0")
    assert prefetch.helpers_for(1 << 40) == 0


def _framed(n_entries: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return pickle.dumps({"device_traces": [[{"action": "alloc", "addr": rng.randrange(1 << 40), "note": "x" * rng.randrange(300)}
                                            for _ in range(n_entries)]]}, protocol=4)


@pytest.mark.parametrize("seed", range(4))
def test_deframed_skip_steps_over_what_read_would_hand_out(seed, tmp_path):
    # in memory (FRAME headers read through the file) and on disk (read by position, the
    # range then stepped over at once): the same bytes, and a CrcReader's CRC of the whole
    data = _framed(3000, seed)
    whole = Deframed(io.BufferedReader(io.BytesIO(data))).read(len(data))
    p = tmp_path / "framed.pickle"
    p.write_bytes(data)
    rng = random.Random(seed)
    for kind in ("seekable", "crc", "file", "crc over file"):
        raw = open(p, "rb") if "file" in kind else io.BytesIO(data)
        with raw:
            src = CrcReader(raw) if "crc" in kind else raw if "file" in kind else io.BufferedReader(raw)
            d = Deframed(src)
            at = 0
            for _ in range(12):
                k = rng.randrange(0, 70_000)
                d.skip(k)
                at += k
                m = rng.randrange(1, 40_000)
                got = d.read(m)
                assert got == whole[at:at + m], kind
                at += len(got)
            if "crc" in kind:
                assert src.drain() == (zlib.crc32(data), len(data)), kind


def test_the_reader_reads_none_of_what_the_helper_decoded(generated, with_helper, monkeypatch):
    """The reader steps over the helper's batches (FRAME headers read by position) instead of
    reading them into its buffer: it reads its own part, not the file (it read ~90% of it)."""
    read = Deframed.read_parts
    got: list[int] = []

    def counted(self, n, ahead=None):
        parts = read(self, n, ahead)
        got.append(sum(len(x) for x in parts))
        return parts
    monkeypatch.setattr(Deframed, "read_parts", counted)
    snap = read_snapshot(str(generated))
    read_bytes, size = sum(got), generated.stat().st_size
    assert with_helper and with_helper[0] > 20_000
    share = with_helper[0] / len(snap.traces[0])          # of the entries, what the helper took
    assert read_bytes < (1 - share + 0.1) * size, (read_bytes, size, share)
    monkeypatch.setattr(Deframed, "read_parts", read)
    alone = _without_helper(generated, monkeypatch)
    assert all(np.array_equal(snap.traces[0].columns[k], alone.traces[0].columns[k]) for k in alone.traces[0].columns)


@pytest.mark.parametrize("on_disk", [True, False], ids=["file (read by position)", "stream (read here)"])
def test_crc_reader_skip_counts_what_it_steps_over(tmp_path, on_disk):
    data = random.Random(1).randbytes(3_000_000)
    p = tmp_path / "bytes"
    p.write_bytes(data)
    with open(p, "rb") as fh:
        r = CrcReader(fh if on_disk else io.BytesIO(data))
        assert r.read(1000) == data[:1000]
        r.skip(2_500_000)
        assert r.read(7) == data[2_501_000:2_501_007]
        r.skip(10_000_000)                  # past the end: stops there
        assert r.read(5) == b""
        assert r.drain() == (zlib.crc32(data), len(data))


def test_the_cache_entry_names_the_whole_file_when_a_helper_read_part_of_it(generated, with_helper, monkeypatch,
                                                                             tmp_path):
    # the reader steps over what the helper read, but its CRC still covers every byte
    from vramscope.common.files import crc32_file
    from vramscope.parsers import cache
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    seen = {}
    write = cache._write_entry

    def recording(workdir, snap, sink, columns, ident, source):
        seen.update(ident)
        return write(workdir, snap, sink, columns, ident, source)
    monkeypatch.setattr(cache, "_write_entry", recording)
    cache.open_snapshot(str(generated))
    assert with_helper and with_helper[0] > 20_000
    with open(generated, "rb") as fh:
        assert (seen["crc32"], seen["size"]) == crc32_file(fh)


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_reads_back_as_it_was_written(seed):
    """write_batch / read_batch: every field of every entry as the helper decoded it, whether a
    key is on every entry (its presence then not written) or not, and whatever share of the
    strings is inline (their offsets written for those only)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    shape = ("action", "addr", "size", "frames", "pool_id", "user_metadata")
    n = int(rng.integers(1, 300))
    buf = bytes(rng.integers(0, 256, 4096, dtype=np.uint8))

    def present(p_absent):
        return rng.random(n) >= p_absent

    def str_field(p_inline, p_absent):
        inline = rng.random(n) < p_inline
        starts = rng.integers(0, 4000, n)
        lens = rng.integers(0, 60, n)
        return (rng.integers(0, 1 << 20, n), inline, starts, lens, np.zeros(n, np.int64), present(p_absent))

    lists = rng.integers(0, 4000, n)
    fields = {
        "action": str_field(rng.choice([0.0, 0.05, 1.0]), 0.0),
        "addr": (rng.integers(-(1 << 62), 1 << 62, n), present(0.0)),
        "size": (rng.integers(0, 1 << 40, n), present(rng.choice([0.0, 0.3]))),
        "frames": (rng.integers(0, 1 << 20, n), rng.random(n) < 0.5, lists, lists + rng.integers(0, 3, n) * 2,
                   np.zeros(n, np.int64), present(rng.choice([0.0, 0.1]))),
        "pool_id": (rng.integers(0, 1 << 20, n), rng.random(n) < 0.5, rng.integers(0, 9, n), rng.integers(0, 9, n),
                    np.zeros(n, np.int64), present(0.5)),
        "user_metadata": str_field(0.5, rng.choice([0.0, 0.9])),
    }
    end = np.sort(rng.integers(0, 1 << 30, n))
    out = io.BytesIO()
    uid_of: dict = {}
    prefetch.write_batch(out, 1000, n, end, fields, shape, buf, 7, uid_of, [])
    body = out.getvalue()[prefetch._HEAD.size:]
    batch = prefetch.read_batch(body, 1000, n, shape, [])
    got, _ = batch.fields(shape)
    assert (batch.end == end + 7).all()
    for key in shape:
        f, g = fields[key], got[key]
        assert (g[-1] == f[-1]).all(), key                                  # present
        if key in ("addr", "size"):
            assert (g[0] == f[0]).all()
            continue
        assert (g[0] == f[0]).all() and (g[1] == f[1]).all(), key           # ref, inline
        inl = np.flatnonzero(f[1])
        if key in ("action", "user_metadata"):                              # the inline strings' bytes
            assert [batch.strings[a:a + ln] for a, ln in zip(g[2][inl].tolist(), g[3][inl].tolist())] == \
                [buf[a:a + ln] for a, ln in zip(f[2][inl].tolist(), f[3][inl].tolist())]
        elif key == "frames":                                               # each inline list's bytes
            assert [batch.lists[u] for u in g[2][inl].tolist()] == \
                [buf[a:b] for a, b in zip(f[2][inl].tolist(), f[3][inl].tolist())]
        else:
            assert (g[2] == f[2]).all() and (g[3] == f[3]).all()


def test_a_batch_whose_offsets_disagree_with_its_strings_is_refused():
    import numpy as np
    shape = ("action",)
    n = 4
    f = (np.arange(n), np.array([True, False, True, False]), np.array([0, 0, 5, 0]), np.array([3, 0, 2, 0]),
         np.zeros(n, np.int64), np.ones(n, bool))
    out = io.BytesIO()
    prefetch.write_batch(out, 0, n, np.arange(n) + 10, {"action": f}, shape, b"abcdefgh", 0, {}, [])
    body = bytearray(out.getvalue()[prefetch._HEAD.size:])
    prefetch.read_batch(bytes(body), 0, n, shape, [])                    # as written: reads
    # the inline flags say one string more than the offsets written for them
    arrays_at = 8 + 8 * n + 8 + 4 * n + 8                                # end, ref, then the inline flags
    body[arrays_at + 1] = 1
    with pytest.raises(ValueError):
        prefetch.read_batch(bytes(body), 0, n, shape, [])


def test_batches_grow_to_a_count_or_a_size_whichever_comes_first():
    """Whole batches grow fourfold, to MAX_BATCH entries of small entries, and to about
    BATCH_BYTES of big ones (65,536 entries of 240 bytes outgrew the helper's 16 MB reads and
    read slower than 16,384); never under 256."""
    from vramscope.parsers.fastpath import BATCH_BYTES, MAX_BATCH, next_batch
    assert next_batch(256, 256, 256 * 100) == 1024
    assert next_batch(16384, 16384, 16384 * 64) == MAX_BATCH == 65536
    assert next_batch(MAX_BATCH, MAX_BATCH, MAX_BATCH * 64) == MAX_BATCH
    big = next_batch(16384, 16384, 16384 * 240)
    assert big == BATCH_BYTES // 240 and big * 240 <= BATCH_BYTES < MAX_BATCH * 240
    assert next_batch(1024, 1024, 1024 * (100 << 20)) == 256
    assert prefetch._SLACK < BATCH_BYTES < prefetch._CHUNK
