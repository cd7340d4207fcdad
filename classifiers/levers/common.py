"""What every lever's `why_not` checks first: is there evidence to advise on at all."""
from __future__ import annotations

GUESSED_TOO_MUCH = 0.9       # at or above this share of the peak guessed, no lever is advised


def evidence_why_not(run) -> str | None:
    """Why no lever can be judged on this run (None: the trace is evidence enough). Expandable
    segments, which act on the allocator's cache a state-only dump measures too, skip this."""
    if run is None:
        return None
    if run.recorded.value != "trace":
        return ("a state-only snapshot (no trace): it shows what is live, not how the run got there, so no "
                "lever can be simulated on it")
    if not run.frames:
        return "no allocation carries frames: the categories are guesses, not evidence to advise on"
    if run.guessed_share >= GUESSED_TOO_MUCH:
        return (f"{run.guessed_share:.0%} of the peak is a guess (live before recording began, no frames): "
                f"too little evidence to advise on")
    return None


def training_why_not(run) -> str | None:
    """Why a lever that acts on training (gradients, optimizer state) cannot apply: it needs a
    backward and an optimizer step seen in the trace."""
    if run is None or run.trains:
        return None
    if run.optimizer_step.value and run.backward.value is False:
        return ("the parameters are updated without a backward (zeroth-order): no gradients or optimizer state "
                "for this lever to act on")
    if run.backward.value and not run.optimizer_step.value:
        return "a backward ran but no optimizer step is in the trace: no optimizer state to act on"
    if run.kind.value == "inference":
        return "forward passes only, no backward: nothing trains"
    if run.kind.value == "forward_with_grad":
        return "forward passes with grad enabled and no backward in the trace: nothing trains in it"
    return "no backward and optimizer step in the trace: nothing trains in it"


__all__ = ["evidence_why_not", "training_why_not", "GUESSED_TOO_MUCH"]
