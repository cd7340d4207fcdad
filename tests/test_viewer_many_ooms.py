"""A run that ran out of memory again and again (the expandable fixture's trace replayed 30
times over: 30 OOMs): the timeline labels the first MARKERS_AT_MOST and draws the rest as one
item, the findings list opens the first OOM's lines only and any other's when it is chosen.
One InfiniteLine and label per OOM, and every OOM's lines wrapped, took 1.5 s of a 726-OOM open."""
from __future__ import annotations

import pickle
import sys

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from helpers import DATA, REPO, load_trusted  # noqa: E402
from viewer_helpers import open_and_wait  # noqa: E402


@pytest.fixture(scope="module")
def many_ooms(tmp_path_factory):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from tile_snapshot import tile
    snap = load_trusted(DATA / "expandable.pickle")
    n = max(len(t) for t in snap["device_traces"])
    path = tmp_path_factory.mktemp("ooms") / "thirty_ooms.pickle"
    path.write_bytes(pickle.dumps(tile(snap, 30 * n), protocol=4))
    return str(path)


def test_many_ooms_are_drawn_as_one_item_past_the_first(qt, window, many_ooms):
    data = open_and_wait(qt, window, many_ooms)
    ooms = [f for f in data.findings.head if f.kind == "oom"]
    assert len(ooms) == 30
    tl = window.timeline
    labelled = [ln for ln in tl.marker_lines if ln.label is not None and ln.label.toPlainText() == "OOM"]
    assert len(labelled) == tl.MARKERS_AT_MOST == 20
    assert [ln.value() for ln in labelled] == [float(data.x_of_index(f.index)) for f in ooms[:20]]
    assert list(tl.more_ooms.xs) == sorted(float(data.x_of_index(f.index)) for f in ooms[20:])


def test_of_many_ooms_only_the_first_opens_and_a_chosen_one_opens_too(qt, window, many_ooms):
    data = open_and_wait(qt, window, many_ooms)
    panel = window.findings_panel
    oom_items = [it for it in panel.items if data.findings[it.data(0, 0x0100)].kind == "oom"]
    assert len(oom_items) == 30
    assert [it.isExpanded() for it in oom_items] == [True] + [False] * 29
    k = oom_items[12].data(0, 0x0100)
    panel.select(k)
    assert oom_items[12].isExpanded() and oom_items[12].childCount() >= 2
