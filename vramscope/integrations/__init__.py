"""Training-framework callbacks built on `vramscope.record` (optional: each imports its
framework, and `import vramscope` imports none of them).

    from vramscope.integrations.huggingface import RecordCallback   # transformers.Trainer
    from vramscope.integrations.lightning import RecordCallback     # lightning.pytorch.Trainer

Either one, given no recorder, starts recording when it is created: create it before the
model, so that the weights' allocations carry their stacks. Given a running recorder
(`with vramscope.record(...) as rec: ... RecordCallback(rec)`), it only tells the recorder
the steps, the model and the optimizer; the `with` block starts and stops recording.
"""
from __future__ import annotations

from ..recorder import Recorder


def recorder_for(recorder: Recorder | str | None, options: dict) -> tuple[Recorder, bool]:
    """(the recorder a callback uses, whether the callback owns it): the running recorder it
    was given (its `with` block starts and stops it), else a new one, started now."""
    if isinstance(recorder, Recorder):
        if options:
            raise TypeError(f"options {sorted(options)} go to vramscope.record(...), not with a recorder")
        return recorder, False
    return Recorder(*(() if recorder is None else (recorder,)), **options).start(), True


__all__ = ["recorder_for"]
