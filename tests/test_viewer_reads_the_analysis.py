"""The viewer asks, it never re-derives: on every real snapshot, fixture and recorded run,
what the viewer draws and writes is the analysis' figure.

- composition: the bands of every pixel column (at the moment each column shows), the
  "At this moment" panel and the legend's peak figures are `DeviceAnalysis.live_by_category`
  / `by_category_at` / `peak.by_category`, which equal the live rows summed by category
  (an independent reference) and add up to the live line;
- what-if: the What-if panel's peak, its type, the fit and the levers it leaves out are
  `what_if`'s (the same call `vramscope whatif` makes) and `levers_left_out`'s;
- the allocator: the reserved and allocated bytes the Allocator and "At this moment"
  panels show are the analysis' reserved line and live bytes, and at an OOM the cached
  bytes are the OOM record's `fragmentation_bytes`; the reserved-but-unallocated figures they
  print are their allocator state's.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PySide6")

from vramscope.classifiers import CATEGORIES  # noqa: E402
from vramscope.classifiers.liveset import live_mask  # noqa: E402
from vramscope.classifiers.whatif import what_if  # noqa: E402
from vramscope.common.units import fmt_bytes  # noqa: E402
from vramscope.services.whatif import levers_left_out  # noqa: E402

from helpers import DATA, GROUNDTRUTH, NOT_A_SNAPSHOT, REPO, SHARED  # noqa: E402

FILES = sorted(
    [p for p in SHARED.glob("*.p*kl*") if p.name != NOT_A_SNAPSHOT] if SHARED.is_dir() else []
) + sorted(DATA.glob("*.pickle")) + sorted(GROUNDTRUTH.glob("*.pickle")) + [REPO / "assets" / "example.pickle"]
IDS = [p.name if p.parent != GROUNDTRUTH else f"gt-{p.name}" for p in FILES]
# slider moves and levers the panel could send
QUESTIONS = (({"activations": 0.5}, []), ({"weights": 0.0, "optimizer": 1.7}, ["half_batch"]),
             ({}, ["checkpointing", "expandable_segments"]))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def devices_of(path):
    """The viewer's model of every device of the file (as the window's worker makes it)."""
    from vramscope.viewer.model.load import load, switch_device
    result = load(str(path))
    for dev in result.analysis.device_order():
        yield dev, (result if result.device == dev else switch_device(result, dev)).data


def moments(d) -> list[int]:
    """The start, the end, a few entries between, the peak, each OOM and each iteration's peak."""
    da = d.da
    picks = {-1, max(d.n - 1, -1), da.peak.index, *(o.index for o in da.ooms),
             *(it.peak_index for it in da.iterations[:20])}
    picks.update(np.linspace(0, max(d.n - 1, 0), 7).astype(int).tolist())
    return sorted(i for i in picks if i < max(d.n, 1))


def rows_by_category(d, i: int) -> np.ndarray:
    """The reference: the allocation rows live after entry i, summed by category."""
    live = live_mask(d.allocs, i)
    return np.bincount(d.category[live], weights=d.allocs.size[live].astype(np.float64),
                       minlength=len(CATEGORIES)).astype(np.int64)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_the_viewer_shows_the_analysis_figures(path, qt, monkeypatch, cache_dir, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", cache_dir)
    from vramscope.present.words import largest_free_words, reserved_unallocated_words
    from vramscope.viewer.panels.allocator import AllocatorPanel
    from vramscope.viewer.panels.legend import LegendBar
    from vramscope.viewer.panels.moment import MomentPanel
    from vramscope.viewer.panels.whatif import WhatIfPanel
    legend, moment, allocator, whatif = LegendBar(), MomentPanel(), AllocatorPanel(), WhatIfPanel()
    for w in (legend, moment, allocator, whatif):
        qt.addWidget(w)
    for dev, d in devices_of(path):
        if d is None:
            continue
        da, an = d.da, d.analysis
        at = moments(d)
        # -- composition: the model, the bands and the panels are the analysis' -----------------
        comp = d.composition(at)
        ref = np.array([rows_by_category(d, i) for i in at])
        assert np.array_equal(comp.astype(np.int64), ref), (dev, "composition")
        assert np.array_equal(comp.sum(axis=1), [d.live_at(i) for i in at])
        assert np.array_equal(da.live_by_category(at), ref)
        for i, row in zip(at, ref):
            assert da.by_category_at(i) == {c: int(v) for c, v in zip(CATEGORIES, row) if v}
        assert da.peak.by_category == da.by_category_at(da.peak.index)
        if d.n:
            x0, x1 = d.x_range
            for a, b, cols in ((x0, x1, 600), (x0 + (x1 - x0) * 0.4, x0 + (x1 - x0) * 0.45, 300)):
                env = d.envelope(a, b, cols)
                assert np.array_equal(env.col_comp.astype(np.int64), da.live_by_category(env.col_index))
                assert np.array_equal(env.col_comp_last.astype(np.int64), da.live_by_category(env.col_index_last))
        legend.set_data(d)
        for c, button in legend.buttons.items():
            assert f"({fmt_bytes(da.peak.by_category.get(CATEGORIES[c], 0))} of it live at the peak)" in \
                button.toolTip()
        moment.set_data(d)
        moment.show_index(da.peak.index)
        shown_rows = {moment.cats.topLevelItem(k).text(0).split(" (")[0]: moment.cats.topLevelItem(k).text(1)
                      for k in range(moment.cats.topLevelItemCount())}
        assert shown_rows == {c: fmt_bytes(v) for c, v in da.peak.by_category.items() if v > 0}
        # a category's bytes that are a guess say so, as the analysis counts them
        guessed = da.guessed_by_category([da.peak.index])
        for k in range(moment.cats.topLevelItemCount()):
            name, _, note = moment.cats.topLevelItem(k).text(0).partition(" (")
            g = int(guessed[0][CATEGORIES.index(name)]) if guessed is not None else 0
            assert bool(note) == (g > 0), (name, note, g)
        # -- what if: the panel's answer is what_if's ---------------------------------------------------
        whatif.set_data(d)
        whatif.ensure_model()
        qt.waitUntil(lambda: whatif.session is not None, timeout=60_000)
        session = whatif.session
        assert session.left_out == levers_left_out(an, dev)
        for name, cb in whatif.levers.items():
            assert cb.isEnabled() == (name not in session.left_out)
        for sliders, levers in QUESTIONS:
            sliders = {c: f for c, f in sliders.items() if c in whatif.sliders}
            levers = [lv for lv in levers if lv not in session.left_out]
            for name, sl in whatif.sliders.items():
                sl.setValue(round(sliders.get(name, 1.0) * 100))
            for name, cb in whatif.levers.items():
                cb.setChecked(name in levers)
            whatif.update_now()
            # (a simulated lever is asked on the panel's worker: its answer comes a moment later)
            qt.waitUntil(lambda: not whatif._asking, timeout=60_000)
            got, want = whatif.last, what_if(an, dev, sliders, levers)
            assert got is not None
            assert (got.scaled, got.baseline, got.scales, got.fits) == (want.scaled, want.baseline, want.scales,
                                                                         want.fits), (dev, sliders, levers)
            assert fmt_bytes(want.scaled.bytes) in whatif.peak_line.text()
        whatif.reset()
        # -- the allocator: the analysis' reserved line and live bytes, the OOM's record -------------
        for i in at:
            st = d.allocator.state_at(i)          # the analysis' allocator (classifiers/allocator.py)
            segs = d.segments.at(i)
            reserved = da.live.reserved_at(i)
            if not st.known:
                assert not segs.known and da.reserved_unallocated_at(i) is None
                continue
            assert (st.reserved, int(segs.size.sum())) == (reserved, reserved), (dev, i)
            assert (st.allocated, int(segs.allocated.sum())) == (d.live_at(i), d.live_at(i)), (dev, i)
            assert st.reserved_unallocated == da.reserved_unallocated_at(i), (dev, i)
            allocator.set_data(d)
            allocator.show_index(i)
            head = allocator.header.text()
            assert reserved_unallocated_words(st.reserved, st.reserved_unallocated) in head
            assert largest_free_words(st.cached, st.largest_free, st.cached_outside_largest_free) in head
            moment.show_index(i)
            assert reserved_unallocated_words(reserved, da.reserved_unallocated_at(i)) in moment.seg_label.text()
        for o in da.ooms:
            if o.reserved is not None and not da.reserved_unknown():
                segs = d.segments.at(o.index)
                assert (int(segs.size.sum()), int(segs.allocated.sum())) == (o.reserved, o.allocated)
                assert o.fragmentation_bytes == da.reserved_unallocated_at(o.index)
    whatif.shutdown()
