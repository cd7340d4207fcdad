#!/usr/bin/env python3
"""Viewer benchmark: time to a usable window, peak RSS, zoom/pan repaint times.

    python benchmarks/bench_viewer.py                    # 1e5, 1e6, 1e7 events
    python benchmarks/bench_viewer.py --events 1e6 --changes 50 --json out.json

For each size, on benchmarks/out/snap_N.pickle (made by gen_snapshot.py when
missing), every measurement runs in its own fresh process so that peak RSS
means something:

- baseline: `pickle.load` of the file (time, peak RSS); the file is read once
  before, so both sides start from a warm page cache;
- cold open: a new viewer window (offscreen, 1400x900) opens the file through
  its background loader with an empty column cache (parse + analyze + model +
  first paint); "usable" is from the open request to the first painted frame;
  Qt's own start-up (QApplication, window) is reported apart;
- warm open: the same with the column cache filled by the cold run (a reopen);
- repaints: after the cold open, `--changes` random view changes (log-uniform
  widths from 1e-4 of the run to all of it, random centres): set the x range,
  recompute the envelope, and paint the whole timeline (plot + overview) with
  `grab()`; median and 95th percentile.

- the same views stacked by allocation and by segment, and a hover (what is under a
  random point, answered and drawn) after each;
- the Allocator panel at random entries and stepping one entry (state + paint);
- a what-if slider moved (exact scaled peak, words, scaled redraw and paint);
- the frame search: from the last keystroke to the table showing the result;
- the memory tree at the peak (the panel's tree asked for and painted) and an event selected
  in the Allocator's event list (to the map, the list and the timeline repainted);
  `--only-new` times only these two after the opens.

Targets (issue 4): usable <= 3x pickle.load; viewer RSS <= 0.5x pickle.load RSS
+ 150 MB; repaint <= 16 ms median and <= 33 ms p95. Issue 16: allocation / segment
views and the allocator panel <= 16 ms median, hover <= 30 ms, search settles <= 100 ms;
issue 14: a slider redraw <= 16 ms median. Issue 22: the memory tree at the peak <= 100 ms
median, an event selected <= 30 ms median.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from _snapshots import ensure_snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")
SIZE = (1400, 900)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux: KiB


def snapshot_path(events: int) -> str:
    return ensure_snapshot(OUT, events)


def warm_page_cache(path: str):
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


# -- children --------------------------------------------------------------------------
def child_pickle(path: str) -> dict:
    import pickle
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        obj = pickle.load(fh)
    dt = time.perf_counter() - t0
    del obj
    return {"seconds": dt, "rss_mb": rss_mb()}


def child_viewer(path: str, changes: int, seed: int, only_new: bool = False) -> dict:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    t_start = time.perf_counter()
    from vramscope.viewer.app import make_app, quiet_platform_noise
    quiet_platform_noise()
    app = make_app()
    from vramscope.viewer.window import MainWindow
    win = MainWindow(persist=False, use_cache=True)
    win.resize(*SIZE)
    win.show()
    app.processEvents()
    win.grab()
    startup = time.perf_counter() - t_start
    rss_before = rss_mb()

    done = []
    win.loaded.connect(lambda: done.append(time.perf_counter()))
    errors = []
    win.loading.worker.failed.connect(errors.append)
    t0 = time.perf_counter()
    win.open_path(path)
    while not done and not errors:
        app.processEvents()
        time.sleep(0.002)
    if errors:
        raise SystemExit(f"load failed: {errors[0]}")
    app.processEvents()
    win.grab()                       # the first frame, fully painted
    usable = time.perf_counter() - t0
    out = {"startup_s": startup, "usable_s": usable, "rss_before_load_mb": rss_before,
           "from_cache": bool(win.result.snapshot.from_cache), "events": win.data.n if win.data else 0,
           "model_mb": (win.data.nbytes / 1e6) if win.data else 0}

    if changes and win.data is not None:
        import numpy as np
        q = lambda xs, p: float(np.percentile(xs, p)) if xs else 0.0     # noqa: E731
        tl = win.timeline
        x0, x1 = win.data.x_range
        full = x1 - x0
        for mode in MODES if not only_new else ():
            if not win.timeline.set_mode(mode):
                continue
            rng = np.random.default_rng(seed)                   # the same views for every mode
            tl.refresh_now()
            tl.grab()                                            # a first frame (lazy models built)
            total, compute, paint, cpu, hover = [], [], [], [], []
            for _ in range(changes):
                width = full * 10 ** rng.uniform(-4, 0)
                c = rng.uniform(x0 + width / 2, x1 - width / 2) if width < full else (x0 + x1) / 2
                a, ca = time.perf_counter(), time.thread_time()
                tl.set_x_range(c - width / 2, c + width / 2)
                tl.refresh_now()
                b = time.perf_counter()
                tl.grab()
                e, ce = time.perf_counter(), time.thread_time()
                app.processEvents()      # let coalesced timers run (not timed: already refreshed)
                total.append((e - a) * 1e3)
                compute.append((b - a) * 1e3)
                paint.append((e - b) * 1e3)
                cpu.append((ce - ca) * 1e3)
                # hover: what is under a random point of this view, answered and drawn
                (vx0, vx1), (vy0, vy1) = tl.vb.viewRange()
                hx, hy = rng.uniform(vx0, vx1), rng.uniform(vy0, vy1) * 0.9
                h0 = time.perf_counter()
                tl.pointer.hover_at(hx, hy)
                tl.plot.viewport().grab()
                hover.append((time.perf_counter() - h0) * 1e3)
            tl.pointer.hide_hover()
            # wall time is the target; the GUI thread's CPU time says how much of it was
            # ours when other processes share the machine
            key = "" if mode == "categories" else f"{mode}_"
            out.update({f"{key}repaint_median_ms": q(total, 50), f"{key}repaint_p95_ms": q(total, 95),
                        f"{key}repaint_cpu_median_ms": q(cpu, 50), f"{key}repaint_cpu_p95_ms": q(cpu, 95),
                        f"{key}envelope_median_ms": q(compute, 50), f"{key}envelope_p95_ms": q(compute, 95),
                        f"{key}paint_median_ms": q(paint, 50), f"{key}paint_p95_ms": q(paint, 95),
                        f"{key}hover_median_ms": q(hover, 50), f"{key}hover_p95_ms": q(hover, 95)})
        tl.set_mode("categories")
        tl.reset_view()
    if changes and win.data is not None and not only_new:
        out.update(bench_allocator(app, win, changes, seed))
        out.update(bench_whatif(app, win, changes, seed))
        out.update(bench_search(app, win))
    if (changes or only_new) and win.data is not None:
        out.update(bench_events_and_tree(app, win, max(changes, 20), seed))
    out["rss_mb"] = rss_mb()
    win.close()
    return out


MODES = ("categories", "allocations", "segments")


def bench_allocator(app, win, changes: int, seed: int) -> dict:
    """The Allocator panel at random entries: its state computed and the panel painted."""
    import numpy as np
    d = win.data
    dock = win.docks["allocator"]
    dock.show()
    dock.raise_()
    app.processEvents()
    panel = win.allocator_panel
    rng = np.random.default_rng(seed)
    panel.show_index(d.peak_index)
    panel.grab()                                    # first use: pairs the free_requested entries
    times = []
    for i in rng.integers(0, d.n, changes).tolist():
        a = time.perf_counter()
        panel.show_index(int(i))
        panel.grab()
        times.append((time.perf_counter() - a) * 1e3)
    # stepping: the key the user holds (one entry at a time)
    steps = []
    for _ in range(min(changes, 50)):
        a = time.perf_counter()
        panel.step(1)
        panel.grab()
        steps.append((time.perf_counter() - a) * 1e3)
    win.docks["allocations"].raise_()
    q = lambda xs, p: float(np.percentile(xs, p))     # noqa: E731
    return {"allocator_median_ms": q(times, 50), "allocator_p95_ms": q(times, 95),
            "allocator_step_median_ms": q(steps, 50), "allocator_step_p95_ms": q(steps, 95),
            "allocator_segments": len(panel.state.segments) if panel.state else 0}


def bench_events_and_tree(app, win, changes: int, seed: int) -> dict:
    """Issue 22. The memory tree at the peak: the panel asked for the peak's tree
    (memory_tree, the model reset, the heavy chains opened) and painted, its per-device index
    built once before (timed apart). An event selected in the Allocator's event list at a
    random entry: from the selection to the map, the list and the timeline repainted."""
    import numpy as np
    from vramscope.classifiers.memtree import tree_index
    d = win.data
    q = lambda xs, p: float(np.percentile(xs, p))     # noqa: E731
    a = time.perf_counter()
    tree_index(d.da)
    index_ms = (time.perf_counter() - a) * 1e3
    win.dock_layout.show("memtree")
    app.processEvents()
    panel = win.memtree_panel
    tree = []
    for _ in range(changes):
        panel.index = None                          # ask again (a shown moment is not recomputed)
        a = time.perf_counter()
        panel.show_index(d.peak_index)
        panel.grab()
        tree.append((time.perf_counter() - a) * 1e3)
    nodes = len(panel.tree) if panel.tree is not None else 0
    win.dock_layout.show("allocator")
    app.processEvents()
    alloc = win.allocator_panel
    alloc.show_index(d.peak_index)
    alloc.grab()
    from PySide6.QtCore import QItemSelectionModel
    ev = alloc.events
    sel = ev.selectionModel()
    flags = QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows
    rng = np.random.default_rng(seed)
    pick = []
    for i in rng.integers(0, d.n, changes).tolist():
        ev.scrollTo(ev.model().index(int(i), 0))    # the row on screen, as before a click (not timed)
        app.processEvents()
        a = time.perf_counter()
        sel.setCurrentIndex(ev.model().index(int(i), 0), flags)     # what a click on the row does
        alloc.grab()
        win.timeline.plot.viewport().grab()
        pick.append((time.perf_counter() - a) * 1e3)
        assert alloc.index == int(i) and win.pinned_index == int(i)
    win.docks["allocations"].raise_()
    return {"tree_index_ms": index_ms, "tree_peak_median_ms": q(tree, 50), "tree_peak_p95_ms": q(tree, 95),
            "tree_nodes": nodes, "event_select_median_ms": q(pick, 50), "event_select_p95_ms": q(pick, 95)}


def bench_whatif(app, win, changes: int, seed: int) -> dict:
    """A slider moved: the exact scaled peak, the panel's words and the timeline redrawn
    scaled and painted (the whole run in view, as when one compares)."""
    import numpy as np
    dock = win.docks["whatif"]
    panel = win.whatif_panel
    t0 = time.perf_counter()
    panel.ensure_model()             # CategoryLive and the budget, built on the panel's first show (its worker)
    while panel.session is None:
        app.processEvents()
        time.sleep(0.001)
    build = time.perf_counter() - t0
    dock.show()
    dock.raise_()
    app.processEvents()
    tl = win.timeline
    tl.reset_view()
    rng = np.random.default_rng(seed)
    names = list(panel.sliders)
    times, peak_ms = [], []
    for _ in range(changes):
        name = names[int(rng.integers(len(names)))]
        v = int(rng.integers(0, 201))
        a = time.perf_counter()
        sl = panel.sliders[name]
        sl.blockSignals(True)
        sl.setValue(v)
        sl.blockSignals(False)
        panel.update_now()
        b = time.perf_counter()
        tl.grab()
        times.append((time.perf_counter() - a) * 1e3)
        peak_ms.append((b - a) * 1e3)
    panel.reset()
    win.docks["allocations"].raise_()
    q = lambda xs, p: float(np.percentile(xs, p))     # noqa: E731
    return {"whatif_build_s": build, "slider_median_ms": q(times, 50), "slider_p95_ms": q(times, 95),
            "slider_compute_median_ms": q(peak_ms, 50)}


def bench_search(app, win) -> dict:
    """Typing into the frame search: from the last keystroke to the table showing the result
    (the filter's short pause, the filter, the repaint)."""
    from PySide6.QtTest import QTest
    panel = win.table_panel
    win.docks["allocations"].show()
    win.docks["allocations"].raise_()
    app.processEvents()
    settle = []
    for text in ("forward", "model.py:203", "optimizer", "zzz_nothing"):
        panel.text.clear()
        panel.apply_filter()
        app.processEvents()
        panel.text.setFocus()
        for ch in text:
            QTest.keyClicks(panel.text, ch)
            app.processEvents()
        last = time.perf_counter()
        while panel._timer.isActive():
            app.processEvents()
            time.sleep(0.0005)
        app.processEvents()
        panel.table.viewport().grab()
        settle.append((time.perf_counter() - last) * 1e3)
    panel.text.clear()
    panel.apply_filter()
    return {"search_settle_ms": max(settle), "search_settle_each_ms": settle}


def run_child(args: list[str], env: dict | None = None) -> dict:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"child {args} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- driver ------------------------------------------------------------------------------------
def bench(events: int, changes: int, seed: int, only_new: bool = False) -> dict:
    path = snapshot_path(events)
    stamp = os.stat(path).st_mtime_ns
    warm_page_cache(path)
    base = run_child(["--child-pickle", path])
    cache = tempfile.mkdtemp(prefix="vramscope-bench-cache-")
    try:
        env = {"VRAMSCOPE_CACHE_DIR": cache, "QT_QPA_PLATFORM": "offscreen"}
        cold = run_child(["--child-viewer", path, "--changes", str(changes), "--seed", str(seed)]
                         + (["--only-new"] if only_new else []), env)
        warm = run_child(["--child-viewer", path, "--changes", "0"], env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if os.stat(path).st_mtime_ns != stamp:
        raise SystemExit(f"{path} changed while we measured it (regenerated?): run again")
    rss_budget = 0.5 * base["rss_mb"] + 150
    return {
        "events": events, "file_mb": os.path.getsize(path) / 1e6,
        "pickle_load_s": base["seconds"], "pickle_load_rss_mb": base["rss_mb"],
        "cold": cold, "warm": warm,
        "usable_ratio": cold["usable_s"] / base["seconds"],
        "rss_budget_mb": rss_budget,
        "ok": {
            "usable": cold["usable_s"] <= 3 * base["seconds"],
            "rss": cold["rss_mb"] <= rss_budget,
            "repaint_median": cold.get("repaint_median_ms", 0) <= 16,
            "repaint_p95": cold.get("repaint_p95_ms", 0) <= 33,
            "allocations_repaint_median": cold.get("allocations_repaint_median_ms", 0) <= 16,
            "segments_repaint_median": cold.get("segments_repaint_median_ms", 0) <= 16,
            "allocator_median": cold.get("allocator_median_ms", 0) <= 16,
            "hover": max(cold.get(f"{m}hover_median_ms", 0) for m in ("", "allocations_", "segments_")) <= 30,
            "search_settle": cold.get("search_settle_ms", 0) <= 100,
            "slider_median": cold.get("slider_median_ms", 0) <= 16,
            "tree_peak_median": cold.get("tree_peak_median_ms", 0) <= 100,
            "event_select_median": cold.get("event_select_median_ms", 0) <= 30,
        },
    }


def report(rows: list[dict]) -> str:
    lines = ["| events | pickle.load | usable (cold) | ratio | reopen (cache) | Qt start-up | pickle RSS | viewer RSS "
             "| RSS budget | repaint median / p95 | (CPU) | envelope median / p95 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        c, w = r["cold"], r["warm"]
        lines.append(
            f"| {r['events']:,} | {r['pickle_load_s']:.2f} s | {c['usable_s']:.2f} s | {r['usable_ratio']:.2f}x "
            f"| {w['usable_s']:.2f} s | {c['startup_s']:.2f} s | {r['pickle_load_rss_mb']:.0f} MB "
            f"| {c['rss_mb']:.0f} MB | {r['rss_budget_mb']:.0f} MB "
            f"| {c.get('repaint_median_ms', 0):.1f} / {c.get('repaint_p95_ms', 0):.1f} ms "
            f"| {c.get('repaint_cpu_median_ms', 0):.1f} / {c.get('repaint_cpu_p95_ms', 0):.1f} ms "
            f"| {c.get('envelope_median_ms', 0):.1f} / {c.get('envelope_p95_ms', 0):.1f} ms |")
    lines += ["", "| events | view | repaint median / p95 | hover median / p95 |", "|---:|---|---:|---:|"]
    for r in rows:
        c = r["cold"]
        for mode in MODES:
            key = "" if mode == "categories" else f"{mode}_"
            if f"{key}repaint_median_ms" in c:
                lines.append(f"| {r['events']:,} | {mode} | {c[f'{key}repaint_median_ms']:.1f} / "
                             f"{c[f'{key}repaint_p95_ms']:.1f} ms | {c[f'{key}hover_median_ms']:.1f} / "
                             f"{c[f'{key}hover_p95_ms']:.1f} ms |")
        if "allocator_median_ms" in c:
            lines.append(f"| {r['events']:,} | allocator panel ({c['allocator_segments']} segments) | "
                         f"{c['allocator_median_ms']:.1f} / {c['allocator_p95_ms']:.1f} ms (step "
                         f"{c['allocator_step_median_ms']:.1f} / {c['allocator_step_p95_ms']:.1f}) | |")
        if "slider_median_ms" in c:
            lines.append(f"| {r['events']:,} | what-if slider (model built in {c['whatif_build_s']:.2f} s) | "
                         f"{c['slider_median_ms']:.1f} / {c['slider_p95_ms']:.1f} ms | |")
        if "tree_peak_median_ms" in c:
            lines.append(f"| {r['events']:,} | memory tree at the peak ({c['tree_nodes']} nodes; index "
                         f"{c['tree_index_ms']:.0f} ms once) | {c['tree_peak_median_ms']:.1f} / "
                         f"{c['tree_peak_p95_ms']:.1f} ms | |")
            lines.append(f"| {r['events']:,} | event list: an event selected (map, list, timeline) | "
                         f"{c['event_select_median_ms']:.1f} / {c['event_select_p95_ms']:.1f} ms | |")
        if "search_settle_ms" in c:
            lines.append(f"| {r['events']:,} | frame search settle (worst of 4 queries) | "
                         f"{c['search_settle_ms']:.1f} ms | |")
    return "\n".join(lines)


def _count(s: str) -> int:
    return int(float(s))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", nargs="+", type=_count, default=[100_000, 1_000_000, 10_000_000])
    p.add_argument("--changes", type=int, default=50, help="random view changes to time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--only-new", action="store_true",
                   help="after the opens, time only the memory tree and the event list (issue 22)")
    p.add_argument("--child-pickle", help=argparse.SUPPRESS)
    p.add_argument("--child-viewer", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child_pickle:
        print(json.dumps(child_pickle(a.child_pickle)))
        return 0
    if a.child_viewer:
        print(json.dumps(child_viewer(a.child_viewer, a.changes, a.seed, a.only_new)))
        return 0
    rows = []
    for n in a.events:
        r = bench(n, a.changes, a.seed, a.only_new)
        rows.append(r)
        print(json.dumps(r), file=sys.stderr)
    print(report(rows))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0 if all(all(r["ok"].values()) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
