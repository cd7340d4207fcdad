"""Gradient (activation) checkpointing, simulated on the recorded timeline.

Each block keeps its input; what it saved for backward is freed when its forward ends and
recomputed (its forward replayed, scratch included) right before its own backward starts:
after the last activation saved later in the forward has been freed. The logits, loss and
embeddings outside the blocks are unchanged. Needs a backward in the trace (what it trades is
what the backward reads) and the model's repeated blocks in the stacks.
"""
from __future__ import annotations

import numpy as np

from ..structure import R_OUTPUT, R_OUTSIDE_SAVED, R_SAVED, R_SCRATCH
from .base import Applied, Lever, Measured
from .common import evidence_why_not

NO_BLOCKS = ("no repeated blocks (layers) found in the stacks, so there is nothing to name for "
             "torch.utils.checkpoint and no prediction is made; it would work on a trace with Python frames "
             "(stacks='python' or 'all') of a model that calls its layers from one place (a loop over an "
             "nn.ModuleList or an nn.Sequential)")


class Checkpointing(Lever):
    name = "checkpointing"
    title = "gradient checkpointing"
    simulated = True
    summary = ("simulated on the recorded timeline: each block keeps its input; what it saved for backward is freed "
               "when its forward ends and recomputed right before its own backward")
    measured = (
        Measured("bert_dropout, CPU dev", "transformer/fp32/full", 0.0192, 0, 0.0192, 1),
        Measured("cnn_bn, CPU dev", "cnn/fp32/full", 0.04373, 0, 0.04373, 1),
        Measured("cuda_lora (H100)", "transformer/autocast/lora", -9.363e-06, -9.363e-06, 0, 1),
        Measured("ft_base (tests)", "transformer/fp32/lora", -1.652e-06, -1.652e-06, 0, 1),
        Measured("gpt2_bf16, CPU dev", "transformer/autocast/full", 0.02856, 0, 0.02856, 1),
        Measured("llama_tied, CPU dev", "transformer/fp32/full", -3.607e-05, -3.607e-05, 0, 1),
        Measured("llama_tied, H100 dev", "transformer/fp32/full", -1.072e-05, -1.072e-05, 0, 1),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/full", -8.271e-08, -8.569e-07, 0, 16),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/lora", -1.136e-05, -2.388e-05, 0, 16),
        Measured("transformer_adamw (tests)", "transformer/fp32/full", 0, 0, 0, 1),
        Measured("vit_sgd, CPU dev", "transformer/fp32/full", 0, 0, 0, 1),
        Measured("vit_sgd, H100 dev", "transformer/fp32/full", -0.01002, -0.01002, 0, 1),
    )

    def why_not(self, run, expandable=False):
        why = evidence_why_not(run)
        if why is not None or run is None:
            return why
        if run.checkpointing.value:
            return "activation checkpointing is already on (torch.utils.checkpoint's frames are in the trace)"
        if not run.backward.value:
            return ("no backward in the trace: checkpointing trades the activations a backward reads for "
                    "recomputing them, and nothing here reads them")
        return None

    def apply(self, rw, ctx) -> Applied:
        st = ctx.structure
        if st.blocks is None:
            return Applied(self.name, False, NO_BLOCKS)
        if st.checkpointed:
            return Applied(self.name, False, f"the {st.blocks.name} blocks are checkpointed already")
        kept = _kept(rw, st)
        done = _rewrite_at_once(rw, st, *kept)
        if done is None:                    # rows shared between calls: one call at a time
            done = _rewrite_call_by_call(rw, st, *kept)
        b = st.blocks
        if not done:
            return Applied(self.name, False, f"the {b.count} {b.name} blocks found save nothing for a backward in this "
                                             f"trace: no prediction is made")
        return Applied(self.name, True,
                       f"activation checkpointing of the {b.count} {b.name} blocks: each block "
                       f"keeps its input; what it saved for backward is freed when its forward ends and recomputed "
                       f"(its forward replayed, scratch included) right before its own backward; the logits, loss "
                       f"and embeddings outside the blocks are unchanged; about a third more compute")


def _kept(rw, st):
    """What each forward pass saved for backward (rows sorted by allocation), and for every
    call the range of those made after it in its pass: (kept rows, their allocation entries,
    each call's first and past-the-last index into them)."""
    ai, fi, role = rw.ai, rw.fi, st.role
    kept = np.flatnonzero(np.isin(role, (R_SAVED, R_OUTSIDE_SAVED, R_OUTPUT)) & (fi >= 0))
    kept = kept[np.argsort(ai[kept], kind="stable")]
    ai_kept = ai[kept].astype(np.int64)
    calls = st.calls
    lasts = np.array([c.last for c in calls], dtype=np.int64)
    pass_ends = st.passes[np.array([c.forward_pass for c in calls], dtype=np.int64), 1]
    los = np.searchsorted(ai_kept, lasts + 1)
    his = np.searchsorted(ai_kept, pass_ends + 1)
    return kept, los, his


def _rewrite_call_by_call(rw, st, kept, los, his) -> int:
    """The rewrite, one call at a time (the reference `_rewrite_at_once` must equal)."""
    ai, fi, role = rw.ai, rw.fi, st.role
    los, his = los.tolist(), his.tolist()
    done = 0
    calls = st.calls
    inputs = np.asarray(st.inputs).tolist()
    for j, c in enumerate(calls):
        r = c.rows
        rr = role[r]
        is_saved = rr == R_SAVED
        saved = r[is_saved]
        if not len(saved):
            continue
        fs = fi[saved]
        freed = fs >= 0
        if not freed.any():
            # a forward cut short by an out-of-memory error: no backward to recompute for; what
            # the block saved goes when its forward ends, its input stays (a lower bound)
            rw.fk[saved] = rw.after(c.last, len(saved))
            done += 1
            continue
        if not freed.all():
            saved, fs = saved[freed], fs[freed]
        first_free = int(fs.min())
        later = fi[kept[los[j]:his[j]]]
        later = later[later < first_free]
        base = int(later.max()) if len(later) else first_free - 1
        # replay the window up to its last saved tensor (torch stops the recompute there):
        # its allocations and its scratch's frees, in their order, right after `base`
        is_scratch = rr == R_SCRATCH
        ar = ai[r]
        in_replay = (is_saved | is_scratch) & (ar <= int(ai[saved].max()))
        replay = r[in_replay]
        scratch_of_replay = is_scratch[in_replay]
        ev_key = np.concatenate([ar[in_replay], fi[replay[scratch_of_replay]]])
        new_key = np.empty(len(ev_key), dtype=np.int64)
        new_key[np.argsort(ev_key, kind="stable")] = rw.after(base, len(ev_key))
        free_key = rw.fk[replay]            # (a copy: fancy indexing)
        free_key[scratch_of_replay] = new_key[len(replay):]
        rw.add(new_key[:len(replay)], free_key, replay)
        # forward: what the block saved goes when its forward ends
        rw.fk[saved] = rw.after(c.last, len(saved))
        # its input stays until its backward has run
        inp = inputs[j]
        end = int(fs.max())
        if inp >= 0 and rw.fk[inp] >= 0 and (rw.fk[inp] >> rw.shift) < end:
            rw.fk[inp] = rw.after(end, 1)[0]
        done += 1
    return done


def _rewrite_at_once(rw, st, kept, los, his) -> int | None:
    """`_rewrite_call_by_call` with the numpy work done for all calls together: only the event
    keys are handed out call by call, in the same order, so every key is the same. None where
    the calls' edits could depend on each other (a row in two calls; an input that is some
    call's saved or replayed row, or the input of two calls): there it is done call by call."""
    calls = st.calls
    m = len(calls)
    if not m:
        return 0
    ai, fi, role = rw.ai, rw.fi, st.role
    shift = rw.shift
    counts = np.fromiter((len(c.rows) for c in calls), dtype=np.int64, count=m)
    if not counts.sum():
        return 0
    rows = np.concatenate([np.asarray(c.rows, dtype=np.int64) for c in calls])
    call = np.repeat(np.arange(m, dtype=np.int64), counts)
    if not (np.asarray(st.call_of)[rows] == call).all():      # each row made by its one call
        return None
    rr = role[rows]
    is_saved = rr == R_SAVED
    is_scratch = rr == R_SCRATCH
    f_r = fi[rows].astype(np.int64)
    a_r = ai[rows].astype(np.int64)
    n_saved = np.bincount(call[is_saved], minlength=m)
    freed_saved = is_saved & (f_r >= 0)
    full = np.bincount(call[freed_saved], minlength=m) > 0   # saved something a backward freed
    cut = (n_saved > 0) & ~full                              # a forward an OOM cut short
    big = np.iinfo(np.int64).max
    starts = np.zeros(m, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    nz = counts > 0
    first_free = np.full(m, big, dtype=np.int64)
    end = np.full(m, -1, dtype=np.int64)
    top_ai = np.full(m, -1, dtype=np.int64)
    first_free[nz] = np.minimum.reduceat(np.where(freed_saved, f_r, big), starts[nz])
    end[nz] = np.maximum.reduceat(np.where(freed_saved, f_r, -1), starts[nz])
    top_ai[nz] = np.maximum.reduceat(np.where(freed_saved, a_r, -1), starts[nz])
    # the rows each call re-keys: what it saved (freed by a backward; all of it where none was)
    rekey = (freed_saved & full[call]) | (is_saved & cut[call])
    s_rows, s_call = rows[rekey], call[rekey]
    n_rekey = np.bincount(s_call, minlength=m)
    # the replayed window: saved and scratch rows up to the last saved one
    in_replay = (is_saved | is_scratch) & full[call] & (a_r <= top_ai[call])
    replay, r_call, r_scratch = rows[in_replay], call[in_replay], is_scratch[in_replay]
    n_replay = np.bincount(r_call, minlength=m)
    n_events = n_replay + np.bincount(r_call[r_scratch], minlength=m)
    inputs = np.asarray(st.inputs, dtype=np.int64)
    active = n_saved > 0
    inp = inputs[active & full]
    inp = inp[inp >= 0]
    if len(inp):
        mark = np.zeros(len(ai), dtype=bool)
        mark[s_rows] = True
        mark[replay] = True
        if mark[inp].any() or len(np.unique(inp)) != len(inp):
            return None
    # where each call's replay goes: after the last thing saved later in its pass that is freed
    # before its own first saved tensor is (for all calls at once: their ranges are short)
    fk = rw.fk
    fi_kept = fi[kept].astype(np.int64)
    fc = np.flatnonzero(active & full)
    lens = (his - los)[fc]
    q_first = np.zeros(len(fc), dtype=np.int64)
    np.cumsum(lens[:-1], out=q_first[1:])
    q = np.repeat(np.arange(len(fc), dtype=np.int64), lens)
    vals = fi_kept[np.repeat(los[fc] - q_first, lens) + np.arange(int(lens.sum()), dtype=np.int64)]
    below = np.where(vals < first_free[fc][q], vals, -1)         # free indices are >= 0
    best = np.full(len(fc), -1, dtype=np.int64)
    some = lens > 0
    best[some] = np.maximum.reduceat(below, q_first[some])
    base = np.zeros(m, dtype=np.int64)
    base[fc] = np.where(best >= 0, best, first_free[fc] - 1)
    # each input stays until its call's backward has run, where it would go before
    ext = np.zeros(m, dtype=bool)
    fk_inp = np.where(inputs >= 0, fk[np.maximum(inputs, 0)], -1)
    ext[fc] = (inputs[fc] >= 0) & (fk_inp[fc] >= 0) & ((fk_inp[fc] >> shift) < end[fc])
    # the event keys, handed out in the calls' order, three requests a call at most (its replay,
    # its saved tensors, its input), as Rewrite.after would one call at a time
    lasts = np.fromiter((c.last for c in calls), dtype=np.int64, count=m)
    req_entry = np.stack([base, lasts, end], axis=1)
    req_n = np.stack([n_events, n_rekey, np.ones(m, dtype=np.int64)], axis=1)
    req_on = np.stack([active & full, active, ext], axis=1)
    k = np.full((m, 3), -1, dtype=np.int64)
    k[req_on] = rw.reserve_many(req_entry[req_on], req_n[req_on])
    k_base, k_last, k_end = k[:, 0], k[:, 1], k[:, 2]
    # the replayed events of each call, in its order: its allocations, then its scratch's frees,
    # sorted (stably) by the recorded entry they happened at, keyed one after another after `base`
    ev_call = np.concatenate([r_call, r_call[r_scratch]])
    ev_at = np.concatenate([a_r[in_replay], f_r[in_replay][r_scratch]])
    order = np.argsort((ev_call << 32) + (ev_at + 1), kind="stable")
    first_ev = np.zeros(m, dtype=np.int64)
    np.cumsum(n_events[:-1], out=first_ev[1:])
    sc = ev_call[order]
    new_key = np.empty(len(order), dtype=np.int64)
    new_key[order] = (base[sc] << shift) + k_base[sc] + (np.arange(len(order), dtype=np.int64) - first_ev[sc])
    free_key = fk[replay]
    free_key[r_scratch] = new_key[len(replay):]
    rw.add(new_key[:len(replay)], free_key, replay)
    # forward: what each block saved goes when its forward ends
    first_s = np.zeros(m, dtype=np.int64)
    np.cumsum(n_rekey[:-1], out=first_s[1:])
    fk[s_rows] = (lasts[s_call] << shift) + k_last[s_call] + (np.arange(len(s_rows), dtype=np.int64) - first_s[s_call])
    # its input stays until its backward has run
    ext = k_end >= 0
    fk[inputs[ext]] = (end[ext] << shift) + k_end[ext]
    return int(active.sum())

__all__ = ["Checkpointing"]
