"""What the trace shows about the run (classifiers/runfacts.py), a fact at a time: each on a
small trace built for it in torch's layout (make_fixtures' allocator), with the case that must
not be read as it (frees after an OOM are not a backward; a forward with grad whose output is
reassigned is not one either), then on the runs recorded on an H100 for it (tests/data/facts)."""
from __future__ import annotations

import pickle
import sys

import pytest

from helpers import DATA
from vramscope.classifiers import analyze
from vramscope.parsers import open_snapshot

sys.path.insert(0, str(DATA))
from make_fixtures import Snap, module_call  # noqa: E402

SP = "/venv/lib/python3.11/site-packages/"
TRAIN = ("/home/u/train.py", 40, "main")
MODEL = "/home/u/model.py"
MiB = 1 << 20


def forward_frames(line=12, name="forward"):
    return [(MODEL, line, name)] + module_call(SP) + [("/home/u/train.py", 30, "step"), TRAIN]


def backward_frames():
    return [(SP + "torch/autograd/graph.py", 825, "_engine_run_backward"),
            (SP + "torch/autograd/__init__.py", 353, "backward"), (SP + "torch/_tensor.py", 626, "backward"),
            ("/home/u/train.py", 31, "step"), TRAIN]


def optimizer_frames(file="adamw.py"):
    return [(SP + f"torch/optim/{file}", 240, "_multi_tensor_adamw"), (SP + f"torch/optim/{file}", 180, "step"),
            (SP + "torch/optim/optimizer.py", 487, "wrapper"), ("/home/u/train.py", 32, "step"), TRAIN]


def build_frames(line):
    return [(SP + "torch/nn/modules/linear.py", 106, "__init__"), (MODEL, line, "__init__"),
            ("/home/u/train.py", line, "main"), ("/home/u/train.py", 50, "<module>")]


def facts(tmp_path, build, name="t.pickle"):
    """The run facts of device 0 of the trace `build(sn, dev)` makes."""
    sn = Snap((2, 6), context="all")
    d = sn.device(0, base=0x7F00_0000_0000)
    build(sn, d)
    p = tmp_path / name
    p.write_bytes(pickle.dumps(sn.build(), protocol=4))
    return analyze(open_snapshot(str(p), use_cache=False)).devices[0].run


def model(d, sizes=(4 * MiB,) * 6, line=20):
    return [d.alloc(n, build_frames(line), "weights") for n in sizes]


def fwd(d, n=4, size=2 * MiB):
    return [d.alloc(size, forward_frames(12 + k), "activations") for k in range(n)]


# -- backward ------------------------------------------------------------------------------------------
def test_a_backward_with_its_frames_is_a_backward(tmp_path):
    def run(sn, d):
        w = model(d)
        acts = fwd(d)
        g = [d.alloc(4 * MiB, backward_frames(), "gradients") for _ in w]
        for a in acts:
            d.free(a, backward_frames())
        del g
    r = facts(tmp_path, run)
    assert r.backward.value is True and r.backward.evidence == "stack"
    assert r.kind.value == "forward_backward"


def test_frees_after_an_oom_are_not_a_backward(tmp_path):
    """The exception unwinding after an OOM frees the graph's saved tensors from node destructors
    (C++ frames: deleteNode, release_variables): the unwinding, never a backward."""
    teardown = [("??", 0, "torch::autograd::SavedVariable::reset_data()"),
                ("", 0, "torch::autograd::generated::MulBackward0::release_variables()"),
                ("??", 0, "torch::autograd::deleteNode(torch::autograd::Node*)"),
                ("python_variable.cpp", 0, "THPVariable_subclass_dealloc(_object*)"), TRAIN]

    def run(sn, d):
        model(d)
        acts = fwd(d, 6)
        d.entry("oom", None, 80 * MiB, device_free=1 * MiB, frames=sn.tb(forward_frames()))
        for a in acts:
            d.free(a, teardown)
    r = facts(tmp_path, run)
    assert r.oom.value is True and r.truncated_by_oom.value is True
    assert r.backward.value is False and r.kind.value != "forward_backward"


def test_a_forward_with_grad_whose_output_is_reassigned_is_not_a_backward(tmp_path):
    """Three forwards of one Linear with grad on: each output replaced by the next, its graph freed
    by the user's line (no backward frames): forward passes with grad, no backward."""
    def run(sn, d):
        model(d, (64 * MiB,))
        prev = None
        for k in range(3):
            out = d.alloc(32 * MiB, forward_frames(12), "activations")
            d.alloc(1 * MiB, forward_frames(13), "activations")
            if prev is not None:
                d.free(prev, [("/home/u/train.py", 60 + k, "main")])
            prev = out
    r = facts(tmp_path, run)
    assert r.backward.value is False and r.backward.evidence == "stack"
    assert r.kind.value == "forward_with_grad" and r.optimizer_step.value is False


# -- optimizer ----------------------------------------------------------------------------------------------
def test_an_optimizer_step_names_its_optimizer(tmp_path):
    def run(sn, d):
        w = model(d)
        fwd(d)
        [d.alloc(4 * MiB, backward_frames(), "gradients") for _ in w]
        [d.alloc(4 * MiB, optimizer_frames(), "optimizer") for _ in range(2 * len(w))]
    r = facts(tmp_path, run)
    assert r.optimizer_step.value is True and r.optimizer.value == "AdamW" and r.kind.value == "training"


def test_no_optimizer_frames_no_optimizer(tmp_path):
    def run(sn, d):
        w = model(d)
        fwd(d)
        [d.alloc(4 * MiB, backward_frames(), "gradients") for _ in w]
    r = facts(tmp_path, run)
    assert r.optimizer_step.value is False and r.optimizer.value is None


# -- inference ---------------------------------------------------------------------------------------------
def test_forwards_under_no_grad_are_inference(tmp_path):
    ng = [(SP + "torch/utils/_contextlib.py", 116, "decorate_context")]

    def run(sn, d):
        model(d)
        for k in range(3):
            a = d.alloc(2 * MiB, forward_frames(12) + ng, "activations")
            b = d.alloc(2 * MiB, forward_frames(13) + ng, "activations")
            d.free(a, forward_frames(13) + ng)
            d.free(b, [("/home/u/train.py", 61, "main")])
    r = facts(tmp_path, run)
    assert r.kind.value == "inference" and r.backward.value is False and r.kind.evidence == "stack"


# -- checkpointing, adapters --------------------------------------------------------------------------------
def test_checkpointing_from_its_frames_with_or_without_blocks(tmp_path):
    ck = [(SP + "torch/utils/checkpoint.py", 495, "checkpoint")]

    def run(sn, d):
        model(d)
        for k in range(2):
            d.alloc(2 * MiB, forward_frames(12) + ck, "activations")
    assert facts(tmp_path, run).checkpointing.value is True

    def plain(sn, d):
        model(d)
        fwd(d)
    assert facts(tmp_path, plain, "p.pickle").checkpointing.value is False


def test_adapters_from_peft_frames(tmp_path):
    peft = [(SP + "peft/tuners/lora/layer.py", 500, "forward")]

    def run(sn, d):
        model(d)
        d.alloc(2 * MiB, forward_frames(12) + peft, "activations")
    assert facts(tmp_path, run).adapters.value is True

    def plain(sn, d):
        model(d)
        fwd(d)
    assert facts(tmp_path, plain, "p.pickle").adapters.value is False


# -- autocast ------------------------------------------------------------------------------------------------
def test_autocast_copies_of_the_weights_are_weights_not_activations(tmp_path):
    """fp32 weights under autocast: a half-size copy of each weight matrix inside the op that reads
    it, every forward: `weights.autocast_copy`, not activations, and autocast is on."""
    mats = [4 * MiB] * 4 + [8 * MiB] * 2

    def run(sn, d):
        model(d, mats)
        for k, n in enumerate(mats):
            d.alloc(n // 2, forward_frames(30 + k), "weights")          # the cast
            d.alloc(3 * MiB, forward_frames(30 + k), "activations")     # the op's output
    r = facts(tmp_path, run)
    assert r.autocast.value is True and r.autocast_copy_bytes == sum(mats) // 2

    def fp32(sn, d):
        model(d, mats)
        for k, n in enumerate(mats):
            d.alloc(3 * MiB, forward_frames(30 + k), "activations")
    assert facts(tmp_path, fp32, "p.pickle").autocast.value is False


# -- models ------------------------------------------------------------------------------------------------
def test_two_models_and_a_model_held_twice(tmp_path):
    def two(sn, d):
        model(d, (4 * MiB,) * 6, line=20)
        model(d, (6 * MiB,) * 6, line=21)
    r = facts(tmp_path, two)
    assert r.models_alive.value == 2 and not r.model_held_twice.value

    def copied(sn, d):
        model(d, (4 * MiB,) * 6, line=20)
        model(d, (4 * MiB,) * 6, line=22)          # the same shapes again, built by another call
    r = facts(tmp_path, copied, "c.pickle")
    assert r.models_alive.value == 1 and r.model_held_twice.value is True

    def one(sn, d):
        model(d, (4 * MiB,) * 6, line=20)
    r = facts(tmp_path, one, "o.pickle")
    assert r.models_alive.value == 1 and r.model_held_twice.value is False


def test_a_buffer_beside_each_parameter_made_outside_torch_nn_is_not_called_a_second_model(tmp_path):
    """DeComFL: a zeroth-order estimator keeps a buffer the shape of each parameter, made in its
    own __init__ (torch.zeros_like over the parameters). Weights only by a guess, it reads the same
    as a copy of the model: whether the model is held twice is unknown, not yes; one model."""
    est = [("/home/u/proj/estimators/adam_forward.py", 168, "<listcomp>"),
           ("/home/u/proj/estimators/adam_forward.py", 167, "__init__"),
           ("/home/u/proj/main.py", 70, "setup")]

    def run(sn, d):
        w = model(d, (4 * MiB,) * 5 + (2 * MiB,), line=20)
        for n in (4 * MiB,) * 5 + (2 * MiB,):
            d.alloc(n, est, "weights")
        fwd(d)
        del w
    r = facts(tmp_path, run)
    assert r.models_alive.value == 1
    assert r.model_held_twice.value is None and r.model_held_twice.evidence == "none"
    assert "buffer beside each parameter" in r.model_held_twice.why

    def copied(sn, d):                     # the same shapes built again by torch.nn: held twice, as before
        model(d, (4 * MiB,) * 5 + (2 * MiB,), line=20)
        model(d, (4 * MiB,) * 5 + (2 * MiB,), line=22)
        fwd(d)
    r = facts(tmp_path, copied, "c.pickle")
    assert r.models_alive.value == 1 and r.model_held_twice.value is True and r.model_held_twice.evidence == "stack"


def test_flat_parameter_buffers_leave_the_number_of_models_unknown(tmp_path):
    """verl: vLLM's weights are tensors of one family, the Megatron actor's and critic's live in flat
    buffers whose shapes say nothing: one family seen is not one model."""
    flat = [(SP + "megatron/core/distributed/param_and_grad_buffer.py", 300, "__init__"),
            ("/home/u/train.py", 70, "main")]

    def run(sn, d):
        model(d, (4 * MiB,) * 6, line=20)
        d.alloc(64 * MiB, flat, "gradients")
    r = facts(tmp_path, run)
    assert r.models_alive.value is None and "flat" in r.models_alive.why


# -- what was recorded --------------------------------------------------------------------------------------
def test_a_state_only_dump_decides_nothing_about_phases(tmp_path):
    def run(sn, d):
        d.recording = False
        model(d)
    r = facts(tmp_path, run)
    assert r.recorded.value == "state_only"
    assert r.backward.value is None and r.optimizer_step.value is None and r.oom.value is None
    assert r.live_before_recording_bytes.value == 6 * 4 * MiB and r.kind.value is None


# -- the runs recorded on an H100 for these facts ------------------------------------------------------------
H100 = {
    "oom_first_forward.run.pickle": dict(oom=True, truncated_by_oom=True, backward=False, kind="forward_with_grad"),
    "forward_grad.run.pickle": dict(backward=False, kind="forward_with_grad", optimizer_step=False),
    "eval_nograd.run.pickle": dict(backward=False, kind="inference"),
    "two_models.run.pickle": dict(models_alive=2, kind="training", optimizer="AdamW"),
    "ema_copy.run.pickle": dict(models_alive=1, model_held_twice=True, kind="training"),
    "ckpt_sequential.run.pickle": dict(checkpointing=True, backward=True, kind="forward_backward"),
    "sgd_plain.run.pickle": dict(optimizer="SGD", optimizer_step=True, kind="training"),
}


@pytest.mark.parametrize("name", sorted(H100))
def test_runs_recorded_for_the_facts(name):
    r = analyze(open_snapshot(str(DATA / "facts" / name), use_cache=False)).devices[0].run
    for fact, want in H100[name].items():
        assert getattr(r, fact).value == want, (fact, getattr(r, fact))
    assert r.recorded.value == "trace" and r.live_before_recording_bytes.value == 0


# -- the facts in words: one line every surface prints ------------------------------------------------------
def test_the_run_line_says_what_is_known_marks_guesses_and_names_unknowns():
    from vramscope.present.words import run_words
    r = analyze(open_snapshot(str(DATA / "facts" / "oom_first_forward.run.pickle"), use_cache=False)).devices[0].run
    assert run_words(r.to_json()) == "forward passes with grad on and no backward; ends in an out-of-memory error"
    r = analyze(open_snapshot(str(DATA / "facts" / "ema_copy.run.pickle"), use_cache=False)).devices[0].run
    assert run_words(r.to_json()) == "training, AdamW step; a model held twice"
    unknown = {"recorded": {"value": "trace"}, "kind": {"value": None, "evidence": "none"},
               "models_alive": {"value": 2, "evidence": "guess"}}
    assert run_words(unknown) == "kind unknown (the trace cannot tell); 2 models alive (a guess)"
    assert run_words({"recorded": {"value": "state_only"}}) == "state only: what kind of run it was is unknown"


@pytest.mark.parametrize("name,want", [("Optimizer.step#Lion.step", "Lion"),
                                       ("Optimizer.step#\x1b[31mEvil<b>.step", None)])
def test_an_optimizer_annotation_that_is_not_a_class_name_names_no_optimizer(tmp_path, name, want):
    """The annotation is the file's text: escape codes or markup in it never become the optimizer."""
    def run(sn, d):
        w = model(d)
        fwd(d)
        [d.alloc(4 * MiB, backward_frames(), "gradients") for _ in w]
        sn.annotate(name, "START")
    r = facts(tmp_path, run)
    assert r.optimizer.value == want


# autocast in a small model: its weights' half sizes are also activations' sizes at some batches
@pytest.mark.parametrize("name", sorted(p.name for p in (DATA / "levers" / "dev").glob("*.pickle")))
def test_autocast_seen_at_every_batch_and_sequence_and_never_in_fp32_runs(name):
    r = analyze(open_snapshot(str(DATA / "levers" / "dev" / name), use_cache=False)).devices[0].run
    assert r.autocast.value is name.startswith("gpt2_bf16"), (name, r.autocast)


def test_a_profiler_frame_names_a_library_by_its_package_relative_path():
    """torch's profiler writes files relative to their sys.path entry: 'transformers/...' and
    'contextlib.py' are libraries, the script ('train.py', 'mypkg/model.py') is the user's."""
    from vramscope.classifiers.stacks import is_library_file
    for lib in ("transformers/models/bert/modeling_bert.py", "contextlib.py", "peft/tuners/lora/layer.py",
                "torch/nn/modules/linear.py", "/usr/lib/python3.11/site-packages/timm/layers.py"):
        assert is_library_file(lib), lib
    for user in ("train.py", "mypkg/model.py", "/home/u/transformers_utils.py", "/home/u/transformers/model.py"):
        assert not is_library_file(user), user
