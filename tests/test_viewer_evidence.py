"""The viewer shows how sure each byte is (issue 20): bytes whose category is a guess are drawn
in a paler shade of their category's colour, the hover and the Selection pane say so, and a
finding opens on what makes it (the largest live allocation at a peak, the largest of a leak)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtGui import QColor  # noqa: E402

from viewer_helpers import click_finding, new_window, open_and_wait  # noqa: E402

from vramscope.classifiers.evidence import E_GUESS  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
GUESSED = DATA / "adamw_after_step1.pickle"      # optimizer moments from before the recording
CLEAN = DATA / "cuda_lora.pickle"                 # a real H100 run: every category evidenced
KEEP_LOSS = DATA / "keep_loss.pickle"


@pytest.fixture
def window(qt):
    return new_window(qt)


def band_colors(w) -> set[int]:
    return {int(c) for c in w.timeline.bands.colors}


def test_guessed_bytes_are_drawn_paler_and_only_where_there_are_guesses(qt, window):
    d = open_and_wait(qt, window, str(GUESSED))
    guessed_rows = np.flatnonzero(d.da.evidence >= E_GUESS)
    assert len(guessed_rows), "the fixture's optimizer moments predate the recording"
    qt.waitUntil(lambda: len(window.timeline.bands.colors) > 0, timeout=5000)
    tl, theme = window.timeline, window.timeline.theme
    opt = d.categories.index("optimizer")
    band = theme.band_color("optimizer")
    pale = theme.guess_color(band)
    assert pale.rgba() != band.rgba()
    assert {band.rgba(), pale.rgba()} <= band_colors(window)
    # the pale band's height is the guessed optimizer bytes: at the last column, all of them
    cols = list(tl.bands.colors)
    k = cols.index(np.uint32(pale.rgba()))
    heights = np.diff(np.concatenate([np.zeros((len(tl.bands.x), 1)), tl.bands.cum], axis=1), axis=1)
    guessed_opt = int(d.da.allocs.size[guessed_rows[d.category[guessed_rows] == opt]].sum())
    assert guessed_opt > 0
    assert heights[:, k].max() == pytest.approx(guessed_opt, rel=1e-9)

    # a run where every category has evidence has nothing to shade
    d2 = open_and_wait(qt, window, str(CLEAN))
    assert not (d2.da.evidence >= E_GUESS).any()
    qt.waitUntil(lambda: len(window.timeline.bands.colors) > 0, timeout=5000)
    assert pale.rgba() not in band_colors(window)
    assert len(window.timeline.bands.colors) == window.timeline.bands.cum.shape[1]


def test_a_guessed_allocation_says_so_in_the_hover_and_the_selection(qt, window):
    d = open_and_wait(qt, window, str(GUESSED))
    row = int(np.flatnonzero(d.da.evidence >= E_GUESS)[0])
    window.select_row(row)
    text = window.stack_panel.header.text()
    assert "how sure: a guess" in text
    hover = window.timeline.pointer._hover_html(row, int(d.category[row]), max(d.n - 1, 0))
    assert "(a guess)" in hover
    sure = int(np.flatnonzero(d.da.evidence < E_GUESS)[0])
    window.select_row(sure)
    assert "a guess" not in window.stack_panel.header.text()
    assert "(a guess)" not in window.timeline.pointer._hover_html(sure, int(d.category[sure]), 0)


def test_a_peak_finding_opens_on_its_largest_live_allocation(qt, window):
    d = open_and_wait(qt, window, str(KEEP_LOSS))
    f = click_finding(qt, window, "peak")
    qt.waitUntil(lambda: window.selected_row >= 0, timeout=3000)
    row = window.selected_row
    # independently: every allocation live at the peak's entry, by its lifetime
    live = np.flatnonzero((d.alloc_index <= f.index) & ((d.free_index < 0) | (d.free_index > f.index)))
    assert row in live
    assert int(d.allocs.size[row]) == int(d.allocs.size[live].max())


def test_a_leak_finding_opens_on_its_largest_allocation(qt, window):
    d = open_and_wait(qt, window, str(KEEP_LOSS))
    (leak,) = d.da.leaks
    rows = d.da.leak_rows(leak)
    click_finding(qt, window, "leak")
    qt.waitUntil(lambda: window.selected_row >= 0, timeout=3000)
    assert window.selected_row in set(rows.tolist())
    assert int(d.allocs.size[window.selected_row]) == int(d.allocs.size[rows].max())


def test_pale_is_a_shade_of_the_band_not_another_hue(qt, window):
    theme = window.timeline.theme
    for name in ("weights", "optimizer", "activations", "gradients"):
        band, pale = theme.band_color(name), theme.guess_color(theme.band_color(name))
        assert abs(band.hslHue() - pale.hslHue()) <= 3 or band.hslSaturation() < 20
        assert QColor(pale).lightness() != QColor(band).lightness()
