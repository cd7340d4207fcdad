"""Text from a snapshot is data, never markup: a report of a snapshot whose frame names,
file names and allocator config hold backticks, HTML and line breaks stays inert Markdown
(a user pastes report.md into an issue tracker)."""
from __future__ import annotations

import pickle
import re

from vramscope.classifiers import analyze
from vramscope.parsers import open_snapshot

from vramscope.services.annotations import Annotation
from vramscope.services.report import write_report

EVIL = "ev`il``na```me\n# Injected heading\n<script>alert(1)</script> <img src=x onerror=alert(1)> [x](javascript:1) |a|"


def evil_snapshot(path):
    frames = [{"filename": "/home/u/" + EVIL + ".py", "line": 12, "name": EVIL},
              {"filename": "/home/u/train.py", "line": 40, "name": "main`<b>bold</b>"}]
    trace = []
    addr = 0x7F0000000000
    for k in range(6):
        trace.append({"action": "alloc", "addr": addr + k * (1 << 20), "size": (k + 1) << 20, "stream": 0,
                      "time_us": 1_700_000_000_000_000 + k, "frames": frames})
    trace.append({"action": "free_completed", "addr": addr, "size": 1 << 20, "stream": 0,
                  "time_us": 1_700_000_000_000_010, "frames": frames})
    blocks = [{"address": addr + k * (1 << 20), "size": 1 << 20, "requested_size": (k + 1) << 20,
               "state": "active_allocated", "frames": frames} for k in range(1, 6)]
    seg = {"device": 0, "address": addr, "total_size": 64 << 20, "allocated_size": 20 << 20,
           "active_size": 20 << 20, "requested_size": 20 << 20, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": blocks}
    doc = {"segments": [seg], "device_traces": [trace],
           "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:`128`\n<script>x</script>"}}
    with open(path, "wb") as fh:
        pickle.dump(doc, fh, protocol=4)


def without_code_spans(line: str) -> str:
    """The line with every CommonMark code span removed (a run of N backticks to the next
    run of exactly N)."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "`":
            n = len(re.match(r"`+", line[i:]).group(0))
            m = re.search(r"(?<!`)`{%d}(?!`)" % n, line[i + n:])
            if m:
                i += n + m.end()
                continue
            out.append(line[i:i + n])
            i += n
            continue
        out.append(line[i])
        i += 1
    return "".join(out)


def test_hostile_names_stay_inert_text(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    snap_path = tmp_path / "run`<b>.pickle"
    evil_snapshot(snap_path)
    an = analyze(open_snapshot(str(snap_path), use_cache=False))
    notes = [Annotation(kind="peak", index=3, note="see <script>alert(2)</script>\n# not a heading `x` |cell|")]
    from vramscope.viewer.report_png import render_timeline
    write_report(an, str(tmp_path / "r"), annotations=notes, render_png=render_timeline)
    md = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    headings = [ln for ln in md.splitlines() if ln.lstrip().startswith("#")]
    assert all(not h.startswith("# Injected") and "not a heading" not in h for h in headings), headings
    for ln in md.splitlines():
        bare = without_code_spans(ln)
        # outside code spans: no raw HTML tag, no link or image syntax from the snapshot
        assert not re.search(r"(?<!\\)<(script|img|b)\b", bare, re.I), ln
        assert "javascript:" not in bare or "\\[x\\]" in bare, ln
    # the names are there, whole, inside code spans
    assert "<script>alert(1)</script>" in md
    assert md.count("Injected heading") >= 1
    # table rows keep their column count (a `|` from the snapshot cannot open a cell)
    for ln in md.splitlines():
        if ln.startswith("| 1 | peak"):
            assert len(re.findall(r"(?<!\\)\|", without_code_spans(ln))) == 4, ln


def test_rich_text_escaping_leaves_nothing_to_interpret():
    """The viewer's and the PNGs' rich text: every character HTML gives a meaning is an entity."""
    from vramscope.present.markup import html
    assert html(EVIL) == ("ev`il``na```me\n# Injected heading\n&lt;script&gt;alert(1)&lt;/script&gt; &lt;img src=x "
                          "onerror=alert(1)&gt; [x](javascript:1) |a|")
    assert html("a & b \"c\" 'd' &amp;") == "a &amp; b \"c\" 'd' &amp;amp;"
    assert html(3) == "3"
