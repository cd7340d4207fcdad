#!/usr/bin/env python3
"""A real snapshot's trace replayed to N entries: its layout at scale, for the benchmarks.

    python benchmarks/tile_snapshot.py REAL.pickle --events 1e6 -o benchmarks/out/tiled.pickle

The generated snapshots (gen_snapshot.py) mirror torch's layout closely but have one shape: a
loop of 2,000 iterations, a few hundred segments. A real file's shape at scale (its stack depth,
its iterations per entry, its segment events) found three stages that grew faster than the
trace (README, "Twelfth round"). This replays the longest device trace of REAL until it has N
entries: each replay (a tile) at addresses shifted past the last one's and times after it, with
traceback lists of its own (torch makes one per captured traceback) and torch's frame dicts
shared (torch dedups them), written by `pickle.dump` protocol 4 as torch's `_dump_snapshot`.

REAL is read by an unpickler that refuses every global: a snapshot is dicts, lists, strings
and numbers, and a file that names a class is not read (nothing in it runs). Every tile's
segments stay live after it (the next tile's addresses are new), so a file of many tiles holds
far more live segments than a GPU could: the allocator's history is a worst case here.
"""
from __future__ import annotations

import argparse
import io
import os
import pickle
import sys


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a snapshot holds data only")


def tile(snap: dict, events: int) -> dict:
    """`snap` with its longest device trace replayed to `events` entries (in place)."""
    if not isinstance(snap, dict) or not isinstance(snap.get("device_traces"), list):
        raise ValueError("no device_traces (not a snapshot of torch 2.1 or later)")
    traces = snap["device_traces"]
    if not any(traces):
        raise ValueError("no trace to replay (a state-only snapshot)")
    dev = max(range(len(traces)), key=lambda i: len(traces[i]))
    trace = traces[dev]
    # a trace without times (torch before 2.1 wrote none) is replayed without them
    timed = all("time_us" in e for e in trace)
    if not timed and any("time_us" in e for e in trace):
        raise ValueError("some entries without time_us: cannot be replayed later in time")
    # each replay shifted by the trace's address range (not its highest address: 10^5 replays
    # of a range near 0x7f00_0000_0000 passed 2^64)
    addrs = [e.get("addr", 0) for e in trace]
    span = max(a + e.get("size", 0) for a, e in zip(addrs, trace)) - min(addrs) + (1 << 30)
    t_span = trace[-1]["time_us"] - trace[0]["time_us"] + 1000 if timed else 0
    out: list[dict] = []
    k = 0
    while len(out) < events:
        lists: dict[int, list] = {}
        for e in trace:
            e2 = dict(e)
            if "addr" in e:          # (an oom entry has device_free in its place: none added)
                e2["addr"] = e["addr"] + k * span
            if timed:
                e2["time_us"] = e["time_us"] + k * t_span
            frames = e.get("frames")
            if frames is not None:
                e2["frames"] = lists.setdefault(id(frames), list(frames))
            out.append(e2)
            if len(out) >= events:
                break
        k += 1
    traces[dev] = out
    return snap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("real")
    ap.add_argument("--events", type=float, default=1e6)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    with open(args.real, "rb") as f:
        try:
            snap = _DataOnly(io.BufferedReader(f)).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as e:
            print(f"tile_snapshot: {args.real}: not a snapshot ({e})", file=sys.stderr)
            return 3
    try:
        tile(snap, int(args.events))
    except ValueError as e:
        print(f"tile_snapshot: {args.real}: {e}", file=sys.stderr)
        return 3
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
