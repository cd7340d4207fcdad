#!/usr/bin/env python3
"""How much time classification adds, against pickle.load of the same file.

    python benchmarks/bench_classify.py                 # 10^6 events (generated once)
    python benchmarks/bench_classify.py --events 1e7 --repeat 3
    python benchmarks/bench_classify.py --file some_snapshot.pickle

Target (issue 3): `analyze` (classification, iterations, peaks, leaks, OOMs, including
the parser's live model and allocation pairing it calls) costs at most 0.5x the time of
`pickle.load` of the file at 10^6 events. Snapshots come from benchmarks/gen_snapshot.py
(written to benchmarks/out/, reused when present). The best of `--repeat` runs is
reported for each measurement; everything runs in this one process.
"""
from __future__ import annotations

import argparse
import gc
import os
import pickle
import sys
import time

from _snapshots import ensure_snapshot

HERE = os.path.dirname(os.path.abspath(__file__))


def _best(fn, repeat):
    best = float("inf")
    out = None
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000)
    ap.add_argument("--file", help="an existing snapshot instead of a generated one")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--limit", type=float, default=0.5, help="fail (exit 1) above this ratio")
    args = ap.parse_args(argv)

    os.environ["VRAMSCOPE_CACHE_DIR"] = ""          # measure parsing, not the column cache
    from vramscope.classifiers import analyze, load_rules
    from vramscope.parsers import open_snapshot

    path = args.file if args.file is not None else ensure_snapshot(args.out, args.events)
    size = os.path.getsize(path)

    def load():
        with open(path, "rb") as f:
            return pickle.load(f)

    t_pickle, obj = _best(load, args.repeat)
    del obj
    t_open, snap = _best(lambda: open_snapshot(path, use_cache=False), 1)
    rules = load_rules(use_user_rules=False)
    t_an, an = _best(lambda: analyze(snap, rules=rules), args.repeat)
    n_alloc = sum(len(da.allocs) for da in an.devices.values())
    print(f"file            {path} ({size / 1e6:.1f} MB)")
    print(f"events          {snap.n_events:,}  allocations {n_alloc:,}  stacks {snap.n_stacks:,}  "
          f"iterations {sum(len(da.iterations) for da in an.devices.values()):,}")
    print(f"pickle.load     {t_pickle:8.3f} s")
    print(f"open_snapshot   {t_open:8.3f} s")
    print(f"analyze         {t_an:8.3f} s")
    ratio = t_an / t_pickle
    print(f"analyze / pickle.load = {ratio:.3f}  (target <= {args.limit})")
    return 0 if ratio <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
