"""Record the what-if validation grid: small training runs of a tiny GPT on the CPU
under torch's memory profiler, converted to snapshots (benchmarks/whatif_accuracy.py
reads them; tests/data/record_fit.py records the few committed ones).

    python benchmarks/whatif_grid.py [--out DIR] [--only NAME ...]

Each run is profiled with

    torch.profiler.profile(activities=[CPU], profile_memory=True, record_shapes=True, with_stack=True)

and converted by `torch.cuda._memory_viz._profile_to_snapshot` (the converter torch's
`profile_plot` uses), with the per-allocation `category` dropped (with it present
torch's own tag would decide each category; vramscope must find them from the stacks).
The model is tests/groundtruth/record_runs.py's TinyLM (token + position embeddings for up
to 256 positions, pre-LN blocks of causal self-attention and a GELU MLP, LM head; vocab
512, width 128, 4 heads, MLP 512; built from a config, nothing downloaded), trained with fused AdamW for two steps (the first creates the
optimizer state). A run is named `l<layers>_s<seq>_b<batch>_<full|lora>[_ckpt]`:

  full   every parameter trains;
  lora   every base weight frozen, rank-8 adapters (A, B) on every Linear of every
         block (attention qkv and proj, MLP fc and out: "all-linear");
  ckpt   torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) on every block.

Runs are cached in DIR (default benchmarks/out/whatif_grid/, git-ignored) under a key
of the recording code's hash, so a rerun only records what is missing.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import pickle
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = HERE / "out" / "whatif_grid"
GT = ROOT / "tests" / "groundtruth"

VOCAB, D_MODEL, HEADS, D_FF = 512, 128, 4, 512
MAX_LEN = 256           # position embeddings and causal mask, whatever sequence a run trains at
LORA_RANK = 8
ITERS = 2


@dataclass(frozen=True)
class Config:
    layers: int
    seq: int
    batch: int
    lora: bool
    ckpt: bool
    model: str = "gpt"      # "gpt": record_runs.TinyLM; "llama": a tiny Hugging Face Llama (with peft for LoRA)

    @property
    def name(self) -> str:
        return (("hf_" if self.model == "llama" else "")
                + f"l{self.layers}_s{self.seq}_b{self.batch}_{'lora' if self.lora else 'full'}"
                + ("_ckpt" if self.ckpt else ""))

    @classmethod
    def parse(cls, name: str) -> "Config":
        model = "llama" if name.startswith("hf_") else "gpt"
        parts = name.removeprefix("hf_").split("_")
        return cls(int(parts[0][1:]), int(parts[1][1:]), int(parts[2][1:]), parts[3] == "lora", "ckpt" in parts[4:],
                   model)


def grid() -> list[Config]:
    """The validation grid: 4 and 8 layers, sequence 128 and 256, micro-batch 1-8, full
    fine-tuning and LoRA, with and without checkpointing."""
    out = []
    for layers in (4, 8):
        for seq in (128, 256):
            for batch in (1, 2, 4, 8):
                for lora in (False, True):
                    for ckpt in (False, True):
                        out.append(Config(layers, seq, batch, lora, ckpt))
    return out


def _record_runs():
    sys.path.insert(0, str(GT))
    import record_runs          # the ground-truth recorder's model, markers and converter
    return record_runs


def add_lora_all_linear(model, rank: int = LORA_RANK):
    """Freeze every parameter and put a rank-`rank` adapter on every Linear of every block."""
    rr = _record_runs()
    for p in model.parameters():
        p.requires_grad_(False)
    for blk in model.blocks:
        for owner, name in ((blk.attn, "qkv"), (blk.attn, "proj"), (blk.mlp, "fc"), (blk.mlp, "out")):
            setattr(owner, name, rr.LoRALinear(getattr(owner, name), rank))
    return model


def hf_grid() -> list[Config]:
    """Runs of another model, code and training loop, to check the levers away from the grid's:
    a 4-layer Hugging Face Llama (SwiGLU MLP, RMSNorm, rotary positions, sdpa attention), LoRA
    through peft (target_modules="all-linear"), checkpointing through
    gradient_checkpointing_enable(); sequence 128, micro-batch 2 and 4."""
    return [Config(4, 128, b, lora, ckpt, "llama") for b in (2, 4) for lora in (False, True) for ckpt in (False, True)]


def build_llama(cfg: Config):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    conf = LlamaConfig(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=344, num_hidden_layers=cfg.layers,
                       num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=MAX_LEN,
                       use_cache=False)
    model = LlamaForCausalLM(conf)
    if cfg.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=16, target_modules="all-linear",
                                                 lora_dropout=0.0))
        if cfg.ckpt:
            model.enable_input_require_grads()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    train = functools.partial(_train_llama, model, opt, ITERS, cfg.batch, cfg.seq)
    meta = dict(config=asdict(cfg), name=cfg.name, iterations=ITERS, lora_rank=LORA_RANK if cfg.lora else None,
                trainable_params=sum(p.numel() for p in trainable),
                total_params=sum(p.numel() for p in model.parameters()), model=conf.to_dict())
    return train, meta


def _train_llama(model, opt, iters, batch, seq):
    import torch
    for _ in range(iters):
        ids = torch.randint(0, VOCAB, (batch, seq))
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out


def build(cfg: Config):
    """(train function, metadata) for one configuration."""
    import torch
    if cfg.model == "llama":
        return build_llama(cfg)
    rr = _record_runs()
    torch.manual_seed(0)
    lm_cfg = dict(vocab=VOCAB, d_model=D_MODEL, n_heads=HEADS, n_layers=cfg.layers, d_ff=D_FF, max_len=MAX_LEN)
    model = rr.TinyLM(**lm_cfg, checkpointing=cfg.ckpt)
    if cfg.lora:
        add_lora_all_linear(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-3, fused=True)
    train = functools.partial(rr.train_ft, model, opt, ITERS, cfg.batch, cfg.seq, lm_cfg)
    meta = dict(config=asdict(cfg), name=cfg.name, iterations=ITERS, lora_rank=LORA_RANK if cfg.lora else None,
                trainable_params=sum(p.numel() for p in trainable),
                total_params=sum(p.numel() for p in model.parameters()),
                model=dict(lm_cfg))
    return train, meta


def record(cfg: Config, path: Path) -> dict:
    """Profile one run, write its category-free snapshot to `path` (atomically) and
    return its metadata (with the peak the snapshot's own replay gives)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    rr = _record_runs()
    torch.set_num_threads(1)
    train, meta = build(cfg)
    t0 = time.time()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        train()
    snapshot = rr.convert(prof)[0]
    snap = rr.strip_categories(snapshot)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(snap, f)
    os.replace(tmp, path)
    meta["seconds"] = round(time.time() - t0, 2)
    meta["bytes"] = path.stat().st_size
    return meta


def code_key() -> str:
    """What the recordings depend on: this file and the ground-truth recorder."""
    h = hashlib.sha256()
    for p in (Path(__file__), GT / "record_runs.py"):
        h.update(p.read_bytes())
    import torch
    h.update(torch.__version__.encode())
    return h.hexdigest()[:16]


def ensure(configs, out: Path = DEFAULT_OUT, verbose: bool = True) -> dict[str, Path]:
    """{name: snapshot path} for `configs`, recording the ones not cached (under this
    code's key) yet."""
    key = code_key()
    d = out / key
    d.mkdir(parents=True, exist_ok=True)
    index_path = d / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    paths = {}
    for cfg in configs:
        p = d / f"{cfg.name}.pickle"
        if cfg.name not in index or not p.exists():
            for attempt in range(3):
                try:
                    index[cfg.name] = record(cfg, p)
                    break
                except UnicodeDecodeError:      # torch 2.13 now and then garbles an event name
                    if attempt == 2:
                        raise
            tmp = index_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(index, indent=1))
            os.replace(tmp, index_path)
            if verbose:
                m = index[cfg.name]
                print(f"recorded {cfg.name}: {m['bytes'] / 1e6:.2f} MB in {m['seconds']} s", file=sys.stderr)
        paths[cfg.name] = p
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", help="run names (default: the whole grid)")
    ap.add_argument("--hf", action="store_true", help="also the Hugging Face Llama runs (needs transformers, peft)")
    args = ap.parse_args(argv)
    configs = [Config.parse(n) for n in args.only] if args.only else grid() + (hf_grid() if args.hf else [])
    ensure(configs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
