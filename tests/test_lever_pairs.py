"""Each simulated lever against runs recorded with it pulled: the prediction from one run of a
pair within 5% of the peak of the other (the bar), on pairs of the families recorded on an H100
(tests/data/levers/dev, benchmarks/record_families.py) and the CPU ground truth. A structural
rule of a lever taken out makes at least one of these fail (the mutations tried are in the
closing note of the issue "One lever, one number"); the held-out families
(tests/data/levers/heldout) are never used here."""
from __future__ import annotations

import pytest

from helpers import DATA, GROUNDTRUTH
from vramscope.classifiers import analyze
from vramscope.classifiers.whatif import growth_peak, what_if
from vramscope.parsers import open_snapshot

DEV = DATA / "levers" / "dev"
CPU = DATA / "levers" / "cpu"      # the same family recorded on the CPU (profiler): BatchNorm's counter in its stacks
BAR = 0.05
_AN: dict = {}


def an(path):
    if str(path) not in _AN:
        _AN[str(path)] = analyze(open_snapshot(str(path), use_cache=False))
    return _AN[str(path)]


def peak(path) -> int:
    a = an(path)
    return a.devices[a.primary_device()].peak.bytes


# (source, target, lever, tolerance): the bar where a family was measured off by more, a tight one
# where the simulation was within 0.5% (a rule taken out moves it by more than that)
TIGHT = 0.005
PAIRS = [
    (DEV / "llama_tied.base.pickle", DEV / "llama_tied.ckpt.pickle", "checkpointing", TIGHT),
    (DEV / "vit_sgd.base.pickle", DEV / "vit_sgd.ckpt.pickle", "checkpointing", 0.02),
    (DATA / "cuda_lora.pickle", DATA / "cuda_ckpt.pickle", "checkpointing", TIGHT),
    (GROUNDTRUTH / "ft_base.pickle", GROUNDTRUTH / "ft_checkpointing.pickle", "checkpointing", TIGHT),
    (GROUNDTRUTH / "transformer_adamw.pickle", GROUNDTRUTH / "checkpointing.pickle", "checkpointing", TIGHT),
    (CPU / "cnn_bn.base.pickle", CPU / "cnn_bn.ckpt.pickle", "checkpointing", BAR),
    (CPU / "cnn_bn.ckpt.pickle", CPU / "cnn_bn.base.pickle", "no_checkpointing", TIGHT),
    (DEV / "llama_tied.ckpt.pickle", DEV / "llama_tied.base.pickle", "no_checkpointing", TIGHT),
    (DEV / "vit_sgd.ckpt.pickle", DEV / "vit_sgd.base.pickle", "no_checkpointing", TIGHT),
    (DATA / "cuda_ckpt.pickle", DATA / "cuda_lora.pickle", "no_checkpointing", TIGHT),
    (GROUNDTRUTH / "ft_checkpointing.pickle", GROUNDTRUTH / "ft_base.pickle", "no_checkpointing", TIGHT),
    (DEV / "llama_tied.base.pickle", DEV / "llama_tied.half.pickle", "half_batch", TIGHT),
    (DEV / "llama_tied.double.pickle", DEV / "llama_tied.base.pickle", "half_batch", TIGHT),
    (DEV / "gpt2_bf16.base.pickle", DEV / "gpt2_bf16.half.pickle", "half_batch", TIGHT),
    (DEV / "bert_dropout.base.pickle", DEV / "bert_dropout.half.pickle", "half_batch", TIGHT),
    (DEV / "vit_sgd.base.pickle", DEV / "vit_sgd.half.pickle", "half_batch", TIGHT),
    (GROUNDTRUTH / "ft_batch2x.pickle", GROUNDTRUTH / "ft_base.pickle", "half_batch", TIGHT),
    (CPU / "gpt_l4_s128_b4_full.pickle", CPU / "gpt_l4_s128_b4_lora.pickle", "lora", TIGHT),
    (DEV / "llama_tied.base.pickle", DEV / "llama_tied.lora_all.pickle", "lora", BAR),
]
GROWTH = [
    (DEV / "llama_tied.base.pickle", DEV / "llama_tied.double.pickle", "batch"),
    (DEV / "gpt2_bf16.base.pickle", DEV / "gpt2_bf16.double.pickle", "batch"),
    (DEV / "bert_dropout.base.pickle", DEV / "bert_dropout.double.pickle", "batch"),
    (DEV / "vit_sgd.half.pickle", DEV / "vit_sgd.base.pickle", "batch"),
    (DEV / "llama_tied.base.pickle", DEV / "llama_tied.seq2.pickle", "seq"),
    (DEV / "bert_dropout.base.pickle", DEV / "bert_dropout.seq2.pickle", "seq"),
    (DEV / "gpt2_bf16.base.pickle", DEV / "gpt2_bf16.seq2.pickle", "seq"),
]


@pytest.mark.parametrize("src, dst, lever, tol", PAIRS, ids=[f"{lv}:{s.stem}->{d.stem}" for s, d, lv, _t in PAIRS])
def test_a_lever_predicts_the_run_recorded_with_it(src, dst, lever, tol):
    a = an(src)
    dev = a.primary_device()
    r = what_if(a, dev, levers=[lever], with_budget=False)
    assert r.prediction, r.note
    (lv,) = r.levers
    assert lv.applied and lv.simulated
    want = peak(dst)
    assert abs(r.scaled.bytes - want) <= tol * want, (r.scaled.bytes, want, (r.scaled.bytes - want) / want)


@pytest.mark.parametrize("src, dst, dim", GROWTH, ids=[f"{d}:{s.stem}->{t.stem}" for s, t, d in GROWTH])
def test_the_growth_model_predicts_twice_the_batch_or_the_sequence(src, dst, dim):
    a = an(src)
    got = growth_peak(a, a.primary_device(), dim, 2.0)
    want = peak(dst)
    assert got is not None and abs(got - want) <= BAR * want, (got, want, (got - want) / want)


def test_a_convolution_library_workspace_declines_the_batch_levers():
    """cuDNN picks its algorithm, and its workspace, by the shapes: the CNN recorded at twice
    the batch took a workspace ten times larger. Where such scratch is large against the peak,
    the batch levers and the growth model make no prediction and say why."""
    a = an(DEV / "cnn_bn.double.pickle")
    r = what_if(a, 0, levers=["half_batch"], with_budget=False)
    assert not r.prediction and "workspace" in r.levers[0].why and r.levers[0].error_band is None
    assert growth_peak(a, 0, "batch", 2.0) is None
    f = what_if(a, 0, gpu="80", fit="batch", with_budget=False).fit[0]
    assert not f.applied and "cuDNN" in f.why and f.max_factor is None


def test_lora_on_some_matrices_declines():
    a = an(DEV / "llama_tied.base.pickle")
    r = what_if(a, 0, levers=["lora"], lora_targets="q,v", with_budget=False)
    assert not r.prediction and "q,v" in r.levers[0].why
