"""What `vramscope.record` adds to a dump: its `dump()` against torch's own `_dump_snapshot`
(`pickle.dump` of the same snapshot dict into a plain file), in the same run.

    python benchmarks/bench_record.py                 # 1e5 and 1e6 events
    python benchmarks/bench_record.py --events 1e6 --repeat 5

torch's `_snapshot()` (reading the allocator's state) is the same call in both and needs a
GPU, so it is left out: a stand-in `torch` returns the generated snapshot's dict (loaded
once with `pickle.load`: our own generated file). What is measured is the rest: pickling
(protocol 4 in both on Python <= 3.13), the metadata document, the atomic write (a
temporary file, fsync, rename). Also: the time vramscope takes to open the file record()
wrote against the generator's file (the metadata key must not push it off the fast path).
"""
from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import types
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _snapshots import ensure_snapshot  # noqa: E402


def fake_torch(snapshot: dict) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "bench"
    torch.version = SimpleNamespace(cuda="bench")
    torch.cuda = SimpleNamespace(
        is_available=lambda: True, current_device=lambda: 0,
        get_device_properties=lambda d: SimpleNamespace(name="bench", total_memory=80 << 30),
        memory=SimpleNamespace(_record_memory_history=lambda *a, **k: None, _snapshot=lambda *a, **k: snapshot))
    torch._C = SimpleNamespace(_cuda_attach_out_of_memory_observer=lambda fn: None)
    torch.distributed = SimpleNamespace(is_available=lambda: False)
    return torch


def open_seconds(path: str) -> float:
    code = ("import sys, time; from vramscope.parsers import open_snapshot; t = time.perf_counter(); "
            "open_snapshot(sys.argv[1], use_cache=False); print(time.perf_counter() - t)")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True)
    return float(r.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=float, nargs="+", default=[1e5, 1e6])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args(argv)
    for n in (int(e) for e in args.events):
        src = ensure_snapshot(args.out, n)
        with open(src, "rb") as fh:
            snapshot = pickle.load(fh)          # our own generated file
        sys.modules["torch"] = fake_torch(snapshot)
        import vramscope
        from vramscope import recorder
        recorder._observer_attached = False
        with tempfile.TemporaryDirectory(dir=args.out) as tmp:
            plain, ours = [], []
            for k in range(args.repeat):
                t = time.perf_counter()
                with open(os.path.join(tmp, "plain.pickle"), "wb") as fh:     # torch's _dump_snapshot
                    pickle.dump(snapshot, fh)
                plain.append(time.perf_counter() - t)
                with vramscope.record(tmp, dump_on_exit=False) as rec:
                    t = time.perf_counter()
                    path = rec.dump(step=k)
                    ours.append(time.perf_counter() - t)
                snapshot.pop("vramscope_metadata", None)
            p, o = statistics.median(plain), statistics.median(ours)
            size_p, size_o = os.path.getsize(os.path.join(tmp, "plain.pickle")), os.path.getsize(path)
            op, oo = open_seconds(src), open_seconds(path)
        print(f"{n:>9,} events  torch's dump {p:.3f} s  record().dump {o:.3f} s  ({o / p:.2f}x)  "
              f"file {size_p / 2**20:.1f} MiB -> {size_o / 2**20:.1f} MiB (+{size_o - size_p:,} B)  "
              f"vramscope opens it in {oo:.2f} s against {op:.2f} s ({oo / op:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
