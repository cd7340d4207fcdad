"""Each simulated lever against runs recorded with it pulled: the prediction from one run of a
pair within 5% of the peak of the other (the bar), on pairs of the families recorded on an H100
(tests/data/levers/dev, benchmarks/record_families.py) and the CPU ground truth. A structural
rule of a lever taken out makes at least one of these fail (the mutations tried are in the
closing note of the issue "One lever, one number"). The held-out families
(tests/data/levers/heldout) were reported first, untouched (README); two fixes were made after
seeing them and said so (GPT-NeoX's blocks, T5's mask of the scores' shape), and only those two
cases are held here, at the end, as regression tests: they are no longer held out."""
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
    assert lv.applied and lv.simulated and lv.assumption.startswith("simulated on the recorded timeline")
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


# -- after the held-out report (no longer held out: fixed from what it showed, said in the README) --------
HELDOUT = DATA / "levers" / "heldout"


@pytest.mark.parametrize("src, dst, lever", [
    (HELDOUT / "neox.base.pickle", HELDOUT / "neox.ckpt.pickle", "checkpointing"),
    (HELDOUT / "neox.ckpt.pickle", HELDOUT / "neox.base.pickle", "no_checkpointing")])
def test_a_block_whose_call_spans_lines_is_one_block(src, dst, lever):
    """GPT-NeoX's layer calls `self.attention(self.input_layernorm(x), ...)` over two lines: the
    norm runs on line 261, the attention on 260; one call of the block, not two (was +22%, -19%)."""
    a = an(src)
    r = what_if(a, 0, levers=[lever], with_budget=False)
    want = peak(dst)
    assert r.levers[0].applied and abs(r.scaled.bytes - want) <= 0.02 * want, (r.scaled.bytes - want) / want


def test_a_mask_of_the_scores_shape_in_fused_attention_declines_the_sequence():
    """T5 adds its position bias to the mask, batch x heads x seq x seq, and hands it to the fused
    kernel: it grows with the square of the sequence (was predicted linear: -12.8%)."""
    a = an(HELDOUT / "t5.base.pickle")
    assert growth_peak(a, 0, "seq", 2.0) is None
    f = what_if(a, 0, gpu="80", fit="seq", with_budget=False).fit[0]
    assert not f.applied and "mask or bias" in f.why


def test_call_starts_allow_a_call_written_over_lines_and_split_a_short_block_called_again():
    import numpy as np
    from vramscope.classifiers.structure import _call_starts
    lines = np.array([261, 260, 260, 272, 274, 261, 260, 272, 274])
    pos, sig = np.arange(len(lines)), np.zeros(len(lines), dtype=np.int64)
    assert _call_starts(pos, sig, lines).tolist() == [0, 5]
    short = np.array([10, 11, 10, 11, 10, 11])
    assert _call_starts(np.arange(6), np.zeros(6, dtype=np.int64), short).tolist() == [0, 2, 4]


def test_only_the_calls_from_the_blocks_call_site_are_the_blocks():
    """A model's embedding or head can run through the blocks' frame from another line: those
    calls are not blocks; each block call comes back as bounds into the rows under the node."""
    import numpy as np
    from vramscope.classifiers.structure import _call_bounds

    class Paths:                        # stack 0: a block, called from line 40; 1: the head, from
        def node_arrays(self, u, depth, node_path):     # line 60; 2: outside the node
            table = {0: (True, 7, 0, 100), 1: (True, 7, 1, 100), 2: (False, 0, 0, 0)}
            cols = list(zip(*(table[int(s)] for s in u)))
            return (np.array(cols[0]), np.array(cols[1], dtype=np.int64), np.array(cols[2], dtype=np.int64),
                    np.array(cols[3], dtype=np.int64))
    rows_stack = np.array([1, 2, 0, 0, 2, 0, 0, 2, 0, 0, 2, 1])
    pos, a, b = _call_bounds(Paths(), rows_stack, 0, ())
    assert [pos[x:y].tolist() for x, y in zip(a.tolist(), b.tolist())] == [[2, 3], [5, 6], [8, 9]]
    assert _call_bounds(Paths(), np.array([2, 2]), 0, ()) is None
