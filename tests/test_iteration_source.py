"""How a run's iterations were found, and what that makes of their count: a backward or an
optimizer step ends each one ("phases"), else they are forward runs told apart by the work
between them ("forward_runs") or memory's repetition ("periodicity"), and every surface says
the count is a guess there. Before, `summary` said "iterations 22" for one octree-NCA
inference over a slide (its card: 1), and 6 for DeComFL's 2 rounds, as firmly as a training
run's count."""
from __future__ import annotations

import json

import pytest

from vramscope.present.words import ITERATION_SOURCE_WORDS

from helpers import DATA, SHARED, analysis_of, require, shared

import sys
sys.path.insert(0, str(DATA))
import fuzzing  # noqa: E402

CARDS = SHARED / "cards"
FORWARD_NOTE = ITERATION_SOURCE_WORDS["forward_runs"]


@pytest.mark.parametrize("name, source", [("forward_only_loop.pickle", "forward_runs"),
                                          ("cuda_generate.pickle", "forward_runs"),
                                          ("cuda_full.pickle", "phases"), ("clean_loop.pickle", "phases"),
                                          ("keep_loss.pickle", "phases")])
def test_the_iterations_say_how_they_were_found(name, source):
    an = analysis_of(require(DATA / name))
    its = [it for da in an.devices.values() for it in da.iterations]
    assert its and {it.source for it in its} == {source}


def _summary(path) -> tuple[str, dict]:
    rc, text, err = fuzzing.run_cli(["summary", str(path), "--no-cache"])
    assert rc == 0, err
    rc, js, err = fuzzing.run_cli(["summary", str(path), "--json", "--no-cache"])
    assert rc == 0, err
    return text.decode(), json.loads(js)


@pytest.mark.parametrize("name", ["forward_only_loop.pickle", "cuda_full.pickle"])
def test_summary_and_report_call_the_count_a_guess_only_where_it_is_one(name, tmp_path):
    path = require(DATA / name)
    text, doc = _summary(path)
    guess = {it["source"] for d in doc["devices"] for it in d["iterations"]} == {"forward_runs"}
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("iterations"))
    assert (FORWARD_NOTE in line) == guess
    rc, _, err = fuzzing.run_cli(["report", str(path), "-o", str(tmp_path / "r"), "--no-cache"])
    assert rc == 0, err
    md = (tmp_path / "r" / "report.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| Iterations |"))
    assert (FORWARD_NOTE in row) == guess


def _cards():
    if not CARDS.is_dir():
        return []
    out = []
    for p in sorted(CARDS.glob("*.json")):
        card = json.loads(p.read_text())
        f = card["facts"]
        if f.get("backward_in_trace") is False and f.get("optimizer_step_in_trace") is False \
                and f.get("trace_recorded", True):
            out.append(card["file"])
    return out


@pytest.mark.parametrize("name", _cards() or ["(no cards)"])
def test_no_forward_only_run_states_its_iteration_count_as_a_fact(name):
    """Every shared run its card says had neither a backward nor an optimizer step: where we
    count iterations at all, the count is said to be a guess."""
    if name == "(no cards)":
        pytest.skip("../shared/snapshots/cards is not here")
    text, doc = _summary(require(shared(name)))
    for d in doc["devices"]:
        assert all(it["source"] != "phases" for it in d["iterations"]), name
    for ln in text.splitlines():
        if ln.strip().startswith("iterations") and ln.split()[1] != "0":
            assert "a guess" in ln, (name, ln)


@pytest.mark.parametrize("name, guess", [("forward_only_loop.pickle", True), ("cuda_full.pickle", False)])
def test_the_viewer_says_it_too(qt, window, name, guess):
    pytest.importorskip("PySide6")
    from viewer_helpers import open_and_wait
    open_and_wait(qt, window, require(DATA / name))
    label = window.findings_panel.summary
    assert "iterations found" in label.text()
    assert ("(a guess)" in label.text()) == guess
    assert (FORWARD_NOTE in label.toolTip()) == guess
