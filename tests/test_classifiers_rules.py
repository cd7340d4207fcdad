"""Rules on small hand-written traces: each story is a list of (action, key, size, stack)
written as a plain, torch-layout pickle and opened with the real parser, so a rule that
stops matching a library's frames fails here with the stack in the message."""
from __future__ import annotations

import os
import pickle

import numpy as np

os.environ.setdefault("VRAMSCOPE_CACHE_DIR", "")

from vramscope.classifiers import CATEGORIES, analyze, load_rules  # noqa: E402
from vramscope.parsers import open_snapshot  # noqa: E402

SP = "/opt/venv/lib/python3.11/site-packages/"
MOD = [(SP + "torch/nn/modules/module.py", 1750, "_call_impl")]
MAIN = [("/home/u/train.py", 90, "main"), ("/home/u/train.py", 120, "<module>")]


def frames(stack):
    return [{"filename": f, "line": ln, "name": n} for f, ln, n in stack]


def build(story, pre=(), annotations=()):
    """story: [(action, key, size, stack)] with action alloc/free; key names a tensor.
    pre: [(key, size, stack)] blocks live before the trace began (never allocated in it)."""
    addr = {}
    nxt = [0x7F0000000000]
    live = {}
    trace = []
    t = 1_700_000_000_000_000

    def new_addr(size):
        a = nxt[0]
        nxt[0] += (size + 511) // 512 * 512
        return a

    for key, size, stack in pre:
        addr[key] = new_addr(size)
        live[key] = (size, stack)
    for action, key, size, stack in story:
        t += 10
        if action == "alloc":
            addr[key] = new_addr(size)
            live[key] = (size, stack)
            trace.append({"action": "alloc", "addr": addr[key], "size": size, "stream": 0, "time_us": t,
                          "frames": frames(stack)})
        else:
            size = live.pop(key)[0]
            for act in ("free_requested", "free_completed"):
                trace.append({"action": act, "addr": addr[key], "size": size, "stream": 0, "time_us": t,
                              "frames": frames(stack)})
    blocks = [{"address": addr[k], "size": (s + 511) // 512 * 512, "requested_size": s, "state": "active_allocated",
               "frames": frames(st)} for k, (s, st) in sorted(live.items(), key=lambda kv: addr[kv[0]])]
    base = 0x7F0000000000
    seg = {"device": 0, "address": base, "total_size": nxt[0] - base, "allocated_size": sum(b["size"] for b in blocks),
           "active_size": sum(b["size"] for b in blocks), "requested_size": sum(b["requested_size"] for b in blocks),
           "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
           "blocks": blocks}
    return {"segments": [seg], "device_traces": [trace], "allocator_settings": {},
            "external_annotations": list(annotations)}


def run(tmp_path, obj):
    p = tmp_path / "s.pickle"
    with open(p, "wb") as f:
        pickle.dump(obj, f, protocol=4)
    an = analyze(open_snapshot(str(p), use_cache=False), rules=load_rules(use_user_rules=False))
    return an, an.devices[0]


def cat_of(an, da, index):
    """(category, rule id) of the allocation made at trace entry `index`."""
    r = int(np.flatnonzero(da.allocs.alloc_index == index)[0])
    return CATEGORIES[da.category[r]], an.rule_names[da.rule[r]]


def entry_of(story, key):
    """Trace index of the alloc of `key` (frees take two entries)."""
    i = 0
    for action, k, _, _ in story:
        if action == "alloc":
            if k == key:
                return i
            i += 1
        else:
            i += 2
    raise KeyError(key)


def loop(step_parts, iterations=2):
    story = []
    for it in range(iterations):
        for action, key, size, stack in step_parts:
            story.append((action, f"{key}@{it}", size, stack))
    return story


# -- stories ----------------------------------------------------------------------------------
HF_FWD = [(SP + "torch/nn/modules/linear.py", 125, "forward")] + MOD + [
    (SP + "transformers/models/llama/modeling_llama.py", 300, "forward")] + MOD + [
    (SP + "transformers/trainer.py", 3800, "compute_loss"), (SP + "transformers/trainer.py", 3700, "training_step"),
    (SP + "transformers/trainer.py", 2500, "_inner_training_loop")] + MAIN
HF_INPUT = [(SP + "transformers/trainer.py", 3600, "_prepare_input"),
            (SP + "transformers/trainer.py", 3620, "_prepare_inputs"),
            (SP + "transformers/trainer.py", 3690, "training_step")] + MAIN
HF_BWD = [(SP + "torch/autograd/graph.py", 825, "_engine_run_backward"), (SP + "torch/autograd/__init__.py", 347, "backward"),
          (SP + "torch/_tensor.py", 626, "backward"), (SP + "accelerate/accelerator.py", 2200, "backward"),
          (SP + "transformers/trainer.py", 3750, "training_step")] + MAIN
HF_OPT_STATE = [(SP + "torch/optim/adamw.py", 180, "_init_group"), (SP + "torch/optim/adamw.py", 220, "step"),
                (SP + "torch/optim/optimizer.py", 487, "wrapper"), (SP + "accelerate/optimizer.py", 170, "step"),
                (SP + "transformers/trainer.py", 2600, "_inner_training_loop")] + MAIN
HF_OPT_TMP = [(SP + "torch/optim/adamw.py", 540, "_multi_tensor_adamw")] + HF_OPT_STATE[1:]
# Trainer._inner_training_loop frees the gradients with model.zero_grad() after each step
HF_ZERO = [(SP + "torch/nn/modules/module.py", 2900, "zero_grad"),
           (SP + "transformers/trainer.py", 2620, "_inner_training_loop")] + MAIN
HF_LOSS = [(SP + "torch/nn/functional.py", 3479, "cross_entropy"),
           (SP + "transformers/loss/loss_utils.py", 36, "ForCausalLMLoss")] + HF_FWD[2:]


def test_hf_trainer_step(tmp_path):
    step = [("alloc", "batch", 1 << 16, HF_INPUT), ("alloc", "act", 1 << 24, HF_FWD),
            ("alloc", "logits", 1 << 22, HF_FWD), ("alloc", "loss", 4, HF_LOSS),
            ("alloc", "gact", 1 << 24, HF_BWD), ("alloc", "grad", 1 << 20, HF_BWD),
            ("free", "gact", 0, HF_BWD), ("free", "act", 0, HF_BWD), ("free", "logits", 0, HF_BWD),
            ("alloc", "tmp", 1 << 20, HF_OPT_TMP), ("free", "tmp", 0, HF_OPT_TMP)]
    first = [("alloc", "m1", 1 << 20, HF_OPT_STATE), ("alloc", "m2", 1 << 20, HF_OPT_STATE)]
    story = loop(step[:9], 1) + first + loop(step[9:], 1) + \
        [("free", "batch@0", 0, HF_INPUT), ("free", "loss@0", 0, HF_INPUT), ("free", "grad@0", 0, HF_ZERO)] + \
        [(a, k.replace("@0", "@1"), z, st) for a, k, z, st in loop(step, 1)]
    an, da = run(tmp_path, build(story, pre=[("w", 1 << 20, [])]))
    want = {"batch@0": "inputs", "act@0": "activations", "logits@0": "activations", "loss@0": "activations",
            "gact@0": "autograd", "grad@0": "gradients", "m1": "optimizer", "tmp@0": "temporary"}
    for key, cat in want.items():
        got = cat_of(an, da, entry_of(story, key))
        assert got[0] == cat, (key, got)
    assert len(da.iterations) == 2
    assert set(da.iterations[0].phases) == {"inputs", "forward", "backward", "optimizer"}


FSDP_UNSHARD = [(SP + "torch/distributed/fsdp/_flat_param.py", 1400, "_alloc_padded_unsharded_flat_param"),
                (SP + "torch/distributed/fsdp/_flat_param.py", 1350, "unshard"),
                (SP + "torch/distributed/fsdp/_runtime_utils.py", 300, "_unshard"),
                (SP + "torch/distributed/fsdp/_runtime_utils.py", 400, "_pre_forward_unshard"),
                (SP + "torch/distributed/fsdp/_runtime_utils.py", 420, "_pre_forward"),
                (SP + "torch/distributed/fsdp/fully_sharded_data_parallel.py", 850, "forward")] + MOD + MAIN
FSDP_RS = [(SP + "torch/distributed/fsdp/_runtime_utils.py", 800, "_reduce_grad"),
           (SP + "torch/distributed/fsdp/_runtime_utils.py", 760, "_post_backward_hook")]
FWD = [(SP + "torch/nn/modules/linear.py", 125, "forward")] + MOD + [("/home/u/model.py", 40, "forward")] + MOD + MAIN


def test_fsdp_gathered_params_and_reduce_scatter(tmp_path):
    story = [("alloc", "full", 1 << 24, FSDP_UNSHARD), ("alloc", "act", 1 << 22, FWD),
             ("alloc", "rs", 1 << 22, FSDP_RS), ("free", "act", 0, []), ("free", "rs", 0, []),
             ("free", "full", 0, FSDP_UNSHARD)]
    an, da = run(tmp_path, build(story))
    assert cat_of(an, da, entry_of(story, "full"))[0] == "weights"
    assert cat_of(an, da, entry_of(story, "rs"))[0] == "gradients"
    assert cat_of(an, da, entry_of(story, "act"))[0] == "activations"


def test_windows_paths_and_user_optimizer(tmp_path):
    win = "C:\\Users\\u\\proj\\.venv\\Lib\\site-packages\\"
    fwd = [(win + "torch\\nn\\modules\\linear.py", 125, "forward"), (win + "torch\\nn\\modules\\module.py", 1750, "_call_impl"),
           ("C:\\Users\\u\\proj\\train.py", 30, "main")]
    opt = [("C:\\Users\\u\\proj\\my_optimizers.py", 80, "step"), (win + "torch\\optim\\optimizer.py", 493, "wrapper"),
           ("C:\\Users\\u\\proj\\train.py", 35, "main")]
    bwd = [(win + "torch\\_tensor.py", 626, "backward"), ("C:\\Users\\u\\proj\\train.py", 33, "main")]
    story = [("alloc", "a", 1 << 20, fwd), ("alloc", "g", 1 << 20, bwd), ("free", "a", 0, bwd),
             ("alloc", "m", 1 << 20, opt), ("alloc", "t", 1 << 20, opt), ("free", "t", 0, opt)]
    an, da = run(tmp_path, build(story, pre=[("w", 1 << 20, [])]))
    got = {k: cat_of(an, da, entry_of(story, k))[0] for k in ("a", "g", "m", "t")}
    assert got == {"a": "activations", "g": "gradients", "m": "optimizer", "t": "temporary"}
    assert da.peak.type == "optimizer_step"


def test_autograd_thread_without_frames_after_forward_is_backward(tmp_path):
    """stacks='python': the backward runs on the autograd thread and records no frames."""
    story = [("alloc", "x", 1 << 16, [("/home/u/train.py", 20, "get_batch")] + MAIN),
             ("alloc", "a1", 1 << 20, FWD), ("alloc", "a2", 1 << 20, FWD),
             ("alloc", "g1", 1 << 20, []), ("alloc", "tmp", 1 << 20, []), ("free", "tmp", 0, []),
             ("free", "a2", 0, []), ("free", "a1", 0, []),
             ("alloc", "m", 1 << 20, HF_OPT_STATE)]
    an, da = run(tmp_path, build(story))
    assert cat_of(an, da, entry_of(story, "g1"))[0] == "gradients"
    assert cat_of(an, da, entry_of(story, "tmp"))[0] == "autograd"
    assert cat_of(an, da, entry_of(story, "x"))[0] == "inputs"


def test_model_loading_before_training_and_peak_types(tmp_path):
    load = [(SP + "torch/nn/modules/module.py", 1340, "convert"), (SP + "torch/nn/modules/module.py", 900, "_apply"),
            (SP + "torch/nn/modules/module.py", 1350, "to"), ("/home/u/train.py", 10, "main")] + MAIN[1:]
    quant = [(SP + "bitsandbytes/functional.py", 1200, "quantize_4bit"),
             (SP + "bitsandbytes/nn/modules.py", 300, "_quantize"), (SP + "bitsandbytes/nn/modules.py", 330, "cuda")] + load
    story = [("alloc", "w16", 1 << 26, load), ("alloc", "q", 1 << 24, quant), ("free", "w16", 0, quant),
             ("alloc", "w", 1 << 20, load)]
    an, da = run(tmp_path, build(story))
    assert cat_of(an, da, entry_of(story, "q"))[0] == "quantization"
    assert cat_of(an, da, entry_of(story, "w"))[0] == "weights"
    # the 16-bit weight the quantizer packs and frees is the weight in transit, not scratch:
    # the quantization peak (type A) is made of it
    assert cat_of(an, da, entry_of(story, "w16")) == ("weights", "weights.quantization_staging")
    assert da.allocation(int(np.flatnonzero(da.allocs.alloc_index == entry_of(story, "w16"))[0])).evidence == "stack"
    assert da.peak.type == "quantization"
    assert da.iterations == ()
