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
        ai, fi, role = rw.ai, rw.fi, st.role
        # what each forward pass saved for backward, by allocation: for each block, the last of
        # those made after it and freed before its own backward starts
        kept = np.flatnonzero(np.isin(role, (R_SAVED, R_OUTSIDE_SAVED, R_OUTPUT)) & (fi >= 0))
        kept = kept[np.argsort(ai[kept], kind="stable")]
        ai_kept = ai[kept].astype(np.int64)                 # once: a call looks up its range in it (no pass over every row)
        done = 0
        # every call's range of later kept rows at once (one search for all calls, not two per call)
        calls = st.calls
        lasts = np.array([c.last for c in calls], dtype=np.int64)
        pass_ends = np.array([st.passes[c.forward_pass][1] for c in calls], dtype=np.int64)
        los = np.searchsorted(ai_kept, lasts + 1).tolist()
        his = np.searchsorted(ai_kept, pass_ends + 1).tolist()
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
        b = st.blocks
        if not done:
            return Applied(self.name, False, f"the {b.count} {b.name} blocks found save nothing for a backward in this "
                                             f"trace: no prediction is made")
        return Applied(self.name, True,
                       f"activation checkpointing of the {b.count} {b.name} blocks: each block "
                       f"keeps its input; what it saved for backward is freed when its forward ends and recomputed "
                       f"(its forward replayed, scratch included) right before its own backward; the logits, loss "
                       f"and embeddings outside the blocks are unchanged; about a third more compute")


__all__ = ["Checkpointing"]
