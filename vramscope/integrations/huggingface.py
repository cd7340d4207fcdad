"""`transformers.Trainer` callback built on `vramscope.record` (pip install "vramscope[transformers]").

    cb = RecordCallback("memory_snapshot", every=50)        # before the model: recording starts here
    model = AutoModelForCausalLM.from_pretrained(...)
    Trainer(model, args, callbacks=[cb], ...).train()

It dumps every `every` optimizer steps (`state.global_step`), at an OOM (from inside the
allocator, before the error unwinds) and when training ends, with the model's parameter
counts, the optimizer and the per-device batch size in each file's metadata. The Trainer
has no hook for an exception: when training dies of one, a callback that started its own
recording leaves it on until the process ends (the OOM snapshot is already written). Wrap
the run in `with vramscope.record(...) as rec:` and pass `RecordCallback(rec)` to stop it
in every case.
"""
from __future__ import annotations

from transformers import TrainerCallback

from ..recorder import Recorder
from . import recorder_for


class RecordCallback(TrainerCallback):
    def __init__(self, recorder: Recorder | str | None = None, **options):
        self.recorder, self.owned = recorder_for(recorder, options)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        rec = self.recorder
        rec.watch(model, optimizer, micro_batch=rec.micro_batch or args.per_device_train_batch_size)
        rec.step_count = state.global_step          # resumed runs name their steps as the Trainer does

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.recorder.watch(model, optimizer)       # the Trainer may build the optimizer late
        self.recorder.step(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.owned:
            self.recorder.stop()


__all__ = ["RecordCallback"]
