"""How sure a category is: the evidence each allocation's tag rests on (DESIGN.md §3).

Every allocation row gets one of these, stored as its code (a uint8 per row, the index in
`EVIDENCE`; never reorder, only append), strongest first:

  torch     torch's own tag: the `category` a profiler-converted snapshot carries, or a
            component tag of torch's memory tracker
  stack     the allocation's own frames matched a rule (a marker, the phase its stack
            names, the op that made it)
  lifetime  when it was allocated and freed within the recorded phases decided it; its
            frames said nothing
  guess     neither: e.g. live before recording began, no frames, never freed. The
            category is the likeliest reading of the context, and every surface says so
  none      no rule recognised it (category `unknown`)

Each rule of rules.toml states the evidence it rests on (`evidence = ...`); a user's rule
without one gets it from its conditions (`rule_evidence`). A rule that reads a lifetime
cannot know one the trace did not record: on a block live before the trace and never
freed its verdict is a guess (`row_evidence`).

Advice and budgets rest on `torch`, `stack` and `lifetime` bytes (`EVIDENCED`), never on
guesses alone.
"""
from __future__ import annotations

import numpy as np

EVIDENCE: tuple[str, ...] = ("torch", "stack", "lifetime", "guess", "none")
EVIDENCE_CODE: dict[str, int] = {e: i for i, e in enumerate(EVIDENCE)}
E_TORCH, E_STACK, E_LIFETIME, E_GUESS, E_NONE = range(5)
EVIDENCED: tuple[str, ...] = ("torch", "stack", "lifetime")

# what each level means, in one line (tooltips, the report, the README's "How sure is it?")
EVIDENCE_MEANING: dict[str, str] = {
    "torch": "torch's own tag for this allocation",
    "stack": "its own stack matched a rule",
    "lifetime": "when it was allocated and freed decided it (its stack said nothing)",
    "guess": "a guess: no stack and no recorded lifetime to go on",
    "none": "no rule recognised it",
}

# rule conditions that read the allocation's own frames, and those that read its lifetime
_STACK_KEYS = ("markers", "stack_phase", "top", "op", "innermost", "free_markers", "free_not_markers")
_LIFETIME_KEYS = ("phase", "free_phase", "freed", "before_training", "max_allocs_alive", "freed_within")


def rule_evidence(rule) -> str:
    """The evidence a rule rests on when its file does not say: `stack` when any of its
    conditions reads the frames, else `lifetime` when one reads when it lived, else `guess`."""
    if any(getattr(rule, k, None) for k in _STACK_KEYS):
        return "stack"
    if any(getattr(rule, k, None) is not None for k in _LIFETIME_KEYS):
        return "guess" if getattr(rule, "preexisting", None) and getattr(rule, "freed", None) == ("never",) \
            else "lifetime"
    return "guess"


def row_evidence(rule_code: np.ndarray, rule_levels: np.ndarray, framed: np.ndarray, pre: np.ndarray,
                 never_freed: np.ndarray, phase_from_stack: np.ndarray) -> np.ndarray:
    """uint8 evidence per row from the rule that fired (`rule_code`, 0 = none; `rule_levels`:
    the evidence code of each rule, index 0 for `none`), corrected for what the row itself
    could show:
      * no frames and never freed: nothing was seen of it but its size, so any verdict is a
        guess (a stack rule may still match on the absence of a marker);
      * a lifetime verdict on a block live before the trace and never freed: the trace saw
        no lifetime; when its frames named the phase it was made in (what the rule read),
        the verdict rests on its stack, else it is a guess;
      * a stack verdict on a row without frames that the trace saw freed: its lifetime."""
    ev = rule_levels[rule_code].astype(np.uint8)
    unseen = ~framed & never_freed
    stack_bare = (ev == E_STACK) & ~framed
    ev[stack_bare] = E_LIFETIME
    pre_kept = (ev == E_LIFETIME) & pre & never_freed
    ev[pre_kept & phase_from_stack & framed] = E_STACK
    ev[pre_kept & ~(phase_from_stack & framed)] = E_GUESS
    ev[unseen & (ev != E_NONE)] = E_GUESS
    ev[rule_code == 0] = E_NONE
    return ev


def bytes_by_evidence(evidence: np.ndarray, size: np.ndarray, rows: np.ndarray) -> dict[str, int]:
    """{evidence: bytes} of `rows`, non-zero only, strongest first."""
    if not len(rows):
        return {}
    b = np.bincount(evidence[rows], weights=size[rows].astype(np.float64), minlength=len(EVIDENCE))
    return {e: int(v) for e, v in zip(EVIDENCE, b) if v}


__all__ = ["EVIDENCE", "EVIDENCE_CODE", "EVIDENCED", "EVIDENCE_MEANING", "E_TORCH", "E_STACK", "E_LIFETIME",
           "E_GUESS", "E_NONE", "rule_evidence", "row_evidence", "bytes_by_evidence"]
