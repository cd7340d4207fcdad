"""The napkin-math budget against what real and recorded runs measured.

Figures the expectations are checked against come from outside the snapshot: the
recorded runs' truth files (trainable parameters), the model behind a real file
(TinyLlama-1.1B: 22 layers of 44,040,192 projection weights, LoRA r=16 on q/v), and the
fixture generator's shapes (tests/data/make_fixtures.py).
"""
from __future__ import annotations

import json
import pickle
import sys

import pytest

from helpers import DATA, GROUNDTRUTH, SHARED, needs_shared
from vramscope.classifiers import CATEGORIES, analyze
from vramscope.classifiers.budget import TOLERANCE, budget
from vramscope.parsers import open_snapshot

FULLSTEP = "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_fullstep.pickle"
CRANBERRII = "cranberrii+ftcourse__memory_snapshot.pickle"
_cache: dict = {}


def _budget(path, device=0):
    path = str(path)
    if path not in _cache:
        an = analyze(open_snapshot(path, use_cache=False), use_cache=False)
        _cache[path] = budget(an, device)
    return _cache[path]


def _within(row, rel, measured="measured"):
    m = getattr(row, measured)
    return row.expected and abs(m - row.expected) <= rel * row.expected


# -- the figures --------------------------------------------------------------------------
@needs_shared
def test_fp32_adamw_full_step_optimizer_and_gradients_within_10_percent():
    b = _budget(SHARED / FULLSTEP)
    f = b.facts
    assert f.optimizer == "AdamW" and f.optimizer_bytes_per_param == pytest.approx(8.0, rel=0.01)
    opt, grad = b.row("optimizer"), b.row("gradients")
    assert opt.expected == 2 * f.trainable_weight_bytes          # 2 x fp32 trainable parameters
    assert _within(opt, 0.10) and _within(grad, 0.10), (opt, grad)
    assert opt.note == "" and grad.note == ""
    # a full fine-tune: all but a few buffers are trainable
    assert f.trainable_fraction > 0.99 and f.trainable_dtype_bytes == 4.0


def test_qlora_fixture_quantized_weights_within_15_percent():
    b = _budget(DATA / "qlora_4bit.pickle")
    f = b.facts
    q = b.row("quantization")
    assert _within(q, 0.15), q
    # the generator: 5 layers of q/k/v/o (2048x2048, 256x2048 twice, 2048x2048) and
    # gate/up/down (5632x2048 three times), NF4 with double-quantized absmax
    n_q = 5 * (2 * 2048 * 2048 + 2 * 256 * 2048 + 3 * 5632 * 2048)
    assert f.quantized_params == pytest.approx(n_q, rel=0.01)
    assert "double-quantized" in f.quant_scheme
    # LoRA adapters (r=16, fp32) on q_proj and v_proj are the trainable set
    assert f.trainable_params == 5 * (16 * 2048 + 2048 * 16 + 16 * 2048 + 256 * 16)
    assert f.trainable_dtype_bytes == 4.0
    assert f.optimizer == "bitsandbytes 8-bit" and f.input_tokens == 2 * 512
    # the 8-bit state is made in the step after the peak
    assert b.row("optimizer").measured == 0 and "lazily" in b.row("optimizer").note
    assert _within(b.row("optimizer"), 0.15, "measured_max")


@needs_shared
def test_real_4bit_lora_run():
    """cranberrii: TinyLlama-1.1B in NF4 with LoRA r=16 on q_proj/v_proj, one forward and
    backward and no optimizer step (the shared README calls it 8-bit; sizes say 4-bit)."""
    b = _budget(SHARED / CRANBERRII)
    f = b.facts
    assert f.quantized_params == 22 * (2 * 2048 * 2048 + 2 * 256 * 2048 + 3 * 5632 * 2048) == 968_884_224
    assert f.quant_scheme.startswith("4-bit") and "fp32 absmax per 64" in f.quant_scheme
    assert _within(b.row("quantization"), 0.15)
    assert f.trainable_params == 22 * (16 * 2048 + 2048 * 16 + 16 * 2048 + 256 * 16)
    # no optimizer step and no state: none expected and none assumed (no AdamW made up)
    assert b.row("optimizer") is None


# -- recorded runs: trainable parameters from the truth files -------------------------------------
def test_lora_run_trainable_parameters_are_the_adapters():
    """The adapters are counted from their gradients; the frozen base was built before the
    profiler started (no frames, never freed: a guess), so it is not counted, and the
    weights' formula says how much was left out."""
    truth = json.loads((GROUNDTRUTH / "lora.truth.json").read_text())
    b = _budget(GROUNDTRUTH / "lora.pickle")
    f = b.facts
    assert f.trainable_params == truth["trainable_params"]
    assert f.frozen_params == 0
    frozen_bytes = 4 * (truth["total_params"] - truth["trainable_params"])
    assert f.guessed_bytes["weights"] == pytest.approx(frozen_bytes, rel=0.02)
    assert "are a guess" in b.row("weights").formula


@pytest.mark.parametrize("run", ["mlp_adamw", "transformer_adamw", "checkpointing", "bf16_autocast", "lora",
                                 "sgd_accum", "retain_graph", "leak"])
def test_recorded_runs_optimizer_and_gradients_match_their_maximum(run):
    b = _budget(GROUNDTRUTH / f"{run}.pickle")
    assert b.facts.optimizer == ("SGD" if run == "sgd_accum" else "Adam")
    assert _within(b.row("optimizer"), 0.10, "measured_max"), b.row("optimizer")
    assert _within(b.row("gradients"), 0.10, "measured_max"), b.row("gradients")
    # every weight counted but the buffers no gradient matches (a guess: made before the
    # profiler started), which the formula names
    assert b.row("weights").expected + (b.facts.guessed_bytes or {}).get("weights", 0) == b.row("weights").measured


def test_autocast_weights_are_recognized_as_fp32():
    f = _budget(GROUNDTRUTH / "bf16_autocast.pickle").facts
    assert "autocast" in f.dtype_evidence and f.trainable_dtype_bytes == 4.0


# -- notes: a mixed-precision step built with the fixture generator ------------------------------
def _mixed_precision_snapshot(path):
    """bf16 weights (live before the trace), fp32 gradients (AccumulateGrad) and fp32
    AdamW moments created lazily in the first step; two iterations."""
    sys.path.insert(0, str(DATA))
    try:
        import make_fixtures as mf
        sn = mf.Snap((2, 6), t0=1_730_000_000_000_000, context="all")
        call, module_call = mf.call, mf.module_call
    except (ImportError, AttributeError, TypeError) as e:       # the generator changed shape
        pytest.skip(f"make_fixtures not usable here: {e}")
    finally:
        sys.path.remove(str(DATA))
    d = sn.device(0, base=0x7F10_0000_0000)
    SP = "/usr/lib/python3.11/site-packages/"
    TR = "/home/u/train_bf16.py"
    M = module_call(SP)
    main = [(TR, 80, "main"), (TR, 90, "<module>")]
    shapes = [1024 * 1024, 4096 * 1024, 1024 * 4096, 1024 * 1024, 4096 * 1024, 1024 * 4096, 1024, 1024]
    d.recording = False
    params = [(d.alloc(n * 2, (), "weights"), n) for n in shapes]
    d.start_recording()
    eng = [("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)")]
    acc = [("??", 0, "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")]
    grads, state, tok = [], [], 4096
    for _ in range(2):
        sn.annotate("Optimizer.zero_grad#AdamW.zero_grad", "START")
        for g in grads:
            d.free(g, call((SP + "torch/optim/optimizer.py", 975, "zero_grad"), (TR, 40, "step"), main))
        grads = []
        sn.annotate("Optimizer.zero_grad#AdamW.zero_grad", "END")
        x = d.alloc(tok * 8, call((TR, 33, "step"), main), "inputs")
        acts = [d.alloc(tok * 4096 * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M,
                                             (TR, 20, "forward"), M, (TR, 35, "step"), main), "activations")
                for _ in shapes]
        loss = d.alloc(4, call((SP + "torch/nn/functional.py", 3479, "cross_entropy"), (TR, 36, "step"), main),
                       "activations")
        for (_, n), a in zip(reversed(params), reversed(acts)):
            grads.append(d.alloc(n * 4, call(acc, eng), "gradients"))
            d.free(a, call(eng))
        d.free(loss, call((TR, 37, "step"), main))
        d.free(x, call((TR, 38, "step"), main))
        sn.annotate("Optimizer.step#AdamW.step", "START")
        if not state:
            for _, n in params:
                state += [d.alloc(n * 4, call((SP + "torch/optim/adamw.py", 120, "_init_group"),
                                              (SP + "torch/optim/adamw.py", 200, "step"),
                                              (SP + "torch/optim/optimizer.py", 480, "wrapper"), (TR, 39, "step"),
                                              main), "optimizer") for _ in range(2)]
        sn.annotate("Optimizer.step#AdamW.step", "END")
    with open(path, "wb") as f:
        pickle.dump(sn.build(), f, protocol=4)
    return sum(shapes)


def test_mixed_precision_notes_name_the_reason(tmp_path):
    path = tmp_path / "bf16_fp32grads.pickle"
    n = _mixed_precision_snapshot(path)
    b = _budget(path)
    f = b.facts
    assert f.gradient_ratio == 2.0 and f.trainable_dtype_bytes == 2.0 and f.trainable_params == n
    assert "16-bit weights with fp32 gradients" in f.dtype_evidence
    grad, opt = b.row("gradients"), b.row("optimizer")
    assert grad.expected == 2 * n and grad.measured_max == 4 * n
    assert grad.note.startswith("gradients twice the weights: fp32 gradients of 16-bit weights")
    assert opt.expected == 4 * n and opt.measured == 8 * n          # torch keeps moments in the params' dtype
    assert opt.note.startswith("twice: fp32 moments of 16-bit parameters")


# -- shape -----------------------------------------------------------------------------------
def test_rows_follow_the_categories_then_the_total():
    b = _budget(DATA / "qlora_4bit.pickle")
    cats = [r.category for r in b.rows]
    assert cats[-1] == "total" and cats[:-1] == [c for c in CATEGORIES if c in cats]
    assert {"weights", "activations", "gradients", "optimizer", "quantization"} <= set(cats)
    total = b.rows[-1]
    assert total.measured == b.peak_bytes == total.measured_max
    for r in b.rows:
        assert set(r.to_json()) == {"category", "measured", "measured_max", "expected", "formula", "note"}
        assert r.formula and "\n" not in r.formula and "\n" not in r.note
        assert r.measured <= r.measured_max
        flagged = r.expected is not None and r.expected > 0 and abs(r.measured - r.expected) > TOLERANCE * r.expected
        if flagged and r.category != "total":
            assert r.note, r                    # a difference over 15% always says why
    assert b.to_json() == [r.to_json() for r in b.rows]
