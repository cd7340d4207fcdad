"""Record real CUDA memory snapshots of tiny fine-tuning runs (run on a machine with a GPU).

    python tests/cuda/record_cuda.py OUT_DIR [RUN ...]

Each run is a fresh process (so the allocator's settings, `PYTORCH_CUDA_ALLOC_CONF`, take
effect) that builds a small Llama from a config (nothing downloaded: random weights,
random token ids), records with the defaults a user types,

    torch.cuda.memory._record_memory_history()   # context='all', stacks='all'
    ... training steps ...
    torch.cuda.memory._dump_snapshot(path)

and writes `OUT_DIR/cuda_<run>.pickle` plus `OUT_DIR/cuda_runs.json` (torch's version, the
GPU, each run's settings, parameter counts, torch's own peak counters and what happened).
The runs:

* `lora`       LoRA (peft, r=8 on q/v) with bf16 autocast and AdamW, expandable segments on
* `ckpt`       the same with activation checkpointing (gradient_checkpointing_enable)
* `full`       full fine-tuning with fp32 AdamW (optimizer state = 2 x the parameters)
* `oom`        full fine-tuning capped at 1 GiB (set_per_process_memory_fraction); the third
               step's batch is 12x longer and runs out of memory
* `leak`       LoRA where each step's logits are kept in a list (outputs stored for metrics
               without .detach().cpu()): live memory grows every iteration
* `stale`      full fine-tuning with `zero_grad(set_to_none=False)`: the gradients are zeroed
               in place and stay allocated through every next forward
* `wrapped`    full fine-tuning for 6 steps recorded with `max_entries=2500`: the trace keeps
               only its last entries (the ring buffer wrapped), the model, optimizer state and
               the last gradients were made before it began
* `compiled`   LoRA with bf16 autocast under `torch.compile(model)`: Inductor's generated
               kernels and frames (the first step compiles)
* `generate`   inference: `model.generate` of 16 new tokens for 2 prompts of 32 with the KV cache
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

RUNS = ("lora", "ckpt", "full", "oom", "leak", "stale", "wrapped", "compiled", "generate")
VOCAB = 4096


def config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                       use_cache=False)


def one_run(name: str, out_dir: str) -> dict:
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    dev = "cuda"
    lora = name in ("lora", "ckpt", "leak", "compiled")
    steps, batches = 4, [(8, 256)] * 4
    if name == "oom":
        # a 1 GiB card, in effect; the third batch is the long one
        torch.cuda.set_per_process_memory_fraction((1 << 30) / torch.cuda.get_device_properties(0).total_memory)
        batches = [(8, 256), (8, 256), (96, 256), (8, 256)]
    if name == "wrapped":
        steps, batches = 6, [(8, 256)] * 6
        torch.cuda.memory._record_memory_history(max_entries=2500)
    else:
        torch.cuda.memory._record_memory_history()
    model = LlamaForCausalLM(config()).to(dev)
    if name == "generate":
        return _generate(model, out_dir)
    if name == "ckpt":
        model.gradient_checkpointing_enable()
    n_params = sum(p.numel() for p in model.parameters())
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
        if name == "ckpt":
            model.enable_input_require_grads()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if name == "compiled":
        model = torch.compile(model)
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    kept, what, oom_step = [], "finished", None
    t0 = time.time()
    try:
        for step, (bs, seq) in enumerate(batches[:steps]):
            ids = torch.randint(0, VOCAB, (bs, seq), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=lora):
                out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=name != "stale")
            if name == "leak":
                kept.append(out.logits)          # the bug: outputs kept on the GPU, every step
            del out
    except torch.OutOfMemoryError as e:
        what, oom_step = f"out of memory: {str(e).splitlines()[0][:200]}", step + 1
    torch.cuda.synchronize()
    path = os.path.join(out_dir, f"cuda_{name}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    return {"run": name, "file": os.path.basename(path), "bytes": os.path.getsize(path), "what": what,
            "oom_step": oom_step, "steps": steps, "batches": batches[:steps], "lora": lora,
            "checkpointing": name == "ckpt", "bf16_autocast": lora,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "base_parameters": n_params, "trainable_parameters": sum(p.numel() for p in trainable),
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "seconds": round(time.time() - t0, 2)}


def _generate(model, out_dir: str) -> dict:
    import torch
    model.eval()
    model.config.use_cache = True
    prompts = torch.randint(0, VOCAB, (2, 32), device="cuda")
    t0 = time.time()
    with torch.no_grad():
        out = model.generate(prompts, max_new_tokens=16, min_new_tokens=16, do_sample=False, use_cache=True,
                             pad_token_id=0)
    torch.cuda.synchronize()
    path = os.path.join(out_dir, "cuda_generate.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    return {"run": "generate", "file": os.path.basename(path), "bytes": os.path.getsize(path), "what": "finished",
            "prompts": list(prompts.shape), "new_tokens": int(out.shape[1] - prompts.shape[1]),
            "base_parameters": sum(p.numel() for p in model.parameters()),
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(), "seconds": round(time.time() - t0, 2)}


def main(argv: list[str]) -> int:
    out_dir, names = argv[0], argv[1:] or list(RUNS)
    os.makedirs(out_dir, exist_ok=True)
    if names[0] == "--one":
        print(json.dumps(one_run(names[1], out_dir)))
        return 0
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
            "runs": []}
    for name in names:
        env = dict(os.environ)
        if name in ("lora", "leak"):
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        p = subprocess.run([sys.executable, __file__, out_dir, "--one", name], env=env, capture_output=True,
                           text=True)
        sys.stderr.write(p.stderr[-3000:])
        if p.returncode != 0:
            info["runs"].append({"run": name, "failed": p.returncode})
            continue
        rec = json.loads(p.stdout.strip().splitlines()[-1])
        print(json.dumps(rec))
        info["runs"].append(rec)
    with open(os.path.join(out_dir, "cuda_runs.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
