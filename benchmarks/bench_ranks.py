#!/usr/bin/env python3
"""How long `vramscope ranks DIR` takes on a folder of many ranks: one process, two
processes, a Dask cluster of two workers; cold and cached; against `pickle.load` of the
same files.

    python benchmarks/bench_ranks.py                       # 64 ranks of 10^5 events (generated once)
    python benchmarks/bench_ranks.py --ranks 16 --events 1e5 --repeat 3
    python benchmarks/bench_ranks.py --no-dask

The folder is torchtitan's layout (`memory_snapshot/step_1/{rank:06d}_step_1.pickle`), each
rank a snapshot of gen_snapshot.py with its own seed, kept in benchmarks/out/ between runs.
Every command runs in a fresh process (interpreter start and imports included, as a user
sees it, with .pyc files written as an installed package has them, whatever
PYTHONDONTWRITEBYTECODE says) and prints its JSON document; the documents of every mode
must be identical.

  * pickle.load: one child that imports only `pickle`, `sys` and `time` and loads the files
    one after the other (the naive way to read them; bench_parse.py says why nothing else
    is imported), exiting with `os._exit` (the objects' teardown not counted);
  * `--jobs 1`, `--jobs 2`: `vramscope ranks DIR --json --jobs N`, cold (a new empty cache
    directory) then cached (the same command again);
  * Dask: a `distributed.LocalCluster` of 2 worker processes (1 thread each) started in
    this process, its workers reading the cache directory of the run, and
    `vramscope ranks DIR --json --dask ADDRESS`, cold then cached; the cluster's start is
    not counted (it exists before the command, as a user's cluster does).

The best of `--repeat` runs counts (the machine is shared). Results also go to
benchmarks/out/ranks_results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from _snapshots import HERE, ensure_snapshot

PICKLE_CHILD = r"""
import pickle, sys, time
t0 = time.perf_counter()
for p in sys.argv[1:]:
    with open(p, "rb") as f:
        pickle.load(f)
sys.stdout.write(repr(time.perf_counter() - t0))
sys.stdout.flush()
import os
os._exit(0)
"""


def make_folder(out: str, ranks: int, events: int) -> tuple[str, list[str]]:
    """benchmarks/out/ranks_<R>x<N>/memory_snapshot/step_1/{rank:06d}_step_1.pickle, made once."""
    folder = os.path.join(out, f"ranks_{ranks}x{events}", "memory_snapshot")
    step = os.path.join(folder, "step_1")
    os.makedirs(step, exist_ok=True)
    files = []
    for r in range(ranks):
        path = os.path.join(step, f"{r:06d}_step_1.pickle")
        if not os.path.exists(path):
            src = ensure_snapshot(os.path.join(out, "ranks_sources"), events, seed=1000 + r)
            shutil.move(src, path)
        files.append(path)
    return folder, files


def run(cmd: list[str], env: dict) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode()[-800:]}")
    return wall, p.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--events", type=lambda s: int(float(s)), default=100_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-dask", action="store_true", help="leave the Dask cluster out")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args(argv)
    folder, files = make_folder(args.out, args.ranks, args.events)
    size_mb = sum(os.path.getsize(f) for f in files) / 1e6
    base_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(HERE),
                                                                             os.environ.get("PYTHONPATH")]))}
    # an installed package has its .pyc files: without them every process (each worker too)
    # compiles our sources again, 0.3 s or more of each start
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    vramscope = [sys.executable, "-m", "vramscope", "ranks", folder, "--json"]
    for f in files:                      # into the page cache, for every run alike
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    run([sys.executable, "-m", "vramscope", "--help"], base_env)       # compile the .pyc files once

    results: dict[str, dict] = {}
    docs: dict[str, bytes] = {}

    def record(name: str, wall: float, extra: dict | None = None):
        r = results.setdefault(name, {"runs": []})
        r["runs"].append({"wall_s": wall, **(extra or {})})
        r["wall_s"] = min(x["wall_s"] for x in r["runs"])

    for _ in range(args.repeat):
        wall, out = run([sys.executable, "-c", PICKLE_CHILD, *files], base_env)
        record("pickle.load", wall, {"load_s": float(out)})
        for jobs in (1, 2):
            cache = tempfile.mkdtemp(prefix="vramscope-bench-ranks-")
            env = {**base_env, "VRAMSCOPE_CACHE_DIR": cache}
            try:
                for state in ("cold", "cached"):
                    wall, out = run(vramscope + ["--jobs", str(jobs)], env)
                    record(f"--jobs {jobs} {state}", wall)
                    docs[f"--jobs {jobs} {state}"] = out
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        if not args.no_dask:
            try:
                from distributed import LocalCluster
            except ImportError:
                print("dask.distributed is not installed: the Dask rows are left out", file=sys.stderr)
                args.no_dask = True
                continue
            cache = tempfile.mkdtemp(prefix="vramscope-bench-ranks-")
            old = os.environ.get("VRAMSCOPE_CACHE_DIR")
            os.environ["VRAMSCOPE_CACHE_DIR"] = cache          # the workers are started with it
            try:
                with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
                    env = {**base_env, "VRAMSCOPE_CACHE_DIR": cache}
                    for state in ("cold", "cached"):
                        wall, out = run(vramscope + ["--dask", cl.scheduler_address], env)
                        record(f"dask 2 workers {state}", wall)
                        docs[f"dask 2 workers {state}"] = out
            finally:
                if old is None:
                    os.environ.pop("VRAMSCOPE_CACHE_DIR", None)
                else:
                    os.environ["VRAMSCOPE_CACHE_DIR"] = old
                shutil.rmtree(cache, ignore_errors=True)

    first = next(iter(docs.values()))
    same = all(d == first for d in docs.values())
    base = results["pickle.load"]["wall_s"]
    print(f"{args.ranks} ranks x {args.events:,} events ({size_mb:.0f} MB in all), {os.cpu_count()} CPUs, "
          f"best of {args.repeat}; every mode's JSON identical: {same}")
    print(f"{'':<24} {'wall s':>8} {'x pickle.load':>14}")
    for name, r in results.items():
        extra = f"   (pickle.load alone {r['runs'][0]['load_s']:.2f} s)" if name == "pickle.load" else ""
        print(f"{name:<24} {r['wall_s']:>8.2f} {r['wall_s'] / base:>14.2f}{extra}")
    out_path = os.path.join(args.out, "ranks_results.json")
    with open(out_path, "w") as fh:
        json.dump({"ranks": args.ranks, "events": args.events, "bytes": int(size_mb * 1e6), "cpus": os.cpu_count(),
                   "machine": platform.platform(), "python": platform.python_version(), "identical": same,
                   "when": time.strftime("%Y-%m-%d %H:%M:%S"), "results": results}, fh, indent=1)
    print(f"written {out_path}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
