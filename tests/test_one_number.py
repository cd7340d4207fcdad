"""One lever, one number: the saving an advice item shows (summary --json, the OOM findings, the
report, the viewer) is the lever's simulated peak difference, the number `whatif --lever`
gives; an estimate says it is one. On every real snapshot of ../shared and every fixture."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import DATA, GROUNDTRUTH, SHARED
from vramscope.classifiers import analyze
from vramscope.classifiers.levers import LEVERS
from vramscope.classifiers.whatif import what_if
from vramscope.parsers import open_snapshot
from vramscope.services.summary import summary_document

FILES = sorted([p for p in DATA.glob("*.pickle")] + [p for p in DATA.glob("facts/*.pickle")]
               + [p for p in GROUNDTRUTH.glob("*.pickle")]
               + ([p for p in SHARED.glob("*.p*") if not p.name.startswith("NOT_A")] if SHARED.is_dir() else []))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_advice_saves_what_whatif_simulates(path: Path):
    an = analyze(open_snapshot(str(path), use_cache=False))
    doc = summary_document(an)
    for d in doc["devices"]:
        dev = d["device"]
        peak = d["peak"]["bytes"]
        items = list(d["peak"]["advice"]) + [a for o in d["ooms"] for a in o["advice"]]
        for a in items:
            lv = LEVERS.get(a["lever"])
            if lv is None or not lv.simulated:
                assert a["estimate"], a         # a factor's estimate says so
                continue
            assert not a["estimate"]
            r = what_if(an, dev, levers=[a["lever"]], with_budget=False)
            assert r.prediction, (a, r.note)
            assert abs(a["saves_bytes"] - (r.baseline.bytes - r.scaled.bytes)) <= 0.01 * peak, (a, r.scaled.bytes)
