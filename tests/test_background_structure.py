"""The blocks' structure found on a thread (classifiers/structure.py `find_in_background`, on
big runs, beside the peaks, run facts and leaks) is the one found in line; and the command line
puts every thread in glibc's main arena before any thread starts (in an arena of its own the
structure's frees were not reused: a cold summary of 10^7 events peaked 140 MB higher)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers import DATA, analysis_of
from vramscope.classifiers import structure as structure_module
from vramscope.common import memory
from vramscope.common.later import Later, in_order


def test_the_command_line_keeps_one_arena_before_anything_else(monkeypatch, capsys):
    import vramscope.__main__ as entry
    calls = []
    monkeypatch.setattr(memory, "one_malloc_arena", lambda: calls.append("arena") or True)
    monkeypatch.setattr(memory, "keep_freed_pages", lambda: calls.append("keep") or True)
    monkeypatch.setattr(memory, "fewer_collections", lambda: calls.append("gc"))
    monkeypatch.setattr(sys, "argv", ["vramscope", "--help"])
    try:
        entry.run()
    except SystemExit:
        pass
    assert calls == ["arena", "keep", "gc"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_one_arena_takes_on_glibc():
    import os
    if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
        pytest.skip("not glibc")
    assert memory.one_malloc_arena() is True


_KEPT = """
import sys
import numpy as np
from vramscope.common import memory
keep = sys.argv[1] == "keep"
if keep:
    assert memory.keep_freed_pages()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
a = np.ones(96 << 20, np.uint8)
held = rss()
del a
freed = rss()
memory.give_back_freed_pages()
print(held - freed, held - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_pages_are_kept_until_given_back():
    """With keep_freed_pages a freed 96 MB array's pages stay for the next one (not unmapped and
    faulted in afresh: 0.3-0.5 s of a cold 10^7 summary), and give_back_freed_pages hands them
    back (the viewer, once the file is shown); by default they go at once."""
    import os
    import subprocess
    if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
        pytest.skip("not glibc")
    mb = 1 << 20

    def run(how):
        out = subprocess.run([sys.executable, "-c", _KEPT, how], capture_output=True, text=True, check=True)
        return [int(x) for x in out.stdout.split()]
    at_free, after_trim = run("keep")
    assert at_free < 8 * mb and after_trim > 80 * mb
    at_free, _ = run("default")
    assert at_free > 80 * mb


def test_the_structure_found_on_a_thread_is_the_one_found_in_line(monkeypatch):
    an = analysis_of(DATA / "levers/dev/llama_tied.base.pickle")
    da = an.devices[an.primary_device()]
    inline = structure_module._build(da)
    structure_module._CACHE.pop(da, None)
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    job = structure_module.later(da)
    assert job is not None and structure_module.being_found(da)
    assert structure_module.later(da) is None                         # one at a time
    in_order([job])
    st = structure_module.structure(da)
    assert da not in structure_module._PENDING
    assert st.blocks is not None and len(st.calls) == len(inline.calls) > 0
    assert (st.role == inline.role).all() and (st.call_of == inline.call_of).all()
    assert (st.inputs == inline.inputs).all() and st.notes == inline.notes
    assert all((a.rows == b.rows).all() for a, b in zip(st.calls, inline.calls))
    assert structure_module.structure(da) is st


def test_small_runs_find_their_structure_in_line():
    class Small:
        allocs = np.zeros(10)
    assert structure_module.later(Small()) is None


@pytest.mark.parametrize("name, wanted", [("forward_only_loop.pickle", False), ("cuda_full.pickle", True)])
def test_the_thread_gives_up_a_structure_no_lever_of_the_advice_needs(monkeypatch, name, wanted):
    """Found beside the analysis only where a lever the advice simulates needs the blocks (a
    training run's checkpointing); given up once the run's facts say none does (forward passes
    only: the half batch needs only what grows with the batch), and then built where asked for,
    the same as one built in line."""
    from vramscope.classifiers import analyze
    from vramscope.classifiers.advice import needs_blocks
    from vramscope.parsers import open_snapshot
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    built: list = []
    real_build = structure_module._build
    monkeypatch.setattr(structure_module, "_build", lambda da, **kw: built.append(kw) or real_build(da, **kw))
    an = analyze(open_snapshot(str(DATA / name), use_cache=False), use_cache=False)
    da = an.devices[an.primary_device()]
    assert needs_blocks(da.run) is wanted
    job = structure_module._PENDING.get(da)
    if job is not None:
        assert job.wait(120)
    assert (da in structure_module._CACHE or da in structure_module._PENDING) is wanted
    st = structure_module.structure(da)
    assert built[0] == {"background": True} and len(built) == (1 if wanted else 2)
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 1 << 62)
    again = analyze(open_snapshot(str(DATA / name), use_cache=False), use_cache=False)
    inline = structure_module.structure(again.devices[again.primary_device()])
    assert len(st.calls) == len(inline.calls) and (st.role == inline.role).all() and st.notes == inline.notes


def test_a_job_that_raises_raises_where_its_result_is_taken():
    def broken():
        raise ValueError("no")
    jobs = [Later(broken), Later(lambda: 42)]
    in_order(jobs)
    with pytest.raises(ValueError):
        jobs[0].get()
    assert jobs[1].get() == 42                       # the next one ran all the same


def test_the_free_order_found_beside_classify_is_the_one_found_on_demand(monkeypatch):
    """On a big run the rows in free order (what the iterations' peak types read) are found on
    the live model's thread while the rows are classified: the same order as found on demand,
    and the same analysis."""
    from vramscope.classifiers import analysis as analysis_module
    from vramscope.classifiers import analyze
    from vramscope.parsers import open_snapshot
    from vramscope.services.summary import summary_document
    path = str(DATA / "cuda_full.pickle")
    import threading
    found_on = []
    real = analysis_module.free_order_of
    monkeypatch.setattr(analysis_module, "free_order_of",
                        lambda allocs: found_on.append(threading.current_thread().name) or real(allocs))
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    an = analyze(open_snapshot(path, use_cache=False), use_cache=False)
    da = an.devices[an.primary_device()]
    assert found_on == ["vramscope-live"]                # found ahead, once, not on demand
    order, sorted_fi = da._free_order
    ref_order, ref_fi = analysis_module.free_order_of(da.allocs)
    assert np.array_equal(order, ref_order) and np.array_equal(sorted_fi, ref_fi)
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 10 ** 12)
    in_line = analyze(open_snapshot(path, use_cache=False), use_cache=False)
    assert summary_document(in_line) == summary_document(an)



def test_the_structure_thread_reads_the_run_facts_being_found(monkeypatch):
    """On a big run the structure's thread starts beside the run's facts (analysis.py); where it
    reads them (structure.py `_run_facts`: attention inside a fused call of a profiler trace) it
    waits for those being found, never the empty ones a device starts with."""
    import threading
    from vramscope.classifiers.results import RunFacts
    an = analysis_of(DATA / "levers/dev/llama_tied.base.pickle")
    da = an.devices[an.primary_device()]
    structure_module._CACHE.pop(da, None)
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    gate = threading.Event()
    facts = RunFacts(model_kind="transformer")
    find_run = Later(lambda: gate.wait(10) and facts)
    job = structure_module.later(da, run=find_run)
    assert job is not None
    reader = Later(lambda: structure_module._run_facts(da))
    in_order([reader])
    assert not reader.wait(0.3)                  # waiting for the facts being found
    gate.set()
    find_run.run()
    assert reader.get() is facts
    assert structure_module._run_facts(da) is da.run          # once taken: the device's own
    in_order([job])
    assert structure_module.structure(da).blocks is not None


def test_the_analysis_begins_the_structure_before_the_run_facts(monkeypatch):
    """The structure's thread is started before the run's facts are found, not after them."""
    import threading
    from vramscope.classifiers import analysis as analysis_module
    from vramscope.classifiers import analyze
    from vramscope.parsers import open_snapshot
    begun = threading.Event()
    waited: list = []
    real_build, real_facts = structure_module._build, analysis_module.run_facts

    def build(da, **kw):
        begun.set()
        return real_build(da, **kw)

    def facts(da, sf):
        waited.append(begun.wait(10))            # (the structure's thread has begun meanwhile)
        return real_facts(da, sf)
    monkeypatch.setattr(structure_module, "_build", build)
    monkeypatch.setattr(analysis_module, "run_facts", facts)
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    an = analyze(open_snapshot(str(DATA / "cuda_full.pickle"), use_cache=False), use_cache=False)
    assert waited == [True] * len(an.devices) and an.devices[an.primary_device()].run.recorded.value == "trace"


def test_a_trace_ending_in_an_oom_gets_the_same_structure_and_advice_on_the_thread(monkeypatch):
    """A trace that ends in an OOM inside a forward: what that forward made and never freed was
    held to the end of the failed step (saved, not carried). The structure's thread read the
    run's facts (`da.run`) before they were found, took the trace as not ending in an OOM, and the
    checkpointing advice came and went from run to run. With the run's facts slow to come, the
    thread waits for them: the roles and the advice are those found in line."""
    import time
    from vramscope.classifiers import analysis as analysis_module
    from vramscope.classifiers import analyze
    from vramscope.parsers import open_snapshot
    path = str(DATA / "oom_step3.pickle")
    inline = analyze(open_snapshot(path, use_cache=False), use_cache=False)
    di = inline.devices[inline.primary_device()]
    assert di.run.truncated_by_oom.value
    want_roles = structure_module.structure(di).role
    real_facts = analysis_module.run_facts

    def slow_facts(da, sf):
        time.sleep(0.3)                     # (the thread reaches the facts first)
        return real_facts(da, sf)
    monkeypatch.setattr(analysis_module, "run_facts", slow_facts)
    monkeypatch.setattr(structure_module, "BACKGROUND_ROWS", 0)
    an = analyze(open_snapshot(path, use_cache=False), use_cache=False)
    da = an.devices[an.primary_device()]
    assert np.array_equal(structure_module.structure(da).role, want_roles)
    assert [a.lever for a in da.peak.advice] == [a.lever for a in di.peak.advice]
    assert "checkpointing" in [a.lever for a in di.peak.advice]
