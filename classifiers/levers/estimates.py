"""The levers that are estimates, not simulations: they act on one category's bytes per
parameter (an 8-bit or paged optimizer, 4-bit weights) or on the allocator's cache
(expandable segments), so a factor on that category is what they do. Each says it is an
estimate (`"estimate": true`) and uses the budget's facts (bytes per parameter, the dtypes)."""
from __future__ import annotations

from .base import Lever
from .common import evidence_why_not, training_why_not

NF4_BYTES = 0.5 + 4 / 64     # packed 4-bit weight + fp32 absmax per 64
ADAM8BIT_BYTES = 2 + 8 / 256 # two uint8 states + fp32 absmax per 256 values


class Adam8bit(Lever):
    name = "adam8bit"
    title = "8-bit optimizer"
    training = True

    def why_not(self, run, expandable=False):
        why = evidence_why_not(run) or training_why_not(run)
        if why is None and run is not None and isinstance(run.optimizer.value, str) \
                and "8-bit" in run.optimizer.value:
            return f"the optimizer is already 8-bit ({run.optimizer.value})"
        return why

    def factors(self, facts):
        bpp = facts.optimizer_bytes_per_param if facts is not None else None
        if bpp:
            f = min(1.0, ADAM8BIT_BYTES / bpp)
            why = f"{ADAM8BIT_BYTES:.2f} B per trainable parameter instead of the {bpp:.2f} B measured"
        else:
            f = 0.25
            why = f"{ADAM8BIT_BYTES:.2f} B per trainable parameter instead of AdamW's 8 B (fp32 moments)"
        return ({"optimizer": round(f, 6)}, False,
                f"estimate: an 8-bit optimizer (bitsandbytes AdamW8bit) keeps both moments in uint8 with an fp32 "
                f"absmax per 256 values: {why}, so optimizer state x {f:.3g}")


class PagedOptimizer(Lever):
    name = "paged_optimizer"
    title = "paged optimizer"
    training = True

    def why_not(self, run, expandable=False):
        return evidence_why_not(run) or training_why_not(run)

    def factors(self, facts):
        return ({"optimizer": 0.0}, False,
                "estimate: a paged optimizer (bitsandbytes PagedAdamW/PagedAdamW8bit) keeps its state in CUDA "
                "unified memory, outside the caching allocator, which the driver moves to host RAM under memory "
                "pressure: counted as 0 on the GPU at the peak (optimistic: steps get slower while paging, and "
                "state of tensors under 100,000 elements stays on the GPU)")


class FourBit(Lever):
    name = "4bit"
    title = "4-bit base weights"

    def why_not(self, run, expandable=False):
        why = evidence_why_not(run)
        if why is not None or run is None:
            return why
        if run.quantized.value:
            return f"the weights are already quantized ({run.quantized.value})"
        if not (run.frozen_weights or run.adapters.value):
            if not run.trains:
                return ("no frozen base seen training in the trace (4-bit weights serve fine-tuning adapters on a "
                        "frozen base; quantizing a model for inference changes its outputs)")
            return ("the trace shows no frozen weights, and weights that train cannot be 4-bit; with adapters "
                    "on a frozen base: whatif --lever 4bit --lever lora")
        return None

    def factors(self, facts):
        b = facts.frozen_dtype_bytes if facts is not None and facts.frozen_weight_bytes else \
            (facts.trainable_dtype_bytes if facts is not None else 4.0)
        src = (facts.dtype_evidence if facts is not None and facts.dtype_evidence else "fp32 assumed")
        f = min(1.0, NF4_BYTES / b)
        return ({"weights": round(f, 6)}, False,
                f"estimate: 4-bit base weights (bitsandbytes NF4, QLoRA): {NF4_BYTES:.4f} B per parameter (0.5 B "
                f"packed + an fp32 absmax per 64) instead of {b:g} B ({src}), so weights x {f:.3g}; applies to the "
                f"whole weights category, so pair it with lora for a full fine-tune (4-bit weights cannot be "
                f"trained); one layer's dequantization scratch is ignored")


class ExpandableSegments(Lever):
    name = "expandable_segments"
    title = "expandable_segments"

    def why_not(self, run, expandable=False):
        return "already on" if expandable else None

    def factors(self, facts):
        return ({}, True,
                "estimate: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True maps memory in small granules and grows "
                "segments instead of caching many fixed ones: the reserved-but-unallocated memory at the peak "
                "(fragmentation) is taken as gone; the allocated peak itself does not change")


__all__ = ["Adam8bit", "PagedOptimizer", "FourBit", "ExpandableSegments", "NF4_BYTES", "ADAM8BIT_BYTES"]
