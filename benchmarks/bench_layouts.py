"""Cold `summary` on every trace layout we have, at scale: each fixture (tests/data) and each
shared real snapshot (../shared/snapshots, where present) with its trace replayed to N entries
(tile_snapshot.py), timed against gc-off `pickle.load` of the same tiled file, one after the
other in the same run.

    python benchmarks/bench_layouts.py [--events 1e6] [--only NAME_PART ...] [--worst 10]

The generated 10^7 file of bench_stages.py is one layout (torch 2.5-2.9's); a layout the fast
path reads entry by entry is slow at any size, and this is where it shows: the round that wrote
this found three at 35x-88x pickle.load (tests/test_fastpath_layouts.py now counts what the
fast path takes of each, without timing). Prints one line a file, the worst ratio last; a tiled
file is removed once measured.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_parse import PICKLE_CHILD, run_measured  # noqa: E402

SOURCES = [os.path.join(ROOT, "tests", "data"), os.path.join(os.path.dirname(ROOT), "shared", "snapshots")]


def _sources(only: list[str]) -> list[str]:
    out = []
    for d in SOURCES:
        if os.path.isdir(d):
            out += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith((".pickle", ".pkl")))
    return [p for p in out if not only or any(o in os.path.basename(p) for o in only)]


def _tiled(src: str, events: int, out: str) -> bool:
    """Tiled in a process of its own: a child forked from a parent that holds the snapshot
    starts with the parent's pages in its peak RSS."""
    got = run_measured([sys.executable, os.path.join(HERE, "tile_snapshot.py"), src, "--events", str(events),
                        "-o", out])
    return bool(got["ok"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=float, default=1e6)
    ap.add_argument("--only", nargs="*", default=[], help="files whose name holds one of these")
    ap.add_argument("--worst", type=int, default=10, help="the worst ratios listed again at the end")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vramscope-layouts-") as tmp:
        path = os.path.join(tmp, "tiled.pickle")
        for src in _sources(args.only):
            name = os.path.basename(src)
            if not _tiled(src, int(args.events), path):
                print(f"{name[:64]:64s} no trace to replay", flush=True)
                continue
            load = run_measured([sys.executable, "-c", PICKLE_CHILD, path, "nogc"])
            cache = os.path.join(tmp, "cache")
            env = dict(os.environ, VRAMSCOPE_CACHE_DIR=cache)
            got = run_measured([sys.executable, "-m", "vramscope", "summary", path, "--json"], env=env)
            run_measured(["rm", "-rf", cache])
            if not got["ok"]:
                print(f"{name[:64]:64s} summary failed: {got.get('error')}", flush=True)
                continue
            ratio = got["wall_s"] / load["wall_s"]
            rows.append((ratio, name))
            print(f"{name[:64]:64s} load {load['wall_s']:6.2f} s  summary {got['wall_s']:6.2f} s ({ratio:5.2f}x)  "
                  f"RSS {got['rss_mb']:5.0f} MB ({got['rss_mb'] / load['rss_mb']:.3f}x)", flush=True)
            os.remove(path)
    if rows:
        print(f"\nworst {args.worst}:")
        for ratio, name in sorted(rows)[-args.worst:]:
            print(f"  {ratio:5.2f}x  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
