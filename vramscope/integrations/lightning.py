"""Lightning `Callback` built on `vramscope.record` (pip install "vramscope[lightning]").

    cb = RecordCallback("memory_snapshot", every=50)        # before the model: recording starts here
    model = MyLightningModule()
    lightning.pytorch.Trainer(callbacks=[cb], ...).fit(model, data)

It dumps every `every` optimizer steps (`trainer.global_step`), at an OOM (from inside the
allocator, before the error unwinds; or, when torch has no OOM observer, in Lightning's
`on_exception`) and when training ends, with the module's parameter counts and the
optimizer in each file's metadata, and stops recording when training ends or fails.
Works with `lightning` and with the older `pytorch_lightning` package.
"""
from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:                      # the pre-2.0 package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef,assignment,unused-ignore]

from ..recorder import Recorder
from . import recorder_for


class RecordCallback(Callback):
    def __init__(self, recorder: Recorder | str | None = None, **options):
        self.recorder, self.owned = recorder_for(recorder, options)

    def on_train_start(self, trainer, pl_module) -> None:
        opts = trainer.optimizers
        self.recorder.watch(pl_module, opts[0] if opts else None)
        self.recorder.step_count = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Lightning calls this after every batch, and under gradient accumulation most batches
        # end no optimizer step: `global_step` (optimizer steps) has not moved, so nothing is
        # done (counting them made a dump at step 0 while the first step accumulated)
        if trainer.global_step != self.recorder.step_count:
            self.recorder.step(trainer.global_step)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.owned:
            self.recorder.stop(exception)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.owned:
            self.recorder.stop()


__all__ = ["RecordCallback"]
