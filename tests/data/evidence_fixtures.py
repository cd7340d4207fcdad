"""Fixtures for how sure an answer is (issue "Evidence before answers"): the cases real
snapshots from public runs got wrong, rebuilt in torch's exact layout with make_fixtures'
allocator simulator. make_fixtures.py lists them with its own (FIXTURES), so `--check`,
expected.json and every test that walks tests/data cover them.

  state_only_noframes.pickle   an OOM dump of a large model with history off: blocks only,
                               no trace, no frames anywhere
  adamw_from_start.pickle      a small LM's full AdamW training recorded from before the
                               model was built: weights, gradients, moments all by their stacks
  adamw_after_step1.pickle     the same run recorded after its first step: weights, the
                               previous step's gradients and AdamW's moments live before the
                               trace, no frames
  validation_churn.pickle      an fp16 validation loop (forward only) whose attention scores
                               are freed one to two steps later: churn, never a leak
  zeroth_order.pickle          MeZO-style zeroth-order fine-tuning: a deepcopy of the model,
                               per-parameter noise and new parameter data before every forward
  forward_only_loop.pickle     a Linear called in a 3-step loop, no backward, stacks='all':
                               dropping each output frees its graph (C++ frames of a shared
                               pointer's disposal of AccumulateGrad)

Each function returns (Snap, info) like make_fixtures' own; `expect` holds what the tests
check (tests/test_evidence.py).
"""
from __future__ import annotations

from make_fixtures import CPP_EMPTY, CPP_FREE, CPP_MALLOC, CPP_PY, GiB, MiB, LMStep, Snap, call, lm_param_sizes, module_call


# -- an OOM dump with history off --------------------------------------------------------------
def fx_state_only_noframes():
    """A weather model's OOM dump written from an OOM handler with history never turned on:
    155 blocks (36 GiB), no trace entries, no frames on any block or segment."""
    sn = Snap((2, 5), t0=1_740_000_000_000_000, context="all")
    d = sn.device(0, base=0x7A00_0000_0000)
    d.recording = False
    sizes = []
    for layer in range(24):                                      # a transformer-like backbone, fp32
        sizes += [3 * 1024 * 1024 * 4, 1024 * 1024 * 4, 4 * 1024 * 1024 * 4, 4 * 1024 * 1024 * 4]
    sizes += [2048 * 4] * 40 + [64 * MiB] * 10 + [1536 * MiB] * 8 + [2304 * MiB] * 8 + [256 * MiB] + [1 * GiB]
    for n in sizes:
        d.alloc(n, (), "unknown")
    info = {"what": "an OOM dump of a large model with history off: %d blocks, no trace, no frames" % len(sizes),
            "layout": "torch 2.5, device_traces [[]], every frames list empty",
            "expect": {"blocks": len(sizes), "bytes": sum(sizes)}}
    return sn, info


# -- AdamW, recorded from the start and after the first step ----------------------------------
_SP = "/home/student/.venv/lib/python3.11/site-packages/"
_TR = "/home/student/a2/train.py"
_MD = "/home/student/a2/model.py"


def _adamw_run(after_step1: bool):
    sn = Snap((2, 6), t0=1_745_000_000_000_000 + (7 if after_step1 else 0), context="all")
    d = sn.device(0, base=0x7B00_0000_0000)
    C, L, V = 256, 4, 8192
    sizes = lm_param_sizes(C, L, V)
    main = [(_TR, 140, "main"), (_TR, 160, "<module>")]
    build = call((_SP + "torch/nn/modules/module.py", 1340, "convert"), (_SP + "torch/nn/modules/module.py", 900, "_apply"),
                 (_SP + "torch/nn/modules/module.py", 1355, "to"), (_TR, 120, "main"), main[1:])
    if after_step1:
        d.recording = False
    params = [(d.alloc(n, build, "weights"), n) for n in sizes]
    lm = LMStep(sn, d, _SP, _MD, C, L, V, params)
    steps = 3
    start_step = 0
    tok = 4 * 256
    if after_step1:
        # step 1 ran with history off: its gradients and AdamW's moments stay behind
        st = lm.forward(tok, [(_TR, 88, "train_step")] + main, [(_TR, 89, "train_step")] + main)
        g = lm.backward_start(st, [(_TR, 90, "train_step")] + main)
        lm.backward_rest(st, g)
        lm.optimizer_step([(_TR, 91, "train_step")] + main)
        for k in ("loss", "logits"):
            d.free(st[k], call((_TR, 92, "train_step"), main))
        d.start_recording()
        start_step = 1
    for _ in range(start_step, steps):
        lm.zero_grad([(_TR, 86, "train_step")] + main)
        x = d.alloc(tok * 8, call((_TR, 84, "get_batch"), (_TR, 87, "train_step"), main), "inputs")
        st = lm.forward(tok, [(_TR, 88, "train_step")] + main, [(_TR, 89, "train_step")] + main)
        g = lm.backward_start(st, [(_TR, 90, "train_step")] + main)
        lm.backward_rest(st, g)
        lm.optimizer_step([(_TR, 91, "train_step")] + main)
        d.free(st["loss"], call((_TR, 92, "train_step"), main))
        d.free(st["logits"], call((_TR, 92, "train_step"), main))
        d.free(x, call((_TR, 92, "train_step"), main))
        sn.tick(200_000)
    what = ("a small LM's full AdamW training " +
            ("recorded after its first step (weights, gradients and moments from before the trace, no frames)"
             if after_step1 else "recorded from before the model was built"))
    info = {"what": what, "layout": "torch 2.6; stacks='python', context='all'",
            "expect": {"param_bytes": sum(sizes), "params": sum(sizes) // 4, "tensors": len(sizes)}}
    return sn, info


def fx_adamw_from_start():
    return _adamw_run(False)


def fx_adamw_after_step1():
    return _adamw_run(True)


# -- an fp16 validation loop with churn ----------------------------------------------------------
def fx_validation_churn():
    """LLaMA-style fp16 evaluation (forward only, no_grad), 8 steps. The attention scores of
    each step (256 MiB at modeling_llama.py:422) are kept by a lagging callback and freed one
    or two steps later: at some iteration ends two are live, at others one, none at the end."""
    sn = Snap((2, 4), t0=1_742_000_000_000_000, context="all")
    d = sn.device(0, base=0x7C00_0000_0000)
    SP = "/opt/conda/lib/python3.10/site-packages/"
    LL = SP + "transformers/models/llama/modeling_llama.py"
    EV = "/workspace/eval_llama.py"
    M = module_call(SP)
    d.recording = False
    for _ in range(12):
        d.alloc(96 * MiB, (), "weights")
    d.start_recording()
    main = [(EV, 70, "evaluate"), (EV, 99, "<module>")]
    held = []
    frees = 0
    for step in range(8):
        ids = d.alloc(4 * 2048 * 8, call((EV, 61, "evaluate"), main), "inputs")
        model = [(LL, 1190, "forward"), M, (EV, 63, "evaluate")] + main
        h = d.alloc(4 * 2048 * 4096 * 2, call((SP + "torch/nn/modules/sparse.py", 190, "forward"), M,
                                              [(LL, 884, "forward"), M] + model), "activations")
        for layer in range(6):
            blk = [(LL, 640, "forward"), M, (LL, 950, "forward"), M] + model
            attn = [(LL, 422, "forward"), M] + blk
            scores = d.alloc(256 * MiB, call((SP + "torch/nn/functional.py", 1890, "softmax"), attn), "activations")
            o = d.alloc(4 * 2048 * 4096 * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, attn),
                        "activations")
            if layer == 5:
                held.append(scores)                 # kept by the step's callback
            else:
                d.free(scores, call((LL, 423, "forward"), M, blk))
            d.free(h, call((LL, 652, "forward"), M, blk))
            h = o
        logits = d.alloc(4 * 2048 * 32000 * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M,
                                                    [(LL, 1200, "forward"), M] + model), "activations")
        d.free(h, call((EV, 64, "evaluate"), main))
        d.free(logits, call((EV, 66, "evaluate"), main))
        d.free(ids, call((EV, 66, "evaluate"), main))
        # the callback lets go of the scores of one or two steps ago, alternately
        keep = 1 if step % 2 == 0 else 0
        while len(held) > keep + 1:
            d.free(held.pop(0), call((EV, 67, "evaluate"), main))
            frees += 1
        sn.tick(300_000)
    for a in held:
        d.free(a, call((EV, 72, "evaluate"), main))
    info = {"what": "an fp16 validation loop whose attention scores (256 MiB at modeling_llama.py:422) are freed "
                    "one or two steps later: churn, not a leak; nothing of it is live at the end",
            "layout": "torch 2.4; stacks='python', context='all'",
            "expect": {"iterations": 8, "site": [LL, 422, "forward"], "leaks": []}}
    return sn, info


# -- zeroth-order fine-tuning (MeZO) -----------------------------------------------------------
def fx_zeroth_order():
    """MeZO: the model copied with copy.deepcopy (a reference), then every step perturbs
    each parameter in place of its data (noise z, new data) before each of two forwards, and
    updates it the same way: one tensor per parameter, outside the model, never a batch."""
    sn = Snap((2, 6), t0=1_746_000_000_000_000, context="all")
    d = sn.device(0, base=0x7D00_0000_0000)
    SP = "/usr/lib/python3/dist-packages/"
    TR = "/home/zo/mezo/trainer.py"
    RUN = "/home/zo/mezo/run.py"
    M = module_call(SP)
    sizes = [2048 * 2048 * 2] * 8 + [2048 * 8192 * 2] * 4 + [8192 * 2048 * 2] * 4 + [32000 * 2048 * 2]
    d.recording = False
    data = [d.alloc(n, (), "weights") for n in sizes]
    d.start_recording()
    top = [(TR, 900, "_inner_training_loop"), (SP + "transformers/trainer.py", 1540, "train"), (RUN, 300, "main"),
           (RUN, 330, "<module>")]
    copy_stack = call((SP + "torch/nn/parameter.py", 57, "__deepcopy__"), ("/usr/lib/python3.10/copy.py", 153, "deepcopy"),
                      ("/usr/lib/python3.10/copy.py", 231, "_deepcopy_dict"), ("/usr/lib/python3.10/copy.py", 146, "deepcopy"),
                      ("/usr/lib/python3.10/copy.py", 271, "_reconstruct"), ("/usr/lib/python3.10/copy.py", 172, "deepcopy"),
                      (TR, 610, "__init__"), (RUN, 290, "main"), (RUN, 330, "<module>"))
    ref = [d.alloc(n, copy_stack, "weights") for n in sizes]
    perturb = [(TR, 721, "zo_perturb_parameters"), (TR, 760, "zo_step")] + top
    update = [(TR, 801, "zo_update")] + top

    def rewrite(stack_z, stack_new, stack_free):
        for k, n in enumerate(sizes):
            z = d.alloc(n, call(stack_z), "temporary")
            new = d.alloc(n, call(stack_new), "weights")
            d.free(data[k], call(stack_free))
            data[k] = new
            d.free(z, call(stack_free))

    for step in range(3):
        ids = d.alloc(16 * 512 * 8, call((TR, 740, "_prepare_inputs"), (TR, 758, "zo_step"), top), "inputs")
        for scale_line in (722, 723, 724):
            rewrite([(TR, 719, "zo_perturb_parameters")] + perturb[1:], [(TR, scale_line, "zo_perturb_parameters")] + perturb[1:],
                    [(TR, scale_line, "zo_perturb_parameters")] + perturb[1:])
            if scale_line == 724:
                break
            model = [(SP + "transformers/models/opt/modeling_opt.py", 1000, "forward"), M,
                     (TR, 705, "zo_forward"), (TR, 762, "zo_step")] + top
            acts = [d.alloc(16 * 512 * 2048 * 2, call((SP + "torch/nn/modules/linear.py", 125, "forward"), M, model),
                            "activations") for _ in range(6)]
            loss = d.alloc(4, call((SP + "torch/nn/functional.py", 3479, "cross_entropy"), model), "activations")
            for a in acts:
                d.free(a, call((TR, 706, "zo_forward"), (TR, 762, "zo_step"), top))
            d.free(loss, call((TR, 707, "zo_forward"), (TR, 762, "zo_step"), top))
        rewrite([(TR, 799, "zo_update")] + update[1:], [(TR, 803, "zo_update")] + update[1:],
                [(TR, 803, "zo_update")] + update[1:])
        d.free(ids, call((TR, 770, "zo_step"), top))
        sn.tick(400_000)
    info = {"what": "MeZO zeroth-order fine-tuning: a deepcopy of the model, per-parameter noise and new parameter "
                    "data around every forward; no backward, no optimizer",
            "layout": "torch 2.6; stacks='python', context='all'",
            "expect": {"param_bytes": sum(sizes), "tensors": len(sizes), "batch_bytes": 16 * 512 * 8}}
    return sn, info


# -- a forward-only loop, stacks='all' ---------------------------------------------------------
def fx_forward_only_loop():
    """`y = model(x)` three times at the script's top level, no backward. Dropping the
    previous y frees its graph: the free's C++ frames include the shared pointer's disposal
    of the weight's AccumulateGrad node, which is not backward."""
    sn = Snap((2, 6), t0=1_747_000_000_000_000, context="all")
    d = sn.device(0, base=0x7E00_0000_0000)
    SP = "/home/u/.venv/lib/python3.12/site-packages/"
    SC = "/home/u/fwd.py"
    M = module_call(SP)

    def cpp(stack, kind="malloc", extra=()):
        base = CPP_MALLOC if kind == "malloc" else CPP_FREE
        return call(base, list(extra), CPP_EMPTY if kind == "malloc" else [], CPP_PY, stack)

    build = [(SP + "torch/nn/modules/linear.py", 106, "__init__"), (SC, 5, "<module>")]
    w = d.alloc(4096 * 4096 * 4, cpp(build), "weights")
    b = d.alloc(4096 * 4, cpp(build), "weights")
    x = d.alloc(64 * 4096 * 4, cpp([(SC, 6, "<module>")]), "inputs")
    dispose = [("??", 0, "torch::autograd::AccumulateGrad::~AccumulateGrad()"),
               ("??", 0, "std::_Sp_counted_ptr_inplace<torch::autograd::AccumulateGrad, std::allocator<void>, "
                         "(__gnu_cxx::_Lock_policy)2>::_M_dispose()"),
               ("??", 0, "torch::autograd::deleteNode(torch::autograd::Node*)"),
               ("??", 0, "c10::TensorImpl::release_resources()"),
               ("??", 0, "THPVariable_subclass_dealloc(_object*)")]
    y = None
    for step in range(3):
        fwd = [(SP + "torch/nn/modules/linear.py", 125, "forward"), M, (SC, 9, "<module>")]
        new = d.alloc(64 * 4096 * 4, cpp(fwd, extra=[("??", 0, "at::native::addmm_out_cuda(...)")]), "activations")
        if y is not None:
            d.free(y, cpp([(SC, 9, "<module>")], "free", dispose))
        y = new
        s = d.alloc(4, cpp([(SC, 10, "<module>")]), "temporary")
        d.free(s, cpp([(SC, 11, "<module>")], "free"))
        sn.tick(50_000)
    info = {"what": "a Linear called in a 3-step loop, no backward; dropping each output frees its graph "
                    "(C++ frames of AccumulateGrad's disposal)",
            "layout": "torch 2.6; stacks='all', context='all'",
            "expect": {"iterations": 3}}
    return sn, info


FIXTURES = [
    ("state_only_noframes.pickle", fx_state_only_noframes),
    ("adamw_from_start.pickle", fx_adamw_from_start),
    ("adamw_after_step1.pickle", fx_adamw_after_step1),
    ("validation_churn.pickle", fx_validation_churn),
    ("zeroth_order.pickle", fx_zeroth_order),
    ("forward_only_loop.pickle", fx_forward_only_loop),
]

__all__ = ["FIXTURES"]
