"""Seeded fuzzing over the real snapshots and the fixtures, in the test run (well under a minute).

Every mutated file (tests/data/fuzzing.py: bit flips, truncation, splices, integers replaced
by huge and negative values, wrong types, deep nesting, shared references, ...) must end in
exit 0 or exit 3 with one line, and the fast path must read it exactly as the general
interpreter does. Most cases run in this process through `vramscope.cli.main`; the ones that
could crash or exhaust memory run in a worker process under an address-space limit. Every
finding of the long campaign (tests/data/fuzz_campaign.py) is kept in
tests/data/fuzz_regressions.json and replayed here.
"""
from __future__ import annotations

import json
import os
import random
import sys

import pytest

from helpers import DATA, GROUNDTRUTH, SHARED

sys.path.insert(0, str(DATA))
import fuzz_campaign  # noqa: E402
import fuzzing  # noqa: E402

CASES_PER_KIND = 8           # x 15 kinds, in process
SEED = 20240611


def _seeds(max_bytes=600_000) -> list[str]:
    # the fixtures, the smallest real CUDA recording (cuda_oom) included
    out = sorted(str(p) for p in DATA.glob("*.pickle") if p.stat().st_size <= 800_000)
    out += sorted(str(p) for p in GROUNDTRUTH.glob("*.pickle") if p.stat().st_size <= max_bytes)[:3]
    if SHARED.is_dir():
        out += sorted(str(p) for p in SHARED.iterdir()
                      if p.suffix in (".pickle", ".pkl") and p.stat().st_size <= max_bytes)
    return out


def _cases(kinds, per_kind, seed) -> list[dict]:
    rng = random.Random(seed)
    seeds = _seeds()
    out = []
    for kind in kinds:
        for _ in range(per_kind):
            out.append({"i": len(out), "seed": fuzz_campaign.rel(rng.choice(seeds)),
                        "other": fuzz_campaign.rel(rng.choice(seeds)), "kind": kind, "rng": rng.randrange(1 << 31)})
    return out


@pytest.fixture
def no_cache(monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")


@pytest.mark.parametrize("kind", fuzzing.KINDS)
def test_mutated_snapshots_end_in_exit_0_or_3(kind, tmp_path, no_cache):
    findings = []
    outcomes = []
    for c in _cases([kind], CASES_PER_KIND, SEED + fuzzing.KINDS.index(kind)):
        outcome, detail = fuzzing.check_bytes(fuzz_campaign.case_data(c), str(tmp_path / "m.pickle"))
        outcomes.append(outcome)
        if outcome == "FAIL":
            findings.append(f"{c['seed']} {kind} rng={c['rng']}: {detail}")
    assert not findings, "\n".join(findings)
    assert set(outcomes) <= {"ok", "refused"}


def test_crash_and_memory_cases_in_a_limited_process():
    """Deep nesting and shared references (the mutations that once overflowed the C stack or
    blew memory up) in a worker under a 2 GB address-space limit: a segfault or MemoryError
    kills the worker and shows up as a failed case."""
    cases = _cases(("deep_nesting", "shared_ref", "memo_ref"), 4, SEED + 99)
    results = fuzz_campaign.run_cases(cases, max_as_gb=2.0, timeout=30, progress=False)
    bad = [f"{c['seed']} {c['kind']} rng={c['rng']}: {results[c['i']][1]}" for c in cases
           if results[c["i"]][0] == "FAIL"]
    assert not bad, "\n".join(bad)


def _regressions() -> list[dict]:
    if not os.path.exists(fuzz_campaign.REGRESSIONS):
        return []
    with open(fuzz_campaign.REGRESSIONS) as fh:
        return json.load(fh)


@pytest.mark.parametrize("case", _regressions(), ids=lambda c: c["name"])
def test_fuzz_regressions(case, tmp_path, no_cache):
    if "hex" not in case and case["seed"].startswith("shared:") and not SHARED.is_dir():
        pytest.skip("its seed is in ../shared/snapshots")
    outcome, detail = fuzzing.check_bytes(fuzz_campaign.case_data(case), str(tmp_path / "r.pickle"))
    assert outcome in ("ok", "refused"), f"{case['found']} -> now: {detail}"
