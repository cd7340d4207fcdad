"""On a big trace the timeline is built on a thread beside the pairing of the rows, on a guess
(read off the trace's first entries) of whether frees carry their allocation's frames, the one
thing it reads of the rows; classify checks the guess against the rows and builds it again where
it was wrong. Either way the analysis is the one built in order."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from helpers import DATA
from test_analysis_cache import assert_same_analysis
from vramscope.classifiers import analysis as analysis_module
from vramscope.classifiers import analyze, engine
from vramscope.classifiers.timeline import frees_carry_alloc_frames, guess_frees_carry_alloc_frames
from vramscope.parsers import allocations, open_snapshot

# frees with their own frames (most), with the allocation's (torch 2.0's `free`), completions not
# recorded (free_requested only), several devices, an OOM, annotations
FILES = ["cuda_full.pickle", "torch20_history.pickle", "skip_actions.pickle", "multi_device.pickle",
         "cuda_oom.pickle", "annotated_210.pickle", "forward_only_loop.pickle"]


def _fresh(name):
    return analyze(open_snapshot(str(DATA / name), use_cache=False), use_cache=False)


@pytest.fixture
def calls(monkeypatch):
    """The threads timeline_of ran on, wherever it is called from."""
    seen: list[str] = []
    real = engine.timeline_of

    def counted(*a, **k):
        seen.append(threading.current_thread().name)
        return real(*a, **k)
    monkeypatch.setattr(engine, "timeline_of", counted)
    monkeypatch.setattr(analysis_module, "timeline_of", counted)
    return seen


@pytest.mark.parametrize("name", FILES)
def test_the_guess_is_the_rows_answer(name):
    snap = open_snapshot(str(DATA / name), use_cache=False)
    answers = set()
    for dev in snap.devices:
        t = snap.trace(dev)
        if not len(t):
            continue
        exact = frees_carry_alloc_frames(allocations(snap, dev), np.asarray(t.columns["stack"]), False)
        assert guess_frees_carry_alloc_frames(t) == exact
        answers.add(exact)
    assert answers


@pytest.mark.parametrize("name", FILES)
def test_begun_beside_the_pairing_it_is_the_same_analysis(name, monkeypatch, calls):
    want = _fresh(name)
    assert calls and all(c == threading.main_thread().name for c in calls)     # small: in order
    calls.clear()
    monkeypatch.setattr(analysis_module, "_TIMELINE_BESIDE_ENTRIES", 0)
    got = _fresh(name)
    n_dev = sum(1 for d in got.devices.values() if d.n_entries)
    # each device once: on the thread, but for one with no entries (nothing to guess from)
    assert calls.count("vramscope-timeline") == n_dev and len(calls) == len(got.devices)
    assert_same_analysis(got, want)


@pytest.mark.parametrize("name", ["cuda_full.pickle", "torch20_history.pickle"])
def test_a_wrong_guess_is_built_again_from_the_rows(name, monkeypatch, calls):
    want = _fresh(name)
    calls.clear()
    monkeypatch.setattr(analysis_module, "_TIMELINE_BESIDE_ENTRIES", 0)
    real = guess_frees_carry_alloc_frames
    monkeypatch.setattr(analysis_module, "guess_frees_carry_alloc_frames", lambda t: not real(t))
    got = _fresh(name)
    assert calls == ["vramscope-timeline", threading.main_thread().name]
    assert_same_analysis(got, want)


def test_a_profiler_converted_file_is_built_in_order(monkeypatch, calls):
    """Its version bumps (which the timeline reads) are found from the paired rows."""
    monkeypatch.setattr(analysis_module, "_TIMELINE_BESIDE_ENTRIES", 0)
    an = _fresh("fit_b2.pickle")
    assert an.facts.profiler_like
    assert calls == [threading.main_thread().name]


def _frameless(name):
    from test_classifiers import _strip_frames
    return _strip_frames(open_snapshot(str(DATA / name), use_cache=False))


def test_phases_from_periodicity_wait_on_the_thread_for_the_live_bytes(monkeypatch, calls):
    """Without frames the timeline reads the live bytes, made once the rows are paired: its thread
    waits for them and finds the same iterations."""
    from vramscope.classifiers import load_rules
    rules = load_rules(use_user_rules=False)
    want = analyze(_frameless("leak.pickle"), rules=rules, use_cache=False)
    assert want.devices[0].iterations and want.devices[0].iterations[0].source == "periodicity"
    calls.clear()
    monkeypatch.setattr(analysis_module, "_TIMELINE_BESIDE_ENTRIES", 0)
    got = analyze(_frameless("leak.pickle"), rules=rules, use_cache=False)
    assert calls == ["vramscope-timeline"]
    assert_same_analysis(got, want)


def test_a_pairing_that_fails_lets_the_timeline_thread_end(monkeypatch):
    from vramscope.classifiers import load_rules
    monkeypatch.setattr(analysis_module, "_TIMELINE_BESIDE_ENTRIES", 0)

    def broken(snap, dev):
        raise RuntimeError("pairing failed")
    monkeypatch.setattr(analysis_module, "allocations", broken)
    before = {t for t in threading.enumerate() if t.name == "vramscope-timeline"}
    with pytest.raises(RuntimeError, match="pairing failed"):
        analyze(_frameless("leak.pickle"), rules=load_rules(use_user_rules=False), use_cache=False)
    for t in threading.enumerate():
        if t.name == "vramscope-timeline" and t not in before:
            t.join(10)
            assert not t.is_alive()
