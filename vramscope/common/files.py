"""Opening files that a user (or somebody else) named: regular files only, errors in one line.

A path can name a FIFO, a device, a socket or a directory as easily as a snapshot. Opening a
FIFO for reading blocks until somebody writes to it, so a plain `open()` hangs the program
forever, and reading `/dev/zero` never ends. `open_regular` opens without blocking
(`O_NONBLOCK`, a no-op for regular files), checks what it opened with `fstat` (the file
actually opened, not what the path named a moment earlier) and refuses anything that is not
a regular file with a `NotRegularFileError`, an `OSError` whose message fits on one line.

`read_regular` adds a size cap for small files (sidecars, manifests) and `crc32_file` a
streaming checksum that reads through one reused buffer (no copy of the file in memory).
Nothing here imports another vramscope package.
"""
from __future__ import annotations

import errno
import os
import queue
import stat
import threading
import time
import zlib
from typing import BinaryIO

CHUNK = 1 << 20


class NotRegularFileError(OSError):
    """The path names a FIFO, device, socket or directory, not a regular file."""


class FileTooLargeError(OSError):
    """A file read whole (`read_regular`) is larger than the caller allows."""


def kind_of(mode: int) -> str:
    """'a FIFO', 'a directory', ... for a stat mode (what the user should be told)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: str, mode: int) -> NotRegularFileError:
    err = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
    return NotRegularFileError(err, f"is {kind_of(mode)}, not a regular file", path)


def stat_regular(path: str) -> os.stat_result:
    """`os.stat(path)` (symlinks followed), refusing anything but a regular file."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st.st_mode)
    return st


def open_regular(path: str) -> BinaryIO:
    """Open `path` for reading in binary mode, never blocking on a FIFO and refusing
    anything that is not a regular file (`NotRegularFileError`). Other failures raise the
    usual `OSError` (missing, permission, I/O error)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, limit: int) -> bytes:
    """The whole content of a regular file of at most `limit` bytes (`FileTooLargeError`
    beyond it). Reads what the file holds, never a buffer of `limit` bytes up front (which
    `read(limit)` would allocate)."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise FileTooLargeError(errno.EFBIG, f"is larger than {limit:,} bytes", path)
        chunks = []
        total = 0
        want = size + 1 if size else CHUNK      # size 0: /proc-like files say nothing
        while True:
            data = fh.read(min(want, limit + 1 - total))
            if not data:
                break
            chunks.append(data)
            total += len(data)
            if total > limit:
                raise FileTooLargeError(errno.EFBIG, f"is larger than {limit:,} bytes", path)
            want = CHUNK
    return b"".join(chunks)


def crc32_file(fh: BinaryIO, start: int = 0, length: int | None = None, crc: int = 0,
               chunk: int = CHUNK) -> tuple[int, int]:
    """CRC-32 of `length` bytes (None: to the end) of an open file from offset `start`,
    continuing from `crc`; returns (crc, bytes read). Reads through one buffer."""
    fh.seek(start)
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    while length is None or total < length:
        want = chunk if length is None else min(chunk, length - total)
        got = fh.readinto(view[:want])  # type: ignore[attr-defined]
        if not got:
            break
        crc = zlib.crc32(view[:got], crc)
        total += got
    return crc, total


def pread_at(fh, at: int, n: int) -> bytes | None:
    """n bytes (fewer at the end) of open file `fh` at offset `at`, read by position: the
    file's own position does not move. None where it has no descriptor (or the OS no pread)."""
    try:
        fd = fh.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    if not hasattr(os, "pread"):
        return None
    return os.pread(fd, n, at)


def one_line(e: BaseException) -> str:
    """An OSError (or any exception) as one line without the path: 'Permission denied'."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())




class CrcReader:
    """A read-only file wrapper that keeps the CRC-32 and the count of every byte read
    through it: the identity of a file computed while it is parsed, at no extra I/O.

    The CRC runs on a helper thread, a few MiB at a time in order (zlib releases the GIL
    on large buffers), so that it costs the parse almost no time where a second core is
    free. `drain()` gives the result; `close()` stops the thread when the read is abandoned.
    """

    HANDOFF = 256 << 10        # bytes handed to the thread at a time (held until then)

    def __init__(self, fh: BinaryIO):
        self.fh = fh
        self.crc = 0
        self.count = 0
        self._batch: list = []
        self._batch_bytes = 0
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        if data:
            self.count += len(data)
            self._batch.append(data)
            self._batch_bytes += len(data)
            if self._batch_bytes >= self.HANDOFF:
                self._hand_off()
        return data

    def skip(self, n: int) -> None:
        """Step over the next n bytes (read elsewhere): the CRC thread reads them for the CRC
        (by position, on its own, in order with the rest); a file without a descriptor is read
        here, a MiB at a time, never more than a few MiB waiting for the CRC thread."""
        try:
            fd = self.fh.fileno()
            start = self.fh.tell()
            size = os.fstat(fd).st_size
        except (AttributeError, OSError, ValueError):
            fd = -1
        if fd >= 0 and hasattr(os, "pread"):
            n = max(0, min(n, size - start))
            self._hand_off()
            assert self._queue is not None
            self._queue.put((fd, start, n))
            self.fh.seek(start + n)
            self.count += n
            return
        while n > 0:
            got = len(self.read(min(n, 1 << 20)))
            if not got:
                break
            n -= got
            while self._queue is not None and self._queue.qsize() > 16:
                time.sleep(0.0005)

    def peek_at(self, at: int, n: int) -> bytes | None:
        """n bytes at file offset `at`, read by position: neither the file's position nor the
        CRC moves (what is stepped over is read for the CRC by `skip`). None where the file
        has no descriptor."""
        return pread_at(self.fh, at, n)

    def _hand_off(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if self._queue is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._work, name="vramscope-crc", daemon=True)
            self._thread.start()
        self._queue.put(batch)

    def _work(self) -> None:
        crc = self.crc
        assert self._queue is not None
        while True:
            batch = self._queue.get()
            if batch is None:
                break
            if type(batch) is tuple:          # a range of the file stepped over: read it here
                fd, at, n = batch
                while n > 0:
                    data = os.pread(fd, min(n, 4 << 20), at)
                    if not data:
                        break
                    crc = zlib.crc32(data, crc)
                    at += len(data)
                    n -= len(data)
                continue
            for data in batch:
                crc = zlib.crc32(data, crc)
        self.crc = crc

    def _join(self) -> None:
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = self._queue = None
        for data in self._batch:
            self.crc = zlib.crc32(data, self.crc)
        self._batch, self._batch_bytes = [], 0

    def drain(self) -> tuple[int, int]:
        """Read the rest of the file (bytes after the pickle's STOP, usually none); return
        (CRC-32, bytes) of the whole file."""
        self._join()
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            got = self.fh.readinto(view)  # type: ignore[attr-defined]
            if not got:
                break
            self.crc = zlib.crc32(view[:got], self.crc)
            self.count += got
        return self.crc, self.count

    def close(self) -> None:
        """Stop the helper thread (a read given up half-way)."""
        self._join()


__all__ = ["NotRegularFileError", "FileTooLargeError", "open_regular", "stat_regular", "read_regular",
           "crc32_file", "CrcReader", "kind_of", "one_line", "pread_at"]
