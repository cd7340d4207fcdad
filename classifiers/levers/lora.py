"""LoRA instead of full fine-tuning, simulated on the recorded timeline.

The weights stay (frozen); gradients, optimizer state and optimizer scratch shrink to the
adapters' parameters, whose fp32 weights are added; each adapted matrix saves its input to B
(tokens x r) until the block's backward and, at its backward, holds one more tokens x in
tensor (the adapter's gradient of x beside the base's); nothing before the first block is kept
(frozen embeddings), nor the LM head's input or a Python norm's `weight * x` input (frozen
weights need no gradient).

Which matrices get adapters (`targets`, `whatif --lora-targets`): `all-linear` (peft's
`all-linear`, the default: every weight matrix of the blocks), `attention` (the attention
projections: q, k, v, o or a fused qkv), `q,v`, or a comma list of module names (q_proj,
v_proj, gate_proj, ...: each name is one matrix of its kind per block). A snapshot does not
name modules; a block's matrices are told apart by shape: one side the model's width, the other
at most the width (q, k, v, o; k and v narrower under grouped-query attention) or three times
it (a fused qkv) for attention, anything wider for the MLP.
"""
from __future__ import annotations

import math

import numpy as np

from ...common.arrays import isin
from ..structure import R_OUTPUT, R_RECOMPUTE_SAVED, R_SAVED
from ..timeline import P_BACKWARD, P_OPTIMIZER
from .base import Applied, Lever, LeverError, Measured
from .common import evidence_why_not, training_why_not
from .structural import _CAT, block_matrices, frozen_base, scale_rows

LORA_RANK = 8
ADAPTER_BYTES = 4           # adapters (and their gradients) in fp32, as PEFT keeps them
LORA_ALREADY = 0.05         # a trainable share below this is already LoRA-sized
TARGETS_DEFAULT = "all-linear"
_ATTENTION_NAMES = {"q", "k", "v", "o", "q_proj", "k_proj", "v_proj", "o_proj", "query", "key", "value", "qkv",
                    "c_attn", "query_key_value", "wqkv", "out_proj", "qkv_proj", "self_attn", "attn", "attention",
                    "to_q", "to_k", "to_v", "to_out", "wq", "wk", "wv", "wo_attn"}
_NARROW_NAMES = {"k", "v", "k_proj", "v_proj", "key", "value", "to_k", "to_v", "wk", "wv"}
_MLP_NAMES = {"gate_proj", "up_proj", "down_proj", "fc1", "fc2", "c_fc", "w1", "w2", "w3", "wi", "wo", "wi_0",
              "wi_1", "dense_h_to_4h", "dense_4h_to_h", "mlp", "ffn", "gate", "up", "down", "fc_in", "fc_out"}


def parse_targets(text: str | None) -> str:
    """'all-linear' | 'attention' | 'q,v' | 'q_proj,v_proj,...' (checked); raises LeverError."""
    t = (text or TARGETS_DEFAULT).strip().lower()
    if t in ("all-linear", "all_linear", "all"):
        return "all-linear"
    if t in ("attention", "attn"):
        return "attention"
    names = [n.strip() for n in t.split(",") if n.strip()]
    unknown = [n for n in names if n not in _ATTENTION_NAMES and n not in _MLP_NAMES]
    if not names or unknown:
        raise LeverError(f"--lora-targets {text!r}: expected all-linear, attention, q,v or module names such as "
                         f"q_proj,v_proj,gate_proj (unknown: {', '.join(unknown) or 'none given'})")
    return ",".join(names)


def _kinds(mats, width):
    """Per (numel, count) of the blocks' matrices: 'attention' or 'mlp' (by the side that is not
    the width: at most the width, or three times it for a fused qkv, is attention)."""
    out = []
    for numel, k in mats:
        other = numel / width if width else math.sqrt(numel)
        out.append("attention" if other <= width * 1.0001 or abs(other - 3 * width) < 1 else "mlp")
    return out


def select_targets(mats, width, targets: str, n_blocks: int) -> list:
    """The (numel, count) of the matrices that get adapters, of the blocks' `mats`."""
    if targets == "all-linear" or not mats:
        return list(mats)
    kinds = _kinds(mats, width)
    att = [(m, k) for (m, k), kd in zip(mats, kinds) if kd == "attention"]
    mlp = [(m, k) for (m, k), kd in zip(mats, kinds) if kd == "mlp"]
    if targets == "attention":
        return att
    names = targets.split(",")
    out: dict = {}

    def take(pool, n, narrow: bool):
        # `n` matrices per block from the pool: the narrowest sizes first for k/v (grouped-query
        # attention makes them narrower), the widest first otherwise
        pool = sorted(pool, key=lambda mk: mk[0], reverse=not narrow)
        for m, k in pool:
            if n <= 0:
                break
            have = out.get(m, 0)
            room = k - have
            per_block = room // max(1, n_blocks)
            if per_block <= 0:
                continue
            use = min(per_block, n)
            out[m] = have + use * n_blocks
            n -= use
    for nm in names:
        if nm in _ATTENTION_NAMES:
            take(att, 1, nm in _NARROW_NAMES)
        else:
            take(mlp, 1, False)
    return [(m, k) for m, k in out.items()]


def lora_adapter_params(da, st, facts, rank: int, targets: str = TARGETS_DEFAULT) -> tuple[int, int, str, list, int]:
    """(adapter parameters, adapted matrices, how they were counted, the adapted (numel, count),
    the width) for rank-`rank` adapters on the `targets` of the blocks: r.(in + out) each, one
    side being the width."""
    mats, width = block_matrices(da, st, facts)
    n_blocks = st.blocks.count if st.blocks is not None else 1
    chosen = select_targets(mats, width, targets, n_blocks)
    total = 0
    for numel, k in chosen:
        side = width if width else math.sqrt(numel)
        total += k * int(round(rank * (side + numel / side)))
    n_mats = sum(k for _, k in chosen)
    which = {"all-linear": "every weight matrix of the blocks (all-linear)",
             "attention": "the attention projections of the blocks"}.get(targets, f"{targets} of each block")
    how = (f"{n_mats} weight matrices: {which}, r.(width + numel / width) parameters each, width {width}"
           if width else f"{n_mats} weight matrices: {which}, taken as square (no width found)")
    return total, n_mats, how, chosen, width or 0


class Lora(Lever):
    name = "lora"
    title = "LoRA instead of full fine-tuning"
    simulated = True
    summary = ("simulated on the recorded timeline: frozen weights; gradients and optimizer state for rank-8 "
               "adapters on the targeted matrices of the blocks (all-linear unless --lora-targets says); the "
               "adapters' own tensors added")
    training = True
    measured = (
        Measured("llama_tied, H100 dev", "transformer/fp32/full", 0.03375, 0, 0.03375, 1),
        Measured("tiny GPT (CPU grid)", "transformer/fp32/full", 0.001079, 0, 0.002826, 32),
    )

    def why_not(self, run, expandable=False):
        why = evidence_why_not(run) or training_why_not(run)
        if why is not None or run is None:
            return why
        if run.adapters.value:
            return "LoRA/PEFT adapters are already there (their frames are in the trace)"
        share = run.trainable_share
        if share is not None and share < LORA_ALREADY:
            return f"already trains only {share:.1%} of the weights it shows"
        if not run.fine_tuning:
            return ("the trace shows no pretrained model loaded and no frozen weights (training from scratch?); "
                    "on a pretrained model, adapters would shrink the gradients and optimizer state "
                    "(whatif --lever lora simulates it)")
        return None

    def apply(self, rw, ctx) -> Applied:
        da, st, facts, rank = ctx.da, ctx.structure, ctx.facts, ctx.lora_rank
        if facts is None or not facts.trainable_params:
            return Applied(self.name, False, "no trainable parameters recognized (no weight has a gradient of its "
                                             "size): nothing to replace with adapters, no prediction is made")
        if ctx.lora_targets != "all-linear":
            return Applied(self.name, False, f"adapters on only some matrices ({ctx.lora_targets}): the frozen matrices "
                                             f"without one no longer keep their inputs for a weight gradient, which "
                                             f"this simulation does not model (measured: q,v predicted 10% high on a "
                                             f"Llama); no prediction is made (all-linear is simulated)")
        p_adapt, n_mats, how, chosen, width = lora_adapter_params(da, st, facts, rank, ctx.lora_targets)
        if not p_adapt:
            return Applied(self.name, False, "no weight matrices repeated by the blocks (or none of the targets): "
                                             "nothing to put adapters on, no prediction is made")
        phi = min(1.0, p_adapt / facts.trainable_params)
        cat, ai = rw.cat, rw.ai
        ph = da.timeline.phase if da.timeline is not None else np.zeros(0, np.uint8)
        opt_scratch = np.zeros(len(cat), dtype=bool)
        if len(ph):
            opt_scratch = (cat == _CAT["temporary"]) & (ai >= 0) & (ph[np.clip(ai, 0, len(ph) - 1)] == P_OPTIMIZER)
        for sel in (cat == _CAT["gradients"], cat == _CAT["optimizer"], opt_scratch):
            scale_rows(rw, sel, phi)
        rw.add_new([-1], [-1], [p_adapt * ADAPTER_BYTES], "weights", False)
        frozen_base(rw, st)
        _adapter_branch(rw, st, da, facts, rank, n_mats, chosen, width)
        return Applied(self.name, True,
                       f"LoRA of rank {rank} instead of full fine-tuning: the weights stay (frozen); "
                       f"gradients, optimizer state and optimizer scratch shrink to the adapters' {p_adapt:,} "
                       f"parameters ({phi:.2%} of the {facts.trainable_params:,} trained now; {how}), whose fp32 "
                       f"weights are added; each adapted matrix saves its input to B (tokens x r) until the block's "
                       f"backward and, at its backward, holds one more tokens x in tensor (the adapter's gradient of "
                       f"x beside the base's); nothing before the first block is kept (frozen embeddings), nor the "
                       f"LM head's input or a Python norm's `weight * x` input (frozen weights need no gradient)")


def _adapter_branch(rw, st, da, facts, rank: int, n_mats: int, chosen: list, width: int) -> None:
    """The adapter branch of each adapted matrix: x @ A^T (tokens x r) saved from the block's
    forward (its recompute, when checkpointed) until its backward; in backward, at the matrix's
    gradient (full fine-tuning makes it there), the branch's gradients: tokens x (its larger
    side + r), freed when the matrix's backward is done. Of the gradients of a size only some
    adapted (`chosen` counts fewer than there are), those taken are spread evenly."""
    if st.blocks is None or not st.blocks.count or not st.output_bytes or not width:
        return
    # the residual stream in the weights' dtype (fp32 weights under autocast: an fp32 stream)
    act = float(facts.trainable_dtype_bytes or 4.0)
    tokens = st.output_bytes / (width * act)
    per_block = n_mats // st.blocks.count
    xa = int(round(tokens * rank * act))
    fi = rw.fi
    starts = {(w.forward_pass, w.block): w for w in st.recomputes}
    for c in st.calls:
        rr = st.role[c.rows]               # (comparisons, not np.isin: once per call)
        saved = c.rows[(rr == R_SAVED) | (rr == R_OUTPUT)]
        w = starts.get((c.forward_pass, c.block))
        if w is not None:
            saved = w.rows[st.role[w.rows] == R_RECOMPUTE_SAVED]
        if not len(saved) or not per_block:
            continue
        frees = np.sort(fi[saved])
        at = frees[np.linspace(0, len(frees) - 1, per_block).astype(int)]
        f_keys = np.array([rw.after(int(x), 1)[0] for x in at.tolist()], dtype=np.int64)
        rw.add_new(rw.after(w.end if w is not None else c.last, per_block), f_keys, [xa] * per_block,
                   "activations", True)
    # the branch's gradients, where full fine-tuning makes each matrix's gradient: the adapter's
    # gradient of x (tokens x in) and its sum with the base's come beside the base's own, while
    # x itself, which the frozen base does not keep, has gone after A's gradient: one tokens x in
    # tensor more than full fine-tuning has there. `in` is the side whose tokens x in tensor full
    # fine-tuning allocates next to the matrix's gradient (its input's gradient); the larger side
    # where none is seen
    ratio = facts.gradient_ratio if facts.gradient_ratio else 1.0
    dt = facts.trainable_dtype_bytes or 4.0
    sides = {int(round(m * dt * ratio)): (width, m / width) for m, _k in chosen}
    cat = np.asarray(da.category)
    size = np.asarray(da.allocs.size, dtype=np.int64)
    g = np.flatnonzero((cat == _CAT["gradients"]) & (rw.ai >= 0) & isin(size, list(sides)))
    ph = da.timeline.phase
    g = g[ph[rw.ai[g]] == P_BACKWARD]
    g = g[np.argsort(rw.ai[g], kind="stable")]
    # of each size, the share adapted: evenly spread over its gradients
    keep = np.zeros(len(g), dtype=bool)
    mats, _ = block_matrices(da, st, facts)
    have = {int(round(m * dt * ratio)): k for m, k in mats}
    for m, k in chosen:
        s = int(round(m * dt * ratio))
        pos = np.flatnonzero(size[g] == s)
        frac = min(1.0, k / max(1, have.get(s, k)))
        if len(pos):
            take = np.floor(np.arange(len(pos)) * frac + 1e-9) != np.floor((np.arange(len(pos)) - 1) * frac + 1e-9)
            keep[pos[take]] = True
    g = g[keep]
    by_entry = np.full(len(ph), -1, dtype=np.int64)
    has = rw.ai >= 0
    by_entry[rw.ai[has]] = np.flatnonzero(has)
    alloc_entries = np.sort(rw.ai[has]).astype(np.int64)
    for r in g.tolist():
        e = int(rw.ai[r])
        a_side, b_side = sides[int(size[r])]
        k = int(np.searchsorted(alloc_entries, e))
        near = [alloc_entries[j] for j in (k - 1, k + 1) if 0 <= j < len(alloc_entries)]
        fin, end = max(a_side, b_side), e
        for x in near:
            nb = int(size[by_entry[x]])
            hit = [sd for sd in (a_side, b_side) if abs(nb - tokens * sd * act) < 1]
            if hit and cat[by_entry[x]] == _CAT["autograd"]:
                fin, end = hit[0], max(e, int(x))
                break
        nbytes = int(round(tokens * fin * act))
        rw.add_new(rw.after(e - 1, 1), rw.after(end, 1), [nbytes], "autograd", True)


__all__ = ["Lora", "LORA_RANK", "TARGETS_DEFAULT", "parse_targets", "select_targets", "lora_adapter_params",
           "ADAPTER_BYTES"]
