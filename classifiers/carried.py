"""Categories a trimmed export carries from the whole run's analysis.

A trimmed snapshot (`vramscope export --trim`, `--around-peak`) holds a window of the trace:
read on its own, a block from before the window has no lifetime, a backward has no forward
before it, and an allocation can come out in another category than the whole run gave it (a
4-byte loss gradient read as a parameter's gradient). The export therefore writes what the
whole run's analysis said of every allocation in the window under one top-level key, and the
analysis of the trimmed file takes it back: each category keeps its rule and its evidence.

    {"vramscope_categories": {"schema": 1, "device": 0, "rules": [names],
                              "addr": [...], "index": [...],     # index: in the trimmed trace, -1 before it
                              "category": "abc...",              # one letter per row: "a" + category code
                              "rule": [...],                     # indices into "rules"
                              "evidence": "0123..."}}            # one digit per row: the evidence code

Everything is checked (an untrusted file may carry anything): a document that does not hold
together is ignored as a whole.
"""
from __future__ import annotations

import numpy as np

from .categories import CATEGORIES
from .evidence import EVIDENCE

KEY = "vramscope_categories"
SCHEMA = 1
MAX_ROWS = 20_000           # three values per row stay within the parser's bounds on a kept value


def carried_document(da, rule_names: list[str], rows: np.ndarray, new_index: np.ndarray) -> dict | None:
    """The document for `rows` of `da` (their indices in the trimmed trace: `new_index`, -1
    for blocks from before the window); None when there are too many to carry."""
    if len(rows) > MAX_ROWS:
        return None
    rule = np.asarray(da.rule)[rows]
    used = sorted(set(rule.tolist()))
    at = {r: k for k, r in enumerate(used)}
    return {"schema": SCHEMA, "device": int(da.device), "rules": [rule_names[r] for r in used],
            "addr": da.allocs.addr[rows].tolist(), "index": [int(i) for i in new_index],
            "category": "".join(chr(97 + int(c)) for c in np.asarray(da.category)[rows]),
            "rule": [at[r] for r in rule.tolist()],
            "evidence": "".join(str(int(e)) for e in np.asarray(da.evidence)[rows])}


def _valid(doc, device: int):
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("device") != device:
        return None
    addr, index, rule, rules = doc.get("addr"), doc.get("index"), doc.get("rule"), doc.get("rules")
    cat, ev = doc.get("category"), doc.get("evidence")
    if not (isinstance(addr, list) and isinstance(index, list) and isinstance(rule, list) and isinstance(rules, list)
            and isinstance(cat, str) and isinstance(ev, str)):
        return None
    n = len(addr)
    if not (len(index) == len(rule) == len(cat) == len(ev) == n) or n > MAX_ROWS:
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in addr + index + rule):
        return None
    if not all(isinstance(r, str) for r in rules) or any(not 0 <= r < len(rules) for r in rule):
        return None
    cats = [ord(c) - 97 for c in cat]
    evs = [ord(c) - 48 for c in ev]
    if any(not 0 <= c < len(CATEGORIES) for c in cats) or any(not 0 <= e < len(EVIDENCE) for e in evs):
        return None
    return addr, index, cats, [rules[r] for r in rule], evs


def apply_carried(snap, device: int, allocs, category: np.ndarray, rule: np.ndarray, evidence: np.ndarray,
                  rule_names: list[str]) -> int:
    """Take the categories a trimmed export carries (see the module docstring), in place;
    returns how many rows took one. A rule the rules in effect do not know keeps the rule
    that fired here."""
    extra = getattr(snap, "extra", None) or {}
    got = _valid(extra.get(KEY), device)
    if got is None:
        return 0
    addr, index, cats, rules, evs = got
    where = {(int(a), int(i)): r for r, (a, i) in enumerate(zip(allocs.addr.tolist(), allocs.alloc_index.tolist()))}
    code = {name: k for k, name in enumerate(rule_names)}
    n = 0
    for a, i, c, rname, e in zip(addr, index, cats, rules, evs):
        r = where.get((a, i))
        if r is None:
            continue
        category[r] = c
        evidence[r] = e
        if rname in code:
            rule[r] = code[rname]
        n += 1
    return n


__all__ = ["KEY", "carried_document", "apply_carried"]
