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
