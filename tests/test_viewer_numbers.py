"""Every number the viewer shows comes from the analysis (issue 33, items 8 and 10), with real
clicks and keys (pytest-qt, offscreen): the Findings' advice is the analysis' advice item
(its saving, not one of ours); ticking a lever shows `what_if`'s own answer; the What-if panel
says "needs" once; a scaled peak describes itself, not the recorded OOM; the budget never
reads "trainable parameters 0" beside an optimizer; the GPU line belongs to the device it
was set on."""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPoint, Qt  # noqa: E402

from helpers import DATA  # noqa: E402
from viewer_helpers import LOAD_TIMEOUT, open_and_wait  # noqa: E402

OOM3 = str(DATA / "oom_step3.pickle")          # an OOM at step 3, its peak right before it, with advice
MULTI = str(DATA / "multi_device_oom.pickle")  # three devices


def tree_text(panel) -> str:
    out, stack = [], [panel.tree.topLevelItem(k) for k in range(panel.tree.topLevelItemCount())]
    while stack:
        it = stack.pop()
        out.append(it.data(0, Qt.ItemDataRole.UserRole + 1) or it.text(0))
        stack.extend(it.child(k) for k in range(it.childCount()))
    return "\n".join(out)


def test_the_findings_advice_is_the_analysis_advice_item(qt, window, monkeypatch):
    """The saving shown beside a lever is the advice item's `saves_bytes` (the lever's
    simulated saving once classifiers make it so): changing the item changes the text, and
    nothing else does."""
    from vramscope.classifiers.analysis import DeviceAnalysis
    from vramscope.common.units import fmt_bytes
    d = open_and_wait(qt, window, OOM3)
    text = tree_text(window.findings_panel)
    peak = d.da.peak
    oom = d.da.ooms[0]
    assert peak.advice and oom.advice
    assert fmt_bytes(peak.advice[0].saves_bytes) in text
    for a in oom.advice:
        if a.saves_bytes:
            assert fmt_bytes(a.saves_bytes) in text
    # the analysis says another saving: the viewer says that one
    real = DeviceAnalysis.findings

    def doctored(self, iteration_peaks=True):
        out = []
        for f in real(self, iteration_peaks):
            s = f.subject
            if getattr(s, "advice", None):
                s = dataclasses.replace(s, advice=tuple(dataclasses.replace(a, saves_bytes=(a.saves_bytes or 0) + 12345)
                                                        for a in s.advice))
                f = dataclasses.replace(f, subject=s)
            out.append(f)
        return out
    monkeypatch.setattr(DeviceAnalysis, "findings", doctored)
    d2 = open_and_wait(qt, window, OOM3)
    text2 = tree_text(window.findings_panel)
    assert fmt_bytes(peak.advice[0].saves_bytes + 12345) in text2
    assert all(fmt_bytes(a.saves_bytes + 12345) in text2 for a in oom.advice if a.saves_bytes)
    assert d2 is not d


def whatif_ready(qt, w):
    w.dock_layout.show("whatif")
    panel = w.whatif_panel
    qt.waitUntil(lambda: panel.session is not None and panel.last is not None, timeout=30000)
    # (its controls, made when the model came, are laid out and shown a moment later)
    qt.waitUntil(lambda: all(c.isVisible() for c in (*panel.sliders.values(), *panel.levers.values())), timeout=5000)
    return panel


def test_a_lever_ticked_shows_what_ifs_own_answer_and_the_panel_says_needs_once(qt, window):
    from vramscope.classifiers.whatif import what_if
    from vramscope.common.units import fmt_bytes
    d = open_and_wait(qt, window, OOM3)
    panel = whatif_ready(qt, window)
    cb = panel.levers["checkpointing"]
    assert cb.isEnabled()
    qt.mouseClick(cb, Qt.MouseButton.LeftButton, pos=QPoint(8, cb.height() // 2))
    qt.waitUntil(lambda: panel.last is not None and "checkpointing" in [lv.name for lv in panel.last.levers],
                 timeout=5000)
    r = what_if(d.analysis, d.device, {}, ["checkpointing"])
    assert panel.last.scaled.bytes == r.scaled.bytes
    change = r.scaled.bytes - r.baseline.bytes
    assert f"{'+' if change >= 0 else '−'}{fmt_bytes(abs(change))}" in panel.peak_line.text()
    # the advice of a simulated lever is its simulated saving (once classifiers/ make it so:
    # an advice item that says it is not an estimate must agree within 1% of the peak)
    adv = next((a for a in d.da.peak.advice if a.lever == "checkpointing"), None)
    if adv is not None and getattr(adv, "estimate", None) is False:
        assert abs(adv.saves_bytes - (-change)) <= 0.01 * r.baseline.bytes
    # a GPU typed: one "needs" in the panel
    panel.gpu.setFocus()
    panel.gpu.lineEdit().selectAll()
    qt.keyClicks(panel.gpu.lineEdit(), "24")
    qt.waitUntil(lambda: panel.fit_line.isVisible() and "Micro-batch" in panel.fit_line.text(), timeout=5000)
    said = " ".join(lb.text() for lb in (panel.peak_line, panel.fits_line, panel.fit_line))
    assert said.count("needs") + said.count("Needs") == 1, said


def test_a_scaled_peak_describes_itself_not_the_recorded_oom(qt, window):
    from vramscope.present.words import PEAK_TYPE_WORDS
    d = open_and_wait(qt, window, OOM3)
    assert d.da.peak.type == "oom"
    panel = whatif_ready(qt, window)
    oom_words = PEAK_TYPE_WORDS["oom"]
    assert oom_words in panel.peak_line.text()                 # as measured: it did run out there
    for slider in panel.sliders.values():                      # every category x0.9: the same moment
        slider.setFocus()
        qt.keyClick(slider, Qt.Key.Key_PageDown)
    qt.waitUntil(lambda: panel.last is not None and len(panel.last.scales) == len(panel.sliders), timeout=5000)
    assert panel.last.scaled.type == "oom" and panel.last.scaled.bytes < d.da.peak.bytes
    assert oom_words not in panel.peak_line.text()
    assert oom_words not in window.timeline.whatif_label.toPlainText()
    assert "where the recorded run ran out of memory" in panel.peak_line.text()


def test_the_budget_never_reads_zero_trainable_parameters_beside_an_optimizer(qt, window):
    d = open_and_wait(qt, window, OOM3)
    panel = whatif_ready(qt, window)
    facts = panel.session.budget.facts
    assert facts.optimizer
    zero = dataclasses.replace(panel.session.budget, facts=dataclasses.replace(facts, trainable_params=0))
    panel.session = dataclasses.replace(panel.session, budget=zero)
    panel._fill_budget()
    assert "trainable parameters 0" not in panel.facts_line.text()
    assert "trainable parameters not counted" in panel.facts_line.text()
    assert d is window.data


def test_the_gpu_line_belongs_to_the_device_and_the_file_it_was_set_on(qt, window):
    """A 48 GiB line set on one device stayed on the others and on the next file."""
    w = window
    d = open_and_wait(qt, w, MULTI)
    first = d.device
    panel = whatif_ready(qt, w)
    panel.gpu.setFocus()
    panel.gpu.lineEdit().selectAll()
    qt.keyClicks(panel.gpu.lineEdit(), "48")
    qt.waitUntil(lambda: w.timeline.gpu_line.isVisible(), timeout=5000)
    assert w.timeline.gpu_line.value() == 48 * 2 ** 30
    other = next(dev for dev in w.device_strip.buttons if dev != first)
    with qt.waitSignal(w.loaded, timeout=LOAD_TIMEOUT):
        qt.mouseClick(w.device_strip.buttons[other], Qt.MouseButton.LeftButton)
    qt.waitUntil(lambda: w.whatif_panel.session is not None, timeout=30000)
    qt.wait(50)
    assert w.data.device == other
    assert not w.timeline.gpu_line.isVisible() and panel.gpu_request() is None
    with qt.waitSignal(w.loaded, timeout=LOAD_TIMEOUT):
        qt.mouseClick(w.device_strip.buttons[first], Qt.MouseButton.LeftButton)
    qt.waitUntil(lambda: w.timeline.gpu_line.isVisible(), timeout=30000)
    assert w.timeline.gpu_line.value() == 48 * 2 ** 30                  # its own device keeps it
    open_and_wait(qt, w, OOM3)
    qt.waitUntil(lambda: w.whatif_panel.session is not None, timeout=30000)
    qt.wait(50)
    assert not w.timeline.gpu_line.isVisible() and panel.gpu_request() is None
