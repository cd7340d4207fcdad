"""The annotation model: sidecar round trip, undo/redo, notifications, fallbacks, crash safety."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import orjson
import pytest

from vramscope.services import annotations as am
from vramscope.services.annotations import AnnotationStore, load_annotations


@pytest.fixture
def snap(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "userdata"))
    p = tmp_path / "run.pickle"
    p.write_bytes(b"not read by the model")
    return str(p)


def test_round_trip_next_to_snapshot(snap):
    st = AnnotationStore(snap)
    assert st.path == snap + ".vramscope.json" and st.location_note is None
    a = st.add(kind="range", device=0, start_index=10, end_index=20, note="forward of layer 3")
    st.add(kind="peak", device=0, index=15, note="the peak")
    st.add(kind="allocation", device=0, alloc_index=-1, addr=0x7F00, note="weights")
    assert os.path.exists(st.path)          # autosaved
    again = AnnotationStore(snap)
    assert [x.to_dict() for x in again] == [x.to_dict() for x in st]
    assert again.get(a.id).note == "forward of layer 3"
    doc = orjson.loads(open(st.path, "rb").read())
    assert doc["format"] == "vramscope-annotations" and len(doc["annotations"]) == 3
    anns, where, warnings = load_annotations(snap)
    assert len(anns) == 3 and where == st.path and not warnings


def test_undo_redo_and_notifications(snap):
    st = AnnotationStore(snap)
    events = []
    unsubscribe = st.subscribe(lambda ev, ann: events.append((ev, ann.id if ann else None)))
    a = st.add(kind="range", start_index=1, end_index=2, note="one")
    b = st.add(kind="peak", index=5, note="two")
    st.set_note(a.id, "one, edited")
    st.remove(b.id)
    assert [x.id for x in st] == [a.id]
    assert [e[0] for e in events] == ["added", "added", "changed", "removed"]
    assert st.undo()                      # the removal
    assert [x.id for x in st] == [a.id, b.id]
    assert st.undo()                      # the edit
    assert st.get(a.id).note == "one"
    assert st.redo() and st.get(a.id).note == "one, edited"
    # what is on disk follows undo/redo
    assert [x.note for x in AnnotationStore(snap)] == ["one, edited", "two"]
    while st.undo():
        pass
    assert len(st) == 0 and not st.can_undo and st.can_redo
    assert len(AnnotationStore(snap)) == 0
    st.add(kind="peak", index=1)
    assert not st.can_redo                 # a new edit clears the redo stack
    unsubscribe()
    n = len(events)
    st.add(kind="peak", index=2)
    assert len(events) == n


def test_bad_annotations_are_refused(snap):
    st = AnnotationStore(snap)
    with pytest.raises(ValueError):
        st.add(kind="bogus")
    a = st.add(kind="peak", index=1)
    with pytest.raises(ValueError):
        st.edit(a.id, id="x")
    with pytest.raises(KeyError):
        st.remove("nope")


def test_read_only_folder_goes_to_user_data_dir(tmp_path, monkeypatch):
    # Tests run as root, where permissions do not stop writes: a snapshot "inside a file" has a
    # parent that cannot be written whoever we are.
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "userdata"))
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    snap = str(blocker / "run.pickle")
    st = AnnotationStore(snap)
    assert st.path.startswith(str(tmp_path / "userdata" / "annotations"))
    assert st.location_note and st.path in st.location_note
    st.add(kind="peak", index=3, note="kept")
    assert os.path.exists(st.path)
    assert [a.note for a in AnnotationStore(snap)] == ["kept"]
    assert [a.note for a in load_annotations(snap)[0]] == ["kept"]


def test_read_only_detected_by_access_too(snap, monkeypatch):
    monkeypatch.setattr(am.os, "access", lambda *a, **k: False)
    st = AnnotationStore(snap)
    assert st.location_note and "userdata" in st.path


def test_failed_save_switches_to_fallback(snap, monkeypatch):
    st = AnnotationStore(snap)
    real = am.atomic_write

    def flaky(path, data):
        if path == st.next_to_snapshot:
            raise PermissionError(13, "Permission denied")
        real(path, data)
    monkeypatch.setattr(am, "atomic_write", flaky)
    st.add(kind="peak", index=1, note="saved anyway")
    assert st.location_note and os.path.exists(st.path) and st.path != st.next_to_snapshot


@pytest.mark.parametrize("content", [b"", b"{\"annotations\": [", b"\x00\xff garbage", b"{\"format\": 3}"])
def test_corrupt_sidecar_is_moved_aside(snap, content):
    side = snap + ".vramscope.json"
    with open(side, "wb") as fh:
        fh.write(content)
    st = AnnotationStore(snap)
    assert len(st) == 0
    assert st.warnings and "moved to" in st.warnings[0]
    aside = [n for n in os.listdir(os.path.dirname(snap)) if ".vramscope.json.corrupt-" in n]
    assert len(aside) == 1
    assert open(os.path.join(os.path.dirname(snap), aside[0]), "rb").read() == content
    st.add(kind="peak", index=1)
    assert len(AnnotationStore(snap)) == 1


_WRITER = textwrap.dedent("""
    import sys
    from vramscope.services.annotations import AnnotationStore
    st = AnnotationStore(sys.argv[1])
    print(len(st), flush=True)
    i = len(st)
    while True:
        i += 1
        # growing content: each save is bigger than the last, so a torn write would show
        st.add(kind="range", start_index=i, end_index=i + 1, note="note %d " % i + "x" * (200 * i))
""")


def test_sigkill_while_saving_never_corrupts(snap, tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    side = snap + ".vramscope.json"
    rng = random.Random(1234)
    last = 0
    t0 = time.monotonic()
    rounds = 0
    env = dict(os.environ)
    for rounds in range(1, 41):
        proc = subprocess.Popen([sys.executable, str(script), snap], stdout=subprocess.PIPE, env=env)
        line = proc.stdout.readline()          # loaded: now it saves in a tight loop
        assert int(line) == last
        time.sleep(rng.uniform(0.0, 0.06))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        if not os.path.exists(side):
            assert last == 0
            continue
        data = open(side, "rb").read()
        doc = orjson.loads(data)               # never torn, never empty
        n = len(doc["annotations"])
        assert n >= last and n >= 1
        # plausible: every note is whole and in order
        for k, a in enumerate(doc["annotations"], start=1):
            assert a["note"] == "note %d " % k + "x" * (200 * k)
        last = n
        if time.monotonic() - t0 > 18:
            break
    assert rounds >= 20 and last > 0
    # the store reads what survived, and nothing was moved aside
    assert len(AnnotationStore(snap)) == last
    assert not [n for n in os.listdir(os.path.dirname(snap)) if "corrupt" in n]


# -- the sidecar as untrusted input ----------------------------------------------------------
def _side(snap):
    return snap + ".vramscope.json"


@pytest.mark.parametrize("bad", [[1, 2], [{"kind": "nonsense"}], [{"kind": "peak", "index": "12"}],
                                 [{"kind": "range", "note": ["not", "text"]}], [{"no": "kind"}],
                                 [{"kind": "peak", "note": "x" * 100_001}]])
def test_a_bad_note_is_set_aside_and_the_others_load(snap, bad):
    import orjson
    good = [{"kind": "peak", "index": 3, "note": "keep me", "id": "good1"},
            {"kind": "range", "start_index": 1, "end_index": 9, "note": "me too", "id": "good2"}]
    with open(_side(snap), "wb") as fh:
        fh.write(orjson.dumps({"format": "vramscope-annotations", "version": 1, "annotations": good + bad}))
    st = AnnotationStore(snap)
    assert [a.note for a in st] == ["keep me", "me too"]
    assert any("set aside" in w for w in st.warnings)
    st.add(kind="peak", index=5, note="new")
    doc = orjson.loads(open(_side(snap), "rb").read())
    assert len(doc["annotations"]) == 3
    assert doc["set_aside"] == bad                     # nothing lost without a word
    assert not [n for n in os.listdir(os.path.dirname(snap)) if ".corrupt-" in n]


def test_unknown_fields_and_newer_versions_are_kept(snap):
    import orjson
    with open(_side(snap), "wb") as fh:
        fh.write(orjson.dumps({"format": "vramscope-annotations", "version": 7, "theme": {"color": "teal"},
                               "annotations": [{"kind": "peak", "index": 3, "note": "n", "id": "a1",
                                                "pinned": True, "tags": ["x"]}]}))
    st = AnnotationStore(snap)
    assert len(st) == 1 and any("newer vramscope" in w for w in st.warnings)
    st.edit("a1", note="edited")
    doc = orjson.loads(open(_side(snap), "rb").read())
    assert doc["version"] == 7 and doc["theme"] == {"color": "teal"}
    (note,) = doc["annotations"]
    assert note["note"] == "edited" and note["pinned"] is True and note["tags"] == ["x"]


def test_an_oversized_sidecar_is_not_read_and_not_lost(snap, monkeypatch):
    from vramscope.services import sidecar
    monkeypatch.setattr(sidecar, "MAX_BYTES", 1000)
    content = b"[" + b",".join([b'{"kind": "peak", "index": 1, "note": "xxxxxxxxxx"}'] * 40) + b"]"
    with open(_side(snap), "wb") as fh:
        fh.write(content)
    st = AnnotationStore(snap)
    assert len(st) == 0 and st.warnings and "bytes" in st.warnings[0]
    aside = [n for n in os.listdir(os.path.dirname(snap)) if ".corrupt-" in n]
    assert len(aside) == 1 and open(os.path.join(os.path.dirname(snap), aside[0]), "rb").read() == content


def test_a_fifo_as_the_sidecar_does_not_hang(snap):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    os.mkfifo(_side(snap))
    st = AnnotationStore(snap)             # would block forever if it opened the FIFO
    assert len(st) == 0 and st.warnings
    st.add(kind="peak", index=1, note="saved elsewhere")
    assert st.path != _side(snap) and os.path.isfile(st.path)
    assert load_annotations(snap)[0] == [] or load_annotations(snap)[0][0].note == "saved elsewhere"


def test_two_stores_saving_in_turn_merge_instead_of_overwriting(snap):
    """Two windows on one snapshot: each keeps the other's notes, deletions and edits."""
    a = AnnotationStore(snap)
    b = AnnotationStore(snap)
    n1 = a.add(kind="peak", index=1, note="from A")
    n2 = b.add(kind="peak", index=2, note="from B")         # B had not seen A's note
    assert {x.note for x in b} == {"from A", "from B"}
    assert any("merged" in w for w in b.warnings)
    a.add(kind="peak", index=3, note="A again")             # A had not seen B's note
    assert {x.note for x in a} == {"from A", "from B", "A again"}
    b.remove(n1.id)                                         # a deletion stays deleted
    a.edit(n2.id, note="B's note, edited in A")
    final = AnnotationStore(snap)
    assert sorted(x.note for x in final) == ["A again", "B's note, edited in A"]
