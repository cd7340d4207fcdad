"""Half the micro-batch, simulated on the recorded timeline.

Every tensor that grows with the batch is halved: activations, backward intermediates, inputs,
forward and recompute scratch made in the forward and backward passes (structure.py `batch`);
weights, gradients, optimizer state and its scratch, library workspaces (cuBLAS), autocast's
16-bit weight copies and what was live before the trace stay. In training the effective batch
is kept with twice the gradient accumulation steps; in inference the batch runs in two halves.
"""
from __future__ import annotations

import numpy as np

from .base import Applied, Lever, Measured
from .common import evidence_why_not
from .structural import scale_rows


class HalfBatch(Lever):
    name = "half_batch"
    title = "halve the micro-batch"
    simulated = True
    summary = ("simulated on the recorded timeline: every tensor that grows with the batch is halved, recomputed "
               "ones included; weights, gradients, optimizer state, library workspaces and autocast's weight copies "
               "stay")
    measured = (
        Measured("bert_dropout, CPU dev", "transformer/fp32/full", -9.105e-06, -1.15e-05, 0, 2),
        Measured("bert_dropout, H100 dev", "transformer/fp32/full", -0.001889, -0.003773, 0, 2),
        Measured("cnn_bn, CPU dev", "cnn/fp32/full", -4.318e-05, -5.694e-05, 0, 2),
        Measured("ft_batch2x (tests)", "transformer/fp32/lora", -0.001178, -0.001178, 0, 1),
        Measured("gpt2_bf16, CPU dev", "transformer/autocast/full", -7.776e-05, -9.845e-05, 0, 2),
        Measured("gpt2_bf16, H100 dev", "transformer/autocast/full", -0.004387, -0.004649, 0, 2),
        Measured("llama_tied, CPU dev", "transformer/fp32/full", -0.0003253, -0.0004116, 0, 2),
        Measured("llama_tied, H100 dev", "transformer/fp32/full", -0.000137, -0.0001533, 0, 2),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/full", -0.002021, -0.008327, 0, 24),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/lora", -0.002197, -0.007008, 0, 24),
        Measured("vit_sgd, CPU dev", "transformer/fp32/full", -1.226e-07, -1.555e-07, 0, 2),
        Measured("vit_sgd, H100 dev", "transformer/fp32/full", -0.00189, -0.004893, 0.001112, 2),
    )

    def why_not(self, run, expandable=False):
        why = evidence_why_not(run)
        if why is not None or run is None:
            return why
        if not run.forward_seen:
            return "no forward pass in the trace: nothing that grows with the batch can be told"
        return None

    def apply(self, rw, ctx) -> Applied:
        from ..common_words import library_scratch_words
        why = library_scratch_words(ctx.da)
        if why:
            return Applied(self.name, False, why)
        if not np.any(rw.batch):
            return Applied(self.name, False, "nothing in the trace grows with the batch (no activations, backward "
                                             "intermediates or inputs made in a forward or backward): no "
                                             "prediction is made")
        scale_rows(rw, rw.batch, 0.5)
        trains = ctx.run is not None and ctx.run.trains
        return Applied(self.name, True,
                       ("half the micro-batch (keep the effective batch with 2x gradient accumulation)" if trains else
                        "the batch run in two halves") +
                       ": every tensor that grows with the batch is halved: activations, backward intermediates, "
                       "inputs, forward and recompute scratch made in the forward and backward passes; weights, "
                       "gradients, optimizer state and its scratch, library workspaces (cuBLAS), 16-bit weight "
                       "copies (autocast) and what was live before the trace stay")


__all__ = ["HalfBatch"]
