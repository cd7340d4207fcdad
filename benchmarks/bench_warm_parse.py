"""The analysis and the window alone, cold, with the parse cached: `summary --json` (and with
--viewer `view --screenshot`) of FILE, several checkouts, interleaved.

    python benchmarks/bench_warm_parse.py FILE [--reps 5] [--viewer] [--before DIR ...]

End to end, a 10^7 open on this VM varied by a quarter from one run to the next (6.0-8.1 s), most
of it in the parse and in page faults, which `pickle.load` pays too. Here each checkout parses the
file once into a cache folder of its own (untimed). Before each run the analysis' entries are
emptied from it, leaving the parse's columns, so a change to the analysis or the window shows
within a few percent: the cache's arrays written after the structure measured 2.86 -> 2.69 s
(`summary`) and 4.07 -> 3.94 s (viewer), medians of 6, where end to end it was lost in the spread.
Prints the best and median wall time, the best CPU time (user + system, helpers included) and the
highest RSS of each checkout's runs.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_parse import checkouts_cli, run_verb  # noqa: E402

SMALL = 1 << 20        # the entry's small files (manifest, source record) are restored byte for byte


def _files(folder: str) -> dict[str, bytes | None]:
    """Every file under `folder`: its bytes where small, else None (kept as it is)."""
    out: dict[str, bytes | None] = {}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            p = os.path.join(root, name)
            with open(p, "rb") as fh:
                out[p] = fh.read() if os.path.getsize(p) < SMALL else None
    return out


def _back_to(folder: str, parsed: dict[str, bytes | None]) -> None:
    """The cache folder as the parse left it: what the analysis added removed, small files restored."""
    for root, _dirs, names in os.walk(folder):
        for name in names:
            p = os.path.join(root, name)
            if p not in parsed:
                os.unlink(p)
            elif parsed[p] is not None:
                with open(p, "wb") as fh:
                    fh.write(parsed[p])  # type: ignore[arg-type]


def main(argv=None) -> int:
    args, path, trees, verbs = checkouts_cli(__doc__.splitlines()[0], argv)
    caches: dict[str, tuple[str, dict]] = {}
    try:
        for t in trees:
            c = tempfile.mkdtemp(prefix="vramscope-warm-")
            env = dict(os.environ, VRAMSCOPE_CACHE_DIR=c)
            if t != ROOT:
                env["PYTHONPATH"] = t
            subprocess.run([sys.executable, "-c", "import sys; from vramscope.parsers import open_snapshot; "
                            "open_snapshot(sys.argv[1])", path], env=env, cwd=t, check=True)
            caches[t] = (c, _files(c))
        res: dict = {(t, v): [] for t in trees for v, _ in verbs}
        for _ in range(args.reps):
            for t in trees:
                c, parsed = caches[t]
                for v, cmd in verbs:
                    _back_to(c, parsed)
                    res[(t, v)].append(run_verb(t, v, cmd, c))
    finally:
        for c, _ in caches.values():
            shutil.rmtree(c, ignore_errors=True)
    print(f"{os.path.basename(path)}: the parse cached, each run's analysis cold")
    for v, _ in verbs:
        for t in trees:
            runs = res[(t, v)]
            walls = [w for w, _, _ in runs]
            name = "this" if t == ROOT else os.path.relpath(t)
            print(f"  {v:8s} {name:>28s}: best {min(walls):.2f} s, median {statistics.median(walls):.2f} s, "
                  f"CPU best {min(c for _, _, c in runs):.2f} s, RSS {max(r for _, r, _ in runs):.0f} MB; "
                  f"all {[round(w, 2) for w in walls]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
