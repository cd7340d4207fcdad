"""Record small, real CPU training runs through torch's memory profiler.

Each run is profiled with

    torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                           record_shapes=True, with_stack=True)

and converted with ``torch.cuda._memory_viz._profile_to_snapshot`` into the
memory-snapshot layout (the same converter torch's ``profile_plot`` uses).  The
memory profiler tags every allocation with a category (parameter,
optimizer_state, gradient, activation, autograd_detail, temporary, input,
unknown).  Those categories are the ground truth for vramscope's classifier:

* ``<run>.pickle``       the converted snapshot with ``category`` removed from
                         every trace entry (what the classifier sees), written
                         with ``pickle.dump(snapshot, f)`` like ``_dump_snapshot``.
* ``<run>.truth.json``   torch's categories, one per entry of
                         ``device_traces[device]`` (null for non-alloc entries),
                         plus metadata: iterations and phases as trace-index
                         ranges, expected leak, byte totals per category.
* ``transformer_adamw.with_category.pickle``  the converted snapshot untouched
                         (``category`` kept), for the parser test.

Regenerate with ``python tests/groundtruth/record_runs.py`` (optionally a list of
run names).  Everything runs on the CPU in a few seconds per run; addresses and
the ``<built-in method ... at 0x...>`` frame names differ between
regenerations, the categories and event structure do not (fixed seeds).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import math
import os
import pickle
import platform
import re
import sys
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

HERE = os.path.dirname(os.path.abspath(__file__))

# record_function names used to mark iterations and phases; they never reach
# the converted snapshot (it only keeps Python frames), they are read back from
# the profiler's op tree to turn time ranges into trace-index ranges.
MARK_PREFIX = "vramscope_gt::"
PHASES = ("forward", "backward", "optimizer", "inputs")

CATEGORIES = (
    "parameter",
    "optimizer_state",
    "gradient",
    "activation",
    "autograd_detail",
    "temporary",
    "input",
    "unknown",
)


# --------------------------------------------------------------------------
# markers
# --------------------------------------------------------------------------
def iteration(i: int):
    return record_function(f"{MARK_PREFIX}iteration_{i}")


def phase(name: str, micro: int | None = None):
    suffix = f"#{micro}" if micro is not None else ""
    return record_function(f"{MARK_PREFIX}{name}{suffix}")


# --------------------------------------------------------------------------
# models (plain torch, built from configs; nothing is downloaded)
# --------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d_in=256, d_hidden=512, d_out=10, n_hidden=3):
        super().__init__()
        layers: list[nn.Module] = []
        d = d_in
        for _ in range(n_hidden):
            layers += [nn.Linear(d, d_hidden), nn.GELU()]
            d = d_hidden
        layers.append(nn.Linear(d, d_out))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, max_len):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).split(c, dim=-1)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff, bias=False)
        self.out = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, max_len):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, bias=False)
        self.attn = CausalSelfAttention(d_model, n_heads, max_len)
        self.ln2 = nn.LayerNorm(d_model, bias=False)
        self.mlp = FeedForward(d_model, d_ff)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class TinyLM(nn.Module):
    """Decoder-only transformer LM: token+position embeddings, pre-LN blocks,
    final LayerNorm, LM head.  No biases (as in most current LLMs), which also
    keeps the number of parameters, and so of optimizer-step events, small."""

    def __init__(self, vocab=512, d_model=128, n_heads=4, n_layers=2, d_ff=512,
                 max_len=64, checkpointing=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, d_ff, max_len) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.checkpointing = checkpointing

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            if self.checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.head(self.ln_f(x))


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update B @ A (scaled)."""

    def __init__(self, base: nn.Linear, rank=8, alpha=16):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


def add_lora(model: TinyLM, rank=8, targets=("qkv", "proj")) -> TinyLM:
    for p in model.parameters():
        p.requires_grad_(False)
    for blk in model.blocks:
        for name in targets:
            setattr(blk.attn, name, LoRALinear(getattr(blk.attn, name), rank))
    return model


LM_CFG = dict(vocab=512, d_model=128, n_heads=4, n_layers=2, d_ff=512, max_len=64)
LM_BATCH, LM_SEQ = 8, 64
MLP_BATCH, MLP_IN, MLP_OUT = 64, 256, 10


def adamw(params, **kw):
    """AdamW as it runs on a GPU. On CUDA tensors torch.optim defaults to the foreach
    implementation; on CPU tensors it falls back to the single-tensor loop. The runs
    here are recorded on the CPU but stand for GPU training, so they ask for foreach
    explicitly: the same ops (`_foreach_sqrt`, `_foreach_addcdiv_`, ...) and the same
    allocation pattern a CUDA snapshot of `AdamW(...)` shows. `mlp_adamw_single_tensor`
    keeps the CPU default for comparison (see tests/groundtruth/README.md)."""
    kw.setdefault("foreach", True)
    return torch.optim.AdamW(params, lr=1e-3, **kw)


def lm_batch(cfg=LM_CFG):
    with phase("inputs"):
        idx = torch.randint(0, cfg["vocab"], (LM_BATCH, LM_SEQ + 1))
        x = idx[:, :-1].contiguous()
        y = idx[:, 1:].contiguous()
    return x, y


def mlp_batch():
    with phase("inputs"):
        x = torch.randn(MLP_BATCH, MLP_IN)
        y = torch.randint(0, MLP_OUT, (MLP_BATCH,))
    return x, y


def lm_loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))


def mlp_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def standard_step(model, opt, batch_fn, loss_fn, i):
    """One ordinary training iteration with phase markers."""
    with iteration(i):
        x, y = batch_fn()
        with phase("forward"):
            loss = loss_fn(model, x, y)
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    return loss.item()


# --------------------------------------------------------------------------
# the runs.  Each returns (train_fn, meta); train_fn is what gets profiled.
# Model and optimizer are built before profiling, so parameters are
# preexisting (live at the end, never allocated in the trace) and optimizer
# state is created lazily on the first step inside the trace.
# --------------------------------------------------------------------------
def run_mlp_adamw(iters=4):
    torch.manual_seed(0)
    model = MLP()
    opt = adamw(model.parameters())

    def train():
        for i in range(iters):
            standard_step(model, opt, mlp_batch, mlp_loss, i)

    return train, dict(
        description="MLP 256-512-512-512-10 (Linear+GELU), AdamW, batch 64.",
        iterations=iters, expected_leak=False)


def run_mlp_adamw_single_tensor(iters=4):
    torch.manual_seed(0)
    model = MLP()
    opt = adamw(model.parameters(), foreach=False)

    def train():
        for i in range(iters):
            standard_step(model, opt, mlp_batch, mlp_loss, i)

    return train, dict(
        description=("mlp_adamw with AdamW's single-tensor implementation (the CPU "
                     "default, foreach=False): one sqrt and one division per parameter, "
                     "which torch's memory profiler tags parameter and activation."),
        iterations=iters, expected_leak=False, adam_single_tensor=True)


def run_transformer_adamw(iters=4):
    torch.manual_seed(0)
    model = TinyLM(**LM_CFG)
    opt = adamw(model.parameters())

    def train():
        for i in range(iters):
            standard_step(model, opt, lm_batch, lm_loss, i)

    return train, dict(
        description=("Tiny decoder-only transformer LM in plain torch (vocab 512, "
                     "d_model 128, 4 heads, 2 blocks, d_ff 512, seq 64, batch 8), "
                     "cross-entropy, AdamW."),
        iterations=iters, expected_leak=False)


def run_lora(iters=4):
    torch.manual_seed(0)
    model = add_lora(TinyLM(**LM_CFG), rank=8)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = adamw(trainable)

    def train():
        for i in range(iters):
            standard_step(model, opt, lm_batch, lm_loss, i)

    n_tr = sum(p.numel() for p in trainable)
    n_all = sum(p.numel() for p in model.parameters())
    return train, dict(
        description=("TinyLM with all base weights frozen and rank-8 LoRA adapters "
                     "(A, B) on the attention qkv and proj Linears; only adapters "
                     f"require grad ({n_tr} of {n_all} parameters); AdamW on the "
                     "adapters."),
        iterations=iters, expected_leak=False,
        trainable_params=n_tr, total_params=n_all)


def run_checkpointing(iters=3):
    torch.manual_seed(0)
    model = TinyLM(**LM_CFG, checkpointing=True)
    opt = adamw(model.parameters())

    def train():
        for i in range(iters):
            standard_step(model, opt, lm_batch, lm_loss, i)

    return train, dict(
        description=("TinyLM with torch.utils.checkpoint.checkpoint(block, x, "
                     "use_reentrant=False) around each block (activations "
                     "recomputed during backward), AdamW."),
        iterations=iters, expected_leak=False)


def run_sgd_accum(iters=4, micro=2):
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)  # GPU default, see adamw()

    def train():
        for i in range(iters):
            with iteration(i):
                for m in range(micro):
                    x, y = mlp_batch()
                    with phase("forward", m):
                        loss = mlp_loss(model, x, y) / micro
                    with phase("backward", m):
                        loss.backward()
                with phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)

    return train, dict(
        description=(f"MLP, SGD(momentum=0.9), gradient accumulation over {micro} "
                     "micro-batches per optimizer step (gradients created in the "
                     "first micro-batch's backward, accumulated in the second)."),
        iterations=iters, micro_batches=micro, expected_leak=False)


def run_bf16_autocast(iters=3):
    torch.manual_seed(0)
    model = TinyLM(**LM_CFG)
    opt = adamw(model.parameters())

    def loss_fn(model, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))

    def train():
        for i in range(iters):
            standard_step(model, opt, lm_batch, loss_fn, i)

    return train, dict(
        description=("TinyLM forward under torch.autocast('cpu', dtype=torch.bfloat16) "
                     "(fp32 master parameters, bf16 weight copies cast per forward, "
                     "bf16 activations), fp32 loss, AdamW."),
        iterations=iters, expected_leak=False)


def train_leaky(model, opt, iters, history):
    """Keeps every (logits, loss) in `history` without .detach(): the logits
    tensor of each iteration (and the loss with its autograd graph) stay alive."""
    for i in range(iters):
        with iteration(i):
            x, y = lm_batch()
            with phase("forward"):
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
            history.append((logits, loss))  # the leak: no .detach() / .item()
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)


def run_leak(iters=4):
    torch.manual_seed(0)
    model = TinyLM(**LM_CFG)
    opt = adamw(model.parameters())
    history: list = []

    def train():
        train_leaky(model, opt, iters, history)

    return train, dict(
        description=("TinyLM + AdamW, but every iteration appends (logits, loss) to a "
                     "Python list without .detach(). backward() still frees the saved "
                     "activations, but each iteration's logits (batch 8 x seq 64 x "
                     "vocab 512 fp32 = 1 MiB) and loss stay alive with their graph: "
                     "live memory grows by about 1 MiB per iteration."),
        iterations=iters, expected_leak=True,
        leak=dict(file="tests/groundtruth/record_runs.py",
                  file_basename="record_runs.py",
                  function="train_leaky",
                  kept_by="history.append((logits, loss))",
                  leaked_bytes_per_iteration_approx=LM_BATCH * LM_SEQ * LM_CFG["vocab"] * 4,
                  note=("the leaked allocations' stacks contain the frame "
                        "'<path>/record_runs.py(N): train_leaky' where N is the def line "
                        "of train_leaky: the profiler records the function's first "
                        "line, not the executing line")))


def train_retain(model, opt, iters, keep):
    for i in range(iters):
        with iteration(i):
            x, y = mlp_batch()
            with phase("forward"):
                loss = mlp_loss(model, x, y)
            with phase("backward"):
                loss.backward(retain_graph=True)
            keep["loss"] = loss  # reference keeps the retained graph alive
            with phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)


def run_retain_graph(iters=4):
    torch.manual_seed(0)
    model = MLP()
    opt = adamw(model.parameters())
    keep: dict = {}

    def train():
        train_retain(model, opt, iters, keep)

    return train, dict(
        description=("MLP + AdamW with loss.backward(retain_graph=True) each "
                     "iteration while a reference to the latest loss is kept: the "
                     "saved activations of iteration k outlive its backward and "
                     "are freed only when iteration k+1 replaces the reference.  "
                     "Live memory stays higher than mlp_adamw by about one graph "
                     "but does not grow without bound."),
        iterations=iters, expected_leak=False, retained_graph=True,
        retain=dict(function="train_retain", file_basename=os.path.basename(__file__)))


# --------------------------------------------------------------------------
# compare: the same LoRA fine-tuning run in three variants (issue 15).  One code
# path for all three (train_ft, lm_batch_of, lm_loss, TinyLM, LoRALinear), so the
# user frames (record_runs.py functions) match across the three files; only the
# micro-batch size and the checkpointing flag differ.
# --------------------------------------------------------------------------
FT_CFG = dict(vocab=512, d_model=128, n_heads=4, n_layers=2, d_ff=512, max_len=128)
FT_SEQ = 128
FT_MICRO_BATCH = 4
FT_ITERS = 2


def lm_batch_of(batch, seq, cfg):
    with phase("inputs"):
        idx = torch.randint(0, cfg["vocab"], (batch, seq + 1))
        x = idx[:, :-1].contiguous()
        y = idx[:, 1:].contiguous()
    return x, y


def train_ft(model, opt, iters, batch, seq, cfg):
    for i in range(iters):
        with iteration(i):
            x, y = lm_batch_of(batch, seq, cfg)
            with phase("forward"):
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)


def _ft_run(micro_batch, checkpointing, iters=FT_ITERS):
    torch.manual_seed(0)
    model = add_lora(TinyLM(**FT_CFG, checkpointing=checkpointing), rank=8, targets=("qkv",))
    trainable = [p for p in model.parameters() if p.requires_grad]
    # fused AdamW (one kernel per step, e.g. HF Trainer's adamw_torch_fused): the
    # optimizer adds only its state and version bumps, which keeps the files small
    opt = torch.optim.AdamW(trainable, lr=1e-3, fused=True)
    # a partial, not a closure: one frame less in every stack (frames are most of the bytes)
    train = functools.partial(train_ft, model, opt, iters, micro_batch, FT_SEQ, FT_CFG)

    n_tr = sum(p.numel() for p in trainable)
    n_all = sum(p.numel() for p in model.parameters())
    variant = ("ft_checkpointing" if checkpointing else
               "ft_batch2x" if micro_batch != FT_MICRO_BATCH else "ft_base")
    return train, dict(
        description=(f"{variant}: LoRA fine-tuning of TinyLM (vocab 512, d_model 128, 4 heads, "
                     f"2 blocks, d_ff 512, seq {FT_SEQ}), rank-8 adapters on the attention qkv "
                     f"Linears, fused AdamW on the adapters, micro-batch {micro_batch}"
                     + (", torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) "
                        "on every transformer block" if checkpointing else "")
                     + ". One of the three compare runs ft_base / ft_checkpointing / ft_batch2x "
                       "(same code path, same seed)."),
        iterations=iters, expected_leak=False,
        compare=dict(group="ft", variant=variant, runs=["ft_base", "ft_checkpointing", "ft_batch2x"],
                     micro_batch_size=micro_batch, seq_len=FT_SEQ, checkpointing=checkpointing,
                     lora_rank=8, lora_targets=["qkv"], optimizer="AdamW(fused=True)",
                     model=dict(FT_CFG)),
        micro_batch_size=micro_batch, checkpointing=checkpointing,
        trainable_params=n_tr, total_params=n_all, peak_breakdown=True)


def run_ft_base():
    return _ft_run(FT_MICRO_BATCH, False)


def run_ft_checkpointing():
    return _ft_run(FT_MICRO_BATCH, True)


def run_ft_batch2x():
    return _ft_run(2 * FT_MICRO_BATCH, False)


# --------------------------------------------------------------------------
# custom code (issue 13): attention and softmax written with plain tensor ops,
# parameters as plain tensors (no nn.Module, no nn.Parameter).
# --------------------------------------------------------------------------
CA_VOCAB, CA_D, CA_HEADS, CA_SEQ, CA_BATCH = 256, 64, 4, 64, 8


def my_softmax(x):
    m = x.amax(dim=-1, keepdim=True)
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)


def my_attention(x, wq, wk, wv, wo, mask):
    b, t, c = x.shape
    h = CA_HEADS
    q = (x @ wq).view(b, t, h, c // h).transpose(1, 2)
    k = (x @ wk).view(b, t, h, c // h).transpose(1, 2)
    v = (x @ wv).view(b, t, h, c // h).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // h) + mask[:t, :t]
    y = my_softmax(scores) @ v
    return y.transpose(1, 2).reshape(b, t, c) @ wo


def custom_forward(params, idx, mask):
    x = params["emb"][idx]
    x = x + my_attention(x, params["wq"], params["wk"], params["wv"], params["wo"], mask)
    x = x + torch.relu(x @ params["w1"]) @ params["w2"]
    return x @ params["head"]


def custom_params():
    def p(*shape):
        return (torch.randn(*shape) * 0.02).requires_grad_()
    return {"emb": p(CA_VOCAB, CA_D), "wq": p(CA_D, CA_D), "wk": p(CA_D, CA_D),
            "wv": p(CA_D, CA_D), "wo": p(CA_D, CA_D), "w1": p(CA_D, 4 * CA_D),
            "w2": p(4 * CA_D, CA_D), "head": p(CA_D, CA_VOCAB)}


def train_custom(params, mask, opt, iters):
    for i in range(iters):
        with iteration(i):
            with phase("inputs"):
                idx = torch.randint(0, CA_VOCAB, (CA_BATCH, CA_SEQ + 1))
                x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
            with phase("forward"):
                logits = custom_forward(params, x, mask)
                loss = F.cross_entropy(logits.reshape(-1, CA_VOCAB), y.reshape(-1))
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)


def run_custom_attention(iters=3):
    torch.manual_seed(0)
    params = custom_params()
    mask = torch.full((CA_SEQ, CA_SEQ), float("-inf")).triu(1)
    opt = adamw(list(params.values()))

    train = functools.partial(train_custom, params, mask, opt, iters)

    n = sum(p.numel() for p in params.values())
    return train, dict(
        description=("Custom code: a one-block causal LM whose softmax (my_softmax: amax, exp, "
                     "sum, divide) and attention (my_attention: q/k/v/o matmuls with plain "
                     "weight tensors, scaled scores + additive causal mask) are written with "
                     "plain tensor ops; parameters are plain tensors with requires_grad (no "
                     "nn.Module, no nn.Parameter), a ReLU MLP, cross-entropy, AdamW "
                     f"(foreach). vocab {CA_VOCAB}, d {CA_D}, {CA_HEADS} heads, seq {CA_SEQ}, "
                     f"batch {CA_BATCH}."),
        iterations=iters, expected_leak=False, trainable_params=n, total_params=n,
        peak_breakdown=True,
        custom_code=dict(file_basename=os.path.basename(__file__),
                         functions=["my_softmax", "my_attention", "custom_forward", "train_custom"]))


RUNS: dict[str, Callable[[], tuple[Callable[[], None], dict]]] = {
    "mlp_adamw": run_mlp_adamw,
    "mlp_adamw_single_tensor": run_mlp_adamw_single_tensor,
    "transformer_adamw": run_transformer_adamw,
    "lora": run_lora,
    "checkpointing": run_checkpointing,
    "sgd_accum": run_sgd_accum,
    "bf16_autocast": run_bf16_autocast,
    "leak": run_leak,
    "retain_graph": run_retain_graph,
    "ft_base": run_ft_base,
    "ft_checkpointing": run_ft_checkpointing,
    "ft_batch2x": run_ft_batch2x,
    "custom_attention": run_custom_attention,
}
WITH_CATEGORY = {"transformer_adamw"}


# --------------------------------------------------------------------------
# profiling and conversion
# --------------------------------------------------------------------------
def profile_train(train: Callable[[], None]):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 record_shapes=True, with_stack=True) as prof:
        train()
    return prof


class _CachedProfile:
    """Hands one MemoryProfile to _profile_to_snapshot so that we can read the
    same timeline (times) and op tree (markers) it was built from."""

    def __init__(self, memory_profile):
        self._mp = memory_profile

    def _memory_profile(self):
        return self._mp


def convert(prof):
    """Returns (snapshot, device, entry_times_ns, version_bump_alloc_indices,
    marks, end_blocks, preexisting, meta)."""
    from torch.cuda._memory_viz import _profile_to_snapshot
    from torch.profiler._memory_profiler import Action, TensorKey

    mp = prof._memory_profile()
    snapshot = _profile_to_snapshot(_CachedProfile(mp))
    device = torch.cuda.device_count()  # CPU allocations land at index device_count

    # Replay the timeline exactly as _profile_to_snapshot walks it to get the
    # time of every trace entry (the converted entries carry no time) and the
    # category of every block live at the end (preexisting ones included).
    times: list[int] = []
    bumps: list[int] = []
    live: dict = {}  # (key, version) -> (addr, size, category, alloc index or -1)
    preexisting: list[dict] = []  # tensors live when profiling started

    def cat_of(key, version):
        c = mp._categories.get(key, version)
        return c.name.lower() if c is not None else "unknown"

    dropped = collections.Counter()  # allocations with no TensorKey: not converted
    for t, action, (key, version), size in mp.timeline:
        if not isinstance(key, TensorKey):
            if action in (Action.CREATE, Action.INCREMENT_VERSION):
                dropped["allocs"] += 1
                dropped["bytes"] += size
            continue
        if key.device.type == "cuda":
            continue
        addr = key.storage.ptr
        if action == Action.CREATE:
            live[(key, version)] = (addr, size, cat_of(key, version), len(times))
            times.append(t)
        elif action == Action.DESTROY:
            live.pop((key, version))
            times += [t, t]
        elif action == Action.INCREMENT_VERSION:
            live.pop((key, version))
            times += [t, t]
            bumps.append(len(times))
            live[(key, version + 1)] = (addr, size, cat_of(key, version + 1), len(times))
            times.append(t)
        elif action == Action.PREEXISTING:
            live[(key, version)] = (addr, size, cat_of(key, version), -1)
            preexisting.append(dict(size=size, category=cat_of(key, version), addr=addr))
    trace = snapshot["device_traces"][device]
    assert len(times) == len(trace), (len(times), len(trace))
    for i in bumps:
        assert trace[i]["action"] == "alloc" and trace[i - 1]["action"] == "free_completed"
    end_blocks = [dict(size=size, category=cat, alloc_index=idx)
                  for addr, size, cat, idx in sorted(live.values())]
    active = [b for seg in snapshot["segments"] if seg["device"] == device
              for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert [b["size"] for b in active] == [b["size"] for b in end_blocks]
    for b in end_blocks:
        if b["alloc_index"] >= 0:
            assert trace[b["alloc_index"]]["category"] == b["category"]

    marks = []
    for node in mp._op_tree.sorted_nodes:
        try:
            name = node.name
        except UnicodeDecodeError:
            # torch 2.13 (CPU) now and then hands back an event name with
            # invalid UTF-8; our markers are plain ASCII, so skip such nodes
            continue
        if name.startswith(MARK_PREFIX):
            marks.append((name[len(MARK_PREFIX):], node.start_time_ns,
                          node.end_time_ns))
    meta = dict(untracked_allocations_dropped_by_converter=dict(dropped))
    return snapshot, device, times, bumps, marks, end_blocks, preexisting, meta


def time_range_to_indices(times, start, end):
    import bisect

    lo = bisect.bisect_left(times, start)
    hi = bisect.bisect_right(times, end) - 1
    return lo, hi  # hi < lo when no entry falls in the range


def iteration_table(times, marks):
    iters = []
    for name, s, e in marks:
        if name.startswith("iteration_"):
            lo, hi = time_range_to_indices(times, s, e)
            iters.append(dict(iteration=int(name.split("_")[1]), start_index=lo,
                              end_index=hi, phases=[], _s=s, _e=e))
    iters.sort(key=lambda d: d["iteration"])
    for name, s, e in marks:
        if name.startswith("iteration_"):
            continue
        ph, _, micro = name.partition("#")
        for it in iters:
            if it["_s"] <= s and e <= it["_e"]:
                lo, hi = time_range_to_indices(times, s, e)
                d = dict(phase=ph, start_index=lo, end_index=hi)
                if micro:
                    d["micro_batch"] = int(micro)
                it["phases"].append(d)
    for it in iters:
        it["phases"].sort(key=lambda d: (d["start_index"], d["end_index"]))
        del it["_s"], it["_e"]
    return iters


class CorruptProfile(Exception):
    """A frame name that is none of the three forms the profiler produces."""


FRAME_RE = re.compile(r"^.+\.py\(\d+\): .+$")


def frame_stats(trace):
    kinds = collections.Counter()
    n_alloc_no_stack = 0
    n_free_with_frames = 0
    for e in trace:
        if e["action"] == "alloc":
            if not e["frames"]:
                n_alloc_no_stack += 1
            for f in e["frames"]:
                assert f["filename"] == "none" and f["line"] == 0, f
                n = f["name"]
                if FRAME_RE.match(n):
                    kinds["python 'path/file.py(N): func'"] += 1
                elif n.startswith("nn.Module: "):
                    kinds["'nn.Module: Name_k'"] += 1
                elif n.startswith("<built-in"):
                    kinds["'<built-in ...>' (C function called from Python)"] += 1
                else:
                    kinds["other: " + n[:60]] += 1
        elif e["frames"]:
            n_free_with_frames += 1
    return dict(frame_name_kinds=dict(kinds), allocs_without_frames=n_alloc_no_stack,
                non_alloc_entries_with_frames=n_free_with_frames)


def live_curve(trace, iters):
    """Live bytes relative to the trace start (alloc +size, free_completed -size)."""
    live = 0
    peak = (0, -1)
    curve = []
    for i, e in enumerate(trace):
        a = e["action"]
        if a == "alloc":
            live += e["size"]
            if live > peak[0]:
                peak = (live, i)
        elif a in ("free_completed", "free"):
            live -= e["size"]
        curve.append(live)
    out = dict(peak_live_bytes_relative=peak[0], peak_index=peak[1],
               end_live_bytes_relative=live)
    if iters:
        out["live_bytes_relative_at_iteration_end"] = [
            curve[it["end_index"]] if it["end_index"] >= 0 else 0 for it in iters]
        out["peak_live_bytes_relative_per_iteration"] = [
            max(curve[it["start_index"]:it["end_index"] + 1] or [0]) for it in iters]
    return out


def _phase_at(iters, index):
    for it in iters:
        for ph in it["phases"]:
            if ph["start_index"] <= index <= ph["end_index"]:
                return it["iteration"], ph["phase"]
        if it["start_index"] <= index <= it["end_index"]:
            return it["iteration"], None
    return None, None


def peak_breakdown(trace, preexisting, iters):
    """Absolute live bytes by torch's category (tensors live before the trace
    included), at the global peak and at each iteration's peak.  Replays the
    trace from the preexisting tensors: alloc adds (size, its category),
    free_completed removes the address (a version bump frees and re-adds it)."""
    live = {p["addr"]: (p["size"], p["category"]) for p in preexisting}
    cur = sum(sz for sz, _ in live.values())
    curve = []
    for e in trace:
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = (e["size"], e["category"])
            cur += e["size"]
        elif a in ("free_completed", "free"):
            old = live.pop(e["addr"], None)
            if old is not None:
                cur -= old[0]
        curve.append(cur)

    def by_category_at(index):
        live2 = {p["addr"]: (p["size"], p["category"]) for p in preexisting}
        for e in trace[:index + 1]:
            a = e["action"]
            if a == "alloc":
                live2[e["addr"]] = (e["size"], e["category"])
            elif a in ("free_completed", "free"):
                live2.pop(e["addr"], None)
        out = collections.Counter()
        for sz, c in live2.values():
            out[c] += sz
        return {c: out[c] for c in CATEGORIES if out.get(c)}

    def peak_in(lo, hi):
        allocs = [i for i in range(lo, hi + 1) if trace[i]["action"] == "alloc"]
        i = max(allocs, key=lambda k: (curve[k], -k))
        it, ph = _phase_at(iters, i)
        return dict(index=i, bytes=curve[i], iteration=it, phase=ph,
                    by_category=by_category_at(i))

    return dict(
        peak_live=peak_in(0, len(trace) - 1),
        peak_live_per_iteration=[peak_in(it["start_index"], it["end_index"]) for it in iters],
        peak_live_note=("absolute live bytes: tensors live before the trace "
                        "(preexisting_bytes_by_category) plus trace allocs, by torch's "
                        "category of each tensor; index = the alloc that first reached "
                        "the maximum; phase from iteration_table"))


def strip_categories(snapshot):
    """Copy of the snapshot whose trace entries lack 'category'.  Frame lists
    stay the same objects (alloc and free entries share one list in torch's
    converter), so the pickle memo structure is unchanged."""
    out = dict(snapshot)
    out["device_traces"] = [
        [{k: v for k, v in e.items() if k != "category"} for e in tr]
        for tr in snapshot["device_traces"]
    ]
    return out


def category_totals(trace):
    nbytes = collections.Counter()
    count = collections.Counter()
    for e in trace:
        if e["action"] == "alloc":
            nbytes[e["category"]] += e["size"]
            count[e["category"]] += 1
    return ({c: nbytes.get(c, 0) for c in CATEGORIES},
            {c: count.get(c, 0) for c in CATEGORIES})


def _bytes_by(blocks):
    out = collections.Counter()
    for b in blocks:
        out[b["category"]] += b["size"]
    return dict(sorted(out.items()))


def live_at_end_by_category(snapshot, device):
    """Bytes live at the end, by category: trace allocs never freed."""
    live: dict[int, dict] = {}
    for e in snapshot["device_traces"][device]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] in ("free_completed", "free"):
            live.pop(e["addr"], None)
    out = collections.Counter()
    for e in live.values():
        out[e["category"]] += e["size"]
    return {c: out.get(c, 0) for c in CATEGORIES if out.get(c)}


def record(name: str, outdir: str = HERE, with_category: bool | None = None,
           out_pickle: str | None = None, keep_category: bool = False,
           write_truth: bool = True, verbose: bool = True):
    """Profile run `name` and write its files.  Returns the truth dict."""
    train, meta = RUNS[name]()
    want_peak_breakdown = meta.pop("peak_breakdown", False)
    # profiled inline (not through profile_train) to keep one frame less in
    # every stack: frames are ~90% of the pickle bytes
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 record_shapes=True, with_stack=True) as prof:
        train()
    snapshot, device, times, bumps, marks, end_blocks, preexisting, cmeta = convert(prof)
    trace = snapshot["device_traces"][device]

    cats = [e.get("category") if e["action"] == "alloc" else None for e in trace]
    nbytes, counts = category_totals(trace)
    bump_bytes, _ = category_totals([trace[i] for i in bumps])
    iters = iteration_table(times, marks)
    seg_blocks = [b for s in snapshot["segments"] for b in s["blocks"]]
    total_alloc = sum(nbytes.values())

    truth: dict[str, Any] = dict(
        run=name,
        device=device,
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        converter="torch.cuda._memory_viz._profile_to_snapshot",
        profiler=("torch.profiler.profile(activities=[ProfilerActivity.CPU], "
                  "profile_memory=True, record_shapes=True, with_stack=True)"),
        n_entries=len(trace),
        actions=dict(collections.Counter(e["action"] for e in trace)),
        **meta,
        phases_present=sorted({p["phase"] for it in iters for p in it["phases"]}),
        iteration_table=iters,
        category_alloc_bytes=nbytes,
        category_alloc_counts=counts,
        unknown_fraction_of_alloc_bytes=round(nbytes["unknown"] / total_alloc, 4)
        if total_alloc else 0.0,
        version_bump_alloc_indices=bumps,
        version_bump_alloc_bytes={c: b for c, b in bump_bytes.items() if b},
        live_at_end_by_category=live_at_end_by_category(snapshot, device),
        # allocs of this trace still live at the end (never freed)
        live_at_end_alloc_indices=sorted(
            b["alloc_index"] for b in end_blocks if b["alloc_index"] >= 0),
        end_state=dict(
            segments=len(snapshot["segments"]),
            active_blocks=sum(b["state"] == "active_allocated" for b in seg_blocks),
            active_block_bytes=sum(b["size"] for b in seg_blocks
                                   if b["state"] == "active_allocated"),
            active_blocks_without_frames=sum(
                b["state"] == "active_allocated" and not b.get("frames")
                for b in seg_blocks),
        ),
        end_blocks=end_blocks,
        end_blocks_by_category=dict(sorted(collections.Counter(
            b["category"] for b in end_blocks).items())),
        # tensors live when the trace began (no alloc in the trace); some of
        # them are freed or version-bumped during the trace
        preexisting_bytes_by_category=_bytes_by(preexisting),
        preexisting_count=len(preexisting),
        **live_curve(trace, iters),
        frames=frame_stats(trace),
        **cmeta,
        categories=cats,
    )
    if "leak" in truth:
        # the exact frame names of the leaking function as they appear in the
        # stacks of the allocations still live at the end (the leaked ones)
        fn = truth["leak"]["function"]
        leaked = [i for i in truth["live_at_end_alloc_indices"]
                  if trace[i]["category"] not in ("parameter", "optimizer_state")]
        truth["leak"]["leaked_alloc_indices"] = leaked
        truth["leak"]["leaked_bytes"] = sum(trace[i]["size"] for i in leaked)
        truth["leak"]["frame_names"] = sorted({
            f["name"] for i in leaked for f in trace[i]["frames"]
            if f["name"].endswith(": " + fn)})
    odd = [k for k in truth["frames"]["frame_name_kinds"] if k.startswith("other:")]
    if odd:
        raise CorruptProfile(f"unexpected frame names: {odd}")
    if want_peak_breakdown:
        truth.update(peak_breakdown(trace, preexisting, iters))
        truth["categories"] = truth.pop("categories")   # still the long list at the end
    truth["notes"] = notes_for(truth)

    os.makedirs(outdir, exist_ok=True)
    written = []
    if out_pickle is None:
        out_pickle = os.path.join(outdir, f"{name}.pickle")
    with open(out_pickle, "wb") as f:
        pickle.dump(snapshot if keep_category else strip_categories(snapshot), f)
    written.append(out_pickle)
    if with_category is None:
        with_category = name in WITH_CATEGORY
    if with_category:
        p = os.path.join(outdir, f"{name}.with_category.pickle")
        with open(p, "wb") as f:
            pickle.dump(snapshot, f)
        written.append(p)
        truth["with_category_pickle"] = os.path.basename(p)
    truth["pickle_sha256"] = hashlib.sha256(open(out_pickle, "rb").read()).hexdigest()
    if write_truth:
        p = os.path.join(outdir, f"{name}.truth.json")
        with open(p, "w") as f:
            # categories last and on one line each way: small and diffable
            json.dump(truth, f, indent=1)
            f.write("\n")
        written.append(p)
    if verbose:
        sizes = ", ".join(f"{os.path.basename(p)} {os.path.getsize(p)} B" for p in written)
        print(f"{name}: {len(trace)} entries, unknown "
              f"{truth['unknown_fraction_of_alloc_bytes']:.1%} of alloc bytes; {sizes}")
    return truth


def notes_for(t: dict) -> list[str]:
    notes = [
        "Trace entries have no time_us: profiler-converted snapshots carry only "
        "action/addr/size/stream/frames(/category). Iteration and phase ranges "
        "(iteration_table) come from record_function markers matched to the "
        "profiler timeline; they are inclusive trace-index ranges.",
        "Frames: filename 'none', line 0, name 'path/file.py(N): func' "
        "(N = the function's first line, not the executing line), "
        "'nn.Module: Name_k' or '<built-in ...>'. Innermost first.",
        "free_requested/free_completed entries reuse the frames list of their alloc.",
        "In-place updates (optimizer steps, gradient accumulation, zero_) appear as "
        "free_requested+free_completed+alloc at the same address and size "
        "(a new tensor version); version_bump_alloc_indices lists those allocs.",
        "Parameters (and any tensor created before profiling) are preexisting: "
        "they have no alloc in the trace, but appear as active blocks (with "
        "frames []) in segments.",
        "Segment blocks have no 'address'; the single CPU segment spans from the "
        "lowest to the highest address seen, with 'inactive' filler blocks in "
        "between, so total_size can be huge (CPU heap vs mmap addresses).",
        "Categories: torch reports 'unknown' when its memory profiler could not "
        "infer one (the converted snapshot never has None).",
    ]
    if t["unknown_fraction_of_alloc_bytes"] > 0.25:
        notes.append(f"Large unknown share: {t['unknown_fraction_of_alloc_bytes']:.0%} "
                     "of allocated bytes are 'unknown' per torch.")
    return notes


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    names = argv or list(RUNS)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    results = {}
    for n in names:
        for attempt in range(3):
            try:
                results[n] = record(n)
                break
            except (UnicodeDecodeError, CorruptProfile) as exc:  # see convert()
                print(f"{n}: profiler returned a garbled name ({exc}); retrying")
        else:
            raise RuntimeError(f"{n}: could not be recorded")
    return results


if __name__ == "__main__":
    main()
