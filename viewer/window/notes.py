"""The main window's annotation actions: annotate a range, the peak or an allocation, edit,
delete, undo and redo, go to a note; the sidecar store behind them (services/annotations.py)."""
from __future__ import annotations

import os

from ...common.units import fmt_bytes
from ...services.annotations import Annotation, AnnotationStore
from . import dialogs
from ..model.notes import first_line, location_notice, note_row, note_span
from .exports import _one_line

# what the store's undo/redo commands do, for the Edit menu's "Undo Add Note"



class NotesMixin:
    """Mixed into MainWindow (viewer/window.py)."""

    # -- annotations ------------------------------------------------------------------------------------
    def _use_store(self, path: str):
        """The notes of `path` (kept when the same file is reopened or another device shown)."""
        path = os.path.abspath(path)
        if self.store is not None and self.store.snapshot_path == path:
            self._refresh_notes()
            return
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.store = None
        problems = []
        try:
            self.store = AnnotationStore(path)
        except Exception as e:     # notes never stop a snapshot from opening
            problems.append(f"Notes are off for this file: {_one_line(e)}")
        if self.store is not None:
            self._unsubscribe = self.store.subscribe(self._on_store_event)
            problems.extend(self.store.warnings)
        self._notes_problems = problems
        self._update_notice()
        self._refresh_notes()

    def _update_notice(self):
        """Say where the notes go when that is not next to the snapshot (a read-only folder)."""
        text = location_notice(self.store)
        parts = [t for t in [text] + self._notes_problems if t]
        full = " ".join(parts) or None
        changed = full != self.notes_notice
        self.notes_notice = full
        self.notes_panel.set_notice(full)
        if text:
            self.status_notes.setText("✎ notes: user data folder")
            self.status_notes.setToolTip(text)
            self.status_notes.show()
        else:
            self.status_notes.hide()
        if changed and full and self.data is not None:
            self.statusBar().showMessage(self._short_notice(), 20000)

    def _short_notice(self) -> str:
        """The notice for the status bar (its permanent labels leave little room)."""
        return location_notice(self.store, short=True) or (self._notes_problems[0] if self._notes_problems else "")

    def _on_store_event(self, event: str, ann):
        self._refresh_notes()

    def _refresh_notes(self):
        notes = list(self.store) if self.store is not None else []
        self.notes_panel.set_notes(notes, self.data)
        if self.data is not None:
            self.timeline.set_notes(notes)
        dock = self.docks["annotations"]
        dock.setWindowTitle(f"Annotations ({len(notes)})" if notes else "Annotations")
        self._update_note_actions()

    def _ask_note(self, title: str, label: str, text: str = "") -> str | None:
        return dialogs.ask_note(self, title, label, text)

    def _change_notes(self, fn, *args, **kw):
        """Run one store change; a failed save is a message, never a traceback."""
        if self.store is None:
            return None
        try:
            return fn(*args, **kw)
        except OSError as e:
            self._show_error("Cannot save the notes",
                             f"The notes could not be saved to {self.store.path}: {e.strerror or e}")
            return None
        finally:
            self._update_notice()
            self._update_note_actions()

    def _add_note(self, ann: Annotation, title: str, default: str):
        note = self._ask_note(title, f"Note on {ann.where()}:", default)
        if note is None:
            return None
        ann.note = note
        added = self._change_notes(self.store.add, ann)
        if added is not None:
            self.notes_panel.select(added.id)
            self.timeline.set_current_note(added.id)
            self.docks["annotations"].show()
            self.docks["annotations"].raise_()
            self.statusBar().showMessage(f"Note added on {added.where()}, saved to {self.store.path}", 8000)
        return added

    def _entries_in(self, x0: float, x1: float) -> tuple[int, int] | None:
        d = self.data
        if d is None or d.n == 0:
            return None
        first = max(0, int(d.index_at_x(x0)))
        last = min(d.n - 1, d.index_before_x(x1))
        return (first, last) if last >= first else None

    def annotate_range(self):
        """A note on the range marked with Ctrl+drag, or else on the visible range."""
        d = self.data
        if d is None or self.store is None:
            return
        marked = self.timeline.marked_range()
        span = self._entries_in(*(marked or self.timeline.x_span()))
        if span is None:
            self.statusBar().showMessage("No trace entries in that range", 5000)
            return
        first, last = span
        fields = dict(kind="range", device=d.device, start_index=first, end_index=last)
        if d.has_time:
            fields.update(start_us=int(d.tkey[first]), end_us=int(d.tkey[last]))
        peak_bytes, peak_i = d.range_peak(first, last)
        default = f"up to {fmt_bytes(peak_bytes)} live (entry {peak_i:,})"
        what = "marked range" if marked else "visible range"
        if self._add_note(Annotation(**fields), f"Annotate the {what}", default) is not None and marked:
            self.timeline.clear_mark()

    def annotate_peak(self):
        """A note on the peak last navigated to (P, N), else the highest one."""
        d = self.data
        if d is None or self.store is None:
            return
        cur = d.findings[self.finding_pos] if 0 <= self.finding_pos < len(d.findings) else None
        f = cur if cur is not None and cur.kind in ("peak", "iteration_peak") else \
            next((f for f in d.findings if f.kind == "peak"), None)
        i = f.index if f is not None else d.peak_index
        fields = dict(kind="peak", device=d.device, index=int(i))
        if d.has_time and i >= 0:
            fields["time_us"] = int(d.tkey[i])
        default = f.title if f is not None else f"Peak {fmt_bytes(d.peak_bytes)}"
        self._add_note(Annotation(**fields), "Annotate the peak", default)

    def annotate_allocation(self):
        d, row = self.data, self.selected_row
        if d is None or self.store is None:
            return
        if row < 0:
            self.statusBar().showMessage("Select an allocation first: click the timeline or a table row", 5000)
            return
        ann = Annotation(kind="allocation", device=d.device, alloc_index=int(d.alloc_index[row]),
                         addr=int(d.allocs.addr[row]))
        sid = int(d.allocs.stack[row])
        where = " ".join(d.stack_label(sid).split()) if sid >= 0 else ""
        default = f"{d.category_name(int(d.category[row]))} {fmt_bytes(int(d.allocs.size[row]))}" + \
            (f" from {where}" if where else "")
        self._add_note(ann, "Annotate the allocation", default)

    def edit_note(self, ann_id: str | None = None):
        if self.store is None:
            return
        ann_id = ann_id if isinstance(ann_id, str) else self.notes_panel.current_id()
        if ann_id is None:
            return
        ann = self.store.get(ann_id)
        note = self._ask_note("Edit note", f"Note on {ann.where()}:", ann.note)
        if note is not None and note != ann.note:
            self._change_notes(self.store.set_note, ann_id, note)

    def delete_note(self):
        ann_id = self.notes_panel.current_id()
        if self.store is None or ann_id is None:
            return
        where = self.store.get(ann_id).where()
        self._change_notes(self.store.remove, ann_id)
        self.statusBar().showMessage(f"Note on {where} deleted (Ctrl+Z undoes)", 6000)

    def undo_note(self):
        if self.store is not None and self.store.can_undo:
            self._change_notes(self.store.undo)
            self.statusBar().showMessage("Undone", 3000)

    def redo_note(self):
        if self.store is not None and self.store.can_redo:
            self._change_notes(self.store.redo)
            self.statusBar().showMessage("Redone", 3000)

    def go_to_note(self, ann_id: str):
        """Show a note on the timeline: its range, its peak, its allocation."""
        d = self.data
        if self.store is None or d is None:
            return
        try:
            ann = self.store.get(ann_id)
        except KeyError:
            return
        self.notes_panel.select(ann_id)
        span = note_span(d, ann)
        if span is None:
            self.statusBar().showMessage(
                f"This note is on cuda:{ann.device}: choose it in the Device box to see it"
                if ann.device is not None and ann.device != d.device else "This note cannot be placed on the trace",
                6000)
            return
        self.timeline.set_current_note(ann_id)
        first, last = span
        if ann.kind == "allocation" and note_row(d, ann) >= 0:
            row = note_row(d, ann)
            self.select_row(row, source="annotation")
            self._show_row(row)
        elif ann.kind == "range":
            self.timeline.zoom_to_indices(max(first, 0), max(last, 0))
        else:
            self.timeline.zoom_to_indices(*d._zoom_around(first))
            self.timeline.set_cursor_index(first)
            self.pinned_index = first
            self.moment_panel.show_index(first)
        self.statusBar().showMessage(f"{ann.where()}: {first_line(ann.note, 120)}", 10000)

    def _on_marked(self, x0: float, x1: float):
        span = self._entries_in(x0, x1)
        if span is not None:
            self._mark_message = (f"Marked entries {span[0]:,}–{span[1]:,}: press A to annotate, "
                                  "File > Export Trimmed Snapshot to save them, Esc to clear")
            self.statusBar().showMessage(self._mark_message, 10000)
