"""Per-rank snapshots of one simulated data-parallel job, in torch's exact layout, for the
`ranks` tests: written by the fixture generator's allocator simulator
(tests/data/make_fixtures.py: `Snap`, `Dev`), never committed.

Each rank trains the same small model for four iterations on its own GPU (cuda:rank on
an 8-GPU node: `device_traces` has 8 lists, only the rank's own is not empty), starting
within a millisecond of the others. A rank can hold more activations than the others
(`act_scale`) or run out of memory in a given iteration (`oom_iteration`: its micro-batch
there is larger and the device's capacity is the others' reserved peak).
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import make_fixtures as mf  # noqa: E402

sys.path.remove(str(DATA))

MiB = 1 << 20
T0 = 1_730_000_000_000_000          # µs since the epoch
GPUS = 8
TR = "/workspace/torchtitan/train.py"
MD = "/workspace/torchtitan/models/llama/model.py"
SP = "/usr/lib/python3.11/site-packages/"
ENTRY_US = 4_000                    # a step of about 0.5 s spread over its ~120 entries
PAUSE_US = 20_000                   # between steps


class _Clock(mf.Snap):
    """The generator's snapshot with entries `ENTRY_US` apart (its default: 37 µs), so the
    ranks' live memory fills their time as a real step's does."""

    def tick(self, dt=37):
        return super().tick(ENTRY_US if dt == 37 else dt)


def rank_object(rank: int, act_scale: float = 1.0, oom_iteration: int | None = None, capacity: int | None = None,
                metadata: dict | None = None, iterations: int = 4):
    """A snapshot object as `torch.cuda.memory._snapshot()` returns it (see the module
    docstring); `metadata` goes under the top-level key `vramscope_metadata`."""
    sn = _Clock((2, 6), t0=T0 + 150 * rank, context="all")
    d = sn.device(rank % GPUS, base=0x7F00_0000_0000 + rank * 0x100_0000_0000, capacity=capacity)
    M = mf.module_call(SP)
    main = [(TR, 310, "train"), (TR, 402, "<module>")]
    step = [(TR, 255, "train_step")] + main
    d.recording = False
    params = [d.alloc(n, (), "weights") for n in (64 * MiB, 32 * MiB, 32 * MiB, 16 * MiB)]
    d.start_recording()
    state: list[int] = []
    try:
        for it in range(iterations):
            scale = act_scale * (1.75 if it == oom_iteration else 1.0)
            x = d.alloc(2 * MiB, mf.call((TR, 240, "next_batch"), main), "inputs")
            acts = []
            for layer in range(6):
                blk = [(MD, 120, "forward"), M, (MD, 200, "forward"), M] + step
                acts.append(d.alloc(int(24 * MiB * scale), mf.call((SP + "torch/nn/functional.py", 2380, "silu"), blk),
                                    "activations"))
            logits = d.alloc(int(40 * MiB * scale), mf.call((MD, 210, "forward"), M, step), "activations")
            sn.annotate("backward", "START", device=rank % GPUS)
            g = d.alloc(int(40 * MiB * scale), (), "autograd")
            d.free(logits, ())
            grads = [d.alloc(n, (), "gradients") for n in (64 * MiB, 32 * MiB, 32 * MiB, 16 * MiB)]
            for a in reversed(acts):
                d.free(a, ())
            d.free(g, ())
            sn.annotate("backward", "END", device=rank % GPUS)
            opt = [(SP + "torch/optim/adamw.py", 183, "_init_group"), (SP + "torch/optim/adamw.py", 209, "step"),
                   (TR, 270, "train_step")] + main
            if not state:
                state = [d.alloc(n, opt, "optimizer") for n in (64 * MiB, 32 * MiB, 32 * MiB, 16 * MiB) * 2]
            for gr in grads:
                d.free(gr, mf.call((SP + "torch/optim/optimizer.py", 975, "zero_grad"), step))
            d.free(x, mf.call((TR, 241, "train_step"), main))
            sn.tick(PAUSE_US)
    except mf.OutOfMemory:
        pass                                   # the run died here; the dump is taken now
    obj = sn.build(GPUS)
    if metadata is not None:
        obj["vramscope_metadata"] = metadata
    del params
    return obj


def normal_reserved_peak() -> int:
    """The reserved peak of a rank that does not run out (the OOM rank's capacity)."""
    obj = rank_object(0)
    return sum(s["total_size"] for s in obj["segments"])


def write(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=4))     # as torch.cuda.memory._dump_snapshot
    return path


def torchtitan_folder(root: Path, ranks: int = 8, heavy: int = 5, oom: int = 3, step: int = 4,
                      second_oom: int | None = None) -> Path:
    """`memory_snapshot/step_{N}/{rank:06d}_step_{N}.pickle` for every rank, the OOM rank's
    dump in `step_{N}_exit/{rank:06d}_step_{N}_exit.pickle` (torchtitan's layout), plus an
    earlier regular step of ranks 0 and `oom` (to be skipped)."""
    folder = root / "memory_snapshot"
    cap = normal_reserved_peak()
    for r in range(ranks):
        if r in (oom, second_oom):
            obj = rank_object(r, oom_iteration=2 if r == oom else 3, capacity=cap)
            write(folder / f"step_{step}_exit" / f"{r:06d}_step_{step}_exit.pickle", obj)
        else:
            write(folder / f"step_{step}" / f"{r:06d}_step_{step}.pickle",
                  rank_object(r, act_scale=2.0 if r == heavy else 1.0))
    for r in (0, oom):
        write(folder / f"step_{step - 2}" / f"{r:06d}_step_{step - 2}.pickle", rank_object(r, iterations=2))
    return folder


def oom_time_us(obj) -> int:
    return next(e["time_us"] for t in obj["device_traces"] for e in t if e["action"] == "oom")


__all__ = ["rank_object", "torchtitan_folder", "write", "normal_reserved_peak", "oom_time_us"]
