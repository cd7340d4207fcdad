"""The named levers (DESIGN.md §8), with the assumption behind each stated in words.

Two kinds. The levers that change the run's structure (SIMULATED: checkpointing,
no_checkpointing, half_batch, lora) are simulated on the recorded timeline by
simulate.py, which is what what-if (whatif.py) reports; each carries the error band the
validation harness (benchmarks/whatif_accuracy.py) measured against runs recorded with the
lever pulled. The others act on one category's bytes per parameter (adam8bit,
paged_optimizer, 4bit) or on the allocator (expandable_segments) and are factors here.
Every lever also has factors (`lever(name).scales`): OOM and peak advice (ooms.py) ranks
levers by what they would save at one moment, which a global factor estimates. Some use
the budget's facts (bytes per parameter, the trainable share); without facts they assume
full fine-tuning in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass


class LeverError(ValueError):
    """An unknown lever name (one-line message)."""


@dataclass(frozen=True)
class ErrorBand:
    """How far the lever's predicted peak was from the peak of runs recorded with the lever
    pulled (benchmarks/whatif_accuracy.py): relative errors, absolute values."""
    mean: float
    worst: float
    cases: int
    measured_on: str        # which runs

    def to_json(self) -> dict:
        return {"mean": self.mean, "worst": self.worst, "cases": self.cases, "measured_on": self.measured_on}


@dataclass(frozen=True)
class Lever:
    name: str
    title: str
    scales: dict            # {category: factor} (a simulated lever in what-if: {}, the simulation decides)
    removes_overhead: bool  # drops the allocator's reserved-but-unallocated memory in `fits`
    assumption: str         # what it rests on, in words
    simulated: bool = False             # simulated on the recorded timeline (simulate.py), not factors
    error_band: ErrorBand | None = None  # measured against recorded runs; None: not measured

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "simulated": self.simulated, "scales": dict(self.scales),
                "removes_overhead": self.removes_overhead, "assumption": self.assumption,
                "error_band": self.error_band.to_json() if self.error_band is not None else None}


CHECKPOINT_FACTOR = 0.15     # (2L + 34) / (34L) for L = 12..32 layers, rounded up (see below)
LORA_TRAINABLE = 0.01        # LoRA's typical trainable share of the parameters
NF4_BYTES = 0.5 + 4 / 64     # packed 4-bit weight + fp32 absmax per 64
ADAM8BIT_BYTES = 2 + 8 / 256 # two uint8 states + fp32 absmax per 256 values


def _lever_half_batch(facts):
    return ({"activations": 0.5, "autograd": 0.5, "inputs": 0.5}, False,
            "halving the micro-batch halves what grows with it: saved activations, backward intermediates "
            "and the batch itself (keep the effective batch with 2x gradient accumulation); weights, "
            "gradients and optimizer state do not change; dequantization scratch and temporaries are "
            "left as they are")


def _lever_checkpointing(facts):
    return ({"activations": CHECKPOINT_FACTOR}, False,
            f"gradient checkpointing keeps each layer's input (about 2.s.b.h bytes of the ~34.s.b.h a "
            f"transformer layer saves) plus one layer's activations while it is recomputed: "
            f"(2L + 34) / (34L) = 0.09-0.14 for 12-32 layers, so activations x {CHECKPOINT_FACTOR}; the "
            f"logits and loss are not checkpointed (the estimate is optimistic where they dominate); "
            f"backward intermediates unchanged; about a third more compute")


def _lever_no_checkpointing(facts):
    return ({}, False,
            "no gradient checkpointing: every block keeps what it saves for backward from its forward to its "
            "backward instead of recomputing it (simulated on the recorded timeline only)")


def _lever_adam8bit(facts):
    bpp = facts.optimizer_bytes_per_param if facts is not None else None
    if bpp:
        f = min(1.0, ADAM8BIT_BYTES / bpp)
        why = f"{ADAM8BIT_BYTES:.2f} B per trainable parameter instead of the {bpp:.2f} B measured"
    else:
        f = 0.25
        why = f"{ADAM8BIT_BYTES:.2f} B per trainable parameter instead of AdamW's 8 B (fp32 moments)"
    return ({"optimizer": round(f, 6)}, False,
            f"an 8-bit optimizer (bitsandbytes AdamW8bit) keeps both moments in uint8 with an fp32 absmax "
            f"per 256 values: {why}, so optimizer state x {f:.3g}")


def _lever_paged(facts):
    return ({"optimizer": 0.0}, False,
            "a paged optimizer (bitsandbytes PagedAdamW/PagedAdamW8bit) keeps its state in CUDA unified "
            "memory, outside the caching allocator, which the driver moves to host RAM under memory "
            "pressure: counted as 0 on the GPU at the peak (optimistic: steps get slower while paging, and "
            "state of tensors under 100,000 elements stays on the GPU)")


def _lever_lora(facts):
    frac = facts.trainable_fraction if facts is not None and facts.trainable_fraction else None
    now = frac if frac else 1.0
    f = min(1.0, LORA_TRAINABLE / now)
    said = f"{now:.3%} trainable now" if frac else "full fine-tuning assumed now"
    return ({"gradients": round(f, 6), "optimizer": round(f, 6)}, False,
            f"LoRA trains about {LORA_TRAINABLE:.0%} of the parameters (rank 8-16 adapters on the attention "
            f"and MLP projections) with the base frozen: gradients and optimizer state x {f:.3g} ({said}); "
            f"the adapters' own weights (~1%) and their activations are ignored")


def _lever_4bit(facts):
    b = facts.frozen_dtype_bytes if facts is not None and facts.frozen_weight_bytes else \
        (facts.trainable_dtype_bytes if facts is not None else 4.0)
    src = (facts.dtype_evidence if facts is not None and facts.dtype_evidence else "fp32 assumed")
    f = min(1.0, NF4_BYTES / b)
    return ({"weights": round(f, 6)}, False,
            f"4-bit base weights (bitsandbytes NF4, QLoRA): {NF4_BYTES:.4f} B per parameter (0.5 B packed + an "
            f"fp32 absmax per 64) instead of {b:g} B ({src}), so weights x {f:.3g}; applies to the whole "
            f"weights category, so pair it with lora for a full fine-tune (4-bit weights cannot be trained); "
            f"one layer's dequantization scratch is ignored")


def _lever_expandable(facts):
    return ({}, True,
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True maps memory in small granules and grows "
            "segments instead of caching many fixed ones: the reserved-but-unallocated memory at the peak "
            "(fragmentation) is taken as gone; the allocated peak itself does not change")


LEVERS = {
    "half_batch": ("halve the micro-batch", _lever_half_batch),
    "checkpointing": ("gradient checkpointing", _lever_checkpointing),
    "no_checkpointing": ("no gradient checkpointing", _lever_no_checkpointing),
    "adam8bit": ("8-bit optimizer", _lever_adam8bit),
    "paged_optimizer": ("paged optimizer", _lever_paged),
    "lora": ("LoRA instead of full fine-tuning", _lever_lora),
    "4bit": ("4-bit base weights", _lever_4bit),
    "expandable_segments": ("expandable_segments", _lever_expandable),
}


# simulated on the recorded timeline from the run's structure (simulate.py), with what the
# simulation does in a line (what-if says it in full, with this run's blocks, for each run)
SIMULATED = ("checkpointing", "no_checkpointing", "half_batch", "lora")
SIMULATION_WORDS = {
    "checkpointing": "simulated on the recorded timeline: each block keeps its input; what it saved for backward is "
                     "freed when its forward ends and recomputed right before its backward",
    "no_checkpointing": "simulated on the recorded timeline: each recomputed tensor is kept from the forward that made "
                        "it instead",
    "half_batch": "simulated on the recorded timeline: every tensor that grows with the batch is halved, recomputed "
                  "ones included; weights, gradients, optimizer state and library workspaces stay",
    "lora": "simulated on the recorded timeline: frozen weights; gradients and optimizer state for rank-8 adapters on "
            "every weight matrix of the blocks; the adapters' own tensors added",
}

# measured by benchmarks/whatif_accuracy.py (README, "What would fit"): the predicted peak
# against the peak of the run recorded with the lever pulled (python benchmarks/whatif_accuracy.py
# --bands prints these lines)
_GRID = ("runs of a tiny GPT recorded on the CPU with and without the lever (4 and 8 layers, sequence 128 and "
         "256, micro-batch 1-8, full fine-tuning and LoRA on every block matrix, with and without checkpointing)")
_TESTS = "; the ground-truth CPU runs of tests/groundtruth (2 layers)"
_H100 = "; a Llama LoRA run on an H100 (bf16 autocast), with and without checkpointing"
ERROR_BANDS: dict[str, ErrorBand] = {
    "checkpointing": ErrorBand(5.5e-06, 2.4e-05, 35, _GRID + _TESTS + _H100),
    "lora": ErrorBand(0.0011, 0.0028, 32, _GRID),
    "no_checkpointing": ErrorBand(4e-05, 0.0014, 35, _GRID + _TESTS + _H100),
    "half_batch": ErrorBand(0.0021, 0.0083, 49, _GRID + _TESTS),
}

# the levers that act on training: nothing to pull in a trace that only runs forward passes
TRAINING_LEVERS = frozenset({"checkpointing", "adam8bit", "paged_optimizer", "lora"})
LORA_ALREADY = 0.05          # a trainable share below this is already LoRA-sized
GUESSED_TOO_MUCH = 0.9       # at or above this share of the peak guessed, no lever is advised


def left_out(name: str, profile=None, expandable: bool = False) -> str | None:
    """Why lever `name` cannot apply to this run (None: it can), from what the trace shows
    (`profile`: results.RunProfile; classifiers/profile.py). The one rule behind every
    surface's advice: the peak's and the OOMs' "worth trying", what-if, the report, the
    viewer. Expandable segments act on the allocator's cache, which even a state-only
    dump measures; every other lever needs the run's evidence."""
    if name == "expandable_segments":
        return "already on" if expandable else None
    if profile is None:
        return None
    if profile.recorded != "trace":
        return ("a state-only snapshot (no trace): it shows what is live, not how the run got there, so no "
                "lever can be simulated on it")
    if not profile.frames:
        return "no allocation carries frames: the categories are guesses, not evidence to advise on"
    if profile.guessed_share >= GUESSED_TOO_MUCH:
        return (f"{profile.guessed_share:.0%} of the peak is a guess (live before recording began, no frames): "
                f"too little evidence to advise on")
    if not profile.training and name in TRAINING_LEVERS:
        return "nothing trains in this trace (forward passes only)"
    if name == "lora":
        if profile.adapters:
            return "LoRA/PEFT adapters are already there (their frames are in the trace)"
        share = profile.trainable_share
        if share is not None and share < LORA_ALREADY:
            return f"already trains only {share:.1%} of the weights it shows"
        if not profile.fine_tuning:
            return ("the trace shows no pretrained model loaded and no frozen weights (training from scratch?); "
                    "if this is a pretrained model, LoRA adapters would shrink the gradients and optimizer state: "
                    "`vramscope whatif FILE --lever lora`")
    if name == "checkpointing":
        if not profile.blocks:
            return "no repeated blocks (layers) found in the stacks: nothing to name for torch.utils.checkpoint"
        if profile.checkpointed:
            return f"the {profile.blocks} blocks are checkpointed already"
    if name == "no_checkpointing" and not profile.checkpointed:
        return "the run is not checkpointed"
    if name == "4bit":
        if profile.quantized:
            return f"the weights are already quantized ({profile.quantized})"
        if not profile.fine_tuning:
            return ("the trace shows no pretrained model loaded and no frozen weights, and weights that train "
                    "cannot be 4-bit; with LoRA on a pretrained base: `vramscope whatif FILE --lever 4bit --lever lora`")
    return None


def lever(name: str, facts=None) -> Lever:
    """The named lever's factors for this run (`facts`: budget.BudgetFacts, or None)."""
    if name not in LEVERS:
        raise LeverError(f"unknown lever {name!r} (known: {', '.join(LEVERS)})")
    title, fn = LEVERS[name]
    scales, removes, why = fn(facts)
    return Lever(name, title, scales, removes, "estimate: " + why, error_band=ERROR_BANDS.get(name))


def simulated_lever(name: str, assumption: str) -> Lever:
    """A lever simulated on the recorded timeline (what-if), with what the simulation assumed."""
    return Lever(name, LEVERS[name][0], {}, False, "simulated on the recorded timeline: " + assumption, simulated=True,
                 error_band=ERROR_BANDS.get(name))


__all__ = ["Lever", "ErrorBand", "LEVERS", "LeverError", "lever", "simulated_lever", "left_out", "TRAINING_LEVERS",
           "CHECKPOINT_FACTOR", "SIMULATED", "SIMULATION_WORDS", "ERROR_BANDS"]
