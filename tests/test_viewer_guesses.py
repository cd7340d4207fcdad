"""A guess is marked as one wherever it appears (issue 33, item 7), pytest-qt offscreen: the
by-allocation view draws guessed allocations in the pale shade (it drew them at full
saturation), the Findings' peak sentence, the status bar, the table, the moment panel and
the report say "a guess" beside a category's bytes, and the legend says in words what the
pale shade means. On tests/data/adamw_after_step1.pickle: AdamW's moments and the weights,
made before history was on, are guesses."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPointF, Qt  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import open_and_wait  # noqa: E402

GUESSED = str(DATA / "adamw_after_step1.pickle")


def test_the_by_allocation_view_draws_a_guessed_allocation_pale(qt, window):
    w = window
    d = open_and_wait(qt, w, GUESSED)
    guessed = np.flatnonzero(d.guessed_rows())
    assert len(guessed)
    w.timeline.plot.setFocus()
    qt.keyClick(w.timeline.plot, Qt.Key.Key_L)                    # stack by allocation
    assert w.timeline.mode == "allocations"
    w.timeline.refresh_now()
    qt.wait(50)
    tl, st = w.timeline, w.timeline.stacking
    cols = st.cols
    stack = d.alloc_stack()
    # the biggest guessed allocation, in a column where it is drawn
    row = int(guessed[np.argmax(d.allocs.size[guessed])])
    u, bottom, top = cols.band_of(stack.rank_of(row))
    assert len(u)
    k = int(np.flatnonzero(st.col_u == u[len(u) // 2])[0])
    y = float(bottom[len(u) // 2] + top[len(u) // 2]) / 2
    scene = tl.vb.mapViewToScene(QPointF(float(tl.last_env.col_x[k]), y))
    vp = tl.plot.mapFromScene(scene)
    img = tl.plot.viewport().grab().toImage()
    drawn = QColor(img.pixel(vp.x(), vp.y()))
    cat = d.categories[int(d.category[row])]
    pale = tl.theme.guess_color(tl.theme.band_color(cat))
    shades = {c.name() for c in (pale, pale.lighter(112), pale.darker(108), pale.lighter(124))}
    full = tl.theme.band_color(cat)
    assert drawn.name() in shades, (drawn.name(), shades, full.name())
    # the hover box says so too
    tl.pointer.hover_at(float(tl.last_env.col_x[k]), y)
    assert "(a guess)" in tl.hover_label.textItem.toPlainText()


def test_every_sentence_with_a_category_s_bytes_marks_its_guess(qt, window):
    from vramscope.common.units import fmt_bytes
    from vramscope.present.words import guessed_text
    from vramscope.viewer.panels.legend import PALE_WORDS
    w = window
    d = open_and_wait(qt, window, GUESSED)
    pk = d.da.peak
    per = pk.by_category_evidence
    guessed_cats = [c for c, ev in per.items() if ev.get("guess")]
    assert guessed_cats
    # Findings: the peak's sentence
    peak = next(f for f in d.findings if f.kind == "peak")
    top3 = sorted(pk.by_category.items(), key=lambda kv: -kv[1])[:3]
    for c, b in top3:
        said = f"{c} {fmt_bytes(b)}"
        assert said in peak.detail
        marked = f"{said} (a guess)" in peak.detail or f"{said} (" in peak.detail
        assert marked == bool(per.get(c, {}).get("guess")), (c, peak.detail)
    # the status bar
    assert w.status_guess.isVisible() and w.status_guess.text() == f"({guessed_text(pk.by_evidence)})"
    # the legend, in words
    key = w.legend.pale_key
    assert key is not None and key.isVisible() and PALE_WORDS in key.text()
    # the table's category column and the moment panel at the peak
    m = w.table_panel.model
    rows = m.view.rows
    texts = {m.data(m.index(k, 0)) for k in range(min(len(rows), 200))}
    assert any(t.endswith("(a guess)") for t in texts)
    for k in range(min(len(rows), 200)):
        r = int(rows[k])
        assert m.data(m.index(k, 0)).endswith("(a guess)") == d.guessed(r)
    w.moment_panel.show_index(pk.index)
    names = [w.moment_panel.cats.topLevelItem(k).text(0) for k in range(w.moment_panel.cats.topLevelItemCount())]
    for c in guessed_cats:
        assert any(n.startswith(f"{c} (") and "a guess" in n for n in names), (c, names)


def test_the_report_marks_the_guessed_bytes_at_an_oom(tmp_path):
    from vramscope.classifiers.categories import CATEGORIES
    from vramscope.services.report import write_report
    from helpers import analysis_of
    an = analysis_of(DATA / "oom_step3.pickle")          # 317 MiB at its OOM is a guess
    dev = an.primary_device()
    da = an.devices[dev]
    out = write_report(an, str(tmp_path / "r"))
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| Category | Live at the OOM | How sure |" in md
    g = da.guessed_by_category([da.ooms[0].index])
    assert g is not None and g.sum() > 0
    for c, b in da.ooms[0].by_category.items():
        guess = int(g[0][CATEGORIES.index(c)]) if g is not None else 0
        lines = md.splitlines()
        table = lines[lines.index("| Category | Live at the OOM | How sure |"):]
        line = next(ln for ln in table if ln.startswith(f"| {c} | "))
        assert ("guess" in line.split("|")[3]) == (guess > 0), line
    assert out
