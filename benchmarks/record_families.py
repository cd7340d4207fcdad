"""Record the lever-validation families: small training runs of several model families,
each configuration with and without a lever pulled, so that a what-if prediction made
from one run can be checked against the run recorded with the change.

    python benchmarks/record_families.py OUT_DIR [--set dev|heldout|facts|all] [--only RUN ...]
                                         [--device cuda|cpu] [--jobs N]

Two sets of families, kept apart (benchmarks/whatif_accuracy.py --held-out):

* `dev`: the families the levers may be developed against: a ResNet-style CNN with
  BatchNorm (our own blocks, two stages of different widths), a BERT-like encoder with
  dropout (eager attention: the dropout's mask and output are sequence-squared), a GPT-2
  under bf16 autocast (sdpa), a Llama-style SwiGLU model with tied embeddings (full
  fine-tuning, LoRA on q,v only and on all linear layers), a ViT trained with SGD and
  momentum.
* `heldout`: recorded before the code was changed for the dev set and never used to change
  it: torchvision's ResNet-18 (SGD, momentum), a RoBERTa masked LM (Adam, dropout), a Qwen2
  with grouped-query attention and tied embeddings under bf16 autocast (LoRA on the
  attention matrices), a GPT-NeoX (parallel residual; LoRA on all linear layers), a T5
  encoder-decoder (LoRA on q,v).
* `facts`: runs whose facts the analysis must establish (issue 32): an OOM in the first
  forward, forwards with grad enabled and no backward, a no_grad evaluation loop, two models
  alive, a model held twice (EMA copy), checkpoint_sequential with a backward and no
  optimizer, plain SGD without state.

Each run builds its model from a config (nothing downloaded: random weights, random
inputs), records from before the model is built and trains two steps (the first creates
the optimizer state). On CUDA each run is its own process (a clean allocator), recorded
with `torch.cuda.memory._record_memory_history(stacks="python")` and dumped with
`_dump_snapshot`; on the CPU it runs under `torch.profiler` and is converted by
`torch.cuda._memory_viz._profile_to_snapshot` (category dropped), as whatif_grid.py does.
`OUT_DIR/runs.json` holds each run's configuration, parameter counts and, on CUDA, torch's
own `max_memory_allocated` (which the snapshot's peak must equal).

A run is `<family>.<variant>`; the variants of a family: `base`, `half` (micro-batch / 2),
`double` (micro-batch x 2), `seq2` (sequence x 2), `ckpt` (activation checkpointing),
`lora_qv`, `lora_all`, `lora_attn` (rank-8 adapters on those matrices).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VOCAB = 1000
STEPS = 2
LORA_RANK = 8


@dataclass(frozen=True)
class Run:
    family: str
    variant: str
    set: str                  # dev | heldout | facts
    batch: int = 8
    seq: int = 128            # tokens, or the image side for vision models
    ckpt: bool = False
    lora: str = ""            # "", "qv", "all-linear", "attention"
    autocast: str = ""        # "", "bf16"
    optimizer: str = "adamw"  # adamw | adam | sgdm | sgd | none
    steps: int = STEPS
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.family}.{self.variant}"


def _variants(family, set_, base: dict, kinds) -> list[Run]:
    b = Run(family, "base", set_, **base)
    out = [b]
    for k in kinds:
        if k == "half":
            out.append(replace(b, variant=k, batch=b.batch // 2))
        elif k == "double":
            out.append(replace(b, variant=k, batch=b.batch * 2))
        elif k == "seq2":
            out.append(replace(b, variant=k, seq=b.seq * 2))
        elif k == "ckpt":
            out.append(replace(b, variant=k, ckpt=True))
        elif k.startswith("lora_"):
            out.append(replace(b, variant=k, lora={"lora_qv": "qv", "lora_all": "all-linear",
                                                    "lora_attn": "attention"}[k]))
    return out


def runs() -> list[Run]:
    out: list[Run] = []
    # -- dev: the families the levers may be developed on
    out += _variants("cnn_bn", "dev", dict(batch=32, seq=32), ("half", "double", "ckpt"))
    out += _variants("bert_dropout", "dev", dict(batch=8, seq=128), ("half", "double", "seq2", "ckpt"))
    out += _variants("gpt2_bf16", "dev", dict(batch=8, seq=128, autocast="bf16"), ("half", "double", "seq2", "ckpt"))
    out += _variants("llama_tied", "dev", dict(batch=8, seq=128), ("half", "double", "seq2", "ckpt", "lora_qv",
                                                                    "lora_all"))
    out += _variants("vit_sgd", "dev", dict(batch=16, seq=64, optimizer="sgdm"), ("half", "double", "ckpt"))
    # -- held out: never used to change the code
    out += _variants("resnet18", "heldout", dict(batch=16, seq=64, optimizer="sgdm"), ("half", "double", "ckpt"))
    out += _variants("roberta_adam", "heldout", dict(batch=8, seq=128, optimizer="adam"),
                     ("half", "double", "seq2", "ckpt"))
    out += _variants("qwen2_bf16", "heldout", dict(batch=8, seq=128, autocast="bf16"),
                     ("half", "double", "seq2", "ckpt", "lora_attn"))
    out += _variants("neox", "heldout", dict(batch=8, seq=128), ("half", "double", "seq2", "ckpt", "lora_all"))
    out += _variants("t5", "heldout", dict(batch=8, seq=128), ("half", "double", "seq2", "ckpt", "lora_qv"))
    # -- facts (issue 32): what kind of run it is
    F = "facts"
    out += [Run("oom_first_forward", "run", F, batch=64, seq=512, extra=dict(cap_mib=160)),
            Run("forward_grad", "run", F, batch=8, seq=128, optimizer="none", steps=3),
            Run("eval_nograd", "run", F, batch=8, seq=128, optimizer="none", steps=4),
            Run("two_models", "run", F, batch=8, seq=128, steps=1),
            Run("ema_copy", "run", F, batch=8, seq=128, steps=2),
            Run("ckpt_sequential", "run", F, batch=64, seq=0, optimizer="none", steps=1),
            Run("sgd_plain", "run", F, batch=8, seq=128, optimizer="sgd", steps=2)]
    return out


# -- models ----------------------------------------------------------------------------------------
def _hf_lm(run: Run, kind: str):
    import transformers as tf
    common = dict(vocab_size=VOCAB)
    if kind == "bert":
        conf = tf.BertConfig(**common, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                             intermediate_size=512, max_position_embeddings=1024, hidden_dropout_prob=0.1,
                             attention_probs_dropout_prob=0.1, num_labels=2)
        conf._attn_implementation = "eager"
        return tf.BertForSequenceClassification(conf)
    if kind == "gpt2":
        conf = tf.GPT2Config(**common, n_positions=1024, n_embd=128, n_layer=4, n_head=4, attn_pdrop=0.1,
                             resid_pdrop=0.1, embd_pdrop=0.1, bos_token_id=0, eos_token_id=0)
        return tf.GPT2LMHeadModel(conf)
    if kind == "llama":
        conf = tf.LlamaConfig(**common, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                              tie_word_embeddings=True, use_cache=False)
        return tf.LlamaForCausalLM(conf)
    if kind == "roberta":
        conf = tf.RobertaConfig(**common, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                intermediate_size=512, max_position_embeddings=1030, hidden_dropout_prob=0.1,
                                attention_probs_dropout_prob=0.1)
        return tf.RobertaForMaskedLM(conf)
    if kind == "qwen2":
        conf = tf.Qwen2Config(**common, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                              tie_word_embeddings=True, use_cache=False)
        return tf.Qwen2ForCausalLM(conf)
    if kind == "neox":
        conf = tf.GPTNeoXConfig(**common, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                intermediate_size=512, max_position_embeddings=1024, use_parallel_residual=True,
                                use_cache=False)
        return tf.GPTNeoXForCausalLM(conf)
    if kind == "t5":
        conf = tf.T5Config(**common, d_model=128, d_ff=512, d_kv=32, num_layers=3, num_decoder_layers=3,
                           num_heads=4, dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0,
                           use_cache=False)
        return tf.T5ForConditionalGeneration(conf)
    raise ValueError(kind)


_LORA_TARGETS = {
    ("llama", "qv"): ["q_proj", "v_proj"], ("llama", "all-linear"): "all-linear",
    ("qwen2", "attention"): ["q_proj", "k_proj", "v_proj", "o_proj"],
    ("neox", "all-linear"): "all-linear", ("t5", "qv"): ["q", "v"],
}


def _cnn(run: Run, dev):
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class ResBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = nn.Sequential()
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + self.short(x))

    class SmallResNet(nn.Module):
        def __init__(self, ckpt):
            super().__init__()
            self.ckpt = ckpt
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
            self.blocks = nn.ModuleList([ResBlock(16, 32, 1), ResBlock(32, 32, 1), ResBlock(32, 32, 1),
                                         ResBlock(32, 64, 2), ResBlock(64, 64, 1), ResBlock(64, 64, 1)])
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            x = self.stem(x)
            for blk in self.blocks:
                x = checkpoint(blk, x, use_reentrant=False) if self.ckpt else blk(x)
            return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return SmallResNet(run.ckpt).to(dev)


def _resnet18(run: Run, dev):
    import torch
    import torchvision
    from torch import nn
    from torch.utils.checkpoint import checkpoint
    model = torchvision.models.resnet18(num_classes=10)
    if run.ckpt:
        class Ckpt(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return checkpoint(self.inner, x, use_reentrant=False)
        for name in ("layer1", "layer2", "layer3", "layer4"):
            layer = getattr(model, name)
            setattr(model, name, nn.Sequential(*[Ckpt(b) for b in layer]))
    del torch
    return model.to(dev)


def _vit(run: Run, dev):
    import transformers as tf
    conf = tf.ViTConfig(image_size=run.seq, patch_size=8, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=512, num_labels=10, hidden_dropout_prob=0.0)
    model = tf.ViTForImageClassification(conf)
    if run.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(dev)


_HF_KIND = {"bert_dropout": "bert", "gpt2_bf16": "gpt2", "llama_tied": "llama", "roberta_adam": "roberta",
            "qwen2_bf16": "qwen2", "neox": "neox", "t5": "t5"}


def build(run: Run, dev):
    """(model, batch function, loss function) for one run."""
    import torch
    torch.manual_seed(0)
    if run.family in ("cnn_bn", "resnet18", "vit_sgd"):
        model = {"cnn_bn": _cnn, "resnet18": _resnet18, "vit_sgd": _vit}[run.family](run, dev)
        hf = run.family == "vit_sgd"

        def batch():
            return (torch.randn(run.batch, 3, run.seq, run.seq, device=dev),
                    torch.randint(0, 10, (run.batch,), device=dev))

        def loss(model, x, y):
            if hf:
                return model(pixel_values=x, labels=y).loss
            return torch.nn.functional.cross_entropy(model(x), y)
        return model, batch, loss
    kind = _HF_KIND[run.family]
    model = _hf_lm(run, kind)
    if run.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = model.to(dev)
    if run.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=16, lora_dropout=0.0,
                                                 target_modules=_LORA_TARGETS[(kind, run.lora)]))

    def batch():
        ids = torch.randint(1, VOCAB, (run.batch, run.seq), device=dev)
        return ids, ids

    def loss(model, ids, labels):
        if kind == "bert":
            y = torch.randint(0, 2, (ids.shape[0],), device=ids.device)
            return model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=y).loss
        if kind == "t5":
            return model(input_ids=ids, labels=labels[:, : ids.shape[1] // 2].contiguous()).loss
        return model(input_ids=ids, labels=labels).loss
    return model, batch, loss


def optimizer(run: Run, model):
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    if run.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if run.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if run.optimizer == "sgdm":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    if run.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-2)
    return None


def train(run: Run, dev) -> dict:
    """Build and train one run (the caller records around it); its facts."""
    import torch
    if run.set == "facts":
        return _facts_run(run, dev)
    model, batch, loss_fn = build(run, dev)
    model.train()
    opt = optimizer(run, model)
    for _ in range(run.steps):
        x, y = batch()
        if run.autocast:
            with torch.autocast(device_type=dev.split(":")[0], dtype=torch.bfloat16):
                loss = loss_fn(model, x, y)
        else:
            loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, x, y
    return dict(trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
                total_params=sum(p.numel() for p in model.parameters()))


def _facts_run(run: Run, dev) -> dict:
    import torch
    from torch import nn
    llama = replace(run, family="llama_tied")
    if run.family == "oom_first_forward":
        if dev.startswith("cuda"):
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(run.extra["cap_mib"] * 2**20 / total)
        model, batch, loss_fn = build(llama, dev)
        opt = optimizer(llama, model)
        x, y = batch()
        try:
            loss = loss_fn(model, x, y)
            loss.backward()
            opt.step()
            return dict(oom=False)
        except RuntimeError as e:          # torch.OutOfMemoryError is a RuntimeError
            if "out of memory" not in str(e):
                raise
            return dict(oom=True, message=str(e).splitlines()[0][:300])
    if run.family == "forward_grad":
        lin = nn.Linear(2048, 2048).to(dev)
        x = torch.randn(4096, 2048, device=dev)
        out = None
        for _ in range(run.steps):
            out = lin(x) * 2.0          # grad enabled, never backward; each output replaces the last
        del out
        return dict(params=sum(p.numel() for p in lin.parameters()))
    if run.family == "eval_nograd":
        model, batch, loss_fn = build(llama, dev)
        model.eval()
        with torch.no_grad():
            for _ in range(run.steps):
                x, y = batch()
                loss_fn(model, x, y)
        return dict(total_params=sum(p.numel() for p in model.parameters()))
    if run.family == "two_models":
        first, batch, loss_fn = build(llama, dev)
        opt = optimizer(llama, first)
        x, y = batch()
        loss_fn(first, x, y).backward()
        opt.step()                       # first model: weights, gradients and AdamW state stay alive
        second, batch2, loss2 = build(replace(run, family="roberta_adam", optimizer="adam"), dev)
        opt2 = optimizer(replace(run, optimizer="adam"), second)
        x, y = batch2()
        loss2(second, x, y).backward()
        opt2.step()
        return dict(models=2)
    if run.family == "ema_copy":
        model, batch, loss_fn = build(llama, dev)
        ema = copy.deepcopy(model)
        for p in ema.parameters():
            p.requires_grad_(False)
        opt = optimizer(llama, model)
        for _ in range(run.steps):
            x, y = batch()
            loss_fn(model, x, y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for pe, pm in zip(ema.parameters(), model.parameters()):
                    pe.mul_(0.99).add_(pm, alpha=0.01)
        return dict(models=1, held_twice=True)
    if run.family == "ckpt_sequential":
        from torch.utils.checkpoint import checkpoint_sequential
        seq = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(8)]).to(dev)
        x = torch.randn(run.batch, 1024, device=dev, requires_grad=True)
        out = checkpoint_sequential(seq, 4, x, use_reentrant=False)
        out.sum().backward()
        return dict(checkpointing=True)
    if run.family == "sgd_plain":
        model, batch, loss_fn = build(llama, dev)
        opt = optimizer(run, model)
        for _ in range(run.steps):
            x, y = batch()
            loss_fn(model, x, y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return dict(optimizer="SGD")
    raise ValueError(run.family)


# -- recording -------------------------------------------------------------------------------------
def record_cuda(run: Run, path: Path) -> dict:
    import torch
    torch.backends.cudnn.benchmark = False
    torch.cuda.memory._record_memory_history(max_entries=400_000, stacks=os.environ.get("FAM_STACKS", "python"))
    t0 = time.time()
    info = train(run, "cuda")
    torch.cuda.synchronize()
    info["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    info["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    tmp = path.with_suffix(".tmp")
    torch.cuda.memory._dump_snapshot(str(tmp))
    os.replace(tmp, path)
    torch.cuda.memory._record_memory_history(enabled=None)
    info["seconds"] = round(time.time() - t0, 2)
    info["torch"] = torch.__version__
    info["gpu"] = torch.cuda.get_device_name(0)
    return info


def record_cpu(run: Run, path: Path) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    sys.path.insert(0, str(ROOT / "tests" / "groundtruth"))
    import record_runs as rr
    torch.set_num_threads(1)
    t0 = time.time()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        info = train(run, "cpu")
    snap = rr.strip_categories(rr.convert(prof)[0])
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    os.replace(tmp, path)
    info["seconds"] = round(time.time() - t0, 2)
    info["torch"] = torch.__version__
    return info


def one(name: str, out: Path, device: str) -> int:
    """Record one run in this process; its facts go to OUT/<name>.json."""
    run = {r.name: r for r in runs()}[name]
    path = out / run.set / f"{run.name}.pickle"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = (record_cuda if device == "cuda" else record_cpu)(run, path)
        info["ok"] = True
    except Exception as e:      # noqa: BLE001 - a failed run is reported, the others go on
        info = dict(ok=False, error=f"{type(e).__name__}: {e}"[:2000], trace=traceback.format_exc()[-4000:])
    info.update(run=asdict(run), file=str(path.relative_to(out)) if path.exists() else None,
                bytes=path.stat().st_size if path.exists() else 0)
    (out / f"{name}.json").write_text(json.dumps(info, indent=1))
    return 0 if info["ok"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--set", default="all", choices=("dev", "heldout", "facts", "all"))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        return one(args.one, args.out, args.device)
    todo = [r.name for r in runs() if (args.set == "all" or r.set == args.set)
            and (not args.only or r.name in args.only or r.family in args.only)]
    procs: list = []
    t0 = time.time()
    for name in todo:
        while len(procs) >= args.jobs:
            procs = [p for p in procs if p.poll() is None]
            time.sleep(0.1)
        procs.append(subprocess.Popen([sys.executable, __file__, str(args.out), "--one", name, "--device",
                                       args.device]))
    for p in procs:
        p.wait()
    index = {}
    for name in todo:
        f = args.out / f"{name}.json"
        index[name] = json.loads(f.read_text()) if f.exists() else dict(ok=False, error="no result")
        print(f"{name:32s} {'ok ' if index[name]['ok'] else 'FAIL'} "
              f"{index[name].get('bytes', 0) / 1e6:6.2f} MB  {index[name].get('error', '')[:150]}", flush=True)
    (args.out / "runs.json").write_text(json.dumps(index, indent=1))
    print(f"{sum(v['ok'] for v in index.values())} of {len(index)} runs in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
