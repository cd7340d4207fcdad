"""What `ranks` keeps of each rank file between runs: one small sealed record per file.

A rank's file is read through its column cache (parsers/cache.py) and its analysis and
summary artifacts (classifiers/cache.py, services/summary.py), but that cache keeps the
24 most recently used snapshots' columns (7 MB for 10^5 events, 70 MB for 10^6), so a
folder of 64 or 1,000 ranks would parse every file again on every run. What `ranks`
needs of a file is small (its summary document for one device, its metadata, the
envelope of live memory: tens of kilobytes), so it is kept here, beside the column
cache (`$VRAMSCOPE_CACHE_DIR/ranks-v1/`), for the `MAX_RECORDS` most recently used files.

A record is found as the column cache finds an entry (parsers.cache.file_key: size, mtime,
checksums of the head and tail) plus the key of the code that made it, and is trusted only
when the file's stat identity (device, inode, size, mtime, ctime) is the one recorded and
the file had not changed for `RACY_NS` before the record was made (a write always moves
ctime; within that window a second write could hide behind the clock's granularity). A
record is sealed with its CRC-32 and checked field by field when read: a damaged, stale or
foreign one is a miss, never an error.
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..common.atomic import atomic_write
from ..common.files import open_regular, read_regular
from ..common.jsonio import dumps, loads
from ..parsers.cache import RACY_NS, cache_root, file_key, seal, unseal

VERSION = 1
MAX_RECORDS = 4096
MAX_RECORD_BYTES = 16 << 20
_MAGIC = b"VSR1"
_SUFFIX = ".rank"


def _folder() -> str | None:
    root = cache_root()
    return os.path.join(os.path.dirname(root), f"ranks-v{VERSION}") if root else None


def identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _record_path(path: str, code_key: str) -> tuple[str, os.stat_result] | None:
    folder = _folder()
    if folder is None:
        return None
    try:
        with open_regular(path) as fh:
            st = os.fstat(fh.fileno())
            key = file_key(fh, st)
    except OSError:
        return None
    return os.path.join(folder, f"{key}-{code_key}{_SUFFIX}"), st


def lookup(path: str, code_key: str) -> dict | None:
    """The record of `path` made by the code `code_key`, or None (no cache, missing,
    stale, damaged)."""
    found = _record_path(path, code_key)
    if found is None:
        return None
    rec_path, st = found
    try:
        payload = unseal(_MAGIC, read_regular(rec_path, MAX_RECORD_BYTES))
        doc = loads(payload) if payload is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("stat") != identity(st):
        return None
    checked = doc.get("checked_ns")
    if not isinstance(checked, int) or max(st.st_mtime_ns, st.st_ctime_ns) >= checked - RACY_NS:
        return None
    record = doc.get("record")
    if not isinstance(record, dict):
        return None
    try:
        os.utime(rec_path)                  # most recently used
    except OSError:
        pass
    return record


def store(path: str, code_key: str, record: dict[str, Any], before: os.stat_result, checked_ns: int) -> None:
    """Keep `record` for `path`, when the file is as it was (`before`) when it was read
    from `checked_ns` on; quietly nothing when there is no cache or it cannot be written."""
    found = _record_path(path, code_key)
    if found is None:
        return
    rec_path, st = found
    if identity(st) != identity(before):
        return                              # changed while it was read
    try:
        os.makedirs(os.path.dirname(rec_path), exist_ok=True)
        atomic_write(rec_path, seal(_MAGIC, dumps({"stat": identity(st), "checked_ns": checked_ns,
                                                   "record": record})), durable=False)
    except (OSError, ValueError, TypeError):
        return
    _prune(os.path.dirname(rec_path))


def _prune(folder: str) -> None:
    """The least recently used records beyond MAX_RECORDS go, once the folder holds an
    eighth more (so that a run over many files does not sort it after every file)."""
    try:
        names = [n for n in os.listdir(folder) if n.endswith(_SUFFIX)]
        if len(names) <= MAX_RECORDS + MAX_RECORDS // 8:
            return
        aged = []
        for n in names:
            try:
                aged.append((os.stat(os.path.join(folder, n)).st_mtime, n))
            except OSError:
                pass
        aged.sort(reverse=True)
        for _, n in aged[MAX_RECORDS:]:
            try:
                os.remove(os.path.join(folder, n))
            except OSError:
                pass
    except OSError:
        pass


# -- checking what a record holds ------------------------------------------------------------
def int_or_none(v: Any) -> bool:
    return v is None or type(v) is int


def int_array(v: Any) -> np.ndarray | None:
    """A list of plain integers as int64, else None."""
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        return None
    try:
        return np.asarray(v, dtype=np.int64)
    except OverflowError:
        return None


def now_ns() -> int:
    return time.time_ns()


__all__ = ["lookup", "store", "identity", "int_or_none", "int_array", "now_ns", "MAX_RECORDS", "VERSION"]
