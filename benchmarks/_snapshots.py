"""The benchmarks' snapshots: benchmarks/out/snap_<events>[_seed<s>].pickle, made by
gen_snapshot.py when absent and reused after (bench_parse.py keeps its own, checked against
the generator's sources)."""
from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def ensure_snapshot(out: str, events: int, seed: int = 0) -> str:
    """The path of the snapshot of `events` entries (seed `seed`) in folder `out`, generated
    if it is not there yet."""
    name = f"snap_{events}.pickle" if seed == 0 else f"snap_{events}_seed{seed}.pickle"
    path = os.path.join(out, name)
    if not os.path.exists(path):
        os.makedirs(out, exist_ok=True)
        print(f"generating {path} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, os.path.join(HERE, "gen_snapshot.py"), "--events", str(events),
                        "--seed", str(seed), "-o", path, "-q"], check=True)
    return path
