"""Artifacts: results derived from a snapshot, stored beside its cached columns.

The analysis (classifiers/cache.py) and the command line keep their results in the
snapshot's cache entry through these functions, so they are checked like everything else
in the cache: each artifact `art-NAME` (raw bytes, or a standard .npy file mapped on read)
has a checksum file `sum-NAME` (its length and CRC-32) written after it, and an artifact
whose checksum is missing or does not match reads as missing: a damaged, truncated or
half-written one is recomputed, never used. Both files are written atomically; while an
artifact is replaced its checksum is removed first, so a reader never pairs an old sum
with a new file.
"""
from __future__ import annotations

import io
import os
import struct
import time
import zlib

import numpy as np

from ..common.atomic import atomic_write
from ..common.files import crc32_file, open_regular, read_regular
from .snapshot import Snapshot

_SUM = struct.Struct("<4sIQ")
_MAGIC_SUM = b"VSC1"


def read_artifact(snap: Snapshot, name: str) -> bytes | None:
    """A derived result stored beside the snapshot's cached columns (e.g. an analysis),
    or None (no cache, missing, damaged). `name` must already encode everything the result
    depends on."""
    paths = _artifact_paths(snap, name)
    if paths is None:
        return None
    want = _read_sum(paths[1])
    if want is None:
        return None
    try:
        data = read_regular(paths[0], want[1])
    except OSError:
        return None
    return data if (zlib.crc32(data), len(data)) == want else None


def write_artifact(snap: Snapshot, name: str, data: bytes) -> bool:
    """Store `data` atomically beside the cached columns, with its checksum; False when
    there is no cache or it cannot be written."""
    data = bytes(data)
    return _write_artifact_with(snap, name, lambda fh: fh.write(data), zlib.crc32(data), len(data))


def write_artifact_array(snap: Snapshot, name: str, arr: np.ndarray) -> bool:
    """Store one array as an .npy beside the cached columns, atomically, with its checksum;
    False when there is no cache or it cannot be written. Written straight from the array:
    no copy of it in memory."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.hasobject:
        return False
    hdr = io.BytesIO()
    d = np.lib.format.header_data_from_array_1_0(arr)
    try:
        np.lib.format.write_array_header_1_0(hdr, d)
    except ValueError:               # a header over 64 KiB: format 2.0
        hdr = io.BytesIO()
        np.lib.format.write_array_header_2_0(hdr, d)
    npy_header = hdr.getvalue()
    data = arr.reshape(-1).view(np.uint8) if arr.size else np.zeros(0, np.uint8)
    crc = zlib.crc32(data.data, zlib.crc32(npy_header))

    def write(fh):
        fh.write(npy_header)
        fh.write(data)

    return _write_artifact_with(snap, name, write, crc, len(npy_header) + data.nbytes)


def map_artifact_array(snap: Snapshot, name: str) -> np.ndarray | None:
    """An array stored by `write_artifact_array`, memory-mapped read-only, or None (no
    cache, missing, or damaged: its checksum is checked first)."""
    paths = _artifact_paths(snap, name)
    if paths is None:
        return None
    want = _read_sum(paths[1])
    if want is None:
        return None
    try:
        with open_regular(paths[0]) as fh:
            if os.fstat(fh.fileno()).st_size != want[1] or crc32_file(fh) != want:
                return None
        arr = np.load(paths[0], mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, TypeError, EOFError):
        return None
    if arr.size == 0:                    # nothing to map: a plain (empty) array
        arr = np.zeros(arr.shape, dtype=arr.dtype)
    return arr


def _artifact_paths(snap: Snapshot, name: str) -> tuple[str, str] | None:
    if not snap.cache_entry or "/" in name or os.sep in name or name.startswith(".") or not name:
        return None
    return os.path.join(snap.cache_entry, "art-" + name), os.path.join(snap.cache_entry, "sum-" + name)


def _read_sum(path: str) -> tuple[int, int] | None:
    try:
        raw = read_regular(path, _SUM.size)
    except OSError:
        return None
    if len(raw) != _SUM.size:
        return None
    magic, crc, n = _SUM.unpack(raw)
    return (crc, n) if magic == _MAGIC_SUM else None


def _write_artifact_with(snap: Snapshot, name: str, write, crc: int, length: int) -> bool:
    """Write an artifact through `write(file)` into a temporary file in the cache entry,
    rename it into place, then its checksum; False (and no artifact that reads as present)
    when there is no cache or it fails."""
    paths = _artifact_paths(snap, name)
    if paths is None:
        return False
    try:
        try:
            os.remove(paths[1])          # while the artifact changes it must read as missing
        except FileNotFoundError:
            pass
        atomic_write(paths[0], write, durable=False)
        atomic_write(paths[1], _SUM.pack(_MAGIC_SUM, crc, length), durable=False)
        return True
    except (OSError, ValueError, TypeError):
        return False


def artifact_names(snap: Snapshot) -> list[str]:
    """Names of the artifacts stored for this snapshot (without the 'art-' prefix)."""
    if not snap.cache_entry:
        return []
    try:
        return sorted(n[4:] for n in os.listdir(snap.cache_entry) if n.startswith("art-"))
    except OSError:
        return []


def prune_artifacts(snap: Snapshot, drop) -> None:
    """Delete the artifacts whose name `drop(name)` is true (a reader that mapped one
    keeps its pages on POSIX), and temporary files that a crash left behind."""
    if not snap.cache_entry:
        return
    try:
        names = os.listdir(snap.cache_entry)
        present = {n[4:] for n in names if n.startswith("art-")}
        for n in names:
            p = os.path.join(snap.cache_entry, n)
            try:
                if (n.startswith("art-") and drop(n[4:])) or \
                        (n.startswith("sum-") and (n[4:] not in present or drop(n[4:]))) or \
                        (n.startswith((".art-", ".sum-")) and os.path.getmtime(p) < time.time() - 3600):
                    os.remove(p)
            except OSError:
                pass
    except OSError:
        pass
