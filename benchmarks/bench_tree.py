#!/usr/bin/env python3
"""What the viewer's memory tree and event list cost, without the viewer (no Qt imported).

    python benchmarks/bench_tree.py                      # 10^6 events (generated once)
    python benchmarks/bench_tree.py --events 1e7
    python benchmarks/bench_tree.py --file some_snapshot.pickle

Targets (issue 22, at 10^6 events): building the tree at the peak under 100 ms median;
selecting an event under 30 ms (the viewer's part, moving the block map, comes on top of
what is measured here). Measured in this one process, after `analyze`:

  tree index    classifiers.memtree.tree_index (once per device: each row's group, each
                stack's path, the nodes)
  tree peak     memory_tree(da, peak) (then warm: what every later moment costs)
  tree random   memory_tree at random entries
  tree words    tree_lines + tree_document at the peak (the report's text, the JSON)
  search        search_tree for a file, a function, an op
  node rows     tree.rows(node) for the heaviest root (double-click: its allocations)
  event prepare prepare_events (once per device: the rows by address, the segment events)
  event first   the first window of 300 entries after that
  event select  a window of 300 rows around a random entry as EventRows + the block map's
                header (present.events.event_rows + event_header)
  segment next  next_segment_event from random entries
  x axis        classifiers.timeaxis.x_axis (once per device)
and, for the ratio the other benchmarks report, `pickle.load` of the same file in a child
process. Results also go to benchmarks/out/tree_results.json.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from _snapshots import ensure_snapshot

HERE = os.path.dirname(os.path.abspath(__file__))


def _stats(ts):
    a = np.asarray(ts) * 1e3
    return {"median_ms": float(np.median(a)), "p95_ms": float(np.percentile(a, 95)), "max_ms": float(a.max()),
            "n": int(len(a))}


def _fmt(name, s):
    return f"{name:<13s} median {s['median_ms']:8.2f} ms   p95 {s['p95_ms']:8.2f} ms   max {s['max_ms']:8.2f} ms" \
           f"   (n={s['n']})"


def _timed(fn, repeat):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return _stats(ts)


def pickle_load_seconds(path: str) -> float:
    code = ("import pickle, sys, time, os\nf = open(sys.argv[1], 'rb')\nt = time.perf_counter()\n"
            "pickle.load(f)\nprint(time.perf_counter() - t)\nsys.stdout.flush()\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000)
    ap.add_argument("--file", help="an existing snapshot instead of a generated one")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-pickle", action="store_true", help="skip the pickle.load baseline")
    args = ap.parse_args(argv)

    os.environ["VRAMSCOPE_CACHE_DIR"] = ""          # never touch the user's cache
    import orjson

    from vramscope.classifiers import analyze, load_rules
    from vramscope.classifiers.events import event_window, next_segment_event, prepare_events
    from vramscope.classifiers.memtree import memory_tree, tree_index
    from vramscope.classifiers.timeaxis import x_axis
    from vramscope.common.atomic import atomic_write
    from vramscope.parsers import open_snapshot
    from vramscope.present.events import event_header, event_rows
    from vramscope.present.memtree import search_tree, tree_document, tree_lines
    from vramscope.present.stacks import Stacks
    from vramscope.present.timeaxis import axis_reason

    path = args.file if args.file is not None else ensure_snapshot(args.out, args.events)
    with open(path, "rb") as fh:                    # warm the page cache for both sides
        while fh.read(1 << 24):
            pass
    load_s = None if args.no_pickle else pickle_load_seconds(path)
    t = time.perf_counter()
    snap = open_snapshot(path, use_cache=False)
    an = analyze(snap, rules=load_rules(use_user_rules=False), use_cache=False)
    t_an = time.perf_counter() - t
    stacks = Stacks(an)
    print(f"file          {path}  ({snap.n_events:,} events; open + analyze {t_an:.2f} s"
          + (f"; pickle.load {load_s:.2f} s)" if load_s is not None else ")"))
    results: dict = {"file": path, "events": snap.n_events, "analyze_s": t_an, "pickle_load_s": load_s, "devices": []}
    rng = np.random.default_rng(args.seed)
    ms = (lambda s: s * 1e3)
    for dev, da in an.devices.items():
        n = da.n_entries
        if n == 0:
            continue
        r: dict = {"device": dev, "entries": n, "rows": len(da.allocs)}
        t = time.perf_counter()
        ix = tree_index(da)
        r["tree_index_ms"] = ms(time.perf_counter() - t)
        t = time.perf_counter()
        tree = memory_tree(da, da.peak.index)
        r["tree_peak_first_ms"] = ms(time.perf_counter() - t)
        print(f"device {dev}: {n:,} entries, {len(da.allocs):,} allocation rows, {ix.n_groups} stack groups, "
              f"{ix.n_nodes} nodes ({len(tree)} at the peak, {tree.total_count:,} live allocations)")
        print(f"tree index    {r['tree_index_ms']:8.2f} ms (once per device)")
        print(f"tree first    {r['tree_peak_first_ms']:8.2f} ms (at the peak, after the index)")
        r["tree_peak"] = _timed(lambda: memory_tree(da, da.peak.index), args.repeat)
        print(_fmt("tree peak", r["tree_peak"]) + "   target < 100 ms")
        idx = rng.integers(-1, n, size=args.repeat).tolist()
        it = iter(idx)
        r["tree_random"] = _timed(lambda: memory_tree(da, next(it)), len(idx))
        print(_fmt("tree random", r["tree_random"]))
        r["tree_words"] = _timed(lambda: (tree_lines(tree, stacks), tree_document(tree, stacks)), 10)
        print(_fmt("tree words", r["tree_words"]))
        queries = ["forward", ".py:1", "aten::mm", "train.py", "no_such_frame"]
        qi = iter(queries * (args.repeat // len(queries) + 1))
        r["search"] = _timed(lambda: search_tree(tree, stacks, next(qi)), args.repeat)
        print(_fmt("search", r["search"]))
        top = int(tree.roots[0]) if len(tree.roots) else -1
        r["node_rows"] = _timed(lambda: tree.rows(top), 20)
        print(_fmt("node rows", r["node_rows"]) + f"   ({len(tree.rows(top)):,} rows)")
        t = time.perf_counter()
        prepare_events(da)
        r["event_prepare_ms"] = ms(time.perf_counter() - t)
        print(f"event prepare {r['event_prepare_ms']:8.2f} ms (once per device: the rows by address, the segment events)")
        t = time.perf_counter()
        event_window(da, n // 2, n // 2 + 300)
        r["event_first_ms"] = ms(time.perf_counter() - t)
        print(f"event first   {r['event_first_ms']:8.2f} ms (a window of 300, after prepare_events)")
        sel = rng.integers(0, n, size=args.repeat).tolist()
        si = iter(sel)

        def select():
            i = next(si)
            event_rows(da, stacks, max(0, i - 150), i + 150)
            event_header(da, stacks, i)
        r["event_select"] = _timed(select, len(sel))
        print(_fmt("event select", r["event_select"]) + "   target < 30 ms (with the viewer's block map)")
        sj = iter(sel)
        r["segment_next"] = _timed(lambda: next_segment_event(da, next(sj)), len(sel))
        print(_fmt("segment next", r["segment_next"]))
        t = time.perf_counter()
        ax = x_axis(da)
        r["x_axis_ms"] = ms(time.perf_counter() - t)
        r["x_axis"] = axis_reason(ax)
        print(f"x axis        {r['x_axis_ms']:8.2f} ms: {r['x_axis']}")
        results["devices"].append(r)
    os.makedirs(args.out, exist_ok=True)
    atomic_write(os.path.join(args.out, "tree_results.json"), orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
