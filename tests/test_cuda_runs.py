"""Real CUDA snapshots: tiny Llama fine-tuning runs recorded on an H100 with torch 2.11
(tests/data/record_cuda.py; what each run did is in tests/data/cuda_runs.json).

They hold what no CPU profile can: the allocator's own traces with C++ stacks, cuBLAS
workspaces, expandable segments, an OOM under a process cap. Each test checks our answer
against what the run is known to have done."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vramscope.classifiers import analyze
from vramscope.classifiers.budget import budget
from vramscope.classifiers.categories import CATEGORIES
from vramscope.parsers import open_snapshot
from vramscope.present.stacks import Stacks
from vramscope.present.words import oom_diagnosis
from vramscope.services.compare import compare_analyses

DATA = Path(__file__).resolve().parent / "data"
RUNS = {r["run"]: r for r in json.loads((DATA / "cuda_runs.json").read_text())["runs"]}
MiB = 1 << 20


def load(run: str):
    snap = open_snapshot(str(DATA / f"cuda_{run}.pickle"), use_cache=False)
    return snap, analyze(snap, use_cache=False)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_cublas_workspaces_are_library_scratch_not_model_tensors(run):
    """Two 32 MiB cuBLAS workspaces (the main thread's and autograd's; generation has no
    backward, one) live to the end of every run; they were read as activations and gradients
    (and as the previous step's gradients)."""
    _snap, an = load(run)
    da = an.devices[0]
    ws = [i for i in range(len(da.allocs.size)) if da.rule_names[da.rule[i]] == "temporary.library_workspace"]
    assert [int(da.allocs.size[i]) for i in ws] == [32 * MiB] * (1 if run == "generate" else 2)
    assert all(CATEGORIES[da.category[i]] == "temporary" for i in ws)
    if run != "stale":                                      # the others call zero_grad(set_to_none=True)
        assert da.stale_gradients is None


@pytest.mark.parametrize("run", ["lora", "ckpt", "full", "leak"])
def test_each_training_step_is_an_iteration(run):
    _snap, an = load(run)
    its = an.devices[0].iterations
    assert len(its) == RUNS[run]["steps"]
    assert all(it.peak_type == "backward_start" for it in its)


def test_the_peak_is_torchs_own_counter_to_the_blocks_rounding():
    """Our peak sums the sizes the trace records (what was asked for); torch's
    max_memory_allocated() sums whole blocks (rounded up to 512 bytes, and a large block is
    not split when less than 1 MiB would remain): never below ours, and within 1%."""
    for run, rec in RUNS.items():
        _snap, an = load(run)
        ours = an.devices[0].peak.bytes
        assert ours <= rec["max_memory_allocated"] <= ours * 1.01, run


def test_full_fine_tuning_optimizer_is_two_fp32_copies_of_the_parameters():
    _snap, an = load("full")
    peak = an.devices[0].peak
    params = RUNS["full"]["trainable_parameters"]
    assert peak.by_category["optimizer"] == 2 * 4 * params           # AdamW's exp_avg and exp_avg_sq
    assert peak.by_category["weights"] == pytest.approx(4 * params, rel=0.01)
    b = budget(an, 0)
    row = next(r for r in b.rows if r.category == "optimizer")
    assert row.expected == pytest.approx(row.measured_max, rel=0.10)


def test_lora_trains_a_sliver_and_checkpointing_cuts_activations():
    _s, lora = load("lora")
    _s, ckpt = load("ckpt")
    lp, cp = lora.devices[0].peak, ckpt.devices[0].peak
    # LoRA: optimizer state for the adapters only (2 x 32,768 fp32 values)
    assert lp.by_category.get("optimizer", 0) == 2 * 4 * RUNS["lora"]["trainable_parameters"]
    assert cp.by_category["activations"] < 0.75 * lp.by_category["activations"]
    c = compare_analyses(lora, ckpt).devices[0]
    assert c.a.peak == lp and c.b.peak == cp and c.peak_delta == cp.bytes - lp.bytes
    assert c.by_category_delta["activations"] == cp.by_category["activations"] - lp.by_category["activations"] < 0


def test_kept_logits_are_one_leak_at_the_forward_call():
    """Each step's logits (bf16, 8 x 256 x 4096) appended to a list: one leak, 16 MiB an
    iteration, made where the model is called."""
    _snap, an = load("leak")
    leaks = an.devices[0].leaks
    assert len(leaks) == 1
    lk = leaks[0]
    assert lk.bytes_per_iteration == 8 * 256 * 4096 * 2
    assert lk.category == "activations"
    # the line of `out = model(input_ids=ids, labels=ids)` in record_cuda.py as it was when
    # the run was recorded (the file has grown since)
    assert Stacks(an).site(lk.site, lk.stack).endswith("record_cuda.py:74:one_run")
    assert lk.cause == "container"
    _s, clean = load("lora")
    assert clean.devices[0].leaks == ()


def test_oom_under_a_process_cap_is_the_third_step_and_says_so():
    _snap, an = load("oom")
    da = an.devices[0]
    assert len(da.ooms) == 1
    its = da.iterations
    assert [it.peak_type == "oom" for it in its] == [False, False, True]
    o = da.ooms[0]
    assert o.device_free > 70 * (1 << 30)                   # the card had room: the 1 GiB cap ran out
    text = oom_diagnosis(o)
    assert "limit set in the process" in text and "fragmented" in text
    # without fragmentation to blame, live tensors fill what the process was allowed, not the card
    import dataclasses
    text = oom_diagnosis(dataclasses.replace(o, fragmentation_bytes=0))
    assert "fill the memory allowed" in text and "fill the device" not in text
    assert o.advice and o.advice[0].lever == "expandable_segments"


def test_gradients_zeroed_in_place_are_the_previous_steps_gradients():
    """zero_grad(set_to_none=False): every parameter's fp32 gradient stays allocated through
    each next step; the finding names them, their bytes and the fix."""
    _snap, an = load("stale")
    sg = an.devices[0].stale_gradients
    assert sg is not None
    assert sg.bytes == 4 * RUNS["stale"]["trainable_parameters"]
    assert sg.iterations == (2, 3, 4) and sg.freed_last == -1          # never freed: zeroed in place
    assert sg.live_at_peak == sg.bytes
    from vramscope.present.words import stale_gradients_text
    text = stale_gradients_text(sg)
    assert "zeroed in place" in text and "zero_grad(set_to_none=True)" in text


def test_generation_is_inference_its_kv_cache_is_named_and_no_training_lever_is_offered():
    _snap, an = load("generate")
    da = an.devices[0]
    from vramscope.classifiers.levers import TRAINING_LEVERS, left_out
    assert not da.run.trains and da.run.kind.value == "inference"
    assert not {a.lever for a in da.peak.advice} & TRAINING_LEVERS
    # the K and V tensors of each decoding step: 2 prompts x 4 heads x 64 dims x fp32 per
    # position, for 32 .. 47 positions (the prompt, then one more each step), 4 layers x K, V
    kv = [i for i in range(len(da.allocs.size)) if da.rule_names[da.rule[i]] == "activations.kv_cache"]
    sizes = sorted(int(da.allocs.size[i]) for i in kv)
    assert sizes == sorted(2 * 4 * 64 * 4 * n for n in range(32, 48) for _ in range(2 * 4))
    # the training runs keep their training levers
    _s, lora = load("lora")
    run = lora.devices[0].run
    assert run.trains and not any("nothing trains" in (left_out(n, run) or "") for n in TRAINING_LEVERS)


def test_a_trace_whose_ring_buffer_wrapped_mid_backward():
    """max_entries=2500: the trace begins inside step 5's backward. The blocks from before it
    that this backward frees are its intermediates (autograd), not gradients; the previous
    step's gradients, the weights and the optimizer state made before the trace are told
    apart by what they are, to the byte."""
    _snap, an = load("wrapped")
    da = an.devices[0]
    a = da.allocs
    params = RUNS["wrapped"]["trainable_parameters"]
    rule = [da.rule_names[r] for r in da.rule]
    cat = [CATEGORIES[c] for c in da.category]
    pre = a.alloc_index < 0

    def total(pred) -> int:
        return int(sum(int(a.size[i]) for i in range(len(a.size)) if pred(i)))

    assert total(lambda i: cat[i] == "optimizer") == 2 * 4 * params
    assert 4 * params <= total(lambda i: cat[i] == "weights") <= 4 * params + 1024      # + rotary buffers
    # step 5's gradients, made before the trace began or in its interrupted backward
    start = da.iterations[0].start_index
    # (one 32 KiB block freed by the trace's very first entry, before the backward is seen,
    # is counted with them)
    assert total(lambda i: a.alloc_index[i] < start and cat[i] == "gradients") == pytest.approx(4 * params,
                                                                                               rel=0.002)
    # what the interrupted backward frees: its own intermediates
    first_bwd = da.timeline.phase[:900] == 3
    assert first_bwd.any()
    assert total(lambda i: pre[i] and rule[i] == "gradients.backward" and a.free_index[i] >= 0
                 and first_bwd[min(int(a.free_index[i]), 899)]) == 0
    assert len(da.iterations) == 1 and da.iterations[0].peak_type == "backward_start"
    assert da.peak.bytes <= RUNS["wrapped"]["max_memory_allocated"] <= da.peak.bytes * 1.01


def test_torch_compile_autotuning_is_named_and_generated_code_is_not_yours():
    """Under torch.compile the first step compiles: Inductor's autotuning benchmarks candidate
    kernels with scratch buffers (the first iteration's peak is higher for them); its
    generated kernels' files (/tmp/torchinductor_<user>/...) are torch's code, not the user's."""
    _snap, an = load("compiled")
    da = an.devices[0]
    its = da.iterations
    assert len(its) == 4
    rule = [da.rule_names[r] for r in da.rule]
    tune = [i for i, r in enumerate(rule) if r == "temporary.compile_autotune"]
    assert tune and all(CATEGORIES[da.category[i]] == "temporary" for i in tune)
    assert max(int(da.allocs.alloc_index[i]) for i in tune) < its[1].start_index     # compiling: step 1 only
    first, later = its[0].peak_bytes, its[1].peak_bytes
    tuned_at_first = sum(int(da.allocs.size[i]) for i in np.flatnonzero(da.live_mask(its[0].peak_index))
                         if rule[i] == "temporary.compile_autotune")
    assert first > later and tuned_at_first >= first - later - 8 * MiB
    params = RUNS["compiled"]["trainable_parameters"]
    assert da.peak.by_category.get("optimizer", 0) in (0, 2 * 4 * params)
    assert sum(int(da.allocs.size[i]) for i, r in enumerate(rule) if r == "optimizer.state") == 2 * 4 * params
    st = Stacks(an)
    for i in range(len(da.allocs.size)):
        assert "torchinductor_" not in st.where(int(da.allocs.stack[i])).split(":")[0]


def test_levers_that_cannot_apply_are_left_out_with_the_reason():
    from vramscope.services.whatif import lever_peaks, levers_left_out
    _s, lora = load("lora")                       # LoRA already, expandable segments on
    out = levers_left_out(lora, 0)
    assert set(out) == {"lora", "expandable_segments", "no_checkpointing"}        # not checkpointed either
    assert "adapters are already there" in out["lora"] and out["expandable_segments"] == "already on"
    assert not {n for n, _t, _r in lever_peaks(lora, 0)} & set(out)
    _s, gen = load("generate")                    # inference: no training lever
    assert {"checkpointing", "adam8bit", "paged_optimizer", "lora"} <= set(levers_left_out(gen, 0))
    # full training of a model built from a config: nothing in the trace shows a pretrained
    # model or frozen weights, so LoRA and 4-bit weights are left out, saying why and how to ask
    _s, full = load("full")
    out = levers_left_out(full, 0)
    assert set(out) == {"lora", "4bit", "no_checkpointing"}
    assert "no pretrained model loaded" in out["lora"] and "no frozen weights" in out["4bit"]
    assert all("whatif" in out[n] for n in ("lora", "4bit"))
    assert out["no_checkpointing"] == "the run is not checkpointed"
