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

    def slow_load(path, device, use_cache, progress, on_read=None):
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

    def counted(path, device, use_cache, progress, on_read=None):
        calls.append(threading.current_thread().name)
        out = real(path, device, use_cache, progress, on_read)
        calls.append(progress.cancelled)
        return out

    monkeypatch.setattr(load_module, "load", counted)
    out = tmp_path / "shot.png"
    assert app_module.run_viewer(FILE, str(out), use_cache=False) == 0
    assert out.stat().st_size > 10_000
    assert calls == ["vramscope-load", False]


def test_a_file_that_does_not_read_is_said_at_once_without_a_window(monkeypatch, tmp_path, capsys):
    """An unreadable file fails the reading within milliseconds: said (exit 3) before a window
    is built for it; one that fails only once the window is up is said the same way."""
    import vramscope.viewer.window as window_module
    bad = tmp_path / "not_a_snapshot.pickle"
    bad.write_bytes(b"\x80\x04this is not a pickle")
    built: list = []
    real_window = window_module.MainWindow

    def counted_window(*args, **kwargs):
        built.append(1)
        return real_window(*args, **kwargs)

    monkeypatch.setattr(window_module, "MainWindow", counted_window)
    real_loading = app_module._run_viewer

    def after_the_reading(path, screenshot, device, use_cache, begun):
        assert begun is not None
        begun.job.wait(30)                    # (failed by now: as it would be on any machine)
        return real_loading(path, screenshot, device, use_cache, begun)

    monkeypatch.setattr(app_module, "_run_viewer", after_the_reading)
    out = tmp_path / "shot.png"
    assert app_module.run_viewer(str(bad), str(out)) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vramscope: ") and "Traceback" not in err[0]
    assert built == [] and not out.exists()

    monkeypatch.setattr(app_module, "_run_viewer", real_loading)
    monkeypatch.setattr(app_module, "_failed_early", lambda loading: None)   # failing late, the same words
    assert app_module.run_viewer(str(bad), str(out)) == 3
    late = capsys.readouterr().err.strip().splitlines()
    assert late == err and built == [1] and not out.exists()


@pytest.mark.parametrize("fills", [True, False])
def test_the_window_waits_for_the_reading_only_where_the_reading_fills_every_cpu(monkeypatch, tmp_path, fills):
    """Where the reading keeps every CPU busy (its thread and its helpers: 2 to 4 CPUs), the
    window of a screenshot, which nobody sees until its picture is taken, is built once the
    file is read, beside the analysis (one CPU): built beside the reading it slowed the reading
    by as much as it took. Where a CPU is left over, it is built beside the reading."""
    order: list = []
    real = load_module.load
    real_app = app_module.make_app
    app_begun = threading.Event()

    def traced(path, device, use_cache, progress, on_read=None):
        def read():
            # a read that ends once the window is begun, or after 3 s where it waits for the read
            app_begun.wait(3)
            order.append("read")
            if on_read is not None:
                on_read()
        return real(path, device, use_cache, progress, read)

    def app():
        order.append("app")
        app_begun.set()
        return real_app()

    monkeypatch.setattr(load_module, "load", traced)
    monkeypatch.setattr(app_module, "make_app", app)
    monkeypatch.setattr(app_module, "_reading_takes_every_cpu", lambda path: fills)
    out = tmp_path / "shot.png"
    assert app_module.run_viewer(FILE, str(out), use_cache=False) == 0
    assert out.stat().st_size > 10_000
    assert order == (["read", "app"] if fills else ["app", "read"])


def test_the_reading_fills_every_cpu_with_its_helpers(monkeypatch):
    from vramscope.parsers import prefetch
    big = 1 << 30
    for cpus, fills in ((1, False), (2, True), (4, True), (5, False), (16, False)):
        monkeypatch.setattr(prefetch, "_cpus", lambda c=cpus: c)
        assert prefetch.reading_fills_every_cpu(big) is fills, cpus
    monkeypatch.setattr(prefetch, "_cpus", lambda: 2)
    assert prefetch.reading_fills_every_cpu(1 << 20) is False        # too small for a helper: a CPU left
    monkeypatch.setenv("VRAMSCOPE_PARSE_HELPER", "0")
    assert prefetch.reading_fills_every_cpu(big) is False
