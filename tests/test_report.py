"""`vramscope report`: Markdown + PNG + JSON, sized for an issue tracker."""
from __future__ import annotations

import os

import orjson
import pytest

from vramscope.services.annotations import Annotation, AnnotationStore
from vramscope.classifiers import analyze
from vramscope.cli import main
from vramscope.parsers import open_snapshot
from vramscope.present.stacks import Stacks
from vramscope.services.report import MD_LIMIT, PNG_LIMIT, redact
from vramscope.services.report import write_report as _write_report
from vramscope.services.report_markdown import fit_markdown as _fit_markdown
from vramscope.viewer.model.lod import envelope
from vramscope.viewer.report_png import render_timeline


def write_report(*a, **kw):
    return _write_report(*a, render_png=render_timeline, **kw)

from helpers import DATA, REPO

EXAMPLE = str(REPO / "assets" / "example.pickle")
OOM = DATA / "oom.pickle"


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", "")
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "userdata"))
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")


def _png_size(path):
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_example_report(tmp_path):
    an = analyze(open_snapshot(EXAMPLE, use_cache=False))
    notes = [Annotation(kind="range", device=0, start_index=100, end_index=400, note="first backward | pass"),
             Annotation(kind="peak", device=0, index=an.devices[0].live.peak_index, note="the peak")]
    paths = write_report(an, str(tmp_path / "r"), annotations=notes)
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["analysis.json", "report.md", "timeline.png"]
    md_path, js_path, png_path = (str(tmp_path / "r" / n) for n in ("report.md", "analysis.json", "timeline.png"))
    md = open(md_path, encoding="utf-8").read()
    assert len(md.encode()) <= MD_LIMIT and os.path.getsize(png_path) <= PNG_LIMIT
    assert _png_size(png_path) == (1200, 520)
    assert "## Device 0" in md and "### Live memory at the peak, by category" in md
    assert "| Category | Bytes | Share |" in md and "MiB" in md
    assert "first backward \\| pass" in md and "the peak" in md      # annotations, escaped for tables
    assert "make_example.py" in md                                 # stacks show the user's code
    doc = orjson.loads(open(js_path, "rb").read())
    assert doc["devices"][0]["peak"]["bytes"] == an.devices[0].live.peak_bytes
    assert [a["note"] for a in doc["annotations"]] == ["first backward | pass", "the peak"]
    assert doc["devices"][0]["largest_at_peak"]


def test_annotations_come_from_the_sidecar(tmp_path):
    snap_path = tmp_path / "run.pickle"
    snap_path.write_bytes(open(EXAMPLE, "rb").read())
    store = AnnotationStore(str(snap_path))
    store.add(kind="range", device=0, start_index=5, end_index=50, note="from the sidecar")
    an = analyze(open_snapshot(str(snap_path), use_cache=False))
    write_report(an, str(tmp_path / "r"))
    assert "from the sidecar" in open(tmp_path / "r" / "report.md").read()
    assert orjson.loads(open(tmp_path / "r" / "analysis.json", "rb").read())["annotations"][0]["note"] == \
        "from the sidecar"


def test_oom_report_explains_the_oom(tmp_path):
    an = analyze(open_snapshot(str(OOM), use_cache=False))
    write_report(an, str(tmp_path / "r"))
    md = open(tmp_path / "r" / "report.md", encoding="utf-8").read()
    assert "### Out of memory" in md
    assert "requested **1000.0 MiB**" in md and "device free" in md
    assert "reserved but unallocated" in md
    assert "**Diagnosis**" in md and "**Next step**" in md
    assert "expandable_segments" in md             # fragmentation > request, not on: DESIGN.md §5
    assert os.path.getsize(tmp_path / "r" / "timeline.png") <= PNG_LIMIT
    doc = orjson.loads(open(tmp_path / "r" / "analysis.json", "rb").read())
    rep = doc["devices"][0]["ooms"][0]
    assert rep["fragmentation_bytes"] >= rep["requested"] and "expandable_segments" in rep["suggestion"]


def test_redact_paths(tmp_path):
    an = analyze(open_snapshot(str(OOM), use_cache=False))
    notes = [Annotation(kind="peak", index=3, note="see /home/alice/secret/train.py")]
    write_report(an, str(tmp_path / "r"), redact_paths=True, annotations=notes)
    for name in ("report.md", "analysis.json"):
        text = open(tmp_path / "r" / name, encoding="utf-8").read()
        for leak in ("/workspace", "site-packages", "/opt/conda", "/home/alice", str(DATA)):
            assert leak not in text, (name, leak)
        assert "train_qlora.py" in text
    assert "train.py" in open(tmp_path / "r" / "report.md").read()
    # without redaction the paths are there (the check above can fail)
    write_report(an, str(tmp_path / "plain"))
    assert "/workspace" in open(tmp_path / "plain" / "report.md").read()


def test_redact_keeps_units():
    assert redact("/home/a/b/train.py:12 main") == "train.py:12 main"
    assert redact("C:\\Users\\a\\train.py(3): f") == "train.py(3): f"
    assert redact("torch/nn/modules/linear.py:125 forward") == "linear.py:125 forward"
    assert redact("12 MiB/iteration and reserved/allocated") == "12 MiB/iteration and reserved/allocated"


def test_markdown_is_cut_to_size():
    big = "x" * 3000

    def build(limits):
        return "# t\n" + "\n".join(f"- {big[:limits['note']]}" for _ in range(limits["annotations"]))
    text = _fit_markdown(build)
    assert len(text.encode()) <= MD_LIMIT

    def huge(limits):
        return "\n".join("y" * 100 for _ in range(1000))
    text = _fit_markdown(huge)
    assert len(text.encode()) <= MD_LIMIT and "truncated" in text


def test_envelope_keeps_every_peak():
    import numpy as np
    rng = np.random.default_rng(0)
    live = rng.integers(0, 1000, 100_000)
    live[77_777] = 10 ** 6
    x = np.arange(len(live), dtype=float)
    idx, low = envelope(x, live, 300)
    assert len(idx) <= 301 and 77_777 in idx
    assert live[idx].max() == 10 ** 6 and low.min() == live.min()


def test_short_stack_user_code_first():
    an = analyze(open_snapshot(EXAMPLE, use_cache=False))
    sid = int(an.snapshot.trace(0).columns["stack"][0])
    st = Stacks(an).short(sid)
    assert 1 <= len(st) <= 4 and st[0].startswith("make_example.py:")


def test_cli_report(tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["report", EXAMPLE, "-o", str(out), "--redact-paths"]) == 0
    printed = capsys.readouterr().out.split()
    assert {os.path.basename(p) for p in printed} == {"report.md", "analysis.json", "timeline.png"}
    assert main(["report", EXAMPLE, "-o", str(out), "--device", "9"]) == 2


def test_png_draws_every_category_band(tmp_path):
    """Each category present is filled in the plot, the lowest one (weights) included:
    count the pixels of its colour well beyond its legend square."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QColor, QImage

    from vramscope.classifiers import category_color
    an = analyze(open_snapshot(str(REPO / "assets" / "example.pickle"), use_cache=False))
    path = render_timeline(an, 0, str(tmp_path / "t.png"))
    img = QImage(path).convertToFormat(QImage.Format.Format_RGB32)
    import numpy as np
    px = np.frombuffer(img.constBits(), dtype=np.uint32, count=img.width() * img.height())
    for cat in ("weights", "optimizer", "gradients", "activations"):
        rgb = QColor(category_color(cat)).rgb() & 0xFFFFFF
        n = int(np.count_nonzero((px & 0xFFFFFF) == rgb))
        assert n > 3000, f"{cat}: {n} pixels of its colour"
