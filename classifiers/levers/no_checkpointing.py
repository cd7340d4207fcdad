"""No gradient checkpointing (for a checkpointed run), simulated on the recorded timeline.

Each tensor recomputed during backward is matched (by order and size) to the one its forward
made, which is then kept until the recomputed one's free; the recompute and its scratch go.
"""
from __future__ import annotations

import difflib

from ..structure import R_RECOMPUTE_SAVED, R_RECOMPUTE_SCRATCH
from .base import Applied, Lever, Measured
from .common import evidence_why_not
from .structural import frozen_base, trains_before_blocks, without_checkpoint


class NoCheckpointing(Lever):
    name = "no_checkpointing"
    title = "no gradient checkpointing"
    simulated = True
    summary = ("simulated on the recorded timeline: each recomputed tensor is kept from the forward that made it "
               "instead")
    measured = (
        Measured("bert_dropout, CPU dev", "transformer/fp32/full", -6.455e-06, -6.455e-06, 0, 1),
        Measured("checkpointing (tests)", "transformer/fp32/full", 0, 0, 0, 1),
        Measured("cnn_bn, CPU dev", "cnn/fp32/full", -4.645e-05, -4.645e-05, 0, 1),
        Measured("cuda_ckpt (H100)", "transformer/autocast/lora", 0.001417, 0, 0.001417, 1),
        Measured("ft_checkpointing (tests)", "transformer/fp32/lora", 0, 0, 0, 1),
        Measured("gpt2_bf16, CPU dev", "transformer/autocast/full", -0.006612, -0.006612, 0, 1),
        Measured("llama_tied, CPU dev", "transformer/fp32/full", 1.494e-05, 0, 1.494e-05, 1),
        Measured("llama_tied, H100 dev", "transformer/fp32/full", 7.548e-06, 0, 7.548e-06, 1),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/full", 0, 0, 0, 16),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/lora", 0, 0, 0, 16),
        Measured("vit_sgd, CPU dev", "transformer/fp32/full", 0, 0, 0, 1),
        Measured("vit_sgd, H100 dev", "transformer/fp32/full", 0.003472, 0, 0.003472, 1),
    )

    def why_not(self, run, expandable=False):
        why = evidence_why_not(run)
        if why is not None or run is None:
            return why
        if not run.checkpointing.value:
            return "the run is not checkpointed"
        return None

    def apply(self, rw, ctx) -> Applied:
        st = ctx.structure
        if st.blocks is None or not st.checkpointed:
            return Applied(self.name, False, "the recompute windows of the checkpointed blocks were not found in the "
                                             "stacks (torch.utils.checkpoint frames around a repeated block): no "
                                             "prediction is made")
        role, size = st.role, rw.size
        by = {(c.forward_pass, c.block): c for c in st.calls}
        done = 0
        for w in st.recomputes:
            c = by.get((w.forward_pass, w.block))
            q = w.rows
            rw.keep[q[role[q] == R_RECOMPUTE_SCRATCH]] = False
            if c is None:
                continue
            sm = difflib.SequenceMatcher(None, size[c.rows].tolist(), size[q].tolist(), autojunk=False)
            for blk in sm.get_matching_blocks():
                for t in range(blk.size):
                    f, x = int(c.rows[blk.a + t]), int(q[blk.b + t])
                    if role[x] == R_RECOMPUTE_SAVED:
                        if rw.fk[x] < 0 or (rw.fk[f] >= 0 and rw.fk[f] < rw.fk[x]):
                            rw.fk[f] = rw.fk[x]
                        rw.keep[x] = False
            done += 1
        # the checkpoint kept the first block's input for its recompute; without it, nothing keeps
        # it when nothing before the first block trains (frozen embeddings: LoRA)
        frozen = not trains_before_blocks(rw.da, st)
        if frozen:
            frozen_base(rw, without_checkpoint(st), tail=False)
        b = st.blocks
        if not done:
            return Applied(self.name, False, "no recompute of a block was matched to its forward: no prediction is made")
        return Applied(self.name, True,
                       f"no activation checkpointing of the {b.count} {b.name} blocks: each tensor "
                       f"recomputed during backward is matched (by order and size) to the one its forward made, which "
                       f"is kept until the recomputed one was freed; the recompute and its scratch go"
                       + ("; the first block's input, which only the checkpoint kept (nothing before the blocks "
                          "trains), goes when the first block's forward ends" if frozen else "")
                       + "; about a quarter less compute")


__all__ = ["NoCheckpointing"]
