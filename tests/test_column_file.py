"""Column files are checksummed and written on a writer thread: in order, the same bytes and
CRC as written inline, an element readable mid-stream, a failed write raised by the next call."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from vramscope.parsers.tables import CacheWriteError, ColumnFile


def test_written_in_order_with_the_crc_of_every_byte(tmp_path):
    path = tmp_path / "col.bin"
    col = ColumnFile(np.int64, str(path))
    parts = [np.arange(k, k + 1000, dtype=np.int64) for k in range(0, 100_000, 1000)]
    for p in parts:
        col.append(p)
    assert col.get(12_345) == 12_345            # waits for what is queued
    out = col.finish()
    data = np.concatenate(parts)
    assert (np.asarray(out) == data).all()
    assert col.crc == zlib.crc32(data.tobytes())
    assert path.read_bytes() == data.tobytes()


class _Full:
    name = "full"

    def write(self, b):
        raise OSError(28, "No space left on device")

    def close(self):
        pass


def test_a_failed_write_is_raised_by_the_next_call(tmp_path):
    col = ColumnFile(np.int32, str(tmp_path / "col.bin"))
    col._fh.close()
    col._fh = _Full()
    col.append(np.arange(10, dtype=np.int32))
    with pytest.raises(CacheWriteError, match="No space left"):
        col.finish()


def test_discard_drops_what_is_queued(tmp_path):
    col = ColumnFile(np.int32, str(tmp_path / "col.bin"))
    for _ in range(50):
        col.append(np.zeros(100_000, dtype=np.int32))
    col.discard()                               # no error, no wait for 50 writes to fail
    assert col._fh is None


def test_a_column_of_one_value_writes_nothing_and_holds_no_memory(tmp_path):
    path = tmp_path / "col.bin"
    col = ColumnFile(np.int64, str(path))
    col.fill(0, 3)
    for _ in range(4):
        col.append(np.zeros(50_000, dtype=np.int64))
    assert col.is_constant and col.get(123_456) == 0
    with pytest.raises(IndexError):
        col.get(200_003)
    out = col.finish()
    assert len(out) == 200_003 and out.strides == (0,) and not out.flags.writeable
    assert (np.asarray(out) == 0).all()
    assert not path.exists()


def test_the_first_other_value_writes_what_came_before(tmp_path):
    path = tmp_path / "col.bin"
    col = ColumnFile(np.int32, str(path))
    col.fill(-1, 5)
    col.append(np.full(7, -1, dtype=np.int32))
    assert col.is_constant
    tail = np.arange(10, dtype=np.int32)
    col.append(tail)
    col.fill(-1, 2)
    assert not col.is_constant and col.get(3) == -1 and col.get(13) == 1
    out = col.finish()
    data = np.concatenate([np.full(12, -1, dtype=np.int32), tail, np.full(2, -1, dtype=np.int32)])
    assert (np.asarray(out) == data).all() and col.crc == zlib.crc32(data.tobytes())
    assert path.read_bytes() == data.tobytes()
