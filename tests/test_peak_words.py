"""A peak's moment is told one way: the Findings' title names its type (DESIGN.md §4) and the
detail under it adds the phase only where the type leaves it out ("other": a peak outside any
pass the trace shows, while the next batch was prepared or an OOM unwound). Before, the title of
DeComFL's peak said "outside a recognised phase" and its detail "inputs phase"."""
from __future__ import annotations

import dataclasses
import re

import pytest

from vramscope.present.words import OTHER_PHASE_WORDS, PEAK_TYPE_WORDS, finding_detail, finding_title

from helpers import DATA, analysis_of, real_snapshots, require, shared


def _peaks(an):
    for da in an.devices.values():
        yield next(f for f in da.findings() if f.kind == "peak")


def test_decomfl_peak_title_and_detail_agree():
    an = analysis_of(require(shared("ZidongLiu+DeComFL__memory.pickle")))
    f = next(_peaks(an))
    assert (f.subject.type, f.subject.phase) == ("other", "inputs")      # what the trace says of that moment
    title, detail = finding_title(f), finding_detail(f)
    assert PEAK_TYPE_WORDS["other"] in title and "recognised" not in title
    assert OTHER_PHASE_WORDS["inputs"] in detail
    assert "inputs phase" not in detail


@pytest.mark.parametrize("phase", ["inputs", "unwind", "none", "pre", "forward"])
def test_the_detail_adds_a_phase_only_to_a_peak_typed_other(phase):
    f = next(_peaks(analysis_of(require(DATA / "oom.pickle"))))
    for typ in ("other", "forward", "model_load"):
        g = dataclasses.replace(f, subject=dataclasses.replace(f.subject, type=typ, phase=phase))
        detail = finding_detail(g)
        said = [w for w in OTHER_PHASE_WORDS.values() if w in detail]
        assert said == ([OTHER_PHASE_WORDS[phase]] if typ == "other" and phase in OTHER_PHASE_WORDS else [])
        assert not re.search(r"\b(none|inputs|pre|unwind|forward) phase\b", detail)


def test_no_real_peak_says_a_bare_phase_name():
    for path in real_snapshots():
        for f in _peaks(analysis_of(path)):
            assert not re.search(r"\b\w+ phase\b", finding_detail(f)), path.name


@pytest.mark.parametrize("name", ["state_only_noframes.pickle", "bare_list.pickle"])
def test_a_snapshot_without_a_trace_has_its_peak_in_the_state_it_recorded(name, tmp_path):
    """Its one moment is the state it recorded: 'at the start of the trace' named a trace that
    is not there. The summary, the report, whatif and the Findings' detail say it alike."""
    import json
    import sys
    sys.path.insert(0, str(DATA))
    import fuzzing
    from vramscope.viewer.model.load import DeviceData
    path = require(DATA / name)
    rc, out, err = fuzzing.run_cli(["summary", str(path), "--json", "--no-cache"])
    assert rc == 0, err
    devices = json.loads(out)["devices"]
    assert all(d["run"]["recorded"]["value"] == "state_only" for d in devices)
    # where it falls: in no pass of a trace that is not there ('outside any pass the trace shows')
    assert all(d["peak"]["type_words"] == "no allocation traced" for d in devices)
    rc, out, err = fuzzing.run_cli(["summary", str(path), "--no-cache"])
    lines = [ln for ln in out.decode().splitlines() if ln.strip().startswith("peak live")]
    assert lines and all("in the state the snapshot recorded, no allocation traced" in ln for ln in lines)
    assert "the trace shows" not in out.decode() and "before the trace began" not in out.decode()
    assert "live before the snapshot was taken)" in out.decode()
    rc, _, err = fuzzing.run_cli(["report", str(path), "-o", str(tmp_path / "r"), "--no-cache"])
    assert rc == 0, err
    md = (tmp_path / "r" / "report.md").read_text()
    assert "in the state the snapshot recorded" in md and "at the start of the trace" not in md
    assert "no allocation traced" in md and "the trace shows" not in md and "before the trace began" not in md
    rc, out, err = fuzzing.run_cli(["whatif", str(path), "--no-cache"])
    assert rc == 0, err
    assert "measured peak" in out.decode() and "at the start of the trace" not in out.decode()
    assert "in the state the snapshot recorded, no allocation traced" in out.decode()
    rc, out, err = fuzzing.run_cli(["whatif", str(path), "--json", "--no-cache"])
    assert rc == 0 and all(d["recorded"] == "state_only" for d in json.loads(out)["devices"])
    rc, out, err = fuzzing.run_cli(["compare", str(path), str(path), "--no-cache"])
    assert rc == 0, err
    assert "the trace shows" not in out.decode() and "at the start of the trace" not in out.decode()
    an = analysis_of(path)
    for dev in an.devices:
        f = next(f for f in DeviceData(an.snapshot, an, dev).findings if f.finding.kind == "peak")
        assert "in the state the snapshot recorded" in f.detail
        assert f.title.endswith("· no allocation traced")
