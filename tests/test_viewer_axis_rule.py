"""One x-axis rule for every timeline (issue 33, items 8 and 9): the main timeline, Compare,
the report's PNG and the rank overview all start a device in seconds or in entries as
classifiers/timeaxis.py decides, on every committed snapshot (tests/data, tests/groundtruth,
assets/example.pickle). Compare (`usable_times`) and the report's PNG had rules of their
own: six committed files showed in entries in the timeline and in seconds in both."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from helpers import DATA, GROUNDTRUTH, REPO, analysis_of  # noqa: E402

FILES = sorted(DATA.glob("*.pickle")) + sorted(GROUNDTRUTH.glob("*.pickle")) + [REPO / "assets" / "example.pickle"]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_timeline_of_a_committed_file_follows_the_one_rule(path, qapp):
    from vramscope.classifiers.compare import CompareError
    from vramscope.classifiers.timeaxis import x_axis
    from vramscope.services.compare import compare_analyses
    from vramscope.services.rank_read import live_envelope
    from vramscope.services.summary import summary_document
    from vramscope.viewer.model import DeviceData
    from vramscope.viewer.model.compare import AlignedSide
    from vramscope.viewer.report_png import timeline_axis
    an = analysis_of(path)
    if not an.devices:
        pytest.skip("records no memory")
    try:
        sides = {dc.device: dc.a for dc in compare_analyses(an, an).devices}
    except CompareError:
        sides = {}
    doc = {d["device"]: d for d in summary_document(an)["devices"]}
    for dev, da in an.devices.items():
        rule = x_axis(da)
        seconds = rule.seconds and da.live.n_events > 1
        d = DeviceData(an.snapshot, an, dev)
        assert d.time_axis == seconds, ("timeline", dev, rule.reason)
        assert timeline_axis(da)[1] == seconds, ("report PNG", dev, rule.reason)
        if dev in sides and sides[dev].origin_us is not None:
            assert AlignedSide(an, sides[dev]).has_time == seconds, ("Compare", dev, rule.reason)
        env = live_envelope(an.snapshot, dev, iterations=doc[dev]["iterations"])
        assert (env.axis == "us") == seconds, ("rank overview", dev, rule.reason)


def test_the_report_png_of_a_squeezed_run_is_in_entries(tmp_path, qapp):
    """The H100 LoRA run: iteration 1 takes 87% of its time; its report PNG spans its entries."""
    from vramscope.viewer.report_png import timeline_axis
    an = analysis_of(DATA / "cuda_lora.pickle")
    da = an.devices[an.primary_device()]
    x, seconds, label = timeline_axis(da)
    assert not seconds and x[-1] == da.live.n_events - 1
    assert label.startswith("trace entry (entries: iteration 1 takes")
