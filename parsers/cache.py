"""Open a snapshot, through a cache of memory-mapped columns.

The first open streams the pickle into column files inside a fresh directory of
the user cache (`$VRAMSCOPE_CACHE_DIR`, else the platform's user cache dir), then
renames it into place: a reader sees a complete entry or none. A reopen maps the
columns read-only, so it costs almost nothing and shares pages with the OS cache.
The key is the file's identity (size, mtime and a hash of its head and tail) and
the parser's version; a changed file gets a new key, and a corrupt, half-written
or unreadable entry is thrown away and rebuilt. When no cache directory can be
written (read-only disk), we parse into memory and say nothing: caching is an
optimisation, never a reason to fail.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zlib

import numpy as np
import orjson

from ..common.atomic import atomic_write
from .errors import CorruptError, NotASnapshotError, SnapshotError
from .progress import Progress
from .reader import read_pickle_stream
from .snapshot import BLOCK_COLUMNS, SEGMENT_COLUMNS, DeviceTrace, Snapshot, build_tables, interned_arrays
from .tables import ALL_COLUMNS, map_column

CACHE_VERSION = 4
_HASH_SPAN = 1 << 16
MAX_ENTRIES = 24          # keep the most recently used snapshots' columns


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


def file_key(path: str, st: os.stat_result) -> str:
    """The file's identity: size, mtime and checksums of its head and tail. (zlib's
    CRC32 rather than hashlib: this detects change, it is no security boundary, and
    hashlib would load OpenSSL, 3 MB of resident memory, on every run.)"""
    with open(path, "rb") as fh:
        head = fh.read(_HASH_SPAN)
        tail = b""
        if st.st_size > _HASH_SPAN:
            fh.seek(max(_HASH_SPAN, st.st_size - _HASH_SPAN))
            tail = fh.read(_HASH_SPAN)
    return (f"{st.st_size:x}-{st.st_mtime_ns:x}-{zlib.crc32(head):08x}{zlib.adler32(head):08x}"
            f"-{zlib.crc32(tail):08x}{zlib.adler32(tail):08x}")


def open_snapshot(path: str, progress: Progress | None = None, use_cache: bool = True) -> Snapshot:
    """Read a snapshot file (or its cached columns). Raises `SnapshotError` for bad input."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SnapshotError("no such file", path) from None
    except OSError as e:
        raise SnapshotError(f"cannot read: {e.strerror or e}", path) from None
    if os.path.isdir(path):
        raise SnapshotError("is a directory, not a snapshot file", path)
    root = cache_root() if use_cache else None
    entry = None
    if root is not None:
        try:
            key = file_key(path, st)
        except OSError as e:
            raise SnapshotError(f"cannot read: {e.strerror or e}", path) from None
        entry = os.path.join(root, key)
        snap = _load_cached(entry, path)
        if snap is not None:
            return snap
    try:
        return _parse(path, st, root, entry, progress)
    except SnapshotError as e:
        if e.path is None:
            e.path = path
        raise


def _parse(path, st, root, entry, progress):
    workdir = None
    if entry is not None:
        try:
            os.makedirs(root, exist_ok=True)
            workdir = tempfile.mkdtemp(prefix=".tmp-", dir=root)
        except OSError:
            workdir = None
    if progress is not None:
        progress.start("Reading", st.st_size)
    try:
        with open(path, "rb") as fh:
            top, sink, reader = read_pickle_stream(fh, st.st_size, workdir, progress)
        columns = sink.finish()
        try:
            seg, blk, settings, annotations, extra, layout, ntrace = build_tables(top, sink, reader)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
            raise NotASnapshotError(f"segments are malformed ({type(e).__name__})") from None
        ff, fl, fn, so, sf = interned_arrays(sink.interner)
        traces = {d: DeviceTrace(d, cols, extras) for d, (cols, extras) in columns.items() if len(cols["action"])}
        if any("category" in t.columns for t in traces.values()):
            layout = "profiler"
        snap = Snapshot(path=path, strings=sink.interner.strings, frame_file=ff, frame_line=fl, frame_name=fn,
                        stack_offsets=so, stack_frames=sf, traces=traces, segments=seg, blocks=blk,
                        action_names=sink.action_names, category_names=sink.category_names,
                        allocator_settings=settings, annotations=annotations, extra=extra, layout=layout,
                        trace_device_count=ntrace)
        if progress is not None:
            progress.finish()
    except BaseException:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    if workdir:
        try:
            _write_meta(workdir, snap, columns)
            try:
                os.rename(workdir, entry)
            except OSError:
                # somebody else cached it meanwhile (or the rename is not allowed):
                # keep using our own columns, which stay valid while mapped.
                _schedule_cleanup(workdir)
                return snap
            _prune(root, keep=entry)
            # the mapped columns moved with the directory; remap from the new place
            cached = _load_cached(entry, path)
            if cached is not None:
                cached.from_cache = False
                return cached
        except OSError:
            _schedule_cleanup(workdir)
    return snap


def read_artifact(snap: Snapshot, name: str) -> bytes | None:
    """A derived result stored beside the snapshot's cached columns (e.g. an analysis),
    or None. `name` must already encode everything the result depends on."""
    path = _artifact_path(snap, name)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _write_artifact_with(snap: Snapshot, name: str, write) -> bool:
    """Write an artifact through `write(file)` into a temporary file in the cache entry,
    then rename it into place; False (and no file left) when there is no cache or it fails."""
    path = _artifact_path(snap, name)
    if path is None:
        return False
    try:
        atomic_write(path, write, durable=False)
        return True
    except (OSError, ValueError):
        return False


def write_artifact(snap: Snapshot, name: str, data: bytes) -> bool:
    """Store `data` atomically beside the cached columns; False when there is no cache."""
    return _write_artifact_with(snap, name, lambda fh: fh.write(data))


def _artifact_path(snap: Snapshot, name: str) -> str | None:
    if not snap.cache_entry or "/" in name or os.sep in name or name.startswith("."):
        return None
    return os.path.join(snap.cache_entry, "art-" + name)


def write_artifact_array(snap: Snapshot, name: str, arr: np.ndarray) -> bool:
    """Store one array as an .npy beside the cached columns, atomically (a temporary file
    renamed into place); False when there is no cache or it cannot be written. Written
    straight from the array: no copy of it in memory."""
    return _write_artifact_with(
        snap, name, lambda fh: np.save(fh, np.ascontiguousarray(arr), allow_pickle=False))


def map_artifact_array(snap: Snapshot, name: str) -> np.ndarray | None:
    """An array stored by `write_artifact_array`, memory-mapped read-only, or None (no
    cache, missing). A damaged file raises ValueError or OSError: callers decide."""
    path = _artifact_path(snap, name)
    if path is None or not os.path.exists(path):
        return None
    arr = np.load(path, mmap_mode="r", allow_pickle=False)
    if arr.size == 0:                    # nothing to map: a plain (empty) array
        arr = np.zeros(arr.shape, dtype=arr.dtype)
    return arr


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
    import time
    try:
        for n in os.listdir(snap.cache_entry):
            p = os.path.join(snap.cache_entry, n)
            try:
                if (n.startswith("art-") and drop(n[4:])) or \
                        (n.startswith(".art-") and os.path.getmtime(p) < time.time() - 3600):
                    os.remove(p)
            except OSError:
                pass
    except OSError:
        pass


def _prune(root: str, keep: str) -> None:
    """Drop the least recently used entries beyond MAX_ENTRIES (and stale temp dirs)."""
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
            shutil.rmtree(p, ignore_errors=True)
    except OSError:
        pass


def _schedule_cleanup(workdir):
    # Files stay readable through our maps after unlinking on POSIX.
    if os.name == "posix":
        shutil.rmtree(workdir, ignore_errors=True)


def _write_meta(workdir, snap: Snapshot, columns):
    tables = {
        "frame_file": snap.frame_file, "frame_line": snap.frame_line, "frame_name": snap.frame_name,
        "stack_offsets": snap.stack_offsets, "stack_frames": snap.stack_frames,
    }
    tables.update({f"seg_{k}": v for k, v in snap.segments.items()})
    tables.update({f"blk_{k}": v for k, v in snap.blocks.items()})
    with open(os.path.join(workdir, "tables.npz"), "wb") as fh:
        np.savez(fh, **tables)
        fh.flush()
        os.fsync(fh.fileno())
    meta = {
        "version": CACHE_VERSION,
        "devices": {str(d): {"n": len(t), "columns": sorted(t.columns),
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
    }
    # Devices whose traces were empty left column files behind: drop them.
    for d, (cols, _) in columns.items():
        if d not in snap.traces:
            for k in cols:
                p = os.path.join(workdir, f"d{d}_{k}.bin")
                if os.path.exists(p):
                    os.remove(p)
    tmp = os.path.join(workdir, "meta.json.tmp")
    with open(tmp, "wb") as fh:
        fh.write(orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS))
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, os.path.join(workdir, "meta.json"))   # written last: marks the entry complete


def _load_cached(entry: str, path: str) -> Snapshot | None:
    meta_path = os.path.join(entry, "meta.json")
    if not os.path.exists(meta_path):
        if os.path.isdir(entry):
            shutil.rmtree(entry, ignore_errors=True)
        return None
    try:
        with open(meta_path, "rb") as fh:
            meta = orjson.loads(fh.read())
        if meta.get("version") != CACHE_VERSION:
            raise CorruptError("cache version")
        with np.load(os.path.join(entry, "tables.npz")) as z:
            tables = {k: z[k] for k in z.files}
        traces = {}
        for d, info in meta["devices"].items():
            n = int(info["n"])
            cols = {}
            for k in info["columns"]:
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
            from_cache=True, cache_entry=entry)
        _validate(snap)
        try:
            os.utime(entry)   # most recently used
        except OSError:
            pass
        return snap
    except (OSError, ValueError, KeyError, TypeError, CorruptError, orjson.JSONDecodeError, NotASnapshotError):
        shutil.rmtree(entry, ignore_errors=True)
        return None


def _validate(snap: Snapshot) -> None:
    """Cheap consistency checks, so that a damaged cache is rebuilt rather than trusted."""
    ns = snap.n_stacks
    nf = len(snap.frame_file)
    if len(snap.stack_frames) != int(snap.stack_offsets[-1]):
        raise CorruptError("stack table")
    if len(snap.stack_frames) and (snap.stack_frames.max() >= nf or snap.stack_frames.min() < 0):
        raise CorruptError("stack frames")
    nstr = len(snap.strings)
    if nf and (max(snap.frame_file.max(), snap.frame_name.max()) >= nstr):
        raise CorruptError("frame strings")
    for t in snap.traces.values():
        st = t.columns["stack"]
        if len(st) and (int(st.max()) >= ns or int(st.min()) < -1):
            raise CorruptError("trace stacks")
