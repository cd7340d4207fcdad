"""The annotation sidecar file: read defensively, written without losing anything.

A sidecar (`FILE.vramscope.json`) is a user's work, and it travels: copied with a
snapshot, edited by hand, written by a newer vramscope, or by two windows open on the
same file. So reading it:

  * opens only a regular file (a FIFO or a device would hang), of at most MAX_BYTES;
  * checks every note on its own: a note that does not hold together (a wrong type, an
    unknown kind, a note longer than MAX_NOTE_CHARS) is set aside with a warning and
    kept in the file under "set_aside", and the others load;
  * keeps what it does not know: unknown fields of a note (in `Annotation.extra`),
    unknown top-level fields, and a newer format version, all written back as they were.

And writing it (`merge_for_save`): when the file changed on disk since this store read
or wrote it (another window saved notes), the two are merged by note id instead of
one overwriting the other: notes only on disk are kept unless this store deleted them,
notes on both sides take this store's version when it edited them, the disk's
otherwise.
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import Any

from ..common.files import FileTooLargeError, NotRegularFileError, read_regular
from ..common.jsonio import loads

FORMAT = "vramscope-annotations"
FORMAT_VERSION = 1
MAX_BYTES = 16 << 20            # a sidecar of hand-written notes is kilobytes
MAX_NOTE_CHARS = 100_000
MAX_NOTES = 100_000
KNOWN_TOP = ("format", "version", "snapshot", "annotations", "set_aside")


class SidecarError(ValueError):
    """The file is not a sidecar we can read at all (not JSON, too big, not a file)."""


@dataclass
class Identity:
    """What a sidecar was on disk when read or written: a change means another writer."""
    size: int
    mtime_ns: int
    crc: int

    @classmethod
    def of(cls, data: bytes, st: os.stat_result) -> "Identity":
        return cls(st.st_size, st.st_mtime_ns, zlib.crc32(data))


@dataclass
class Contents:
    notes: list[dict]                            # the valid notes, as dicts
    set_aside: list[Any] = field(default_factory=list)   # notes that did not hold together
    extra: dict = field(default_factory=dict)    # unknown top-level fields
    version: int = FORMAT_VERSION
    warnings: list[str] = field(default_factory=list)
    identity: Identity | None = None


def read_bytes(path: str) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file of at most MAX_BYTES. FileNotFoundError when absent;
    SidecarError for anything else that is not a readable sidecar; OSError for I/O."""
    try:
        data = read_regular(path, MAX_BYTES)
    except NotRegularFileError:
        raise SidecarError("not a regular file") from None
    except FileTooLargeError:
        raise SidecarError(f"more than the {MAX_BYTES:,} bytes a sidecar may have") from None
    return data, os.stat(path)


def parse(data: bytes, check_note) -> Contents:
    """The sidecar's notes, each checked by `check_note(dict)` (raises ValueError when the
    note does not hold together). SidecarError when the file is not a sidecar at all."""
    try:
        doc = loads(data)
    except ValueError as e:
        raise SidecarError(f"not JSON ({' '.join(str(e).split())[:80]})") from None
    out = Contents(notes=[])
    if isinstance(doc, list):                  # tolerated: a bare list of notes
        items = doc
    elif isinstance(doc, dict) and isinstance(doc.get("annotations"), list):
        items = doc["annotations"]
        version = doc.get("version")
        if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
            out.version = version
            out.warnings.append(f"written by a newer vramscope (format {version}); unknown fields are kept")
        out.extra = {k: v for k, v in doc.items() if k not in KNOWN_TOP}
        if isinstance(doc.get("set_aside"), list):
            out.set_aside = list(doc["set_aside"])
    else:
        raise SidecarError("not a vramscope annotations file")
    if len(items) > MAX_NOTES:
        out.warnings.append(f"{len(items):,} notes: only the first {MAX_NOTES:,} are read")
        out.set_aside += items[MAX_NOTES:]
        items = items[:MAX_NOTES]
    bad = 0
    for k, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise ValueError("not an object")
            if len(str(item.get("note", ""))) > MAX_NOTE_CHARS:
                raise ValueError(f"a note longer than {MAX_NOTE_CHARS:,} characters")
            check_note(item)
        except (ValueError, TypeError) as e:
            bad += 1
            out.set_aside.append(item)
            if bad <= 3:
                out.warnings.append(f"note {k + 1} set aside: {' '.join(str(e).split())[:120]}")
            continue
        out.notes.append(item)
    if bad > 3:
        out.warnings.append(f"... {bad:,} notes set aside in all (kept in the file under \"set_aside\")")
    return out


def merge_for_save(mine: list, disk: list, synced: set[str], deleted: set[str], edited: set[str]) -> tuple[list, int]:
    """Merge this store's notes with those another writer saved (lists of objects with an
    `id`). `synced`: the ids on disk when this store last read or wrote the file; `deleted`
    and `edited`: what this store changed since. Returns (merged list, notes taken from
    the disk that this store did not have)."""
    on_disk = {d.id: d for d in disk}
    merged = []
    for a in mine:
        if a.id in on_disk:
            merged.append(a if a.id in edited else on_disk[a.id])
        elif a.id in synced and a.id not in edited:
            continue                            # deleted by the other writer
        else:
            merged.append(a)                    # ours, new since the last sync
    have = {a.id for a in mine}
    added = [d for d in disk if d.id not in have and d.id not in deleted]
    return merged + added, len(added)


__all__ = ["read_bytes", "parse", "merge_for_save", "Contents", "Identity", "SidecarError", "FORMAT",
           "FORMAT_VERSION", "MAX_BYTES", "MAX_NOTE_CHARS", "MAX_NOTES"]
