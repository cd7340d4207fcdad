"""Every layout of DESIGN.md §2 through the synthetic fixtures in tests/data (torch's exact
layout, for what a CPU machine cannot record). The hostile ones are test_hostile.py's."""
from __future__ import annotations

import orjson
import pytest

from vramscope.parsers import allocations, live_model, open_snapshot

from helpers import DATA, load_trusted, reference_peaks
from test_parsers import _assert_same_as_pickle

EXPECTED = orjson.loads((DATA / "expected.json").read_bytes())["fixtures"]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_figures(name):
    want = EXPECTED[name]
    snap = open_snapshot(str(DATA / name))
    assert sorted(d["device"] for d in want["devices"]) == snap.devices
    for d in want["devices"]:
        dev = d["device"]
        m = live_model(snap, dev)
        t = snap.trace(dev)
        assert len(t) == d["entries"]
        assert int((t.action == 0).sum()) == d["allocs"]
        assert (m.peak_bytes, m.peak_index) == (d["peak_bytes"], d["peak_index"])
        assert (m.start_bytes, m.end_bytes) == (d["start_bytes"], d["end_bytes"])
        assert m.reserved_peak == d["reserved_peak"]
        for oom in d.get("ooms", []):
            i = oom["index"]
            assert snap.action_names[t.action[i]] == "oom"
            assert t.size[i] == oom["requested"]
            assert t.extras[i]["device_free"] == oom["device_free"]
            assert m.live_after[i] == oom["live_bytes"]
            assert m.reserved_after[i] == oom["reserved_bytes"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_columns_equal_pickle_load(name):
    obj = load_trusted(DATA / name)
    snap = open_snapshot(str(DATA / name))
    _assert_same_as_pickle(snap, obj)
    assert {d: live_model(snap, d).peak_bytes for d in snap.devices} == reference_peaks(obj)
    for d in snap.devices:
        allocations(snap, d)


def test_torch20_history_blocks_get_addresses_and_frames():
    obj = load_trusted(DATA / "torch20_history.pickle")
    snap = open_snapshot(str(DATA / "torch20_history.pickle"))
    seg = obj["segments"][0]
    cursor = seg["address"]
    got = snap.blocks["address"][snap.blocks["segment"] == 0].tolist()
    want = []
    for b in seg["blocks"]:
        want.append(cursor)
        cursor += b["size"]
    assert got == want
    # frames come from the block's latest history record; blocks allocated before
    # recording started have none
    has_history = [bool(b.get("history")) for s in obj["segments"] for b in s["blocks"]]
    stacks = snap.blocks["stack"].tolist()
    assert any(has_history)
    assert all((sid > 0) == h for sid, h in zip(stacks, has_history))


def test_unknown_actions_and_fields_are_kept():
    snap = open_snapshot(str(DATA / "multi_device.pickle"))
    obj = load_trusted(DATA / "multi_device.pickle")
    names = {snap.action_names[a] for d in snap.devices for a in snap.trace(d).action}
    assert "future_action" in names and "free" in names
    unknown_top = set(obj) - {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert unknown_top and unknown_top <= set(snap.extra)
    extras = [e for d in snap.devices for e in snap.trace(d).extras.values()]
    assert extras, "unknown per-entry fields are kept in extras"


def test_expandable_segments_and_settings():
    snap = open_snapshot(str(DATA / "expandable.pickle"))
    names = {snap.action_names[a] for a in snap.trace(0).action}
    assert {"segment_map", "segment_unmap"} <= names
    assert snap.segments["is_expandable"].all()
    assert snap.allocator_settings["expandable_segments"] is True


def test_annotations_pools_and_pending_free():
    snap = open_snapshot(str(DATA / "annotated_210.pickle"))
    assert any(a.get("stage") == "START" for a in snap.annotations)
    assert set(snap.segments["pool_b"].tolist()) >= {0, 1}
    assert (snap.blocks["state"] == 2).any()     # active_pending_free
    t = snap.trace(0)
    assert "compile_context" in t.columns and "user_metadata" in t.columns


def test_the_committed_fixtures_are_what_their_generator_makes(tmp_path):
    """`make_fixtures.py --check` regenerates every synthetic fixture in memory and compares it,
    byte for byte, with the committed file (and expected.json with its figures); a fixture
    edited by hand, or a generator changed without regenerating, fails here."""
    import shutil
    import subprocess
    import sys
    gen = DATA / "make_fixtures.py"
    r = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # and the check can fail: one fixture changed by a byte
    for name in [*EXPECTED, "expected.json"]:
        shutil.copy(DATA / name, tmp_path / name)
    damaged = tmp_path / "oom.pickle"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 1
    damaged.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, str(gen), "--check", "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "oom.pickle differs from the generator" in r.stderr
