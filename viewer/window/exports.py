"""The window's File > Export actions: the report (Markdown, PNG, JSON), a trimmed snapshot,
a Perfetto trace. The dialogs ask on the GUI thread; the export itself runs on its own
worker (viewer/worker.py) with progress and Cancel, through the same services as the
command line (`vramscope report`, `vramscope export`), and the window says where it wrote.

The report's timeline PNG is drawn with Qt widgets, which live on the GUI thread: the
worker hands that one step back to it (`GuiThread`) and waits, still cancellable; the
analysis, the Markdown and the JSON stay on the worker.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

import numpy as np
from PySide6.QtWidgets import QFileDialog, QInputDialog

from ...classifiers.iterations import starts_ends
from ...common.files import one_line
from ...common.units import fmt_bytes, fmt_seconds
from ...present.timeaxis import number_ranges
from ...parsers import Progress
from ..pngfile import save_png
from ..worker import GuiThread, Worker
from . import dialogs
from .progress import ProgressDialog

if TYPE_CHECKING:
    from .main import MainWindow

TRIM_WINDOW = 2000        # entries around the peak in a trimmed export (as `vramscope export --around-peak`)


def range_words(d, first: int, last: int) -> str:
    """What a trimmed snapshot of entries first..last holds: 'entries 1,000–3,000 (0.512 s to
    1.230 s, iterations 2-3)'; the seconds when the trace has times, the iterations it
    touches when the run has them ('part of iteration 2' when it lies inside one)."""
    words = f"entries {first:,}–{last:,}"
    more = []
    if d.has_time:
        t0, t1 = float(d.seconds_of(first)), float(d.seconds_of(last))
        more.append(f"{fmt_seconds(t0, (t1 - t0) / 100 or None, t1)} to {fmt_seconds(t1, (t1 - t0) / 100 or None, t1)}")
    starts, ends = starts_ends(d.iterations)      # (a run of short steps has a million: columns)
    touch = np.flatnonzero((starts <= last) & (ends >= first))
    inside = (starts[touch] >= first) & (ends[touch] <= last)
    if len(touch) == 1 and not inside[0]:
        more.append(f"part of iteration {int(touch[0]) + 1}")
    elif len(touch):
        whole, part = (touch[inside] + 1).tolist(), (touch[~inside] + 1).tolist()
        if whole:
            more.append(f"iteration{'s' if len(whole) > 1 else ''} {number_ranges(whole)}")
        if part:
            more.append(f"part of iteration{'s' if len(part) > 1 else ''} {number_ranges(part)}")
    return words + (f" ({', '.join(more)})" if more else "")


class Exports:
    """File > Save Image, Export Report, Export Trimmed Snapshot, Export Perfetto Trace."""

    def __init__(self, window: MainWindow):
        self.win = window
        self.worker = Worker(window)
        self.progress = ProgressDialog(window, self.worker)
        self.gui = GuiThread(window)
        self._what = ""
        self._done: Callable[[object], str] | None = None
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        self.worker.cancelled.connect(self._on_cancelled)

    # -- where -------------------------------------------------------------------------------
    def _start_folder(self) -> str:
        w = self.win
        if w.path:
            return os.path.dirname(w.path)
        return str(w.settings.value("last_dir", "")) if w.settings is not None else ""

    def _base_name(self) -> str:
        return os.path.splitext(os.path.basename(self.win.path or "vramscope"))[0]

    def _save_path(self, title: str, suggested: str, filt: str, ext: str) -> str | None:
        path, _ = QFileDialog.getSaveFileName(self.win, title, os.path.join(self._start_folder(), suggested), filt)
        if not path:
            return None
        return path if os.path.splitext(path)[1] else path + ext

    # -- running one ---------------------------------------------------------------------------
    def _run(self, what: str, job: Callable[[Progress], object], done: Callable[[object], str]):
        """Write on the worker with progress and Cancel; `done(result)` words the outcome for
        the status bar. A folder that cannot be written or a bad range is a message box."""
        self._what, self._done = what, done
        self.win.close_error()
        self.worker.submit(job, expected=(OSError, ValueError))
        self.progress.show(f"Writing the {what}…")
        self.win.statusBar().showMessage(f"Writing the {what}…")

    def _on_finished(self, result):
        self.progress.hide()
        if self._done is not None:
            self.win.statusBar().showMessage(self._done(result), 15000)

    def _on_failed(self, msg: str):
        self.progress.hide()
        self.win.statusBar().showMessage(f"Could not write the {self._what}", 5000)
        self.win.show_error(f"Cannot export the {self._what}", msg)

    def _on_cancelled(self):
        self.progress.hide()
        self.win.statusBar().showMessage(f"Export of the {self._what} cancelled", 5000)

    def shutdown(self):
        self.worker.shutdown()
        self.progress.hide()

    # -- the exports ---------------------------------------------------------------------------
    def image(self):
        w = self.win
        start = w.settings.value("last_dir", "") if w.settings is not None else ""
        path, _ = QFileDialog.getSaveFileName(w, "Save image", os.path.join(start or "", self._base_name() + ".png"),
                                              "PNG images (*.png)")
        if path:
            w.timeline.hide_hover()              # the hover box is the pointer's, never the image's
            name = os.path.basename(path)        # (the whole path was cut off at 1024 pixels)
            try:
                save_png(w.grab(), path)
            except OSError as e:
                w.statusBar().showMessage(f"Could not write {name}: {one_line(e)}", 10000)
            else:
                w.statusBar().showMessage(f"Saved {name}", 5000)

    def report(self):
        """report.md + timeline.png (notes drawn) + analysis.json into a folder, like `vramscope report`."""
        w = self.win
        if w.result is None:
            return
        out = dialogs.ask_report_folder(w, self._start_folder(), f"{self._base_name()}-report")
        if not out:
            return
        if os.path.exists(out) and not os.path.isdir(out):
            self.win.show_error("Cannot export the report", f"{out} is a file, not a folder")
            return
        from ...services.report import write_report
        from ..report_png import render_timeline
        analysis = w.result.analysis
        store = w.notes.store
        notes = list(store) if store is not None else None     # None: the report reads the sidecar
        gui = self.gui

        def job(progress: Progress) -> list[str]:
            on_gui = gui.runner(progress)
            progress.start("report.md, timeline.png, analysis.json", 1.0)     # a busy bar: no steps to count

            def png(an, dev, path, annotations):
                # Qt widgets draw it: on the GUI thread; the rest of the report stays here
                return on_gui(lambda: render_timeline(an, dev, path, annotations))
            return write_report(analysis, out, annotations=notes, render_png=png, progress=progress)
        self._run("report", job, lambda paths: f"Report written to {out}: "
                  + ", ".join(os.path.basename(p) for p in paths))

    def trimmed(self):
        """A window of the shown device's trace as a snapshot pickle: the marked range,
        the visible range (when zoomed in) or the entries around the peak."""
        w = self.win
        d = w.data
        if w.result is None or d is None or d.n == 0:
            return
        from ...services.export import export_trimmed, window_around
        choices = []
        marked = w.timeline.marked_range()
        if marked is not None and (span := w.entries_in(*marked)) is not None:
            choices.append((f"The marked range: {range_words(d, *span)}", span))
        span = w.entries_in(*w.timeline.x_span())
        if span is not None and span[1] - span[0] + 1 < d.n:
            choices.append((f"The visible range: {range_words(d, *span)}", span))
        s, e = window_around(d.n, max(d.peak_index, 0), TRIM_WINDOW)
        choices.append((f"{e - s + 1:,} entries around the peak: {range_words(d, s, e)}", (s, e)))
        if len(choices) > 1:
            item, ok = QInputDialog.getItem(w, "Export trimmed snapshot", f"Which entries of cuda:{d.device}:",
                                            [c[0] for c in choices], 0, False)
            if not ok:
                return
            span = next((c[1] for c in choices if c[0] == item), choices[0][1])
        else:
            span = choices[0][1]
        # the save dialog's title says what the file will hold (the only words when there was no choice)
        path = self._save_path(f"Export trimmed snapshot of cuda:{d.device}: {range_words(d, *span)}",
                               f"{self._base_name()}.trimmed.pickle", "Memory snapshots (*.pickle)", ".pickle")
        if not path:
            return
        snap, dev, an = w.result.snapshot, d.device, w.result.analysis

        def job(progress: Progress) -> dict:
            progress.start("writing the snapshot", 1.0)
            # (the whole run's categories travel with the window: classifiers/carried.py)
            return export_trimmed(snap, path, device=dev, start=span[0], end=span[1], analysis=an, progress=progress)
        self._run("trimmed snapshot", job, lambda info: (
            f"Wrote entries {info['start']:,}–{info['end']:,} of cuda:{info['device']} to {path} "
            f"({fmt_bytes(info['bytes'])})"))

    def perfetto(self):
        """Live bytes per category as Perfetto counter tracks, every device."""
        w = self.win
        if w.result is None:
            return
        from ...services.export import export_perfetto
        path = self._save_path("Export Perfetto trace", f"{self._base_name()}.perfetto.json",
                               "Chrome trace JSON (*.json)", ".json")
        if not path:
            return
        analysis = w.result.analysis

        def job(progress: Progress) -> dict:
            progress.start("writing the trace", 1.0)
            return export_perfetto(analysis, path, progress=progress)
        self._run("Perfetto trace", job, lambda info: (
            f"Wrote {info['counter_events']:,} counter events to {path}: open it in ui.perfetto.dev"))


__all__ = ["Exports", "TRIM_WINDOW", "range_words"]
