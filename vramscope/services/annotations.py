"""Annotations on a snapshot: a Qt-free model with undo/redo and an atomic sidecar.

A user marks a time range, a peak or one allocation and writes a note. The notes
live in a sidecar next to the snapshot, ``FILE.vramscope.json`` (orjson), saved
after every change so nothing is lost when the viewer crashes.

Why the care when saving: a sidecar that is half-written when the process dies
(power cut, SIGKILL, OOM killer) would lose every note the user wrote. So a save
writes a temporary file in the same directory, flushes and fsyncs it, renames it
over the sidecar with `os.replace` (atomic on POSIX and on Windows within one
volume) and fsyncs the directory so the rename itself survives a crash. A reader
therefore sees the old sidecar or the new one, never a mix.

When the snapshot's folder cannot be written (a read-only mount, a shared
dataset), the sidecar goes to the user data directory instead
(``$VRAMSCOPE_DATA_DIR`` or ``platformdirs.user_data_dir('vramscope')``, then
``annotations/<sha256 of the snapshot's absolute path>.json``) and
`AnnotationStore.location_note` says where, so the viewer can tell the user.

A sidecar that does not parse is moved aside (``FILE.vramscope.json.corrupt-<time>``)
and reported in `AnnotationStore.warnings`, never silently dropped or overwritten.

The model knows nothing of Qt (DESIGN.md; napari's rule): the viewer subscribes
with `subscribe(callback)` and gets ``callback(event, annotation)`` for
``"added"``, ``"removed"``, ``"changed"`` and ``"reset"`` (annotation None).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone

from ..common.atomic import atomic_write, is_temp_of
from ..common.jsonio import dumps
from . import sidecar
from .sidecar import FORMAT, FORMAT_VERSION

SIDECAR_SUFFIX = ".vramscope.json"
KINDS = ("range", "peak", "allocation")
_INT_FIELDS = ("device", "start_index", "end_index", "start_us", "end_us", "index", "time_us", "alloc_index", "addr")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Annotation:
    """One note. `kind` says which of the location fields matter:

    - ``range``: `start_index`..`end_index` (trace entries, inclusive) and/or `start_us`..`end_us`;
    - ``peak``: `index` (the entry that reached the peak; -1 = the start state) and `time_us`;
    - ``allocation``: `alloc_index` (-1 = live before the trace began) and `addr`.
    """
    kind: str
    note: str = ""
    device: int | None = None
    start_index: int | None = None
    end_index: int | None = None
    start_us: int | None = None
    end_us: int | None = None
    index: int | None = None
    time_us: int | None = None
    alloc_index: int | None = None
    addr: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: str = field(default_factory=_now)
    modified: str = ""
    extra: dict = field(default_factory=dict, compare=False)   # fields we do not know, written back

    def __post_init__(self):
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise ValueError(f"annotation kind must be one of {KINDS}, not {self.kind!r}")
        if not self.modified:
            self.modified = self.created

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if v is not None and k != "extra"}
        return {**self.extra, **d}

    @classmethod
    def from_dict(cls, d: dict) -> "Annotation":
        """A note from its JSON; ValueError when a known field has the wrong type (the
        sidecar reader sets such a note aside). Unknown fields go to `extra`."""
        if not isinstance(d, dict) or "kind" not in d:
            raise ValueError("an annotation must be an object with a 'kind'")
        kw: dict = {}
        for name in _INT_FIELDS:
            v = d.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise ValueError(f"{name} must be an integer, not {type(v).__name__}")
            kw[name] = v
        for name in ("note", "id", "created", "modified"):
            v = d.get(name)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{name} must be text, not {type(v).__name__}")
            if v is not None:
                kw[name] = v
        if not kw.get("id"):
            kw.pop("id", None)
        known = {f.name for f in fields(cls)}
        return cls(kind=d["kind"], extra={k: v for k, v in d.items() if k not in known}, **kw)

    def where(self) -> str:
        """A short human description of what the note is attached to."""
        dev = f"device {self.device}: " if self.device is not None else ""
        if self.kind == "range":
            if self.start_index is not None and self.end_index is not None:
                return f"{dev}entries {self.start_index:,}-{self.end_index:,}"
            if self.start_us is not None and self.end_us is not None:
                return f"{dev}{(self.end_us - self.start_us) / 1e3:,.1f} ms from t={self.start_us:,} us"
            return f"{dev}range"
        if self.kind == "peak":
            return f"{dev}peak" + (f" at entry {self.index:,}" if self.index is not None else "")
        where = f"{dev}allocation"
        if self.alloc_index is not None:
            where += " live before the trace" if self.alloc_index < 0 else f" at entry {self.alloc_index:,}"
        if self.addr is not None:
            where += f" (addr 0x{self.addr:x})"
        return where


# -- undo/redo: commands ---------------------------------------------------------

class _Add:
    def __init__(self, ann: Annotation, pos: int | None = None):
        self.ann, self.pos = ann, pos

    def do(self, store):
        store._insert(self.ann, self.pos)

    def undo(self, store):
        self.pos = store._remove(self.ann.id)


class _Remove:
    def __init__(self, ann_id: str):
        self.ann_id, self.ann, self.pos = ann_id, None, None

    def do(self, store):
        self.ann = store.get(self.ann_id)
        self.pos = store._remove(self.ann_id)

    def undo(self, store):
        store._insert(self.ann, self.pos)


class _Edit:
    def __init__(self, ann_id: str, changes: dict):
        self.ann_id, self.changes, self.before = ann_id, changes, None

    def do(self, store):
        ann = store.get(self.ann_id)
        self.before = {k: getattr(ann, k) for k in self.changes}
        self.before["modified"] = ann.modified
        store._set(self.ann_id, {**self.changes, "modified": _now()})

    def undo(self, store):
        store._set(self.ann_id, self.before)


# -- where the sidecar lives -------------------------------------------------------

def data_dir() -> str:
    d = os.environ.get("VRAMSCOPE_DATA_DIR")
    if d:
        return d
    import platformdirs
    return platformdirs.user_data_dir("vramscope", appauthor=False)


def fallback_path(snapshot_path: str) -> str:
    key = hashlib.sha256(os.path.abspath(snapshot_path).encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return os.path.join(data_dir(), "annotations", key + ".json")


def dir_writable(directory: str) -> bool:
    """os.access can lie (root, ACLs, read-only mounts seen as writable): also try. A folder
    whose mode lets nobody write (chmod a-w) is read-only by its owner's wish, which root
    would otherwise ignore: the notes then go to the user data folder."""
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        if not os.stat(directory).st_mode & 0o222:
            return False
    except OSError:
        return False
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vramscope-probe-")
    except OSError:
        return False
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass
    return True


def _check_note(d: dict) -> None:
    Annotation.from_dict(d)


def _read(path: str) -> tuple[sidecar.Contents, list[Annotation]]:
    """A sidecar's contents and notes. FileNotFoundError when absent; SidecarError when it
    is not a readable sidecar; OSError for I/O errors."""
    data, st = sidecar.read_bytes(path)
    contents = sidecar.parse(data, _check_note)
    contents.identity = sidecar.Identity.of(data, st)
    return contents, [Annotation.from_dict(d) for d in contents.notes]


class AnnotationStore:
    """The annotations of one snapshot, with undo/redo, change callbacks and autosave."""

    def __init__(self, snapshot_path: str, autosave: bool = True, sidecar_path: str | None = None):
        self.snapshot_path = os.path.abspath(snapshot_path)
        self.autosave = autosave
        self.annotations: list[Annotation] = []
        self.warnings: list[str] = []
        self.location_note: str | None = None
        self._undo: list = []
        self._redo: list = []
        self._callbacks: list = []
        # what the file held besides our notes, kept on save; and what we saw on disk last,
        # to notice another writer
        self._kept = sidecar.Contents(notes=[])
        self._seen: sidecar.Identity | None = None
        self._synced: set[str] = set()     # note ids in the file at the last read or write
        self._deleted: set[str] = set()    # ... and what this store changed since
        self._edited: set[str] = set()
        self.next_to_snapshot = self.snapshot_path + SIDECAR_SUFFIX
        if sidecar_path is not None:
            self.path = sidecar_path
        elif dir_writable(os.path.dirname(self.snapshot_path)):
            self.path = self.next_to_snapshot
        else:
            self._use_fallback("the snapshot's folder is not writable")
        self.load()

    # -- location ------------------------------------------------------------------
    def _use_fallback(self, why: str) -> None:
        self.path = fallback_path(self.snapshot_path)
        self.location_note = f"annotations are saved in {self.path} ({why})"

    # -- loading -------------------------------------------------------------------
    def _candidates(self) -> list[str]:
        # A note saved to the fallback earlier is newer than a read-only sidecar next to the snapshot.
        cands = [self.path]
        if self.path != self.next_to_snapshot:
            cands.append(self.next_to_snapshot)
        return cands

    def load(self) -> None:
        """(Re)read the sidecar; one that cannot be read at all is moved aside and reported,
        bad notes in it are set aside (kept in the file) and reported."""
        self.annotations = []
        self._undo.clear()
        self._redo.clear()
        self._deleted.clear()
        self._edited.clear()
        self._kept = sidecar.Contents(notes=[])
        self._seen = None
        for p in self._candidates():
            try:
                contents, notes = _read(p)
            except FileNotFoundError:
                continue
            except sidecar.SidecarError as e:
                self._move_aside(p, e)
                continue
            except OSError as e:
                self.warnings.append(f"cannot read {p}: {e.strerror or e}")
                if p == self.path:
                    self._use_fallback("the sidecar next to the snapshot cannot be read")
                continue
            self.annotations = notes
            self._kept = contents
            if p == self.path:
                self._seen = contents.identity
                self._synced = {a.id for a in notes}
            self.warnings += [f"{p}: {w}" for w in contents.warnings]
            break
        self._clean_temp_files()
        self._notify("reset", None)

    def _move_aside(self, p: str, err) -> None:
        if os.path.exists(p) and not os.path.isfile(p):   # a FIFO or a folder: never touch it
            self.warnings.append(f"{p} is not a regular file ({err}); saving elsewhere")
            if p == self.path:
                self._use_fallback("the sidecar's name is taken by something that is not a file")
            return
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        dest = f"{p}.corrupt-{stamp}"
        n = 1
        while os.path.exists(dest):
            n += 1
            dest = f"{p}.corrupt-{stamp}-{n}"
        try:
            os.replace(p, dest)
            self.warnings.append(f"the annotations file {p} could not be read ({err}); it was moved to {dest}")
        except OSError as e:
            self.warnings.append(f"the annotations file {p} could not be read ({err}) nor moved aside "
                                 f"({e.strerror or e}); saving elsewhere")
            if p == self.path:
                self._use_fallback("the sidecar next to the snapshot is unreadable")

    def _clean_temp_files(self) -> None:
        """Temporary files left by a writer that was killed mid-save."""
        d = os.path.dirname(self.path)
        base = os.path.basename(self.path)
        try:
            names = os.listdir(d)
        except OSError:
            return
        for name in names:
            if is_temp_of(name, base):
                full = os.path.join(d, name)
                try:
                    if time.time() - os.path.getmtime(full) > 60:   # never race a live writer
                        os.unlink(full)
                except OSError:
                    pass

    # -- saving ----------------------------------------------------------------------
    def to_json(self) -> bytes:
        kept = self._kept
        doc = {**kept.extra, "format": FORMAT, "version": max(FORMAT_VERSION, kept.version),
               "snapshot": os.path.basename(self.snapshot_path),
               "annotations": [a.to_dict() for a in self.annotations]}
        if kept.set_aside:
            doc["set_aside"] = kept.set_aside
        return dumps(doc, pretty=True)

    def _merge_from_disk(self) -> None:
        """Another writer saved since we read: take in what it added or changed (by note id),
        keep what we deleted deleted, and say so."""
        try:
            contents, notes = _read(self.path)
        except (FileNotFoundError, OSError, sidecar.SidecarError):
            return
        if self._seen is not None and contents.identity == self._seen:
            return
        merged, added = sidecar.merge_for_save(self.annotations, notes, self._synced, self._deleted, self._edited)
        changed = [a.id for a in merged] != [a.id for a in self.annotations] or any(
            x is not y for x, y in zip(merged, self.annotations))
        self.annotations = merged
        for d in contents.set_aside:
            if d not in self._kept.set_aside:
                self._kept.set_aside.append(d)
        self._kept.extra = {**contents.extra, **self._kept.extra}
        self._kept.version = max(self._kept.version, contents.version)
        if changed:
            self.warnings.append(f"{self.path} was changed by another window or program: its notes were merged "
                                 f"with these ({added} added there)")
            self._notify("reset", None)

    def save(self) -> str:
        self._merge_from_disk()
        data = self.to_json()
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            atomic_write(self.path, data)
        except OSError as e:
            if self.path == self.next_to_snapshot:
                self._use_fallback(f"saving next to the snapshot failed: {e.strerror or e}")
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                atomic_write(self.path, data)
            else:
                raise
        try:
            st = os.stat(self.path)
            self._seen = sidecar.Identity.of(data, st)
        except OSError:
            self._seen = None
        self._synced = {a.id for a in self.annotations}
        self._deleted.clear()
        self._edited.clear()
        return self.path

    # -- queries -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.annotations)

    def __iter__(self):
        return iter(list(self.annotations))

    def get(self, ann_id: str) -> Annotation:
        for a in self.annotations:
            if a.id == ann_id:
                return a
        raise KeyError(ann_id)

    # -- notifications -------------------------------------------------------------------
    def subscribe(self, callback):
        """`callback(event, annotation)`; returns a function that unsubscribes."""
        self._callbacks.append(callback)

        def unsubscribe():
            if callback in self._callbacks:
                self._callbacks.remove(callback)
        return unsubscribe

    def _notify(self, event: str, ann) -> None:
        for cb in list(self._callbacks):
            cb(event, ann)

    # -- edits (all through commands so they can be undone) ------------------------------
    def _run(self, cmd) -> None:
        cmd.do(self)
        self._undo.append(cmd)
        self._redo.clear()
        self._changed()

    def _changed(self) -> None:
        if self.autosave:
            self.save()

    def add(self, ann: Annotation | None = None, **kw) -> Annotation:
        """`add(Annotation(...))` or `add(kind="range", start_index=.., end_index=.., note=..)`."""
        if ann is None:
            ann = Annotation(**kw)
        if any(a.id == ann.id for a in self.annotations):
            raise ValueError(f"duplicate annotation id {ann.id}")
        self._run(_Add(ann))
        return ann

    def remove(self, ann_id: str) -> None:
        self.get(ann_id)
        self._run(_Remove(ann_id))

    def edit(self, ann_id: str, **changes) -> Annotation:
        ann = self.get(ann_id)
        bad = set(changes) - ({f.name for f in fields(Annotation)} - {"id", "created", "modified", "kind"})
        if bad:
            raise ValueError(f"cannot edit {sorted(bad)}")
        self._run(_Edit(ann_id, changes))
        return ann

    def set_note(self, ann_id: str, note: str) -> Annotation:
        return self.edit(ann_id, note=note)

    @property
    def can_undo(self) -> bool:
        return bool(self._undo)

    @property
    def can_redo(self) -> bool:
        return bool(self._redo)

    def undo(self) -> bool:
        if not self._undo:
            return False
        cmd = self._undo.pop()
        cmd.undo(self)
        self._redo.append(cmd)
        self._changed()
        return True

    def redo(self) -> bool:
        if not self._redo:
            return False
        cmd = self._redo.pop()
        cmd.do(self)
        self._undo.append(cmd)
        self._changed()
        return True

    # -- primitive mutations (commands call these; they notify) -----------------------------
    def _insert(self, ann: Annotation, pos: int | None) -> None:
        self._deleted.discard(ann.id)
        self._edited.add(ann.id)
        if pos is None or pos > len(self.annotations):
            self.annotations.append(ann)
        else:
            self.annotations.insert(pos, ann)
        self._notify("added", ann)

    def _remove(self, ann_id: str) -> int:
        for i, a in enumerate(self.annotations):
            if a.id == ann_id:
                del self.annotations[i]
                self._deleted.add(ann_id)
                self._notify("removed", a)
                return i
        raise KeyError(ann_id)

    def _set(self, ann_id: str, values: dict) -> None:
        ann = self.get(ann_id)
        self._edited.add(ann_id)
        for k, v in values.items():
            setattr(ann, k, v)
        self._notify("changed", ann)


def load_annotations(snapshot_path: str) -> tuple[list[Annotation], str | None, list[str]]:
    """Read-only: the annotations of a snapshot, where they came from, and warnings.

    Unlike `AnnotationStore` this never moves or writes anything (reports use it)."""
    next_to = os.path.abspath(snapshot_path) + SIDECAR_SUFFIX
    try:
        fb = fallback_path(snapshot_path)
    except Exception:      # no home directory: only the sidecar next to the snapshot
        fb = None
    # the same preference as AnnotationStore: where it would save now comes first
    if dir_writable(os.path.dirname(next_to)) or fb is None:
        cands = [next_to] + ([fb] if fb else [])
    else:
        cands = [fb, next_to]
    warnings: list[str] = []
    for p in cands:
        try:
            contents, notes = _read(p)
        except FileNotFoundError:
            continue
        except (OSError, sidecar.SidecarError) as e:
            warnings.append(f"the annotations file {p} could not be read ({e})")
            continue
        return notes, p, warnings + [f"{p}: {w}" for w in contents.warnings]
    return [], None, warnings
