"""The window's notes: annotate a range, the peak or an allocation, edit, delete, undo and
redo, go to a note; the sidecar store behind them (services/annotations.py), and where the
notes are saved when that is not next to the snapshot."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...common.units import fmt_bytes
from ...present.words import error_text
from ...services.annotations import Annotation, AnnotationStore
from ..model.notes import first_line, location_notice, note_row, note_span
from . import dialogs

if TYPE_CHECKING:
    from .main import MainWindow

# what the store's undo/redo commands do, for the Edit menu's "Undo Add Note"
COMMAND_NAMES = {"_Add": "Add Note", "_Remove": "Delete Note", "_Edit": "Edit Note"}


class Notes:
    """The notes of the file shown (kept when the same file is reopened or another device
    shown) and the Edit menu's note actions."""

    def __init__(self, window: MainWindow):
        self.win = window
        self.store: AnnotationStore | None = None
        self._unsubscribe = None
        self.notice: str | None = None          # where the notes go, and why, when not next to the file
        self._problems: list[str] = []

    # -- the store ---------------------------------------------------------------------------------
    def use_store(self, path: str):
        """The notes of `path` (kept when the same file is reopened or another device shown)."""
        path = os.path.abspath(path)
        if self.store is not None and self.store.snapshot_path == path:
            self.refresh()
            return
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.store = None
        problems = []
        try:
            self.store = AnnotationStore(path)
        except Exception as e:     # notes never stop a snapshot from opening
            problems.append(f"Notes are off for this file: {one_line(e)}")
        if self.store is not None:
            self._unsubscribe = self.store.subscribe(lambda _event, _ann: self.refresh())
            problems.extend(self.store.warnings)
        self._problems = problems
        self._update_notice()
        self.refresh()

    def close(self):
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _update_notice(self):
        """Say where the notes go when that is not next to the snapshot (a read-only folder)."""
        w = self.win
        text = location_notice(self.store)
        parts = [t for t in [text] + self._problems if t]
        full = " ".join(parts) or None
        changed = full != self.notice
        self.notice = full
        w.notes_panel.set_notice(full)
        if text:
            w.status_notes.setText("✎ notes: user data folder")
            w.status_notes.setToolTip(text)
            w.status_notes.show()
        else:
            w.status_notes.hide()
        if changed and full and w.data is not None:
            w.statusBar().showMessage(self.short_notice(), 20000)

    def elsewhere(self) -> bool:
        """The notes go to the user data folder, not beside the snapshot (a read-only folder)."""
        return location_notice(self.store) is not None

    def short_notice(self) -> str:
        """The notice for the status bar (its permanent labels leave little room)."""
        return location_notice(self.store, short=True) or (self._problems[0] if self._problems else "")

    def refresh(self):
        w = self.win
        notes = list(self.store) if self.store is not None else []
        w.notes_panel.set_notes(notes, w.data)
        if w.data is not None:
            w.timeline.set_notes(notes)
        dock = w.docks["annotations"]
        dock.setWindowTitle(f"Annotations ({len(notes)})" if notes else "Annotations")
        self.update_actions()

    def update_actions(self):
        """The Edit menu's note actions, enabled as they can act; Undo and Redo say what they undo."""
        w, store, d = self.win, self.store, self.win.data
        on = store is not None and d is not None
        w.act_note_range.setEnabled(on and d is not None and d.n > 0)
        w.act_note_peak.setEnabled(on)
        w.act_note_alloc.setEnabled(on and w.selected_row >= 0)
        chosen = store is not None and w.notes_panel.current_id() is not None
        w.act_note_edit.setEnabled(chosen)
        w.act_note_delete.setEnabled(chosen)
        for act, can, stack, word in ((w.act_undo, store is not None and store.can_undo, "_undo", "Undo"),
                                      (w.act_redo, store is not None and store.can_redo, "_redo", "Redo")):
            act.setEnabled(bool(can))
            cmds = getattr(store, stack, None) if can else None
            what = COMMAND_NAMES.get(type(cmds[-1]).__name__, "") if cmds else ""
            act.setText(f"&{word} {what}".rstrip())

    # -- changes -----------------------------------------------------------------------------------
    def _change(self, fn, *args, **kw):
        """Run one store change; a failed save is a message, never a traceback."""
        if self.store is None:
            return None
        try:
            return fn(*args, **kw)
        except OSError as e:
            self.win.show_error("Cannot save the notes",
                                f"The notes could not be saved to {self.store.path}: {e.strerror or e}")
            return None
        finally:
            self._update_notice()
            self.update_actions()

    def _add(self, ann: Annotation, title: str, default: str):
        w = self.win
        note = dialogs.ask_note(w, title, f"Note on {ann.where()}:", default)
        if note is None or self.store is None:
            return None
        ann.note = note
        added = self._change(self.store.add, ann)
        if added is not None:
            w.notes_panel.select(added.id)
            w.timeline.set_current_note(added.id)
            w.docks["annotations"].show()
            w.docks["annotations"].raise_()
            w.statusBar().showMessage(f"Note added on {added.where()}, saved to {self.store.path}", 8000)
        return added

    def annotate_range(self):
        """A note on the range marked with Ctrl+drag, or else on the visible range."""
        w, d = self.win, self.win.data
        if d is None or self.store is None:
            return
        marked = w.timeline.marked_range()
        span = w.entries_in(*(marked or w.timeline.x_span()))
        if span is None:
            w.statusBar().showMessage("No trace entries in that range", 5000)
            return
        first, last = span
        fields = dict(kind="range", device=d.device, start_index=first, end_index=last)
        if d.has_time and d.tkey is not None:
            fields.update(start_us=int(d.tkey[first]), end_us=int(d.tkey[last]))
        peak_bytes, peak_i = d.range_peak(first, last)
        default = f"up to {fmt_bytes(peak_bytes)} live (entry {peak_i:,})"
        what = "marked range" if marked else "visible range"
        if self._add(Annotation(**fields), f"Annotate the {what}", default) is not None and marked:
            w.timeline.clear_mark()

    def annotate_peak(self):
        """A note on the peak last navigated to (P, N), else the highest one."""
        w, d = self.win, self.win.data
        if d is None or self.store is None:
            return
        cur = d.findings[w.finding_pos] if 0 <= w.finding_pos < len(d.findings) else None
        f = cur if cur is not None and cur.kind in ("peak", "iteration_peak") else \
            next((f for f in d.findings if f.kind == "peak"), None)
        i = f.index if f is not None else d.peak_index
        fields = dict(kind="peak", device=d.device, index=int(i))
        if d.has_time and d.tkey is not None and i >= 0:
            fields["time_us"] = int(d.tkey[i])
        default = f.title if f is not None else f"Peak {fmt_bytes(d.peak_bytes)}"
        self._add(Annotation(**fields), "Annotate the peak", default)

    def annotate_allocation(self):
        w = self.win
        d, row = w.data, w.selected_row
        if d is None or self.store is None:
            return
        if row < 0:
            w.statusBar().showMessage("Select an allocation first: click the timeline or a table row", 5000)
            return
        ann = Annotation(kind="allocation", device=d.device, alloc_index=int(d.alloc_index[row]),
                         addr=int(d.allocs.addr[row]))
        sid = int(d.allocs.stack[row])
        where = " ".join(d.stack_label(sid).split()) if sid >= 0 else ""
        default = f"{d.category_name(int(d.category[row]))} {fmt_bytes(int(d.allocs.size[row]))}" + \
            (f" from {where}" if where else "")
        self._add(ann, "Annotate the allocation", default)

    def edit(self, ann_id: str | None = None):
        if self.store is None:
            return
        ann_id = ann_id if isinstance(ann_id, str) else self.win.notes_panel.current_id()
        if ann_id is None:
            return
        ann = self.store.get(ann_id)
        note = dialogs.ask_note(self.win, "Edit note", f"Note on {ann.where()}:", ann.note)
        if note is not None and note != ann.note:
            self._change(self.store.set_note, ann_id, note)

    def delete(self):
        ann_id = self.win.notes_panel.current_id()
        if self.store is None or ann_id is None:
            return
        where = self.store.get(ann_id).where()
        self._change(self.store.remove, ann_id)
        self.win.statusBar().showMessage(f"Note on {where} deleted (Ctrl+Z undoes)", 6000)

    def undo(self):
        if self.store is not None and self.store.can_undo:
            self._change(self.store.undo)
            self.win.statusBar().showMessage("Undone", 3000)

    def redo(self):
        if self.store is not None and self.store.can_redo:
            self._change(self.store.redo)
            self.win.statusBar().showMessage("Redone", 3000)

    # -- going there --------------------------------------------------------------------------------
    def go_to(self, ann_id: str):
        """Show a note on the timeline: its range, its peak, its allocation."""
        w, d = self.win, self.win.data
        if self.store is None or d is None:
            return
        try:
            ann = self.store.get(ann_id)
        except KeyError:
            return
        w.notes_panel.select(ann_id)
        span = note_span(d, ann)
        if span is None:
            w.statusBar().showMessage(
                f"This note is on cuda:{ann.device}: choose it in the Device box to see it"
                if ann.device is not None and ann.device != d.device else "This note cannot be placed on the trace",
                6000)
            return
        w.timeline.set_current_note(ann_id)
        first, last = span
        row = note_row(d, ann) if ann.kind == "allocation" else -1
        if row >= 0:
            w.select_row(row, source="annotation")
            w.show_row(row)
        elif ann.kind == "range":
            w.timeline.zoom_to_indices(max(first, 0), max(last, 0))
        else:
            w.timeline.zoom_to_indices(*d.zoom_around(first))
            w.timeline.set_cursor_index(first)
            w.pin(first)
        w.statusBar().showMessage(f"{ann.where()}: {first_line(ann.note, 120)}", 10000)

    def on_marked(self, x0: float, x1: float):
        w = self.win
        span = w.entries_in(x0, x1)
        if span is not None:
            w.mark_message = (f"Marked entries {span[0]:,}–{span[1]:,}: press A to annotate, "
                              "File > Export Trimmed Snapshot to save them, Esc to clear")
            w.statusBar().showMessage(w.mark_message, 10000)


def one_line(e: BaseException) -> str:
    """An exception for a message box: expected failures as they are, others marked."""
    text = error_text(e)
    return text if isinstance(e, (OSError, ValueError)) else f"unexpected error ({type(e).__name__}: {text})"


__all__ = ["Notes", "COMMAND_NAMES", "one_line"]
