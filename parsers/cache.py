"""Open a snapshot, through a cache of memory-mapped columns that is never trusted blindly.

The first open streams the pickle into column files inside a fresh directory of the user
cache (`$VRAMSCOPE_CACHE_DIR`, else the platform's user cache dir), then renames it into
place: a reader sees a complete entry or none. A reopen maps the columns read-only, so it
costs almost nothing and shares pages with the OS cache.

An entry is found by a key (the file's size, mtime and a CRC of its head and tail) and is
then checked, every time, before anything in it is used:

* identity: the entry records the snapshot it came from: its size and the CRC-32 of its
  whole content (computed while parsing, from the bytes parsed), and its stat identity
  (device, inode, size, mtime, ctime) with the time we last checked the content. Any
  write to a file changes its ctime, and ctime cannot be set back by a user, so an
  unchanged stat identity means unchanged content, except right after a write, when
  the clock's granularity could hide a second one: a file whose ctime or mtime is
  within `RACY_NS` of our last check is hashed again (as git does with "racily clean"
  index entries). So the common reopen costs one fstat (on POSIX; on Windows, where
  st_ctime is the creation time, the content is hashed on every open); a copied, touched
  or edited file (or an entry that came from another file: swapped entry folders) costs
  one full-content CRC (about 0.15 s per 500 MB here), which either confirms the entry
  (and refreshes the recorded identity) or discards it;
* integrity: every file of the entry carries a CRC-32 (the columns' and tables' in the
  manifest, the manifest and the source record in a header of their own, each artifact
  in a checksum file beside it: artifacts.py), checked on every open: a flipped byte or a
  truncated file discards the entry (or reads as a missing artifact), which is rebuilt.

A damaged entry is never served and never fatal: anything unexpected while reading one
makes it a cache miss. When no cache directory can be written (read-only disk, disk
full), we parse into memory and say nothing: caching is an optimisation, never a reason
to fail. Only regular files are opened, the snapshot and the cache's own files alike.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
import zlib
from contextlib import contextmanager

import numpy as np

from ..common import jsonio
from ..common.atomic import atomic_write
from ..common.files import CrcReader, NotRegularFileError, crc32_file, one_line, open_regular, read_regular
# artifacts live in their own module; their names stay importable from here (classifiers/cache.py)
from .artifacts import (artifact_names, map_artifact_array, prune_artifacts, read_artifact,  # noqa: F401
                        write_artifact, write_artifact_array)
from .errors import CorruptError, LimitError, NotASnapshotError, SnapshotError
from .progress import Progress
from .reader import read_pickle_stream
from .snapshot import BLOCK_COLUMNS, SEGMENT_COLUMNS, DeviceTrace, Snapshot, build_tables, interned_arrays
from .tables import ALL_COLUMNS, CacheWriteError, constant_column, map_column

CACHE_VERSION = 7        # 7: a column of one value is no file (the manifest's "constant"); 6: annotate action, host memory, component tags, internal_metadata, FX frames
_HASH_SPAN = 1 << 16
MAX_ENTRIES = 24          # keep the most recently used snapshots' columns
RACY_NS = 2_000_000_000   # a file changed this close to our last look may have changed again unseen
# st_ctime is the inode's change time on POSIX; on Windows it is the creation time, which an
# in-place write keeps: there the content is hashed on every open
_CTIME_TELLS_WRITES = os.name == "posix"
MAX_MANIFEST = 1 << 31    # bytes: the manifest holds every string of the snapshot

_SEAL = struct.Struct("<4sIQ")          # magic, CRC-32 of the payload, payload length
_MAGIC_MANIFEST, _MAGIC_SOURCE = b"VSM1", b"VSS1"


def cache_root() -> str | None:
    root = os.environ.get("VRAMSCOPE_CACHE_DIR")
    if root == "":
        return None
    if root is None:
        try:
            import platformdirs
            root = platformdirs.user_cache_dir("vramscope", appauthor=False)
        except Exception:  # platformdirs missing or no home: no cache
            return None
    return os.path.join(root, f"snapshots-v{CACHE_VERSION}")


def file_key(fh, st: os.stat_result) -> str:
    """Where to look for a file's entry: size, mtime and checksums of its head and tail.
    (zlib's CRC32 rather than hashlib: this finds an entry, whose identity is then checked;
    hashlib would load OpenSSL, 3 MB of resident memory, on every run.)"""
    fh.seek(0)
    head = fh.read(_HASH_SPAN)
    tail = b""
    if st.st_size > _HASH_SPAN:
        fh.seek(max(_HASH_SPAN, st.st_size - _HASH_SPAN))
        tail = fh.read(_HASH_SPAN)
    fh.seek(0)
    return (f"{st.st_size:x}-{st.st_mtime_ns:x}-{zlib.crc32(head):08x}{zlib.adler32(head):08x}"
            f"-{zlib.crc32(tail):08x}{zlib.adler32(tail):08x}")


def _stat_identity(st: os.stat_result) -> list:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


# -- sealed files: a header with the payload's CRC-32 and length ----------------------------
def seal(magic: bytes, payload: bytes) -> bytes:
    return _SEAL.pack(magic, zlib.crc32(payload), len(payload)) + payload


def unseal(magic: bytes, data: bytes) -> bytes | None:
    """The payload of a sealed file, or None when it is not one or is damaged."""
    if len(data) < _SEAL.size:
        return None
    m, crc, n = _SEAL.unpack_from(data)
    payload = data[_SEAL.size:]
    if m != magic or n != len(payload) or zlib.crc32(payload) != crc:
        return None
    return payload


def _read_sealed(path: str, magic: bytes, limit: int = MAX_MANIFEST) -> bytes | None:
    try:
        return unseal(magic, read_regular(path, limit))
    except OSError:
        return None


# -- opening ------------------------------------------------------------------------------
def open_snapshot(path: str, progress: Progress | None = None, use_cache: bool = True) -> Snapshot:
    """Read a snapshot file (or its cached columns). Raises `SnapshotError` for bad input,
    including a path that is not a readable regular file."""
    with _opened(path) as fh:
        st = os.fstat(fh.fileno())
        root = cache_root() if use_cache else None
        entry = None
        if root is not None:
            entry = os.path.join(root, file_key(fh, st))
            snap = _load_cached(entry, path, fh, st)
            if snap is not None:
                return snap
        return _parse(path, fh, st, root, entry, progress)


def read_snapshot(path: str, progress: Progress | None = None, fast: bool = True) -> Snapshot:
    """Read a snapshot into memory without the cache. `fast=False` takes the general
    interpreter for every trace entry: the result must equal the fast path's (tests and
    the fuzz campaign compare the two)."""
    with _opened(path) as fh:
        return _parse_into(path, fh, os.fstat(fh.fileno()), None, None, None, progress, fast)


@contextmanager
def _opened(path: str):
    """The user's file, open for reading: every failure, opening or reading, is a
    `SnapshotError` that names the path."""
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        raise SnapshotError("no such file", path) from None
    except NotRegularFileError as e:
        raise SnapshotError(e.strerror or "not a regular file", path) from None
    except OSError as e:
        raise SnapshotError(f"cannot read: {one_line(e)}", path) from None
    with fh:
        try:
            yield fh
        except SnapshotError as e:
            if e.path is None:
                e.path = path
            raise
        except OSError as e:
            raise SnapshotError(f"cannot read: {one_line(e)}", path) from None


def _parse(path, fh, st, root, entry, progress):
    workdir = None
    if entry is not None:
        try:
            os.makedirs(root, exist_ok=True)
            workdir = tempfile.mkdtemp(prefix=".tmp-", dir=root)
        except OSError:
            workdir = None
    try:
        return _parse_into(path, fh, st, root, entry, workdir, progress)
    except CacheWriteError:
        # the cache folder cannot take the columns (disk full, I/O error): read into memory
        _remove(workdir)
        fh.seek(0)
        return _parse_into(path, fh, st, None, None, None, progress)


def _parse_into(path, fh, st, root, entry, workdir, progress, fast=True):
    started_ns = time.time_ns()
    if progress is not None:
        progress.start("Reading", st.st_size)
    reader = CrcReader(fh)
    try:
        top, sink, interp = read_pickle_stream(reader, st.st_size, workdir, progress, fast=fast, source=(path, st))
        content_crc, content_size = reader.drain()
        columns = sink.finish()
        try:
            seg, blk, settings, annotations, extra, layout, ntrace = build_tables(top, sink, interp)
            interp.release()
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError) as e:
            raise NotASnapshotError(f"segments are malformed ({type(e).__name__})") from None
        except RecursionError:
            raise LimitError("nesting too deep") from None
        except MemoryError:
            raise LimitError("the file asks for more memory than this machine has") from None
        ff, fl, fn, so, sf = interned_arrays(sink.interner)
        traces = {d: DeviceTrace(d, cols, extras) for d, (cols, extras) in columns.items() if len(cols["action"])}
        if any("category" in t.columns for t in traces.values()):
            layout = "profiler"
        snap = Snapshot(path=path, strings=sink.interner.strings, frame_file=ff, frame_line=fl, frame_name=fn,
                        stack_offsets=so, stack_frames=sf, traces=traces, segments=seg, blocks=blk,
                        action_names=sink.action_names, category_names=sink.category_names,
                        allocator_settings=settings, annotations=annotations, extra=extra, layout=layout,
                        trace_device_count=ntrace, dropped_values=sink.flat.dropped,
                        component_names=sink.component_names, frame_fx=sink.interner.frame_fx)
        if progress is not None:
            progress.finish()
    except BaseException:
        reader.close()
        _remove(workdir)
        raise
    if not workdir:
        return snap
    after = os.fstat(fh.fileno())
    if _stat_identity(after) != _stat_identity(st) or content_size != st.st_size:
        _schedule_cleanup(workdir)   # the file changed while we read it: what we read is not it
        return snap
    source = {"stat": _stat_identity(st), "checked_ns": started_ns}
    try:
        _write_entry(workdir, snap, sink, columns, {"size": content_size, "crc32": content_crc}, source)
        try:
            os.rename(workdir, entry)
        except OSError:
            # somebody else cached it meanwhile (or the rename is not allowed):
            # keep using our own columns, which stay valid while mapped.
            _schedule_cleanup(workdir)
            return snap
    except (OSError, TypeError, ValueError, CacheWriteError):
        _schedule_cleanup(workdir)
        return snap
    _prune(root, keep=entry)
    # the mapped columns moved with the directory; remap from the new place (just written
    # and checked: no need to read them again)
    cached = _load_cached(entry, path, fh, st, verify=False)
    if cached is not None:
        cached.from_cache = False
        return cached
    return snap


def _write_entry(workdir, snap: Snapshot, sink, columns, content: dict, source: dict) -> None:
    files = {}
    for d, dev in sink.devices.items():
        for k, col in dev.cols.items():
            name = f"d{d}_{k}.bin"
            if col.is_constant:
                continue                # no file: its one value is in the manifest
            if d in snap.traces:
                files[name] = [col.n * col.dtype.itemsize, col.crc]
            else:           # devices whose traces were empty left column files behind
                try:
                    os.remove(os.path.join(workdir, name))
                except OSError:
                    pass
    tables = {
        "frame_file": snap.frame_file, "frame_line": snap.frame_line, "frame_name": snap.frame_name,
        "stack_offsets": snap.stack_offsets, "stack_frames": snap.stack_frames,
    }
    tables.update({f"seg_{k}": v for k, v in snap.segments.items()})
    tables.update({f"blk_{k}": v for k, v in snap.blocks.items()})
    tpath = os.path.join(workdir, "tables.npz")
    with open(tpath, "xb") as fh:
        np.savez(fh, **tables)  # type: ignore[arg-type]  # (numpy's stub: the keywords are array names)
    with open_regular(tpath) as fh:
        crc, size = crc32_file(fh)
    files["tables.npz"] = [size, crc]
    meta = {
        "version": CACHE_VERSION,
        "source": content,
        "files": files,
        "devices": {str(d): {"n": len(t), "columns": sorted(t.columns),
                             "constant": {k: c.constant.item() for k, c in sink.devices[d].cols.items()
                                          if c.is_constant},
                             "extras": {str(i): v for i, v in t.extras.items()}}
                    for d, t in snap.traces.items()},
        "strings": snap.strings,
        "action_names": snap.action_names,
        "category_names": snap.category_names,
        "allocator_settings": snap.allocator_settings,
        "annotations": snap.annotations,
        "extra": snap.extra,
        "layout": snap.layout,
        "trace_device_count": snap.trace_device_count,
        "dropped_values": snap.dropped_values,
        "component_names": snap.component_names,
        "frame_fx": {str(f): [*v[:4], list(v[4])] for f, v in snap.frame_fx.items()},
    }
    # No fsync anywhere: a power cut can leave any of these files short or empty, and then
    # its checksum discards the entry on the next open. Losing an entry costs only time.
    _write_sealed(os.path.join(workdir, "source"), _MAGIC_SOURCE, jsonio.dumps(source))
    # written last: marks the entry complete
    _write_sealed(os.path.join(workdir, "manifest"), _MAGIC_MANIFEST, jsonio.dumps(meta))


def _write_sealed(path: str, magic: bytes, payload: bytes) -> None:
    atomic_write(path, seal(magic, payload), durable=False)


def _source_matches(entry: str, meta: dict, fh, st) -> bool:
    """Whether the entry came from the file open as `fh` (see the module's docstring)."""
    src = meta["source"]
    if st.st_size != src["size"]:
        return False
    raw = _read_sealed(os.path.join(entry, "source"), _MAGIC_SOURCE, 1 << 16)
    known = jsonio.loads(raw) if raw is not None else None
    now = _stat_identity(st)
    if _CTIME_TELLS_WRITES and isinstance(known, dict) and known.get("stat") == now:
        checked = known.get("checked_ns")
        if isinstance(checked, int) and max(st.st_mtime_ns, st.st_ctime_ns) < checked - RACY_NS:
            return True
    checked_ns = time.time_ns()
    crc, size = crc32_file(fh)
    fh.seek(0)
    if size != src["size"] or crc != src["crc32"] or _stat_identity(os.fstat(fh.fileno())) != now:
        return False
    try:
        _write_sealed(os.path.join(entry, "source"), _MAGIC_SOURCE,
                      jsonio.dumps({"stat": now, "checked_ns": checked_ns}))
    except OSError:
        pass
    return True


def _verify_files(entry: str, files: dict) -> bool:
    for name, (size, crc) in files.items():
        if "/" in name or os.sep in name or name.startswith("."):
            return False
        with open_regular(os.path.join(entry, name)) as fh:
            if os.fstat(fh.fileno()).st_size != size:
                return False
            got, n = crc32_file(fh)
        if n != size or got != crc:
            return False
    return True


def _load_cached(entry: str, path: str, fh, st, verify: bool = True) -> Snapshot | None:
    """The snapshot from a cache entry, or None (absent, stale, damaged: then removed)."""
    if not os.path.isdir(entry):
        return None
    try:
        raw = _read_sealed(os.path.join(entry, "manifest"), _MAGIC_MANIFEST)
        if raw is None:
            raise CorruptError("manifest")
        meta = jsonio.loads(raw)
        if meta.get("version") != CACHE_VERSION:
            raise CorruptError("cache version")
        if verify and not (_source_matches(entry, meta, fh, st) and _verify_files(entry, meta["files"])):
            raise CorruptError("stale or damaged")
        with np.load(os.path.join(entry, "tables.npz"), allow_pickle=False) as z:
            tables = {k: z[k] for k in z.files}
        traces = {}
        files = meta["files"]
        for d, info in meta["devices"].items():
            n = int(info["n"])
            cols = {}
            constant = info["constant"]
            for k in info["columns"]:
                if k in constant:
                    cols[k] = constant_column(int(constant[k]), np.dtype(ALL_COLUMNS[k]), n)
                    continue
                if f"d{d}_{k}.bin" not in files:
                    raise CorruptError("a column without a checksum")
                p = os.path.join(entry, f"d{d}_{k}.bin")
                dt = np.dtype(ALL_COLUMNS[k])
                if os.path.getsize(p) != n * dt.itemsize:
                    raise CorruptError("column size")
                cols[k] = map_column(p, dt, n)
            traces[int(d)] = DeviceTrace(int(d), cols, {int(i): v for i, v in info["extras"].items()})
        snap = Snapshot(
            path=path, strings=meta["strings"], frame_file=tables["frame_file"], frame_line=tables["frame_line"],
            frame_name=tables["frame_name"], stack_offsets=tables["stack_offsets"],
            stack_frames=tables["stack_frames"], traces=traces,
            segments={k: tables[f"seg_{k}"] for k in SEGMENT_COLUMNS},
            blocks={k: tables[f"blk_{k}"] for k in BLOCK_COLUMNS},
            action_names=meta["action_names"], category_names=meta["category_names"],
            allocator_settings=meta["allocator_settings"], annotations=meta["annotations"],
            extra=meta["extra"], layout=meta["layout"], trace_device_count=meta["trace_device_count"],
            from_cache=True, cache_entry=entry, dropped_values=int(meta.get("dropped_values", 0)),
            component_names=meta["component_names"],
            frame_fx={int(f): (int(v[0]), int(v[1]), int(v[2]), int(v[3]), tuple(int(x) for x in v[4]))
                      for f, v in meta["frame_fx"].items()})
        _validate(snap)
        for t in traces.values():
            # _validate read these whole: their pages handed back until a stage reads them (a
            # column no stage reads whole, compile_context, held 40 MB at 10^7 entries to the end)
            t.release(tuple(t.columns))
        try:
            os.utime(entry)   # most recently used
        except OSError:
            pass
        return snap
    except Exception:  # noqa: BLE001 - a damaged entry, whatever the damage, is a cache miss
        _remove(entry)
        return None


def _validate(snap: Snapshot) -> None:
    """Consistency checks beyond the checksums (a manifest from a buggy writer, a swapped
    file that happens to match): a cache entry must never hand out an index out of range."""
    ns = snap.n_stacks
    nf = len(snap.frame_file)
    if not isinstance(snap.strings, list) or not all(type(s) is str for s in snap.strings):
        raise CorruptError("strings")
    if len(snap.stack_offsets) < 1 or len(snap.stack_frames) != int(snap.stack_offsets[-1]):
        raise CorruptError("stack table")
    if len(snap.stack_offsets) > 1 and bool((np.diff(snap.stack_offsets) < 0).any()):
        raise CorruptError("stack offsets")
    if len(snap.stack_frames) and (snap.stack_frames.max() >= nf or snap.stack_frames.min() < 0):
        raise CorruptError("stack frames")
    nstr = len(snap.strings)
    if not (len(snap.frame_line) == len(snap.frame_name) == nf):
        raise CorruptError("frame table")
    if nf and (max(snap.frame_file.max(), snap.frame_name.max()) >= nstr
               or min(snap.frame_file.min(), snap.frame_name.min()) < 0):
        raise CorruptError("frame strings")
    for tab in (snap.segments, snap.blocks):
        lengths = {len(v) for v in tab.values()}
        if len(lengths) > 1:
            raise CorruptError("table lengths")
    for t in snap.traces.values():
        c = t.columns
        for k in ("stack", "forward_stack"):
            if k in c and len(c[k]) and (int(c[k].max()) >= ns or int(c[k].min()) < -1):
                raise CorruptError("trace stacks")
        if len(c["action"]) and int(c["action"].max()) >= len(snap.action_names):
            raise CorruptError("actions")
        if "category" in c and len(c["category"]) and int(c["category"].max()) >= len(snap.category_names):
            raise CorruptError("categories")
        for k in ("compile_context", "user_metadata", "internal_metadata"):
            if k in c and len(c[k]) and (int(c[k].max()) >= nstr or int(c[k].min()) < -1):
                raise CorruptError("trace strings")
        if "component" in c and len(c["component"]) and int(c["component"].max()) >= len(snap.component_names):
            raise CorruptError("components")
    if not isinstance(snap.component_names, list) or not all(type(s) is str for s in snap.component_names):
        raise CorruptError("component names")
    bc = snap.blocks["component"]
    if len(bc) and int(bc.max()) >= len(snap.component_names):
        raise CorruptError("block components")
    for f, (op, name, target, trace, originals) in snap.frame_fx.items():
        if not 0 <= f < nf or any(not -1 <= x < nstr for x in (op, name, target, trace)) \
                or any(not 0 <= x < nf for x in originals):
            raise CorruptError("fx frames")


# -- housekeeping ----------------------------------------------------------------------------
def _prune(root: str, keep: str) -> None:
    """Drop the least recently used entries beyond MAX_ENTRIES (and stale temp dirs), and
    the folders of older cache versions (nothing reads them any more)."""
    parent, here = os.path.split(root)
    try:
        for name in os.listdir(parent):
            if name.startswith("snapshots-v") and name != here:
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    except OSError:
        pass
    try:
        entries = []
        for name in os.listdir(root):
            p = os.path.join(root, name)
            if p == keep:
                continue
            st = os.stat(p)
            if name.startswith(".tmp-"):
                if st.st_mtime < os.path.getmtime(keep) - 24 * 3600:   # abandoned by a crash
                    shutil.rmtree(p, ignore_errors=True)
                continue
            entries.append((st.st_mtime, p))
        entries.sort(reverse=True)
        for _, p in entries[MAX_ENTRIES - 1:]:
            _remove(p)
    except OSError:
        pass


def _remove(path: str | None) -> None:
    if not path:
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass


def _schedule_cleanup(workdir):
    # Files stay readable through our maps after unlinking on POSIX.
    if os.name == "posix":
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["open_snapshot", "read_snapshot", "cache_root", "read_artifact", "write_artifact", "write_artifact_array",
           "map_artifact_array", "artifact_names", "prune_artifacts", "CACHE_VERSION"]
