"""Every shared real snapshot against its card (../shared/snapshots/cards): each fact the card
decides, read from the script that wrote it, against `devices[].run` of `summary --json`, and
none of the card's `must_not_say` claims in `summary`, `whatif` or report.md. The mapping
between the card's facts and ours is in tests/cards.py (`python tests/cards.py` prints it all).
Skipped without ../shared."""
from __future__ import annotations

import json

import pytest

from cards import cards, forbidden, run_facts, texts, wrong_facts
from helpers import needs_shared

CARDS = cards()
# a card whose fact vramscope has no way to see in the file (said in the closing note)
KNOWN: set = set()     # (file, fact) where we are sure the card is wrong: none


@needs_shared
@pytest.mark.parametrize("card", CARDS, ids=[c["file"] for c in CARDS])
def test_the_card_facts_and_no_forbidden_claim(card):
    if not card["path"].exists():
        pytest.skip(f"{card['file']} is not in ../shared/snapshots")
    txt = texts(card["path"])
    run = run_facts(json.loads(txt["summary_json"]))
    wrong = [w for w in wrong_facts(card, run) if (card["file"], w.split(":")[0]) not in KNOWN]
    assert not wrong, wrong
    bad = forbidden(card, txt)
    assert not bad, bad


@needs_shared
def test_every_card_is_checked():
    assert len(CARDS) >= 24 and all(c["path"].exists() for c in CARDS)


def test_a_fact_the_card_decides_and_vramscope_contradicts_is_caught():
    """The checker itself: a wrong backward, a wrong kind, an unknown where the trace tells."""
    card = {"facts": {"trace_recorded": True, "backward_in_trace": False, "kind": "inference",
                      "optimizer_step_in_trace": False}}
    fact = {"value": None, "evidence": "none", "why": ""}
    run = {"recorded": {**fact, "value": "trace"}, "backward": {**fact, "value": True},
           "optimizer_step": {**fact, "value": False}, "kind": {**fact, "value": "training"}}
    wrong = wrong_facts(card, run)
    assert any(w.startswith("backward") for w in wrong) and any(w.startswith("kind") for w in wrong)
    run["backward"] = {**fact, "value": None}          # a trace with frames must decide it
    assert any(w.startswith("backward") for w in wrong_facts(card, run))
    claim = {"must_not_say": [{"claim": "x", "regex": "gradient accumulation"}]}
    assert forbidden(claim, {"summary": "half the micro-batch, with twice the gradient accumulation steps"})
