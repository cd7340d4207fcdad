"""Entry point for `vramscope FILE`, `vramscope view FILE [--screenshot OUT.png]`."""
from __future__ import annotations

import os
import sys

SCREENSHOT_SIZE = (1400, 900)


def make_app():
    """The QApplication (created once), with pyqtgraph configured and a dark palette
    when the system asks for dark but the style's palette is light."""
    import pyqtgraph as pg
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QPalette
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        app = QApplication([sys.argv[0] if sys.argv else "vramscope"])
        app.setApplicationName("vramscope")
        app.setOrganizationName("vramscope")
        app.setApplicationDisplayName("vramscope")
    hints = QGuiApplication.styleHints()
    scheme = getattr(hints, "colorScheme", None)
    if scheme is not None and hints.colorScheme() == Qt.ColorScheme.Dark:
        if app.palette().color(QPalette.ColorRole.Window).lightness() > 128:
            app.setStyle("Fusion")      # Fusion's standard palette follows the colour scheme
            app.setPalette(app.style().standardPalette())
    pal = app.palette()
    pg.setConfigOptions(antialias=False, useOpenGL=False,
                        background=pal.color(QPalette.ColorRole.Base),
                        foreground=pal.color(QPalette.ColorRole.Text))
    return app


# Said by Qt's offscreen platform plugin on every window shown; not our business.
PLATFORM_NOISE = ("This plugin does not support propagateSizeHints()",)


def quiet_platform_noise():
    """Drop the offscreen plugin's chatter; pass every other Qt message to stderr."""
    from PySide6.QtCore import qInstallMessageHandler

    def handler(mode, context, message):
        if message not in PLATFORM_NOISE:
            print(message, file=sys.stderr)

    qInstallMessageHandler(handler)


def process_events(app, rounds: int = 4):
    for _ in range(rounds):
        app.processEvents()
        app.sendPostedEvents()


def render_screenshot(window, out: str) -> bool:
    """Lay the window out at a fixed size offscreen, draw it and save a PNG."""
    from PySide6.QtWidgets import QApplication
    app = QApplication.instance()
    window.resize(*SCREENSHOT_SIZE)
    window.show()
    process_events(app)
    window.default_layout()
    process_events(app)
    window.preview()
    process_events(app)
    window.timeline.refresh_now()
    process_events(app)
    window.settle()
    process_events(app)
    window.timeline.hide_hover()
    from .pngfile import save_png
    try:
        save_png(window.grab(), out)
    except OSError:
        return False
    return True


def run_viewer(path: str | None, screenshot: str | None = None, device: int | None = None,
               use_cache: bool = True) -> int:
    """Open the viewer; with `screenshot`, load synchronously, save a PNG and return.

    Exit codes as the command line's: 0 ok, 2 usage, 3 bad input, 130 interrupted.
    """
    if screenshot:
        if not path:
            print("vramscope: error: --screenshot needs a snapshot FILE", file=sys.stderr)
            return 2
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if path and not os.path.isdir(path):
        # the snapshot read and analyzed on a thread while Qt, the app and the window are set up
        # (the window follows it with its progress and Cancel); left any other way than with its
        # result (Ctrl-C, an error, the window closed), the reading is cancelled and waited for
        # (its helper processes stopped), not cut off at the interpreter's exit
        from .model.load import Begun
        begun = Begun(path, device, use_cache)
        try:
            if screenshot and _reading_takes_every_cpu(path):
                # nobody sees this window before its picture is taken: it is built while the
                # analysis runs (on one CPU), not while the reading keeps every CPU busy, where
                # it slowed the reading by about what it took (2 CPUs, 10^7 events: 0.3 s measured)
                begun.wait_read()
            return _run_viewer(path, screenshot, device, use_cache, begun)
        finally:
            if not begun.done():
                begun.cancel(wait=CANCEL_WAIT_S)
    return _run_viewer(path, screenshot, device, use_cache, None)


def _reading_takes_every_cpu(path: str) -> bool:
    from ..parsers.prefetch import reading_fills_every_cpu
    try:
        return reading_fills_every_cpu(os.path.getsize(path))
    except OSError:
        return False


CANCEL_WAIT_S = 10.0       # for a cancelled read to stop (it looks at the flag every batch)


def _failed_early(begun) -> int | None:
    """The exit code of an early reading that has already failed (a file that does not read
    says so at once, without a window built for it); None while it reads, or once it has
    read, or where it failed otherwise (left to the reading's own handling below)."""
    from ..parsers import Cancelled, SnapshotError
    if begun is None or not begun.done():
        return None
    try:
        begun.job.get()
    except SnapshotError as e:
        print(f"vramscope: {e.one_line()}", file=sys.stderr)
        return 3
    except Cancelled:
        print("vramscope: interrupted", file=sys.stderr)
        return 130
    except BaseException:       # (raised again where the result is taken)
        return None
    return None


def _run_viewer(path: str | None, screenshot: str | None, device: int | None, use_cache: bool,
                begun) -> int:
    from PySide6.QtWidgets import QApplication

    from ..parsers import Cancelled, SnapshotError
    if screenshot:
        failed = _failed_early(begun)     # (Qt's import gave the reading time to fail)
        if failed is not None:
            return failed
    if screenshot and QApplication.instance() is None:
        quiet_platform_noise()     # our own process: keep stderr for what matters
    app = make_app()
    from .model.load import load
    from .window import MainWindow

    if screenshot and path:
        folder = None
        failed = _failed_early(begun)
        if failed is not None:
            return failed
        # the window built while the thread still reads (it shows nothing until given the result)
        win = MainWindow(persist=False, use_cache=use_cache)
        win.screen_fit.enabled = False       # a picture of a fixed size, whatever the screen (offscreen: 800x800)
        try:
            try:
                if os.path.isdir(path):          # a folder of per-rank snapshots: its overview and first rank
                    from .ranks_part import load_folder
                    folder = load_folder(path, use_cache)
                    first = folder.result.primary()
                    assert first is not None    # load_folder raises NoRanks on a folder without one
                    path = first.file
                result = begun.job.take() if begun is not None else load(path, device, use_cache)
            except SnapshotError as e:
                print(f"vramscope: {e.one_line()}", file=sys.stderr)
                return 3
            except (Cancelled, KeyboardInterrupt):
                print("vramscope: interrupted", file=sys.stderr)
                return 130
            if device is not None and result.analysis is not None and device not in result.analysis.devices:
                devs = ", ".join(str(d) for d in sorted(result.analysis.devices)) or "none"
                print(f"vramscope view: error: no device {device} in {path} (devices with data: {devs})",
                      file=sys.stderr)
                return 2
            win.apply_result(result)
            if folder is not None:           # on a window laid out (a panel hidden before cannot be raised)
                win.resize(*SCREENSHOT_SIZE)
                win.show()
                process_events(app)
                win.ranks.apply(folder, open_first=False)
            ok = render_screenshot(win, screenshot)
        finally:
            win.close()
            win.deleteLater()
            process_events(app)
        if not ok:
            print(f"vramscope: error: cannot write {screenshot}", file=sys.stderr)
            return 2
        return 0

    win = MainWindow(use_cache=use_cache)
    win.show()
    if begun is not None:
        win.open_begun(begun)
    elif path:
        win.open_path(path, device)
    return int(app.exec())
