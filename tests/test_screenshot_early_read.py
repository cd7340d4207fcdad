"""`vramscope view FILE --screenshot` reads the snapshot on a thread from the start, while Qt
and the window are set up (viewer/app.py). Left any other way than with its result (Ctrl-C,
an error), it cancels that reading and waits for it: the reader stops its helper processes
instead of being cut off at the interpreter's exit."""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("PySide6")

from helpers import DATA  # noqa: E402
from vramscope.parsers import Cancelled  # noqa: E402
from vramscope.viewer import app as app_module  # noqa: E402
import vramscope.viewer.model.load as load_module  # noqa: E402

FILE = str(DATA / "cuda_full.pickle")


def test_a_screenshot_left_early_cancels_its_reading_and_waits(monkeypatch, tmp_path):
    seen: dict = {}

    def slow_load(path, device, use_cache, progress):
        seen["thread"] = threading.current_thread().name
        while not progress.cancelled:
            time.sleep(0.005)
        time.sleep(0.05)                      # stopping takes a while: it is waited for
        seen["stopped"] = True
        raise Cancelled()

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(load_module, "load", slow_load)
    monkeypatch.setattr(app_module, "_run_viewer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        app_module.run_viewer(FILE, str(tmp_path / "shot.png"))
    assert seen == {"thread": "vramscope-load", "stopped": True}


def test_the_reading_done_is_taken_as_it_is(monkeypatch, tmp_path):
    """The normal path: the thread's result is the window's; nothing is cancelled."""
    calls: list = []
    real = load_module.load

    def counted(path, device, use_cache, progress):
        calls.append(threading.current_thread().name)
        out = real(path, device, use_cache, progress)
        calls.append(progress.cancelled)
        return out

    monkeypatch.setattr(load_module, "load", counted)
    out = tmp_path / "shot.png"
    assert app_module.run_viewer(FILE, str(out), use_cache=False) == 0
    assert out.stat().st_size > 10_000
    assert calls == ["vramscope-load", False]
