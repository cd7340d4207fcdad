"""A long run's iteration peaks (thousands) in Findings: their group opens closed and its rows
are made when it is first opened, or when one of them is navigated to (N / Shift+N, a click
on the timeline's marker): 0.25 s less to open a 10^7-event run of 5,000 iterations."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import open_and_wait  # noqa: E402
from vramscope.viewer.panels.findings import FindingsPanel  # noqa: E402

RUN = str(DATA / "cuda_full.pickle")       # 4 iterations: a "long run" once the limit is 1


def _group(tree, label):
    for k in range(tree.topLevelItemCount()):
        it = tree.topLevelItem(k)
        if it.data(0, Qt.ItemDataRole.UserRole + 1).startswith(label):
            return it
    return None


def test_a_long_list_of_iteration_peaks_is_made_when_opened(qt, window, monkeypatch):
    monkeypatch.setattr(FindingsPanel, "SHOWN_OPEN", 1)
    w = window
    d = open_and_wait(qt, w, RUN)
    n_it = sum(f.kind == "iteration_peak" for f in d.findings)
    assert n_it >= 2
    panel = w.findings_panel
    group = _group(panel.tree, "Iteration peaks")
    assert group is not None and not group.isExpanded()
    assert group.childCount() == 0                              # nothing made yet...
    assert group.childIndicatorPolicy() == group.ChildIndicatorPolicy.ShowIndicator   # ... but it opens
    before = len(panel.items)
    group.setExpanded(True)                                     # opened: its rows made, once
    assert group.childCount() == n_it and len(panel.items) == before + n_it
    group.setExpanded(False)
    group.setExpanded(True)
    assert group.childCount() == n_it
    titles = [group.child(k).text(0).replace("\n", " ") for k in range(n_it)]
    assert all(t.startswith("Iteration") for t in titles)


def test_an_iteration_peak_navigated_to_is_made_and_chosen(qt, window, monkeypatch):
    monkeypatch.setattr(FindingsPanel, "SHOWN_OPEN", 1)
    w = window
    d = open_and_wait(qt, w, RUN)
    panel = w.findings_panel
    k = max(i for i, f in enumerate(d.findings) if f.kind == "iteration_peak")
    panel.select(k)
    cur = panel.tree.currentItem()
    assert cur is not None and cur.data(0, Qt.ItemDataRole.UserRole) == k
    assert cur.parent() is _group(panel.tree, "Iteration peaks") and cur.parent().isExpanded()
    # every finding, in turn, from the keyboard: each one current in the tree
    w.timeline.plot.setFocus()
    for _ in range(len(d.findings)):
        qt.keyClick(w.timeline.plot, Qt.Key.Key_N)
        qt.wait(30)
        cur = panel.tree.currentItem()
        assert cur is not None and cur.data(0, Qt.ItemDataRole.UserRole) == w.finding_pos


def test_a_short_list_opens_made_and_open(qt, window):
    w = window
    d = open_and_wait(qt, w, RUN)
    group = _group(w.findings_panel.tree, "Iteration peaks")
    n_it = sum(f.kind == "iteration_peak" for f in d.findings)
    assert group.isExpanded() and group.childCount() == n_it


def test_more_peaks_than_rows_show_a_window_that_follows_navigation(qt, window, monkeypatch):
    """A run of a million short steps: the group shows ROWS_AT_MOST rows and says how to reach
    the rest; going to a peak past them (N / Shift+N) shows the rows around it. The findings
    of the peaks never shown are never made (DeviceData.findings makes them when read)."""
    monkeypatch.setattr(FindingsPanel, "SHOWN_OPEN", 1)
    monkeypatch.setattr(FindingsPanel, "ROWS_AT_MOST", 2)
    w = window
    d = open_and_wait(qt, w, RUN)
    peaks = d.findings.iteration_peaks()
    assert len(peaks) >= 4 and not d.findings._made          # none made by the open
    panel = w.findings_panel
    group = _group(panel.tree, "Iteration peaks")
    group.setExpanded(True)
    shown = [group.child(k).data(0, Qt.ItemDataRole.UserRole) for k in range(group.childCount())]
    assert shown[:2] == list(peaks[:2]) and shown[2] is None                 # two, then the way on
    assert group.child(2).text(0).replace("\n", " ").startswith(f"Showing 1–2 of {len(peaks)}")
    assert set(d.findings._made) == {0, 1}
    last = peaks[-1]
    panel.select(last)                                          # past the rows shown: they follow it
    cur = panel.tree.currentItem()
    assert cur is not None and cur.data(0, Qt.ItemDataRole.UserRole) == last
    shown = [group.child(k).data(0, Qt.ItemDataRole.UserRole) for k in range(group.childCount() - 1)]
    assert shown == list(peaks[-2:])
    assert all(it.parent() is not group or it.data(0, Qt.ItemDataRole.UserRole) in shown for it in panel.items)
    assert d.findings[last].finding.subject == d.iterations[-1]
