"""Make assets/example.pickle, the snapshot the README's first command opens.

A small but real CPU training run: a tiny decoder-only transformer LM (plain
torch, 2 blocks) trained for 4 iterations with AdamW, recorded with

    torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                           record_shapes=True, with_stack=True)

and converted with ``torch.cuda._memory_viz._profile_to_snapshot`` (the layout
of torch's own memory snapshots; torch's per-allocation ``category`` is kept,
since this is an unmodified converted snapshot).  The model code comes from
tests/groundtruth/record_runs.py.

Run from the repository root:  python assets/make_example.py
"""

from __future__ import annotations

import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "example.pickle")

ITERATIONS = 4
# A larger batch than the ground-truth runs: activations (the per-iteration
# sawtooth) then clearly dominate the flat parameter + optimizer-state floor,
# without adding events (the number of events, not tensor sizes, sets the file
# size).
BATCH, SEQ = 16, 64


def train_example(model, opt, batch_fn, loss_fn, iters):
    for _ in range(iters):
        x, y = batch_fn()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def main(out: str = OUT) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "tests", "groundtruth"))
    import record_runs as rr  # noqa: E402  (model code shared with the ground truth)
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.cuda._memory_viz import _profile_to_snapshot

    torch.manual_seed(0)
    cfg = dict(rr.LM_CFG)
    model = rr.TinyLM(**cfg)
    # fused=True: one kernel updates all parameters, so the optimizer step is a
    # short stretch of events and the forward/backward sawtooth dominates the
    # event axis (converted snapshots carry no timestamps)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def batch():
        idx = torch.randint(0, cfg["vocab"], (BATCH, SEQ + 1))
        return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 record_shapes=True, with_stack=True) as prof:
        train_example(model, opt, batch, rr.lm_loss, ITERATIONS)
    snapshot = _profile_to_snapshot(prof)

    with open(out, "wb") as f:
        pickle.dump(snapshot, f)  # as torch.cuda.memory._dump_snapshot does

    device = torch.cuda.device_count()
    trace = snapshot["device_traces"][device]
    live = peak = 0
    for e in trace:
        if e["action"] == "alloc":
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            live -= e["size"]
    info = dict(file=out, bytes=os.path.getsize(out), entries=len(trace),
                torch=torch.__version__, peak_relative=peak)
    print(info)
    return info


if __name__ == "__main__":
    main()
