"""What holds the memory now (issue 22): the Memory tree panel, driven by real clicks and keys
(pytest-qt, offscreen) on real files. Its bytes are checked against the live bytes computed
here from the allocation rows' alloc / free entries, not from the tree."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPointF, Qt  # noqa: E402

from viewer_helpers import open_and_wait  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def live_bytes(d, i: int) -> tuple[int, int]:
    """(bytes, allocations) live right after entry i, from the rows' own alloc / free entries."""
    sizes = np.asarray(d.allocs.size, dtype=np.int64)
    ai, fi = d.alloc_index, d.free_index
    live = (ai <= i) & ((fi < 0) | (fi > i))
    return int(sizes[live].sum()), int(live.sum())


def show_tree(qt, w):
    w.dock_layout.show("memtree")
    panel = w.memtree_panel
    qt.waitUntil(lambda: w.on_screen("memtree") and panel.tree is not None, timeout=5000)
    return panel


def top_level(panel) -> list:
    m = panel.model
    from vramscope.viewer.panels.memtree import BYTES_ROLE
    return [m.index(r, 0).data(BYTES_ROLE) for r in range(m.rowCount())]


def rows_shown(view, parent=None) -> list:
    from PySide6.QtCore import QModelIndex
    parent = parent or QModelIndex()
    m = view.model()
    return [m.index(r, 0, parent) for r in range(m.rowCount(parent))]


@pytest.mark.parametrize("name", ["keep_loss.pickle", "cuda_lora.pickle"])
def test_the_tree_holds_the_live_bytes_at_the_peak_and_where_the_timeline_is_clicked(qt, window, name):
    w = window
    d = open_and_wait(qt, w, str(DATA / name))
    panel = show_tree(qt, w)
    i = d.peak_index
    assert panel.index == i
    total, count = live_bytes(d, i)
    assert total == d.live_at(i) > 0
    assert sum(top_level(panel)) == total
    assert panel.tree.total_count == count
    from vramscope.common.units import fmt_bytes
    assert f"<b>{fmt_bytes(total)}</b> live in {count:,} allocations" in panel.header.text()
    assert "(the peak)" in panel.header.text()
    # opened at first down the heavy chains: some child row is on screen
    first = panel.model.index(0, 0)
    assert panel.view.isExpanded(first)
    # each node's bytes are its children's and no more
    m = panel.model
    from vramscope.viewer.panels.memtree import BYTES_ROLE
    for ix in rows_shown(panel.view):
        kids = rows_shown(panel.view, ix)
        if kids:
            assert sum(k.data(BYTES_ROLE) for k in kids) <= ix.data(BYTES_ROLE)
    # a click on the timeline elsewhere: the tree follows, what was open stays open
    opened = m.node_of(first)
    tl = w.timeline
    x0, x1 = tl.x_span()
    px = float(d.x_of_index(i))               # far from the peak's pixel (its marker takes a click)
    x = max((x0 + f * (x1 - x0) for f in (0.2, 0.4, 0.8)), key=lambda v: abs(v - px))
    assert abs(float(d.x_of_index(i)) - x) > 0.1 * (x1 - x0)
    pos = tl.plot.mapFromScene(tl.vb.mapViewToScene(QPointF(x, 1.0)))
    qt.mouseClick(tl.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    j = w.pinned_index
    assert j != i and panel.index == j
    total_j, count_j = live_bytes(d, j)
    assert sum(top_level(panel)) == total_j and panel.tree.total_count == count_j
    assert "(the peak)" not in panel.header.text()
    ix = panel.model.index_of(opened)
    if ix.isValid() and panel.model.rowCount(ix):
        assert panel.view.isExpanded(ix)
    # Peak brings it back
    qt.mouseClick(panel.peak_btn, Qt.MouseButton.LeftButton)
    assert panel.index == i and sum(top_level(panel)) == total


def test_search_opens_the_tree_down_to_the_frame(qt, window):
    from vramscope.present.memtree import search_tree
    w = window
    d = open_and_wait(qt, w, str(DATA / "keep_loss.pickle"))
    panel = show_tree(qt, w)
    expected = search_tree(panel.tree, d.stacks, "train.py:180")
    assert len(expected)
    panel.search.setFocus()
    qt.keyClicks(panel.search, "train.py:180")
    qt.waitUntil(lambda: panel.view.currentIndex().isValid(), timeout=3000)
    cur = panel.model.node_of(panel.view.currentIndex())
    assert cur in set(expected.tolist())
    # the heaviest match first, its ancestors opened
    assert panel.tree.bytes[cur] == panel.tree.bytes[expected].max()
    for up in panel.tree.path(cur)[:-1]:
        assert panel.view.isExpanded(panel.model.index_of(up))
    assert "found" in panel.found.text() or " of " in panel.found.text()
    qt.keyClicks(panel.search, "zzz_nothing")
    qt.waitUntil(lambda: panel.found.text() == "none found", timeout=3000)


def test_a_double_click_shows_the_nodes_allocations_largest_selected(qt, window):
    w = window
    d = open_and_wait(qt, w, str(DATA / "keep_loss.pickle"))
    panel = show_tree(qt, w)
    t = panel.tree
    ix = panel.model.index(0, 0)
    node = panel.model.node_of(ix)
    expected = t.rows(node)
    assert len(expected) == t.count[node]
    rect = panel.view.visualRect(ix)
    # a real double-click: press and release, then the double-click (QTest's alone has no press)
    qt.mouseClick(panel.view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qt.mouseDClick(panel.view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    tm = w.table_panel.model
    qt.waitUntil(lambda: tm.rowCount() == len(expected), timeout=3000)
    assert sorted(tm.row_id(r) for r in range(tm.rowCount())) == sorted(expected.tolist())
    sizes = np.asarray(d.allocs.size)
    assert w.selected_row == int(expected[0]) and sizes[w.selected_row] == sizes[expected].max()
    assert w.on_screen("allocations") and w.table_panel.chip.isVisible()


def test_guessed_bytes_are_shown_as_a_guess(qt, window):
    from vramscope.classifiers.evidence import E_GUESS
    w = window
    # weights and optimizer state made before recording (no stacks): part of a node is a guess
    open_and_wait(qt, w, str(DATA / "adamw_after_step1.pickle"))
    panel = show_tree(qt, w)
    t = panel.tree
    (part,) = [n for n in t.walk() if 0 < t.by_evidence[n, E_GUESS] < t.bytes[n]]
    panel.select_node(part)
    ix = panel.model.index_of(part)
    share = round(100 * int(t.by_evidence[part, E_GUESS]) / int(t.bytes[part]))
    assert panel.model.index_of(part, 4).data().endswith(f"({share}% a guess)")
    assert ix.data(Qt.ItemDataRole.FontRole) is None           # not all of it: drawn as evidence
    assert f"is {share}% a guess" in ix.data(Qt.ItemDataRole.ToolTipRole)
    # a node with no guessed byte says nothing of guesses
    sure = next(k for k in t.walk() if int(t.by_evidence[k, E_GUESS]) == 0)
    assert "guess" not in panel.model.index_of(sure, 4).data()
    assert "guess" not in panel.model.index_of(sure).data(Qt.ItemDataRole.ToolTipRole)
    # a node made only of guessed bytes: pale italic, '(a guess)', and the tooltip says why
    open_and_wait(qt, w, str(DATA / "qlora_4bit.pickle"))
    panel = show_tree(qt, w)
    t = panel.tree
    (g,) = [n for n in t.walk() if t.guessed(n)]
    panel.select_node(g)
    ix = panel.model.index_of(g)
    assert ix.data(Qt.ItemDataRole.FontRole).italic()
    assert ix.data(Qt.ItemDataRole.ForegroundRole) is not None
    assert panel.model.index_of(g, 4).data().endswith("(a guess)")
    assert "is a guess" in ix.data(Qt.ItemDataRole.ToolTipRole)
