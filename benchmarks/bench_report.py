#!/usr/bin/env python3
"""`summary` and `report` cold and cached, for one or several source trees in the same run.

    python benchmarks/bench_report.py                                  # this checkout, 10^6 events
    python benchmarks/bench_report.py --tree before=/tmp/old --tree after=. --repeat 3

Each tree (a checkout: `git archive COMMIT | tar -x -C DIR` gives an older one) is laid
out as it installs (pyproject.toml's package-dir) under benchmarks/out/trees/LABEL and
run with PYTHONPATH pointing there, so two versions of the code share this one
environment and one machine state. Every command runs in a fresh process, waited for
with `os.wait4` for its own peak RSS; the trees alternate within each repeat and the
best wall time (median RSS) of `--repeat` runs counts (the machine is shared):

  summary cold    `summary FILE --json`, empty cache (parse, analyze, write the cache)
  summary cached  the same again, on that cache (`--cached-runs` times per repeat: a cached
                  run is short, and the noise of a shared machine is not)
  report cold     `report FILE -o DIR`, empty cache
  report cached   the same again, on that cache (the analysis read from it)

The snapshot comes from gen_snapshot.py (benchmarks/out/, reused). Results also go to
benchmarks/out/report_results.json.
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _snapshots import ensure_snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib


def installed_layout(tree: str, dest: str) -> str:
    """The tree's packages copied where they install (`vramscope/parsers`, ...)."""
    with open(os.path.join(tree, "pyproject.toml"), "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(dest, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "icons")
    for pkg, src in sorted(package_dir.items()):       # parents first: 'vramscope' before 'vramscope.x'
        target = os.path.join(dest, *pkg.split("."))
        if os.path.isdir(target):                      # a link in the tree made it already
            shutil.rmtree(target)
        shutil.copytree(os.path.join(tree, src), target, ignore=ignore, symlinks=False)
    # byte-compiled as pip installs it: otherwise every run compiles the sources again (most of
    # a cached `summary` under PYTHONDONTWRITEBYTECODE), and a tree with more lines looks slower
    compileall.compile_dir(dest, quiet=1)
    return dest


def _run(cmd: list[str], env: dict, cwd: str) -> dict:
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        # `python -m` puts the working directory first on sys.path: run from an empty one,
        # so the tree on PYTHONPATH is the one imported
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=cwd)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {stderr[-500:]}")
    return {"wall_s": wall, "rss_mb": ru.ru_maxrss / 1024 if sys.platform != "darwin" else ru.ru_maxrss / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000)
    ap.add_argument("--file", help="an existing snapshot instead of a generated one")
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                    help="a source tree to measure (repeatable; default: this checkout)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cached-runs", type=int, default=3, help="cached runs after each cold one")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args(argv)
    path = args.file or ensure_snapshot(args.out, args.events)
    trees = [t.split("=", 1) for t in args.tree] or [["this", ROOT]]
    layouts = {label: installed_layout(os.path.abspath(src), os.path.join(args.out, "trees", label))
               for label, src in trees}
    with open(path, "rb") as f:                         # into the page cache before anything is timed
        while f.read(1 << 24):
            pass
    steps = ("summary cold", "summary cached", "report cold", "report cached")
    runs: dict = {label: {s: [] for s in steps} for label in layouts}
    work = tempfile.mkdtemp(prefix="vramscope-bench-report-")
    try:
        for k in range(args.repeat):
            for label, layout in layouts.items():
                env = {**os.environ, "PYTHONPATH": layout, "QT_QPA_PLATFORM": "offscreen"}
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                base = [sys.executable, "-m", "vramscope"]
                for verb, cmd in (("summary", ["summary", os.path.abspath(path), "--json"]),
                                  ("report", ["report", os.path.abspath(path), "-o", os.path.join(work, f"{label}-{k}")])):
                    cache = os.path.join(work, f"cache-{label}-{verb}-{k}")
                    os.makedirs(cache)
                    env["VRAMSCOPE_CACHE_DIR"] = cache
                    runs[label][f"{verb} cold"].append(_run(base + cmd, env, work))
                    for _ in range(args.cached_runs):
                        runs[label][f"{verb} cached"].append(_run(base + cmd, env, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{os.path.basename(path)}: best wall time (s) of {args.repeat} cold runs and {args.repeat * args.cached_runs} "
          f"cached ones / median peak RSS (MB)")
    print(f"{'':16}" + "".join(f"{label:>22}" for label in layouts))
    table = {}
    for s in steps:
        cells = []
        for label in layouts:
            rs = runs[label][s]
            best = min(r["wall_s"] for r in rs)
            rss = statistics.median(r["rss_mb"] for r in rs)
            table.setdefault(label, {})[s] = {"best_wall_s": best, "median_rss_mb": rss,
                                              "wall_s": [r["wall_s"] for r in rs]}
            cells.append(f"{best:8.2f} s / {rss:6.0f} MB")
        print(f"{s:16}" + "".join(f"{c:>22}" for c in cells))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report_results.json"), "w") as f:
        json.dump({"file": path, "repeat": args.repeat, "trees": dict(trees), "results": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
