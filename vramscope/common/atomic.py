"""The one way vramscope writes a file: whole or not at all.

A file the user made or asked for (a note sidecar, a report, an export, a cache
entry) must never be left half-written when the process dies (power cut,
SIGKILL, the OOM killer) or a write fails (disk full). So every write goes to a
temporary file in the same directory, is flushed and fsynced, then renamed over
the target with `os.replace` (atomic on POSIX, and on Windows within one
volume), and the directory is fsynced so that the rename itself survives a
crash. A reader sees the old file or the new one, never a mix; on any error the
temporary file is removed and the target is untouched.

The temporary file is created with the same permissions a plain `open(path, "w")`
would give (0o666 less the umask), not mkstemp's 0o600: an exported report is
for sharing.
"""
from __future__ import annotations

import os
import secrets
from typing import BinaryIO, Callable

TEMP_SUFFIX = ".tmp"


def temp_name(path: str) -> str:
    """A fresh hidden name beside `path`: '.NAME.<random>.tmp'."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.{secrets.token_hex(6)}{TEMP_SUFFIX}")


def is_temp_of(name: str, base: str) -> bool:
    """Whether directory entry `name` is a temporary file of `atomic_write(.../base)`."""
    return name.startswith(f".{base}.") and name.endswith(TEMP_SUFFIX)


def fsync_dir(directory: str) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened)."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:          # Windows cannot open a directory; its rename is still atomic
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def atomic_write(path: str, data: bytes | Callable[[BinaryIO], None], durable: bool = True) -> None:
    """Write `data` (bytes, or a function that writes into the open binary file) to
    `path` atomically. `durable=False` skips the fsyncs (caches: losing the newest
    entry to a power cut costs only time, never a result). Raises OSError."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(directory)


__all__ = ["atomic_write", "fsync_dir", "temp_name", "is_temp_of", "TEMP_SUFFIX"]
