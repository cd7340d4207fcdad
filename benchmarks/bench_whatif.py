#!/usr/bin/env python3
"""How fast the what-if peak is recomputed, and what its model costs in memory.

    python benchmarks/bench_whatif.py                    # 10^6 events (generated once)
    python benchmarks/bench_whatif.py --events 1e7
    python benchmarks/bench_whatif.py --file some_snapshot.pickle

Target (issue 14): the viewer's what-if sliders redraw in under 16 ms median at 10^6
events, so the exact scaled peak (classifiers/category_live.py, CategoryLive.peak) must
take a fraction of that. Measured here, in this one process, after `analyze`:

  build        CategoryLive.build (once per device) and the bytes it keeps
  random       peak() for random factors in [0, 2) on every category (the worst case for
               the pruning: every category's rounding matters)
  slider       one category swept 0 -> 2 in small steps, the others at 1 (a user dragging
               one slider), for each category in turn
  levers       what_if() for each lever (type of the new peak, budget reused)
  samples      live_at_many() at 2,000 sample points (once per view) and
               scaled_series() on them (per slider move)
  budget       budget() (once per device)
Every `random` result is checked against a full vectorized replay for a few factor sets
(`exact`). Snapshots come from benchmarks/gen_snapshot.py (benchmarks/out/, reused).
Results also go to benchmarks/out/whatif_results.json.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numpy as np

from _snapshots import ensure_snapshot

HERE = os.path.dirname(os.path.abspath(__file__))


def _stats(ts):
    a = np.asarray(ts) * 1e3
    return {"median_ms": float(np.median(a)), "p90_ms": float(np.percentile(a, 90)), "max_ms": float(a.max()),
            "n": int(len(a))}


def _fmt(name, s):
    return f"{name:<10s} median {s['median_ms']:7.2f} ms   p90 {s['p90_ms']:7.2f} ms   max {s['max_ms']:7.2f} ms   (n={s['n']})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000)
    ap.add_argument("--file", help="an existing snapshot instead of a generated one")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--trials", type=int, default=200, help="random factor sets")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    os.environ["VRAMSCOPE_CACHE_DIR"] = ""          # never touch the user's cache
    import orjson

    from vramscope.classifiers import analyze, load_rules
    from vramscope.classifiers.budget import budget
    from vramscope.classifiers.category_live import CategoryLive, scale_live, scaled_series
    from vramscope.classifiers.whatif import LEVERS, what_if
    from vramscope.common.atomic import atomic_write
    from vramscope.parsers import open_snapshot

    path = args.file if args.file is not None else ensure_snapshot(args.out, args.events)
    t = time.perf_counter()
    snap = open_snapshot(path, use_cache=False)
    an = analyze(snap, rules=load_rules(use_user_rules=False), use_cache=False)
    t_an = time.perf_counter() - t
    results = {"file": path, "events": snap.n_events, "analyze_s": t_an, "devices": []}
    print(f"file       {path}  ({snap.n_events:,} events; open + analyze {t_an:.2f} s)")
    rng = np.random.default_rng(args.seed)
    for dev, da in an.devices.items():
        n = len(da.live.live_after)
        if n == 0:
            continue
        gc.collect()
        t = time.perf_counter()
        cl = CategoryLive.build(da)
        t_build = time.perf_counter() - t
        C = len(cl.categories)
        print(f"device {dev}: {n:,} entries, {cl.n_events:,} alloc/free events, {len(da.iterations)} iterations, "
              f"categories {', '.join(cl.categories)}")
        print(f"build      {t_build * 1e3:7.1f} ms, keeps {cl.nbytes / 1e6:.1f} MB "
              f"({cl.nbytes / max(1, n):.2f} B per entry; live_after alone is 8 B per entry)")
        cl.peak()                                            # warm up
        ts, factor_sets = [], []
        for _ in range(args.trials):
            f = rng.random(C) * 2
            t = time.perf_counter()
            cl.peak(f)
            ts.append(time.perf_counter() - t)
            factor_sets.append(f)
        s_random = _stats(ts)
        print(_fmt("random", s_random))
        ts = []
        for k in range(C):
            for v in np.linspace(0, 2, 41):
                f = np.ones(C)
                f[k] = v
                t = time.perf_counter()
                cl.peak(f)
                ts.append(time.perf_counter() - t)
        s_slider = _stats(ts)
        print(_fmt("slider", s_slider))
        # exactness: the pruned search against a full replay of per-category live bytes
        # (events are the only moments the totals change; the start state is index -1)
        from vramscope.classifiers.category_live import _replay
        cum, entries = _replay(cl.ev_code, cl._row_cat, cl._alloc_index, cl._free_index, cl._size, C, cl.start)
        exact = True
        for f in factor_sets[:5] + [np.ones(C)]:
            tot = scale_live(cum, f).sum(axis=1)
            s0 = int(scale_live(cl.start, f).sum())
            j = int(np.argmax(tot))
            want = (int(tot[j]), int(entries[j])) if tot[j] > s0 else (s0, -1)
            got = cl.peak(f)
            exact &= (got.bytes, got.index) == want
        del cum, entries
        print(f"exact      {'yes' if exact else 'NO'} (6 factor sets against a full replay)")
        t = time.perf_counter()
        bud = budget(an, dev, model=cl)
        t_budget = time.perf_counter() - t
        ts = []
        for name in LEVERS:
            t = time.perf_counter()
            what_if(an, dev, levers=[name], model=cl, budget=bud)
            ts.append(time.perf_counter() - t)
        s_levers = _stats(ts)
        print(_fmt("levers", s_levers) + "  (what_if incl. the new peak's type)")
        idx = np.linspace(-1, n - 1, 2000).astype(np.int64)
        t = time.perf_counter()
        samples = cl.live_at_many(idx)
        t_samples = time.perf_counter() - t
        ts = []
        for f in factor_sets[:100]:
            t = time.perf_counter()
            scaled_series(samples, f)
            ts.append(time.perf_counter() - t)
        s_series = _stats(ts)
        print(f"samples    live_at_many(2000) {t_samples * 1e3:.1f} ms once per view; "
              f"scaled_series median {s_series['median_ms']:.3f} ms per move")
        print(f"budget     {t_budget * 1e3:7.1f} ms")
        results["devices"].append({
            "device": dev, "entries": n, "events": cl.n_events, "iterations": len(da.iterations),
            "categories": list(cl.categories), "build_ms": t_build * 1e3, "model_bytes": cl.nbytes,
            "random": s_random, "slider": s_slider, "levers": s_levers, "exact": exact,
            "live_at_many_2000_ms": t_samples * 1e3, "scaled_series": s_series, "budget_ms": t_budget * 1e3})
    os.makedirs(args.out, exist_ok=True)
    atomic_write(os.path.join(args.out, "whatif_results.json"), orjson.dumps(results, option=orjson.OPT_INDENT_2),
                 durable=False)
    return 0 if all(d["exact"] for d in results["devices"]) else 1


if __name__ == "__main__":
    sys.exit(main())
