"""The Trainer callbacks of `vramscope.record`, in the real `transformers.Trainer` and
Lightning `Trainer`, training a tiny Llama built from a config on the CPU (nothing
downloaded), with torch's CUDA memory calls faked (tests/fake_torch.py): recording starts
before the model is built, dumps every N steps with the model's and optimizer's facts,
dumps at an OOM before it unwinds, and stops. Skipped where torch, transformers (with
accelerate) or Lightning is not installed (`pip install -e ".[test,transformers,lightning]"`).
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vramscope.parsers import open_snapshot  # noqa: E402

from fake_torch import FakeCuda  # noqa: E402

STEPS, BATCH, SEQ = 4, 4, 16


@pytest.fixture
def fake(monkeypatch, tmp_path):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    f = FakeCuda.from_fixture("cuda_lora.pickle")
    f.patch(monkeypatch, torch)
    return f


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    model.model.embed_tokens.weight.requires_grad_(False)      # some frozen parameters too
    return model


def oom_at(fake, model, call: int) -> None:
    """Make the model's `call`-th forward run out of memory, as the allocator would."""
    calls = [0]

    def hook(module, args):
        calls[0] += 1
        if calls[0] == call:
            fake.oom()
    model.register_forward_pre_hook(hook)


def expected_counts(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters()) - trainable


def files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


# -- transformers.Trainer ---------------------------------------------------------------------------
def hf_trainer(model, out, callbacks):
    pytest.importorskip("accelerate")          # the Trainer needs it
    ids = torch.randint(0, 128, (BATCH * STEPS, SEQ), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = transformers.TrainingArguments(output_dir=str(out), per_device_train_batch_size=BATCH, max_steps=STEPS,
                                          save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
                                          disable_tqdm=True, dataloader_num_workers=0)
    return transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)


def test_hf_trainer_records_from_before_the_model_every_n_steps(fake, tmp_path):
    from vramscope.integrations.huggingface import RecordCallback
    out = tmp_path / "memory_snapshot"
    cb = RecordCallback(out, every=2, seq_len=SEQ)        # before the model: recording starts here
    fake.mark("model built")
    model = tiny_llama()
    hf_trainer(model, tmp_path / "hf", [cb]).train()
    assert fake.names() == ["history", "attach", "mark:model built", "snapshot", "snapshot", "history"]
    assert fake.calls[0][1]["stacks"] == "python"
    assert files(out) == ["step_000000000002/000000_step_2.pickle", "step_000000000004/000000_step_4.pickle"]
    trainable, frozen = expected_counts(model)
    for step, path in zip((2, 4), cb.recorder.files):
        m = open_snapshot(path, use_cache=False).metadata
        assert (m.step, m.reason, m.micro_batch, m.seq_len) == (step, "step", BATCH, SEQ)
        assert (m.trainable_params, m.frozen_params) == (trainable, frozen)
        assert [p.dtype for p in m.trainable] == ["float32"] and m.params_not_on_gpu == trainable + frozen  # CPU run
        assert m.optimizer == "torch.optim.adamw.AdamW" and m.optimizer_state_dtype == "float32"
        assert m.optimizer_state_bytes == 2 * 4 * trainable
    assert not cb.recorder.recording


def test_hf_trainer_oom_is_dumped_before_it_unwinds(fake, tmp_path):
    from vramscope.integrations.huggingface import RecordCallback
    out = tmp_path / "memory_snapshot"
    fake.watch_dir = str(out)
    cb = RecordCallback(out, every=10)
    model = tiny_llama()
    oom_at(fake, model, call=3)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            hf_trainer(model, tmp_path / "hf", [cb]).train()
        assert fake.files_at_oom == ["step_000000000002_exit/000000_step_2.pickle"]
        m = open_snapshot(cb.recorder.files[0], use_cache=False).metadata
        assert (m.reason, m.step, m.oom.requested) == ("oom", 2, 1 << 30)
        assert m.trainable_params == expected_counts(model)[0]
        # the Trainer has no hook for an exception: an owned recorder is still on (README says so)
        assert cb.recorder.recording
    finally:
        cb.recorder.stop()


def test_hf_trainer_inside_a_record_block_stops_at_the_oom(fake, tmp_path):
    import vramscope
    from vramscope.integrations.huggingface import RecordCallback
    with pytest.raises(torch.OutOfMemoryError):
        with vramscope.record(tmp_path / "snap") as rec:
            model = tiny_llama()
            oom_at(fake, model, call=2)
            hf_trainer(model, tmp_path / "hf", [RecordCallback(rec)]).train()
    assert fake.names() == ["history", "attach", "oom", "snapshot", "raise", "history"]
    assert files(tmp_path / "snap") == ["step_000000000001_exit/000000_step_1.pickle"]
    assert not rec.recording
    with pytest.raises(TypeError):                       # options belong to vramscope.record then
        RecordCallback(rec, every=2)


# -- Lightning --------------------------------------------------------------------------------------
def lightning_run(fake, out, callback, oom_call=None, accumulate=1):
    L = pytest.importorskip("lightning.pytorch")

    class TinyLM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_llama()
            if oom_call is not None:
                oom_at(fake, self.model, oom_call)

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    fake.mark("model built")
    module = TinyLM()
    ids = torch.randint(0, 128, (BATCH * STEPS * accumulate, SEQ), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(ids, batch_size=BATCH)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                        default_root_dir=str(out.parent), accumulate_grad_batches=accumulate)
    trainer.fit(module, loader)
    return module


def test_lightning_records_from_before_the_model_every_n_steps(fake, tmp_path):
    pytest.importorskip("lightning.pytorch")
    from vramscope.integrations.lightning import RecordCallback
    out = tmp_path / "memory_snapshot"
    cb = RecordCallback(out, every=2, micro_batch=BATCH, seq_len=SEQ)
    module = lightning_run(fake, out, cb)
    assert fake.names() == ["history", "attach", "mark:model built", "snapshot", "snapshot", "history"]
    assert files(out) == ["step_000000000002/000000_step_2.pickle", "step_000000000004/000000_step_4.pickle"]
    trainable, frozen = expected_counts(module)
    m = open_snapshot(cb.recorder.files[-1], use_cache=False).metadata
    assert (m.step, m.reason, m.micro_batch, m.seq_len) == (4, "step", BATCH, SEQ)
    assert (m.trainable_params, m.frozen_params) == (trainable, frozen)
    assert m.optimizer == "torch.optim.adamw.AdamW" and m.optimizer_state_bytes == 2 * 4 * trainable
    assert not cb.recorder.recording


def test_lightning_oom_is_dumped_before_it_unwinds_and_recording_stops(fake, tmp_path):
    pytest.importorskip("lightning.pytorch")
    from vramscope.integrations.lightning import RecordCallback
    out = tmp_path / "memory_snapshot"
    fake.watch_dir = str(out)
    cb = RecordCallback(out, every=10)
    with pytest.raises(torch.OutOfMemoryError):
        lightning_run(fake, out, cb, oom_call=3)
    assert fake.files_at_oom == ["step_000000000002_exit/000000_step_2.pickle"]
    assert fake.names() == ["history", "attach", "mark:model built", "oom", "snapshot", "raise", "history"]
    m = open_snapshot(cb.recorder.files[0], use_cache=False).metadata
    assert (m.reason, m.step) == ("oom", 2)
    assert not cb.recorder.recording


def test_lightning_counts_optimizer_steps_under_gradient_accumulation(fake, tmp_path):
    """accumulate_grad_batches=4: Lightning calls on_train_batch_end after every micro-batch,
    and `global_step` moves once per optimizer step. A dump every 1 step is one per optimizer
    step (1 to 4), never one at step 0 while the first step accumulates."""
    pytest.importorskip("lightning.pytorch")
    from vramscope.integrations.lightning import RecordCallback
    out = tmp_path / "memory_snapshot"
    cb = RecordCallback(out, every=1, dump_on_exit=False)
    lightning_run(fake, out, cb, accumulate=4)
    assert files(out) == [f"step_{n:012d}/000000_step_{n}.pickle" for n in range(1, STEPS + 1)]
    assert [open_snapshot(f, use_cache=False).metadata.step for f in cb.recorder.files] == [1, 2, 3, 4]
    assert fake.names().count("snapshot") == STEPS


@pytest.mark.parametrize("framework", ["huggingface", "lightning"])
def test_the_callbacks_no_cuda_warning_points_at_the_users_line(fake, tmp_path, monkeypatch, framework):
    pytest.importorskip("lightning.pytorch" if framework == "lightning" else "transformers")
    import importlib
    RecordCallback = importlib.import_module(f"vramscope.integrations.{framework}").RecordCallback
    from vramscope import recorder
    monkeypatch.setattr(recorder, "_cuda_available", lambda torch: False)
    with pytest.warns(RuntimeWarning, match="CUDA is not available") as caught:
        RecordCallback(tmp_path / "snap")
    line = sys._getframe().f_lineno - 1
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]
