"""Cold `summary` (and optionally the viewer) end to end against gc-off `pickle.load`, several
checkouts, interleaved: on a machine whose speed drifts (a VM: pickle.load of the 10^7-event
file took 11 s and 21 s within minutes), a ratio is only worth its two numbers taken together.

    python benchmarks/bench_e2e.py FILE [--reps 5] [--viewer] [--before DIR ...]

Each repetition runs pickle.load, then each checkout's `vramscope summary FILE --json` with an
empty cache, each in a fresh process started in that checkout (so it imports its own code); the
best and the median of each, their ratios, the best CPU time (user + system: what the VM's
stolen time does not inflate) and the peak RSS are printed.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_parse import PICKLE_CHILD, checkouts_cli, run_measured, run_verb  # noqa: E402


def main(argv=None) -> int:
    args, path, trees, verbs = checkouts_cli(__doc__.splitlines()[0], argv)
    loads: list = []
    res: dict = {(t, v): [] for t in trees for v, _ in verbs}
    for _ in range(args.reps):
        r = run_measured([sys.executable, "-c", PICKLE_CHILD, path, "nogc"])
        loads.append((r["wall_s"], r["rss_mb"], r["user_s"] + r["sys_s"]))
        for t in trees:
            for v, cmd in verbs:
                with tempfile.TemporaryDirectory() as cache:
                    res[(t, v)].append(run_verb(t, v, cmd, cache))
    lw = [w for w, _, _ in loads]
    lr = max(r for _, r, _ in loads)
    lc = min(c for _, _, c in loads)
    print(f"{os.path.basename(path)}: pickle.load (gc off) best {min(lw):.2f} s, median {statistics.median(lw):.2f} s, "
          f"CPU best {lc:.2f} s, RSS {lr:.0f} MB; all {[round(x, 2) for x in lw]}")
    for (t, v), xs in res.items():
        w = [x for x, _, _ in xs]
        rss = max(r for _, r, _ in xs)
        cpu = min(c for _, _, c in xs)
        print(f"  {v:8s} {os.path.relpath(t, ROOT) if t != ROOT else 'this':>24s}: best {min(w):.2f} s "
              f"({min(w) / min(lw):.2f}x best load), median {statistics.median(w):.2f} s "
              f"({statistics.median(w) / statistics.median(lw):.2f}x median load), CPU best {cpu:.2f} s ({cpu / lc:.2f}x), "
              f"RSS {rss:.0f} MB ({rss / lr:.3f}x); "
              f"all {[round(x, 2) for x in w]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
