"""One analysis, told the same way everywhere.

For every real snapshot in ../shared/snapshots, every fixture in tests/data, every recorded
ground-truth run and the bundled example, through the command line as a user runs it:
`summary --json`, `report`'s analysis.json and report.md, `allocations --csv` and the
viewer's model agree on the allocation count, the peak (bytes, index, type), the
iterations and each iteration's peak, and the number of leaks and OOMs. And no name a
user reads first for an allocation (`where`, the report's first frame, the viewer's
first frame) is an allocator internal when the stack holds anything better.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pytest

from vramscope.cli import main
from vramscope.common.units import fmt_bytes
from vramscope.present.words import moment_text
from vramscope.services.report_markdown import iterations_note_md
from vramscope.present.words import peak_words

from helpers import DATA, GROUNDTRUTH, NOT_A_SNAPSHOT, REPO, SHARED

FILES = sorted(
    [p for p in SHARED.glob("*.p*kl*") if p.name != NOT_A_SNAPSHOT] if SHARED.is_dir() else []
) + sorted(DATA.glob("*.pickle")) + sorted(GROUNDTRUTH.glob("*.pickle")) + [REPO / "assets" / "example.pickle"]
IDS = [p.name if p.parent != GROUNDTRUTH else f"gt-{p.name}" for p in FILES]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def run_cli(capsys, *argv) -> str:
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.err == "", out.err
    return out.out


def report_sections(md: str) -> dict[int, str]:
    """report.md's text per device section."""
    parts = re.split(r"^## Device (\d+)$", md, flags=re.M)
    return {int(parts[k]): parts[k + 1].split("\n## ")[0] for k in range(1, len(parts), 2)}


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_summary_report_csv_and_viewer_agree(path, tmp_path, capsys, monkeypatch, cache_dir):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", cache_dir)
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    summary = orjson.loads(run_cli(capsys, "summary", str(path), "--json"))
    rows = list(csv.DictReader(io.StringIO(run_cli(capsys, "allocations", str(path), "--csv"))))
    out = tmp_path / "report"
    run_cli(capsys, "report", str(path), "-o", str(out))
    analysis = orjson.loads((out / "analysis.json").read_bytes())
    md = (out / "report.md").read_text(encoding="utf-8")
    sections = report_sections(md)

    assert [d["device"] for d in summary["devices"]] == [d["device"] for d in analysis["devices"]]
    assert sorted(sections) == sorted(d["device"] for d in summary["devices"])
    per_device_rows = {}
    evidence_totals: dict[int, dict[str, int]] = {}
    for r in rows:
        per_device_rows.setdefault(int(r["device"]), []).append(r)
    for s, a in zip(summary["devices"], analysis["devices"]):
        dev = s["device"]
        # the report's JSON is the summary document plus additions, never different
        for key, value in s.items():
            assert a[key] == value, (dev, key)
        # allocations: the rows of allocations --csv, blocks live before the trace included
        dev_rows = per_device_rows.get(dev, [])
        assert s["allocations"] == len(dev_rows)
        assert s["allocations_before_trace"] == sum(r["index"] == "-1" for r in dev_rows)
        # report.md tells the same figures
        sec = sections[dev]
        pk = s["peak"]
        assert f"| Allocations | {s['allocations']:,}" in sec
        when = moment_text(pk["index"], s["run"]["recorded"]["value"] == "state_only")
        assert f"| Peak live | **{fmt_bytes(pk['bytes'])}** {when}" in sec
        assert f"{pk['type_words']} (`{pk['type']}`)" in sec
        note = iterations_note_md([SimpleNamespace(**it) for it in s["iterations"]])      # (a guess: how found)
        assert f"| Iterations | {len(s['iterations'])}{note} |" in sec
        assert f"| Leaks | {len(s['leaks']) or s['leaks_note']} |" in sec
        assert f"| OOMs | {len(s['ooms']) or 'none'} |" in sec
        for it in s["iterations"][:3]:
            assert (f"| {it['number']} | {it['start_index']:,}-{it['end_index']:,} | {fmt_bytes(it['peak_bytes'])} | "
                    f"{peak_words(it['peak_type'])} |") in sec
        # the peak is where live memory is highest, and its iteration is numbered alike
        numbers = [it["number"] for it in s["iterations"]]
        assert numbers == list(range(1, len(numbers) + 1))
        if pk["iteration"] is not None:
            it = s["iterations"][pk["iteration"] - 1]
            assert it["start_index"] <= pk["index"] <= it["end_index"]
            assert it["peak_bytes"] == pk["bytes"]
        for lk in s["leaks"]:
            assert set(lk["iterations"]) <= set(numbers)
        # how sure: the peak's bytes per evidence level add up to the peak, per category too,
        # and the CSV's evidence column holds the same levels as the analysis' rows
        assert sum(pk["by_evidence"].values()) == pk["bytes"]
        assert {c: sum(v.values()) for c, v in pk["by_category_evidence"].items()} == pk["by_category"]
        for e in ("torch", "stack", "lifetime", "guess", "none"):
            assert pk["by_evidence"].get(e, 0) == sum(v.get(e, 0) for v in pk["by_category_evidence"].values())
        csv_ev: dict[str, int] = {}
        for r in dev_rows:
            csv_ev[r["evidence"]] = csv_ev.get(r["evidence"], 0) + int(r["size"])
        assert set(csv_ev) <= {"torch", "stack", "lifetime", "guess", "none"}
        evidence_totals[dev] = csv_ev

    # the viewer's model reads the same analysis
    from vramscope.viewer.model.load import load
    result = load(str(path))
    if result.data is not None:
        d = result.data
        s = next(x for x in summary["devices"] if x["device"] == d.device)
        assert d.n_rows == s["allocations"] and d.n == s["entries"]
        assert d.peak_bytes == s["peak"]["bytes"] and d.peak_index == s["peak"]["index"]
        kinds = [f.kind for f in d.findings]
        assert kinds.count("leak") == len(s["leaks"]) and kinds.count("oom") == len(s["ooms"])
        assert [f.index for f in d.findings if f.kind == "iteration_peak"] == \
            [it["peak_index"] for it in s["iterations"]]
        assert d.device == summary["primary_device"]
        # the Findings' peak says where it falls in the summary's words
        assert next(f for f in d.findings if f.kind == "peak").title.endswith(f"· {s['peak']['type_words']}")
        # the viewer's rows carry the same evidence as the CSV's
        from vramscope.classifiers.evidence import EVIDENCE
        ev = np.bincount(d.da.evidence, weights=d.da.allocs.size.astype(np.float64), minlength=len(EVIDENCE))
        assert {e: int(b) for e, b in zip(EVIDENCE, ev) if b} == evidence_totals.get(d.device, {})
        # and what the timeline draws pale at the peak is the summary's guessed bytes there
        guessed = d.guessed_composition([max(d.peak_index, 0)])
        drawn_pale = 0 if guessed is None else int(round(float(guessed.sum())))
        if d.peak_index >= 0:
            assert drawn_pale == s["peak"]["by_evidence"].get("guess", 0) + s["peak"]["by_evidence"].get("none", 0)


# -- what a user reads first is never the allocator's own frame ------------------------------
STACKS_ALL = [p for p in [SHARED / "cranberrii+ftcourse__memory_snapshot.pickle"] if p.exists()] + [
    DATA / "backward_thread.pickle", DATA / "qlora_4bit.pickle", DATA / "oom.pickle"]


@pytest.mark.parametrize("path", STACKS_ALL, ids=[p.name for p in STACKS_ALL])
def test_no_allocator_frame_first_when_anything_better_exists(path, tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    from vramscope.classifiers import analyze
    from vramscope.classifiers.stacks import ROLE_ALLOCATOR
    from vramscope.parsers import open_snapshot
    from vramscope.present.stacks import Stacks
    an = analyze(open_snapshot(str(path), use_cache=False))
    stacks = Stacks(an)
    role = an.facts.stacks.table.role
    checked = 0
    for dev, da in an.devices.items():
        rows = np.unique(np.asarray(da.allocs.stack), return_index=True)[1]
        for r in rows.tolist():
            a = da.allocation(r)
            fids = an.snapshot.stack(a.stack) if a.stack >= 0 else np.zeros(0, dtype=np.int64)
            better = bool(len(fids)) and bool((role[fids] != ROLE_ALLOCATOR).any())
            if not better:
                continue
            checked += 1
            for hide in (True, False):
                first = stacks.view_of(da, a, hide_internals=hide).frames[0]
                assert first.role != "allocator", (path.name, first)
            where = stacks.where_of(a)
            assert not where.startswith(("torch::unwind", "torch::CapturedTraceback", "c10::", "??")), where
            short = stacks.short(a.stack, 4, a.forward_stack)
            assert short and not short[0].startswith(("torch::unwind", "torch::CapturedTraceback", "c10::")), short
    assert checked > 0
    # and in the report: no listed stack starts with an allocator frame
    from vramscope.services.report import write_report
    write_report(an, str(tmp_path / "r"))
    md = (tmp_path / "r" / "report.md").read_text()
    firsts = re.findall(r"^\d+\. .*\n    - `+ ?(.*?) ?`+$", md, flags=re.M)
    assert firsts and not any(f.startswith(("torch::unwind", "torch::CapturedTraceback", "c10::", "??"))
                              for f in firsts), firsts


def test_summary_cli_text_names_iterations_like_json(capsys, monkeypatch, tmp_path):
    """The text summary lists iteration numbers and peaks as the JSON has them."""
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path))
    path = str(REPO / "assets" / "example.pickle")
    doc = orjson.loads(run_cli(capsys, "summary", path, "--json"))
    text = run_cli(capsys, "summary", path)
    for it in doc["devices"][0]["iterations"]:
        assert re.search(rf"^\s+{it['number']}\s+peak\s+{re.escape(fmt_bytes(it['peak_bytes']))}", text, re.M)
    assert f"{doc['devices'][0]['allocations']:,} allocations" in text
